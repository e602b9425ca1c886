"""pass@k / build@k (Chen et al. 2021) and speedup_n@k (ParEval, Nichols et al. 2024)."""

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
