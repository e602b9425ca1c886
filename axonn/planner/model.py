r"""Cost model of one training step of a Llama-family model on a 4D AxoNN grid.

Notation
--------
Grid ``(D, R, C, Z)`` = (data, row, column, depth), an :class:`axonn.grid_shape.GridShape`;
``G = D·R·C·Z`` GPUs. Ranks are numbered column fastest, then row, then depth, then data, so the
*stride* of an axis (distance between two ranks that differ only along it) is
``s_C = 1, s_R = C, s_Z = R·C, s_D = R·C·Z``.

``b`` = micro-batch *per GPU* (sequences one rank processes in one forward/backward), ``s`` =
sequence length, ``B`` = global batch (sequences per optimizer step). A data×depth shard takes
``B/(D·Z)`` sequences per step in ``A = B/(D·Z·b)`` accumulation micro-steps. Local token count
of a micro-step: ``m = b·s`` (the 3D matmul's ``m`` is ``b·Z·s`` and depth splits it).

The 3D-parallel Linear ``Y = X Wᵀ`` with ``W`` of shape ``n × k`` (out × in): out is split over
the row group ``Gr``, in over the column group ``Gc``, the local block again over depth ``Z``.
Layers with ``transpose=True`` (o_proj, down_proj) swap the row and column roles, so
``(Gr, Gc) = (R, C)`` for q, k, v, gate, up, lm_head and ``(C, R)`` for o, down.  The block's Linears,
their shapes and kinds, and its replicated parameters come from the family's parallel plan
(:mod:`axonn.plans`, the table ``axonn.parallelize`` applies); Llama's are named here.

Compute
-------
Per Linear and micro-step each of the three GEMMs (forward ``Y``, ``dX``, ``dW``) does
``2·m·n·k/(Gr·Gc)`` flops on a local ``m × (k/Gc) × (n/Gr)`` problem. Its time is a roofline
with a shape-dependent efficiency curve::

    f(d)        = d / (d + d_half)
    rate(m,n,k) = measured · min(1, f(m)·f(n)·f(k) / f(d_ref)³)
    t_gemm      = max(2mnk / rate, 2·(mk + kn + mn) / hbm_bw)

(``measured`` is the profile's bf16 GEMM rate at ``m = n = k = d_ref``.) Flash attention on the
``heads/R`` local heads, replicated over the column group, does
``4·b·s²·(h/R)·½`` causal flops forward and 2.5× that backward at
``measured · attention_efficiency``. Elementwise kernels (norms, RoPE, SwiGLU, residuals) are
a ``kernel_overhead`` fraction on top. With activation checkpointing the backward also
recomputes each decoder layer's forward (not the lm_head's: only decoder layers are checkpointed).

Communication
-------------
Per-rank volumes (elements) from the 3D algorithm, per Linear and micro-step; weights travel in
bf16 (``bytes_act``: the trainer's autocast casts a shard before it is all-gathered), gradients
in fp32 (``bytes_grad_comm``: they are reduced in the master weights' dtype; 2 with the trainer's
``grad_reduce_dtype = "bf16"``)::

    all-gather W over Z (fwd, and again bwd):  (Z−1)/Z · nk/(Gr·Gc)
    all-reduce Y over Gc (fwd):              2(Gc−1)/Gc · m·n/Gr
    all-reduce dX over Gr (bwd):             2(Gr−1)/Gr · m·k/Gc
    reduce-scatter dW over Z (bwd):            (Z−1)/Z · nk/(Gr·Gc)
    all-reduce dW shard over D (once/step):  2(D−1)/D · nk/(Gr·Gc·Z)

the ``V × h`` embedding (vocabulary over row × column, each chunk over depth) adds per
micro-step an fp32 all-gather of its chunk over Z in the forward and a reduce-scatter of its
gradient (``bytes_grad_comm``) in the backward, ``(Z−1)/Z · V·h/(R·C)`` elements each and not
overlapped, plus the forward
all-reduce of its ``m × h`` output over row × column (charged as a column then a row
all-reduce); and, with activation checkpointing on a row × column grid, one fp32 all-gather of the layer
input's ``1/(R·C)`` slices per layer in backward, ``(R·C−1)/(R·C) · m·h`` (``axonn.recompute``,
charged as a column then a row all-gather, not overlapped). Re-layouts over the column group, per
decoder layer and micro-step, not overlapped: o_proj's and down_proj's outputs are all-gathered to
full width in the forward (bf16), and the gradients of the column slices the two RMSNorm outputs
are cut into are all-gathered in the backward (fp32), ``(C−1)/C · m·h`` each; the final norm's
slice adds one more backward all-gather. A recomputed forward repeats its all-reduces and
re-layouts and gathers its weights over depth again, synchronously (no prefetch).

A collective of ``v`` bytes on an axis of ``p`` ranks takes
``t = α·⌈log₂ p⌉·k + v / β`` (k = 2 for all-reduce, 1 otherwise: the latency of the
tree / recursive-halving algorithms NCCL/RCCL use at scale; the bandwidth term uses the ring
volumes above). Topology: an axis with stride ``s`` and size ``p`` stays in a node when
``s·p ≤ g`` (``g`` = GPUs per node), then ``β = intra_node_gbps``. Otherwise each of its rings
crosses node boundaries, and ``min(s, g)`` rings leave every node at once (the ``g/s`` ranks of
one ring in a node are neighbours, so a ring needs one NIC stream per node), so
``β = min(intra, inter_node_gbps / min(s, g))``.

At-scale terms of the profile (each neutral at its default, which gives the formulas above exactly):

* message size: a collective on a buffer of ``S`` bytes (the full tensor) reaches ``e(S) = S/(S + S½)`` of
  its bus bandwidth, ``S½`` = ``intra_node_half_bw_mbytes`` / ``inter_node_half_bw_mbytes``: ``v/(β·e(S))``;
* launch: every collective call costs ``collective_launch_us`` on top of its hops;
* global taper: a group spanning more than ``nodes_per_group`` nodes gets ``global_taper`` of the
  inter-node bandwidth (the links between full-bisection domains, loaded by every group at once).

So ``t = launch + α·⌈log₂ p⌉·k + v/(β·e(S))``. Two software terms of :class:`CostConfig` (neutral at their
defaults): ``recompute_fraction`` scales what a checkpointed layer recomputes (its forward compute and
collectives), and ``elementwise_bytes_hidden`` / ``elementwise_bytes_ffn`` add the elementwise kernels' HBM
time ``m·(e_h·h + e_f·ffn/R)/HBM`` per layer and micro-step (a third forward, two thirds backward).

Overlap
-------
``overlap(c, x, f) = c + x − f·min(c, x)``: ``f = 1`` is ``max(c, x)``, ``f = 0`` the sum.

* depth all-gathers / reduce-scatters are prefetched / issued asynchronously and hide behind
  the compute of neighbouring layers with fraction ``overlap_depth`` (default 0.9);
* the forward all-reduce of ``Y`` is on the critical path (not overlapped);
* the backward all-reduce of ``dX`` overlaps the ``dW`` GEMM with ``overlap_tensor_bwd`` (0.5);
* the data-parallel all-reduce runs after the last micro-step's backward (``sync_gradients``) and
  is not overlapped: ``overlap_data`` = 0 (a knob for a trainer that would overlap it).

Step time::

    T_layer_fwd = c_f + x_f + y_f − min(c_f, f_Z·min(c_f, x_f))
    T_layer_bwd = c_b + x_b + y_b − min(c_b, f_Z·min(c_b, x_b) + f_T·min(c_dW, y_dX))
    (y_b: dX all-reduces, backward re-layouts and, with checkpointing, the recomputed forward's y_f + x_f)
    T_micro     = L·(T_layer_fwd + T_layer_bwd) + T_lm_head + T_embedding
    T_step      = A·T_micro + overlap(T_bwd_last, T_dp, f_D) − T_bwd_last + T_optimizer

(``c`` compute, ``x`` depth collectives, ``y`` row/column all-reduces and re-layouts.) Model flops per step
are ``(6N + 12·L·h·s)·B·s`` (the MFU convention; ``N`` = all parameters), and the predicted
sustained rate is that over ``T_step``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from axonn.grid_shape import GridShape
from axonn.plans import (TRANSPOSED, block_linears, dims_of_shape, final_norm_parameters, get_plan,
                                 layer_parameters)
from axonn.presets import ModelShape

from .profiles import MachineProfile

#: the grid's axes in the order of ``--grid D,R,C,Z`` and of the planner's tables
AXES: tuple[str, ...] = GridShape._fields
#: what the planner's tables, JSON (``comm_s``, ``intra_node_axes``) and messages call each axis
AXIS_LABEL = {"data": "data", "row": "row", "col": "column", "depth": "depth"}


@dataclass(frozen=True)
class LinearSpec:
    """One Linear ``Y = X Wᵀ`` with ``W`` of shape ``out × in_``."""

    name: str
    out: int
    in_: int
    transposed: bool = False
    out_dim: str = "out"  # which model dimension ``out`` is (for error messages)
    in_dim: str = "in"

    @property
    def params(self) -> int:
        return self.out * self.in_

    def split(self, grid: GridShape) -> tuple[int, int]:
        """``(Gr, Gc)``: sizes of the groups splitting out and in (swapped when transposed)."""
        return (grid.col, grid.row) if self.transposed else (grid.row, grid.col)

    def axes(self) -> tuple[str, str]:
        """Names of the axes splitting out and in."""
        return ("col", "row") if self.transposed else ("row", "col")


def layer_linears(shape: ModelShape) -> list[LinearSpec]:
    """The Linears of one decoder block in order (q, k, v, o, gate, up, down for Llama), from the
    family's parallel plan (:mod:`axonn.plans`), the one ``axonn.parallelize`` applies."""
    return [LinearSpec(m.name, m.out, m.in_, m.transposed, m.out_dim, m.in_dim)
            for m in block_linears(get_plan(shape.family), dims_of_shape(shape))]


