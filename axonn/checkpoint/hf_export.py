"""Hugging Face model directories: export from a live model (:func:`export_hf`) or from a checkpoint offline
(:func:`to_hf`), and lazy reading of one (:class:`SafetensorsCheckpoint`)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ..grid import Grid
from ..parallelize import spec_of
from ..sharding import gather_full, rows_from_pieces
from .layout import barrier, grid_of, read_index, read_meta, verify
from .loading import open_pieces
from .publishing import fsync_path, publish, staging_dir

HF_SHARD_BYTES = 5 * 2**30  # the size of one safetensors file of an export (HF's default max_shard_size)


def _by_bytes(entries: list[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Names grouped in order into files of at most ``max_bytes`` (a larger tensor gets its own)."""
    files: list[list[str]] = [[]]
    size = 0
    for name, nbytes in entries:
        if files[-1] and size + nbytes > max_bytes:
            files.append([])
            size = 0
        files[-1].append(name)
        size += nbytes
    return files


def _checked_against_plan(config, shapes: dict[str, tuple[int, ...]], what: str
                           ) -> tuple[Callable[[str, torch.Tensor], torch.Tensor], dict[str, str]]:
    """Refuse (``ValueError``) a state dict of full tensors ``shapes`` (name -> shape) that is not the model its
    family's plan and ``config`` describe (:func:`axonn.plans.state_problems`), or a ``config`` whose model_type
    has no plan; before anything is written.  Returns the check of each gathered tensor against its shape, and
    the name each tensor is written under: its own, or the one the family's released checkpoints (and
    ``save_pretrained``) use where the plan names one (GPT-NeoX's head: ``embed_out.weight``)."""
    from axonn.plans import get_plan, state_problems

    try:
        plan = get_plan(getattr(config, "model_type", None))
    except ValueError as e:
        raise ValueError(f"{what}: HF export writes the models of the families with a parallel plan: {e}") from None
    problems = state_problems(plan, config, shapes)
    if problems:
        raise ValueError(f"{what} is not the {plan.hf_class} its config describes (axonn.plans):\n  "
                         + "\n  ".join(problems[:10]))

    def check(name: str, full: torch.Tensor) -> torch.Tensor:
        if tuple(full.shape) != tuple(shapes[name]):
            raise RuntimeError(f"{name}: gathered a tensor of shape {list(full.shape)}, the plan says "
                               f"{list(shapes[name])}")
        return full

    aliases = dict(plan.checkpoint_aliases)
    return check, {n: aliases.get(n, n) for n in shapes}


def _check_export_target(d: Path) -> Path:
    if d.exists() and any(d.iterdir()) and not (d / "config.json").exists():
        raise FileExistsError(f"{d} exists and is not a model directory (no config.json): an export replaces its "
                              "target, so choose a new or empty directory")
    return d


def _config_with_dtype(config, written: set[torch.dtype]):
    """A copy of ``config`` whose ``dtype`` is the widest floating-point dtype of the tensors ``written``.

    ``from_pretrained`` (``dtype="auto"``) casts every weight to ``config.dtype``: a config that kept
    the dtype of the model it was built from (``bfloat16`` for a Hub Llama used as ``--init``) while
    the export holds fp32 master weights would load them rounded to bf16.  The widest written dtype
    loses nothing.
    """
    config = type(config).from_dict(config.to_dict())  # the live model's config stays as it is
    if written:
        # transformers >= 4.56 calls it ``dtype`` (``torch_dtype`` is a deprecated property there);
        # earlier versions, ``torch_dtype``
        name = "dtype" if isinstance(getattr(type(config), "torch_dtype", None), property) else "torch_dtype"
        setattr(config, name, max(written, key=lambda t: torch.finfo(t).bits))
    return config


