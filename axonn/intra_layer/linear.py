"""3D tensor-parallel Linear layer (Y = X Wᵀ, W is ``out × in``).

Sharding (``transpose=False``; ``transpose=True`` swaps row and col):

* ``W[out, in]``: ``out`` split over the **row** group, ``in`` over the
  **column** group; the local ``out/Gr × in/Gc`` block is flattened, zero-padded
  to a multiple of ``Gz`` and split again over the **depth** group.  The
  parameter ``weight`` is this rank's 1-D depth shard.
* ``bias[out]``: ``out`` split over the row group (replicated over col, depth, data).
* input ``X``: last dim sharded over the column group (``in/Gc``), replicated over row;
  output ``Y``: last dim sharded over the row group (``out/Gr``), replicated over col.
  With ``drop_input``/``gather_output`` (the default unless ``expert_mode``) the
  layer takes and returns full (replicated) activations instead.

Forward: all-gather W over depth; ``Y_local = X_local W_localᵀ``; all-reduce Y over col.
Under autocast the shard is cast to the autocast dtype *before* the all-gather (the matmul would
cast the gathered weight anyway, so the result is bit-identical): a bf16 run moves and holds 2 B
per gathered element, not 4.
Backward: all-gather W over depth again (in ``dY``'s dtype); ``dX = dY W`` all-reduced over row;
``dW = dYᵀ X`` reduce-scattered over depth (summing the depth ranks' different
micro-batches).  Data-parallel (and, for replicated params, depth) reduction
happens in :func:`axonn.sync_gradients`.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn as nn

from ..communication import all_gather, all_reduce, comm_tag
from ..grid import Grid, divisor_hint, get_grid
from ..sharding import ShardSpec, extract
from . import autotune
from .overlap import CONFIG, STATS, reduce_weight_grad
from .primitives import drop, gather


def autocast_dtype(x: torch.Tensor, w: torch.Tensor) -> torch.dtype:
    """The dtype the forward matmul will run in: autocast's, where it is on for ``x``'s device."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else w.dtype


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_shard, layer):
        with comm_tag(layer.axonn_name):
            dtype = autocast_dtype(x, w_shard)
            w = layer._local_weight(w_shard, backward=False, dtype=dtype)
            # F.linear(x, w) unless autotuning is on; FP8 (opt-in, axonn.intra_layer.fp8) takes x in the compute dtype
            y = layer.fp8("fwd", x.to(dtype), w) if layer.fp8 else autotune.matmul("fwd", x, w)
            all_reduce(y, layer.in_axis, grid=layer.grid)
        ctx.save_for_backward(x, w_shard)
        ctx.layer = layer
        return y

    @staticmethod
    def backward(ctx, dy):
        with comm_tag(ctx.layer.axonn_name):
            return _LinearFn._backward(ctx, dy)

    @staticmethod
    def _backward(ctx, dy):
        layer = ctx.layer
        x, w_shard = ctx.saved_tensors
        dy = dy.contiguous()
        # under autocast the forward ran in low precision; backward runs outside autocast, so
        # compute in dy's dtype and hand the weight gradient back in the master weight's dtype
        w = layer._local_weight(w_shard, backward=True, dtype=dy.dtype).to(dy.dtype)
        x = x.to(dy.dtype)
        mm = layer.fp8 or autotune.matmul
        dx = pending_dx = None
        if ctx.needs_input_grad[0]:
            dx = mm("dgrad", dy, w)  # dy @ w
            pending_dx = all_reduce(dx, layer.out_axis, async_op=CONFIG.all_reduce, grid=layer.grid)
        dw = None
        if ctx.needs_input_grad[1]:
            # dyᵀ @ x
            dw = reduce_weight_grad(mm("wgrad", dy.reshape(-1, layer.local_out), x.reshape(-1, layer.local_in)),
                                    layer.weight, layer.weight_spec.padded_len, layer.grid)
        if CONFIG.all_reduce and pending_dx is not None:
            dx = pending_dx.wait()
        return dx, dw, None