def block_replicated_params(shape: ModelShape) -> int:
    """Parameters of one decoder block that every rank holds whole: its norms and Linear biases (the
    biases are in fact split with their Linear; they are few and counted here)."""
    per_layer = layer_parameters(get_plan(shape.family), dims_of_shape(shape))
    return per_layer["norm"] + per_layer["bias"]


def replicated_params(shape: ModelShape) -> int:
    """:func:`block_replicated_params` of every block and the final norm."""
    return shape.layers * block_replicated_params(shape) + final_norm_parameters(get_plan(shape.family),
                                                                                 dims_of_shape(shape))


def column_relayouts(shape: ModelShape) -> tuple[int, int]:
    """``(forward, backward)`` column re-layouts of activations per decoder block: the transposed
    Linears' outputs all-gathered in the forward, and the gradients of the column slices cut for the
    non-transposed ones (:func:`axonn.intra_layer.drop`) all-gathered in the backward."""
    plan = get_plan(shape.family)
    return sum(r.kind == TRANSPOSED for r in plan.block), len(plan.drop_after) + len(plan.drop_before)


def lm_head(shape: ModelShape) -> LinearSpec:
    return LinearSpec("lm_head", shape.vocab, shape.hidden, False, "vocab", "hidden")


def divisibility_problem(shape: ModelShape, grid: GridShape) -> str | None:
    """Why ``grid`` cannot shard ``shape``, or ``None`` when every dimension divides.

    Rules: those of the family's plan (:mod:`axonn.plans`, the ones ``axonn.parallelize`` checks):
    heads and KV heads over the row group (the non-transposed q/k/v split their output, whole heads
    per rank), hidden over column, FFN over row, the embedding's vocabulary over row × column; and for
    every Linear its out dimension over ``Gr`` and its in dimension over ``Gc`` (the vocabulary, the
    lm_head's rows, over row).  Depth has no rule of its own: a local block whose element count it does not
    divide is zero-padded to a multiple of it (``axonn.sharding.ShardSpec.depth_sharded``), which the
    trainer accepts (e.g. depth 3 on 3 GPUs).
    """
    plan, dims = get_plan(shape.family), dims_of_shape(shape)
    linears = layer_linears(shape) + [lm_head(shape)]
    linear_dims = {d for r in plan.linears() for d in (r.out, r.in_)}
    # the plan's rules on numbers no Linear checks (heads, KV heads) and the embedding's, then every Linear's
    # dimensions over its groups (hidden and FFN, with the Linear named), then the plan's remaining rules
    first = [r for r in plan.requires if r.dim not in linear_dims or len(r.axes) > 1]
    for rule in first:
        g = math.prod(getattr(grid, a) for a in rule.axes)
        if dims[rule.dim] % g:
            if len(rule.axes) > 1:
                names = "×".join(AXIS_LABEL[a] for a in rule.axes)
                sizes = "×".join(str(getattr(grid, a)) for a in rule.axes)
                return f"{names}={sizes} does not divide {rule.dim}={dims[rule.dim]} (embedding)"
            return f"{AXIS_LABEL[rule.axes[0]]}={g} does not divide {rule.dim}={dims[rule.dim]}"
    for lin in linears:
        gr, gc = lin.split(grid)
        ax_out, ax_in = lin.axes()
        if lin.out % gr:
            return f"{AXIS_LABEL[ax_out]}={gr} does not divide {lin.out_dim}={lin.out} ({lin.name})"
        if lin.in_ % gc:
            return f"{AXIS_LABEL[ax_in]}={gc} does not divide {lin.in_dim}={lin.in_} ({lin.name})"
    for rule in plan.requires:
        g = math.prod(getattr(grid, a) for a in rule.axes)
        if rule not in first and dims[rule.dim] % g:
            return f"{'×'.join(AXIS_LABEL[a] for a in rule.axes)}={g} does not divide {rule.dim}={dims[rule.dim]}"
    return None


