"""Rank 1 dies after init; rank 0's next collective must fail (not hang) within the timeout."""
from __future__ import annotations

import os
import time

import torch

import axonn
from axonn.communication import all_reduce

grid = axonn.init(G_data=2)
if grid.rank == 1:
    os._exit(3)
t0 = time.time()
try:
    for _ in range(3):
        all_reduce(torch.ones(4), "data")
        time.sleep(0.5)
except Exception as e:  # noqa: BLE001
    print(f"rank0 got error after {time.time() - t0:.1f}s: {type(e).__name__}: {str(e)[:200]}", flush=True)
    os._exit(7)
print("rank0: no error", flush=True)
os._exit(0)
