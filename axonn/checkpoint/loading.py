"""Loading a checkpoint onto any grid: :func:`load`, and the choice of stored pieces each rank reads.

On the grid the checkpoint was written on each shard is the identical stored piece; on another grid each shard is
cut from the rows of the full tensor it needs, taken from the pieces that overlap it (resharding).  Files are
memory-mapped, so a rank reads about its own share of the bytes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..grid import Grid
from ..parallelize import spec_of
from ..sharding import ShardSpec, overlaps, rows_from_pieces, shard_from_rows
from .layout import (barrier, grid_of, load_extra, load_shard_file, model_meta, optimizer_names, read_index, read_meta,
                     verify)

def load(model: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike,
         grid: Grid | None = None, checksums: bool = True) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save` (on any grid) into ``model``/``optimizer``.

    Returns the saved ``extra_state``.  Raises ``FileNotFoundError`` for an
    incomplete checkpoint, ``ValueError`` for one from a different model or optimizer and
    :class:`DamagedCheckpoint` (on every rank) for one whose files are not the bytes saved
    (:func:`verify`), before anything is loaded.  ``checksums=False`` skips :func:`verify` (for a
    checkpoint the caller has just verified; the small files are checked as they are read anyway).
    """
    grid = grid_of(model, grid)
    path = Path(path)
    meta = read_meta(path)
    _check_compatible(meta, model)
    groups = _check_optimizer(model, optimizer, meta) if optimizer is not None else None
    if checksums:
        verify(path, grid)
    params = dict(model.named_parameters())
    index = read_index(path)
    pieces, opieces = open_pieces(path, index, pieces_to_read(pieces_by_name(index),
                                                                {n: spec_of(p) for n, p in params.items()}))
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(_local_from_pieces(pieces[n], spec_of(p)).view_as(p))
    if optimizer is not None:
        _load_optimizer(model, optimizer, meta, opieces, groups)
    barrier()
    return load_extra(path)


def _check_compatible(meta: dict, model: nn.Module) -> None:
    mine = model_meta(model)
    problems = []
    for k, v in meta.get("config", {}).items():
        if k in mine["config"] and mine["config"][k] != v:
            problems.append(f"config.{k}: checkpoint {v} vs model {mine['config'][k]}")
    a, b = set(meta["params"]), set(mine["params"])
    if a - b:
        problems.append(f"parameters only in the checkpoint: {sorted(a - b)[:5]}")
    if b - a:
        problems.append(f"parameters only in the model: {sorted(b - a)[:5]}")
    for n in sorted(a & b):
        if list(meta["params"][n]) != list(mine["params"][n]):
            problems.append(f"{n}: checkpoint shape {meta['params'][n]} vs model {mine['params'][n]}")
    if problems:
        raise ValueError("checkpoint does not match the model (different model?):\n  " + "\n  ".join(problems[:10]))


def pieces_by_name(index: dict[str, dict[str, ShardSpec]]) -> dict[str, list[tuple[str, ShardSpec]]]:
    """A checkpoint's ``{file: {name: spec}}`` (``index.json``) as ``{name: [(file, spec), ...]}``."""
    held: dict[str, list[tuple[str, ShardSpec]]] = {}
    for f, part in index.items():
        for n, s in part.items():
            held.setdefault(n, []).append((f, s))
    return held


def pieces_to_read(held: dict[str, list[tuple[str, ShardSpec]]], specs: dict[str, ShardSpec]) -> dict[str, set[str]]:
    """``{file: names}``: the stored pieces (``held``, :func:`pieces_by_name`) that a rank with
    shards ``specs`` is loaded from.  A shard stored identically (same grid) needs only that
    piece; otherwise every piece that :func:`~axonn.sharding.overlaps` it.
    """
    wanted: dict[str, set[str]] = {}
    mine: dict[ShardSpec, ShardSpec] = {}
    # (piece, shard) -> (identical, overlapping): every layer repeats the same few pairs of specs
    test: dict[tuple[int, int], tuple[bool, bool]] = {}
    for n, spec in specs.items():
        pieces = held.get(n)
        if not pieces:
            raise ValueError(f"the checkpoint stores no shard of {n}")
        spec = mine.setdefault(spec, spec)
        rel = []
        for f, s in pieces:
            key = (id(s), id(spec))
            if key not in test:
                test[key] = (s == spec, overlaps(s, spec))
            rel.append((f, *test[key]))
        same = [f for f, eq, _ in rel if eq]
        # (a shard that lies entirely in the depth padding overlaps nothing: any piece gives its dtype)
        files = same[:1] or [f for f, _, ov in rel if ov] or [pieces[0][0]]
        for f in files:
            wanted.setdefault(f, set()).add(n)
    return dict(sorted(wanted.items()))