@dataclass(frozen=True)
class CostConfig:
    """Knobs of the cost model that are properties of the software, not the machine."""

    overlap_depth: float = 0.9       # fraction of depth all-gathers/reduce-scatters hidden
    overlap_tensor_bwd: float = 0.5  # fraction of the dX all-reduce hidden behind the dW GEMM
    overlap_data: float = 0.0        # data all-reduce hidden behind backward (sync_gradients runs after it: none)
    kernel_overhead: float = 0.10    # elementwise kernels, launch gaps: fraction of GEMM+attention time
    causal_attention: bool = True    # flash attention skips the masked half
    bytes_act: int = 2               # bf16 activations / weights on the wire
    bytes_grad_comm: int = 4         # gradients reduced in fp32 (the master weights' dtype); 2: bf16
    optimizer_bytes_per_param: int = 36  # bytes touched per local parameter by fused AdamW (r+w)
    # fraction of a checkpointed decoder layer's forward (compute and collectives) the backward re-runs:
    # 1 = full checkpointing (this trainer's); 0.5 = a policy that recomputes every other layer or every
    # other matmul (torchtitan's "selective" modes); only used with activation checkpointing on
    recompute_fraction: float = 1.0
    # HBM bytes the elementwise kernels (norms, RoPE, SwiGLU, residuals) move per token and decoder layer,
    # per element of the hidden and of the MLP width (forward + backward); 0: the flat kernel_overhead only
    elementwise_bytes_hidden: float = 0.0
    elementwise_bytes_ffn: float = 0.0


