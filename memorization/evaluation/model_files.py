"""Checks of a Hugging Face model directory before anything loads it: each failure one line naming the file.

:func:`check_model_dir` is what every evaluation entry point (``eval/extract.py``, ``eval/mia.py``,
``eval/downstream.py``, ``eval/hpc_code.py --model``) runs first, so a damaged or wrong directory is refused with
the file and the fix instead of a deserialiser's traceback (``invalid header length``) or a misleading hint
(a broken ``config.json`` reported as a missing tokenizer).

A safetensors file is ``u64 N`` (little-endian), then ``N`` bytes of JSON header mapping each tensor to
``data_offsets [begin, end)`` in the data that follows; the file is whole when its size is at least
``8 + N + max(end)``.  Reading the header costs one small read, however large the file: a header claiming
more than :data:`MAX_HEADER_BYTES` (safetensors' own cap, 100 MB) is refused before it is read, and the header
is validated as safetensors validates it -- an object of ``{"dtype", "shape", "data_offsets"}`` entries (plus
an optional ``__metadata__`` of strings), each tensor's byte span ``prod(shape) * itemsize``, the spans laid
end to end from 0 without gap or overlap -- so a malformed file is one line, in bounded time and memory.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
MAX_HEADER_BYTES = 100_000_000  # safetensors refuses a longer header (MAX_HEADER_SIZE)
#: bytes per element of each safetensors dtype
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


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
        if n > MAX_HEADER_BYTES:
            return (f"{path} is not a safetensors file safetensors reads: its header claims {n:,} bytes, more than "
                    f"the {MAX_HEADER_BYTES:,} it allows")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return f"{path} is damaged: its header is not valid JSON"
    why = header_problem(header)
    if why:
        return f"{path} is damaged: {why}"
    need = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size < need:
        return f"{path} is truncated: its tensors need {need:,} bytes, the file holds {size:,}"
    return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def header_problem(header) -> str | None:
    """Why a parsed safetensors header is malformed (module docstring), or None."""
    if not isinstance(header, dict):
        return f"its header is a JSON {type(header).__name__}, not an object of tensors"
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        return "its header's __metadata__ is not an object of strings"
    spans = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(t, dict) or set(t) != {"dtype", "shape", "data_offsets"}:
            return f"tensor {name!r} is not an object of dtype, shape and data_offsets"
        dtype, shape, offsets = t["dtype"], t["shape"], t["data_offsets"]
        if dtype not in DTYPE_BYTES:
            return f"tensor {name!r} has an unknown dtype {dtype!r}"
        if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
            return f"tensor {name!r} has a shape {shape!r} that is not a list of sizes"
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)
                and offsets[0] <= offsets[1]):
            return f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end"
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPE_BYTES[dtype] != offsets[1] - offsets[0]:
            return (f"tensor {name!r} of shape {shape} ({dtype}) needs {numel * DTYPE_BYTES[dtype]:,} bytes, its "
                    f"data_offsets {offsets} span {offsets[1] - offsets[0]:,}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for lo, hi, name in sorted(spans):
        if lo != end:
            what = "overlaps the tensor before it" if lo < end else f"leaves bytes {end}..{lo} unused before it"
            return f"tensor {name!r} at bytes {lo}..{hi} {what}"
        end = hi
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
            names = set(index["weight_map"].values())
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ModelDirError(f"{flag} {path}: model.safetensors.index.json is damaged ({e})") from None
        bad = sorted(str(n) for n in names if not isinstance(n, str) or Path(n).name != n or n in ("", ".", ".."))
        if bad:
            raise ModelDirError(f"{flag} {path}: model.safetensors.index.json names {bad[0]!r}, not a file of the "
                                "model directory; copy or export the model again")
        files += sorted(p / n for n in names)
    for f in files:
        if not f.is_file():
            raise ModelDirError(f"{flag} {path}: {f.name}, named by model.safetensors.index.json, is missing")
        why = safetensors_problem(f)
        if why:
            raise ModelDirError(f"{flag} {path}: {why}; copy or export the model again")
    if "pytorch_model.bin" in present:
        why = pickle_problem(p / "pytorch_model.bin")
        if why:
            raise ModelDirError(f"{flag} {path}: {why}")
    return p


def pickle_problem(path: Path) -> str | None:
    """Why the pickled weights ``path`` (``pytorch_model.bin``) cannot be loaded safely, or None: its pickle is
    read with torch's ``weights_only`` unpickler, the tensors memory-mapped, not read (so this costs about nothing);
    a pickle naming anything but tensors and plain containers -- code a load would run -- is refused."""
    from axonn.checkpoint import DamagedCheckpoint, load_plain

    fix = "convert it to safetensors, or copy the model again"
    try:
        try:
            load_plain(path, path, mmap=True, damaged=fix)
        except RuntimeError as e:
            if "mmap can only be used" not in str(e):
                raise
            load_plain(path, path, damaged=fix)  # a file in torch's legacy (pre-zip) format: read whole
    except DamagedCheckpoint as e:  # (and UnsafeCheckpoint, a pickle naming code)
        return str(e)
    except Exception as e:  # noqa: BLE001 - torch's readers raise RuntimeError, ValueError, EOFError, ...
        return f"{path} cannot be read as torch weights ({' '.join(str(e).split())[:200]}); {fix}"
    return None
