"""Membership inference (MIA) scores for causal LMs, and how well they separate members.

Given a model and a set of documents, each score is a single number per document that an
attacker could compute with (at most) black-box access to token probabilities.  With
``x = (x_0, ..., x_{n-1})`` the token ids of a document and
``log p_t = log p_theta(x_t | x_<t)`` for ``t = 1..n-1`` (the first token has no context and
is not scored; prepend BOS to score it), the scores are:

``loss``      mean token negative log-likelihood (the log-perplexity)::

                  L(x) = -1/(n-1) * sum_t log p_t

              Members were trained on, so they tend to have *lower* loss.
``zlib``      loss divided by the zlib-compressed size in bytes of the text of the *scored*
              tokens (Carlini et al., 2021, "Extracting Training Data from Large Language
              Models")::

                  Z(x) = L(x) / len(zlib.compress(utf8(decode(x_1, ..., x_{n-1}))))

              ``x`` is the document as scored, i.e. after any ``max_length`` truncation: a
              manifest's ``text`` (the whole document) is never used, as its length would add
              noise unrelated to membership.

              Normalises away "generically easy" text (repetitive text compresses well *and*
              has low loss); *lower* is more member-like.
``min_k``     Min-k% Prob (Shi et al., 2023, "Detecting Pretraining Data from Large Language
              Models"): the mean of the lowest ``k`` fraction of the token log-probs::

                  M_k(x) = 1/|S| * sum_{t in S} log p_t,   S = the max(1, floor(k (n-1)))
                                                            tokens with smallest log p_t

              An unseen text has a few very surprising tokens; a memorised one has none, so
              *higher* is more member-like.  ``k = 0.2`` by default.
``min_k_pp``  Min-K%++ (Zhang et al., 2024, "Min-K%++: Improved Baseline for Detecting Pre-Training
              Data from Large Language Models"): each token's log-prob standardised by the
              model's own next-token distribution at that position, then Min-k% of those::

                  z_t = (log p_t - mu_t) / sigma_t,   mu_t = E_{z ~ p(.|x_<t)} log p(z|x_<t),
                  sigma_t^2 = E_{z ~ p(.|x_<t)} (log p(z|x_<t))^2 - mu_t^2
                  K(x) = mean of the max(1, floor(k (n-1))) smallest z_t

              Training pushes a member's tokens towards a local maximum of the likelihood, above
              what the distribution at that position would give a typical token; a position
              whose distribution is a single token (sigma_t = 0) scores z_t = 0.  *Higher* is
              more member-like.
``ref_diff``  loss under the target model minus loss under a reference model that did not see
              the members (e.g. the base checkpoint before fine-tuning, or a model trained on
              the same distribution without the targets)::

                  R(x) = L_target(x) - L_ref(x)

              Both losses cover the same text span: the reference scores the same ids when
              it shares the target's vocabulary, else the decoded scored span re-tokenised
              with its own tokenizer.  Calibrates away per-document difficulty; *lower* is
              more member-like.

All scores are computed in padded batches (right padding + attention mask) with one forward
pass per batch; the per-token work is fully vectorised.

Evaluation
----------
:func:`mia_report` turns raw scores into the numbers that are reported: ROC AUC and the TPR at
1% FPR, for members (targets with ``exposures >= 1``) against nonmembers, overall and broken
down by exposure count.  :func:`run_mia` takes as nonmembers the targets with ``exposures ==
0`` when there are any (never trained on, and drawn like the members), pooled with the
manifest's held-out corpus documents only when the targets come from that same corpus.
Without exposure-0 targets it uses the manifest's nonmembers; for user-supplied targets those
are background-corpus documents, a different distribution, so the AUC then also measures
that shift -- the report says so (``nonmember_source``, ``warnings``).  Each score is first
oriented with :data:`SCORE_DIRECTIONS` so that *higher means "member"*; an AUC of 0.5 is chance
and an AUC above 0.5 means the attack works.

* ``AUC = P(s_member > s_nonmember) + 0.5 P(s_member = s_nonmember)`` -- the normalised
  Mann-Whitney U statistic, computed from average ranks (ties count half).  It equals the
  trapezoidal area under the ROC curve returned by :func:`roc_curve`.
* ``TPR@FPR=f`` -- the ROC curve (one point per distinct threshold, so tied scores give a
  diagonal segment) is linearly interpolated at ``FPR = f``.  With ``N`` nonmembers the FPR
  resolution is ``1/N``: below ``N = 100`` the 1% point is an interpolation between the
  ``FPR = 0`` and ``FPR = 1/N`` points, which the report flags as ``fpr_resolution``.

Public API
----------
:func:`mia_scores`, :func:`mia_report`, :func:`run_mia`, :func:`roc_curve`, :func:`roc_auc`,
:func:`tpr_at_fpr`, :func:`load_manifest`, :func:`load_checkpoint`,
:func:`sequence_token_logprobs`.  The CLI is ``python eval/mia.py``.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .eval_model import (Docs, MissingTokenizerError, as_id_lists, check_vocab, default_device, grid_runtime,
                         load_checkpoint, load_on_grid, model_device, model_max_length)
from .mixture import is_int, load_manifest

log = logging.getLogger(__name__)

#: Orientation of each score: multiply by this so that higher means "more member-like".
SCORE_DIRECTIONS: dict[str, float] = {"loss": -1.0, "zlib": -1.0, "min_k": 1.0, "min_k_pp": 1.0, "ref_diff": -1.0}

#: Human-readable description of each score (used in the markdown report).
SCORE_DESCRIPTIONS: dict[str, str] = {
    "loss": "mean token NLL (lower = member)",
    "zlib": "loss / zlib-compressed bytes of the scored tokens' text (lower = member)",
    "min_k": "mean of the lowest k% token log-probs (higher = member)",
    "min_k_pp": "Min-K%++: mean of the lowest k% standardised token log-probs (higher = member)",
    "ref_diff": "target loss - reference loss on the same text (lower = member)",
}

# Logit elements converted to float32 log-probs at once (2^28 floats = 1 GiB).
_LOGIT_CHUNK_ELEMENTS = 1 << 28

__all__ = [
    "SCORE_DIRECTIONS",
    "MissingTokenizerError",
    "load_checkpoint",
    "load_manifest",
    "sequence_token_logprobs",
    "mia_scores",
    "roc_curve",
    "roc_auc",
    "tpr_at_fpr",
    "mia_report",
    "report_markdown",
    "plot_roc",
    "run_mia",
    "select_nonmembers",
]


# --------------------------------------------------------------------------- loading


# --------------------------------------------------------------------------- scoring


def pad_batch(
    seqs: Sequence[Sequence[int]], device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into ``(input_ids, attention_mask)`` of shape ``(B, max_len)``.

    The pad id is 0; padded positions are excluded by the attention mask and by every
    statistic computed here, so its value never matters.
    """
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def sequence_token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass: log-prob of every next token, ``log p(x_t | x_<t)``.

    Returns ``(logp, valid)`` of shape ``(B, T-1)``: ``logp[b, t-1] = log p(x_t | x_<t)`` in
    float32 and ``valid[b, t-1]`` true where both ``x_{t-1}`` and ``x_t`` are real (unpadded)
    tokens.  Computed as ``-cross_entropy(logits[:, :-1], x[:, 1:])`` over the whole batch.
    """
    logp, _, valid = token_stats(model, input_ids, attention_mask, standardise=False)
    return logp, valid


@torch.no_grad()
def token_stats(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                standardise: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(logp, z, valid)`` of one forward pass: :func:`sequence_token_logprobs`'s log-probs and, with
    ``standardise``, Min-K%++'s ``z_t = (log p_t - mu_t) / sigma_t`` (module docstring; None without)."""
    head = vocab_sharded_head(model)
    with head.sharded_output() if head is not None else contextlib.nullcontext():
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    logits = out.logits[:, :-1]
    targets = input_ids[:, 1:]
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    if head is not None:  # a grid's LM head: log-probs (and Min-K%++'s moments) from the row shards
        from axonn.intra_layer import vocab_parallel_logprobs

        rows = max(1, _LOGIT_CHUNK_ELEMENTS // max(1, 2 * logits.size(1) * logits.size(2)))
        logps, zs = [], []
        for chunk, tgt in zip(logits.split(rows), targets.split(rows)):
            lp, mu, sigma = vocab_parallel_logprobs(chunk, tgt, moments=standardise, axes=head.out_axis,
                                                    grid=head.grid)
            logps.append(lp)
            if standardise:
                zs.append(torch.where(sigma > 0, (lp - mu) / sigma.clamp(min=1e-30), torch.zeros_like(lp)))
        return torch.cat(logps), torch.cat(zs) if standardise else None, valid
    if standardise:  # log_softmax, its probabilities and two products: ~4 float32 copies of a row group
        rows = max(1, _LOGIT_CHUNK_ELEMENTS // max(1, 2 * logits.size(1) * logits.size(2)))
        logps, zs = [], []
        for chunk, tgt in zip(logits.split(rows), targets.split(rows)):
            lsm = chunk.float().log_softmax(-1)
            lp = lsm.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            prob = lsm.exp()
            mu = (prob * lsm).sum(-1)
            sigma = (prob * (lsm - mu.unsqueeze(-1)).square()).sum(-1).sqrt()  # two-pass: no cancellation
            zs.append(torch.where(sigma > 0, (lp - mu) / sigma.clamp(min=1e-30), torch.zeros_like(lp)))
            logps.append(lp)
            del lsm, prob
        return torch.cat(logps), torch.cat(zs), valid
    # The float32 upcast + log-softmax inside cross_entropy need ~2 extra copies of the logits;
    # at a 128k vocabulary that is GBs per row, so large batches are converted in row groups.
    rows = max(1, _LOGIT_CHUNK_ELEMENTS // max(1, logits.size(1) * logits.size(2)))
    # (N, V) rows, not the (B, V, T) layout: the strided class dimension is ~60x slower on GPU
    nll = torch.cat([
        F.cross_entropy(chunk.float().reshape(-1, chunk.size(-1)), tgt.reshape(-1),
                        reduction="none").view_as(tgt)
        for chunk, tgt in zip(logits.split(rows), targets.split(rows))
    ])
    return -nll, None, valid


def vocab_sharded_head(model: torch.nn.Module):
    """The model's LM head if it is an axonn Linear whose output (the vocabulary) is split over more than one
    rank, else None: then log-probs come from its shards (:func:`axonn.intra_layer.vocab_parallel_logprobs`),
    never the gathered vocabulary."""
    from axonn.intra_layer import Linear

    head = getattr(model, "lm_head", None)
    return head if isinstance(head, Linear) and head.grid.size(head.out_axis) > 1 else None


def _min_k_mean(logp: torch.Tensor, valid: torch.Tensor, k: float) -> torch.Tensor:
    """Row-wise mean of the ``max(1, floor(k * n_valid))`` smallest valid log-probs."""
    n = valid.sum(dim=1)
    count = torch.clamp(torch.floor(n.double() * k).long(), min=1)
    lowest = torch.sort(logp.masked_fill(~valid, float("inf")), dim=1).values
    take = torch.arange(lowest.size(1), device=logp.device)[None, :] < count[:, None]
    total = torch.where(take, lowest, torch.zeros_like(lowest)).sum(dim=1)
    out = total / count
    return torch.where(n > 0, out, torch.full_like(out, float("nan")))


def _score_with_model(
    model: torch.nn.Module,
    docs: list[list[int]],
    *,
    batch_size: int,
    device: torch.device,
    k: float,
    desc: str,
) -> dict[str, np.ndarray]:
    """Loss, min-k, Min-K%++ and token count per doc.  Docs are processed longest-first (so each batch
    has little padding and an out-of-memory error shows up on the first batch) and results
    are put back in input order."""
    from tqdm.auto import tqdm

    n_docs = len(docs)
    loss = np.full(n_docs, np.nan)
    min_k = np.full(n_docs, np.nan)
    min_k_pp = np.full(n_docs, np.nan)
    n_tok = np.zeros(n_docs, dtype=np.int64)
    check_vocab(model, docs, desc)
    # documents with fewer than 2 tokens score nothing (NaN): a batch of only such documents
    # would be a zero-width forward pass, which the model cannot run
    order = sorted((i for i in range(n_docs) if len(docs[i]) >= 2), key=lambda i: -len(docs[i]))
    starts = range(0, len(order), batch_size)
    for s in tqdm(starts, desc=desc, unit="batch", disable=len(starts) <= 1):
        idx = order[s : s + batch_size]
        ids, mask = pad_batch([docs[i] for i in idx], device)
        logp, z, valid = token_stats(model, ids, mask, standardise=True)
        cnt = valid.sum(dim=1)
        mean_nll = -(logp * valid).sum(dim=1) / cnt.clamp(min=1)
        mean_nll = torch.where(cnt > 0, mean_nll, torch.full_like(mean_nll, float("nan")))
        loss[idx] = mean_nll.double().cpu().numpy()
        min_k[idx] = _min_k_mean(logp, valid, k).double().cpu().numpy()
        min_k_pp[idx] = _min_k_mean(z, valid, k).double().cpu().numpy()
        n_tok[idx] = cnt.cpu().numpy()
    return {"loss": loss, "min_k": min_k, "min_k_pp": min_k_pp, "n_tokens": n_tok}


def _check_max_length(max_length: int | None, context: int | None) -> None:
    """Raise ``ValueError`` unless ``max_length`` is None or in ``[2, context]``: a window past the
    context would score positions the model was never trained on (extrapolation, not memory)."""
    if max_length is None:
        return
    if not is_int(max_length) or max_length < 2:
        raise ValueError(f"max_length must be an integer >= 2 (or None for the model's context), "
                         f"got {max_length!r}")
    if context and max_length > context:
        raise ValueError(f"max_length {max_length} exceeds the model's context ({context} tokens: "
                         "max_position_embeddings, or the trained length of a model trained from scratch)")


def _prepare_docs(
    docs: Docs, max_length: int, bos_token_id: int | None, what: str
) -> tuple[list[list[int]], np.ndarray]:
    """``(ids, truncated)``: the documents as scored (BOS prepended, cut to ``max_length``)
    and a boolean mask of the ones that were cut."""
    ids = as_id_lists(docs)
    if bos_token_id is not None:
        ids = [d if (d and d[0] == bos_token_id) else [bos_token_id, *d] for d in ids]
    truncated = np.array([len(d) > max_length for d in ids], dtype=bool)
    if truncated.any():
        n_long = int(truncated.sum())
        log.warning(
            "%s: %d of %d documents are longer than %d tokens and are truncated to their "
            "first %d tokens", what, n_long, len(ids), max_length, max_length,
        )
        ids = [d[:max_length] for d in ids]
    n_short = sum(len(d) < 2 for d in ids)
    if n_short:
        log.warning("%s: %d documents have fewer than 2 tokens; their scores are NaN",
                    what, n_short)
    return ids, truncated


def _reference_ids(
    ids: list[list[int]], tokenizer: Any, reference_tokenizer: Any
) -> list[list[int]]:
    """The scored documents re-tokenised for a reference model with another vocabulary: the
    decoded text of exactly the ids the target model sees, with the reference's BOS in front
    where the target document starts with the target's BOS."""
    bos, ref_bos = tokenizer.bos_token_id, reference_tokenizer.bos_token_id
    out = []
    for d, text in zip(ids, tokenizer.batch_decode(ids, skip_special_tokens=True)):
        r = list(reference_tokenizer(text, add_special_tokens=False)["input_ids"])
        if bos is not None and ref_bos is not None and d[:1] == [bos]:
            r = [ref_bos, *r]
        out.append(r)
    return out


def mia_scores(
    model: torch.nn.Module,
    tokenizer: Any | None,
    docs: Docs,
    *,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    reference_model: torch.nn.Module | None = None,
    reference_tokenizer: Any | None = None,
    texts: Sequence[str] | None = None,
    k: float = 0.2,
    max_length: int | None = None,
    add_bos: bool = False,
) -> dict[str, np.ndarray]:
    """Per-document membership scores (see the module docstring for the math).

    Args:
        model: a causal LM returning ``.logits`` (e.g. ``LlamaForCausalLM``), already on
            ``device``.
        tokenizer: decodes the scored tokens to text for the zlib score (and for a reference
            model with another vocabulary); its BOS id is used when ``add_bos``.  May be
            ``None``.
        docs: token-id lists (or 1-D tensors, or a 2-D tensor) -- one per document.
        batch_size: documents per forward pass.
        device: where to run; default: the model's device.
        reference_model: optional reference LM; adds ``ref_diff`` and ``ref_loss``, computed on
            the same span as the target's loss (``max_length`` is lowered to the reference's
            context length if that is shorter).
        reference_tokenizer: the reference model's tokenizer.  If its vocabulary differs
            from ``tokenizer``'s, the scored ids are decoded and re-tokenised with it;
            otherwise (or when ``None``) the reference scores the very same ids.
        texts: only used without a ``tokenizer``: the text that each document's token ids
            encode, for ``zlib``.  A document that ``max_length`` truncates gets a NaN zlib
            score then, since its text covers more than the scored tokens.  Without texts or
            a tokenizer, ``zlib`` is left out (with a warning).
        k: the fraction for Min-k% Prob and Min-K%++ (0 < k <= 1).
        max_length: documents longer than this are truncated to their first ``max_length``
            tokens (default: the model's context length, capped at 4096).
        add_bos: prepend ``tokenizer.bos_token_id`` to documents that do not start with it,
            so that the first real token is scored too.

    Returns:
        ``{"loss", "zlib", "min_k", "min_k_pp", ["ref_diff", "ref_loss"], "n_tokens"}`` -> arrays of
        shape ``(n_docs,)`` in input order.  ``n_tokens`` is the number of scored tokens.
    """
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be in (0, 1], got {k}")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    from memorization.models import model_context

    _check_max_length(max_length, model_context(model))
    dev = torch.device(device) if device is not None else model_device(model)
    max_length = max_length or model_max_length(model)
    if reference_model is not None and model_max_length(reference_model) < max_length:
        max_length = model_max_length(reference_model)
        log.info("truncating documents to the reference model's context of %d tokens, so that "
                 "both models score the same span", max_length)
    bos = getattr(tokenizer, "bos_token_id", None) if (add_bos and tokenizer is not None) else None
    if add_bos and bos is None:
        log.warning("add_bos requested but no tokenizer BOS id is available; not prepending")
    ids, truncated = _prepare_docs(docs, max_length, bos, "target")
    if texts is not None and len(texts) != len(ids):
        raise ValueError(f"got {len(texts)} texts for {len(ids)} documents")

    out = _score_with_model(model, ids, batch_size=batch_size, device=dev, k=k,
                            desc="MIA scores")
    scores: dict[str, np.ndarray] = {"loss": out["loss"]}

    # zlib of exactly the tokens whose loss was taken (x_1..x_{n-1}), never of a longer text
    zlen = None
    if tokenizer is not None:
        scored = tokenizer.batch_decode([d[1:] for d in ids], skip_special_tokens=True)
        zlen = np.array([len(zlib.compress(t.encode("utf-8"))) for t in scored], dtype=np.float64)
    elif texts is not None:
        zlen = np.array([len(zlib.compress(t.encode("utf-8"))) for t in texts], dtype=np.float64)
        if truncated.any():
            log.warning("zlib: %d truncated documents get NaN (their texts cover more than the "
                        "scored tokens; pass a tokenizer to decode them)", int(truncated.sum()))
            zlen[truncated] = np.nan
    if zlen is not None:
        scores["zlib"] = out["loss"] / np.maximum(zlen, 1.0)
    else:
        log.warning("no texts and no tokenizer: the zlib score is skipped")
    scores["min_k"] = out["min_k"]
    scores["min_k_pp"] = out["min_k_pp"]

    if reference_model is not None:
        ref_max = model_max_length(reference_model)
        if (reference_tokenizer is None or tokenizer is None
                or _same_vocab(tokenizer, reference_tokenizer)):
            ref_ids, ref_cut = ids, np.zeros(len(ids), dtype=bool)  # the very same span
        else:
            log.info("reference tokenizer differs from the target's: re-tokenising the decoded "
                     "scored spans")
            ref_ids, ref_cut = _prepare_docs(_reference_ids(ids, tokenizer, reference_tokenizer),
                                             ref_max, None, "reference")
        ref = _score_with_model(reference_model, ref_ids, batch_size=batch_size,
                                device=model_device(reference_model), k=k,
                                desc="MIA reference")
        ref_loss = ref["loss"].copy()
        if ref_cut.any():
            log.warning("reference: %d documents re-tokenise to more than its %d-token context; "
                        "their ref_diff is NaN", int(ref_cut.sum()), ref_max)
            ref_loss[ref_cut] = np.nan
        scores["ref_diff"] = out["loss"] - ref_loss
        scores["ref_loss"] = ref_loss
    scores["n_tokens"] = out["n_tokens"]
    return scores


# --------------------------------------------------------------------------- ROC / AUC


def _clean(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def roc_curve(
    member_scores: Any, nonmember_scores: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve for "higher score = member".

    Returns ``(fpr, tpr, thresholds)``: one point per distinct score value ``thr`` (classify
    ``score >= thr`` as member), in increasing FPR order, starting at ``(0, 0)`` with
    threshold ``+inf``.  Tied scores across the classes give a diagonal segment.
    """
    pos, neg = _clean(member_scores), _clean(nonmember_scores)
    if pos.size == 0 or neg.size == 0:
        raise ValueError("roc_curve needs at least one member and one nonmember score")
    scores = np.concatenate([pos, neg])
    labels = np.concatenate([np.ones(pos.size), np.zeros(neg.size)])
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    # last index of each run of equal scores
    last = np.r_[np.nonzero(np.diff(scores))[0], scores.size - 1]
    tp = np.cumsum(labels)[last]
    fp = (last + 1) - tp
    tpr = np.r_[0.0, tp / pos.size]
    fpr = np.r_[0.0, fp / neg.size]
    thr = np.r_[np.inf, scores[last]]
    return fpr, tpr, thr


def roc_auc(member_scores: Any, nonmember_scores: Any) -> float:
    """ROC AUC = P(member > nonmember) + 0.5 P(tie), via average ranks (Mann-Whitney U)::

        AUC = (sum of member ranks - n1 (n1 + 1) / 2) / (n1 * n0)
    """
    pos, neg = _clean(member_scores), _clean(nonmember_scores)
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    scores = np.concatenate([pos, neg])
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    # average 1-based rank of each distinct value: (first + last) / 2
    ends = np.cumsum(counts)
    avg_rank = ends - (counts - 1) / 2.0
    ranks = avg_rank[inverse]
    n1, n0 = pos.size, neg.size
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    return float(u / (n1 * n0))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float = 0.01) -> float:
    """TPR of an ROC curve at ``FPR = target``, linearly interpolated between its points.

    Takes the last point with ``fpr <= target`` (the highest TPR reached at that FPR) and the
    next point, and interpolates on the segment between them.
    """
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    i = int(np.searchsorted(fpr, target, side="right")) - 1
    if i < 0:
        return 0.0
    if fpr[i] == target or i == fpr.size - 1:
        return float(tpr[i])
    x0, x1, y0, y1 = fpr[i], fpr[i + 1], tpr[i], tpr[i + 1]
    return float(y0 + (y1 - y0) * (target - x0) / (x1 - x0))


def _score_summary(pos: np.ndarray, neg: np.ndarray, fpr_target: float) -> dict[str, Any]:
    pos, neg = _clean(pos), _clean(neg)
    if pos.size == 0 or neg.size == 0:
        return {"auc": None, "tpr_at_fpr": None, "n_members": int(pos.size),
                "n_nonmembers": int(neg.size)}
    fpr, tpr, _ = roc_curve(pos, neg)
    return {
        "auc": roc_auc(pos, neg),
        "tpr_at_fpr": tpr_at_fpr(fpr, tpr, fpr_target),
        "n_members": int(pos.size),
        "n_nonmembers": int(neg.size),
    }


def mia_report(
    member_scores: dict[str, Any],
    nonmember_scores: dict[str, Any],
    *,
    member_exposures: Sequence[int] | None = None,
    fpr_target: float = 0.01,
    directions: dict[str, float] | None = None,
) -> dict[str, Any]:
    """AUC and TPR at ``fpr_target`` FPR for every score, overall and by exposure count.

    Args:
        member_scores / nonmember_scores: ``{score name: per-document values}`` as returned by
            :func:`mia_scores` (raw, un-oriented).  Only names in ``directions`` are reported.
        member_exposures: exposure count of each member document, for the breakdown.  Entries
            with 0 exposures (controls that were never trained on) are excluded from the
            overall numbers and reported as their own group, where AUC ~ 0.5 is expected.
        fpr_target: FPR at which to read the TPR (default 1%).
        directions: orientation per score (default :data:`SCORE_DIRECTIONS`).

    Returns:
        ``{"fpr_target", "fpr_resolution", "scores": {name: {"auc", "tpr_at_fpr",
        "n_members", "n_nonmembers", "by_exposure": {str(e): {...}}}}}``.  NaN scores are
        dropped.
    """
    if not 0.0 < fpr_target < 1.0:
        raise ValueError(f"fpr_target must be a fraction in (0, 1): 0.01 is 1%, got {fpr_target}")
    directions = directions or SCORE_DIRECTIONS
    names = [n for n in directions if n in member_scores and n in nonmember_scores]
    exp = None if member_exposures is None else np.asarray(member_exposures, dtype=np.int64)
    some = np.asarray(next(iter(member_scores.values())))
    if exp is not None and exp.shape[0] != some.shape[0]:
        raise ValueError("member_exposures must have one entry per member document")
    trained = np.ones(some.shape[0], dtype=bool) if exp is None else exp >= 1
    n_non = int(_clean(np.asarray(nonmember_scores[names[0]])).size) if names else 0
    report: dict[str, Any] = {
        "fpr_target": fpr_target,
        "fpr_resolution": (1.0 / n_non) if n_non else None,
        "scores": {},
    }
    if n_non and 1.0 / n_non > fpr_target:
        log.warning(
            "only %d nonmembers: FPR resolution 1/%d > %g, TPR@%g%%FPR is interpolated "
            "from the first ROC segment", n_non, n_non, fpr_target, 100 * fpr_target)
    for name in names:
        sign = directions[name]
        pos = sign * np.asarray(member_scores[name], dtype=np.float64)
        neg = sign * np.asarray(nonmember_scores[name], dtype=np.float64)
        entry = _score_summary(pos[trained], neg, fpr_target)
        if exp is not None:
            entry["by_exposure"] = {
                str(int(e)): _score_summary(pos[exp == e], neg, fpr_target)
                for e in np.unique(exp)
            }
        report["scores"][name] = entry
    return report


# --------------------------------------------------------------------------- outputs


def report_markdown(report: dict[str, Any], title: str = "Membership inference") -> str:
    """Markdown table: one row per score, overall AUC/TPR and AUC per exposure count."""
    from .extraction import fmt_metric

    pct = f"{100 * report['fpr_target']:g}%"
    scores = report["scores"]
    exposures = sorted({e for s in scores.values() for e in s.get("by_exposure", {})}, key=int)
    head = ["score", "AUC", f"TPR@{pct}FPR"] + [f"AUC e={e}" for e in exposures]
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for name, s in scores.items():
        row = [f"`{name}`", fmt_metric(s["auc"]), fmt_metric(s["tpr_at_fpr"])]
        row += [fmt_metric(s.get("by_exposure", {}).get(e, {}).get("auc")) for e in exposures]
        lines.append("| " + " | ".join(row) + " |")
    any_s = next(iter(scores.values()), None)
    if any_s:
        lines.append("")
        lines.append(f"{any_s['n_members']} members (exposures >= 1) vs "
                     f"{any_s['n_nonmembers']} nonmembers; AUC 0.5 = chance.")
        if report.get("nonmember_description"):
            lines.append(f"Nonmembers: {report['nonmember_description']}.")
        if exposures:
            counts = ", ".join(f"e={e}: {any_s['by_exposure'][e]['n_members']}"
                               for e in exposures)
            lines.append(f"Documents per exposure count: {counts}.")
        res = report.get("fpr_resolution")
        if res and res > report["fpr_target"]:
            lines.append(f"Note: FPR resolution is {res:.3g} (> {pct}); "
                         "TPR at low FPR is interpolated and coarse.")
    for w in report.get("warnings") or []:
        lines += ["", f"**Warning:** {w}"]
    lines.append("")
    for name in scores:
        lines.append(f"- `{name}`: {SCORE_DESCRIPTIONS.get(name, '')}")
    return "\n".join(lines) + "\n"


def plot_roc(
    member_scores: dict[str, Any],
    nonmember_scores: dict[str, Any],
    path: str | os.PathLike,
    *,
    directions: dict[str, float] | None = None,
) -> None:
    """ROC curves of every score (linear and log-log axes side by side) into a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    directions = directions or SCORE_DIRECTIONS
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for name, sign in directions.items():
        if name not in member_scores or name not in nonmember_scores:
            continue
        pos = sign * np.asarray(member_scores[name], dtype=np.float64)
        neg = sign * np.asarray(nonmember_scores[name], dtype=np.float64)
        if _clean(pos).size == 0 or _clean(neg).size == 0:
            continue
        fpr, tpr, _ = roc_curve(pos, neg)
        auc = roc_auc(pos, neg)
        for ax in axes:
            ax.plot(fpr, tpr, label=f"{name} (AUC {auc:.3f})", drawstyle="default")
    for ax, scale in zip(axes, ("linear", "log")):
        ax.plot([1e-4, 1], [1e-4, 1], "k--", lw=0.8, label="chance")
        ax.set_xscale(scale)
        ax.set_yscale(scale)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        if scale == "log":
            ax.set_xlim(1e-3, 1)
            ax.set_ylim(1e-3, 1)
            ax.set_title("ROC (log-log)")
        else:
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_title("ROC")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- end to end


def _tokenize_docs(docs: list[dict[str, Any]], tokenizer: Any | None, what: str) -> list[list[int]]:
    out = []
    for i, d in enumerate(docs):
        if "token_ids" in d:
            out.append([int(t) for t in d["token_ids"]])
            continue
        if tokenizer is None:
            raise MissingTokenizerError(
                f"{what}[{i}] ({d.get('id', '?')}) has no token_ids and no tokenizer is "
                "available to tokenize its text; pass --tokenizer PATH")
        out.append(tokenizer(d["text"], add_special_tokens=False)["input_ids"])
    return out


def _same_vocab(a: Any | None, b: Any | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.get_vocab() == b.get_vocab()


#: ``nonmember_source`` values of :func:`run_mia`'s report, and what they mean.
NONMEMBER_SOURCES: dict[str, str] = {
    "exposure0_targets": "the targets with exposures = 0 (never trained on, drawn like the members)",
    "exposure0_targets+heldout_corpus": "the targets with exposures = 0 plus the manifest's held-out "
                                        "corpus documents (targets and both kinds of nonmembers "
                                        "are drawn from the same corpus)",
    "heldout_corpus": "the manifest's held-out corpus documents (the targets are drawn from the "
                      "same corpus)",
    "background_corpus": "held-out documents of the background corpus, NOT the user's target "
                         "documents",
    "manifest_nonmembers": "the manifest's nonmembers (their origin is not recorded)",
}

USER_TARGETS_WARNING = (
    "the targets are user-supplied but none has exposure 0, so the nonmembers are documents of "
    "the background corpus, not of the user's documents: the AUC measures the shift between the "
    "two distributions as well as membership. Rebuild the run with --exposures 0,N so that part "
    "of the user's own documents is held out (exposure 0) and used as the nonmembers."
)


def _targets_source(manifest: dict[str, Any]) -> str:
    """``"user"``, ``"corpus"`` or ``"unknown"``: where the manifest's targets come from
    (``targets_source``, recorded by :mod:`memorization.mixture`; older manifests: the ids)."""
    if manifest.get("targets_source") in ("user", "corpus"):
        return manifest["targets_source"]
    ids = [str(t.get("id", "")) for t in manifest["targets"]]
    if ids and all(i.startswith("user-") for i in ids):
        return "user"
    if ids and all(i.startswith("doc-") for i in ids):
        return "corpus"
    return "unknown"


def select_nonmembers(manifest: dict[str, Any]) -> tuple[list[dict], list[dict], str, list[str]]:
    """``(members, nonmembers, nonmember_source, warnings)`` for a manifest.

    Members are the targets with ``exposures >= 1``.  Nonmembers are the targets with
    ``exposures == 0`` when there are any -- pooled with the manifest's ``nonmembers`` only
    when the targets were drawn from the corpus those come from -- else the manifest's
    ``nonmembers``, with a warning when the targets are user-supplied (the nonmembers are then
    background-corpus documents, a different distribution).  ``nonmember_source`` is a key of
    :data:`NONMEMBER_SOURCES`.
    """
    targets, held_out = manifest["targets"], manifest["nonmembers"]
    members = [t for t in targets if int(t["exposures"]) >= 1]
    controls = [t for t in targets if int(t["exposures"]) == 0]
    if not members:
        raise ValueError("the manifest has no targets with exposures >= 1")
    source = _targets_source(manifest)
    warns: list[str] = []
    if controls:
        if source == "corpus" and held_out:
            return members, controls + held_out, "exposure0_targets+heldout_corpus", warns
        return members, controls, "exposure0_targets", warns
    if not held_out:
        raise ValueError("the manifest has no nonmembers and no exposure-0 targets to compare "
                         "against")
    if source == "user":
        warns.append(USER_TARGETS_WARNING)
        return members, held_out, "background_corpus", warns
    return members, held_out, ("heldout_corpus" if source == "corpus" else "manifest_nonmembers"), warns


def run_mia(
    model_path: str | os.PathLike,
    manifest_path: str | os.PathLike,
    reference_model_path: str | os.PathLike | None = None,
    *,
    out_dir: str | os.PathLike | None = None,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str | None = "auto",
    k: float = 0.2,
    max_length: int | None = None,
    add_bos: bool = True,
    fpr_target: float = 0.01,
    tokenizer_path: str | os.PathLike | None = None,
    grid: str | None = None,
) -> dict[str, Any]:
    """Score the members and nonmembers of a manifest and report how separable they are.

    With ``grid`` (``"D,R,C,Z"``, under torchrun/mpiexec/srun) the models are parallelized on that grid as in
    training, each rank reading only its own shards, and the documents are split over its data x depth
    replicas (:func:`memorization.runtime.map_over_replicas`): every rank returns the report, rank 0 alone
    writes ``out_dir``.

    Members are the targets with ``exposures >= 1``; nonmembers are chosen by
    :func:`select_nonmembers` (the exposure-0 targets when there are any).  The manifest's
    ``token_ids`` are scored as given (``add_bos`` prepends the tokenizer's BOS when a document
    does not start with it; ``max_length`` truncates), and every score covers exactly that
    span: zlib compresses the decoded scored tokens (the manifest's ``text``, the whole
    document, is not used; without a tokenizer zlib is skipped), and a reference model scores
    the same ids, or the decoded span re-tokenised if its vocabulary differs.

    With ``out_dir``: writes ``mia.json`` (the report), ``mia.md`` (a markdown table),
    ``mia_scores.jsonl`` (per-document scores; ``split`` is the document's role, ``target``
    = member or ``nonmember``, and ``from`` the manifest list it comes from) and
    ``mia_roc.png``.

    Returns the report of :func:`mia_report` plus ``model``, ``manifest``,
    ``reference_model``, ``k``, ``n_targets`` (in the manifest), ``n_members``,
    ``n_nonmembers`` (compared), ``nonmember_source``, ``nonmember_description``,
    ``targets_source``, ``warnings`` and ``markdown``.
    """
    # what can be checked without the models is checked before they load
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be a fraction in (0, 1]: 0.2 is 20%, got {k}")
    if not 0.0 < fpr_target < 1.0:
        raise ValueError(f"fpr_target must be a fraction in (0, 1): 0.01 is 1%, got {fpr_target}")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    _check_max_length(max_length, None)
    if max_length is not None and (Path(model_path) / "config.json").is_file():
        from transformers import AutoConfig

        from memorization.models import model_context

        _check_max_length(max_length, model_context(AutoConfig.from_pretrained(str(model_path))))
    device = device or default_device()
    manifest = load_manifest(manifest_path)
    try:
        members, nonmembers, nonmember_source, warns = select_nonmembers(manifest)
    except ValueError as err:
        raise ValueError(f"manifest {manifest_path}: {err}") from None
    for w in warns:
        log.warning("%s", w)
    rt = grid_runtime(grid) if grid else None
    if rt is not None:
        from .runtime import check_replicas

        check_replicas(len(members) + len(nonmembers), rt.grid, "documents")  # before any weight loads
    if rt is None:
        model, tok = load_checkpoint(model_path, device=device, dtype=dtype,
                                     tokenizer_path=tokenizer_path, require_tokenizer=False)
    else:
        model, tok = load_on_grid(model_path, rt, tokenizer_path, "--model")
        device = None  # each rank's own device
    docs = members + nonmembers
    ids = _tokenize_docs(docs, tok, "documents")
    # name a bad document by its manifest id: mia_scores only knows its place in members + nonmembers
    check_vocab(model, ids, f"manifest {manifest_path}",
                 names=[str(d.get("id", i)) for i, d in enumerate(docs)])

    ref_model, ref_tok = None, None
    if reference_model_path is not None and rt is not None:
        ref_model, ref_tok = load_on_grid(reference_model_path, rt, None, "--reference-model")
    elif reference_model_path is not None:
        ref_model, ref_tok = load_checkpoint(reference_model_path, device=device, dtype=dtype,
                                             require_tokenizer=False, flag="--reference-model")
        if ref_tok is not None and tok is None:
            log.warning("the target checkpoint has no tokenizer: assuming the reference model "
                        "shares its vocabulary and scoring the same token ids")

    def score(share: list[list[int]]) -> dict[str, np.ndarray]:
        return mia_scores(model, tok, share, batch_size=batch_size, device=device, reference_model=ref_model,
                          reference_tokenizer=ref_tok, k=k, max_length=max_length, add_bos=add_bos)

    if rt is None:
        scores = score(ids)
    else:
        from memorization.runtime import map_over_replicas

        def rows(share: list[list[int]]) -> list[dict[str, Any]]:
            s = score(share)
            return [{n: v[i] for n, v in s.items()} for i in range(len(share))]

        per_doc = map_over_replicas(rows, ids, rt.grid)
        scores = {n: np.array([r[n] for r in per_doc]) for n in per_doc[0]}
    n_m = len(members)
    member = {n: v[:n_m] for n, v in scores.items()}
    nonmember = {n: v[n_m:] for n, v in scores.items()}
    exposures = [int(t["exposures"]) for t in members]
    report = mia_report(member, nonmember, member_exposures=exposures, fpr_target=fpr_target)
    report.update({
        "model": str(model_path),
        "manifest": str(manifest_path),
        "reference_model": None if reference_model_path is None else str(reference_model_path),
        "k": k,
        "n_targets": len(manifest["targets"]),
        "n_members": n_m,
        "n_nonmembers": len(nonmembers),
        "targets_source": _targets_source(manifest),
        "nonmember_source": nonmember_source,
        "nonmember_description": NONMEMBER_SOURCES[nonmember_source],
        "warnings": warns,
    })
    report["markdown"] = report_markdown(report)
    if rt is not None:
        report["grid"] = grid

    if out_dir is not None and (rt is None or rt.is_main):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "mia.json", "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
        (out / "mia.md").write_text(report["markdown"], encoding="utf-8")
        with open(out / "mia_scores.jsonl", "w", encoding="utf-8") as fh:
            from_targets = {id(t) for t in manifest["targets"]}
            for i, d in enumerate(docs):
                is_target = id(d) in from_targets
                row: dict[str, Any] = {
                    "id": d.get("id", str(i)),
                    "split": "target" if i < n_m else "nonmember",
                    "from": "targets" if is_target else "nonmembers",
                    "exposures": int(d["exposures"]) if is_target else None,
                }
                for n, v in scores.items():
                    x = v[i].item()
                    row[n] = None if isinstance(x, float) and math.isnan(x) else x
                fh.write(json.dumps(row) + "\n")
        plot_roc(member, nonmember, out / "mia_roc.png")
    return report
