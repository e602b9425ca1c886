"""Rank 1 stays alive but never joins a row-group collective; rank 0's all-reduce on that sub-group
must fail after ``AXONN_TIMEOUT`` (not torch's 30-minute default for groups made by ``new_group``).

Grid data=2 x row=2 on 4 ranks: the row group {0, 1} is a sub-group, not the world.  Rank 0 prints
how long its collective took and writes ``$AXONN_TEST_DONE``; the other ranks wait for that file (at
most ``STUCK_S`` seconds) and exit, so a hang shows as rank 0 taking about ``STUCK_S`` seconds."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

import axonn
from axonn.communication import all_reduce

STUCK_S = 30.0
done = Path(os.environ["AXONN_TEST_DONE"])
grid = axonn.init(G_data=2, G_intra_r=2)
assert grid.group("row") is not None and grid.size("row") < grid.world_size
if grid.rank != 0:
    t0 = time.time()
    while not done.exists() and time.time() - t0 < STUCK_S:
        time.sleep(0.1)
    os._exit(3)
t0 = time.time()
try:
    all_reduce(torch.ones(4), "row")
    print(f"rank0: no error after {time.time() - t0:.1f}s", flush=True)
    rc = 0
except Exception as e:  # noqa: BLE001
    print(f"rank0: error after {time.time() - t0:.1f}s: {type(e).__name__}: {str(e)[:200]}", flush=True)
    rc = 7
done.write_text("done")
os._exit(rc)
