"""pass@k / build@k (Chen et al. 2021); speedup_n@k, speedup_max@k, efficiency_n@k and efficiency_max@k
(ParEval, Nichols et al. 2024), all with the unbiased estimators over N samples."""

from __future__ import annotations

from math import comb
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimator of P(at least one of k samples is correct) = 1 - C(n-c,k)/C(n,k).

    Uses the numerically stable product form of Chen et al. (2021).
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n} c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def speedup_at_k(speedups: Sequence[float], k: int) -> float:
    """Expected max speedup over k of the N samples drawn without replacement.

    ``speedups`` has one entry per sample, 0 for samples that did not pass.
    With s sorted ascending, E[max] = sum_{j>=k} C(j-1, k-1) / C(N, k) * s_j
    (ParEval's speedup_n@k for a single problem).
    """
    s = np.sort(np.asarray(speedups, dtype=float))
    n = len(s)
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= N, got N={n} k={k}")
    weights = np.array([comb(j - 1, k - 1) for j in range(1, n + 1)], dtype=float) / comb(n, k)
    return float(weights @ s)


def mean_or_none(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def efficiency_at_k(speedups: Sequence[float], workers: int, k: int) -> float:
    """ParEval's efficiency_n@k for one problem: E[max over k samples of speedup_n / n] (failed samples 0)."""
    return speedup_at_k([s / workers for s in speedups], k)


def best_over_workers(per_sample: Sequence[dict[int, float]], efficiency: bool = False) -> list[float]:
    """Each sample's best speedup over its worker counts (``efficiency``: best speedup_n / n), 0 for a sample with
    none (it did not pass): the per-sample values of ParEval's speedup_max@k and efficiency_max@k."""
    return [max((s / n if efficiency else s for n, s in d.items()), default=0.0) for d in per_sample]
