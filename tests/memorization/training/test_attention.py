"""``causal_sdpa``: the compiled training step dispatches the attention kernel with ``is_causal=True``, no mask and
grouped K/V (so CUDA can pick flash or cuDNN attention), and every output equals HF's ``sdpa``: training loss and
gradients, packed rows in eager mode, left-padded batched generation, Mistral's sliding window."""
import copy
import sys

import pytest
import torch

from memorization.training.attention import CAUSAL_SDPA, compiled_step_attention, dispatch_problems, use_causal_sdpa
from memorization.training.goldfish import GoldfishConfig
from memorization.training.loss import causal_lm_loss_sum
from memorization.training.models import build_model
from memorization.training.train import TrainConfig, Trainer
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


@pytest.mark.slow  # (~65 s on 2 cores: compiles the model; the default suite checks what the compiled step dispatches)
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


@pytest.mark.parametrize("compile", [False, pytest.param(True, marks=pytest.mark.slow)])  # compiled dispatch in the
def test_left_padded_batches_match_hf_sdpa(compile):  # default suite: test_compiled_train_step_dispatches_...
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

    from memorization.training.attention import _causal_sdpa_mask

    assert _causal_sdpa_mask(batch_size=2, q_length=8, kv_length=8) is None
    assert _causal_sdpa_mask(batch_size=2, cache_position=torch.arange(8), kv_length=8) is None  # 4.53-4.57
    seen = []
    monkeypatch.setattr(mu, "sdpa_mask", lambda **kw: seen.append(kw) or "mask")
    assert _causal_sdpa_mask(batch_size=2, cache_position=torch.arange(7, 8), kv_length=8) == "mask"  # decoding
    assert "q_length" not in seen[0] and seen[0]["cache_position"].tolist() == [7] and seen[0]["kv_length"] == 8
    assert _causal_sdpa_mask(batch_size=2, q_length=1, kv_length=8, q_offset=7) == "mask"
    assert (seen[1]["q_length"], seen[1]["q_offset"], seen[1]["kv_length"]) == (1, 7, 8)


# ---- what the compiled training step dispatches (aten level: after PyTorch chose the kernel) ----------------------

def _compiled_step_calls(tmp_path, attn: str | None = None):
    """One training step of the Trainer with its forward compiled by the recording backend; the SDPA calls."""
    from memorization.training.models import model_config

    config = model_config("tiny", V)
    config.num_hidden_layers = 1  # the check is per layer; one keeps the trace short
    rows = torch.randint(3, V, (4, 32))
    cfg = TrainConfig(batch_size=2, warmup_steps=0, checkpoint_every=0, progress=False,
                      goldfish=GoldfishConfig(k=4, h=3))
    t = Trainer(build_model("tiny", V, seed=0, config=config), rows, torch.zeros_like(rows, dtype=torch.int32),
                rows[:2], cfg, tmp_path)
    if attn is not None:
        t.model.set_attn_implementation(attn)
    return compiled_step_attention(t), t.model.config


def test_compiled_train_step_dispatches_causal_kernel_with_grouped_kv(tmp_path):
    """The trainer's compiled step calls the attention kernel with is_causal=True, no mask tensor, and K/V at the
    model's kv_heads (grouped, not repeated to every query head), once per layer."""
    calls, config = _compiled_step_calls(tmp_path)
    assert config.num_key_value_heads < config.num_attention_heads  # the tiny preset is GQA: repeats would show
    assert dispatch_problems(calls, config) == [], calls
    for c in calls:
        assert (c.q_heads, c.kv_heads) == (config.num_attention_heads, config.num_key_value_heads), c
        assert c.enable_gqa in (None, True), c


