#!/usr/bin/env python
"""The LM head + cross-entropy, forward and backward: fused (``memorization/training/loss.py``, one GPU's HF head)
against the checkpointed chunk loop (the logits of each chunk recomputed in the backward), side by side, interleaved.

    python benchmarks/fused_loss.py                         # CPU: 4,096 positions, h 512, V 8,000, chunks of 1,024
    python benchmarks/fused_loss.py --tokens 8188 --hidden 2048 --vocab 32000 --chunk 4096   # GPU: the 1b at 4 x 2048

On CUDA both run under bf16 autocast, as in the trainer. The fused loss runs the ``m × h × V`` head GEMM three
times, the checkpointed one four; the ratio also holds the fp32 logits pass the fused one saves.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from benchmarks.common import device, timed  # noqa: E402
import memorization.training.loss as loss_mod  # noqa: E402
from memorization.training.goldfish import IGNORE_INDEX  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--tokens", type=int, default=4096, help="positions the loss covers (micro-batch x (seq - 1))")
    p.add_argument("--hidden", type=int, default=512, help="hidden size")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size")
    p.add_argument("--chunk", type=int, default=1024, help="positions per chunk (TrainConfig.chunk_tokens)")
    p.add_argument("--steps", type=int, default=3, help="timed forward + backward passes per arm and round")
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (checkpointed, fused, ...)")
    a = p.parse_args()
    dev = device()
    torch.manual_seed(0)
    head = torch.nn.Linear(a.hidden, a.vocab, bias=False, device=dev)
    hidden = torch.randn(1, a.tokens + 1, a.hidden, device=dev, requires_grad=True)
    labels = torch.randint(0, a.vocab, (1, a.tokens + 1), device=dev)
    labels[torch.rand(labels.shape, device=dev) < 0.25] = IGNORE_INDEX  # Goldfish k = 4

    def ce(logits, y):
        return F.cross_entropy(logits, y, ignore_index=IGNORE_INDEX, reduction="sum")

    def step(fuse: bool) -> None:
        hidden.grad = head.weight.grad = None
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = loss_mod.chunked_lm_loss_sum(hidden, head, labels, ce, a.chunk, fuse=fuse)
        loss.backward()

    times: dict[str, list[float]] = {"checkpointed": [], "fused": []}
    for _ in range(a.rounds):
        for name in times:
            times[name].append(timed(lambda: step(name == "fused"), a.steps, 1, dev))
    best = {k: min(v) for k, v in times.items()}
    print(f"device {dev}, {a.tokens} positions, hidden {a.hidden}, vocab {a.vocab}, chunks of {a.chunk}")
    for name, s in best.items():
        print(f"{name:12s}: {s * 1e3:8.1f} ms per forward + backward (best of {a.rounds} rounds)")
    print(f"speedup fused / checkpointed = {best['checkpointed'] / best['fused']:.2f}x")


if __name__ == "__main__":
    main()
