"""A prepared token store: a run's mixture tokenized once, written as raw arrays, read on demand by every rank.

:func:`prepare_store` loads a corpus, tokenizes it once in parallel (``datasets.map(num_proc=...)`` into a
memory-mapped Arrow file), builds the mixture with :func:`memorization.data.mixture.build_mixture` (the same
selection and placement code, so the stream is the one built from the text) and writes a directory::

    <out>/input_ids.bin        (N, L)  uint16 (vocabulary <= 65,536) or uint32   training rows, in step order
    <out>/doc_ids.bin          (N, L)  int16 or int32                             document index within each row
    <out>/context_ids.bin      (N, C)  like input_ids     the C stream tokens before each row (RowContext.ids)
    <out>/context_doc_ids.bin  (N, C)  int32              their document ids (RowContext.doc_ids, NO_DOC padding)
    <out>/context_start.bin    (N,)    int16 or int32     where each row's background begins (RowContext.start)
    <out>/val_ids.bin, val_doc_ids.bin   (M, L)           held-out rows (M is set by val_docs, not the corpus)
    <out>/manifest.json        the mixture's manifest (Mixture.manifest(): targets, non-members, rows, steps)
    <out>/store.json           written last (the completion marker): format version, each array's file,
                               dtype, shape, byte size and crc32s (one per 64 MiB block, computed as it was
                               written), the token id range, the mixture config, and the fingerprints of
                               corpus, targets and tokenizer

All arrays are C-ordered raw little-endian files (``ndarray.tofile``).  The directory is written under a
temporary name beside ``out`` and renamed into place, so a reader sees a whole store or none.

:func:`open_store` returns a :class:`~memorization.data.mixture.Mixture` whose ``input_ids``, ``doc_ids`` and
``row_context`` are :class:`StoredArray` views: ``view[a:b]`` (or ``view[index_tensor]``) reads those rows
from the file (``pread``, nothing mapped) as the dtype the trainer expects (int64 tokens, int32 document ids),
so a rank's resident memory holds only the rows of the step it trains, whatever the store's size.  The view's
``token_range`` is the one recorded at prepare time: the trainer checks it against the model's vocabulary
without reading the stream.  Asked with what the run names (``corpus``, ``tokenizer``,
``config``, ``target_texts``), ``open_store`` refuses a store of other data or settings, or one that cannot
fill the steps asked for, with a ``StoreMismatch`` that names the difference and the ``prepare`` command
that writes the right store.  With ``verify=True`` (what a run does, on one rank) every array is first read
whole and compared with the crc32s recorded when it was written (:func:`verify_store`): a damaged store is a
:class:`StoreError` naming the file and the command that rebuilds it, not a run on other tokens.  The
recorded token range is checked against the tokenizer's vocabulary here and against the model's by the trainer.

A run given no store uses :func:`ensure_cached_store`: the store of its inputs in the cache
(``$GOLDFISH_CACHE/stores/<key>``, the key a hash of every input), prepared on first use.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from axonn.checkpoint import CHECKSUM_BLOCK, CrcWriter
from axonn.checkpoint.checksums import crcs_of_file, pread_exact

from .atomic import atomic_write_json
from memorization.training.goldfish import RowContext
from .mixture import Mixture, MixtureConfig, build_mixture, tokenize_with_bos

STORE_VERSION = 1
STORE_FILE = "store.json"  # written last: a directory without it is an unfinished store
MANIFEST_FILE = "manifest.json"
PREPARE_SCRIPT = "data/prepare.py"
_CHUNK_ROWS = 1 << 16  # rows converted and written at a time
# the dtype each array has in the trainer's hands (what StoredArray.__getitem__ returns)
_TORCH_DTYPES = {"input_ids": torch.int64, "doc_ids": torch.int32, "context_ids": torch.int64,
                 "context_doc_ids": torch.int32, "context_start": torch.int64, "val_ids": torch.int64,
                 "val_doc_ids": torch.int32}
# MixtureConfig field -> the prepare flag that sets it (for messages)
_FLAGS = {"seq_len": "--seq-len", "batch_size": "--batch-size", "exposures": "--exposures",
          "num_targets": "--num-targets", "num_nonmembers": "--num-nonmembers", "val_docs": "--val-docs",
          "num_steps": "--steps", "min_target_tokens": "--min-target-tokens",
          "max_target_tokens": "--max-target-tokens", "skip_short_targets": "--skip-short-targets",
          "skip_overlapping_targets": "--skip-overlapping-targets", "seed": "--seed", "placement": "--placement"}


class StoreError(ValueError):
    """A token store that cannot be used: missing, unfinished, damaged, or of another format version."""


class StoreMismatch(StoreError):
    """A token store prepared for other data or settings than the run names, or too small for its steps."""


# ---- storage dtypes ----------------------------------------------------------------------------------------
def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 for a vocabulary of at most 65,536 ids, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def _int_dtype(lo: int, hi: int) -> np.dtype:
    """The narrowest of int16/int32/int64 holding ``[lo, hi]``."""
    for dt in (np.int16, np.int32, np.int64):
        if np.iinfo(dt).min <= lo and hi <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"range [{lo}, {hi}] does not fit int64")


def _value_range(t: Any) -> tuple[int, int]:
    """``(min, max)`` of an integer array or tensor, read ``_CHUNK_ROWS`` rows at a time; ``(0, -1)`` if empty."""
    lo, hi = None, None
    for i in range(0, len(t), _CHUNK_ROWS):
        c = np.asarray(t[i : i + _CHUNK_ROWS])
        if c.size:
            lo = int(c.min()) if lo is None else min(lo, int(c.min()))
            hi = int(c.max()) if hi is None else max(hi, int(c.max()))
    return (0, -1) if lo is None else (lo, hi)


# ---- identity: what a store was prepared from --------------------------------------------------------------
def texts_fingerprint(texts: Sequence[str] | None) -> str | None:
    """The fingerprint of a list of documents (:func:`memorization.data.corpus.corpus_fingerprint`); None for None."""
    from .corpus import corpus_fingerprint

    return None if texts is None else corpus_fingerprint(list(texts))


#: mixture fields added after the store format's first version, with their defaults: written only when set
#: otherwise, so a store prepared before them keeps its cache key and header
_LATER_FIELDS = {"placement": "random"}


def config_dict(cfg: MixtureConfig) -> dict:
    """A mixture config as the JSON ``store.json`` keeps (tuples as lists; :data:`_LATER_FIELDS` at their
    default left out)."""
    d = json.loads(json.dumps(asdict(cfg)))
    return {k: v for k, v in d.items() if not (k in _LATER_FIELDS and v == _LATER_FIELDS[k])}


def corpus_key(spec: str) -> str:
    """A corpus spec as stored and compared: a local path made absolute, anything else as given."""
    from .corpus import looks_local

    p = Path(spec).expanduser()
    return str(p.resolve()) if (p.exists() or looks_local(spec)) and not spec.startswith("builtin:") else spec


def _shown(v: Any) -> str:
    """A config value as its flag takes it (``[8, 16]`` -> ``8,16``)."""
    return ",".join(map(str, v)) if isinstance(v, list) else str(v)


def prepare_command(out: str | Path, corpus: str, tokenizer: str, cfg: MixtureConfig, targets: str | None = None,
                    text_field: str = "text") -> str:
    """The ``data/prepare.py`` command line that writes the store of these inputs to ``out``."""
    d = config_dict(cfg)
    args = ["python", PREPARE_SCRIPT, "--corpus", corpus, "--tokenizer", tokenizer]
    if text_field != "text":
        args += ["--text-field", text_field]
    if targets:
        args += ["--targets", str(targets)]
    for name, flag in _FLAGS.items():
        v = d.get(name)
        if isinstance(v, bool):
            args += [flag] if v else []
        elif v is not None:
            args += [flag, _shown(v)]
    return " ".join(shlex.quote(a) for a in args + ["--out", str(out)])


# ---- writing -----------------------------------------------------------------------------------------------
def tokenize_corpus(docs: Sequence[str], tokenizer, num_proc: int = 1, work_dir: str | Path | None = None,
                    batch_size: int = 256) -> Sequence[list[int]]:
    """Each document's token ids with a leading BOS (:func:`memorization.data.mixture.tokenize_with_bos`),
    tokenized by ``datasets.map(batched=True, num_proc=num_proc)`` into a memory-mapped Arrow file in
    ``work_dir`` (a temporary directory if None; the file is kept while the returned column lives).
    The result does not depend on ``num_proc``."""
    from datasets import Dataset, disable_progress_bars

    disable_progress_bars()
    work = Path(work_dir or tempfile.mkdtemp(prefix="token-store-"))
    work.mkdir(parents=True, exist_ok=True)
    ds = Dataset.from_dict({"text": list(docs)})

    def encode(batch: dict) -> dict:
        return {"input_ids": tokenize_with_bos(tokenizer, batch["text"])}

    out = ds.map(encode, batched=True, batch_size=batch_size, num_proc=num_proc if num_proc > 1 else None,
                 remove_columns=["text"], cache_file_name=str(work / "tokens.arrow"), load_from_cache_file=False,
                 desc="tokenizing")
    return out["input_ids"]


def write_store(out: str | Path, mixture: Mixture, identity: dict, vocab_size: int, overwrite: bool = False) -> Path:
    """Write ``mixture`` as a token store in ``out`` (layout in the module docstring), ``identity``
    (fingerprints, specs, the prepare command) recorded in ``store.json``.

    The arrays may be tensors or numpy arrays (memory-mapped ones included) of any integer dtype; they are
    converted and written ``_CHUNK_ROWS`` rows at a time.  The store is built under a temporary name and
    renamed into place; an existing ``out`` is refused unless ``overwrite``."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise StoreError(f"{out} exists: choose another --out, or pass --overwrite to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_work_dirs(out.parent, f".{out.name}.tmp-")
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-{_owner_tag()}"))
    tmp.chmod(0o755)  # (mkdtemp makes it private; a store is read by every rank and user of the run)
    try:
        ctx = mixture.row_context
        arrays = {"input_ids": mixture.input_ids, "doc_ids": mixture.doc_ids, "context_ids": ctx.ids,
                  "context_doc_ids": ctx.doc_ids, "context_start": ctx.start, "val_ids": mixture.val_ids,
                  "val_doc_ids": mixture.val_doc_ids}
        tok_lo, tok_hi = 0, -1
        files = {}
        for name, t in arrays.items():
            lo, hi = _value_range(t)
            if name in ("input_ids", "context_ids", "val_ids"):
                dt = token_dtype(max(vocab_size, hi + 1))
                if lo < 0:
                    raise StoreError(f"{name} holds a negative token id {lo}")
                if name != "context_ids":  # (the context's padding zeros are no tokens)
                    tok_lo, tok_hi = (lo, hi) if tok_hi < tok_lo else (min(tok_lo, lo), max(tok_hi, hi))
            else:
                dt = _int_dtype(lo, hi) if hi >= lo else np.dtype(np.int16)
            path = tmp / f"{name}.bin"
            with open(path, "wb") as f:
                w = CrcWriter(f)  # crc32 of each CHECKSUM_BLOCK bytes, hashed as they are written
                for i in range(0, len(t), _CHUNK_ROWS):
                    w.write(np.ascontiguousarray(np.asarray(t[i : i + _CHUNK_ROWS]).astype(dt.newbyteorder("<"))))
            shape = [int(s) for s in t.shape]
            files[name] = {"file": path.name, "dtype": dt.str, "shape": shape, "bytes": path.stat().st_size,
                           "range": [lo, hi], "crc32": w.record()["crc32"]}
        atomic_write_json(tmp / MANIFEST_FILE, mixture.manifest())
        header = {"version": STORE_VERSION, "arrays": files, "checksum_block_bytes": CHECKSUM_BLOCK,
                  "token_range": [tok_lo, tok_hi],
                  "vocab_size": int(vocab_size), "num_rows": int(len(mixture.input_ids)),
                  "num_steps": int(mixture.num_steps), "seq_len": int(mixture.input_ids.shape[1]),
                  "config": config_dict(mixture.config), "meta": mixture.meta, **identity}
        atomic_write_json(tmp / STORE_FILE, header)  # last: the store is complete
        for f in (MANIFEST_FILE, STORE_FILE):
            (tmp / f).chmod(0o644)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _owner_tag() -> str:
    """``<host>-<pid>-``: which process made a work directory (so a later one can tell whether it died)."""
    import socket

    return f"{socket.gethostname().replace('-', '_')}-{os.getpid()}-"


