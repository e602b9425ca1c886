"""Shared helpers for the benchmarks: device selection, synchronised timing, MFU."""
from __future__ import annotations

import time

import torch

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
