"""How long a checkpoint stops training: the blocking save against the background save, side by side.

    python benchmarks/checkpoint_stall.py --size 160m --steps 4

One process (grid 1,1,1,1), the preset's model built and parallelized as the trainer builds it,
AdamW with its state, synthetic token batches (bf16 autocast on a GPU).  Measured in one run, each ``--repeat`` times
(median):

* ``step``: a training step with no checkpoint in flight;
* blocking: ``axonn.checkpoint.save`` — training waits for every byte to be written and fsynced;
* background: ``save(background=True)`` (the host snapshot: training waits for this), then
  ``--steps`` training steps while the writer thread writes, then ``finish()`` (training waits
  for whatever is left).  Its stall is snapshot + the extra time of the overlapped steps over
  plain ones + the wait in ``finish``.

The ratio printed is the blocking stall over the background one.  On a GPU the snapshot is a
device-to-host copy and the writer competes with nothing; on a CPU-only machine the writer
thread shares the cores with the training step, so the gain is a lower bound.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from axonn.cli import HelpFormatter  # noqa: E402
import axonn.checkpoint as ckpt  # noqa: E402
from benchmarks.common import device, sync  # noqa: E402
from memorization.training.models import build_model  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="160m", help="model-shape preset (axonn/presets.yaml)")
    p.add_argument("--seq", type=int, default=256, help="tokens per row of the synthetic batch")
    p.add_argument("--batch", type=int, default=2, help="rows per training step")
    p.add_argument("--steps", type=int, default=4, help="training steps run while a background save writes")
    p.add_argument("--repeat", type=int, default=3, help="measurements of each kind (the median is printed)")
    p.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temporary directory)")
    a = p.parse_args(argv)

    dev = device()
    rt = Runtime.create()
    model = build_model(a.size, vocab_size=32000, runtime=rt)
    # fused on a GPU, as the trainer's (memorization/training/train.py): the step time the overlapped steps are
    # compared with, and the state the snapshot copies (fused keeps AdamW's step counts on the GPU), are the trainer's
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=dev.type == "cuda")
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (a.batch, a.seq), generator=gen).to(dev)

    def train_step() -> float:
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
            loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(dev)
        return time.perf_counter() - t0

    train_step()  # AdamW's state exists from here on
    work = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="ckpt_stall_"))
    work.mkdir(parents=True, exist_ok=True)
    gb = ckpt.state_bytes(model, opt) / 1e9
    print(f"{a.size}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"{gb:.2f} GB of weights + AdamW state to write, device {dev}, into {work}")
    from tqdm.auto import tqdm

    step_s, blocking_s, snap_s, overlapped_s, wait_s = [], [], [], [], []
    try:
        for i in tqdm(range(a.repeat), desc="measure", unit="round"):
            step_s += [train_step() for _ in range(a.steps)]
            t0 = time.perf_counter()
            ckpt.save(model, opt, work / f"blocking{i}", grid=rt.grid)
            blocking_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pending = ckpt.save(model, opt, work / f"background{i}", grid=rt.grid, background=True)
            snap_s.append(time.perf_counter() - t0)
            overlapped_s.append(sum(train_step() for _ in range(a.steps)))
            t0 = time.perf_counter()
            pending.finish()
            wait_s.append(time.perf_counter() - t0)
            for d in (f"blocking{i}", f"background{i}"):
                shutil.rmtree(work / d)
    finally:
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    step = statistics.median(step_s)
    blocking = statistics.median(blocking_s)
    snap, wait = statistics.median(snap_s), statistics.median(wait_s)
    slowdown = max(0.0, statistics.median(overlapped_s) - a.steps * step)
    background = snap + slowdown + wait
    print(f"\ntraining step                              {step:8.3f} s")
    print(f"blocking save: training waits              {blocking:8.3f} s   ({gb / blocking:.2f} GB/s)")
    print(f"background save: snapshot to host          {snap:8.3f} s")
    print(f"                 {a.steps} overlapped steps' extra  {slowdown:8.3f} s")
    print(f"                 wait in finish()          {wait:8.3f} s")
    print(f"                 training waits            {background:8.3f} s")
    print(f"checkpoint stall, blocking / background:   {blocking / max(background, 1e-9):8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
