"""Checks of a Hugging Face model directory before anything loads it: each failure one line naming the file.

:func:`check_model_dir` is what every evaluation entry point (``eval/extract.py``, ``eval/mia.py``,
``eval/downstream.py``, ``eval/hpc_code.py --model``) runs first, so a damaged or wrong directory is refused with
the file and the fix instead of a deserialiser's traceback (``invalid header length``) or a misleading hint
(a broken ``config.json`` reported as a missing tokenizer).

A safetensors file is ``u64 N`` (little-endian), then ``N`` bytes of JSON header mapping each tensor to
``data_offsets [begin, end)`` in the data that follows; the file is whole when its size is at least
``8 + N + max(end)``.  Reading the header costs one small read, however large the file.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


class ModelDirError(ValueError):
    """A model directory that cannot be loaded; the message names the file and what to do."""


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot be whole (truncated, not safetensors), or None."""
    size = path.stat().st_size
    if size < 8:
        return f"{path} is truncated ({size} bytes)"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            return f"{path} is truncated or not a safetensors file (its header claims {n:,} bytes, the file holds {size:,})"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"{path} is damaged: its header is not valid JSON"
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and "data_offsets" in v]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"{path} is truncated: its tensors need {need:,} bytes, the file holds {size:,}"
    return None


def check_model_config(path: str | Path, flag: str = "--model") -> Path:
    """Refuse (:class:`ModelDirError`) a ``path`` that is no directory with a readable ``config.json``: what a
    command needs before it reads the model's settings (its context length).  Returns the path."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelDirError(f"{flag} {path} does not exist")
    if not p.is_dir():
        raise ModelDirError(f"{flag} {path} is a file: give the directory of a Hugging Face model (config.json and "
                            "weights)")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelDirError(f"{flag} {path} holds no config.json: it is not a Hugging Face model directory (a "
                            "memorize run exports one to <run>/<arm>/model; a training checkpoint converts with "
                            "`python -m axonn.convert`)")
    try:
        json.loads(cfg.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{flag} {path}: config.json is not valid JSON ({e}); restore it from the model's "
                            "source") from None
    return p


def check_model_dir(path: str | Path, flag: str = "--model") -> Path:
    """Refuse (:class:`ModelDirError`) a directory that is no loadable Hugging Face model: what
    :func:`check_model_config` refuses, no weights, a safetensors file (or a shard an index names) truncated or
    damaged.  Returns the path."""
    p = check_model_config(path, flag)
    present = [f for f in WEIGHT_FILES if (p / f).is_file()]
    if not present:
        raise ModelDirError(f"{flag} {path} holds no weights (none of {', '.join(WEIGHT_FILES)})")
    files = [p / "model.safetensors"] if "model.safetensors" in present else []
    if "model.safetensors.index.json" in present:
        try:
            index = json.loads((p / "model.safetensors.index.json").read_text())
            files += sorted({p / f for f in index["weight_map"].values()})
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ModelDirError(f"{flag} {path}: model.safetensors.index.json is damaged ({e})") from None
    for f in files:
        if not f.is_file():
            raise ModelDirError(f"{flag} {path}: {f.name}, named by model.safetensors.index.json, is missing")
        why = safetensors_problem(f)
        if why:
            raise ModelDirError(f"{flag} {path}: {why}; copy or export the model again")
    return p
