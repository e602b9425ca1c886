"""The trainer's view of the ``axonn`` parallel core: one object for everything grid-dependent.

The trainer never calls ``torch.distributed`` itself: which rows this rank trains on,
gradient synchronisation, norm clipping, loss reduction and checkpoints all go through a
:class:`Runtime`, which wraps an ``axonn`` grid.  A single process runs on a 1x1x1x1 grid,
so the same code path serves one CPU and thousands of GPUs.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

import axonn
from axonn import checkpoint as ack
from axonn.communication import any_rank
from axonn.grid_shape import GridShape



def rows_per_rank(batch: int, replicas: int) -> int:
    """Rows of a global batch of ``batch`` rows that each of the ``replicas`` = data x depth ranks takes."""
    if batch % replicas:
        raise ValueError(
            f"global batch {batch} rows is not divisible by data x depth = {replicas}: "
            "change --batch-size or the grid"
        )
    return batch // replicas


def _finding(e: Exception) -> str:
    """A damaged checkpoint's error without its advice to load an earlier one (the resume is doing that)."""
    return str(e).removesuffix(": " + ack.DAMAGED)


def check_replicas(n_items: int, grid: axonn.Grid, what: str) -> None:
    """Refuse a grid with more data replicas than ``n_items`` (``what``: "documents") to split over them: a replica
    would only repeat another's work.  Raises ``ValueError`` naming the fix."""
    data = grid.size("data")
    if n_items < data:
        raise ValueError(f"--grid has {data} data replicas for {n_items} {what}: each replica needs at least one; "
                         f"use a data axis D <= {max(n_items, 1)} (put the other ranks on the row, column or depth "
                         "axes), or fewer ranks")


