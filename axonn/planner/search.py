"""Enumerate 4D grids, reject the invalid ones, predict and rank the rest (:func:`plan`)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from axonn.grid_shape import GridShape
from axonn.presets import ModelShape, get_preset

from .memory import GIB, MemoryBreakdown, MemoryConfig, memory_per_gpu
from .model import AXES, AXIS_LABEL, CostConfig, StepBreakdown, axis_bandwidth, divisibility_problem, predict_step
from .profiles import MachineProfile, known_profiles, load_profile

#: micro-batches the planner tries when none is given (per GPU, sequences)
MICRO_BATCH_CHOICES = (1, 2, 4, 8, 16, 32)
#: the trainer's grad_reduce_dtype -> bytes per gradient element on the wire
GRAD_REDUCE_BYTES = {"fp32": 4, "bf16": 2}
#: largest GPU count searched for "the smallest GPU count that fits"
MAX_SEARCH_GPUS = 1 << 17


class PlanError(ValueError):
    """A request the planner cannot satisfy; the message says why and what would work.

    ``kind`` is one of ``machine``, ``input``, ``nodes``, ``divide``, ``batch``, ``memory``;
    ``smallest_gpus`` is the smallest GPU count that fits (memory errors), when one exists.
    """

    def __init__(self, message: str, kind: str = "input", smallest_gpus: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.smallest_gpus = smallest_gpus


@dataclass
class PlanEntry:
    """One valid, fitting grid with its prediction."""

    grid: GridShape
    micro_batch: int
    grad_accum: int
    step_time_s: float
    flops_per_s: float
    memory: MemoryBreakdown
    breakdown: StepBreakdown
    gpus: int
    peak_tflops: float
    intra_node_axes: list[str] = field(default_factory=list)

    @property
    def memory_per_gpu_bytes(self) -> float:
        return self.memory.total

    @property
    def tflops_per_gpu(self) -> float:
        return self.flops_per_s / self.gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu / self.peak_tflops

    def to_dict(self) -> dict:
        return {
            "grid": list(self.grid),
            "step_time_s": self.step_time_s,
            "flops_per_s": self.flops_per_s,
            "memory_per_gpu_bytes": int(self.memory_per_gpu_bytes),
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "micro_batch": self.micro_batch,
            "grad_accum": self.grad_accum,
            "intra_node_axes": self.intra_node_axes,
            "memory_bytes": {k: int(v) for k, v in self.memory.to_dict().items()},
            "compute_s": self.breakdown.compute_s,
            "comm_s": self.breakdown.comm_s,
            "exposed_comm_s": self.breakdown.exposed_comm_s,
            "optimizer_s": self.breakdown.optimizer_s,
        }


@dataclass
class Rejection:
    """A grid the planner refused: ``kind`` is ``divide``, ``batch`` or ``memory``."""

    grid: GridShape
    kind: str
    reason: str
    memory_per_gpu_bytes: float | None = None

    def to_dict(self) -> dict:
        return {"grid": list(self.grid), "kind": self.kind, "reason": self.reason,
                "memory_per_gpu_bytes": None if self.memory_per_gpu_bytes is None
                else int(self.memory_per_gpu_bytes)}


@dataclass
class PlanResult:
    """Ranked fitting grids (best first) and rejected grids (with reasons)."""

    shape: ModelShape
    seq: int
    global_batch: int
    gpus: int
    machine: MachineProfile
    micro_batch: int | None
    activation_checkpointing: bool
    ranked: list[PlanEntry]
    rejected: list[Rejection]
    grad_reduce_dtype: str = "fp32"

    @property
    def best(self) -> PlanEntry:
        return self.ranked[0]

    def to_json(self, top: int | None = None) -> str:
        """The ranking as a JSON list, best first."""
        entries = self.ranked if top is None else self.ranked[:top]
        return json.dumps([e.to_dict() for e in entries], indent=1)


def resolve_shape(size: str | ModelShape) -> ModelShape:
    if isinstance(size, ModelShape):
        return size
    try:
        return get_preset(size)
    except ValueError as e:
        raise PlanError(str(e), kind="input") from None


def load_machine(machine: str | Path | MachineProfile) -> MachineProfile:
    """:func:`load_profile`, its refusal a :class:`PlanError` (``kind="machine"``) naming the known machines."""
    try:
        return load_profile(machine)
    except (ValueError, OSError) as e:
        raise PlanError(str(e), kind="machine") from None


def _micro_batches(per_shard: int, micro_batch: int | None) -> list[int]:
    if micro_batch is not None:
        return [micro_batch] if per_shard % micro_batch == 0 else []
    return [b for b in MICRO_BATCH_CHOICES if per_shard % b == 0]


def _whole_nodes(gpus: int, prof: MachineProfile) -> bool:
    return gpus <= prof.gpus_per_node or gpus % prof.gpus_per_node == 0


def _fits_somewhere(shape: ModelShape, gpus: int, seq: int, global_batch: int | None,
                    micro_batch: int | None, prof: MachineProfile, ckpt: bool,
                    mem_cfg: MemoryConfig) -> float | None:
    """Smallest memory/GPU of a valid grid of ``gpus`` that fits, or ``None`` (batch ignored if None)."""
    cap = prof.usable_memory_bytes
    best = None
    for g in GridShape.enumerate(gpus):
        if divisibility_problem(shape, g):
            continue
        if global_batch is None:  # any batch: one micro-batch, gradients accumulated (the larger need)
            options = [(micro_batch or 1, 2)]
        else:  # the micro-batches `plan` would try, each with its number of micro-steps
            per_shard = global_batch // (g.data * g.depth)
            if global_batch % (g.data * g.depth):
                continue
            options = [(mb, per_shard // mb) for mb in _micro_batches(per_shard, micro_batch)]
        for mb, steps in options:
            need = memory_per_gpu(shape, g, seq, mb, ckpt, mem_cfg, micro_steps=steps).total
            if need <= cap and (best is None or need < best):
                best = need
    return best


def _candidate_counts(prof: MachineProfile) -> list[int]:
    g = prof.gpus_per_node
    counts = set(range(1, g + 1))
    k = 1
    while k * g <= MAX_SEARCH_GPUS:
        counts.add(k * g)
        k = k + 1 if k < 64 else k * 2
    return sorted(counts)


def smallest_fitting_gpus(shape: ModelShape, seq: int, prof: MachineProfile,
                          global_batch: int | None = None, micro_batch: int | None = None,
                          activation_checkpointing: bool = True,
                          mem_cfg: MemoryConfig | None = None) -> int | None:
    """The smallest GPU count (whole nodes above one node) with a valid grid that fits in memory.

    With ``global_batch`` the grid must also divide it (data×depth | batch); ``None`` if no
    count up to ``MAX_SEARCH_GPUS`` works.
    """
    mem_cfg = mem_cfg or MemoryConfig()
    for n in _candidate_counts(prof):
        if _fits_somewhere(shape, n, seq, global_batch, micro_batch, prof, activation_checkpointing, mem_cfg):
            return n
    return None


def plan(shape: str | ModelShape, seq: int, global_batch: int, gpus: int,
         machine: str | Path | MachineProfile, micro_batch: int | None = None,
         activation_checkpointing: bool = True, cost_cfg: CostConfig | None = None,
         mem_cfg: MemoryConfig | None = None, grad_reduce_dtype: str = "fp32") -> PlanResult:
    """Rank every valid 4D grid of ``gpus`` GPUs for training ``shape`` on ``machine``.

    ``micro_batch`` is sequences per GPU per forward/backward (``None``: the planner picks the
    fastest that fits from :data:`MICRO_BATCH_CHOICES` for each grid). ``global_batch`` is
    sequences per optimizer step and must be divisible by ``data·depth·micro_batch``.
    ``grad_reduce_dtype`` (``"fp32"`` or ``"bf16"``, the trainer's ``grad_reduce_dtype``) sets the
    gradients' bytes on the wire in the default ``cost_cfg`` and ``mem_cfg``.

    Raises :class:`PlanError` for an unknown machine/size, non-positive inputs, a GPU count that
    is not whole nodes, and when no grid is left (nothing divides, the batch never divides, or
    nothing fits in memory), always saying what would work.
    """
    shape = resolve_shape(shape)
    prof = load_machine(machine)
    if grad_reduce_dtype not in GRAD_REDUCE_BYTES:
        raise PlanError(f"grad_reduce_dtype must be one of {sorted(GRAD_REDUCE_BYTES)}, got {grad_reduce_dtype!r}",
                        kind="input")
    wire = GRAD_REDUCE_BYTES[grad_reduce_dtype]
    cost_cfg = cost_cfg or CostConfig(bytes_grad_comm=wire)
    mem_cfg = mem_cfg or MemoryConfig(grad_reduce_bytes=wire)
    for name, val in (("seq", seq), ("global_batch", global_batch), ("gpus", gpus)):
        if not isinstance(val, int) or val <= 0:
            raise PlanError(f"{name} must be a positive integer, got {val!r}", kind="input")
    if micro_batch is not None and (not isinstance(micro_batch, int) or micro_batch <= 0):
        raise PlanError(f"micro_batch must be a positive integer, got {micro_batch!r}", kind="input")
    if not _whole_nodes(gpus, prof):
        g = prof.gpus_per_node
        lo, hi = gpus // g * g, (gpus // g + 1) * g
        raise PlanError(f"{gpus} GPUs is not a whole number of {prof.name} nodes ({g} GPUs each): "
                        f"use {lo} or {hi}", kind="nodes")

    cap = prof.usable_memory_bytes
    ranked: list[PlanEntry] = []
    rejected: list[Rejection] = []
    for grid in GridShape.enumerate(gpus):
        why = divisibility_problem(shape, grid)
        if why:
            rejected.append(Rejection(grid, "divide", why))
            continue
        dz = grid.data * grid.depth
        if global_batch % dz:
            rejected.append(Rejection(grid, "batch", f"global batch {global_batch} is not divisible by "
                                                     f"data×depth={grid.data}×{grid.depth}={dz}"))
            continue
        per_shard = global_batch // dz
        mbs = _micro_batches(per_shard, micro_batch)
        if not mbs:
            rejected.append(Rejection(grid, "batch", f"micro-batch {micro_batch} does not divide the "
                                                     f"{per_shard} sequences per data×depth shard"))
            continue
        best: PlanEntry | None = None
        smallest_need = None
        for mb in mbs:
            mem = memory_per_gpu(shape, grid, seq, mb, activation_checkpointing, mem_cfg, micro_steps=per_shard // mb)
            if smallest_need is None or mem.total < smallest_need:
                smallest_need = mem.total
            if mem.total > cap:
                continue
            bd = predict_step(shape, grid, seq, global_batch, mb, prof, activation_checkpointing, cost_cfg)
            if best is None or bd.step_time_s < best.step_time_s:
                intra = [AXIS_LABEL[ax] for ax in AXES if getattr(grid, ax) > 1 and axis_bandwidth(grid, ax, prof)[2]]
                best = PlanEntry(grid=grid, micro_batch=mb, grad_accum=bd.micro_steps,
                                 step_time_s=bd.step_time_s, flops_per_s=bd.flops_per_s, memory=mem,
                                 breakdown=bd, gpus=gpus, peak_tflops=prof.peak_tflops,
                                 intra_node_axes=intra)
        if best is None:
            rejected.append(Rejection(grid, "memory",
                                      f"does not fit: needs {smallest_need / GIB:.1f} GiB per GPU, "
                                      f"{cap / GIB:.1f} GiB usable", smallest_need))
        else:
            ranked.append(best)
    ranked.sort(key=lambda e: (e.step_time_s, e.memory_per_gpu_bytes))
    result = PlanResult(shape, seq, global_batch, gpus, prof, micro_batch, activation_checkpointing,
                        ranked, rejected, grad_reduce_dtype)
    if not ranked:
        _explain_failure(result, mem_cfg)
    return result


def _explain_failure(res: PlanResult, mem_cfg: MemoryConfig) -> None:
    """Raise the :class:`PlanError` that says why ``res`` has no grid, and what would work."""
    kinds = {r.kind for r in res.rejected}
    shape, prof, ckpt = res.shape, res.machine, res.activation_checkpointing
    what = f"{shape.name} ({shape.num_params() / 1e9:.1f}B params) on {res.gpus} × {prof.name}"
    if kinds == {"divide"}:
        near = [n for n in _candidate_counts(prof)
                if any(divisibility_problem(shape, g) is None for g in GridShape.enumerate(n))]
        near.sort(key=lambda n: (abs(n - res.gpus), n))
        examples = "; ".join(sorted({r.reason for r in res.rejected})[:4])
        raise PlanError(f"no 4D grid of {res.gpus} GPUs divides {shape.name}: e.g. {examples}. "
                        f"GPU counts that do: {', '.join(map(str, sorted(near[:6])))}", kind="divide")
    cap = prof.usable_memory_bytes
    if "memory" not in kinds:
        # no grid was priced: the batch divides none. Offer only the data×depth of grids that fit in memory
        # (at one micro-step, their smallest need), else the batch is not the problem: memory is
        valid = [g for g in GridShape.enumerate(res.gpus) if divisibility_problem(shape, g) is None]
        need_of = {g: memory_per_gpu(shape, g, res.seq, res.micro_batch or 1, ckpt, mem_cfg, micro_steps=1).total
                   for g in valid}
        dz = sorted({g.data * g.depth for g in valid if need_of[g] <= cap})
        if dz:
            batch_ok = [b for b in range(res.global_batch, res.global_batch * 4 + 64)
                        if any(b % x == 0 and (res.micro_batch is None or (b // x) % res.micro_batch == 0)
                               for x in dz)][:1]
            # with a fixed micro-batch the batch must divide by data×depth×micro-batch: list those products
            # (128 is a multiple of data×depth 1, 2, 4, 8 but not of 3, 6, 12, 24 at micro-batch 3)
            mb = f" and micro-batch {res.micro_batch}" if res.micro_batch else ""
            what = "data×depth×micro-batch" if res.micro_batch else "data×depth"
            prods = sorted({x * (res.micro_batch or 1) for x in dz})
            raise PlanError(f"global batch {res.global_batch}{mb} is not divisible by {what} of any valid "
                            f"grid of {res.gpus} GPUs that fits in memory (their {what} products: "
                            f"{', '.join(map(str, prods))}); use a global batch that is a multiple of one of them"
                            + (f", e.g. {batch_ok[0]}" if batch_ok else ""), kind="batch")
        need = min(need_of.values())
    else:
        need = min(r.memory_per_gpu_bytes for r in res.rejected if r.kind == "memory")
    n_min = smallest_fitting_gpus(shape, res.seq, prof, res.global_batch, res.micro_batch, ckpt, mem_cfg)
    batch_note = ""
    if n_min is None:
        n_min = smallest_fitting_gpus(shape, res.seq, prof, None, res.micro_batch, ckpt, mem_cfg)
        if n_min is not None:
            batch_note = f" (with a global batch divisible by its data×depth; {res.global_batch} is not)"
    others = []
    for name in known_profiles():
        if name == prof.name:
            continue
        other = load_profile(name)
        if _whole_nodes(res.gpus, other) and _fits_somewhere(shape, res.gpus, res.seq, res.global_batch,
                                                             res.micro_batch, other, ckpt, mem_cfg):
            others.append(name)
    hint = []
    if not ckpt:
        hint.append("turn activation checkpointing on")
    if res.micro_batch and res.micro_batch > 1:
        hint.append("use a smaller micro-batch")
    if others:
        hint.append(f"it fits on {res.gpus} GPUs of: {', '.join(others)}")
    tail = (" " + "; ".join(hint) + ".") if hint else ""
    if n_min is None:
        raise PlanError(f"{what}: does not fit in memory on any grid up to {MAX_SEARCH_GPUS} GPUs "
                        f"(best grid needs {need / GIB:.1f} GiB per GPU at {res.gpus} GPUs, "
                        f"{cap / GIB:.1f} GiB usable); shorten the sequence ({res.seq}) or use a machine "
                        f"with more memory per GPU.{tail}", kind="memory")
    raise PlanError(f"{what}: no grid fits in memory (best needs {need / GIB:.1f} GiB per GPU, "
                    f"{cap / GIB:.1f} GiB usable). The smallest GPU count that fits is {n_min}"
                    f"{batch_note} ({(n_min + prof.gpus_per_node - 1) // prof.gpus_per_node} nodes).{tail}",
                    kind="memory", smallest_gpus=n_min)


def format_plan(result: PlanResult, top: int = 5, show_rejected: int = 8) -> str:
    """Human-readable table of the ``top`` grids and a summary of the rejected ones."""
    r, prof = result, result.machine
    mb = "auto" if r.micro_batch is None else str(r.micro_batch)
    lines = [
        f"{r.shape.name}: {r.shape.num_params() / 1e9:.3g}B params, seq {r.seq}, global batch {r.global_batch} "
        f"(micro-batch {mb}), activation checkpointing {'on' if r.activation_checkpointing else 'off'}, "
        f"gradients reduced in {r.grad_reduce_dtype}",
        f"machine {prof.name}: {r.gpus} GPUs = {max(1, r.gpus // prof.gpus_per_node)} node(s) × "
        f"{min(r.gpus, prof.gpus_per_node)}, {prof.memory_gib:g} GiB ({prof.usable_memory_bytes / GIB:.1f} usable), "
        f"{prof.measured_tflops:g}/{prof.peak_tflops:g} TFLOP/s measured/peak",
        f"{len(r.ranked)} fitting grid(s), {len(r.rejected)} rejected",
        "",
        f"{'#':>3} {'grid D,R,C,Z':>16} {'mb':>3} {'accum':>5} {'step s':>9} {'TFLOP/s/GPU':>11} "
        f"{'MFU':>5} {'mem GiB':>8}  exposed comm s (data/row/col/depth)  in-node axes",
    ]
    for i, e in enumerate(r.ranked[:top], 1):
        ex = e.breakdown.exposed_comm_s
        exs = "/".join(f"{ex[AXIS_LABEL[a]]:.2f}" for a in AXES)
        lines.append(f"{i:>3} {str(e.grid):>16} {e.micro_batch:>3} {e.grad_accum:>5} {e.step_time_s:>9.3f} "
                     f"{e.tflops_per_gpu:>11.1f} {e.mfu:>5.1%} {e.memory_per_gpu_bytes / GIB:>8.1f}  "
                     f"{exs:<34}  {','.join(e.intra_node_axes) or '-'}")
    if r.ranked:
        m = r.ranked[0].memory
        lines.append(f"    memory of #1 per GPU: {m.states / GIB:.1f} GiB fp32 weights, AdamW state and the gradients live then, "
                     f"{m.activations / GIB:.1f} activations, {m.logits / GIB:.1f} logits, "
                     f"{m.buffers / GIB:.1f} buffers (peak of the step; benchmarks/memory_validation.py traces it)")
    if r.rejected:
        by_kind: dict[str, list[Rejection]] = {}
        for rej in r.rejected:
            by_kind.setdefault(rej.kind, []).append(rej)
        lines.append("")
        lines.append("rejected:")
        label = {"memory": "does not fit in memory", "divide": "does not divide",
                 "batch": "batch not divisible"}
        for kind in ("memory", "divide", "batch"):
            rejs = by_kind.get(kind, [])
            if not rejs:
                continue
            if kind == "memory":
                rejs = sorted(rejs, key=lambda x: x.memory_per_gpu_bytes or 0)
            lines.append(f"  {label[kind]}: {len(rejs)} grid(s)")
            for rej in rejs[:show_rejected]:
                lines.append(f"    {str(rej.grid):>16}  {rej.reason}")
            if len(rejs) > show_rejected:
                lines.append(f"    ... {len(rejs) - show_rejected} more")
    return "\n".join(lines)
