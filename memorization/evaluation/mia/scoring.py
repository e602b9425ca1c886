"""Membership scores of documents under a causal LM: token log-probs and the per-document scores.

The math of each score (``loss``, ``zlib``, ``min_k``, ``min_k_pp``, ``ref_diff``) is in the docstring of
:mod:`memorization.evaluation.mia`.  The token log-probs are :meth:`memorization.lm.LM.token_logprobs`' (padded batches,
one forward pass per batch); the per-token work is vectorised.
"""
from __future__ import annotations

import logging
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..eval_model import Docs, as_id_lists, check_vocab, model_device, model_max_length
from memorization.lm import LM
from memorization.data.mixture import is_int

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
    lm: LM,
    docs: list[list[int]],
    *,
    batch_size: int,
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
    check_vocab(lm.model, docs, desc)
    # documents with fewer than 2 tokens score nothing (NaN): a batch of only such documents
    # would be a zero-width forward pass, which the model cannot run
    order = sorted((i for i in range(n_docs) if len(docs[i]) >= 2), key=lambda i: -len(docs[i]))
    starts = range(0, len(order), batch_size)
    for s in tqdm(starts, desc=desc, unit="batch", disable=len(starts) <= 1):
        idx = order[s : s + batch_size]
        logp, z, valid = lm.token_logprobs([docs[i] for i in idx], standardise=True)
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
    from memorization.training.models import model_context

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

    out = _score_with_model(LM(model, tokenizer, device=dev), ids, batch_size=batch_size, k=k, desc="MIA scores")
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
        ref = _score_with_model(LM(reference_model, reference_tokenizer), ref_ids, batch_size=batch_size, k=k,
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

