"""Token log-probabilities of a causal LM from one forward pass of a right-padded batch.

For a sequence ``x_1..x_T`` the forward gives ``log p(x_t | x_<t)`` for ``t = 2..T`` (``logp[:, t-2]``).  With an
axonn grid whose LM head splits the vocabulary over more than one rank the log-probs (and Min-K%++'s moments) come
from each rank's shard of the logits (:func:`axonn.intra_layer.vocab_parallel_logprobs`): no rank gathers the
whole vocabulary.  Otherwise the float32 upcast runs in row groups of at most :data:`LOGIT_CHUNK_ELEMENTS` logits
(a 128k vocabulary makes one row's float32 log-softmax GBs).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from .batching import pad_batch

#: Logit elements converted to float32 log-probs at once (2^28 floats = 1 GiB).
LOGIT_CHUNK_ELEMENTS = 1 << 28


def vocab_sharded_head(model: torch.nn.Module):
    """The model's LM head if it is an axonn Linear whose output (the vocabulary) is split over more than one
    rank, else None: then log-probs come from its shards (:func:`axonn.intra_layer.vocab_parallel_logprobs`),
    never the gathered vocabulary."""
    from axonn.intra_layer import Linear

    head = getattr(model, "lm_head", None)
    return head if isinstance(head, Linear) and head.grid.size(head.out_axis) > 1 else None


@torch.no_grad()
def token_stats(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                standardise: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(logp, z, valid)`` of one forward pass, each ``(B, T-1)``: ``logp[b, t-1] = log p(x_t | x_<t)`` in
    float32, ``valid[b, t-1]`` true where both ``x_{t-1}`` and ``x_t`` are real (unpadded) tokens, and with
    ``standardise`` Min-K%++'s ``z_t = (log p_t - mu_t) / sigma_t`` (``mu_t``, ``sigma_t``: mean and standard
    deviation of ``log p(v | x_<t)`` under ``p(v | x_<t)``; 0 where ``sigma_t = 0``); None without."""
    head = vocab_sharded_head(model)
    with head.sharded_output() if head is not None else contextlib.nullcontext():
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    logits = out.logits[:, :-1]
    targets = input_ids[:, 1:]
    valid = attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()
    if head is not None:  # a grid's LM head: log-probs (and Min-K%++'s moments) from the row shards
        from axonn.intra_layer import vocab_parallel_logprobs

        rows = max(1, LOGIT_CHUNK_ELEMENTS // max(1, 2 * logits.size(1) * logits.size(2)))
        logps, zs = [], []
        for chunk, tgt in zip(logits.split(rows), targets.split(rows)):
            lp, mu, sigma = vocab_parallel_logprobs(chunk, tgt, moments=standardise, axes=head.out_axis,
                                                    grid=head.grid)
            logps.append(lp)
            if standardise:
                zs.append(torch.where(sigma > 0, (lp - mu) / sigma.clamp(min=1e-30), torch.zeros_like(lp)))
        return torch.cat(logps), torch.cat(zs) if standardise else None, valid
    if standardise:  # log_softmax, its probabilities and two products: ~4 float32 copies of a row group
        rows = max(1, LOGIT_CHUNK_ELEMENTS // max(1, 2 * logits.size(1) * logits.size(2)))
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
    rows = max(1, LOGIT_CHUNK_ELEMENTS // max(1, logits.size(1) * logits.size(2)))
    # (N, V) rows, not the (B, V, T) layout: the strided class dimension is much slower on GPU
    nll = torch.cat([
        F.cross_entropy(chunk.float().reshape(-1, chunk.size(-1)), tgt.reshape(-1),
                        reduction="none").view_as(tgt)
        for chunk, tgt in zip(logits.split(rows), targets.split(rows))
    ])
    return -nll, None, valid


@torch.no_grad()
def continuation_scores(model: torch.nn.Module, seqs: list[list[int]], cont_lens: list[int]
                        ) -> list[tuple[float, bool]]:
    """``(Σ log p(continuation), every continuation token is the argmax)`` of each sequence, one forward pass:
    ``seqs[b]`` is the model's input followed by one more token, its last ``cont_lens[b]`` tokens the
    continuation.  A vocabulary-sharded head is never gathered (:func:`axonn.intra_layer.vocab_parallel_is_max`
    tells the argmax from the shards)."""
    ids, mask = pad_batch(seqs, next(model.parameters()).device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    head = vocab_sharded_head(model)
    with head.sharded_output() if head is not None else contextlib.nullcontext():
        logits = model(input_ids=inputs, attention_mask=mask[:, :-1], use_cache=False).logits
    if head is not None:
        from axonn.intra_layer import vocab_parallel_is_max, vocab_parallel_logprobs

        logp, _, _ = vocab_parallel_logprobs(logits, targets, axes=head.out_axis, grid=head.grid)
        top = vocab_parallel_is_max(logits, targets, axes=head.out_axis, grid=head.grid)
    else:
        lsm = logits.float().log_softmax(-1)
        logp = lsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        top = lsm.argmax(-1) == targets
    out = []
    for b, (s, m) in enumerate(zip(seqs, cont_lens)):
        last = len(s) - 1  # targets[b, :last] are real
        out.append((float(logp[b, last - m:last].sum()), bool(top[b, last - m:last].all())))
    return out


def window_spans(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """Sliding windows over a document of ``n_tokens`` tokens (the rolling log-likelihood's).

    Returns ``(begin, end, first)`` triples: the window is ``x[begin:end]`` and its targets
    ``x[begin+first : end]`` are scored.  The first window is ``x[0:min(L, n)]`` and scores
    tokens ``1..end-1``; each next window scores the next ``S`` tokens (fewer at the end) and
    is the ``L`` tokens ending at its last target, so every scored token sees at least
    ``L - S >= 1`` tokens of context.  Together the windows score tokens ``1 .. n-1``
    exactly once each.  Requires ``1 <= S <= L - 1``.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    if not 1 <= stride <= max_length - 1:
        raise ValueError(
            f"stride must be in [1, max_length - 1 = {max_length - 1}] so that every scored "
            f"token has context, got {stride}")
    if n_tokens < 2:
        return []
    end = min(max_length, n_tokens)
    spans: list[tuple[int, int, int]] = [(0, end, 1)]
    while end < n_tokens:
        prev_end, end = end, min(end + stride, n_tokens)
        begin = max(0, end - max_length)
        spans.append((begin, end, prev_end - begin))
    return spans