def model_flops_per_token(shape: ModelShape, seq: int) -> float:
    """MFU convention: ``6·N + 12·L·h·s`` flops per trained token."""
    return 6.0 * shape.num_params() + 12.0 * shape.layers * shape.hidden * seq


@dataclass
class StepBreakdown:
    """Predicted step time of one grid and where it goes (seconds per optimizer step); the per-axis dicts are
    keyed by :data:`AXIS_LABEL` (``data``, ``row``, ``column``, ``depth``)."""

    step_time_s: float
    micro_steps: int
    compute_s: float              # GEMM + attention + overhead, all micro-steps
    exposed_comm_s: dict[str, float] = field(default_factory=dict)  # per axis, after overlap
    comm_s: dict[str, float] = field(default_factory=dict)          # per axis, before overlap
    optimizer_s: float = 0.0
    model_flops: float = 0.0

    @property
    def flops_per_s(self) -> float:
        return self.model_flops / self.step_time_s

    def to_dict(self) -> dict:
        return asdict(self)


def _f(d: float, half: float) -> float:
    return d / (d + half)


def gemm_time(m: float, n: float, k: float, prof: MachineProfile) -> float:
    """Roofline time of an ``m × k`` by ``k × n`` bf16 GEMM (see module docstring)."""
    ref = _f(prof.gemm_ref_dim, prof.gemm_half_dim) ** 3
    eff = min(1.0, _f(m, prof.gemm_half_dim) * _f(n, prof.gemm_half_dim) * _f(k, prof.gemm_half_dim) / ref)
    rate = prof.measured_tflops * 1e12 * eff
    t_flop = 2.0 * m * n * k / rate
    t_mem = 2.0 * (m * k + k * n + m * n) / (prof.hbm_gbps * 1e9)
    return max(t_flop, t_mem)


