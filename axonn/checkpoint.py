"""Sharded, atomic, reshardable checkpoints and HF export.

Layout of a checkpoint directory (on a filesystem every rank can see)::

    path/meta.json          format, grid it was written on, model config, every
                            parameter's HF name and full shape, optimizer param groups
    path/index.json         which shard of which parameter each rank file holds:
                            {"specs": [ShardSpec dict, ...], "files": {file: {name: spec no.}}}
                            (each distinct spec once: 5 MB for a 405b on 4,096 ranks, not 21)
    path/rank00000.pt ...   per writing rank: {name: (local tensor, ShardSpec dict)} for the
                            params (and optimizer state) this rank *writes*
    path/extra.pt           ``extra_state`` (rank 0)
    path/checksums.json     the size and the crc32 of every 64 MiB block of each file above, as written
                            (rank 0 gathers them from the writers; absent in a checkpoint saved before
                            checksums were recorded, or with ``checksums=False``: it loads unverified)
    path/COMPLETE           written last; ``load`` refuses a directory without it

Ownership: a shard is written once.  Of the ranks that hold it, the tensor coordinate that
is 0 on every tensor axis the shard is replicated over owns it (depth for row/col blocks,
depth and row/col for norms), and its data replicas, which hold the same shards, split
the writing (:func:`writers`, balanced by size): each rank writes about 1/G_data of
what its tensor coordinate owns, so the save runs at the bandwidth of every node, not
of data slice 0's alone.  Atomicity: everything is written into ``.<name>.tmp``,
fsynced, then renamed to ``path`` by rank 0 (an existing checkpoint at ``path`` is
replaced only after the new one is complete).
``save(..., background=True)`` copies this rank's shards to host memory (a snapshot) and
returns a :class:`PendingSave` whose files a thread writes while training goes on; its
collective ``finish()`` waits, checks that every rank's writes succeeded and only then
writes ``COMPLETE`` and renames, so a failed or interrupted background save leaves the
previous checkpoint in place, exactly as a blocking one does.

Loading looks up in ``index.json`` which stored pieces it needs and opens only their
files.  On the grid the checkpoint was written on (a resumed or requeued job) that
is, for each shard, the identical piece in its writer's file, copied; nothing is
reassembled.  On another grid each shard (the *current* grid's spec) is cut from the
rows of the full tensor it needs, taken from the stored pieces that overlap it
(:func:`axonn.sharding.overlaps`), so a checkpoint written on one grid loads onto any
other; the files are memory-mapped, so each rank reads about its own share of the
bytes and opens only the files that hold it.
Optimizer state tensors with the parameter's shape follow the parameter's
spec; others (e.g. Adam's ``step``) are stored whole.

Checksums: a writer computes the crc32 of each ``CHECKSUM_BLOCK`` (64 MiB) block of a file as its bytes
pass to the file (in ``CHECKSUM_THREADS`` threads, while the caller's thread writes them: no second read,
and a save takes about as long as without, see ``benchmarks/checkpoint_checksum.py``).  :func:`verify`,
which :func:`load` and :func:`to_hf` run before anything is loaded, reads every file of the checkpoint
whole and compares: a file whose bytes differ from those saved (a flipped bit, a truncated copy) is
refused on every rank with a :class:`DamagedCheckpoint` naming the step, the file and the block whose
crc32 differs.  The loader reads only the pieces a rank needs (memory-mapped), but a rank verifies whole
files: the shard files are shared out, file ``rankN.pt`` to rank ``N mod world``, so each file is read
once for its check, by the rank that (on the grid it was written on) loads from it, and every rank reads
about its share of the checkpoint (total / world), blocks in parallel.  On a resume the verification is
then a read of each rank's share, hashed at several GB/s; the load that follows reads the same bytes,
from the page cache where the node's memory holds them (else from the filesystem again: up to twice the
bytes of a load without checksums).  The small files (meta.json, index.json, extra.pt) are checked by
every rank that reads them, from the bytes it read.  Anything outside the files (a flipped bit in host
memory, on the network) is not covered.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import io
import json
import math
import os
import shutil
import sys
import threading
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from .communication import any_rank
from .grid import Grid, get_grid, ranks_per_node
from .parallelize import spec_of
from .sharding import ShardSpec, gather_full, overlaps, rows_from_pieces, shard_from_rows

FORMAT = "axonn-sharded-v2"  # v2: index.json, data replicas split the writing
READABLE = (FORMAT, "axonn-sharded-v1")  # v1: one file per rank, no index (each file's table is read)
_CONFIG_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "head_dim")


def _grid(model: nn.Module, grid: Grid | None) -> Grid:
    return grid or getattr(model, "_axonn_grid", None) or get_grid()


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


TENSOR_AXES = ("depth", "row", "col")


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
            index.setdefault(_file_of(d * t_size + t), {})[n] = owned[n]
    return dict(sorted(index.items()))


def _fsync_write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_path(path: Path) -> None:  # a directory or a file, through a read-only descriptor
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _model_meta(model: nn.Module) -> dict:
    cfg = getattr(model, "config", None)
    c = {k: getattr(cfg, k, None) for k in _CONFIG_KEYS} if cfg is not None else {}
    meta = {"config": c, "params": {n: list(spec_of(p).full_shape) for n, p in model.named_parameters()}}
    if hasattr(cfg, "to_json_string"):  # the whole HF config: to_hf writes a loadable model without the model
        meta["hf_config"] = json.loads(cfg.to_json_string(use_diff=False))
    return meta


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
    grid = _grid(model, grid)
    path = Path(path)
    tmp = _staging_dir(path, grid.rank)
    _barrier()
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
        files.append((_file_of(grid.rank), lambda f: torch.save(shards, f)))
    if grid.rank == 0:
        compact = json.dumps(_encode_index(index), separators=(",", ":")).encode()
        meta = {"format": FORMAT, "grid": grid.sizes, "world_size": grid.world_size, **_model_meta(model)}
        if checksums:  # a checkpoint that says so and lacks checksums.json is damaged, not an old one
            meta["checksums"] = {"file": CHECKSUMS, "algorithm": "crc32", "block_bytes": CHECKSUM_BLOCK}
        if optimizer is not None:
            meta["optimizer"] = {"class": type(optimizer).__name__,
                                 "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                                  for g in optimizer.state_dict()["param_groups"]],
                                 "names": _names_of_optimizer(model, optimizer)}
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
                _fsync_write(self.tmp / name, write)
        except BaseException as e:  # noqa: BLE001 - reported by finish() on every rank
            self._error = e
        self._files = []  # drop the host copies as soon as they are on disk

    def _write_summed(self, name: str, write: Callable, f) -> None:
        w = _CrcWriter(f)
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
        _barrier()
        if self.grid.rank == 0:
            if sums is not None:
                record = {"algorithm": "crc32", "block_bytes": CHECKSUM_BLOCK, "step": self.step,
                          "files": dict(sorted(sums.items()))}
                data = json.dumps(record, separators=(",", ":")).encode()
                _fsync_write(self.tmp / CHECKSUMS, lambda f: f.write(data))
            _fsync_write(self.tmp / "COMPLETE", lambda f: f.write(b"ok\n"))
            _publish(self.tmp, self.path)
        _barrier()


def _gather_sums(mine: dict[str, dict], grid: Grid) -> dict[str, dict]:
    """Every rank's ``{file: checksum record}`` merged, on rank 0 (``{}`` elsewhere); one small gather."""
    if grid.world_size == 1:
        return dict(mine)
    parts = [None] * grid.world_size if grid.rank == 0 else None
    dist.gather_object(mine, parts, dst=0)
    return {f: r for part in parts or () for f, r in part.items()}


