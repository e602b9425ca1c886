"""Writing a checkpoint (collective): :func:`save`, blocking or in the background (:class:`PendingSave`).

Each rank writes the shards it is the writer of (:func:`axonn.checkpoint.layout.writers`) into a staging
directory, hashing them as they are written; rank 0 writes ``index.json``, ``meta.json``, ``extra.pt``,
``checksums.json`` and ``COMPLETE`` last, then publishes the directory
(:func:`axonn.checkpoint.publishing.publish`).
"""
from __future__ import annotations

import functools
import io
import json
import os
import threading
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from ..communication import any_rank
from ..grid import Grid, ranks_per_node
from ..parallelize import spec_of
from ..sharding import ShardSpec
from . import checksums as crc
from .layout import (FORMAT, TENSOR_AXES, barrier, build_index, encode_index, file_of, grid_of, model_meta,
                     optimizer_names, tensor_owned, writers)
from .publishing import fsync_write, publish, staging_dir

def save(model: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike,
         extra_state: dict[str, Any] | None = None, grid: Grid | None = None,
         background: bool = False, checksums: bool = True) -> "PendingSave | None":
    """Write a sharded checkpoint of ``model`` (+ ``optimizer``) to ``path`` (collective).

    ``checksums`` records every file's size and block crc32s in ``checksums.json`` (computed as the
    bytes are written), which :func:`load` verifies; ``False`` writes a checkpoint without them, as
    saved before they were recorded (for comparisons: it loads unverified).

    ``background=True`` returns once this rank's shards are copied to host memory (a snapshot:
    training may change the model and optimizer right away) and writes the files in a thread; the
    returned :class:`PendingSave`'s ``finish()``, called by every rank at the same point, waits for
    them and publishes the checkpoint.  Until then ``path`` keeps its previous content.  Costs host
    memory for this rank's share of the state (the blocking save streams one tensor at a time): if
    some rank's share exceeds what its node has available (:func:`_snapshot_fits`), every rank
    saves blocking instead, with a warning, and ``None`` is returned as for a blocking save.
    """
    grid = grid_of(model, grid)
    path = Path(path)
    tmp = staging_dir(path, grid.rank)
    barrier()
    owned = tensor_owned({n: spec_of(p) for n, p in model.named_parameters()}, grid.coords)
    mine = {n for n, d in writers(owned, grid.sizes["data"]).items() if d == grid.coords["data"]}
    if background:
        background = _snapshot_fits(state_bytes(model, optimizer, mine), grid)
    saved = _host_copy if background else _as_saved
    params: dict[str, tuple[torch.Tensor, dict]] = {}
    optim: dict[str, dict[str, tuple[torch.Tensor, dict | None]]] = {}
    for name, p in model.named_parameters():
        if name not in mine:
            continue
        spec = owned[name]
        params[name] = (saved(p), spec.to_dict())
        if optimizer is not None and p in optimizer.state:
            optim[name] = {k: ((saved(v), spec.to_dict()) if torch.is_tensor(v) and v.shape == p.shape
                               else (saved(v) if torch.is_tensor(v) else v, None))
                           for k, v in optimizer.state[p].items()}
    index = _gather_index(owned, grid)
    files: list[tuple[str, Callable]] = []
    if params:
        shards = {"params": params, "optim": optim}
        files.append((file_of(grid.rank), lambda f: torch.save(shards, f)))
    if grid.rank == 0:
        compact = json.dumps(encode_index(index), separators=(",", ":")).encode()
        meta = {"format": FORMAT, "grid": grid.sizes, "world_size": grid.world_size, **model_meta(model)}
        if checksums:  # a checkpoint that says so and lacks checksums.json is damaged, not an old one
            meta["checksums"] = {"file": crc.CHECKSUMS, "algorithm": "crc32", "block_bytes": crc.CHECKSUM_BLOCK}
        if optimizer is not None:
            meta["optimizer"] = {"class": type(optimizer).__name__,
                                 "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                                  for g in optimizer.state_dict()["param_groups"]],
                                 "names": optimizer_names(model, optimizer)}
        meta_bytes = json.dumps(meta, indent=1, default=str).encode()
        extra = io.BytesIO()
        torch.save(extra_state or {}, extra)  # now: the caller may change extra_state afterwards
        files += [("index.json", lambda f: f.write(compact)), ("meta.json", lambda f: f.write(meta_bytes)),
                  ("extra.pt", lambda f: f.write(extra.getbuffer()))]
    step = (extra_state or {}).get("step")
    pending = PendingSave(tmp, path, grid, files, checksums=checksums,
                          step=step if isinstance(step, int) else None)
    if not background:
        pending.write()
        pending.finish()
        return None
    pending.start()
    return pending


