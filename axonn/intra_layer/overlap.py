"""Communication switches (overlap with compute, the gradients' wire dtype) and the queue of
in-flight gradient reductions."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..communication import reduce_scatter
from ..grid import Grid


@dataclass
class OverlapConfig:
    all_reduce: bool = False      # dX all-reduce overlapped with the dW matmul
    reduce_scatter: bool = False  # dW reduce-scatter left in flight while earlier layers back-propagate
    all_gather: bool = False      # next layer's depth all-gather prefetched one layer ahead
    # dtype gradients are summed in over depth and data (None: the parameter's own, fp32)
    grad_reduce_dtype: torch.dtype | None = None


CONFIG = OverlapConfig()
# Counters for tests/diagnostics: prefetched all-gathers consumed, async reduce-scatters issued,
# all-gathers of forwards recomputed by activation checkpointing.
STATS: dict[str, int] = {"prefetch_hits": 0, "async_reduce_scatters": 0, "recompute_gathers": 0}
# (Pending, parameter) pairs of asynchronous weight-gradient reduce-scatters, oldest first.
PENDING_GRADS: list = []
# At most this many stay in flight: queuing one more first finishes the oldest.  Each holds its
# fp32 input (the unreduced gradient of a whole local block) until it is waited for, so an
# unbounded queue would keep Z times every gradient shard alive until sync_gradients.
MAX_IN_FLIGHT_GRADS = 2
_CALLBACK_TASK = -1  # the autograd graph task whose end will finish the queue


class optimize_communication:
    """Turn on non-blocking collectives overlapped with compute.

    * ``overlap_all_reduce``: a Linear's ``dX`` all-reduce runs while its ``dW`` matmul computes;
    * ``overlap_reduce_scatter``: a Linear's (and the embedding's) ``dW`` reduce-scatter over
      depth stays in flight while the layers before it back-propagate (at most
      ``MAX_IN_FLIGHT_GRADS`` at a time; the rest are finished when the backward pass ends);
    * ``overlap_all_gather``: each Linear starts the depth all-gather of the next one's weight
      (forward order in the forward, reverse order in the backward) before its own matmul.  A
      forward recomputed by activation checkpointing gathers synchronously and leaves the
      backward's prefetch in place, so no gathered weight is dropped or left dangling.

    ``grad_reduce_dtype=torch.bfloat16`` sums gradients in bf16 on the wire (the depth
    reduce-scatters and :func:`axonn.sync_gradients`' all-reduce over data): half the bytes of
    the fp32 default, at bf16's rounding of each rank's contribution and of the sum (NCCL adds in
    the wire dtype).  Gradients are still accumulated over micro-steps and kept in fp32.

    Usable as a setter (``axonn.optimize_communication(overlap_all_reduce=True)``
    keeps the setting) or as a context manager (restores the previous setting
    on exit).  The overlapped numbers are identical to the blocking path.
    """

    def __init__(self, overlap_all_reduce: bool = False, overlap_reduce_scatter: bool = False,
                 overlap_all_gather: bool = False, grad_reduce_dtype: torch.dtype | None = None):
        if grad_reduce_dtype is not None and not grad_reduce_dtype.is_floating_point:
            raise ValueError(f"grad_reduce_dtype must be a floating-point dtype (e.g. torch.bfloat16), "
                             f"got {grad_reduce_dtype}")
        self._prev = OverlapConfig(CONFIG.all_reduce, CONFIG.reduce_scatter, CONFIG.all_gather,
                                   CONFIG.grad_reduce_dtype)
        CONFIG.all_reduce = bool(overlap_all_reduce)
        CONFIG.reduce_scatter = bool(overlap_reduce_scatter)
        CONFIG.all_gather = bool(overlap_all_gather)
        CONFIG.grad_reduce_dtype = grad_reduce_dtype

    def __enter__(self) -> "optimize_communication":
        return self

    def __exit__(self, *exc) -> None:
        finish_pending_grads()
        CONFIG.all_reduce, CONFIG.reduce_scatter, CONFIG.all_gather, CONFIG.grad_reduce_dtype = (
            self._prev.all_reduce, self._prev.reduce_scatter, self._prev.all_gather,
            self._prev.grad_reduce_dtype)


def queue_grad(pending, param: torch.nn.Parameter) -> None:
    """Leave a weight-gradient reduce-scatter in flight (accumulated into ``param.grad`` later).

    Called from a backward: the rest are finished when this backward pass ends (an autograd
    engine callback, as DDP's), so none outlives it into the next micro-step's forward.
    """
    global _CALLBACK_TASK
    STATS["async_reduce_scatters"] += 1
    PENDING_GRADS.append((pending, param))
    while len(PENDING_GRADS) > MAX_IN_FLIGHT_GRADS:
        _finish_oldest()
    task = torch._C._current_graph_task_id()
    if task != _CALLBACK_TASK:  # once per backward pass (a failed one leaves no stale flag behind)
        torch.autograd.Variable._execution_engine.queue_callback(finish_pending_grads)
        _CALLBACK_TASK = task


def reduce_weight_grad(grad: torch.Tensor, weight: torch.nn.Parameter, padded_len: int,
                       grid: Grid) -> torch.Tensor | None:
    """The gradient of a depth-sharded ``weight`` from this rank's gradient of its whole local block.

    ``grad`` (any shape) is flattened, cast to the wire dtype (``grad_reduce_dtype``, else the
    weight's), zero-padded to ``padded_len`` and reduce-scattered over depth (summing the depth
    ranks' different micro-batches); the result is returned in the weight's dtype.  ``grad`` is
    consumed: pass it without keeping a reference, so a cast copy lets it go before the
    reduce-scatter allocates its output (one local block less at the backward's peak).  With
    ``overlap_reduce_scatter`` the reduce-scatter is queued (:func:`queue_grad`) and ``None`` is
    returned: it lands in ``weight.grad`` later.
    """
    depth = grid.size("depth")
    wire = CONFIG.grad_reduce_dtype if depth > 1 and CONFIG.grad_reduce_dtype is not None else weight.dtype
    n = grad.numel()
    if padded_len > n:  # one buffer: cast and pad in a single copy
        flat = torch.empty(padded_len, dtype=wire, device=grad.device)
        flat[:n].copy_(grad.reshape(-1))
        flat[n:].zero_()
    else:
        flat = grad.reshape(-1).to(wire)
    del grad
    if depth == 1:
        return flat
    if CONFIG.reduce_scatter:
        queue_grad(reduce_scatter(flat, "depth", async_op=True, grid=grid), weight)
        return None
    return reduce_scatter(flat, "depth", grid=grid).to(weight.dtype)


def _finish_oldest() -> None:
    pending, param = PENDING_GRADS.pop(0)
    g = pending.wait()
    with torch.no_grad():
        if param.grad is None:
            param.grad = g.to(param.dtype)
        else:
            param.grad.add_(g)


def finish_pending_grads() -> None:
    """Wait for every in-flight weight-gradient reduce-scatter and accumulate into ``.grad``."""
    while PENDING_GRADS:
        _finish_oldest()
