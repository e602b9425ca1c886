"""The on-disk layout of a sharded checkpoint: its format, who writes which shard, ``index.json``, ``meta.json``,
``extra.pt``, and the verification of a whole checkpoint against its checksums.

The directory's files and the ownership rule are described in :mod:`axonn.checkpoint`.
"""
from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from ..communication import any_rank
from ..grid import Grid, get_grid
from ..parallelize import spec_of
from ..sharding import ShardSpec
from .checksums import (CHECKSUMS, DAMAGED, DamagedCheckpoint, MissingFromCheckpoint, check_file, checker_of,
                        read_checked, read_checksums, read_json)

FORMAT = "axonn-sharded-v2"  # v2: index.json, data replicas split the writing
READABLE = (FORMAT, "axonn-sharded-v1")  # v1: one file per rank, no index (each file's table is read)
_CONFIG_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "head_dim")
TENSOR_AXES = ("depth", "row", "col")


def grid_of(model: nn.Module, grid: Grid | None) -> Grid:
    """``grid`` if given, else the grid ``model`` was parallelized on, else the current one."""
    return grid or getattr(model, "_axonn_grid", None) or get_grid()


def barrier() -> None:
    """A barrier over every process when there is more than one (no-op in a single process)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def tensor_owned(specs: dict[str, ShardSpec], coords: dict[str, int]) -> dict[str, ShardSpec]:
    """The shards that the tensor coordinate ``coords`` stores: those of ``specs`` for which it is
    coordinate 0 on every tensor axis the shard is replicated over (each distinct shard once)."""
    if any("data" in s.shard_axes for s in specs.values()):
        raise NotImplementedError("checkpoints of parameters sharded over the data axis")
    return {n: s for n, s in specs.items() if all(coords[a] == 0 for a in TENSOR_AXES if a not in s.shard_axes)}


def writers(owned: dict[str, ShardSpec], data_size: int) -> dict[str, int]:
    """Which data replica writes each of one tensor coordinate's shards ``owned``.

    Every data replica holds the same shards, so they split the writing: largest shard first, each
    to the replica with the fewest elements so far (longest-processing-time order: no replica
    writes more than ``total / data_size`` plus one shard).  Deterministic, so the writers and
    rank 0's index agree without asking each other.
    """
    load = [0] * data_size
    out: dict[str, int] = {}
    for n in sorted(owned, key=lambda n: (-owned[n].local_numel, n)):
        d = min(range(data_size), key=lambda i: (load[i], i))
        out[n] = d
        load[d] += owned[n].local_numel
    return out


def build_index(parts: dict[int, dict[str, ShardSpec]], sizes: dict[str, int]) -> dict[str, dict[str, ShardSpec]]:
    """``{file: {name: spec}}`` of a save on the grid ``sizes``, from ``parts[t]``: the shards
    tensor coordinate ``t`` (its rank in data slice 0) owns.  The writer of a shard is the rank at
    data index :func:`writers` gives and tensor index ``t``: ``data * T + t``."""
    t_size = math.prod(sizes[a] for a in TENSOR_AXES)
    index: dict[str, dict[str, ShardSpec]] = {}
    for t, owned in parts.items():
        for n, d in writers(owned, sizes["data"]).items():
            index.setdefault(file_of(d * t_size + t), {})[n] = owned[n]
    return dict(sorted(index.items()))


def file_of(rank: int) -> str:
    """The name of the shard file rank ``rank`` writes: ``rank%05d.pt``."""
    return f"rank{rank:05d}.pt"


def encode_index(index: dict[str, dict[str, ShardSpec]]) -> dict:
    """``index.json``'s form: every distinct spec once, each file's entries point at it."""
    number: dict[ShardSpec, int] = {}
    files = {f: {n: number.setdefault(s, len(number)) for n, s in part.items()} for f, part in index.items()}
    return {"specs": [s.to_dict() for s in number], "files": files}


def read_index(path: str | os.PathLike) -> dict[str, dict[str, ShardSpec]]:
    """A checkpoint's ``{file: {name: spec}}`` (equal specs are one object)."""
    path = Path(path)
    sums = read_checksums(path)
    if (path / "index.json").exists() or (sums is not None and "index.json" in sums["files"]):
        raw = read_json(path / "index.json", sums)
        specs = [ShardSpec.from_dict(d) for d in raw["specs"]]
        return {f: {n: specs[i] for n, i in part.items()} for f, part in raw["files"].items()}
    # format v1, before index.json (one file per rank): read each file's own table instead
    seen: dict[ShardSpec, ShardSpec] = {}

    def table(f: Path) -> dict[str, ShardSpec]:
        part = load_shard_file(f)["params"]
        return {n: seen.setdefault(s := ShardSpec.from_dict(d), s) for n, (_, d) in part.items()}

    return {f.name: table(f) for f in sorted(path.glob("rank*.pt"))}


def model_meta(model: nn.Module) -> dict:
    """``meta.json``'s model part: the config keys that must match to load, every parameter's full shape, and
    the whole HF config when the model has one."""
    cfg = getattr(model, "config", None)
    c = {k: getattr(cfg, k, None) for k in _CONFIG_KEYS} if cfg is not None else {}
    meta = {"config": c, "params": {n: list(spec_of(p).full_shape) for n, p in model.named_parameters()}}
    if hasattr(cfg, "to_json_string"):  # the whole HF config: to_hf writes a loadable model without the model
        meta["hf_config"] = json.loads(cfg.to_json_string(use_diff=False))
    return meta