class PendingSave:
    """A checkpoint whose files are being written (:func:`save` with ``background=True``).

    ``finish()`` is collective: every rank calls it at the same point of its program.  It waits
    for this rank's writer thread, agrees with the other ranks that every write succeeded (else
    every rank raises, and the staging directory is left unpublished), gathers the files' checksums
    on rank 0, which writes ``checksums.json``, then ``COMPLETE``, and renames the staging directory
    to ``path``.
    """

    def __init__(self, tmp: Path, path: Path, grid: Grid, files: list[tuple[str, Callable]],
                 checksums: bool = True, step: int | None = None):
        self.tmp, self.path, self.grid, self._files = tmp, path, grid, files
        self.checksums, self.step = checksums, step
        self.sums: dict[str, dict] = {}  # {file: {"bytes": n, "crc32": [hex per block]}} of this rank's files
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def write(self) -> None:
        """Write and fsync this rank's files (in the caller's thread or the writer thread), computing
        their checksums on the way."""
        try:
            for name, write in self._files:
                if self.checksums:
                    write = functools.partial(self._write_summed, name, write)
                fsync_write(self.tmp / name, write)
        except BaseException as e:  # noqa: BLE001 - reported by finish() on every rank
            self._error = e
        self._files = []  # drop the host copies as soon as they are on disk

    def _write_summed(self, name: str, write: Callable, f) -> None:
        w = crc.CrcWriter(f)
        write(w)
        self.sums[name] = w.record()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.write, name=f"axonn-save-{self.path.name}", daemon=False)
        self._thread.start()

    def done(self) -> bool:
        """Whether this rank's files are written (``finish`` will not wait for them)."""
        return self._thread is None or not self._thread.is_alive()

    def finish(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if bool(any_rank(self._error is not None, self.grid)):
            here = f": {self._error!r} on this rank" if self._error is not None else " on another rank"
            raise RuntimeError(f"writing checkpoint {self.path} failed{here}; the previous checkpoint there, "
                               f"if any, is untouched") from self._error
        sums = _gather_sums(self.sums, self.grid) if self.checksums else None
        barrier()
        if self.grid.rank == 0:
            if sums is not None:
                record = {"algorithm": "crc32", "block_bytes": crc.CHECKSUM_BLOCK, "step": self.step,
                          "files": dict(sorted(sums.items()))}
                data = json.dumps(record, separators=(",", ":")).encode()
                fsync_write(self.tmp / crc.CHECKSUMS, lambda f: f.write(data))
            fsync_write(self.tmp / "COMPLETE", lambda f: f.write(b"ok\n"))
            publish(self.tmp, self.path)
        barrier()


def _gather_sums(mine: dict[str, dict], grid: Grid) -> dict[str, dict]:
    """Every rank's ``{file: checksum record}`` merged, on rank 0 (``{}`` elsewhere); one small gather."""
    if grid.world_size == 1:
        return dict(mine)
    parts = [None] * grid.world_size if grid.rank == 0 else None
    dist.gather_object(mine, parts, dst=0)
    return {f: r for part in parts or () for f, r in part.items()}


SNAPSHOT_HOST_FRACTION = 0.8  # of this rank's share of the node's available host memory


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None, names: set[str] | None = None) -> int:
    """Bytes of the parameters in ``names`` (default: all) and of their optimizer state tensors."""
    total = 0
    for name, p in model.named_parameters():
        if names is None or name in names:
            total += p.numel() * p.element_size()
            if optimizer is not None and p in optimizer.state:
                total += sum(v.numel() * v.element_size() for v in optimizer.state[p].values() if torch.is_tensor(v))
    return total


def _snapshot_fits(nbytes: int, grid: Grid, available: int | None = None) -> bool:
    """Whether every rank can hold its background-save snapshot (collective: all ranks agree).

    Each rank needs ``nbytes`` of host memory; it may take ``SNAPSHOT_HOST_FRACTION`` of its
    share of the node's available memory (``available / axonn.grid.ranks_per_node()``).  If any rank cannot,
    every rank saves blocking instead (nothing is lost, training waits for the write) and rank 0
    says why.
    """
    if available is None:
        import psutil

        available = psutil.virtual_memory().available
    share = available / ranks_per_node()
    ok = not bool(any_rank(nbytes > SNAPSHOT_HOST_FRACTION * share, grid))
    if not ok and grid.rank == 0:
        import warnings

        warnings.warn(f"background checkpoint: a rank's snapshot ({nbytes / 1e9:.1f} GB on rank 0) does not fit "
                      f"in its share of host memory ({share / 1e9:.1f} GB available per rank on rank 0's node); "
                      f"saving blocking instead (drop --async-checkpoint, or use more nodes)", stacklevel=3)
    return ok


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of ``t`` that later in-place updates of ``t`` do not touch."""
    return t.detach().to("cpu", copy=True)


def _as_saved(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``torch.save`` should see it: the live tensor itself, on its device.

    ``torch.save`` copies one storage at a time to the host while it writes, so a rank's
    save needs host memory for its largest tensor, not for all it writes of its shards and
    optimizer state.  A view into a larger storage is cloned, since ``torch.save`` would write
    the whole storage.
    """
    t = t.detach()
    whole = (t.is_contiguous() and t.storage_offset() == 0
             and t.untyped_storage().nbytes() == t.numel() * t.element_size())
    return t if whole else t.clone()


def _gather_index(owned: dict[str, ShardSpec], grid: Grid) -> dict[str, dict[str, ShardSpec]]:
    """The whole save's index (:func:`build_index`) on rank 0, ``{}`` elsewhere.

    The data replicas of a tensor coordinate own the same shards, so only data slice 0 sends its
    ``owned`` specs, over its tensor group: (depth x row x col) small dicts, not one per rank.
    """
    if grid.coords["data"] != 0:
        return {}
    group = grid.group(TENSOR_AXES)
    parts = [owned]
    if group is not None:
        parts = [None] * grid.size(TENSOR_AXES) if grid.rank == 0 else None
        dist.gather_object(owned, parts, dst=0, group=group)  # global rank 0 is this group's rank 0
    if grid.rank != 0:
        return {}
    # data slice 0 holds ranks 0..T-1 (data is the slowest axis): part t is tensor coordinate t's
    return build_index(dict(enumerate(parts)), grid.sizes)