def remove_stale_work_dirs(parent: Path, prefix: str) -> None:
    """Remove the directories ``<prefix><host>-<pid>-*`` in ``parent`` that a process of this host made and that
    is gone (a preparation killed with SIGKILL cannot remove its own; one of another host is left alone)."""
    import socket

    host = socket.gethostname().replace("-", "_")
    if not parent.is_dir():
        return
    for d in parent.glob(f"{prefix}{host}-*-*"):
        pid = d.name[len(prefix) + len(host) + 1:].split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:  # alive, another user's
            pass


def auto_num_proc(num_docs: int) -> int:
    """Tokenizing processes for ``num_docs`` documents when none is asked for: one below 20,000 documents
    (the default corpus's 2,414 tokenize in about a second, less than starting workers takes), else up to 8
    of this machine's cores."""
    return 1 if num_docs < 20_000 else max(1, min(8, os.cpu_count() or 1))


def prepare_store(corpus: str, tokenizer: str, cfg: MixtureConfig, out: str | Path,
                  targets: Sequence[str] | None = None, targets_path: str | None = None, text_field: str = "text",
                  num_proc: int | None = 1, overwrite: bool = False, tokenizer_obj=None) -> Path:
    """Tokenize ``corpus`` once with ``tokenizer`` and write the token store of the mixture ``cfg`` to ``out``.

    ``corpus`` is a :func:`memorization.data.corpus.load_documents` spec (hub name, local jsonl/parquet/txt/arrow
    directory, ``builtin:pydocs``); ``tokenizer`` a :func:`memorization.data.corpus.load_tokenizer` spec (with a
    checkpoint, its directory: the run's ``--init``); ``targets`` the target documents' texts (None: targets
    drawn from the corpus), ``targets_path`` where they were read from (recorded, and used in messages).
    ``tokenizer_obj`` (already loaded from ``tokenizer``) skips loading it again; ``num_proc`` None picks
    :func:`auto_num_proc` of the corpus's size.  The mixture is exactly
    ``build_mixture(docs, tokenizer, cfg, target_texts)``'s; ``ValueError`` as build_mixture raises them."""
    from .corpus import corpus_fingerprint, data_checksums, load_documents, load_tokenizer, tokenizer_sha256

    tok = tokenizer_obj if tokenizer_obj is not None else load_tokenizer(tokenizer)
    docs = load_documents(corpus, text_field=text_field)
    target_texts = None if targets is None else list(targets)
    out = Path(out)
    if out.parent.exists():
        remove_stale_work_dirs(out.parent, ".tokenize-")
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None,
                                     prefix=f".tokenize-{_owner_tag()}") as work:
        workers = auto_num_proc(len(docs)) if num_proc is None else num_proc
        token_ids = tokenize_corpus(docs, tok, num_proc=workers, work_dir=work)
        checks = data_checksums(corpus, tok)
        meta = {"corpus": corpus, "tokenizer": tokenizer, "corpus_fingerprint": corpus_fingerprint(docs), **checks}
        mixture = build_mixture(docs, tok, cfg, target_texts=target_texts, meta=meta, token_ids=token_ids)
        del token_ids
    identity = {"corpus": corpus, "corpus_key": corpus_key(corpus), "text_field": text_field,
                "corpus_fingerprint": meta["corpus_fingerprint"], "corpus_sha256": checks["corpus_sha256"],
                "tokenizer": tokenizer, "tokenizer_sha256": tokenizer_sha256(tok),
                "targets": targets_path, "targets_fingerprint": texts_fingerprint(target_texts),
                "command": prepare_command(out, corpus, tokenizer, cfg, targets_path, text_field)}
    return write_store(out, mixture, identity, vocab_size=len(tok), overwrite=overwrite)


