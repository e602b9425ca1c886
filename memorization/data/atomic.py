"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Write to a temporary file in the destination's directory, flush and fsync it, then
``os.replace`` it over the destination (atomic on POSIX within one file system).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def finite_json(obj: object) -> object:
    """``obj`` with every non-finite float (NaN, +-inf: not JSON) replaced by None (``null``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def atomic_write_json(path: str | Path, obj: object) -> None:
    """Write ``obj`` as strict JSON (a non-finite float is written as ``null``: every file is valid JSON)."""
    atomic_write_text(path, json.dumps(finite_json(obj), indent=1, allow_nan=False))
