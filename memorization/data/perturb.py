"""Near-duplicate exposure: targets seen in training only as perturbed copies, a different perturbation per copy.

A copy of a target ``x`` (its first ``n`` tokens as the row holds them) is perturbed at a fraction ``q``:

* ``substitute``: ``round(q n)`` positions drawn without replacement among ``1..n-1`` (the first token is kept),
  each replaced by a token drawn uniformly from the vocabulary other than the original;
* ``shuffle``: the copy is cut into spans of :data:`SPAN` tokens from position 1, ``round(q n / SPAN)`` of them
  drawn without replacement, and each drawn span's tokens are permuted at random (a local reordering: the
  same tokens, another order).

Each copy is perturbed by a generator seeded by ``(seed, row)`` alone, so every arm trains on the same copies and
two copies of a target differ.  Extraction and MIA score the original target (the manifest's ``token_ids``), which
training never saw verbatim.  :class:`PerturbedRows` applies the perturbations as rows are read.
"""
from __future__ import annotations

import random

import torch

from .row_overlay import read_rows

KINDS = ("substitute", "shuffle")
#: tokens per shuffled span
SPAN = 4


def perturb(ids: list[int], fraction: float, kind: str, vocab: int, rng: random.Random) -> list[int]:
    """``ids`` perturbed at ``fraction`` by ``kind`` (module docstring); the first token never changes."""
    if kind not in KINDS:
        raise ValueError(f"unknown perturbation {kind!r}: choose one of {KINDS}")
    out, n = list(ids), len(ids)
    if kind == "substitute":
        for i in rng.sample(range(1, n), min(n - 1, round(fraction * n))) if n > 1 else ():
            new = rng.randrange(vocab - 1)
            out[i] = new + (new >= out[i])  # uniform over the vocabulary without the original
        return out
    spans = [(lo, min(lo + SPAN, n)) for lo in range(1, n, SPAN)]
    for lo, hi in rng.sample(spans, min(len(spans), round(fraction * n / SPAN))):
        part = out[lo:hi]
        rng.shuffle(part)
        out[lo:hi] = part
    return out


class PerturbedRows:
    """A stream's rows with every target copy perturbed: ``copies`` maps a row to the number of target tokens at
    its start (``n``); ``view[a:b]`` / ``view[index]`` return the base's rows with those first ``n`` tokens replaced
    by :func:`perturb` of them (seeded by ``(seed, row)``).  ``shape``, ``dtype``, ``len()`` and ``token_range`` (the
    base's widened to the whole vocabulary for substitutions) are known without reading rows."""

    def __init__(self, base, copies: dict[int, int], fraction: float, kind: str, vocab: int, seed: int = 0):
        if not 0 <= fraction <= 1:
            raise ValueError(f"the perturbed fraction must be in [0, 1], got {fraction}")
        if kind not in KINDS:
            raise ValueError(f"unknown perturbation {kind!r}: choose one of {KINDS}")
        self.base, self.copies, self.fraction, self.kind = base, copies, fraction, kind
        self.vocab, self.seed = vocab, seed
        self.shape, self.dtype = tuple(base.shape), base.dtype
        self.device = getattr(base, "device", torch.device("cpu"))
        if isinstance(base, torch.Tensor):
            lo, hi = (int(base.min()), int(base.max())) if base.numel() else (0, -1)
        else:
            lo, hi = base.token_range
        self.token_range = (min(lo, 0), max(hi, vocab - 1)) if kind == "substitute" and copies else (lo, hi)

    def __len__(self) -> int:
        return self.shape[0]

    def copy(self, row: int, ids: list[int]) -> list[int]:
        """The perturbed copy of ``ids``, the target tokens at the start of ``row``."""
        return perturb(ids, self.fraction, self.kind, self.vocab, random.Random(f"perturb:{self.seed}:{row}"))

    def __getitem__(self, index) -> torch.Tensor:
        rows, out = read_rows(self.base, index, len(self))
        for k, r in enumerate(rows):
            n = self.copies.get(r)
            if n:
                out[k, :n] = torch.tensor(self.copy(r, out[k, :n].tolist()), dtype=out.dtype)
        return out[0] if isinstance(index, int) else out


def target_copies(targets: list[dict], seq_len: int) -> dict[int, int]:
    """Row -> target tokens at its start, for every row holding a copy of a target (a manifest target's ``rows``;
    the row holds ``token_ids`` and the one token after them, cut to ``seq_len``)."""
    return {r: min(len(t["token_ids"]) + 1, seq_len) for t in targets for r in t.get("rows", [])}