# ---- the cache: a store prepared on first use -------------------------------------------------------------
CACHE_SUBDIR = "stores"  # under memorization.data.corpus.cache_dir()


def _corpus_state(spec: str) -> Any:
    """What identifies a corpus's bytes without reading its documents: the sha256 of the default corpus or a
    local file, each file's name, size and modification time for a local directory, None for a hub dataset
    (its name and the ``datasets`` cache version it)."""
    from .corpus import corpus_sha256, visible_files

    sha = corpus_sha256(spec)
    if sha is not None:
        return sha
    p = Path(spec).expanduser()
    if p.is_dir():
        return [[str(f.relative_to(p)), f.stat().st_size, f.stat().st_mtime_ns] for f in visible_files(p)]
    return None


def cached_store_path(corpus: str, tokenizer, cfg: MixtureConfig, target_texts: Sequence[str] | None = None,
                      text_field: str = "text") -> Path:
    """Where the cache keeps the store of these inputs: ``<cache_dir>/stores/<key>``, the key a sha256 of the
    store format, the corpus (:func:`corpus_key` and its bytes' state), the text field, the tokenizer's
    :func:`~memorization.data.corpus.tokenizer_sha256`, the targets' fingerprint and the mixture config.  Any
    change to one of them names another store; nothing is ever reused for other inputs."""
    import hashlib

    from .corpus import cache_dir, tokenizer_sha256

    ident = {"version": STORE_VERSION, "corpus": corpus_key(corpus), "corpus_state": _corpus_state(corpus),
             "text_field": text_field, "tokenizer_sha256": tokenizer_sha256(tokenizer),
             "targets": texts_fingerprint(target_texts), "config": config_dict(cfg)}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    return cache_dir() / CACHE_SUBDIR / key