def open_pieces(path: Path, index: dict[str, dict[str, ShardSpec]], wanted: dict[str, set[str]]):
    """The stored pieces ``wanted`` names (``{file: names}``), memory-mapped, so a piece's bytes are
    read only when it is used: ``{name: [(tensor, spec)]}`` for the parameters and
    ``{name: {key: [(value, spec or None)]}}`` for their optimizer state (None: stored whole)."""
    pieces: dict[str, list] = {}
    opieces: dict[str, dict[str, list]] = {}
    for f, names in wanted.items():
        d = load_shard_file(path / f)
        for n in names:
            spec = index[f][n]
            pieces.setdefault(n, []).append((d["params"][n][0], spec))
            for k, (v, s) in d["optim"].get(n, {}).items():
                opieces.setdefault(n, {}).setdefault(k, []).append((v, spec if s else None))
    return pieces, opieces


def _local_from_pieces(pieces: list[tuple[torch.Tensor, ShardSpec]], spec: ShardSpec) -> torch.Tensor:
    """This rank's shard from the stored pieces that overlap it: the identical piece if there is
    one (same grid), else cut from the rows of the full tensor it needs (resharding)."""
    for t, s in pieces:
        if s == spec:
            return t
    return shard_from_rows(spec, lambda r0, r1: rows_from_pieces(pieces, r0, r1))


def _check_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict) -> list[list[str]]:
    """The optimizer's groups of parameter names, after checking that the checkpoint's optimizer state
    fits ``optimizer`` (called before anything is loaded: a refused load leaves the model as it was)."""
    if "optimizer" not in meta:
        raise ValueError("checkpoint has no optimizer state (saved with optimizer=None): load it with "
                         "optimizer=None and start the optimizer afresh")
    om = meta["optimizer"]
    if om["class"] != type(optimizer).__name__:
        raise ValueError(f"checkpoint optimizer is {om['class']}, got {type(optimizer).__name__}: build the "
                         f"same optimizer, or load with optimizer=None")
    groups = optimizer_names(model, optimizer)
    if len(groups) != len(om["param_groups"]):
        raise ValueError(f"optimizer has {len(groups)} param groups, checkpoint {len(om['param_groups'])}: "
                         "build the optimizer with the same groups, or load with optimizer=None")
    return groups


def _load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, opieces: dict,
                    groups: list[list[str]]) -> None:
    """Load the optimizer state of ``opieces`` into ``optimizer``; ``groups`` its parameter names by group,
    as :func:`_check_optimizer` returned them."""
    om = meta["optimizer"]
    params = dict(model.named_parameters())
    sd = optimizer.state_dict()
    state: dict[int, dict] = {}
    idx = 0
    for gi, names in enumerate(groups):
        for n in names:
            if n in opieces:
                p = params[n]
                st = {}
                for k, pcs in opieces[n].items():
                    v, s = pcs[0]
                    if s is not None:
                        v = _local_from_pieces(pcs, spec_of(p)).view_as(p)
                    # a copy: no optimizer state stays backed by the memory-mapped file
                    st[k] = v.to(p.device if s is not None else v.device, copy=True) if torch.is_tensor(v) else v
                state[idx] = st
            idx += 1
        sd["param_groups"][gi].update({k: tuple(v) if isinstance(v, list) else v
                                       for k, v in om["param_groups"][gi].items()})
    sd["state"] = state
    optimizer.load_state_dict(sd)
