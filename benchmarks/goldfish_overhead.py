#!/usr/bin/env python
"""Step time of the trainer with Goldfish loss (k=4, h=13) over plain cross-entropy, side by side.

    python benchmarks/goldfish_overhead.py                    # CPU: tiny preset
    python benchmarks/goldfish_overhead.py --size 1b --seq 2048 --batch 4   # GPU (goal: ratio <= 1.01)
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from benchmarks.common import device, stream_context, timed  # noqa: E402
from memorization.training.goldfish import GoldfishConfig  # noqa: E402
from memorization.training.models import build_model  # noqa: E402
from memorization.training.train import TrainConfig, Trainer  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default=None, help="model preset (default: tiny on CPU, 1b on GPU)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default 128 CPU / 2048 GPU)")
    p.add_argument("--batch", type=int, default=None, help="rows per step (default 8 CPU / 4 GPU)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per arm (repeated, interleaved)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (standard, goldfish, ...)")
    p.add_argument("--compile", action="store_true", help="torch.compile the loss/forward")
    a = p.parse_args()
    dev = device()
    gpu = dev.type == "cuda"
    size, seq, batch = a.size or ("1b" if gpu else "tiny"), a.seq or (2048 if gpu else 128), a.batch or (4 if gpu else 8)
    n_rows = batch * (a.steps + 2) * a.rounds * 2 + batch
    rows = torch.randint(3, 32000, (n_rows, seq))
    docs = torch.zeros_like(rows, dtype=torch.int32)
    times: dict[str, list[float]] = {"standard": [], "goldfish": []}
    with tempfile.TemporaryDirectory() as tmp:
        # one model and optimizer; only the Goldfish setting changes between interleaved rounds
        cfg = TrainConfig(batch_size=batch, checkpoint_every=0, progress=False, compile=a.compile)
        t = Trainer(build_model(size, 32000, seed=0), rows, docs, rows[:batch], cfg, tmp, run_name="bench",
                    row_context=stream_context(rows))
        for _ in range(a.rounds):
            for name, k in (("standard", 0), ("goldfish", 4)):
                t.cfg.goldfish = GoldfishConfig(k=k, h=13)
                times[name].append(timed(t.train_step, a.steps, 2, dev))
    st, gf = min(times["standard"]), min(times["goldfish"])
    tok = batch * seq
    print(f"device {dev}, size {size}, {batch} x {seq} tokens per step, best of {a.rounds} rounds of {a.steps} steps")
    print(f"standard CE : {st * 1e3:8.2f} ms/step  {tok / st:10.0f} tok/s")
    print(f"goldfish k=4: {gf * 1e3:8.2f} ms/step  {tok / gf:10.0f} tok/s")
    print(f"step-time ratio goldfish / standard = {gf / st:.4f}  (goal <= 1.01 on a GPU)")


if __name__ == "__main__":
    main()