class Linear(nn.Module):
    """Tensor-parallel ``nn.Linear`` over the row, column and depth groups (see module doc)."""

    fp8 = None  # the local products in FP8 when set (axonn.intra_layer.fp8.enable_fp8); the collectives are unchanged

    def __init__(self, in_features: int, out_features: int, bias: bool = True, transpose: bool = False,
                 expert_mode: bool = False, *, drop_input: bool | None = None,
                 gather_output: bool | str | None = None, grid: Grid | None = None,
                 device=None, dtype=None, init: bool = True):
        super().__init__()
        self.grid = grid = grid or get_grid()
        self.in_features, self.out_features, self.transpose = in_features, out_features, transpose
        self.out_axis, self.in_axis = ("col", "row") if transpose else ("row", "col")
        g_out, g_in = grid.size(self.out_axis), grid.size(self.in_axis)
        for name, n, ax, g in (("out_features", out_features, self.out_axis, g_out),
                               ("in_features", in_features, self.in_axis, g_in)):
            if n % g:
                raise ValueError(f"Linear {name}={n} is not divisible by the {ax} axis size "
                                 f"G_intra_{ax[0]}={g}" + divisor_hint(n, g, ax))
        self.local_out, self.local_in = out_features // g_out, in_features // g_in
        self.drop_input = (not expert_mode) if drop_input is None else drop_input
        self.gather_output = (not expert_mode) if gather_output is None else gather_output
        io, ii = grid.index(self.out_axis), grid.index(self.in_axis)
        out_rng = (io * self.local_out, (io + 1) * self.local_out)
        in_rng = (ii * self.local_in, (ii + 1) * self.local_in)
        self.weight_spec = ShardSpec.depth_sharded((out_features, in_features), (out_rng, in_rng),
                                                   grid.size("depth"), grid.index("depth"), ("depth", "row", "col"))
        self.bias_spec = ShardSpec((out_features,), (out_rng,), shard_axes=(self.out_axis,))
        self.weight = nn.Parameter(torch.empty(self.weight_spec.local_numel, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(self.local_out, device=device, dtype=dtype)) if bias else None
        self.weight._axonn_spec = self.weight_spec
        if self.bias is not None:
            self.bias._axonn_spec = self.bias_spec
        self.axonn_name = "linear"  # label for the communication byte counter (set by parallelize)
        self._prefetch = None
        self._next_layer: Linear | None = None
        self._prev_layer: Linear | None = None
        if init:
            self.reset_parameters()

    def axonn_specs(self) -> dict[str, ShardSpec]:
        specs = {"weight": self.weight_spec}
        if self.bias is not None:
            specs["bias"] = self.bias_spec
        return specs

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Same init (and RNG consumption) as ``nn.Linear`` on the full matrix, then sliced."""
        w = torch.empty(self.out_features, self.in_features, dtype=self.weight.dtype)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        b = None
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            b = torch.empty(self.out_features, dtype=self.weight.dtype).uniform_(-bound, bound)
        self.load_full(w, b)

    @torch.no_grad()
    def load_full(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """Set this rank's shards from the full ``out × in`` weight (and ``out`` bias)."""
        self.weight.copy_(extract(weight.to(self.weight.dtype), self.weight_spec))
        if bias is not None:
            if self.bias is None:
                raise ValueError("layer was built without bias")
            self.bias.copy_(extract(bias.to(self.bias.dtype), self.bias_spec))

    def _local_weight(self, w_shard: torch.Tensor, backward: bool, dtype: torch.dtype) -> torch.Tensor:
        """This rank's ``local_out × local_in`` block: the depth shards all-gathered in ``dtype``."""
        numel = self.local_out * self.local_in
        if self.grid.size("depth") == 1:
            return w_shard.view(self.local_out, self.local_in)
        if not backward and torch._C._current_graph_task_id() != -1:
            # a forward recomputed inside the backward (activation checkpointing): gather now, leave
            # this layer's prefetch (issued for its own backward) untouched and start none
            STATS["recompute_gathers"] += 1
            pre, nxt = None, None
        else:
            pre, self._prefetch = self._prefetch, None
            nxt = self._prev_layer if backward else self._next_layer
        if pre is not None and pre[1:] == (w_shard._version, backward, dtype):
            full = pre[0].wait()
            STATS["prefetch_hits"] += 1
        else:
            full = all_gather(w_shard.detach().to(dtype), "depth", grid=self.grid)
        if CONFIG.all_gather and nxt is not None and nxt._prefetch is None and nxt.grid is self.grid:
            nxt._prefetch = (all_gather(nxt.weight.detach().to(dtype), "depth", async_op=True, grid=self.grid),
                             nxt.weight._version, backward, dtype)
        return full[:numel].view(self.local_out, self.local_in)

    @torch.compiler.disable  # collectives, async handles, prefetch state: eager under torch.compile
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_input:
            x = drop(x, self.in_axis, self.grid)
        y = _LinearFn.apply(x, self.weight, self)
        if self.bias is not None:
            y = y + self.bias
        g = self.gather_output
        if g == "auto":
            g = not torch.is_grad_enabled()
        if g:
            y = gather(y, self.out_axis, self.grid)
        return y

    @contextlib.contextmanager
    def sharded_output(self) -> Iterator["Linear"]:
        """Within: the output stays sharded over ``out_axis`` (no gather), whatever ``gather_output`` says -- e.g.
        the LM head's vocab-sharded logits for :func:`~axonn.intra_layer.cross_entropy.vocab_parallel_logprobs`."""
        saved = self.gather_output
        self.gather_output = False
        try:
            yield self
        finally:
            self.gather_output = saved

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, transpose={self.transpose}, "
                f"local={self.local_out}x{self.local_in}, grid={self.grid.sizes}")