def ensure_cached_store(corpus: str, tokenizer: str, cfg: MixtureConfig, tokenizer_obj,
                        targets: Sequence[str] | None = None, targets_path: str | None = None,
                        text_field: str = "text", num_proc: int | None = None) -> tuple[Path, bool]:
    """The cached store of these inputs (:func:`cached_store_path`), prepared now (:func:`prepare_store`) if
    the cache does not hold a complete one; ``(path, prepared)``.  A directory there without its
    ``store.json`` (a crash mid-write of an older layout) is replaced; when another process finishes the same
    store first, its copy is used.  ``ValueError`` as :func:`prepare_store` raises them."""
    path = cached_store_path(corpus, tokenizer_obj, cfg, targets, text_field)
    if (path / STORE_FILE).exists():
        return path, False
    try:
        prepare_store(corpus, tokenizer, cfg, path, targets=targets, targets_path=targets_path,
                      text_field=text_field, num_proc=num_proc, overwrite=path.exists(), tokenizer_obj=tokenizer_obj)
    except (StoreError, OSError):
        if not (path / STORE_FILE).exists():  # not a race lost to another process preparing the same store
            raise
    return path, True


# ---- reading -----------------------------------------------------------------------------------------------
class StoredArray:
    """A read-only view of one array of a token store, read from its file on demand.

    ``view[a:b]`` and ``view[index]`` (an integer, a 1-D integer tensor or array) return a torch tensor of
    ``dtype`` holding only those rows, read with ``pread`` into a fresh buffer: nothing of the file is mapped
    into this process, so its resident memory holds the rows asked for and no more, whatever the store's size
    and however the kernel maps or reads ahead file pages (the page cache may keep them; it is not this
    process's memory).  ``shape``, ``len()``, ``dtype`` (the returned dtype), ``storage_dtype`` and
    ``token_range`` (the values' range recorded when the store was written) are known without reading the data."""

    def __init__(self, path: Path, dtype: np.dtype, shape: tuple[int, ...], torch_dtype: torch.dtype,
                 value_range: tuple[int, int]):
        self.path, self.storage_dtype, self.shape = Path(path), np.dtype(dtype), tuple(shape)
        self.dtype, self.token_range = torch_dtype, tuple(value_range)
        self.device = torch.device("cpu")
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.storage_dtype.itemsize
        self._fd: int | None = None

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"StoredArray({self.path.name}, shape={self.shape}, {self.storage_dtype} -> {self.dtype})"

    def _read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``[lo, hi)`` in the storage dtype, read from the file (a short read means a truncated store)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        buf = np.empty((hi - lo, *self.shape[1:]), self.storage_dtype)
        try:
            pread_exact(self._fd, memoryview(buf).cast("B"), lo * self._row_bytes, self.path)
        except EOFError as e:
            raise StoreError(f"{e}, before row {hi} of {self.shape[0]}: the store is damaged or incomplete; "
                             "prepare it again") from None
        return buf

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, torch.Tensor):
            index = index.cpu().numpy()
        to = np.dtype(str(self.dtype).removeprefix("torch."))
        if isinstance(index, slice) and index.step in (None, 1):
            lo, hi, _ = index.indices(len(self))
            out = self._read(lo, max(lo, hi)).astype(to, copy=False)
        else:  # scattered rows (a fingerprint's sample): one read each
            rows = np.asarray(index, dtype=np.int64) % len(self)  # (integer indices; negative from the end)
            out = np.empty((*np.shape(rows), *self.shape[1:]), to)
            flat = out.reshape(-1, *self.shape[1:])
            for k, i in enumerate(np.ravel(rows).tolist()):
                flat[k] = self._read(i, i + 1)[0]
        return torch.from_numpy(out)

    def __getstate__(self) -> dict:  # a file descriptor does not travel: the view opens its file where it lands
        return {**self.__dict__, "_fd": None}

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


