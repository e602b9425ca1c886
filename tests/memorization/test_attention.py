"""``causal_sdpa``: the compiled training forward runs SDPA with ``is_causal=True`` and no mask (so CUDA can pick
flash attention), and every output equals HF's ``sdpa``: training loss and gradients, packed rows in eager mode,
left-padded batched generation."""
import copy
import sys

import pytest
import torch

from memorization.attention import CAUSAL_SDPA, use_causal_sdpa
from memorization.goldfish import GoldfishConfig
from memorization.loss import causal_lm_loss_sum
from memorization.models import build_model
from memorization.train import TrainConfig, Trainer
from tests.support import WORKERS

sys.path.insert(0, str(WORKERS))
from common import assert_same_greedy  # noqa: E402

V = 512


def _pair():
    ref = build_model("tiny", V, seed=0)
    ours = copy.deepcopy(ref)
    assert use_causal_sdpa(ours) and ours.config._attn_implementation == CAUSAL_SDPA
    assert ref.config._attn_implementation == "sdpa"
    return ref, ours


def _sdpa_calls(fn, *args, **kw) -> tuple[list[dict], object]:
    """Compile ``fn`` with a backend that records the SDPA calls of the traced graph, run it; (calls, output)."""
    calls = []

    def backend(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.target is torch.nn.functional.scaled_dot_product_attention:
                calls.append({"mask": node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None),
                              "is_causal": node.kwargs.get("is_causal", False)})
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*args, **kw)
    return calls, out


def test_compiled_training_forward_calls_causal_sdpa_without_a_mask():
    _, ours = _pair()
    ids = torch.randint(3, V, (2, 64))
    calls, _ = _sdpa_calls(causal_lm_loss_sum, ours, ids, ids)
    assert len(calls) == ours.config.num_hidden_layers
    assert all(c["mask"] is None and c["is_causal"] is True for c in calls), calls


def test_compiled_loss_and_grads_equal_hf_sdpa():
    ref, ours = _pair()
    ids = torch.randint(3, V, (2, 64))
    labels = ids.clone()
    labels[:, ::3] = -100  # Goldfish-style drops
    loss_ref, n_ref = causal_lm_loss_sum(ref, ids, labels)
    loss_ref.backward()
    torch._dynamo.reset()
    loss, n = torch.compile(causal_lm_loss_sum)(ours, ids, labels)
    loss.backward()
    assert int(n) == int(n_ref)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(ref.named_parameters(), ours.parameters()):  # fp32 rounding of compiled vs eager
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5 * float(p.grad.abs().max()), msg=name)


def test_eager_packed_rows_keep_their_mask():
    """Position ids that restart inside a row (packing) are read in eager mode and masked as HF does."""
    ref, ours = _pair()
    ids = torch.randint(3, V, (2, 48))
    pos = torch.cat([torch.arange(20), torch.arange(28)]).expand(2, -1)
    with torch.no_grad():
        a = ref(input_ids=ids, position_ids=pos).logits
        b = ours(input_ids=ids, position_ids=pos).logits
        plain = ours(input_ids=ids).logits
    torch.testing.assert_close(b, a)
    assert not torch.allclose(b[:, 20:], plain[:, 20:], atol=1e-3)  # the packing mask did take effect


@pytest.mark.parametrize("compile", [False, True])
def test_left_padded_batches_match_hf_sdpa(compile):
    """A padding mask goes to HF's own mask builder: logits and greedy generation are unchanged."""
    ref, ours = _pair()
    ids = torch.randint(3, V, (3, 24))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, :11] = 0
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=mask).logits
        torch._dynamo.reset()
        fwd = torch.compile(ours.forward) if compile else ours.forward
        b = fwd(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(b[mask.bool()], a[mask.bool()], rtol=1e-5, atol=1e-5)
    if not compile:
        # the same greedy tokens up to near-ties (two attention kernels: fp32 rounding, not the same bits)
        assert_same_greedy(ours, ref, ids, "left-padded generate", attention_mask=mask, max_new_tokens=8,
                           pad_token_id=0)


def test_trainer_switches_an_sdpa_model_and_leaves_eager_alone(tmp_path):
    rows = torch.randint(3, V, (8, 32))
    docs = torch.zeros_like(rows, dtype=torch.int32)
    cfg = TrainConfig(batch_size=4, checkpoint_every=0, progress=False, goldfish=GoldfishConfig(k=4, h=3))
    t = Trainer(build_model("tiny", V, seed=0), rows, docs, rows[:4], cfg, tmp_path / "a")
    assert t.model.config._attn_implementation == CAUSAL_SDPA
    eager = build_model("tiny", V, seed=0)
    eager.set_attn_implementation("eager")
    t = Trainer(eager, rows, docs, rows[:4], cfg, tmp_path / "b")
    assert t.model.config._attn_implementation == "eager"


def test_mask_function_takes_both_calling_conventions(monkeypatch):
    """transformers 5 calls a mask function with ``q_length``/``q_offset``; 4.53-4.57 with ``cache_position``
    instead (no ``q_length``). A plain causal mask is None either way, and anything else goes to HF's
    ``sdpa_mask`` with the arguments it was given (the 4.x convention's passed through unchanged)."""
    from transformers import masking_utils as mu

    from memorization.attention import _causal_sdpa_mask

    assert _causal_sdpa_mask(batch_size=2, q_length=8, kv_length=8) is None
    assert _causal_sdpa_mask(batch_size=2, cache_position=torch.arange(8), kv_length=8) is None  # 4.53-4.57
    seen = []
    monkeypatch.setattr(mu, "sdpa_mask", lambda **kw: seen.append(kw) or "mask")
    assert _causal_sdpa_mask(batch_size=2, cache_position=torch.arange(7, 8), kv_length=8) == "mask"  # decoding
    assert "q_length" not in seen[0] and seen[0]["cache_position"].tolist() == [7] and seen[0]["kv_length"] == 8
    assert _causal_sdpa_mask(batch_size=2, q_length=1, kv_length=8, q_offset=7) == "mask"
    assert (seen[1]["q_length"], seen[1]["q_offset"], seen[1]["kv_length"]) == (1, 7, 8)
