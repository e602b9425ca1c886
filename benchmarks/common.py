"""Shared helpers for the benchmarks: device selection, synchronised timing, MFU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

H100_BF16_PEAK = 989e12  # dense bf16 FLOP/s of an H100 SXM (NVIDIA H100 Tensor Core GPU datasheet)


def device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn, n: int, warmup: int, dev: torch.device) -> float:
    """Seconds per call of ``fn`` over ``n`` calls after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    sync(dev)
    return (time.perf_counter() - t0) / n


def flops_per_token(shape, seq: int) -> float:
    """6 N (N = parameters doing matmuls: all but the input embedding) + 12 L h s for attention."""
    n = shape.num_params() - shape.vocab * shape.hidden
    return 6 * n + 12 * shape.layers * shape.hidden * seq


def stream_context(rows: torch.Tensor, width: int = 64):
    """The Goldfish row context of ``rows`` read as one continuous document (each row continues the
    previous one), as the mixture gives the trainer: so a benchmark's Goldfish step does the
    trainer's real work (rows hashed with the stream tokens before them)."""
    from memorization.training.goldfish import NO_DOC, RowContext

    ids = torch.zeros(len(rows), width, dtype=rows.dtype)
    ids[1:] = rows[:-1, -width:]
    docs = torch.zeros(len(rows), width, dtype=torch.int32)
    docs[0] = NO_DOC
    return RowContext(ids, docs, torch.zeros(len(rows), dtype=torch.long))


def torchrun_result(script: str, ranks: int, args: list[str], threads: int = 1) -> dict:
    """Run ``script`` on ``ranks`` local gloo ranks under ``torchrun`` (``threads`` torch threads each) and return the
    JSON its rank 0 printed on a line starting ``RESULT ``; exit with the tail of its stderr if it failed or printed
    none (the grid benchmarks' workers: ``extract_grid.py``, ``train_grid.py``)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", script, *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        sys.exit(f"{Path(script).name} {' '.join(args)} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])
