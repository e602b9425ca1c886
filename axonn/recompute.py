"""Activation recomputation (activation checkpointing) of decoder layers, keeping only a 1/(R·C) slice of each
layer input.

In the layout of :func:`axonn.parallelize` the residual stream entering a decoder layer is
replicated over the row and column groups: the ``R·C`` ranks of a tensor-parallel group hold
the same ``(b, s, h)`` fp32 tensor.  Plain checkpointing saves it on every rank, ``L·4·b·s·h``
bytes per rank (31.5 GiB for the 405B at micro-batch 2 of 2048 tokens).  Here rank ``i`` of the
row × column group keeps only elements ``[i·n/(R·C), (i+1)·n/(R·C))`` of the flattened input;
backward all-gathers it over row × column, recomputes the layer under the forward's autocast
and RNG state, and back-propagates through the recomputed graph (which also accumulates the
parameters' gradients), so the gradient is exactly that of plain checkpointing.

Volume: one all-gather of ``(R·C − 1)/(R·C) · b·s·h`` fp32 elements per layer and micro-step,
in backward.
"""
from __future__ import annotations

import math
from contextlib import ExitStack
from typing import Callable

import torch

from .communication import all_gather
from .grid import Grid

TP_AXES = ("row", "col")


class _SlicedRecompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn: Callable[[torch.Tensor], torch.Tensor], grid: Grid, x: torch.Tensor) -> torch.Tensor:
        ctx.fn, ctx.grid = fn, grid
        ctx.autocast = [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]
        ctx.cpu_rng = torch.get_rng_state()
        ctx.cuda_rng = torch.cuda.get_rng_state(x.device) if x.is_cuda else None
        with torch.no_grad():
            y = fn(x)
        n, i = grid.size(TP_AXES), grid.index(TP_AXES)
        per = math.ceil(x.numel() / n)
        flat = x.detach().reshape(-1)
        shard = flat[i * per:(i + 1) * per].clone()
        if shard.numel() < per:  # the last ranks' slices of an uneven split are zero-padded
            shard = torch.cat([shard, shard.new_zeros(per - shard.numel())])
        ctx.save_for_backward(shard)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        (shard,) = ctx.saved_tensors
        n = math.prod(ctx.shape)
        x = all_gather(shard, TP_AXES, grid=ctx.grid)[:n].view(ctx.shape).detach().requires_grad_(True)
        devices = [x.device] if x.is_cuda else []
        with ExitStack() as stack:
            stack.enter_context(torch.random.fork_rng(devices=devices))
            torch.set_rng_state(ctx.cpu_rng)
            if ctx.cuda_rng is not None:
                torch.cuda.set_rng_state(ctx.cuda_rng, x.device)
            for device, dtype in ctx.autocast:
                stack.enter_context(torch.autocast(device, dtype=dtype))
            stack.enter_context(torch.enable_grad())
            y = ctx.fn(x)
        torch.autograd.backward(y, dy)
        return None, None, x.grad


# torch.compile: the autograd.Function (RNG state, an all-gather and a nested backward) runs eagerly, while
# the layer it calls in the forward still compiles (recursive=False); the backward's recomputation is eager
_apply_eagerly = torch.compiler.disable(_SlicedRecompute.apply, recursive=False)


def sliced_recompute(grid: Grid) -> Callable:
    """A ``checkpoint(function, hidden_states)`` for HF's ``_gradient_checkpointing_func`` (see module doc)."""

    def checkpoint(function: Callable, hidden_states: torch.Tensor, *args, **kwargs):
        if args or kwargs:
            raise TypeError("axonn's sliced recomputation takes the layer's hidden states only (HF passes the rest "
                            "bound into `function`)")
        returned: dict[str, int] = {}

        def layer(x: torch.Tensor) -> torch.Tensor:
            out = function(x)
            if isinstance(out, tuple):  # transformers < 4.54 layers return (hidden_states, None, ...)
                if any(o is not None for o in out[1:]):
                    raise ValueError("sliced activation recomputation needs a layer that returns only hidden states "
                                     "(no attention weights or cache)")
                returned["tuple"] = len(out)
                out = out[0]
            return out

        y = _apply_eagerly(layer, grid, hidden_states)
        return (y,) + (None,) * (returned["tuple"] - 1) if "tuple" in returned else y

    return checkpoint


def enable_activation_checkpointing(model: torch.nn.Module, grid: Grid | None = None) -> None:
    """Checkpoint every decoder layer of a (parallelized) HF model.

    On a tensor-parallel layout (``R·C > 1``) the saved layer inputs are sharded over row × column
    (:class:`_SlicedRecompute`); otherwise this is HF's own non-reentrant checkpointing.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers >= 5
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    grid = grid or getattr(model, "_axonn_grid", None)
    if grid is None or grid.size(TP_AXES) == 1:
        return
    func = sliced_recompute(grid)
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False):
            module._gradient_checkpointing_func = func
