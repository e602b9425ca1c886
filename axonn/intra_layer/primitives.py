"""Differentiable re-layout primitives on the last (feature) dimension.

* :func:`drop`   forward: keep this rank's contiguous chunk of the last dim
  (input replicated over ``axes``); backward: all-gather the gradient chunks.
* :func:`gather` forward: all-gather chunks along the last dim; backward: keep
  this rank's chunk (the downstream computation is replicated over ``axes``).
* :func:`reduce_forward` forward: all-reduce (sum); backward: identity (the
  output is consumed identically on every rank of ``axes``).
* :func:`reduce_both` forward: all-reduce (sum); backward: all-reduce (sum) of the gradient
  (each rank of ``axes`` consumes the sum in its own, different way).
* :func:`slice_replicated` forward: this rank's chunk of the last dim of a tensor replicated over
  ``axes`` (a replicated weight); backward: the chunk's gradient zero-padded to full width and summed
  over ``axes``, so every rank holds the full gradient of the replicated tensor.

Each is opaque to ``torch.compile`` (``torch.compiler.disable``): collectives run eagerly and the
model code between them compiles into graphs that every layer reuses.
"""
from __future__ import annotations

import torch

from ..communication import all_gather, all_reduce
from ..grid import Grid


def _chunk(x: torch.Tensor, axes, grid: Grid) -> torch.Tensor:
    p, i = grid.size(axes), grid.index(axes)
    n = x.shape[-1] // p
    return x[..., i * n:(i + 1) * n].contiguous()


class _Drop(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axes, grid):
        ctx.axes, ctx.grid = axes, grid
        return _chunk(x, axes, grid)

    @staticmethod
    def backward(ctx, dy):
        return all_gather(dy.contiguous(), ctx.axes, dim=-1, grid=ctx.grid), None, None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axes, grid):
        ctx.axes, ctx.grid = axes, grid
        return all_gather(x.contiguous(), axes, dim=-1, grid=grid)

    @staticmethod
    def backward(ctx, dy):
        return _chunk(dy, ctx.axes, ctx.grid), None, None


class _ReduceFwd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axes, grid):
        return all_reduce(x.clone(), axes, grid=grid)

    @staticmethod
    def backward(ctx, dy):
        return dy, None, None


class _ReduceBoth(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axes, grid):
        ctx.axes, ctx.grid = axes, grid
        return all_reduce(x.clone(), axes, grid=grid)

    @staticmethod
    def backward(ctx, dy):
        return all_reduce(dy.clone(), ctx.axes, grid=ctx.grid), None, None


class _SliceReplicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, axes, grid):
        ctx.axes, ctx.grid = axes, grid
        return _chunk(x, axes, grid)

    @staticmethod
    def backward(ctx, dy):
        p, i = ctx.grid.size(ctx.axes), ctx.grid.index(ctx.axes)
        n = dy.shape[-1]
        full = dy.new_zeros((*dy.shape[:-1], n * p))
        full[..., i * n:(i + 1) * n] = dy
        return all_reduce(full, ctx.axes, grid=ctx.grid), None, None


@torch.compiler.disable
def drop(x: torch.Tensor, axes, grid: Grid) -> torch.Tensor:
    return x if grid.size(axes) == 1 else _Drop.apply(x, axes, grid)


@torch.compiler.disable
def gather(x: torch.Tensor, axes, grid: Grid) -> torch.Tensor:
    return x if grid.size(axes) == 1 else _Gather.apply(x, axes, grid)


@torch.compiler.disable
def reduce_forward(x: torch.Tensor, axes, grid: Grid) -> torch.Tensor:
    return x if grid.size(axes) == 1 else _ReduceFwd.apply(x, axes, grid)


@torch.compiler.disable
def reduce_both(x: torch.Tensor, axes, grid: Grid) -> torch.Tensor:
    return x if grid.size(axes) == 1 else _ReduceBoth.apply(x, axes, grid)


@torch.compiler.disable
def slice_replicated(x: torch.Tensor, axes, grid: Grid) -> torch.Tensor:
    return x if grid.size(axes) == 1 else _SliceReplicated.apply(x, axes, grid)
