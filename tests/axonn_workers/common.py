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
