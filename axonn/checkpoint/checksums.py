"""Checksums of a checkpoint's files: the crc32 of every ``CHECKSUM_BLOCK``-byte block, computed as a file is
written (:class:`CrcWriter`) and compared when it is read (:func:`compare`), and the errors a damaged
checkpoint raises.

Blocks are hashed in parallel by :func:`hash_pool` (``zlib.crc32`` and ``os.preadv`` release the GIL), so a
writer hashes while it writes (no second read) and a verifier reads a file's blocks concurrently.
"""
from __future__ import annotations

import functools
import json
import math
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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


class CrcWriter:
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


def crcs_of_bytes(data: bytes) -> list[int]:
    """The crc32 of each ``CHECKSUM_BLOCK``-byte block of ``data`` (the last block may be shorter)."""
    mv = memoryview(data)
    return [zlib.crc32(mv[i:i + CHECKSUM_BLOCK]) for i in range(0, len(mv), CHECKSUM_BLOCK)]


def pread_exact(fd: int, buf: memoryview, offset: int, name: str | Path) -> None:
    """Fill ``buf`` (a writable byte view) from byte ``offset`` of the open file ``fd`` (``os.preadv``: no file
    position used, so threads and forked processes may share ``fd``); ``EOFError`` naming ``name`` and the byte
    where the file ends if it ends first."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            raise EOFError(f"{name} ended at byte {offset + done}")
        done += n


def crcs_of_file(f: Path, size: int) -> list[int]:
    """The crc32 of each block of the first ``size`` bytes of ``f``, blocks read and hashed in parallel."""
    fd = os.open(f, os.O_RDONLY)
    try:
        def block(i: int) -> int:
            buf = getattr(_buffers, "buf", None)
            if buf is None:
                buf = _buffers.buf = memoryview(bytearray(_READ_CHUNK))
            crc, off, end = 0, i * CHECKSUM_BLOCK, min(size, (i + 1) * CHECKSUM_BLOCK)
            while off < end:
                chunk = buf[:min(_READ_CHUNK, end - off)]
                pread_exact(fd, chunk, off, f)
                crc = zlib.crc32(chunk, crc)
                off += len(chunk)
            return crc

        return list(hash_pool().map(block, range(math.ceil(size / CHECKSUM_BLOCK))))
    finally:
        os.close(fd)


DAMAGED = "the checkpoint is damaged; load an earlier one (point the root's LATEST at another step_* directory)"


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
    raw = read_json(Path(f))
    if not isinstance(raw, dict) or raw.get("algorithm") != "crc32" or raw.get("block_bytes") != CHECKSUM_BLOCK:
        raise DamagedCheckpoint(f"{f}: not checksums this version reads (crc32 of {CHECKSUM_BLOCK}-byte blocks): "
                                f"{DAMAGED}")
    return raw


def compare(f: Path, want: dict, size: int, crcs: list[int], step: int | None) -> None:
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


def read_checked(f: Path, sums: dict | None) -> bytes:
    """The bytes of ``f``, a (small) file of a checkpoint marked complete, checked against ``sums``
    (:func:`read_checksums`; None: not recorded)."""
    try:
        data = f.read_bytes()
    except FileNotFoundError as e:
        raise MissingFromCheckpoint(f"{f} is missing from a checkpoint marked complete: {DAMAGED}") from e
    if sums is not None and f.name in sums["files"]:
        compare(f, sums["files"][f.name], len(data), crcs_of_bytes(data), sums.get("step"))
    return data


def read_json(f: Path, sums: dict | None = None):
    """The JSON in ``f``, a file of a checkpoint marked complete, checked against ``sums``
    (:func:`read_checksums`; None: not recorded); a damaged one is a clear error."""
    data = read_checked(f, None)
    try:
        parsed = json.loads(data.decode())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedCheckpoint(f"{f} is not valid JSON ({e}): {DAMAGED}") from e
    if sums is not None and f.name in sums["files"]:
        compare(f, sums["files"][f.name], len(data), crcs_of_bytes(data), sums.get("step"))
    return parsed


def check_file(f: Path, want: dict, step: int | None) -> None:
    """Read ``f`` whole (blocks in parallel) and compare it with its record ``want``."""
    try:
        size = f.stat().st_size
        crcs = crcs_of_file(f, size) if size == want["bytes"] else []
    except FileNotFoundError as e:
        raise MissingFromCheckpoint(f"{f} is missing from a checkpoint marked complete: {DAMAGED}") from e
    except (OSError, EOFError) as e:  # an I/O error, or cut short while read: every rank must hear of it
        raise DamagedCheckpoint(f"{f} cannot be read ({e}): {DAMAGED}") from e
    compare(f, want, size, crcs, step)


def checker_of(name: str, world: int) -> int:
    """The rank that reads a shard file whole to verify it: ``rankN.pt``'s is ``N mod world`` (on the grid
    it was written on, the rank that wrote it and loads from it); the other files (small) rank 0's."""
    digits = name.removeprefix("rank").removesuffix(".pt")
    return int(digits) % world if name.startswith("rank") and digits.isdigit() else 0
