"""Thin wrappers around torch.distributed collectives on grid axes.

Every wrapper takes the *axes* (e.g. ``"col"`` or ``("row", "col")``) instead of
a raw group, is a no-op on a size-1 axis, supports ``async_op`` (returning a
:class:`Pending` whose ``wait()`` gives the result) and reports to an optional
byte counter (:func:`count_bytes`) the per-rank volume of the *logical*
collective with the ring formulas (Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", 2005):

* all-gather / reduce-scatter of ``n`` elements (``n`` = full size) over ``p``
  ranks: ``(p-1)/p * n``;
* all-reduce of ``n`` elements: ``2 (p-1)/p * n``.

Gloo fallback for reduce-scatter: if gloo's ``reduce_scatter_tensor`` refuses a call,
we all-reduce the full buffer and keep our slice (twice the traffic; the counter still
reports the logical reduce-scatter and marks the record ``fallback=True``).  Only gloo falls
back, where the refusal is the same on every rank: on NCCL an error is real (out of memory,
a failed communicator), and one rank switching collectives alone would leave the others
waiting in a reduce-scatter it never joins, so the error is raised.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from .grid import Grid, get_grid

# backend -> does it support reduce_scatter_tensor?  AXONN_RS_FALLBACK=1 (read at each call) forces the fallback.
_RS_SUPPORTED: dict[str, bool] = {}
# torch >= 2.13 renamed the tensor-in/tensor-out collectives; keep working on older torch.
_ALL_GATHER_T = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER_T = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class ByteCounter:
    """Records ``(tag, op, axes, elements, bytes, fallback)`` for every collective."""

    records: list[tuple[str, str, str, float, float, bool]] = field(default_factory=list)

    def total(self, op: str | None = None, axes: str | None = None, tag: str | None = None) -> float:
        return sum(r[4] for r in self.records
                   if (op is None or r[1] == op) and (axes is None or r[2] == axes)
                   and (tag is None or r[0] == tag))


_COUNTER: ByteCounter | None = None
_TAG: list[str] = [""]


@contextmanager
def count_bytes() -> Iterator[ByteCounter]:
    """Count bytes moved by this rank's collectives inside the ``with`` block."""
    global _COUNTER
    prev, _COUNTER = _COUNTER, ByteCounter()
    try:
        yield _COUNTER
    finally:
        _COUNTER = prev


@contextmanager
def comm_tag(tag: str) -> Iterator[None]:
    """Label collectives issued inside the block (e.g. with a layer name)."""
    _TAG.append(tag)
    try:
        yield
    finally:
        _TAG.pop()


def _axes_name(axes: str | Iterable[str]) -> str:
    return axes if isinstance(axes, str) else "+".join(axes)


def _record(op: str, axes, p: int, n_full: int, elsize: int, fallback: bool = False) -> None:
    if _COUNTER is None:
        return
    factor = 2.0 if op == "all_reduce" else 1.0
    elems = factor * (p - 1) / p * n_full
    _COUNTER.records.append((_TAG[-1], op, _axes_name(axes), elems, elems * elsize, fallback))


class Pending:
    """Result of an async collective: ``wait()`` returns the finished tensor.

    ``keep``: the collective's input, referenced until ``wait()`` so that its memory is never
    reused while the collective may still read it, whatever the backend does (and so that a
    memory trace sees it live for exactly that long).
    """

    def __init__(self, work, result: torch.Tensor, post: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 keep: torch.Tensor | None = None):
        self._work, self._result, self._post, self._keep = work, result, post, keep

    def wait(self) -> torch.Tensor:
        if self._work is not None:
            self._work.wait()
            self._work = None
        self._keep = None
        if self._post is not None:
            self._result, self._post = self._post(self._result), None
        return self._result


def any_rank(flag: bool, grid: Grid | None = None) -> torch.Tensor | bool:
    """``flag`` OR-ed over every rank: a 0-dim tensor on the grid's device (all-reduce MAX over the
    world, no host sync until it is read) or, on a single rank, ``flag`` itself."""
    grid = grid or get_grid()
    if grid.world_size == 1:
        return flag
    t = torch.full((), float(flag), device=grid.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def all_reduce(t: torch.Tensor, axes, op=dist.ReduceOp.SUM, async_op: bool = False,
               grid: Grid | None = None):
    """In-place all-reduce of ``t`` over ``axes``; returns ``t`` (or a Pending)."""
    grid = grid or get_grid()
    g, p = grid.group(axes), grid.size(axes)
    if p == 1:
        return Pending(None, t) if async_op else t
    _record("all_reduce", axes, p, t.numel(), t.element_size())
    work = dist.all_reduce(t, op=op, group=g, async_op=async_op)
    return Pending(work, t) if async_op else t


def all_gather(t: torch.Tensor, axes, dim: int = 0, async_op: bool = False, grid: Grid | None = None):
    """Concatenate the ``t`` of every rank of ``axes`` along ``dim`` (group-rank order)."""
    grid = grid or get_grid()
    g, p = grid.group(axes), grid.size(axes)
    if p == 1:
        return Pending(None, t) if async_op else t
    t = t.contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    out = torch.empty((p * t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
    _record("all_gather", axes, p, out.numel(), t.element_size())
    work = _ALL_GATHER_T(out, t, group=g, async_op=async_op)
    d = dim % t.dim()
    if d == 0:
        post = None
    else:
        shape = t.shape
        post = lambda o: torch.cat(o.view(p, *shape).unbind(0), dim=d)  # noqa: E731
    if async_op:
        return Pending(work, out, post)
    return post(out) if post else out


def reduce_scatter(t: torch.Tensor, axes, async_op: bool = False, grid: Grid | None = None):
    """Sum ``t`` (1-D, length divisible by the group size) over ``axes`` and keep this rank's chunk."""
    grid = grid or get_grid()
    g, p = grid.group(axes), grid.size(axes)
    if p == 1:
        return Pending(None, t) if async_op else t
    t = t.contiguous()
    n = t.shape[0] // p
    backend = dist.get_backend(g)
    if _RS_SUPPORTED.get(backend, True) and os.environ.get("AXONN_RS_FALLBACK") != "1":
        out = torch.empty((n,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        try:
            work = _REDUCE_SCATTER_T(out, t, group=g, async_op=async_op)
            _record("reduce_scatter", axes, p, t.numel(), t.element_size())
            return Pending(work, out, keep=t) if async_op else out
        except (RuntimeError, NotImplementedError, ValueError):
            if backend != "gloo":
                raise
            _RS_SUPPORTED[backend] = False
    # Fallback: all-reduce the whole buffer, keep our slice.
    i = dist.get_rank(g)
    _record("reduce_scatter", axes, p, t.numel(), t.element_size(), fallback=True)
    work = dist.all_reduce(t, group=g, async_op=async_op)
    post = lambda full: full[i * n:(i + 1) * n].clone()  # noqa: E731
    if async_op:
        return Pending(work, t, post)
    return post(t)
