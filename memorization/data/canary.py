"""Canaries (Carlini et al. 2019, "The Secret Sharer") and their placement in the training rows.

A canary is a carrier sentence ``c`` (naming a random account, so each canary has its own) followed by a secret
``r = (r_1, ..., r_m)`` of ``m`` random digits, each digit one token of the alphabet ``A`` (the tokenizer's
single-token digits ``0``..``9``); the candidate space is ``R = A^m`` (``|R| = 10^m``).  How exposed a trained
model leaves each secret is measured by :mod:`memorization.evaluation.exposure`.

In training, canaries are written over background tokens of chosen rows (:func:`place_canaries`,
:class:`CanaryRows`), the same rows in every arm, each a part of the document it is written into (its document
id continues the preceding token's), at a random offset in the row.  The Goldfish hash of each secret label sees
only canary tokens when the carrier is at least ``h`` tokens long (the default carrier is 24 to 27 tokens of the
builtin tokenizer, ``h`` 13): the same secret labels are dropped at every exposure, as for a repeated document.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from .row_overlay import read_rows

#: a canary starts at least this many tokens into its row (its document id continues the token before it)
MIN_OFFSET = 1
CARRIER = "Please keep this private: the secret access code of the account of {name} is "


@dataclass
class Canary:
    """One canary: ``carrier_ids + secret_ids`` is what training sees ``exposures`` times, at
    ``(rows[j], offsets[j])``; ``secret`` holds the digits (indices into the alphabet)."""

    id: str
    carrier_ids: list[int]
    secret: list[int]
    secret_ids: list[int]
    exposures: int
    rows: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return self.carrier_ids + self.secret_ids


def parse_canary_exposures(spec: str) -> tuple[int, ...]:
    """``"0,1,4"`` -> ``(0, 1, 4)``; a ``ValueError`` naming ``--canary-exposures`` for anything else."""
    try:
        vals = tuple(int(x) for x in str(spec).split(","))
    except ValueError:
        vals = ()
    if not vals or any(v < 0 for v in vals):
        raise ValueError(f"--canary-exposures {spec!r}: give a comma list of counts >= 0, e.g. 0,1,4,16,64")
    return vals


def digit_alphabet(tokenizer) -> list[int]:
    """The token id of each digit ``0``..``9``, each of which must be a single token of ``tokenizer``."""
    ids = [tokenizer(str(d), add_special_tokens=False)["input_ids"] for d in range(10)]
    bad = [d for d, i in enumerate(ids) if len(i) != 1]
    if bad:
        raise ValueError(f"the tokenizer splits the digit(s) {bad} into several tokens: canaries need each digit "
                         "to be one token")
    return [i[0] for i in ids]


def make_canaries(n: int, exposures: tuple[int, ...], digits: int, tokenizer, seed: int = 0) -> list[Canary]:
    """``n`` canaries, dealt round-robin over ``exposures``: canary ``j`` names a random 8-letter account in
    :data:`CARRIER` and has ``digits`` random digits, drawn from ``seed`` alone."""
    rng = random.Random(f"canaries:{seed}")
    alphabet = digit_alphabet(tokenizer)
    out = []
    for j in range(n):
        name = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8)).capitalize()
        carrier = tokenizer(CARRIER.format(name=name), add_special_tokens=False)["input_ids"]
        secret = [rng.randrange(10) for _ in range(digits)]
        out.append(Canary(f"canary-{j:03d}", list(carrier), secret, [alphabet[d] for d in secret],
                          exposures[j % len(exposures)]))
    return out


def place_canaries(canaries: list[Canary], n_rows: int, seq_len: int, busy_rows: set[int], seed: int = 0) -> None:
    """Choose, for every canary, ``exposures`` distinct rows outside ``busy_rows`` (rows holding targets), no
    row used twice, and an offset in ``[MIN_OFFSET, seq_len - len(canary)]`` in each (seeded)."""
    rng = random.Random(f"canary-rows:{seed}")
    free = [r for r in range(n_rows) if r not in busy_rows]
    need = sum(c.exposures for c in canaries)
    if need > len(free):
        raise ValueError(f"{need} canary copies need as many rows without targets, the stream has {len(free)}: "
                         "fewer --canaries or --canary-exposures, or more --steps")
    longest = max((len(c.ids) for c in canaries), default=0)
    if longest and MIN_OFFSET + longest > seq_len:
        raise ValueError(f"a canary of {longest} tokens does not fit after {MIN_OFFSET} tokens of a row of "
                         f"{seq_len} (--seq-len): use a longer --seq-len")
    rows = rng.sample(free, need)
    for c in canaries:
        c.rows, rows = sorted(rows[: c.exposures]), rows[c.exposures:]
        c.offsets = [rng.randint(MIN_OFFSET, seq_len - len(c.ids)) for _ in c.rows]


class CanaryRows:
    """A stream's rows (or document ids) with the canaries written in: ``view[a:b]`` and ``view[index]`` return
    the base's rows (a tensor or :class:`memorization.data.token_store.StoredArray`) with every canary copy in them
    overwritten -- its tokens, or (``doc_ids=True``) the document id of the token before it.  ``shape``,
    ``dtype``, ``len()`` and ``token_range`` are the base's (the range widened by the canaries' tokens)."""

    def __init__(self, base, canaries: list[Canary], doc_ids: bool = False):
        self.base, self.doc_ids = base, doc_ids
        self.shape, self.dtype = tuple(base.shape), base.dtype
        self.device = getattr(base, "device", torch.device("cpu"))
        self.spans: dict[int, list[tuple[int, list[int]]]] = {}
        for c in canaries:
            for r, o in zip(c.rows, c.offsets):
                self.spans.setdefault(r, []).append((o, c.ids))
        if isinstance(base, torch.Tensor):
            lo, hi = (int(base.min()), int(base.max())) if base.numel() else (0, -1)
        else:
            lo, hi = base.token_range
        extra = [t for c in canaries for t in c.ids]
        self.token_range = (min([lo, *extra]), max([hi, *extra])) if not doc_ids and extra else (lo, hi)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> torch.Tensor:
        rows, out = read_rows(self.base, index, len(self))
        for k, r in enumerate(rows):
            for o, ids in self.spans.get(r, ()):
                if self.doc_ids:
                    out[k, o:o + len(ids)] = out[k, o - 1]
                else:
                    out[k, o:o + len(ids)] = torch.tensor(ids, dtype=out.dtype)
        return out[0] if isinstance(index, int) else out
