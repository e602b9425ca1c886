"""Causal-LM loss with Goldfish labels, chunked so full fp32 logits never exist.

For a batch ``x`` of shape (B, T) and labels ``y`` (``-100`` = ignored, incl. Goldfish drops)
the loss is the sum over kept positions of ``-log softmax(W h_{t-1})[y_t]``, where ``h`` is the
backbone's last hidden state and ``W`` the LM head.  The sequence is processed in chunks of
``chunk_tokens`` positions; each chunk's logits are recomputed in backward (activation
checkpointing), so peak memory holds one chunk of logits instead of B*T*V fp32 values.

If the LM head is a vocabulary-parallel ``axonn`` layer, its logits are vocab shards and the
cross-entropy is the vocabulary-parallel one (no gather of the full vocabulary).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .goldfish import IGNORE_INDEX


def _cross_entropy_for(model: torch.nn.Module):
    """Summed CE over kept labels: ``axonn``'s vocabulary-parallel CE when the logits are vocab shards.

    A parallelised LM head (``axonn.parallelize``) splits the vocabulary over the row group and,
    with gradients on, returns this rank's shard of the logits; the CE then all-reduces the
    max, the sum of exponentials and the target logit over the row group instead of
    gathering V logits.  Full logits (serial, or gathered under ``no_grad``) use plain CE.
    """
    grid = getattr(model, "_axonn_grid", None)
    vocab = model.config.vocab_size

    def ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if grid is None or logits.shape[-1] == vocab:
            return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
        from axonn import vocab_parallel_cross_entropy

        return vocab_parallel_cross_entropy(logits, labels, IGNORE_INDEX, reduction="sum", axes="row", grid=grid)

    return ce


def chunked_lm_loss_sum(
    hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor, ce, chunk_tokens: int = 4096
) -> torch.Tensor:
    """Sum of token losses; ``hidden`` (B, T, H) predicts ``labels[:, 1:]`` from positions ``:-1``."""
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = labels[:, 1:].reshape(-1)

    def chunk_loss(hc: torch.Tensor, yc: torch.Tensor) -> torch.Tensor:
        return ce(lm_head(hc).float(), yc)

    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, h.shape[0], chunk_tokens):  # loop over chunks of thousands of tokens
        hc, yc = h[start : start + chunk_tokens], y[start : start + chunk_tokens]
        if torch.is_grad_enabled() and h.shape[0] > chunk_tokens:
            total = total + checkpoint(chunk_loss, hc, yc, use_reentrant=False)
        else:
            total = total + chunk_loss(hc, yc)
    return total


def causal_lm_loss_sum(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    chunk_tokens: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum of token losses, number of kept labels)`` for a HF ``*ForCausalLM`` model."""
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    loss_sum = chunked_lm_loss_sum(out.last_hidden_state, model.lm_head, labels, _cross_entropy_for(model),
                                   chunk_tokens)
    n = (labels[:, 1:] != IGNORE_INDEX).sum()
    return loss_sum, n
