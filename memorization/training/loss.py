"""Causal-LM loss with Goldfish labels, chunked so full fp32 logits never exist.

For a batch ``x`` of shape (B, T) and labels ``y`` (``-100`` = ignored, incl. Goldfish drops)
the loss is the sum over kept positions of ``-log softmax(W h_{t-1})[y_t]``, where ``h`` is the
backbone's last hidden state and ``W`` the LM head.  The positions are processed in chunks of
``chunk_tokens``, so peak memory holds one chunk of logits instead of B*T*V fp32 values:

* a plain ``nn.Linear`` head (serial, or a grid with one rank per tensor axis): fused
  (:class:`_FusedLinearCrossEntropy`): each chunk's gradients ``dL/dh`` and ``dL/dW`` are computed
  in the forward while its logits exist, so no logits are recomputed in the backward;
* a vocabulary-parallel ``axonn`` head (its logits are vocab shards; the cross-entropy is the
  vocabulary-parallel one, no gather of the full vocabulary): each chunk's logits are recomputed
  in the backward (activation checkpointing).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .goldfish import IGNORE_INDEX


def cross_entropy_for(model: torch.nn.Module):
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


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """``Σ_t CE(h_t Wᵀ, y_t)`` over kept labels, its gradients computed chunk by chunk in the forward.

    For a chunk ``c`` of positions, with logits ``Z_c = h_c Wᵀ`` (in the autocast dtype, read as fp32)
    and ``G_c = softmax(Z_c) − onehot(y_c)`` (zero rows where the label is ignored)::

        dL/dh_c = G_c W          dL/dW = Σ_c G_cᵀ h_c   (fp32 sum)

    ``G_c`` is cast to the matmul dtype first, as the autocast backward of ``F.linear`` would do.
    The logits of a chunk exist once (the checkpointed loop makes them twice, and runs the
    ``m × h × V`` head GEMM a fourth time); the backward only scales the stored ``dh`` and ``dW``
    by the incoming gradient. Memory: one chunk's logits and ``G_c``, plus ``dh`` (like ``h``) and an
    fp32 ``dW`` (like the head's gradient) from the forward to the backward.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, chunk_tokens: int,
                matmul_dtype: torch.dtype) -> torch.Tensor:
        w = weight.to(matmul_dtype)
        dh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        total = h.new_zeros((), dtype=torch.float32)
        for start in range(0, h.shape[0], chunk_tokens):  # chunks of thousands of positions
            hc = h[start : start + chunk_tokens].to(matmul_dtype)
            yc = y[start : start + chunk_tokens]
            keep = yc != IGNORE_INDEX
            tgt = yc.clamp(min=0).unsqueeze(1)
            z = (hc @ w.t()).float()
            lse = torch.logsumexp(z, dim=1)
            total = total + ((lse - z.gather(1, tgt).squeeze(1)) * keep).sum()
            z.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
            z.scatter_add_(1, tgt, torch.full_like(lse, -1.0).unsqueeze(1))
            g = z.mul_(keep.unsqueeze(1)).to(matmul_dtype)
            del z  # (the fp32 chunk is freed before the two gradient GEMMs)
            if dh is not None:
                dh[start : start + chunk_tokens] = g @ w
            if dw is not None:
                dw.add_(g.t() @ hc)  # the GEMM's output in the matmul dtype, summed in fp32
        ctx.save_for_backward(dh, dw)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        dh, dw = ctx.saved_tensors
        return (None if dh is None else dh * grad.to(dh.dtype),
                None if dw is None else (dw * grad).to(ctx.weight_dtype), None, None, None)


def fusable(lm_head: torch.nn.Module) -> bool:
    """A plain, bias-free ``nn.Linear`` head (HF Llama's, left unsharded on a trivial tensor grid) with no
    module hooks: the fused loss never calls the module, so hooks on it would silently not run."""
    hooks = (lm_head._forward_hooks, lm_head._forward_pre_hooks, lm_head._backward_hooks,
             lm_head._backward_pre_hooks)
    return type(lm_head) is torch.nn.Linear and lm_head.bias is None and not any(hooks)


def chunked_lm_loss_sum(
    hidden: torch.Tensor, lm_head: torch.nn.Module, labels: torch.Tensor, ce, chunk_tokens: int = 4096,
    fuse: bool = True,
) -> torch.Tensor:
    """Sum of token losses; ``hidden`` (B, T, H) predicts ``labels[:, 1:]`` from positions ``:-1``.

    ``ce(logits, labels)`` is the summed cross-entropy of the chunked (vocabulary-parallel) path; a
    :func:`fusable` head computes the plain one itself (unless ``fuse`` is False: the checkpointed chunks
    then run as for a sharded head), which is what :func:`cross_entropy_for` gives for full logits.
    """
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = labels[:, 1:].reshape(-1)
    if fuse and torch.is_grad_enabled() and fusable(lm_head) and (h.requires_grad or lm_head.weight.requires_grad):
        from axonn.intra_layer.linear import autocast_dtype

        return _FusedLinearCrossEntropy.apply(h, lm_head.weight, y, chunk_tokens, autocast_dtype(h, lm_head.weight))

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
    """``(sum of token losses, number of kept labels)`` for a HF ``*ForCausalLM`` model (its decoder is
    ``model.base_model``: ``model.model``, GPT-NeoX's ``model.gpt_neox``)."""
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    loss_sum = chunked_lm_loss_sum(out.last_hidden_state, model.lm_head, labels, cross_entropy_for(model),
                                   chunk_tokens)
    n = (labels[:, 1:] != IGNORE_INDEX).sum()
    return loss_sum, n