def optimizer_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The parameter names of each of ``optimizer``'s param groups, in order (``ValueError`` if it holds a
    parameter that is not ``model``'s)."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for g in optimizer.param_groups:
        missing = [p for p in g["params"] if id(p) not in names]
        if missing:
            raise ValueError("optimizer holds parameters that are not in the model")
        groups.append([names[id(p)] for p in g["params"]])
    return groups


def read_meta(path: str | os.PathLike) -> dict:
    """``meta.json`` of a complete checkpoint in a format this version reads (else a clear error)."""
    path = Path(path)
    if not (path / "COMPLETE").exists():
        raise FileNotFoundError(f"{path} is not a complete axonn checkpoint (no COMPLETE marker)")
    sums = read_checksums(path)
    meta = read_json(path / "meta.json", sums)
    if not isinstance(meta, dict) or meta.get("format") not in READABLE:
        raise ValueError(f"{path}: unknown checkpoint format "
                         f"{meta.get('format') if isinstance(meta, dict) else meta!r}; this version reads {READABLE}")
    if sums is None and meta.get("checksums"):
        raise MissingFromCheckpoint(f"{path / CHECKSUMS} is missing from a checkpoint saved with checksums: {DAMAGED}")
    return meta


def read_extra(path: str | os.PathLike) -> dict[str, Any]:
    """The ``extra_state`` a complete checkpoint was saved with, without loading anything else."""
    read_meta(path)  # complete, and in a format this version reads
    return load_extra(path)


def load_extra(path: str | os.PathLike) -> dict[str, Any]:
    """``extra.pt`` of the checkpoint ``path``, checked against its checksum, then unpickled with torch's
    ``weights_only`` unpickler: plain containers, numbers, strings and tensors only, so no file can make a load
    run code (a checksum proves nothing against whoever also rewrote ``checksums.json``).  Anything else is
    refused as an :class:`UnsafeCheckpoint` naming the file.  (The caller has checked with :func:`read_meta`
    that the checkpoint is complete.)"""
    path = Path(path)
    data = read_checked(path / "extra.pt", read_checksums(path))  # checked before it is unpickled
    return load_plain(io.BytesIO(data), path / "extra.pt")


class UnsafeCheckpoint(DamagedCheckpoint):
    """A checkpoint file holding something other than plain data (a pickle that could run code when loaded)."""


def load_plain(f: Any, name: str | os.PathLike, mmap: bool = False, damaged: str = DAMAGED) -> Any:
    """``torch.load(f, weights_only=True)``: only tensors, numbers, strings and plain containers; a pickle
    naming any other class or function (which could run code) is refused as :class:`UnsafeCheckpoint`, one
    that is no pickle as :class:`DamagedCheckpoint` (its message ends with ``damaged``: what to do)."""
    import pickle
    import re
    try:
        return torch.load(f, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        text = " ".join(str(e).split("Check the documentation")[0].split())
        what = re.split(r" was not an allowed| Please use", text.split("WeightsUnpickler error:")[-1])[0].strip()[:200]
        if not re.search(r"global|class|GLOBAL", what):  # a damaged pickle, not one naming code
            raise DamagedCheckpoint(f"{name} cannot be read ({what}): {damaged}") from e
        raise UnsafeCheckpoint(f"{name} holds something other than tensors and plain data and is refused: loading "
                               f"it could run code ({what}); do not use a file from a source you do not "
                               "trust") from e


def load_shard_file(f: Path) -> dict:
    """A rank file of a checkpoint, memory-mapped; a truncated or damaged one is an error naming it."""
    try:
        return load_plain(f, f, mmap=True)
    except (FileNotFoundError, DamagedCheckpoint):  # (UnsafeCheckpoint is one) said by load_plain
        raise
    except (RuntimeError, EOFError, ValueError) as e:  # torch's zip reader / unpickler on a damaged file
        raise DamagedCheckpoint(f"{f} cannot be read ({' '.join(str(e)[:200].split())}): {DAMAGED}") from e


def verify(path: str | os.PathLike, grid: Grid | None = None) -> bool:
    """Check a complete checkpoint's files against the checksums recorded when it was saved (collective).

    Every rank reads and checks the metadata (meta.json, index.json, checksums.json) as a load would;
    the shard files are shared out (:func:`checker_of`): each is read whole, once, by one rank, its
    blocks in ``CHECKSUM_THREADS`` threads.  The ranks then agree (an all-reduce of a flag): if any
    found a file damaged, every rank raises :class:`DamagedCheckpoint` with the first such finding (the
    step, the file, the block and both crc32s).  Returns True when verified, False for a checkpoint
    saved without checksums (nothing to compare with; its metadata was still read).  ``grid=None``: one
    process checks every file.
    """
    path = Path(path)
    rank, world = (grid.rank, grid.world_size) if grid is not None else (0, 1)
    found: str | None = None
    sums = None
    try:
        read_meta(path)
        sums = read_checksums(path)
        if (path / "index.json").exists() or (sums is not None and "index.json" in sums["files"]):
            read_index(path)
        if sums is not None:
            step = sums.get("step")
            for name, want in sums["files"].items():
                if name not in ("meta.json", "index.json") and checker_of(name, world) == rank:
                    check_file(path / name, want, step)
    except DamagedCheckpoint as e:
        found = str(e)
    if world > 1 and bool(any_rank(found is not None, grid)):
        everyone: list[str | None] = [None] * world
        dist.all_gather_object(everyone, found)
        bad = [m for m in everyone if m is not None]
        more = f" (and {len(bad) - 1} more ranks found damage)" if len(bad) > 1 else ""
        raise DamagedCheckpoint(bad[0] + more)
    if found is not None:
        raise DamagedCheckpoint(found)
    return sums is not None