def rebuild_command(path: str | Path, header: dict) -> str:
    """The ``data/prepare.py`` command that writes the store ``header`` describes again, into ``path`` (the
    directory as it was given now, which may not be where it was prepared), replacing what is there."""
    try:
        cfg = MixtureConfig(**{k: tuple(v) if k == "exposures" else v for k, v in header["config"].items()})
        return prepare_command(path, header["corpus"], header["tokenizer"], cfg, header.get("targets"),
                               header.get("text_field", "text")) + " --overwrite"
    except (KeyError, TypeError, ValueError):  # a header too damaged to say what it was prepared from
        return f"python {PREPARE_SCRIPT} --out {shlex.quote(str(path))} --overwrite ..."


def verify_store(path: str | Path, header: dict | None = None) -> bool:
    """Read every array of the store in ``path`` whole and compare it with the crc32s ``store.json`` recorded
    when it was written (blocks hashed in parallel threads: about a second per GB and hashing thread).
    :class:`StoreError` naming the first damaged file, the byte range and the command that rebuilds the
    store; False (nothing checked) for a store prepared before checksums were recorded, True when intact."""
    path = Path(path)
    header = _read_header(path) if header is None else header
    if header.get("checksum_block_bytes") != CHECKSUM_BLOCK:
        return False
    for name, a in header["arrays"].items():
        f = path / a["file"]
        try:
            crcs = crcs_of_file(f, a["bytes"])
        except (OSError, EOFError) as e:
            raise StoreError(f"token store {path}: {a['file']} cannot be read ({e}): prepare it again: "
                             f"{rebuild_command(path, header)}") from None
        bad = [i for i, (got, want) in enumerate(zip(crcs, a["crc32"])) if f"{got:08x}" != want]
        if bad or len(crcs) != len(a["crc32"]):
            i = bad[0] if bad else min(len(crcs), len(a["crc32"]))
            more = f", nor are those of {len(bad) - 1} more blocks" if len(bad) > 1 else ""
            raise StoreError(f"token store {path}: {a['file']} is damaged (the crc32 of its bytes "
                             f"{i * CHECKSUM_BLOCK}..{min(a['bytes'], (i + 1) * CHECKSUM_BLOCK)} is not the one "
                             f"recorded when it was written{more}): prepare it again: {rebuild_command(path, header)}")
    return True


