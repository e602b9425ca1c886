"""Sharded, atomic, reshardable checkpoints and HF export.

Layout of a checkpoint directory (on a filesystem every rank can see)::

    path/meta.json          format, grid it was written on, model config, every
                            parameter's HF name and full shape, optimizer param groups
    path/rank00000.pt ...   per rank: {name: (local tensor, ShardSpec dict)} for the
                            params (and optimizer state) this rank *owns*
    path/extra.pt           ``extra_state`` (rank 0)
    path/COMPLETE           written last; ``load`` refuses a directory without it

Ownership: a shard is written once, by the rank whose coordinates are 0 on
every axis the shard is replicated over (e.g. data for depth-sharded weights;
data, depth and row/col for norms).  Atomicity: everything is written into
``.<name>.tmp``, fsynced, then renamed to ``path`` by rank 0 (an existing
checkpoint at ``path`` is replaced only after the new one is complete).

Loading reassembles every full tensor from the stored (shard, slice) pairs
and cuts this rank's shard with the *current* grid's spec, so a checkpoint
written on one grid loads onto any other (each rank reads every shard file:
memory = one full copy of the model + optimizer state per rank, offline).
Optimizer state tensors with the parameter's shape follow the parameter's
spec; others (e.g. Adam's ``step``) are stored whole.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from .grid import AXES, Grid, get_grid
from .parallelize import full_state_dict, spec_of
from .sharding import ShardSpec, assemble, extract

FORMAT = "axonn-sharded-v1"
_CONFIG_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "head_dim")


def _grid(model: nn.Module, grid: Grid | None) -> Grid:
    return grid or getattr(model, "_axonn_grid", None) or get_grid()


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _owner(spec: ShardSpec, grid: Grid) -> bool:
    return all(grid.coords[a] == 0 for a in AXES if a not in spec.shard_axes)


def _fsync_write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model_meta(model: nn.Module) -> dict:
    cfg = getattr(model, "config", None)
    c = {k: getattr(cfg, k, None) for k in _CONFIG_KEYS} if cfg is not None else {}
    return {"config": c, "params": {n: list(spec_of(p).full_shape) for n, p in model.named_parameters()}}


def _names_of_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    names = {id(p): n for n, p in model.named_parameters()}
    groups = []
    for g in optimizer.param_groups:
        missing = [p for p in g["params"] if id(p) not in names]
        if missing:
            raise ValueError("optimizer holds parameters that are not in the model")
        groups.append([names[id(p)] for p in g["params"]])
    return groups


def save(model: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike,
         extra_state: dict[str, Any] | None = None, grid: Grid | None = None) -> None:
    """Write a sharded checkpoint of ``model`` (+ ``optimizer``) to ``path`` (collective)."""
    grid = _grid(model, grid)
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp"
    if grid.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()
    params: dict[str, tuple[torch.Tensor, dict]] = {}
    optim: dict[str, dict[str, tuple[torch.Tensor, dict | None]]] = {}
    for name, p in model.named_parameters():
        spec = spec_of(p)
        if not _owner(spec, grid):
            continue
        params[name] = (p.detach().cpu().clone(), spec.to_dict())
        if optimizer is not None and p in optimizer.state:
            optim[name] = {k: ((v.detach().cpu().clone(), spec.to_dict()) if torch.is_tensor(v) and v.shape == p.shape
                               else (v.detach().cpu().clone() if torch.is_tensor(v) else v, None))
                           for k, v in optimizer.state[p].items()}
    _fsync_write(tmp / f"rank{grid.rank:05d}.pt", lambda f: torch.save({"params": params, "optim": optim}, f))
    _barrier()
    if grid.rank == 0:
        meta = {"format": FORMAT, "grid": grid.sizes, "world_size": grid.world_size, **_model_meta(model)}
        if optimizer is not None:
            meta["optimizer"] = {"class": type(optimizer).__name__,
                                 "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                                  for g in optimizer.state_dict()["param_groups"]],
                                 "names": _names_of_optimizer(model, optimizer)}
        _fsync_write(tmp / "meta.json", lambda f: f.write(json.dumps(meta, indent=1, default=str).encode()))
        _fsync_write(tmp / "extra.pt", lambda f: torch.save(extra_state or {}, f))
        _fsync_write(tmp / "COMPLETE", lambda f: f.write(b"ok\n"))
        _fsync_dir(tmp)
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old)
    _barrier()


def _check_compatible(meta: dict, model: nn.Module) -> None:
    mine = _model_meta(model)
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


def load(model: nn.Module, optimizer: torch.optim.Optimizer | None, path: str | os.PathLike,
         grid: Grid | None = None) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save` (on any grid) into ``model``/``optimizer``.

    Returns the saved ``extra_state``.  Raises ``FileNotFoundError`` for an
    incomplete checkpoint and ``ValueError`` for one from a different model.
    """
    grid = _grid(model, grid)
    path = Path(path)
    if not (path / "COMPLETE").exists():
        raise FileNotFoundError(f"{path} is not a complete axonn checkpoint (no COMPLETE marker)")
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}")
    _check_compatible(meta, model)
    pieces: dict[str, list] = {}
    opieces: dict[str, dict[str, list]] = {}
    for f in sorted(path.glob("rank*.pt")):
        d = torch.load(f, map_location="cpu", weights_only=True)
        for n, (t, s) in d["params"].items():
            pieces.setdefault(n, []).append((t, ShardSpec.from_dict(s)))
        for n, st in d["optim"].items():
            for k, (v, s) in st.items():
                opieces.setdefault(n, {}).setdefault(k, []).append((v, ShardSpec.from_dict(s) if s else None))
    with torch.no_grad():
        for n, p in model.named_parameters():
            full = assemble(pieces[n])
            p.copy_(extract(full, spec_of(p)).to(p.dtype).view_as(p))
    if optimizer is not None:
        _load_optimizer(model, optimizer, meta, opieces)
    _barrier()
    return torch.load(path / "extra.pt", map_location="cpu", weights_only=False)


def _load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, meta: dict, opieces: dict) -> None:
    if "optimizer" not in meta:
        raise ValueError("checkpoint has no optimizer state")
    om = meta["optimizer"]
    if om["class"] != type(optimizer).__name__:
        raise ValueError(f"checkpoint optimizer is {om['class']}, got {type(optimizer).__name__}")
    groups = _names_of_optimizer(model, optimizer)
    if len(groups) != len(om["param_groups"]):
        raise ValueError(f"optimizer has {len(groups)} param groups, checkpoint {len(om['param_groups'])}")
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
                    st[k] = extract(assemble(pcs), spec_of(p)).view_as(p).to(p.device) if s is not None else v
                state[idx] = st
            idx += 1
        sd["param_groups"][gi].update({k: tuple(v) if isinstance(v, list) else v
                                       for k, v in om["param_groups"][gi].items()})
    sd["state"] = state
    optimizer.load_state_dict(sd)


def export_hf(model: nn.Module, directory: str | os.PathLike, tokenizer=None, grid: Grid | None = None) -> None:
    """Write a HF directory (config + ``model.safetensors``) loadable by ``from_pretrained`` (collective)."""
    from safetensors.torch import save_file

    grid = _grid(model, grid)
    sd = full_state_dict(model, rank0_only=True, grid=grid)
    if grid.rank == 0:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(d)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(d)
        if tokenizer is not None:
            tokenizer.save_pretrained(d)
    _barrier()
