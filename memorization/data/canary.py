"""Canaries and their exposure (Carlini et al. 2019, "The Secret Sharer").

A canary is a carrier sentence ``c`` (naming a random account, so each canary has its own) followed by a secret
``r = (r_1, ..., r_m)`` of ``m`` random digits, each digit one token of the alphabet ``A`` (the tokenizer's
single-token digits ``0``..``9``); the candidate space is ``R = A^m`` (``|R| = 10^m``).  With the
log-perplexity ``Px(r) = -log2 Pr_theta(r | c) = -sum_i log2 p_theta(r_i | c, r_<i)`` (the carrier is common to
every candidate, so only the secret's tokens count):

    rank(s)     = 1 + |{r' in R : Px(r') < Px(s)}|
    exposure(s) = log2 |R| - log2 rank(s)

An unseen secret has exposure about 1 bit on average (a uniform rank has ``E[log2 |R| - log2 rank] ~ log2 e``);
a fully memorised one ``log2 |R|`` (``m log2 10`` bits).  :func:`enumerate_log_perplexities` computes ``Px`` of
every candidate exactly, level by level of the digit trie (``(|A|^m - 1) / (|A| - 1)`` forwards of one next-token
distribution each, batched); where ``R`` is too large, :func:`estimated_exposure` fits a skew normal to ``Px`` of
uniformly sampled candidates (the paper's estimate) and takes ``exposure = -log2 F(Px(s))``, ``F`` the fitted CDF.

In training, canaries are written over background tokens of chosen rows (:func:`place_canaries`,
:class:`CanaryRows`), the same rows in every arm, each a part of the document it is written into (its document
id continues the preceding token's), at a random offset in the row.  The Goldfish hash of each secret label sees
only canary tokens when the carrier is at least ``h`` tokens long (the default carrier is 24 to 27 tokens of the
builtin tokenizer, ``h`` 13): the same secret labels are dropped at every exposure, as for a repeated document.
"""
from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from .row_overlay import read_rows

#: a canary starts at least this many tokens into its row (its document id continues the token before it)
MIN_OFFSET = 1
#: candidate spaces up to this size are enumerated exactly; larger ones are estimated from samples
EXACT_LIMIT = 10 ** 5
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


@torch.no_grad()
def _next_logprobs(model: torch.nn.Module, seqs: list[list[int]], batch_size: int) -> torch.Tensor:
    """``log p_theta(. | seq)`` over the whole vocabulary after each of ``seqs`` (equal lengths), float32."""
    device = next(model.parameters()).device
    out = []
    for lo in range(0, len(seqs), batch_size):
        ids = torch.tensor(seqs[lo:lo + batch_size], dtype=torch.long, device=device)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[:, -1]
        out.append(logits.float().log_softmax(-1).cpu())
    return torch.cat(out)