def map_over_replicas(fn: Callable[[list], list], items: list, grid: axonn.Grid) -> list:
    """``fn(items)`` computed by the data x depth replicas of ``grid`` together: replica ``r`` takes every
    ``replicas``-th item from ``r``, its row x column ranks call ``fn`` on that share together (``fn`` runs a
    model sharded over them), and every rank returns the per-item results in the items' order.

    Every replica calls ``fn`` on the same number of items (a short share repeats one of its items, whose
    result is dropped): the depth axis all-gathers each layer's weights in every forward, so its ranks must
    run the same forwards.  ``fn`` returns one picklable result per item, in order."""
    import torch.distributed as dist

    if not items:
        return []
    replicas, r = grid.size(("data", "depth")), grid.index(("data", "depth"))
    mine = list(range(r, len(items), replicas))
    per = -(-len(items) // replicas)
    padded = mine + [mine[0] if mine else 0] * (per - len(mine))
    local = fn([items[i] for i in padded])
    if len(local) != len(padded):
        raise ValueError(f"map_over_replicas: fn returned {len(local)} results for {len(padded)} items")
    if grid.world_size == 1:
        return local
    shares = [None] * grid.world_size
    dist.all_gather_object(shares, list(zip(mine, local[: len(mine)])))
    by_index = dict(item for share in shares for item in share)
    return [by_index[i] for i in range(len(items))]


@dataclass
class Runtime:
    grid: axonn.Grid

    @classmethod
    def create(cls, data: int | GridShape = 1, row: int = 1, col: int = 1, depth: int = 1) -> "Runtime":
        """Initialise ``axonn`` (torchrun / mpiexec / single process) on a data x row x column x depth grid: the
        four sizes, or one :class:`GridShape` (:func:`axonn.init`)."""
        return cls(axonn.init(data, row, col, depth))

    # ---- topology ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.grid.device

    @property
    def is_main(self) -> bool:
        return self.grid.rank == 0

    @property
    def replicas(self) -> int:
        """Ranks that take different slices of the global batch (data x depth)."""
        return self.grid.size(("data", "depth"))

    @property
    def tensor_ranks(self) -> int:
        """Ranks one model replica is sharded over (row x column x depth)."""
        return self.grid.size(("row", "col", "depth"))

    def local_batch_rows(self, batch: int) -> int:
        return rows_per_rank(batch, self.replicas)

    def batch_slice(self, t: torch.Tensor) -> torch.Tensor:
        return axonn.batch_slice(t, self.grid)

    # ---- model and gradients -----------------------------------------------------------------
    def parallelize(self, model: torch.nn.Module) -> torch.nn.Module:
        return axonn.parallelize(model, self.grid)

    def enable_activation_checkpointing(self, model: torch.nn.Module) -> None:
        """Recompute each decoder layer in backward; on a row x col grid its saved input is sharded there."""
        axonn.enable_activation_checkpointing(model, self.grid)

    def sync_gradients(self, model: torch.nn.Module) -> None:
        axonn.sync_gradients(model, self.grid)

    def clip_and_step(self, opt: torch.optim.Optimizer, params, max_norm: float) -> torch.Tensor:
        """Clip the grid-wide gradient norm to ``max_norm``, then ``opt.step()``; returns the norm (0-dim, on
        the device: no host synchronisation).

        A fused optimizer (torch's ``fused=True`` AdamW, the trainer's on CUDA) takes the clip as its
        ``grad_scale``, the divisor ``torch.amp.GradScaler`` hands it: its kernel divides each gradient by
        ``max(1, (‖g‖ + 1e-6) / max_norm)`` as it reads it, so clipping makes no pass over the gradients of its
        own (:func:`axonn.clip_grad_norm_`'s multiply reads and writes every one: 8 bytes a parameter).
        Any other optimizer gets the gradients clipped by :func:`axonn.clip_grad_norm_` first.
        """
        params = list(params)
        if not all(g.get("fused") for g in opt.param_groups):
            norm = axonn.clip_grad_norm_(params, max_norm, grid=self.grid)
            opt.step()
            return norm
        norm = axonn.grad_norm(params, grid=self.grid)
        opt.grad_scale = ((norm + 1e-6) / max_norm).clamp(min=1.0)
        try:
            opt.step()
        finally:
            del opt.grad_scale
        return norm

    def all_reduce_batch(self, t: torch.Tensor) -> None:
        """Sum ``t`` in place over the ranks that hold different batch slices (data x depth)."""
        if self.replicas > 1:
            torch.distributed.all_reduce(t, group=self.grid.group(("data", "depth")))

    def any_rank(self, flag: bool) -> torch.Tensor | bool:
        """``flag`` OR-ed over every rank: a 0-dim device tensor (all-reduce MAX, no host sync) or, alone, the bool."""
        return any_rank(flag, self.grid)

    def barrier(self) -> None:
        if self.grid.world_size > 1:
            torch.distributed.barrier()

    def from_main(self, obj):
        """``obj`` as rank 0 holds it, on every rank (a pickled broadcast: for small host objects, such as a
        path or an error message that rank 0 alone produced)."""
        if self.grid.world_size == 1:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda"
                                                else None)
        return box[0]

    # ---- checkpoints (sharded, atomic; see axonn.checkpoint) ----------------------------------
    def save_checkpoint(self, model: torch.nn.Module, opt: torch.optim.Optimizer, root: Path, extra: dict,
                        background: bool = False) -> Callable[[], None] | None:
        """Write ``root/step_XXXXXXX`` atomically, then point ``root/LATEST`` at it
        (:func:`axonn.checkpoint.write_latest`) and keep the last two (:func:`axonn.checkpoint.retain`, which
        also removes the staging directories of saves a crash or a failed write left unpublished).

        ``background=True`` snapshots the state to host memory, writes it in a thread and returns
        the function that finishes the save (collective: every rank calls it at the same point);
        ``LATEST`` moves only then.
        """
        root = Path(root)
        name = f"step_{extra['step']:07d}"
        extra = {**extra, "rng": torch.get_rng_state()}
        pending = ack.save(model, opt, root / name, extra, grid=self.grid, background=background)

        def publish() -> None:
            if pending is not None:
                pending.finish()
            if self.is_main:
                ack.write_latest(root, name)
                ack.retain(root, name, keep=2)
            self.barrier()

        if pending is None:  # a blocking save (asked for, or chosen by ack.save: no host memory for a snapshot)
            publish()
            return None
        return publish

    def resume_point(self, root: Path) -> Path | None:
        """The checkpoint a resume loads: the one ``root/LATEST`` names if it is intact, else the newest older
        complete one that is (collective); None if ``root`` has no ``LATEST``.

        Each candidate is verified against the checksums recorded when it was saved
        (:func:`axonn.checkpoint.verify`: every rank reads about its share of the files); the ranks agree
        on the outcome, so a damaged shard that one rank finds makes every rank fall back together.
        Falling back says on stderr (one line, rank 0) which checkpoint was damaged and which one this
        resumes from; if none is intact, :class:`axonn.checkpoint.DamagedCheckpoint` says what was
        found.  A checkpoint saved before checksums were recorded is taken as it is (one line says so).
        """
        root = Path(root)
        first = ack.latest(root)
        if first is None:
            return None
        newest = ack.step_of(first)
        older = sorted(((step, p) for p in root.glob("step_*") if (step := ack.step_of(p)) is not None
                        and (newest is None or step < newest) and (p / "COMPLETE").exists()), reverse=True)
        damaged: list[tuple[Path, ack.DamagedCheckpoint]] = []
        for path in [first, *(p for _, p in older)]:
            try:
                checked = ack.verify(path, self.grid)
            except ack.DamagedCheckpoint as e:
                damaged.append((path, e))
                continue
            if self.is_main and damaged:
                names = ", ".join(p.name for p, _ in damaged)
                print(f"resume: checkpoint {names} in {root} is damaged ({_finding(damaged[0][1])}); resuming from "
                      f"{path.name}, the newest intact one", file=sys.stderr, flush=True)
            if self.is_main and not checked:
                print(f"resume: {path} was saved before checkpoints recorded checksums: loading it unverified",
                      file=sys.stderr, flush=True)
            return path
        found = "; ".join(f"{p.name}: {_finding(e)}" for p, e in damaged)
        raise ack.DamagedCheckpoint(f"no intact checkpoint in {root} to resume from ({found}); every checkpoint "
                                    f"there is damaged: to start afresh, move its step_* directories and LATEST aside")

    def load_checkpoint(self, model: torch.nn.Module, opt: torch.optim.Optimizer, root: Path,
                        path: Path | None = None) -> dict | None:
        """Load ``path``, a checkpoint :meth:`resume_point` chose, or else the one it chooses in ``root``
        (resharding if the grid changed); None if there is none."""
        path = path if path is not None else self.resume_point(root)
        if path is None:
            return None
        extra = ack.load(model, opt, path, grid=self.grid, checksums=False)  # resume_point verified it
        if "rng" in extra:
            torch.set_rng_state(extra.pop("rng"))
        return extra

    def checkpoint_extra(self, root: Path, path: Path | None = None) -> dict | None:
        """The extra state of ``path``, or else of the checkpoint :meth:`resume_point` chooses in ``root``,
        nothing loaded; None if there is none."""
        path = path if path is not None else self.resume_point(root)
        return None if path is None else ack.read_extra(path)

    def export_hf(self, model: torch.nn.Module, out_dir: Path, tokenizer=None,
                  dtype: torch.dtype | None = None) -> None:
        """Write a Hugging Face safetensors directory that ``from_pretrained`` loads (collective, streamed)."""
        ack.export_hf(model, out_dir, tokenizer, grid=self.grid, dtype=dtype)