def _write_hf_dir(d: Path, rank: int, entries: list[tuple[str, int]], full_of: Callable[[str], torch.Tensor],
                  config, savers: list, dtype: torch.dtype | None, max_shard_bytes: int,
                  file_names: dict[str, str]) -> None:
    """Write a HF model directory from ``full_of(name)`` (the full tensor; every rank calls it for every
    name, in order, so it may be a collective), rank 0 holding one file's tensors at a time.

    ``entries`` are (state-dict name, bytes as written), each written under ``file_names[name]``; ``savers``
    more objects with ``save_pretrained`` (generation config, tokenizer).  One file is ``model.safetensors``; more
    are ``model-0000i-of-0000n.safetensors`` with HF's ``model.safetensors.index.json``.  The
    directory appears atomically (the callers refuse a target that is not a model directory first).
    ``config.json``'s ``dtype`` is that of the tensors written (:func:`_config_with_dtype`).
    """
    from safetensors.torch import save_file

    tmp = staging_dir(d, rank)
    plan = _by_bytes(entries, max_shard_bytes)
    names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    if len(plan) == 1:
        names = ["model.safetensors"]
    weight_map, total, written = {}, 0, set()
    for fname, group in zip(names, plan):
        tensors = {}
        for name in group:
            full = full_of(name)
            if rank == 0:
                full = full.to("cpu", dtype=dtype if dtype is not None and full.is_floating_point() else None)
                tensors[file_names[name]] = full.contiguous()
                weight_map[file_names[name]] = fname
                total += full.numel() * full.element_size()
                if full.is_floating_point():
                    written.add(full.dtype)
            del full
        if rank == 0:
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
            fsync_path(tmp / fname)
        del tensors
    if rank != 0:
        return
    if len(plan) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    _config_with_dtype(config, written).save_pretrained(tmp)
    for obj in savers:
        if obj is not None:
            obj.save_pretrained(tmp)
    publish(tmp, d)


def export_hf(model: nn.Module, directory: str | os.PathLike, tokenizer=None, grid: Grid | None = None,
              max_shard_bytes: int = HF_SHARD_BYTES, dtype: torch.dtype | None = None) -> None:
    """Write a HF directory that ``from_pretrained`` loads: config, safetensors, tokenizer (collective).

    Streams: each tensor is gathered in turn (:func:`~axonn.sharding.gather_full`), moved to the
    host of rank 0 and written with the rest of its file; rank 0 holds one file's tensors at a time
    (at most ``max_shard_bytes``, HF's 5 GiB by default), no rank ever holds the full model.  One
    file is ``model.safetensors``; more are ``model-0000i-of-0000n.safetensors`` with HF's
    ``model.safetensors.index.json``.  ``dtype`` (e.g. ``torch.bfloat16``) converts floating-point
    tensors on the way.  The directory appears atomically (written beside it, then renamed over a
    previous export; a non-empty directory that is not a model directory is refused).  The model must be of
    a family with a parallel plan: every tensor's full shape is checked against the plan and the model's
    config before anything is written (:func:`axonn.plans.state_problems`), and each gathered tensor
    against its shape; the tensors are named as the family's ``save_pretrained`` names them (the plan's
    checkpoint aliases: GPT-NeoX's head is ``embed_out.weight``, which transformers 4 and 5 both load), and
    ``config.json`` is the model's own config (its family's class).  A tied head (``tie_word_embeddings``) is
    the embedding's tensor, written once under the embedding's name, as ``save_pretrained`` writes it.
    """
    d = _check_export_target(Path(directory))
    params = dict(model.named_parameters())
    aliases = set(dict(model.named_parameters(remove_duplicate=False))) - set(params)
    state = {n: t for n, t in model.state_dict().items() if n not in aliases}  # a tied head: written once
    shapes = {n: tuple(spec_of(params[n]).full_shape if n in params else t.shape) for n, t in state.items()}
    check, file_names = _checked_against_plan(getattr(model, "config", None), shapes,
                                              f"export of {type(model).__name__}")
    grid = grid_of(model, grid)
    entries = [(n, math.prod(shapes[n]) * (dtype or t.dtype).itemsize) for n, t in state.items()]

    def full_of(name: str) -> torch.Tensor:
        t = state[name]
        return check(name, gather_full(t, spec_of(params[name]), grid) if name in params else t.detach())

    _write_hf_dir(d, grid.rank, entries, full_of, model.config,
                  [getattr(model, "generation_config", None), tokenizer], dtype, max_shard_bytes, file_names)
    barrier()