def axis_bandwidth(grid: GridShape, axis: str, prof: MachineProfile) -> tuple[float, float, bool]:
    """``(bytes/s per rank, latency s, intra_node)`` of collectives along ``axis``."""
    return group_bandwidth(grid, getattr(grid, axis), grid.stride(axis), prof)


def group_span_nodes(p: int, s: int, gpus_per_node: int) -> int:
    """Nodes one group of ``p`` ranks ``s`` apart touches: ``⌈(s·(p−1) + 1)/g⌉`` (groups start on a node)."""
    return -(-(s * (p - 1) + 1) // gpus_per_node)


def message_efficiency(buffer_bytes: float, half_bytes: float) -> float:
    """Fraction of the bus bandwidth a collective on a ``buffer_bytes`` buffer reaches: ``S/(S + S½)``.

    ``S½`` (``half_bytes``) is the buffer size at which the measured bus bandwidth is half its large-message
    value (protocol switch points, pipelining chunks, per-step synchronisation); ``S½ = 0`` gives 1 for every
    size. The curve rises monotonically with ``S`` towards 1.
    """
    if half_bytes <= 0:
        return 1.0
    return buffer_bytes / (buffer_bytes + half_bytes) if buffer_bytes > 0 else 0.0


def group_bandwidth(grid: GridShape, p: int, s: int, prof: MachineProfile) -> tuple[float, float, bool]:
    """``(bytes/s per rank, latency s, intra_node)`` of a group of ``p`` ranks ``s`` apart.

    One axis is such a group; so is row × column (``p = R·C``, ``s = 1``: column is the fastest
    axis and row the next), which the embedding all-reduces over in one collective.

    Global taper: a group that spans more nodes than one full-bisection domain (``nodes_per_group``: a
    dragonfly group, a fat-tree pod) sends part of its ring hops over the links between domains, which all
    groups of the axis load at once; each node then gets ``global_taper`` of its injection bandwidth there
    and the ring runs at its slowest hop: ``β = min(intra, global_taper · inter / min(s, g))``.
    """
    g = prof.gpus_per_node
    intra_bw = prof.intra_node_gbps * 1e9
    if s * p <= g and (g % (s * p) == 0 or grid.size <= g):  # every group inside one node
        return intra_bw, prof.intra_node_latency_us * 1e-6, True
    streams = min(s, g)
    inter = prof.inter_node_gbps * 1e9 / streams
    if prof.nodes_per_group > 0 and group_span_nodes(p, s, g) > prof.nodes_per_group:
        inter *= prof.global_taper
    return min(intra_bw, inter), prof.inter_node_latency_us * 1e-6, False


class _Comm:
    """Collective timing on a fixed grid/profile (cached per-axis bandwidths)."""

    def __init__(self, grid: GridShape, prof: MachineProfile):
        self.grid = grid
        self.prof = prof
        self.bw = {ax: axis_bandwidth(grid, ax, prof) for ax in AXES}
        self.bw_row_column = group_bandwidth(grid, grid.row * grid.col, 1, prof)

    def time(self, axis: str, volume_bytes: float, allreduce: bool, buffer_bytes: float | None = None) -> float:
        return self._time(getattr(self.grid, axis), self.bw[axis], volume_bytes, allreduce, buffer_bytes)

    def _time(self, p: int, bw_lat: tuple[float, float, bool], volume_bytes: float, allreduce: bool,
              buffer_bytes: float | None = None) -> float:
        """``launch + α·k⌈log₂p⌉ + v / (β·e(S))``: ``v`` bytes moved per rank, ``S`` the collective's buffer
        (the full tensor; ``v`` when not given), ``e`` :func:`message_efficiency` with the profile's
        ``S½`` inside or across nodes, ``launch`` the profile's per-collective cost."""
        if p == 1:
            return 0.0
        bw, lat, intra = bw_lat
        prof = self.prof
        half = (prof.intra_node_half_bw_mbytes if intra else prof.inter_node_half_bw_mbytes) * 1e6
        eff = message_efficiency(volume_bytes if buffer_bytes is None else buffer_bytes, half)
        steps = (2 if allreduce else 1) * math.ceil(math.log2(p))
        return prof.collective_launch_us * 1e-6 + lat * steps + (volume_bytes / (bw * eff) if volume_bytes else 0.0)

    def allgather(self, axis: str, n_elems_total: float, nbytes: int) -> float:
        """All-gather (or reduce-scatter) of a tensor of ``n`` elements: (p−1)/p·n per rank."""
        p = getattr(self.grid, axis)
        return self.time(axis, (p - 1) / p * n_elems_total * nbytes, allreduce=False,
                         buffer_bytes=n_elems_total * nbytes)

    def allreduce(self, axis: str, n_elems: float, nbytes: int) -> float:
        """Ring all-reduce of ``n`` elements per rank: 2(p−1)/p·n."""
        return self._allreduce(getattr(self.grid, axis), self.bw[axis], n_elems, nbytes)

    def allreduce_row_column(self, n_elems: float, nbytes: int) -> float:
        """One ring all-reduce over the row × column group (``R·C`` consecutive ranks)."""
        return self._allreduce(self.grid.row * self.grid.col, self.bw_row_column, n_elems, nbytes)

    def _allreduce(self, p: int, bw_lat: tuple[float, float, bool], n_elems: float, nbytes: int) -> float:
        return self._time(p, bw_lat, 2 * (p - 1) / p * n_elems * nbytes, allreduce=True,
                          buffer_bytes=n_elems * nbytes)


def _ov(c: float, x: float, f: float) -> float:
    """Hidden part of communication ``x`` behind compute ``c`` with overlap fraction ``f``."""
    return f * min(c, x)


def predict_step(shape: ModelShape, grid: GridShape, seq: int, global_batch: int, micro_batch: int,
                 prof: MachineProfile, activation_checkpointing: bool = True,
                 cfg: CostConfig | None = None) -> StepBreakdown:
    """Predict the time of one optimizer step (equations in the module docstring).

    ``micro_batch`` is per GPU; ``global_batch`` must be divisible by ``D·Z·micro_batch``.
    """
    cfg = cfg or CostConfig()
    D, R, C, Z = grid
    if global_batch % (D * Z * micro_batch):
        raise ValueError(f"global batch {global_batch} is not divisible by data×depth×micro_batch="
                         f"{D}×{Z}×{micro_batch}")
    accum = global_batch // (D * Z * micro_batch)
    comm = _Comm(grid, prof)
    m = micro_batch * seq
    ba, bg = cfg.bytes_act, cfg.bytes_grad_comm
    ckpt = activation_checkpointing
    axes_comm = {ax: 0.0 for ax in AXES}  # per micro-step (data: per step)

    def linear_costs(lin: LinearSpec, times: int = 1, recompute: bool = ckpt) -> dict[str, float]:
        """Per-micro-step costs of one Linear; adds ``times`` copies of its traffic to ``axes_comm``
        (``recompute``: its forward runs again in the backward, a checkpointed decoder layer's)."""
        gr, gc = lin.split(grid)
        ax_out, ax_in = lin.axes()
        n_loc, k_loc = lin.out / gr, lin.in_ / gc
        t_g = gemm_time(m, n_loc, k_loc, prof)          # forward Y
        t_dx = gemm_time(m, k_loc, n_loc, prof)          # dX = dY W
        t_dw = gemm_time(n_loc, k_loc, m, prof)          # dW = dYᵀ X
        w_local = n_loc * k_loc
        ag = comm.allgather("depth", w_local, ba)        # gather W (fwd; again in bwd)
        rs = comm.allgather("depth", w_local, bg)        # reduce-scatter dW
        ar_y = comm.allreduce(ax_in, m * n_loc, ba)
        ar_dx = comm.allreduce(ax_out, m * k_loc, ba)
        rf = cfg.recompute_fraction if recompute else 0.0
        axes_comm["depth"] += times * ((2 + rf) * ag + rs)
        axes_comm[ax_in] += times * ar_y * (1 + rf)
        axes_comm[ax_out] += times * ar_dx
        return dict(c_f=t_g, c_dx=t_dx, c_dw=t_dw, ag=ag, rs=rs, ar_y=ar_y, ar_dx=ar_dx)

    def block(costs: list[dict[str, float]], attn_f: float = 0.0, attn_b: float = 0.0, recompute: bool = ckpt,
              relayout_f: float = 0.0, relayout_b: float = 0.0, elem_f: float = 0.0,
              elem_b: float = 0.0) -> tuple[float, float, float]:
        """(forward time, backward time, compute time) of a group of Linears + attention; ``relayout_*``:
        its column all-gathers of activations (forward) and activation gradients (backward); ``elem_*``:
        its elementwise kernels' HBM time (forward, backward)."""
        ov = 1.0 + cfg.kernel_overhead
        rf = cfg.recompute_fraction if recompute else 0.0
        c_f = (sum(x["c_f"] for x in costs) + attn_f) * ov + elem_f
        c_dw = sum(x["c_dw"] for x in costs) * ov
        c_b = (sum(x["c_dx"] for x in costs) + attn_b) * ov + c_dw + elem_b + rf * c_f
        x_f = sum(x["ag"] for x in costs)
        y_f = sum(x["ar_y"] for x in costs) + relayout_f
        x_b = sum(x["ag"] + x["rs"] for x in costs)
        y_dx = sum(x["ar_dx"] for x in costs)
        # the recomputed forward's collectives: its all-reduces and re-layouts, and its depth all-gathers
        # (synchronous: axonn.intra_layer.linear gathers a recomputed forward's weight without prefetch)
        y_b = y_dx + relayout_b + rf * (y_f + x_f)
        t_f = c_f + x_f + y_f - min(c_f, _ov(c_f, x_f, cfg.overlap_depth))
        hidden_b = min(c_b, _ov(c_b, x_b, cfg.overlap_depth) + _ov(c_dw, y_dx, cfg.overlap_tensor_bwd))
        t_b = c_b + x_b + y_b - hidden_b
        return t_f, t_b, c_f + c_b

    # --- one decoder layer
    layer = [linear_costs(lin, shape.layers) for lin in layer_linears(shape)]
    h_loc = shape.heads // R * shape.head_dim
    attn_flops_f = 4.0 * micro_batch * seq * seq * h_loc * (0.5 if cfg.causal_attention else 1.0)
    attn_rate = prof.measured_tflops * 1e12 * prof.attention_efficiency
    attn_f, attn_b = attn_flops_f / attn_rate, 2.5 * attn_flops_f / attn_rate
    # re-layouts over the column group: o_proj's and down_proj's outputs all-gathered to full width in
    # the forward (bf16), the two RMSNorm outputs' column slices' gradients in the backward (fp32)
    n_f, n_b = column_relayouts(shape)
    relayout_f = n_f * comm.allgather("col", m * shape.hidden, ba)
    relayout_b = n_b * comm.allgather("col", m * shape.hidden, 4)
    rf_layer = cfg.recompute_fraction if ckpt else 0.0
    axes_comm["col"] += shape.layers * (relayout_f * (1 + rf_layer) + relayout_b)
    # elementwise kernels' HBM traffic (norms, RoPE, SwiGLU, residuals) per micro-step: full-width hidden
    # (the residual stream is not sharded over row × column), the MLP width split over the row group;
    # a third in the forward, two thirds in the backward
    elem = m * (cfg.elementwise_bytes_hidden * shape.hidden + cfg.elementwise_bytes_ffn * shape.ffn / R) / (
        prof.hbm_gbps * 1e9)
    lf, lb, lc = block(layer, attn_f, attn_b, relayout_f=relayout_f, relayout_b=relayout_b,
                       elem_f=elem / 3, elem_b=2 * elem / 3)
    if ckpt and R * C > 1:  # axonn.recompute: backward all-gathers each layer's fp32 input over row x col
        ag_c = comm.allgather("col", m * shape.hidden / R, 4)  # hierarchical: column, then row
        ag_r = comm.allgather("row", m * shape.hidden, 4)
        lb += rf_layer * (ag_c + ag_r)
        axes_comm["col"] += shape.layers * rf_layer * ag_c
        axes_comm["row"] += shape.layers * rf_layer * ag_r
    # --- lm_head (+ loss) and the embedding: fp32 output all-reduced over row x column (one
    # collective over the R·C group), its chunk all-gathered over depth and its gradient
    # reduce-scattered there (fp32 chunk, gradient in the wire dtype; not overlapped)
    # the lm_head is not checkpointed (nothing recomputed); the final norm's column slice's gradient is
    # all-gathered (fp32) in its backward
    head = [linear_costs(lm_head(shape), recompute=False)]
    head_relayout_b = comm.allgather("col", m * shape.hidden, 4)
    axes_comm["col"] += head_relayout_b
    hf, hb, hc = block(head, recompute=False, relayout_b=head_relayout_b)
    # attributed to row and column in proportion to what each axis alone would take
    emb_split = {ax: comm.allreduce(ax, m * shape.hidden, 4) for ax in ("col", "row")}
    emb_joint = comm.allreduce_row_column(m * shape.hidden, 4)
    emb_sum = sum(emb_split.values())
    emb_out = {ax: (emb_joint * t / emb_sum if emb_sum else 0.0) for ax, t in emb_split.items()}
    emb_chunk = shape.vocab * shape.hidden / (R * C)
    emb_depth = comm.allgather("depth", emb_chunk, 4) + comm.allgather("depth", emb_chunk, bg)
    for ax, t in emb_out.items():
        axes_comm[ax] += t
    axes_comm["depth"] += emb_depth
    emb = sum(emb_out.values()) + emb_depth
    t_micro = shape.layers * (lf + lb) + hf + hb + emb
    t_bwd_last = shape.layers * lb + hb
    compute = accum * (shape.layers * lc + hc)

    # --- data-parallel all-reduce of every local gradient shard, bucketed per layer
    layer_params = sum(lin.params for lin in layer_linears(shape))
    emb_params = 2 * shape.vocab * shape.hidden
    shard = lambda p: p / (R * C * Z)  # noqa: E731
    t_dp = shape.layers * comm.allreduce("data", shard(layer_params), bg) + comm.allreduce("data", shard(emb_params), bg)
    replicated = replicated_params(shape)  # norm weights and biases (+ their grads)
    t_dp += comm.allreduce("data", replicated, bg) if D > 1 else 0.0
    exposed_dp = t_dp - _ov(t_bwd_last, t_dp, cfg.overlap_data)
    # norms are replicated over R·C·Z and their gradients are reduced there too (small)
    total_local = shard(shape.layers * layer_params + emb_params) + replicated
    t_opt = cfg.optimizer_bytes_per_param * total_local / (prof.hbm_gbps * 1e9)

    step = accum * t_micro + exposed_dp + t_opt
    comm_s = {ax: axes_comm[ax] * (accum if ax != "data" else 1) for ax in AXES}
    comm_s["data"] = t_dp
    # exposed communication: attribute the non-compute time to axes proportionally to raw volume
    exposed_total = max(0.0, step - compute - t_opt)
    raw = sum(comm_s.values())
    exposed = {ax: (exposed_total * comm_s[ax] / raw if raw else 0.0) for ax in AXES}
    tokens = global_batch * seq
    return StepBreakdown(step_time_s=step, micro_steps=accum, compute_s=compute,
                         exposed_comm_s={AXIS_LABEL[ax]: t for ax, t in exposed.items()},
                         comm_s={AXIS_LABEL[ax]: t for ax, t in comm_s.items()}, optimizer_s=t_opt,
                         model_flops=model_flops_per_token(shape, seq) * tokens)
