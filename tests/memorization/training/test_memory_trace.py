"""memorization/training/memory_trace.py: the peak of live tensor storages, each counted once however many views share
it."""
from __future__ import annotations

import torch

from memorization.training.memory_trace import PeakMemory


def test_peak_memory_counts_live_storages_once():
    a = torch.zeros(1000)  # 4000 B, existing
    with PeakMemory([a, a[10:]]) as tracker:  # a view shares the storage
        b = torch.ones(2000)  # 8000 B
        c = b.view(40, 50)  # no new storage
        c.add_(1)  # in place: no new storage
        del b, c  # freed: live back to 4000
        d = torch.ones(500)  # 2000 B
    assert tracker.base == 4000
    assert tracker.peak == 12000
    assert tracker.live == 6000
    ops = {op for op, *_ in tracker.at_peak}
    assert ops == {"existing", "ones"}
    del d
