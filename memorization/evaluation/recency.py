"""Extraction against recency: the optimizer steps between a target's last exposure and the end of training.

A target of run with ``N`` steps whose exposures were at steps ``s_1 < ... < s_n`` (0-based, the manifest's
``steps``) was last seen ``N - 1 - s_n`` steps before the end (0: in the final step).  With random placement
(:data:`memorization.data.mixture.PLACEMENTS`) a target seen more often tends to be seen later, so exposure count and
recency are confounded; :func:`by_recency` shows extraction per recency bin, so the two can be told apart
(and ``--placement last`` removes the confound by construction).
"""
from __future__ import annotations

import math

from .extraction import summarize, trained


def steps_since_last(target: dict, num_steps: int) -> int | None:
    """Steps from ``target``'s last exposure to the end of a ``num_steps`` run; None when it was never seen."""
    steps = target.get("steps") or []
    return num_steps - 1 - max(steps) if steps else None


def recency_bins(num_steps: int, bins: int = 5) -> list[tuple[int, int]]:
    """Half-open ranges ``[lo, hi)`` of steps since the last exposure covering ``[0, N)``, each twice as wide as
    the one before: edges ``0, N/2^(bins-1), ..., N/4, N/2, N`` (rounded up; empty ranges of a short run left
    out), so the last steps of the run, where forgetting acts fastest, are resolved finely."""
    edges = [0] + [math.ceil(num_steps / 2 ** (bins - 1 - i)) for i in range(bins)]
    return [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi > lo]


def by_recency(documents: list[dict], targets: list[dict], num_steps: int, bins: int = 5) -> list[dict]:
    """Extraction summaries (:func:`memorization.evaluation.extraction.summarize`) of the trained ``documents`` per
    :func:`recency_bins` range of steps since their target's last exposure, each with ``steps`` ``[lo, hi)``
    and the exposure counts it holds; ``documents`` are matched to ``targets`` (manifest records) by ``id``."""
    since = {t["id"]: steps_since_last(t, num_steps) for t in targets}
    docs = [d for d in trained(documents) if since.get(d["id"]) is not None]
    out = []
    for lo, hi in recency_bins(num_steps, bins):
        inside = [d for d in docs if lo <= since[d["id"]] < hi]
        out.append({"steps": [lo, hi], "exposures": sorted({int(d["exposures"]) for d in inside
                                                             if d.get("exposures") is not None}),
                    **summarize(inside)})
    return out
