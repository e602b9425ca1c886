"""Membership scores of documents under a causal LM: token log-probs and the per-document scores.

The math of each score (``loss``, ``zlib``, ``min_k``, ``min_k_pp``, ``ref_diff``) is in the docstring of
:mod:`memorization.mia`.  All scores are computed in padded batches (right padding + attention mask) with one
forward pass per batch; the per-token work is vectorised.
"""
from __future__ import annotations

import contextlib
import logging
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..eval_model import Docs, as_id_lists, check_vocab, model_device, model_max_length
from ..mixture import is_int

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
    # (N, V) rows, not the (B, V, T) layout: the strided class dimension is much slower on GPU
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


def check_max_length(max_length: int | None, context: int | None) -> None:
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

    check_max_length(max_length, model_context(model))
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



def _same_vocab(a: Any | None, b: Any | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.get_vocab() == b.get_vocab()