def _read_header(path: Path) -> dict:
    if not path.is_dir():
        raise StoreError(f"token store {path} does not exist: prepare it with `python {PREPARE_SCRIPT} "
                         f"--out {path} ...` (`python {PREPARE_SCRIPT} --help`)")
    head = path / STORE_FILE
    if not head.is_file():
        raise StoreError(f"token store {path} is unfinished (no {STORE_FILE}: its preparation did not complete): "
                         f"prepare it again with `python {PREPARE_SCRIPT} --out {path} --overwrite ...`")
    try:
        header = json.loads(head.read_text())
    except json.JSONDecodeError as e:
        raise StoreError(f"token store {path}: {STORE_FILE} is not valid JSON ({e}): prepare it again: "
                         f"python {PREPARE_SCRIPT} --out {shlex.quote(str(path))} --overwrite ...") from None
    if not isinstance(header, dict) or header.get("version") != STORE_VERSION:
        version = header.get("version") if isinstance(header, dict) else None
        raise StoreError(f"token store {path} has format version {version!r}, this code reads "
                         f"{STORE_VERSION}: prepare it again with this version: {rebuild_command(path, header)}")
    for name, a in header["arrays"].items():
        f = path / a["file"]
        size = f.stat().st_size if f.is_file() else None
        want = int(np.prod(a["shape"], dtype=np.int64)) * np.dtype(a["dtype"]).itemsize
        if size != a["bytes"] or size != want:
            raise StoreError(f"token store {path}: {a['file']} holds {size} bytes, {STORE_FILE} records "
                             f"{a['bytes']} ({a['shape']} of {a['dtype']}): the store is damaged or incomplete; "
                             f"prepare it again: {rebuild_command(path, header)}")
    return header


