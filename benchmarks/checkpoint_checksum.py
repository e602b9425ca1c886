"""What the checkpoint checksums cost: save and load with and without them, side by side in one run.

    python benchmarks/checkpoint_checksum.py --size 160m --repeat 3

One process (grid 1,1,1,1), the preset's model built as the trainer builds it, with AdamW state (one
step on zero gradients), on the CPU.  Each ``--repeat`` times (median), alternating the two kinds:

* save: ``axonn.checkpoint.save`` (blocking: every byte written and fsynced), ``checksums=False``
  against ``checksums=True`` (the crc32 of each 64 MiB block computed while the bytes are written);
* load, cold: the files' pages dropped from the page cache first (``posix_fadvise(DONTNEED)``: the
  bytes come from the disk, as on a resume), ``load(checksums=False)`` against ``load()``, which
  first verifies every file (reads it whole, crc32 in ``CHECKSUM_THREADS`` threads) and then loads;
* load, warm: the same with the files in the page cache (the verification then costs only hashing).

Also printed: the rates of the candidate hashes (crc32, the one used; sha256; blake2b) in one thread and
of crc32 over the hash pool, and the time to read the files once from the disk (cold) in one thread.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import axonn.checkpoint as ckpt  # noqa: E402
from axonn.cli import HelpFormatter  # noqa: E402
from memorization.training.models import build_model  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402


def drop_cache(d: Path) -> None:
    """Evict the (clean, fsynced) pages of the files in ``d`` from the page cache: the next read is from disk."""
    for f in d.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(d: Path) -> float:
    """Seconds to read every file of ``d`` once, in 16 MiB pieces."""
    buf = memoryview(bytearray(16 * 2**20))
    t0 = time.perf_counter()
    for f in d.iterdir():
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - t0


def hash_rates(nbytes: int = 512 * 2**20) -> dict[str, float]:
    """GB/s of the candidate hashes in one thread (64 MiB blocks), and of crc32 over the checkpoint's hash pool."""
    data = memoryview(os.urandom(64 * 2**20) * (nbytes // (64 * 2**20)))
    blocks = [data[i:i + ckpt.CHECKSUM_BLOCK] for i in range(0, len(data), ckpt.CHECKSUM_BLOCK)]
    rates = {}
    for name, fn in (("crc32", zlib.crc32), ("sha256", lambda b: hashlib.sha256(b).digest()),
                     ("blake2b", lambda b: hashlib.blake2b(b).digest())):
        t0 = time.perf_counter()
        for b in blocks:
            fn(b)
        rates[name] = len(data) / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    list(ckpt.hash_pool().map(zlib.crc32, blocks))
    rates["pool"] = len(data) / (time.perf_counter() - t0) / 1e9
    return rates


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="160m", help="model-shape preset (axonn/presets.yaml)")
    p.add_argument("--repeat", type=int, default=3, help="measurements of each kind (the median is printed)")
    p.add_argument("--dir", default=None, help="where to write the checkpoints (default: a temporary directory)")
    p.add_argument("--hash-mb", type=int, default=512, help="MiB of random bytes the hash rates are measured on")
    a = p.parse_args(argv)

    rt = Runtime.create()
    model = build_model(a.size, vocab_size=32000, runtime=rt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for q in model.parameters():
        q.grad = torch.zeros_like(q)
    opt.step()  # AdamW's state exists from here on: weights + 2 moments are written
    target = build_model(a.size, vocab_size=32000, seed=1, runtime=rt)
    target_opt = torch.optim.AdamW(target.parameters(), lr=1e-4)
    work = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="ckpt_checksum_"))
    work.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[float]] = {k: [] for k in ("save0", "save1", "cold0", "cold1", "warm0", "warm1", "read")}
    try:
        for i in range(a.repeat):
            for with_sums in (False, True) if i % 2 == 0 else (True, False):
                k = int(with_sums)
                d = work / f"ck{k}"
                shutil.rmtree(d, ignore_errors=True)  # a new checkpoint each time, not a replacement (untimed)
                t0 = time.perf_counter()
                ckpt.save(model, opt, d, {"step": i}, grid=rt.grid, checksums=with_sums)
                runs[f"save{k}"].append(time.perf_counter() - t0)
                drop_cache(d)
                t0 = time.perf_counter()
                ckpt.load(target, target_opt, d, grid=rt.grid, checksums=with_sums)
                runs[f"cold{k}"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ckpt.load(target, target_opt, d, grid=rt.grid, checksums=with_sums)
                runs[f"warm{k}"].append(time.perf_counter() - t0)
            drop_cache(work / "ck1")
            runs["read"].append(read_all(work / "ck1"))
        files = sorted((work / "ck1").iterdir())
        gb = sum(f.stat().st_size for f in files) / 1e9
        shards = [f for f in files if f.name.startswith("rank")]
    finally:
        for k in (0, 1):
            shutil.rmtree(work / f"ck{k}", ignore_errors=True)
        if a.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    assert all(torch.equal(x, y) for x, y in zip(target.parameters(), model.parameters()))
    rates = hash_rates(max(1, a.hash_mb // 64) * 64 * 2**20)
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{a.size}: {sum(q.numel() for q in model.parameters()) / 1e6:.0f}M parameters + AdamW state, "
          f"{gb:.2f} GB in {len(files)} files ({len(shards)} shard file), CPU, {os.cpu_count()} cores, "
          f"median of {a.repeat}")
    print(f"hashes in one thread: crc32 {rates['crc32']:.2f} GB/s, sha256 {rates['sha256']:.2f} GB/s, blake2b "
          f"{rates['blake2b']:.2f} GB/s; crc32 over the hash pool ({ckpt.CHECKSUM_THREADS} threads): "
          f"{rates['pool']:.2f} GB/s")
    print(f"reading the files once from disk (one thread): {med['read']:.2f} s ({gb / med['read']:.2f} GB/s)")
    print(f"\n{'':28}{'without':>10}{'with':>10}{'ratio':>9}")
    for label, key in (("save (s)", "save"), ("load, cold page cache (s)", "cold"),
                       ("load, warm page cache (s)", "warm")):
        off, on = med[f"{key}0"], med[f"{key}1"]
        print(f"{label:28}{off:10.2f}{on:10.2f}{on / off:8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