def test_dispatch_check_sees_hf_sdpa_mask_and_repeated_kv(tmp_path):
    """The check above can fail: on HF's own ``sdpa`` the same compiled step materialises the mask
    (is_causal=False) and repeats K and V to every query head, and the recorded calls and the verdict say so."""
    calls, config = _compiled_step_calls(tmp_path, attn="sdpa")
    assert len(calls) == config.num_hidden_layers
    for c in calls:
        assert c.has_mask and not c.is_causal, c
        assert c.kv_heads == c.q_heads == config.num_attention_heads, c
    problems = dispatch_problems(calls, config)
    assert len(problems) == 2 and "mask tensor" in problems[0] and "K/V with" in problems[1], problems


def test_unpacked_rows_decides_without_a_trace():
    """Inside ``unpacked_rows`` a plain request is causal (None) even outside a trace with HF's packed-sequence
    adapter as mask function (what a graph break before the mask function would leave); outside it, that request
    goes to HF's mask builder, and padding or a window always does."""
    from transformers import masking_utils as mu

    from memorization.training.attention import _causal_sdpa_mask, unpacked_rows

    one_sequence = torch.zeros(2, 8, dtype=torch.long)
    packed = mu.and_masks(mu.causal_mask_function, mu.packed_sequence_mask_function(one_sequence))
    kw = dict(batch_size=2, q_length=8, kv_length=8, mask_function=packed)
    plain_causal = torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 1, 8, 8)
    assert torch.equal(_causal_sdpa_mask(**kw, allow_is_causal_skip=False), plain_causal)
    with unpacked_rows():
        assert _causal_sdpa_mask(**kw, allow_is_causal_skip=False) is None
        pad = torch.ones(2, 8, dtype=torch.bool)
        pad[0, :3] = False
        assert _causal_sdpa_mask(**kw, attention_mask=pad, allow_is_causal_skip=False) is not None
        assert _causal_sdpa_mask(**kw, local_size=4, allow_is_causal_skip=False) is not None
    assert _causal_sdpa_mask(**kw, allow_is_causal_skip=False) is not None  # the context was left


def test_attention_function_equals_hf_sdpa_and_defers_to_it(monkeypatch):
    """Without a mask our function equals HF's sdpa (causal, GQA) to fp32 rounding; with a mask, one query, a window
    narrower than the keys or a non-causal module it is HF's function that runs."""
    import transformers.integrations.sdpa_attention as hf

    from memorization.training.attention import causal_sdpa_attention

    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 2, True
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 16, 8, generator=g) for h in (4, 2, 2))
    ours, _ = causal_sdpa_attention(module, q, k, v, None, scaling=0.3)
    ref, _ = hf.sdpa_attention_forward(module, q, k, v, None, scaling=0.3)
    torch.testing.assert_close(ours, ref)
    seen = []
    real = hf.sdpa_attention_forward
    monkeypatch.setattr(hf, "sdpa_attention_forward", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    mask = torch.ones(16, 16, dtype=torch.bool).tril()[None, None]
    causal_sdpa_attention(module, q, k, v, mask)
    causal_sdpa_attention(module, q[:, :, :1], k, v, None)
    causal_sdpa_attention(module, q, k, v, None, sliding_window=8)
    assert len(seen) == 3 and seen[2]["sliding_window"] == 8
    causal_sdpa_attention(module, q, k, v, None, sliding_window=16)  # covers every key: plain causal
    module.is_causal = False
    causal_sdpa_attention(module, q, k, v, None)
    assert len(seen) == 4


def test_mistral_sliding_window_keeps_its_own_path():
    """A Mistral model whose window (16) is narrower than its rows (48) gives the same logits on causal_sdpa as on
    HF's sdpa: the window's mask is built and applied, not replaced by plain causal attention."""
    ref = build_model("tiny", V, seed=0, family="mistral")
    ref.config.sliding_window = 16
    ours = copy.deepcopy(ref)
    assert use_causal_sdpa(ours)
    ids = torch.randint(3, V, (2, 48))
    with torch.no_grad():
        a, b = ref(input_ids=ids).logits, ours(input_ids=ids).logits
        ref.config.sliding_window = None
        full = ref(input_ids=ids).logits
    torch.testing.assert_close(b, a)
    assert not torch.allclose(full[:, 20:], a[:, 20:], atol=1e-3)  # the window did take effect