def to_hf(checkpoint: str | os.PathLike, directory: str | os.PathLike, tokenizer=None, config=None,
          dtype: torch.dtype | None = None, max_shard_bytes: int = HF_SHARD_BYTES) -> None:
    """Turn a sharded checkpoint into a HF directory offline: one process, no grid, no GPU.

    For a job that stopped after its last checkpoint but before its export, or to get an HF model of
    any step.  Each full tensor is assembled from its stored pieces (memory-mapped; the pieces that
    :func:`read_index` names, :func:`~axonn.sharding.rows_from_pieces` over all rows) and written
    before the next is read, so the process holds one tensor plus one output file's worth (at most
    ``max_shard_bytes``).  ``config`` (a ``PretrainedConfig``) is needed only for a checkpoint
    written before ``meta.json`` carried the model's config.  As in :func:`export_hf` the parameters' shapes
    are checked against the family's plan and the config before anything is written.
    """
    from transformers import AutoConfig, GenerationConfig

    path, d = Path(checkpoint), _check_export_target(Path(directory))
    meta = read_meta(path)
    if config is None:
        if "hf_config" not in meta:
            raise ValueError(f"{path}: this checkpoint predates meta.json's hf_config; pass the model's config "
                             "(--config DIR: a directory with its config.json, e.g. the run's export or --init model)")
        cfg = dict(meta["hf_config"])
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    verify(path)  # every file, in this process, before a byte of it is converted
    index = read_index(path)
    shapes = {n: tuple(s) for n, s in meta["params"].items()}
    check, file_names = _checked_against_plan(config, shapes, str(path))
    missing = sorted(set(shapes).difference(*index.values()))
    if missing:
        raise ValueError(f"{path}: the checkpoint stores no shard of {missing[:3]}")
    pieces, _ = open_pieces(path, index, {f: set(part) for f, part in index.items()})  # every piece, mmapped
    entries = [(n, math.prod(shape) * (dtype or pieces[n][0][0].dtype).itemsize) for n, shape in shapes.items()]

    def full_of(name: str) -> torch.Tensor:
        shape = shapes[name]
        return check(name, rows_from_pieces(pieces[name], 0, shape[0]).view(shape))

    _write_hf_dir(d, 0, entries, full_of, config,
                  [GenerationConfig.from_model_config(config), tokenizer], dtype, max_shard_bytes, file_names)


class SafetensorsCheckpoint:
    """A HF checkpoint directory read lazily: shapes from the file headers, rows on demand.

    ``model.safetensors`` or a sharded ``model.safetensors.index.json`` (what :func:`export_hf`
    and the Hub's Llama releases hold).  :meth:`rows` reads ``full[r0:r1]`` of one tensor from the
    memory-mapped file, so a rank cutting its shard (:func:`axonn.sharding.shard_from_rows`)
    reads only those rows.  Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, directory: str | os.PathLike):
        from safetensors import safe_open

        self.directory = d = Path(directory)
        index = d / "model.safetensors.index.json"
        if index.exists():
            self.weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        elif (d / "model.safetensors").exists():
            with safe_open(str(d / "model.safetensors"), framework="pt") as f:
                self.weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        else:
            other = sorted(p.name for p in d.glob("*.bin")) if d.is_dir() else []
            hint = (f" (found {', '.join(other[:3])}: convert it with `from_pretrained(...).save_pretrained(dir, "
                    "safe_serialization=True)`)" if other else "")
            raise FileNotFoundError(f"{d}: no model.safetensors or model.safetensors.index.json{hint}")
        missing = sorted({f for f in self.weight_map.values() if not (d / f).exists()})
        if missing:
            raise FileNotFoundError(f"{d}: the index names files that are not there: {', '.join(missing[:3])}")
        self._open: dict[str, Any] = {}

    def _file(self, name: str):
        from safetensors import safe_open

        fname = self.weight_map[name]
        if fname not in self._open:
            self._open[fname] = safe_open(str(self.directory / fname), framework="pt")
        return self._open[fname]

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._file(name).get_slice(name).get_shape())

    def rows(self, name: str, r0: int, r1: int) -> torch.Tensor:
        """``full[r0:r1]`` of tensor ``name`` (dim 0), read from the file."""
        return self._file(name).get_slice(name)[r0:r1]

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> "SafetensorsCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