@torch.no_grad()
def enumerate_log_perplexities(model: torch.nn.Module, carrier_ids: list[int], alphabet: list[int], length: int,
                               batch_size: int = 256) -> np.ndarray:
    """``Px(r)`` in bits of every candidate ``r`` in ``alphabet^length`` after ``carrier_ids``, indexed by ``r`` read
    as a base-``|A|`` number (first symbol most significant), computed level by level of the trie: the
    distributions after every partial secret of length ``t`` give the ``t+1``-th symbol's log-probability."""
    was_training = model.training
    model.eval()
    A = len(alphabet)
    alpha = torch.tensor(alphabet)
    px = torch.zeros(1, dtype=torch.float64)  # nats so far of each partial secret, in base-A order
    for t in range(length):
        seqs = [carrier_ids + [alphabet[(i // A ** (t - 1 - j)) % A] for j in range(t)] for i in range(A ** t)]
        lp = _next_logprobs(model, seqs, batch_size)[:, alpha].double()  # (A^t, A)
        px = (px.unsqueeze(1) - lp).reshape(-1)
    model.train(was_training)
    return (px / math.log(2)).numpy()


def secret_index(secret: list[int], base: int) -> int:
    """A secret (digit indices) as its position in :func:`enumerate_log_perplexities`'s order."""
    i = 0
    for d in secret:
        i = i * base + d
    return i


def exact_exposure(px: np.ndarray, index: int) -> dict:
    """``{"rank", "exposure"}`` of candidate ``index`` among all candidates' log-perplexities ``px`` (module
    docstring: ``rank = 1 + #{Px(r') < Px(s)}``)."""
    rank = 1 + int((px < px[index]).sum())
    return {"rank": rank, "exposure": math.log2(len(px)) - math.log2(rank)}


@torch.no_grad()
def secret_log_perplexities(model: torch.nn.Module, carrier_ids: list[int], secrets: list[list[int]],
                            batch_size: int = 256) -> np.ndarray:
    """``Px`` in bits of each token sequence in ``secrets`` (equal lengths) after ``carrier_ids``: one forward
    of carrier + secret per candidate, batched."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    P, out = len(carrier_ids), []
    for lo in range(0, len(secrets), batch_size):
        ids = torch.tensor([carrier_ids + s for s in secrets[lo:lo + batch_size]], dtype=torch.long, device=device)
        lp = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float()
        lp = lp[:, P - 1:-1].log_softmax(-1).gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)
        out.append(-lp.double().sum(-1).cpu() / math.log(2))
    model.train(was_training)
    return torch.cat(out).numpy()


def estimated_exposure(sample_px: np.ndarray, px: float) -> float:
    """Exposure from a skew normal fitted to the log-perplexities of uniformly sampled candidates:
    ``-log2 F(px)`` (``F`` the fitted CDF, the estimated share of candidates more likely than the secret)."""
    from scipy.stats import skewnorm

    a, loc, scale = skewnorm.fit(sample_px)
    return float(-skewnorm.logcdf(px, a, loc, scale) / math.log(2))


def canary_exposures(model: torch.nn.Module, canaries: list[Canary], alphabet: list[int], samples: int = 4096,
                     exact_limit: int = EXACT_LIMIT, seed: int = 0, batch_size: int = 256) -> list[dict]:
    """Per canary ``{"id", "exposures", "exposure", "method", "rank", "max_exposure"}``: exact by enumeration
    when ``|A|^m <= exact_limit`` (``rank`` is then the secret's rank), else estimated from ``samples`` uniform
    candidates (seeded by ``seed`` and the canary's id; ``rank`` None)."""
    A, out = len(alphabet), []
    for c in canaries:
        m = len(c.secret)
        row = {"id": c.id, "exposures": c.exposures, "max_exposure": m * math.log2(A)}
        if A ** m <= exact_limit:
            px = enumerate_log_perplexities(model, c.carrier_ids, alphabet, m, batch_size)
            row.update(exact_exposure(px, secret_index(c.secret, A)), method="exact")
        else:
            rng = np.random.default_rng([seed, zlib.crc32(c.id.encode())])
            cands = [[alphabet[d] for d in rng.integers(0, A, m)] for _ in range(samples)]
            sample_px = secret_log_perplexities(model, c.carrier_ids, cands, batch_size)
            own = secret_log_perplexities(model, c.carrier_ids, [c.secret_ids], batch_size)[0]
            row.update(exposure=estimated_exposure(sample_px, own), rank=None, method=f"skew-normal fit, {samples}")
        out.append(row)
    return out


def summarize_exposures(rows: list[dict]) -> dict:
    """By exposure count: ``{n: {"n", "mean", "ci95", "median", "max"}}`` of the canaries' exposures (``ci95``: a
    t interval of the mean, None for one canary)."""
    from memorization.evaluation.stats import mean_ci

    groups: dict[int, list[float]] = {}
    for r in rows:
        groups.setdefault(int(r["exposures"]), []).append(float(r["exposure"]))
    out = {}
    for n, xs in sorted(groups.items()):
        xs_sorted = sorted(xs)
        k = len(xs)
        out[str(n)] = {"n": k, "mean": sum(xs) / k, "ci95": mean_ci(xs),
                       "median": xs_sorted[k // 2] if k % 2 else (xs_sorted[k // 2 - 1] + xs_sorted[k // 2]) / 2,
                       "max": max(xs)}
    return out
