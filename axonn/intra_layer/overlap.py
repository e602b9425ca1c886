"""Communication/computation overlap switches and the queue of in-flight gradient reductions."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class OverlapConfig:
    all_reduce: bool = False      # dX all-reduce overlapped with the dW matmul
    reduce_scatter: bool = False  # dW reduce-scatter left in flight until sync_gradients
    all_gather: bool = False      # next layer's depth all-gather prefetched one layer ahead


CONFIG = OverlapConfig()
# Counters for tests/diagnostics: prefetched all-gathers actually consumed, async RS issued.
STATS: dict[str, int] = {"prefetch_hits": 0, "async_reduce_scatters": 0}
# (Pending, parameter) pairs of asynchronous weight-gradient reduce-scatters.
PENDING_GRADS: list = []


class optimize_communication:
    """Turn on non-blocking collectives overlapped with compute.

    Usable as a setter (``axonn.optimize_communication(overlap_all_reduce=True)``
    keeps the setting) or as a context manager (restores the previous setting
    on exit).  With ``overlap_reduce_scatter`` the weight-gradient
    reduce-scatters are waited for (and accumulated into ``.grad``) in
    :func:`axonn.sync_gradients` / :func:`finish_pending_grads`.  The numbers
    are identical to the blocking path.
    """

    def __init__(self, overlap_all_reduce: bool = False, overlap_reduce_scatter: bool = False,
                 overlap_all_gather: bool = False):
        self._prev = OverlapConfig(CONFIG.all_reduce, CONFIG.reduce_scatter, CONFIG.all_gather)
        CONFIG.all_reduce = bool(overlap_all_reduce)
        CONFIG.reduce_scatter = bool(overlap_reduce_scatter)
        CONFIG.all_gather = bool(overlap_all_gather)

    def __enter__(self) -> "optimize_communication":
        return self

    def __exit__(self, *exc) -> None:
        finish_pending_grads()
        CONFIG.all_reduce, CONFIG.reduce_scatter, CONFIG.all_gather = (
            self._prev.all_reduce, self._prev.reduce_scatter, self._prev.all_gather)


def finish_pending_grads() -> None:
    """Wait for every in-flight weight-gradient reduce-scatter and accumulate into ``.grad``."""
    while PENDING_GRADS:
        pending, param = PENDING_GRADS.pop(0)
        g = pending.wait()
        with torch.no_grad():
            if param.grad is None:
                param.grad = g.to(param.dtype)
            else:
                param.grad.add_(g)
