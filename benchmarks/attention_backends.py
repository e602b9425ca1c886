#!/usr/bin/env python
"""Causal self-attention forward + backward per SDPA backend, side by side, at a preset's shape.

    python benchmarks/attention_backends.py                  # GPU: the 1b's attention at 4 x 2048, bf16
    python benchmarks/attention_backends.py --batch 1 --seq 256 --backends math   # CPU smoke run

Each backend runs ``scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=...)`` with K and V at
the preset's ``kv_heads`` (GQA) or repeated to all heads (``--repeat-kv``), forward and backward, once per
layer of the model, and the time per training step's attention is printed with the rate on the causal
half of 4 B T^2 h flops forward (x 3.5 with backward: 2 forward GEMMs, 5 backward incl. the recompute).
A backend that cannot run the shape is reported, not fatal.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from axonn.presets import get_preset  # noqa: E402
from benchmarks.common import device, timed  # noqa: E402

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backend: SDPBackend, gqa: bool,
                   grad_bthd: bool = False):
    """One forward + backward of causal SDPA restricted to ``backend``; ``grad_bthd``: the output's gradient
    arrives as a Llama layer's does, the transpose of a contiguous (B, T, H, d) tensor."""
    def step() -> None:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        if grad_bthd:
            grad = torch.ones(out.shape[0], out.shape[2], out.shape[1], out.shape[3], device=out.device,
                              dtype=out.dtype).transpose(1, 2)
        else:
            grad = torch.ones_like(out)
        out.backward(grad)
    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="1b", help="model preset whose heads, kv heads and layers are used")
    p.add_argument("--batch", type=int, default=4, help="sequences")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--backends", default="cudnn,flash,efficient", help=f"comma-separated, of {', '.join(BACKENDS)}")
    p.add_argument("--repeat-kv", action="store_true", help="repeat K and V to all heads instead of enable_gqa")
    p.add_argument("--layout", default="bhtd", choices=["bhtd", "bthd"],
                   help="memory layout of q, k, v: bhtd contiguous, or bthd (the projections' output transposed, "
                        "as a Llama layer hands them to SDPA, and the output's gradient likewise)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (each: all layers' attention)")
    a = p.parse_args()
    dev = device()
    shape = get_preset(a.size)
    d = shape.hidden // shape.heads
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    kvh = shape.heads if a.repeat_kv else shape.kv_heads
    g = torch.Generator(device=dev).manual_seed(0)

    def leaf(heads: int) -> torch.Tensor:
        if a.layout == "bthd":
            x = torch.randn(a.batch, a.seq, heads, d, device=dev, dtype=dtype, generator=g).transpose(1, 2)
        else:
            x = torch.randn(a.batch, heads, a.seq, d, device=dev, dtype=dtype, generator=g)
        return x.requires_grad_()

    q, k, v = leaf(shape.heads), leaf(kvh), leaf(kvh)
    flops = 3.5 * 2 * a.batch * a.seq**2 * shape.hidden * shape.layers  # causal half of 4 B T^2 h, fwd+bwd
    print(f"device {dev}, {a.size}: {shape.layers} layers x (B {a.batch}, T {a.seq}, {shape.heads} heads, "
          f"{kvh} kv heads, d {d}), {dtype}, layout {a.layout}")
    for name in [b.strip() for b in a.backends.split(",") if b.strip()]:
        step = attention_step(q, k, v, BACKENDS[name], gqa=kvh != shape.heads, grad_bthd=a.layout == "bthd")
        try:
            s = timed(lambda: [step() for _ in range(shape.layers)], a.steps, 2, dev)
        except RuntimeError as e:
            print(f"{name:9s}: cannot run this shape ({str(e).splitlines()[0][:100]})")
            continue
        print(f"{name:9s}: {s * 1e3:8.2f} ms per step's attention (fwd+bwd)  {flops / s / 1e12:7.1f} TFLOP/s")


if __name__ == "__main__":
    main()
