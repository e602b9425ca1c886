"""How sure a memorization rate is, and whether two arms differ on the same documents.

With 32 targets, 31/32 against 0/32 extracted is decisive; 6/32 against 2/32 is not. Two tools
(``scipy.stats``) say which:

* :func:`rate_ci`: the Wilson score interval of a rate ``k/n``. Unlike the normal approximation it
  stays inside [0, 1] and is not zero-width at 0/n or n/n (0/32 gives [0, 0.107] at 95%).
* :func:`mean_ci`: the Student-t interval of a mean (a per-seed or per-canary average).
* :func:`paired_exact_test`: the exact McNemar test of two arms scored on the *same* documents.
  Only discordant documents carry evidence: ``b`` extracted by arm A alone, ``c`` by arm B alone.
  Under H0 (both arms extract a document with the same probability) ``b ~ Binomial(b + c, 1/2)``;
  the p-value is two-sided. Pairing is what makes it sharp: the arms share targets, mixture and seed.
"""
from __future__ import annotations

from collections.abc import Mapping


def rate_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the rate ``k/n`` (``n >= 1``)."""
    from scipy.stats import binomtest

    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"a rate needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def mean_ci(xs: list[float], confidence: float = 0.95) -> list[float] | None:
    """Student-t interval of the mean of ``xs``: ``mean +- t_{n-1} s / sqrt(n)``; None for fewer than 2 values
    (a single value has no spread to estimate)."""
    from scipy.stats import t

    n = len(xs)
    if n < 2:
        return None
    mean = sum(xs) / n
    sd = (sum((x - mean) ** 2 for x in xs) / (n - 1)) ** 0.5
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / n ** 0.5
    return [mean - half, mean + half]


def _outcome(value: object, doc: str, arm: str) -> bool:
    """A document's extracted/not-extracted outcome; a missing one (None, NaN) is refused, never read as
    "not extracted" (which would make it a discordant pair)."""
    if value is None or value != value:
        raise ValueError(f"arm {arm} has no outcome for document {doc!r} ({value!r})")
    return bool(value)


def paired_exact_test(a: Mapping[str, bool], b: Mapping[str, bool]) -> dict:
    """Exact McNemar test of arm A against arm B on the documents both were scored on (by id).

    Returns ``{"n": shared documents, "only_a": A extracted and B did not, "only_b": the reverse,
    "p_value": two-sided exact p (1.0 when no document is discordant)}``.
    """
    from scipy.stats import binomtest

    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("the two arms share no scored document: they cannot be compared pairwise")
    x = {d: _outcome(a[d], d, "A") for d in shared}
    y = {d: _outcome(b[d], d, "B") for d in shared}
    only_a = sum(x[d] and not y[d] for d in shared)
    only_b = sum(y[d] and not x[d] for d in shared)
    p = binomtest(only_a, only_a + only_b, 0.5).pvalue if only_a + only_b else 1.0
    return {"n": len(shared), "only_a": only_a, "only_b": only_b, "p_value": float(p)}
