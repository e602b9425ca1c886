"""Exposure of canaries (Carlini et al. 2019, "The Secret Sharer"): how much more likely a trained model finds
a canary's secret than the other candidates (the canaries: :mod:`memorization.data.canary`).

For a canary with carrier ``c`` and secret ``r`` of ``m`` symbols of the alphabet ``A`` (candidate space
``R = A^m``), with the log-perplexity ``Px(r) = -log2 Pr_theta(r | c) = -sum_i log2 p_theta(r_i | c, r_<i)``
(the carrier is common to every candidate, so only the secret's tokens count):

    rank(s)     = 1 + |{r' in R : Px(r') < Px(s)}|
    exposure(s) = log2 |R| - log2 rank(s)

An unseen secret has exposure about 1 bit on average (a uniform rank has ``E[log2 |R| - log2 rank] ~ log2 e``);
a fully memorised one ``log2 |R|`` (``m log2 10`` bits).  :func:`enumerate_log_perplexities` computes ``Px`` of
every candidate exactly, level by level of the digit trie (``(|A|^m - 1) / (|A| - 1)`` forwards of one next-token
distribution each, batched); where ``R`` is too large, :func:`estimated_exposure` fits a skew normal to ``Px`` of
uniformly sampled candidates (the paper's estimate) and takes ``exposure = -log2 F(Px(s))``, ``F`` the fitted CDF.
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import torch

from memorization.data.canary import Canary

#: candidate spaces up to this size are enumerated exactly; larger ones are estimated from samples
EXACT_LIMIT = 10 ** 5


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
