#!/usr/bin/env python
"""The optimizer step with gradient clipping: the clip's own pass over the gradients (``axonn.clip_grad_norm_``,
then fused AdamW) against the clip taken inside fused AdamW's kernel as its ``grad_scale``
(``Runtime.clip_and_step``, what the trainer does with a fused optimizer), side by side, interleaved.

    python benchmarks/clip_step.py                 # CPU: the 1b's parameter shapes, 4 of its 22 layers (~0.3 B)
    python benchmarks/clip_step.py --layers 22     # GPU: the whole 1b (1.1 B parameters)

Both arms compute the same grid-wide norm and take the same fused AdamW step (fp32 parameters, gradients and
state); the clip pass they differ by reads and writes every gradient once, 8 bytes a parameter, against the
~36 of the rest (the norm's read of the gradients; the parameter, both moments and the gradient read and written by
the step). The clip is active at every step.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import axonn  # noqa: E402
from axonn.cli import HelpFormatter  # noqa: E402
from axonn.presets import get_preset, preset_names  # noqa: E402
from benchmarks.common import device, timed  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402


def shapes(size: str, layers: int | None) -> list[tuple[int, ...]]:
    """The parameter shapes of the HF Llama of preset ``size`` (``layers`` of its decoder layers)."""
    s = get_preset(size)
    h, kv = s.hidden, s.kv_heads * s.head_dim
    layer = [(h, h), (kv, h), (kv, h), (h, h), (s.ffn, h), (s.ffn, h), (h, s.ffn), (h,), (h,)]
    return [(s.vocab, h)] + layer * (s.layers if layers is None else layers) + [(h,), (s.vocab, h)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="1b", choices=preset_names(), help="preset whose parameter shapes to use")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers to keep (default: 4 on CPU, all of the preset's on a GPU)")
    p.add_argument("--steps", type=int, default=10, help="timed optimizer steps per arm and round")
    p.add_argument("--rounds", type=int, default=6, help="interleaved rounds (clip pass, in-kernel, ...)")
    a = p.parse_args()
    dev = device()
    layers = a.layers if a.layers is not None else (None if dev.type == "cuda" else 4)
    rt = Runtime(axonn.init())
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=dev) * 0.02) for s in shapes(a.size, layers)]
    grads = [torch.randn_like(q) for q in params]  # norm ~ sqrt(N) >> 1: clipped at every step
    opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    n = sum(q.numel() for q in params)

    def step(in_kernel: bool):
        def run() -> None:
            for q, g in zip(params, grads):
                q.grad = g  # the same tensors every step: no allocation timed
            if in_kernel:
                rt.clip_and_step(opt, params, 1.0)
            else:
                axonn.clip_grad_norm_(params, 1.0, grid=rt.grid)
                opt.step()
        return run

    times: dict[str, list[float]] = {"clip pass + fused AdamW": [], "clip inside fused AdamW": []}
    for _ in range(a.rounds):
        for name in times:
            times[name].append(timed(step(name.startswith("clip inside")), a.steps, 1, dev))
    best = {k: min(v) for k, v in times.items()}
    print(f"device {dev}, {a.size} shapes, {layers if layers is not None else get_preset(a.size).layers} layers: "
          f"{n / 1e9:.2f} B fp32 parameters")
    for name, s in best.items():
        print(f"{name:24s}: {s * 1e3:8.1f} ms per step (best of {a.rounds} rounds)")
    slow, fast = best["clip pass + fused AdamW"], best["clip inside fused AdamW"]
    print(f"speedup clip inside / clip pass = {slow / fast:.2f}x ({(slow - fast) * 1e3:.1f} ms saved per step)")


if __name__ == "__main__":
    main()
