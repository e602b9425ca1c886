"""Shared helpers for the benchmarks: device selection, synchronised timing, MFU."""
from __future__ import annotations

import time

import torch

H100_BF16_PEAK = 989e12  # dense bf16 FLOP/s of an H100 SXM (REFERENCES.md)


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