CHECKSUMS = "checksums.json"
CHECKSUM_BLOCK = 64 * 2**20  # bytes per crc32: a damaged file is reported by block, and blocks are hashed in parallel
CHECKSUM_THREADS = 4  # per rank, hashing while a file is written and reading + hashing blocks to verify one
_READ_CHUNK = 16 * 2**20  # a verifying thread reads a block in pieces of this size (its buffer)
_INLINE_BYTES = 2**20  # a write shorter than this is hashed in the writing thread (no hand-off)
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process it was started in, the pool)
_pool_lock = threading.Lock()
_buffers = threading.local()


def hash_pool() -> ThreadPoolExecutor:
    """The threads that compute crc32s (``zlib.crc32`` and ``os.preadv`` release the GIL), started once per
    process (a forked child does not inherit the parent's threads: it starts its own)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(CHECKSUM_THREADS, thread_name_prefix="axonn-crc32"))
        return _pool[1]


class _CrcWriter:
    """A binary file's ``write`` that computes the crc32 of each ``CHECKSUM_BLOCK``-byte block of what passes.

    ``torch.save`` writes sequentially (its zip writer refuses to seek), so the bytes that pass are the
    file's.  The crc32s of a large write are computed by the hash pool while this thread writes the same
    bytes (each block's from its start, the block it continues from the running value), so the hashing
    costs a save about nothing where the write is slower than the hashing.
    """

    def __init__(self, f):
        self.f, self.size, self._crc, self.blocks = f, 0, 0, []

    def write(self, data) -> int:
        mv = memoryview(data).cast("B")
        segments = []  # (lo, hi) of mv, each within one block; the first continues the current block
        lo = 0
        while lo < len(mv):
            hi = min(len(mv), lo + CHECKSUM_BLOCK - (self.size + lo) % CHECKSUM_BLOCK)
            segments.append((lo, hi))
            lo = hi
        starts = [self._crc] + [0] * (len(segments) - 1)
        if len(mv) < _INLINE_BYTES:
            crcs = [zlib.crc32(mv[a:b], c) for (a, b), c in zip(segments, starts)]
            self.f.write(mv)
        else:
            futures = [hash_pool().submit(zlib.crc32, mv[a:b], c) for (a, b), c in zip(segments, starts)]
            try:
                self.f.write(mv)
            finally:  # (also when the write fails: no thread may still read the caller's buffer)
                crcs = [f.result() for f in futures]
        for (_, hi), crc in zip(segments, crcs):
            if (self.size + hi) % CHECKSUM_BLOCK == 0:
                self.blocks.append(crc)
                crc = 0
            self._crc = crc
        self.size += len(mv)
        return len(mv)

    def flush(self) -> None:
        self.f.flush()

    def record(self) -> dict:
        """``{"bytes": size, "crc32": [8 hex digits per block]}`` of what was written."""
        blocks = self.blocks + ([self._crc] if self.size % CHECKSUM_BLOCK else [])
        return {"bytes": self.size, "crc32": [f"{c:08x}" for c in blocks]}


def _crcs_of_bytes(data: bytes) -> list[int]:
    mv = memoryview(data)
    return [zlib.crc32(mv[i:i + CHECKSUM_BLOCK]) for i in range(0, len(mv), CHECKSUM_BLOCK)]


def _crcs_of_file(f: Path, size: int) -> list[int]:
    """The crc32 of each block of the first ``size`` bytes of ``f``, blocks read and hashed in parallel."""
    fd = os.open(f, os.O_RDONLY)
    try:
        def block(i: int) -> int:
            buf = getattr(_buffers, "buf", None)
            if buf is None:
                buf = _buffers.buf = memoryview(bytearray(_READ_CHUNK))
            crc, off, end = 0, i * CHECKSUM_BLOCK, min(size, (i + 1) * CHECKSUM_BLOCK)
            while off < end:
                n = os.preadv(fd, [buf[:min(_READ_CHUNK, end - off)]], off)
                if n == 0:
                    raise EOFError(f"{f} ended at byte {off}")
                crc = zlib.crc32(buf[:n], crc)
                off += n
            return crc

        return list(hash_pool().map(block, range(math.ceil(size / CHECKSUM_BLOCK))))
    finally:
        os.close(fd)


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
    optimizer state (the save used to copy all of that first).  A
    view into a larger storage is cloned, since ``torch.save`` would write the whole storage.
    """
    t = t.detach()
    whole = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def _file_of(rank: int) -> str:
    return f"rank{rank:05d}.pt"


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


def _encode_index(index: dict[str, dict[str, ShardSpec]]) -> dict:
    """``index.json``'s form: every distinct spec once, each file's entries point at it."""
    number: dict[ShardSpec, int] = {}
    files = {f: {n: number.setdefault(s, len(number)) for n, s in part.items()} for f, part in index.items()}
    return {"specs": [s.to_dict() for s in number], "files": files}


def read_index(path: str | os.PathLike) -> dict[str, dict[str, ShardSpec]]:
    """A checkpoint's ``{file: {name: spec}}`` (equal specs are one object)."""
    path = Path(path)
    sums = read_checksums(path)
    if (path / "index.json").exists() or (sums is not None and "index.json" in sums["files"]):
        raw = _read_json(path / "index.json", sums)
        specs = [ShardSpec.from_dict(d) for d in raw["specs"]]
        return {f: {n: specs[i] for n, i in part.items()} for f, part in raw["files"].items()}
    # format v1, before index.json (one file per rank): read each file's own table instead
    seen: dict[ShardSpec, ShardSpec] = {}

    def table(f: Path) -> dict[str, ShardSpec]:
        part = _load_shard_file(f)["params"]
        return {n: seen.setdefault(s := ShardSpec.from_dict(d), s) for n, (_, d) in part.items()}

    return {f.name: table(f) for f in sorted(path.glob("rank*.pt"))}


def _staging_dir(path: Path, rank: int) -> Path:
    """``.<name>.tmp`` beside ``path``, emptied and created by rank 0 (the others only learn its name)."""
    tmp = path.parent / f".{path.name}.tmp"
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    return tmp


def _publish(tmp: Path, path: Path) -> None:
    """Make the finished staging directory ``tmp`` appear as ``path`` (rank 0), then delete what
    was there before (in the background).

    An existing ``path`` is swapped with ``tmp`` in one step (:func:`_exchange`), so ``path`` names
    a complete directory at every instant.  Where the filesystem cannot swap, the old one is moved
    aside to ``.trash-<name>-*`` and ``tmp`` renamed in: a crash between those two renames leaves
    ``path`` missing, and :func:`latest` then names the moved-aside directory to rename back.
    """
    _fsync_path(tmp)
    if not path.exists():
        old = None
        os.rename(tmp, path)
    elif _exchange(tmp, path):
        old = tmp  # the staging name now holds the previous directory
    else:
        old = _move_aside(path)
        os.rename(tmp, path)
    _fsync_path(path.parent)
    if old is not None:
        discard(old)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``, ext4/xfs/btrfs/tmpfs).
    False where the C library or the filesystem has no such call (other systems, some parallel
    filesystems): the caller falls back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, f"swapping {a} and {b}: {os.strerror(err)}")


