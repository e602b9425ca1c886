"""Shared helpers for the multi-process axonn workers."""
from __future__ import annotations

import sys
import traceback

import torch


def tiny_config(**kw):
    from transformers import LlamaConfig

    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, attention_bias=False,
                mlp_bias=False, tie_word_embeddings=False,
                pad_token_id=138)  # in batch(0), not in the first vocab chunk: its row gets no gradient
    base.update(kw)
    cfg = LlamaConfig(**base)
    cfg._attn_implementation = "eager"
    return cfg


def tiny_llama(seed: int = 0, **kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(**kw)).float()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a-b| / max |b| (per-tensor relative error)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    e = rel_err(a, b)
    assert e <= tol, f"{what}: relative error {e:.3e} > {tol:.0e}"


def assert_same_greedy(model, ref, prompt: torch.Tensor, what: str, tol: float = 1e-4, **kw) -> None:
    """``model.generate`` picks the greedy tokens ``ref.generate`` picks, up to near-ties.

    Two different computations of the same logits (parallel vs serial, another attention kernel) agree
    to fp32 rounding, not bit for bit (which bits depend on the CPU's ISA, BLAS path and threads), so an
    argmax between two logits closer than that may go either way.  Every token must be equal until the
    first difference; there the two picked tokens' logits in ``ref``'s scores must be within ``tol``
    relative of the step's largest |logit| (a near-tie; fp32 paths differ by ~1e-6), and the rest is
    not compared (the prompts differ from then on).
    """
    kw = dict(do_sample=False, output_logits=True, return_dict_in_generate=True, **kw)
    a, b = model.generate(prompt, **kw), ref.generate(prompt, **kw)
    got, want, scores = a.sequences, b.sequences, torch.stack(b.logits, 1)  # scores: (batch, new, vocab)
    assert got.shape == want.shape, f"{what}: generated {tuple(got.shape)} vs {tuple(want.shape)}"
    n = prompt.shape[1]
    for r in range(got.shape[0]):
        diff = (got[r, n:] != want[r, n:]).nonzero()
        if len(diff):
            k = int(diff[0])
            s = scores[r, k].double()
            gap = float(s[want[r, n + k]] - s[got[r, n + k]])
            assert gap <= tol * float(s.abs().max()), (
                f"{what}: row {r} step {k}: picked {int(got[r, n + k])} over {int(want[r, n + k])}, "
                f"not a near-tie (logit gap {gap:.3e})\n{got}\n{want}")
    assert torch.equal(got[:, :n], want[:, :n]), what


def mean_over_batch_ranks(x: torch.Tensor) -> torch.Tensor:
    """A per-rank scalar averaged over the data x depth replicas (each saw its own rows of the batch)."""
    import axonn
    from axonn.communication import all_reduce

    g = axonn.get_grid()
    x = x.detach().clone().reshape(1)
    all_reduce(x, ("data", "depth"))
    return x[0] / g.size(("data", "depth"))


def assert_matches_serial(par, ref, x: torch.Tensor, loss: torch.Tensor, ref_out, label: str = "") -> None:
    """After both backwards (and the parallel model's gradient sync): the parallel loss averaged over the batch
    replicas, its logits on this rank's rows, every full gradient and every full weight equal the serial model's
    (``ref_out``: the serial forward's output on the whole batch ``x``)."""
    import axonn

    what = f"{label} " if label else ""
    assert_close(mean_over_batch_ranks(loss), ref_out.loss, f"{what}loss")
    with torch.no_grad():
        logits = par(input_ids=axonn.batch_slice(x)).logits
    assert_close(logits, axonn.batch_slice(ref_out.logits), f"{what}logits")
    grads = axonn.full_grad_dict(par)
    names = [n for n, _ in ref.named_parameters()]
    assert sorted(grads) == sorted(names), f"{what}param names differ: {set(grads) ^ set(names)}"
    for n, p in ref.named_parameters():
        assert_close(grads[n], p.grad, f"{what}grad {n}")
    sd = axonn.full_state_dict(par)
    for n, t in ref.state_dict().items():
        assert torch.equal(sd[n], t), f"{what}full_state_dict {n}"


def train_step(model, opt, x: torch.Tensor, y: torch.Tensor) -> float:
    """One optimizer step of a parallel model on this rank's slice of the global batch ``(x, y)`` (gradient sync,
    clipping to 1.0, AdamW); returns the loss averaged over the batch replicas."""
    import axonn

    loss = model(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y)).loss
    loss.backward()
    axonn.sync_gradients(model)
    axonn.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(mean_over_batch_ranks(loss))


def batch(step: int, b: int = 4, t: int = 16, vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic global batch; every 5th label is -100 (same count in every row, Goldfish-style)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, vocab, (b, t), generator=g)
    y = x.clone()
    y[:, 3::5] = -100
    return x, y


def run_main(fn) -> None:
    try:
        fn()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        import os
        os._exit(1)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def flip_bytes(f, n: int = 64, at: float = 0.5) -> None:
    """Flip ``n`` bytes of file ``f`` from the fraction ``at`` of its length (a disk or a copy gone wrong)."""
    data = bytearray(f.read_bytes())
    i = int(len(data) * at)
    data[i:i + n] = bytes(b ^ 0xFF for b in data[i:i + n])
    f.write_bytes(bytes(data))


def save_steps_4_and_8(rt, model, opt, root) -> dict:
    """Checkpoints of steps 4 and 8 under ``root`` by the trainer's runtime ``rt``, every weight changed in
    between (+1); returns step 4's weights by name."""
    rt.save_checkpoint(model, opt, root, {"step": 4})
    at4 = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    rt.save_checkpoint(model, opt, root, {"step": 8})
    return at4