def _view(path: Path, header: dict, name: str) -> StoredArray:
    a = header["arrays"][name]
    return StoredArray(path / a["file"], np.dtype(a["dtype"]), tuple(a["shape"]), _TORCH_DTYPES[name],
                       tuple(a["range"]))


def _load(path: Path, header: dict, name: str) -> torch.Tensor:
    """A small array (validation rows), read whole."""
    a = header["arrays"][name]
    arr = np.fromfile(path / a["file"], np.dtype(a["dtype"])).reshape(a["shape"])
    return torch.from_numpy(arr.astype(np.dtype(str(_TORCH_DTYPES[name]).removeprefix("torch."))))


def store_info(path: str | Path) -> dict:
    """A store's ``store.json`` (after checking the store is complete and undamaged; :class:`StoreError` if not)."""
    return _read_header(Path(path))


def check_store(header: dict, path: str | Path, corpus: str | None = None, tokenizer=None,
                config: MixtureConfig | None = None, target_texts: Sequence[str] | None = None,
                text_field: str | None = None, tokenizer_spec: str | None = None,
                targets_path: str | None = None, check_corpus_bytes: bool = True) -> None:
    """Refuse (:class:`StoreMismatch`) a store whose header differs from what a run names; each argument
    left None is not checked, except ``target_texts``, which is checked whenever ``config`` is given (None:
    targets drawn from the corpus).  The message names what differs and the prepare command for this run."""
    from .corpus import corpus_sha256, tokenizer_sha256

    stored_cfg = header["config"]
    fix_cfg = config or MixtureConfig(**{k: tuple(v) if k == "exposures" else v for k, v in stored_cfg.items()})
    fix = prepare_command(path, corpus or header["corpus"], tokenizer_spec or header["tokenizer"], fix_cfg,
                          targets_path if targets_path is not None else header.get("targets"),
                          text_field or header.get("text_field", "text")) + " --overwrite"
    where = f"token store {path}"
    if config is not None:
        steps, B, L = header["num_steps"], header["config"]["batch_size"], header["seq_len"]
        want = config.num_steps
        if want is not None and config.batch_size == B and config.seq_len == L and want > steps:
            raise StoreMismatch(
                f"{where} holds {steps} steps of {B} rows x {L} tokens ({steps * B * L:,} tokens); {want} steps "
                f"need {want * B * L:,} tokens: prepare a store for {want} steps (from a corpus whose background "
                f"fills them): {fix}")
    problems = []
    if corpus is not None and corpus_key(corpus) != header.get("corpus_key"):
        problems.append(f"corpus {header['corpus']!r}, this run names {corpus!r}")
    elif corpus is not None and check_corpus_bytes and header.get("corpus_sha256") is not None:
        now = corpus_sha256(corpus)
        if now is not None and now != header["corpus_sha256"]:
            problems.append(f"corpus {corpus!r} with sha256 {header['corpus_sha256'][:12]}..., the file now has "
                            f"{now[:12]}... (it changed since)")
    if text_field is not None and text_field != header.get("text_field"):
        problems.append(f"text field {header.get('text_field')!r}, this run reads {text_field!r}")
    tok_sha = tokenizer_sha256(tokenizer) if tokenizer is not None else None
    lo, hi = header.get("token_range", (0, -1))
    if tokenizer is not None and hi >= len(tokenizer):  # (the model's vocabulary: checked by the trainer)
        problems.append(f"token ids up to {hi}, beyond this run's tokenizer's {len(tokenizer)} ids")
    if tok_sha is not None and tok_sha != header["tokenizer_sha256"]:
        problems.append(f"tokenizer {header['tokenizer']!r} (sha256 {header['tokenizer_sha256'][:12]}...), this "
                        f"run's tokenizer is another (sha256 {tok_sha[:12]}...)")
    if config is not None:
        if texts_fingerprint(target_texts) != header.get("targets_fingerprint"):
            held = header.get("targets") or ("documents given" if header.get("targets_fingerprint") else None)
            problems.append(f"targets {held or 'drawn from the corpus'}, this run's targets are "
                            f"{'other documents' if target_texts is not None else 'drawn from the corpus'}")
        now = config_dict(config)
        for k in [*now, *(k for k in stored_cfg if k not in now)]:
            was, asks = (c.get(k, _LATER_FIELDS.get(k)) for c in (stored_cfg, now))
            if was != asks:
                problems.append(f"{_FLAGS.get(k, k)} {_shown(was)}, this run asks {_shown(asks)}")
    if problems:
        raise StoreMismatch(f"{where} was prepared with " + "; ".join(problems)
                            + f". Prepare a store for this run: {fix}")


