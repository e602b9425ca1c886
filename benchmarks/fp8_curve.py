#!/usr/bin/env python
"""FP8 against bf16 on the same training run: the loss curves side by side and whether they agree within a tolerance.

    python benchmarks/fp8_curve.py                                   # GPU: 1b preset, 200 steps of 4 x 2048, compiled
    python benchmarks/fp8_curve.py --size tiny --seq 64 --batch 4 --steps 30 --no-compile   # CPU smoke run

Both runs are our trainer from the same initialisation on the same rows: bf16 autocast (``TrainConfig.bf16``, on
CUDA) and the same with its Linears but the LM head in FP8 (``TrainConfig.fp8``, torchao's recipe). The rows are a
learnable synthetic stream -- each token is ``(a * previous + b) mod V`` with probability 0.9, uniform otherwise --
so the loss falls to a floor of about ``0.1 ln V + H(0.1)`` nats and relative differences stay meaningful. Printed:
both losses every ``--every`` steps, then the mean and max relative difference over the last half of the run,
and ``fp8 curve OK`` if the mean is within ``--tol`` (default 1%) and the max within ``3 * tol``, else ``BAD``.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from benchmarks.train_throughput import VOCAB, bench_model  # noqa: E402
from memorization.training.goldfish import GoldfishConfig  # noqa: E402
from memorization.training.train import TrainConfig, Trainer  # noqa: E402


def synthetic_rows(n: int, seq: int, vocab: int, seed: int = 0, p_rule: float = 0.9) -> torch.Tensor:
    """``n`` rows where each token follows ``(a * prev + b) mod vocab`` with probability ``p_rule``, else uniform."""
    g = torch.Generator().manual_seed(seed)
    a, b = 48271, 11
    rows = torch.empty(n, seq, dtype=torch.long)
    rows[:, 0] = torch.randint(3, vocab, (n,), generator=g)
    noise = torch.randint(3, vocab, (n, seq), generator=g)
    keep = torch.rand(n, seq, generator=g) < p_rule
    for t in range(1, seq):
        rule = (rows[:, t - 1] * a + b) % (vocab - 3) + 3
        rows[:, t] = torch.where(keep[:, t], rule, noise[:, t])
    return rows


def curve(size: str, layers: int | None, rows: torch.Tensor, batch: int, steps: int, lr: float, compile: bool,
          fp8: str) -> list[float]:
    """The per-step training losses of our trainer on ``rows`` (``fp8``: its recipe, "" for bf16/fp32)."""
    cfg = TrainConfig(batch_size=batch, steps=steps, lr=lr, warmup_steps=min(20, steps // 10), checkpoint_every=0,
                      progress=False, compile=compile, fp8=fp8, goldfish=GoldfishConfig(k=0))
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(bench_model(size, layers), rows, torch.zeros_like(rows, dtype=torch.int32), rows[:batch], cfg,
                    tmp, run_name=fp8 or "bf16")
        return [h["loss"] for h in t.fit()["history"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="1b", help="model preset")
    p.add_argument("--layers", type=int, default=0, help="layers to build (0: the preset's)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--steps", type=int, default=200, help="training steps of each run")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (linear warmup, cosine decay)")
    p.add_argument("--fp8", default="rowwise", choices=["rowwise", "tensorwise"], help="torchao float8 recipe")
    p.add_argument("--tol", type=float, default=0.01, help="allowed mean relative loss difference, last half")
    p.add_argument("--every", type=int, default=20, help="print the losses every N steps")
    p.add_argument("--no-compile", action="store_true", help="do not torch.compile the forward")
    a = p.parse_args()
    if a.steps < 2 or a.batch < 1 or a.layers < 0 or a.tol <= 0:
        p.error("--steps must be >= 2, --batch >= 1, --layers >= 0 and --tol > 0")
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        p.error("FP8 needs torchao: pip install -e '.[fp8]'")
    rows = synthetic_rows(a.steps * a.batch, a.seq, VOCAB)
    runs = {name: curve(a.size, a.layers or None, rows, a.batch, a.steps, a.lr, not a.no_compile, fp8)
            for name, fp8 in (("bf16", ""), (f"fp8 {a.fp8}", a.fp8))}
    ref, got = runs.values()
    print(f"{a.size}{f' ({a.layers} layers)' if a.layers else ''}, {a.steps} steps of {a.batch} x {a.seq}, "
          f"lr {a.lr}, synthetic stream (floor ~{0.1 * torch.log(torch.tensor(float(VOCAB))).item() + 0.325:.2f})")
    for s in range(0, a.steps, a.every):
        print(f"step {s:4d}: bf16 {ref[s]:.4f}  fp8 {got[s]:.4f}  rel {abs(got[s] - ref[s]) / ref[s]:.4f}")
    tail = [abs(g - r) / r for g, r in zip(got[a.steps // 2:], ref[a.steps // 2:])]
    mean, worst = sum(tail) / len(tail), max(tail)
    ok = mean <= a.tol and worst <= 3 * a.tol
    print(f"last {len(tail)} steps: mean rel diff {mean:.4f}, max {worst:.4f} (tolerance {a.tol} / {3 * a.tol}); "
          f"final loss bf16 {ref[-1]:.4f} fp8 {got[-1]:.4f}")
    print(f"fp8 curve {'OK' if ok else 'BAD'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
