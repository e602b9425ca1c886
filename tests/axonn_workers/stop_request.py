"""Only rank 1 is sent SIGUSR1: both ranks must stop after the same step, and resuming continues the curve."""
from __future__ import annotations

import os
import signal
import sys

import torch

from memorization.training.models import build_model
from memorization.training.runtime import Runtime
from memorization.training.train import TrainConfig, Trainer, TrainingInterrupted

out = sys.argv[1]
rt = Runtime.create(data=2)
g = torch.Generator().manual_seed(0)
rows = torch.randint(3, 4096, (8, 32), generator=g).repeat(6, 1)  # 48 rows: 12 steps of 4


def trainer(name: str) -> Trainer:
    cfg = TrainConfig(batch_size=4, lr=3e-3, warmup_steps=3, checkpoint_every=4, progress=False)
    return Trainer(build_model("tiny", 4096, seed=0), rows, torch.zeros_like(rows, dtype=torch.int32), rows[:8], cfg,
                   os.path.join(out, name), rt, run_name=name)


def signal_rank1(rec: dict) -> None:
    if rt.grid.rank == 1 and rec["step"] == 5:
        os.kill(os.getpid(), signal.SIGUSR1)


ref = [h["loss"] for h in trainer("full").fit()["history"]]
stopped = None
try:
    trainer("cut").fit(on_step=signal_rank1)
except TrainingInterrupted as e:
    stopped = e.step
latest = open(os.path.join(out, "cut", "checkpoint", "LATEST")).read().strip()
print(f"rank {rt.grid.rank}: stopped after step {stopped}, LATEST {latest}", flush=True)
resumed = [h["loss"] for h in trainer("cut").fit(resume=True)["history"]]
err = max(abs(a - b) / abs(b) for a, b in zip(resumed, ref))
assert len(resumed) == len(ref) == 12 and err < 1e-6, (resumed, ref)
print(f"rank {rt.grid.rank}: resumed curve matches (max rel err {err:.1e})", flush=True)
