#!/usr/bin/env python
"""Training on a grid of CPU ranks against one rank, the same cores: step time and loss of our trainer.

Each grid runs under ``torchrun`` (gloo) with the real trainer (:class:`memorization.training.train.Trainer`, fp32,
Goldfish k = 4) on the same rows and global batch, the model built sharded on the grid from the same weights (a
preset, or a pretrained checkpoint with ``--init``).  Every grid gets the same cores: each of its ranks runs
``cores / ranks`` torch threads (at least one), so a grid is faster only where splitting the work beats one
process's threads.  Printed per grid: seconds a step (median of the timed steps, after the warm-up ones), tokens/s,
the ratio to the first grid, and the last step's loss beside the first grid's (equal to float rounding: the grids
train the same model).

    python benchmarks/train_grid.py --init "$(python data/models/get.py smollm2-135m)"   # 1 rank vs 2, 4 x 128
    python benchmarks/train_grid.py --size tiny --grids "1,1,1,1;2,1,1,1" --steps 3      # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from axonn.grid_shape import GridShape  # noqa: E402
from benchmarks.common import torchrun_result  # noqa: E402

GRIDS = ("1,1,1,1", "2,1,1,1", "1,1,1,2")


def worker(a: argparse.Namespace) -> None:
    import torch

    from memorization.training.goldfish import GoldfishConfig
    from memorization.training.models import build_model, model_config
    from memorization.training.runtime import Runtime
    from memorization.training.train import TrainConfig, Trainer

    rt = Runtime.create(GridShape.parse(a.grid))
    torch.set_num_threads(a.threads)
    vocab = model_config(None, 0, init=a.init).vocab_size if a.init else a.vocab
    model = build_model(None if a.init else a.size, vocab, init=a.init, seed=0, runtime=rt)
    rows = torch.randint(3, vocab, (a.batch * (a.steps + a.warmup), a.seq), generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(batch_size=a.batch, lr=1e-4, warmup_steps=1, checkpoint_every=0, progress=False,
                      goldfish=GoldfishConfig(k=4, h=13))
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(model, rows, torch.zeros_like(rows, dtype=torch.int32), rows[:a.batch], cfg, tmp, rt)
        t.total_steps = a.steps + a.warmup
        times, loss = [], None
        for i in range(a.steps + a.warmup):
            rt.barrier()
            t0 = time.perf_counter()
            rec = t.train_step()
            loss = float(rec["loss"])  # reads the step's values: the step has finished on every rank
            rt.barrier()
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
    if rt.is_main:
        print("RESULT " + json.dumps({"grid": a.grid, "ranks": rt.grid.world_size, "threads": a.threads,
                                      "seconds": statistics.median(times), "loss": loss}), flush=True)


def main() -> None:
    from axonn.cli import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--init", default=None, metavar="DIR", help="a pretrained HF checkpoint (default: the preset)")
    p.add_argument("--size", default="tiny", help="model preset when no --init (default: tiny)")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary of the preset (default: 4096)")
    p.add_argument("--seq", type=int, default=128, help="tokens per row (default: 128)")
    p.add_argument("--batch", type=int, default=4, help="global batch in rows (default: 4)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default: 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default: 1)")
    p.add_argument("--cores", type=int, default=os.cpu_count(), help="cores every grid shares (default: all)")
    p.add_argument("--grids", default=";".join(GRIDS), help=f"';'-separated D,R,C,Z grids, the first the reference "
                   f"(default: {';'.join(GRIDS)})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--grid", default="1,1,1,1", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if a.init and not (Path(a.init) / "config.json").is_file():
        p.error(f"--init {a.init}: no Hugging Face checkpoint (config.json) there")
    if min(a.seq, a.batch, a.steps, a.cores) < 1 or a.warmup < 0:
        p.error("--seq, --batch, --steps and --cores must be >= 1, --warmup >= 0")
    grids = []
    for grid in a.grids.split(";"):
        try:
            grids.append((grid, GridShape.parse(grid).size))
        except ValueError as e:
            p.error(f"--grids: {e}")
    rows = []
    for grid, n in grids:
        threads = max(1, a.cores // n)
        args = ["--worker", "--grid", grid, "--threads", str(threads), "--size", a.size, "--vocab", str(a.vocab),
                "--seq", str(a.seq), "--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup)]
        rows.append(torchrun_result(__file__, n, args + (["--init", a.init] if a.init else []), threads))
        print(f"  {grid}: {rows[-1]['seconds']:.2f} s/step", file=sys.stderr, flush=True)
    base, tok = rows[0], a.batch * a.seq
    print(f"Training steps of {a.init or a.size} ({a.batch} x {a.seq} tokens, fp32, Goldfish k=4), {a.cores} cores "
          "shared by every grid, gloo\n")
    print("| grid D,R,C,Z | ranks x threads | s/step | tokens/s | speed vs first grid | last loss | vs first grid |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['grid']} | {r['ranks']} x {r['threads']} | {r['seconds']:.2f} | {tok / r['seconds']:.0f} | "
              f"{base['seconds'] / r['seconds']:.2f}x | {r['loss']:.6f} | {r['loss'] - base['loss']:+.1e} |")


if __name__ == "__main__":
    main()