def open_store(path: str | Path, corpus: str | None = None, tokenizer=None, config: MixtureConfig | None = None,
               target_texts: Sequence[str] | None = None, text_field: str | None = None,
               tokenizer_spec: str | None = None, targets_path: str | None = None,
               check_corpus_bytes: bool = True, verify: bool = False) -> Mixture:
    """The :class:`~memorization.data.mixture.Mixture` of the token store in ``path``, its training rows, document
    ids and row context read on demand (:class:`StoredArray`; validation rows, targets and non-members loaded).

    It is a drop-in for ``build_mixture(docs, tokenizer, config, target_texts, meta)``'s: the same rows,
    manifest and ``num_steps``.  Given what the run names, it checks the store was prepared from it
    (:func:`check_store`; ``tokenizer_spec`` and ``targets_path`` only make the suggested prepare command
    exact).  :class:`StoreError` for a missing, unfinished or damaged store, :class:`StoreMismatch` for one of
    other data or settings or too few steps; both say how to prepare the right one.  ``verify`` reads every
    array first and compares it with its recorded crc32s (:func:`verify_store`)."""
    path = Path(path)
    header = _read_header(path)
    check_store(header, path, corpus, tokenizer, config, target_texts, text_field, tokenizer_spec, targets_path,
                check_corpus_bytes)
    if verify:  # (after the cheap checks: a store of other settings is refused without reading it)
        verify_store(path, header)
    manifest = json.loads((path / MANIFEST_FILE).read_text())
    cfg = MixtureConfig(**{k: tuple(v) if k == "exposures" else v for k, v in header["config"].items()})
    base = {"version", "config", "num_rows", "num_steps", "targets", "nonmembers"}
    meta = {k: v for k, v in manifest.items() if k not in base}
    ctx = RowContext(*(_view(path, header, n) for n in ("context_ids", "context_doc_ids", "context_start")))
    return Mixture(input_ids=_view(path, header, "input_ids"), doc_ids=_view(path, header, "doc_ids"),
                   val_ids=_load(path, header, "val_ids"), val_doc_ids=_load(path, header, "val_doc_ids"),
                   targets=manifest["targets"], nonmembers=manifest["nonmembers"], config=cfg, meta=meta,
                   row_context=ctx)