TRASH_PREFIX = ".trash-"


def _move_aside(path: Path) -> Path:
    """Rename ``path`` to a hidden ``.trash-*`` sibling (no ``step_*`` glob sees it); returns the new path."""
    trash = path.parent / f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    return trash


def discard(path: Path) -> threading.Thread:
    """Delete the directory ``path`` without waiting for it: rename it to a hidden ``.trash-*``
    sibling (one metadata operation), then remove that in a daemon thread, together with any
    ``.trash-*`` left there by a process that exited before its deletion finished.

    Removing a job-scale checkpoint (a 405b one is ~5 TB in thousands of files) can take minutes
    on a parallel filesystem; rank 0 doing it while the other ranks wait in a barrier would run
    past the collectives' timeout.  Returns the thread (tests join it).
    """
    path = Path(path)
    if not path.name.startswith(TRASH_PREFIX):
        _move_aside(path)

    def remove() -> None:
        for p in sorted(path.parent.glob(TRASH_PREFIX + "*")):
            shutil.rmtree(p, ignore_errors=True)

    t = threading.Thread(target=remove, name=f"discard {path.name}", daemon=True)
    t.start()
    return t


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
         grid: Grid | None = None, checksums: bool = True) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save` (on any grid) into ``model``/``optimizer``.

    Returns the saved ``extra_state``.  Raises ``FileNotFoundError`` for an
    incomplete checkpoint, ``ValueError`` for one from a different model or optimizer and
    :class:`DamagedCheckpoint` (on every rank) for one whose files are not the bytes saved
    (:func:`verify`), before anything is loaded.  ``checksums=False`` skips :func:`verify` (for a
    checkpoint the caller has just verified; the small files are checked as they are read anyway).
    """
    grid = _grid(model, grid)
    path = Path(path)
    meta = read_meta(path)
    _check_compatible(meta, model)
    groups = _check_optimizer(model, optimizer, meta) if optimizer is not None else None
    if checksums:
        verify(path, grid)
    params = dict(model.named_parameters())
    index = read_index(path)
    pieces, opieces = _open_pieces(path, index, pieces_to_read(pieces_by_name(index),
                                                                {n: spec_of(p) for n, p in params.items()}))
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(_local_from_pieces(pieces[n], spec_of(p)).view_as(p))
    if optimizer is not None:
        _load_optimizer(model, optimizer, meta, opieces, groups)
    _barrier()
    return _load_extra(path)


def read_extra(path: str | os.PathLike) -> dict[str, Any]:
    """The ``extra_state`` a complete checkpoint was saved with, without loading anything else."""
    read_meta(path)  # complete, and in a format this version reads
    return _load_extra(path)


def _load_extra(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    data = _read_checked(path / "extra.pt", read_checksums(path))  # checked before it is unpickled
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


class DamagedCheckpoint(ValueError, RuntimeError):
    """A file of a checkpoint marked complete is missing, unreadable, or not the bytes that were saved.

    A ``ValueError`` and a ``RuntimeError``, as the damaged-JSON and unreadable-shard errors it
    replaces were (callers that caught those still do); a resume catches this class to fall back to
    an older checkpoint.
    """


class MissingFromCheckpoint(DamagedCheckpoint, FileNotFoundError):
    """A file of a checkpoint marked complete is missing."""


def read_checksums(path: str | os.PathLike) -> dict | None:
    """The ``{file: {"bytes": n, "crc32": [hex per block]}}`` recorded when the checkpoint was saved, or
    None for one saved without (before checksums were recorded, or with ``checksums=False``)."""
    f = Path(path) / CHECKSUMS
    try:
        st = f.stat()
    except FileNotFoundError:
        return None
    return _parsed_checksums(str(f), st.st_ino, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _parsed_checksums(f: str, ino: int, mtime_ns: int, size: int) -> dict:
    """checksums.json, parsed once per version of the file (each reader of a small file consults it)."""
    raw = _read_json(Path(f))
    if not isinstance(raw, dict) or raw.get("algorithm") != "crc32" or raw.get("block_bytes") != CHECKSUM_BLOCK:
        raise DamagedCheckpoint(f"{f}: not checksums this version reads (crc32 of {CHECKSUM_BLOCK}-byte blocks): "
                                f"{DAMAGED}")
    return raw


def _compare(f: Path, want: dict, size: int, crcs: list[int], step: int | None) -> None:
    """Raise :class:`DamagedCheckpoint` if ``f`` (``size`` bytes, block crc32s ``crcs``) is not as recorded."""
    where = f"checkpoint of step {step}: " if step is not None else ""
    if size != want["bytes"]:
        raise DamagedCheckpoint(f"{where}{f} is {size} bytes, {want['bytes']} when it was saved: {DAMAGED}")
    bad = [i for i, (got, w) in enumerate(zip(crcs, want["crc32"])) if f"{got:08x}" != w]
    if bad:
        i, n = bad[0], len(want["crc32"])
        more = f" (and {len(bad) - 1} more of its blocks)" if len(bad) > 1 else ""
        raise DamagedCheckpoint(
            f"{where}{f}: the crc32 of its bytes {i * CHECKSUM_BLOCK}..{min(size, (i + 1) * CHECKSUM_BLOCK)} "
            f"(block {i + 1} of {n}) is {crcs[i]:08x}, {want['crc32'][i]} when it was saved{more}: {DAMAGED}")


def _read_checked(f: Path, sums: dict | None) -> bytes:
    """The bytes of ``f``, a (small) file of a checkpoint marked complete, checked against ``sums``
    (:func:`read_checksums`; None: not recorded)."""
    try:
        data = f.read_bytes()
    except FileNotFoundError as e:
        raise MissingFromCheckpoint(f"{f} is missing from a checkpoint marked complete: {DAMAGED}") from e
    if sums is not None and f.name in sums["files"]:
        _compare(f, sums["files"][f.name], len(data), _crcs_of_bytes(data), sums.get("step"))
    return data


def _check_file(f: Path, want: dict, step: int | None) -> None:
    """Read ``f`` whole (blocks in parallel) and compare it with its record ``want``."""
    try:
        size = f.stat().st_size
        crcs = _crcs_of_file(f, size) if size == want["bytes"] else []
    except FileNotFoundError as e:
        raise MissingFromCheckpoint(f"{f} is missing from a checkpoint marked complete: {DAMAGED}") from e
    except (OSError, EOFError) as e:  # an I/O error, or cut short while read: every rank must hear of it
        raise DamagedCheckpoint(f"{f} cannot be read ({e}): {DAMAGED}") from e
    _compare(f, want, size, crcs, step)


def _checker_of(name: str, world: int) -> int:
    """The rank that reads a shard file whole to verify it: ``rankN.pt``'s is ``N mod world`` (on the grid
    it was written on, the rank that wrote it and loads from it); the other files (small) rank 0's."""
    digits = name.removeprefix("rank").removesuffix(".pt")
    return int(digits) % world if name.startswith("rank") and digits.isdigit() else 0


def verify(path: str | os.PathLike, grid: Grid | None = None) -> bool:
    """Check a complete checkpoint's files against the checksums recorded when it was saved (collective).

    Every rank reads and checks the metadata (meta.json, index.json, checksums.json) as a load would;
    the shard files are shared out (:func:`_checker_of`): each is read whole, once, by one rank, its
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
                if name not in ("meta.json", "index.json") and _checker_of(name, world) == rank:
                    _check_file(path / name, want, step)
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


def latest(root: str | os.PathLike) -> Path | None:
    """The checkpoint a checkpoint root's ``LATEST`` file names (a trainer writes it after each
    complete save), or None when the root has none yet."""
    f = Path(root) / "LATEST"
    if not f.exists():
        return None
    name = f.read_text().strip()
    path = Path(root) / name
    if not name or not path.is_dir():
        aside = [p for p in Path(root).glob(f"{TRASH_PREFIX}{name}-*") if (p / "COMPLETE").exists()] if name else []
        if aside:  # a replacement that stopped between its two renames (_publish without _exchange)
            raise FileNotFoundError(f"{f} names {name!r}, which was being replaced when the run stopped: its "
                                    f"previous version is {aside[-1]}; rename that back to {path} and resume")
        raise FileNotFoundError(f"{f} names {name!r}, which is not a directory of {root}: write the name of an "
                                f"existing step_* checkpoint into it, or delete it to start afresh")
    return path


def read_meta(path: str | os.PathLike) -> dict:
    """``meta.json`` of a complete checkpoint in a format this version reads (else a clear error)."""
    path = Path(path)
    if not (path / "COMPLETE").exists():
        raise FileNotFoundError(f"{path} is not a complete axonn checkpoint (no COMPLETE marker)")
    sums = read_checksums(path)
    meta = _read_json(path / "meta.json", sums)
    if not isinstance(meta, dict) or meta.get("format") not in READABLE:
        raise ValueError(f"{path}: unknown checkpoint format "
                         f"{meta.get('format') if isinstance(meta, dict) else meta!r}; this version reads {READABLE}")
    if sums is None and meta.get("checksums"):
        raise MissingFromCheckpoint(f"{path / CHECKSUMS} is missing from a checkpoint saved with checksums: {DAMAGED}")
    return meta


DAMAGED = "the checkpoint is damaged; load an earlier one (point the root's LATEST at another step_* directory)"


def _read_json(f: Path, sums: dict | None = None):
    """The JSON in ``f``, a file of a checkpoint marked complete, checked against ``sums``
    (:func:`read_checksums`; None: not recorded); a damaged one is a clear error."""
    data = _read_checked(f, None)
    try:
        parsed = json.loads(data.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedCheckpoint(f"{f} is not valid JSON ({e}): {DAMAGED}") from e
    if sums is not None and f.name in sums["files"]:
        _compare(f, sums["files"][f.name], len(data), _crcs_of_bytes(data), sums.get("step"))
    return parsed


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


def _open_pieces(path: Path, index: dict[str, dict[str, ShardSpec]], wanted: dict[str, set[str]]):
    """The stored pieces ``wanted`` names (``{file: names}``), memory-mapped, so a piece's bytes are
    read only when it is used: ``{name: [(tensor, spec)]}`` for the parameters and
    ``{name: {key: [(value, spec or None)]}}`` for their optimizer state (None: stored whole)."""
    pieces: dict[str, list] = {}
    opieces: dict[str, dict[str, list]] = {}
    for f, names in wanted.items():
        d = _load_shard_file(path / f)
        for n in names:
            spec = index[f][n]
            pieces.setdefault(n, []).append((d["params"][n][0], spec))
            for k, (v, s) in d["optim"].get(n, {}).items():
                opieces.setdefault(n, {}).setdefault(k, []).append((v, spec if s else None))
    return pieces, opieces


def _load_shard_file(f: Path) -> dict:
    """A rank file of a checkpoint, memory-mapped; a truncated or damaged one is an error naming it."""
    try:
        return torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise
    except (RuntimeError, EOFError, ValueError) as e:  # torch's zip reader / unpickler on a damaged file
        raise DamagedCheckpoint(f"{f} cannot be read ({' '.join(str(e)[:200].split())}): {DAMAGED}") from e


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
    groups = _names_of_optimizer(model, optimizer)
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
        # transformers >= 4.56 calls it ``dtype`` (``torch_dtype`` became a deprecated property); before, ``torch_dtype``
        name = "dtype" if isinstance(getattr(type(config), "torch_dtype", None), property) else "torch_dtype"
        setattr(config, name, max(written, key=lambda t: torch.finfo(t).bits))
    return config


def _write_hf_dir(d: Path, rank: int, entries: list[tuple[str, int]], full_of: Callable[[str], torch.Tensor],
                  config, savers: list, dtype: torch.dtype | None, max_shard_bytes: int) -> None:
    """Write a HF model directory from ``full_of(name)`` (the full tensor; every rank calls it for every
    name, in order, so it may be a collective), rank 0 holding one file's tensors at a time.

    ``entries`` are (state-dict name, bytes as written); ``savers`` more objects with
    ``save_pretrained`` (generation config, tokenizer).  One file is ``model.safetensors``; more
    are ``model-0000i-of-0000n.safetensors`` with HF's ``model.safetensors.index.json``.  The
    directory appears atomically (the callers refuse a target that is not a model directory first).
    ``config.json``'s ``dtype`` is that of the tensors written (:func:`_config_with_dtype`).
    """
    from safetensors.torch import save_file

    tmp = _staging_dir(d, rank)
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
                tensors[name] = full.contiguous()
                weight_map[name] = fname
                total += full.numel() * full.element_size()
                if full.is_floating_point():
                    written.add(full.dtype)
            del full
        if rank == 0:
            save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
            _fsync_path(tmp / fname)
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
    _publish(tmp, d)


def export_hf(model: nn.Module, directory: str | os.PathLike, tokenizer=None, grid: Grid | None = None,
              max_shard_bytes: int = HF_SHARD_BYTES, dtype: torch.dtype | None = None) -> None:
    """Write a HF directory that ``from_pretrained`` loads: config, safetensors, tokenizer (collective).

    Streams: each tensor is gathered in turn (:func:`~axonn.sharding.gather_full`), moved to the
    host of rank 0 and written with the rest of its file; rank 0 holds one file's tensors at a time
    (at most ``max_shard_bytes``, HF's 5 GiB by default), no rank ever holds the full model.  One
    file is ``model.safetensors``; more are ``model-0000i-of-0000n.safetensors`` with HF's
    ``model.safetensors.index.json``.  ``dtype`` (e.g. ``torch.bfloat16``) converts floating-point
    tensors on the way.  The directory appears atomically (written beside it, then renamed over a
    previous export; a non-empty directory that is not a model directory is refused).
    """
    d = _check_export_target(Path(directory))
    grid = _grid(model, grid)
    params = dict(model.named_parameters())
    state = model.state_dict()
    entries = [(n, math.prod(spec_of(params[n]).full_shape if n in params else t.shape) * (dtype or t.dtype).itemsize)
               for n, t in state.items()]

    def full_of(name: str) -> torch.Tensor:
        t = state[name]
        return gather_full(t, spec_of(params[name]), grid) if name in params else t.detach()

    _write_hf_dir(d, grid.rank, entries, full_of, model.config,
                  [getattr(model, "generation_config", None), tokenizer], dtype, max_shard_bytes)
    _barrier()


def to_hf(checkpoint: str | os.PathLike, directory: str | os.PathLike, tokenizer=None, config=None,
          dtype: torch.dtype | None = None, max_shard_bytes: int = HF_SHARD_BYTES) -> None:
    """Turn a sharded checkpoint into a HF directory offline: one process, no grid, no GPU.

    For a job that stopped after its last checkpoint but before its export, or to get an HF model of
    any step.  Each full tensor is assembled from its stored pieces (memory-mapped; the pieces that
    :func:`read_index` names, :func:`~axonn.sharding.rows_from_pieces` over all rows) and written
    before the next is read, so the process holds one tensor plus one output file's worth (at most
    ``max_shard_bytes``).  ``config`` (a ``PretrainedConfig``) is needed only for a checkpoint
    written before ``meta.json`` carried the model's config.
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
    missing = sorted(set(shapes).difference(*index.values()))
    if missing:
        raise ValueError(f"{path}: the checkpoint stores no shard of {missing[:3]}")
    pieces, _ = _open_pieces(path, index, {f: set(part) for f, part in index.items()})  # every piece, mmapped
    entries = [(n, math.prod(shape) * (dtype or pieces[n][0][0].dtype).itemsize) for n, shape in shapes.items()]

    def full_of(name: str) -> torch.Tensor:
        shape = shapes[name]
        return rows_from_pieces(pieces[name], 0, shape[0]).view(shape)

    _write_hf_dir(d, 0, entries, full_of, config,
                  [GenerationConfig.from_model_config(config), tokenizer], dtype, max_shard_bytes)


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
