"""Cross-entropy on vocabulary-sharded logits, never materialising the full vocabulary.

``logits_shard[..., V/p]`` holds vocab entries ``[i·V/p, (i+1)·V/p)`` of group rank ``i``
(default group: the row axis, which splits ``lm_head``'s output).  Per token:

1. ``m = max_v logits``: local max, all-reduce(MAX);
2. ``s = Σ_v exp(logit - m)``: local sum, all-reduce(SUM);
3. ``t = logit[label] - m``: taken by the owning rank (0 elsewhere), all-reduce(SUM);
4. ``loss = log s - t``; tokens with ``label == ignore_index`` get loss 0 and zero gradient.

Backward (local, no communication): ``softmax_local - onehot_local(label)`` times the
incoming gradient.  ``reduction="mean"`` divides by the number of non-ignored tokens
(of this rank's micro-batch), like ``F.cross_entropy``; with none it returns 0.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..communication import all_reduce
from ..grid import Grid, get_grid


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, or as it is when wider (float64 logits keep their precision)."""
    return x if x.dtype == torch.float64 else x.float()


def _label_columns(labels: torch.Tensor, nv: int, valid: torch.Tensor | None, axes, grid: Grid):
    """``(idx, local)``: each label's column in this rank's ``nv``-wide vocabulary shard (0 where not owned) and
    whether this rank owns it (and it is ``valid``)."""
    start = grid.index(axes) * nv
    local = (labels >= start) & (labels < start + nv)
    if valid is not None:
        local &= valid
    return torch.where(local, labels - start, torch.zeros_like(labels)), local


def _shifted_sums(logits: torch.Tensor, labels: torch.Tensor, valid: torch.Tensor | None, axes, grid: Grid):
    """Steps 1-3 of the module doc on float32 (or float64) ``logits``: ``(shifted, e, s, t, idx, local)`` with ``shifted =
    logits - m``, ``e = exp(shifted)``, ``s = Σ_v e`` and ``t = shifted[label]`` over the whole vocabulary (three
    all-reduces), ``idx``/``local`` the label's local column and whether this rank owns it (and it is ``valid``)."""
    m = logits.max(dim=-1).values
    all_reduce(m, axes, op=dist.ReduceOp.MAX, grid=grid)
    shifted = logits - m.unsqueeze(-1)
    e = shifted.exp()
    s = e.sum(dim=-1)
    all_reduce(s, axes, grid=grid)
    idx, local = _label_columns(labels, logits.shape[-1], valid, axes, grid)
    t = shifted.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * local
    all_reduce(t, axes, grid=grid)
    return shifted, e, s, t, idx, local


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, ignore_index, axes, grid):
        ctx.in_dtype = logits.dtype
        valid = labels != ignore_index
        _, e, s, t, idx, local = _shifted_sums(_upcast(logits), labels, valid, axes, grid)
        loss = (s.log() - t) * valid
        e.div_(s.unsqueeze(-1))
        ctx.save_for_backward(e, idx, local, valid)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        softmax, idx, local, valid = ctx.saved_tensors
        grad = softmax
        grad.scatter_add_(-1, idx.unsqueeze(-1), -local.unsqueeze(-1).to(grad.dtype))
        grad.mul_((dloss * valid).unsqueeze(-1))
        return grad.to(ctx.in_dtype), None, None, None, None


@torch.compiler.disable  # three all-reduces: eager under torch.compile
def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, labels: torch.Tensor, ignore_index: int = -100,
                                 reduction: str = "mean", axes="row", grid: Grid | None = None) -> torch.Tensor:
    """Cross-entropy of vocab-sharded logits (see module doc). ``reduction`` in {"mean","sum","none"}."""
    grid = grid or get_grid()
    if logits_shard.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits_shard.shape)} and labels {tuple(labels.shape)} disagree")
    vocab = logits_shard.shape[-1] * grid.size(axes)
    # a label outside [0, V) would be owned by no rank and give a wrong loss, silently: refuse it as
    # F.cross_entropy does (checked on the device: no host synchronisation on a GPU)
    torch._assert_async(((labels == ignore_index) | ((labels >= 0) & (labels < vocab))).all(),
                        f"vocab_parallel_cross_entropy: label out of range [0, {vocab}) and not ignore_index")
    loss = _VocabParallelCE.apply(logits_shard, labels, ignore_index, axes, grid)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        n = (labels != ignore_index).sum().clamp(min=1)
        return loss.sum() / n
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


@torch.no_grad()
@torch.compiler.disable  # all-reduces: eager under torch.compile
def vocab_parallel_logprobs(logits_shard: torch.Tensor, targets: torch.Tensor, moments: bool = False,
                            axes="row", grid: Grid | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(log p(target), μ, σ)`` per token from vocab-sharded logits, never the full vocabulary (no autograd).

    With ``lse = m + log Σ_v exp(logit - m)`` (steps 1-2 of the module doc), ``log p(target) = t - log s``
    (step 3) and, with ``moments`` (Min-K%++), ``μ = Σ_v p·log p`` and ``σ² = Σ_v p·(log p - μ)²`` over the
    whole vocabulary: two more all-reduce(SUM)s of local sums, float32 throughout.  ``None`` for μ and σ
    without ``moments``.  Targets must lie in ``[0, V)``.
    """
    grid = grid or get_grid()
    shifted, e, s, t, _, _ = _shifted_sums(_upcast(logits_shard), targets, None, axes, grid)
    del e
    log_s = s.log()
    logp = t - log_s
    if not moments:
        return logp, None, None
    lsm = shifted.sub_(log_s.unsqueeze(-1))  # log p over the local vocabulary, in place
    p = lsm.exp()
    mu = (p * lsm).sum(dim=-1)
    all_reduce(mu, axes, grid=grid)
    var = (p * (lsm - mu.unsqueeze(-1)).square()).sum(dim=-1)  # two-pass: no cancellation
    all_reduce(var, axes, grid=grid)
    return logp, mu, var.sqrt()


@torch.no_grad()
@torch.compiler.disable  # all-reduces: eager under torch.compile
def vocab_parallel_is_max(logits_shard: torch.Tensor, targets: torch.Tensor, axes="row",
                          grid: Grid | None = None) -> torch.Tensor:
    """Per token, whether the target's logit is the largest of the whole vocabulary (greedy decoding would pick
    it; a tie counts), from vocab-sharded logits: the global max (all-reduce MAX) against the target's logit
    (all-reduce SUM of the one owner's value), never the full vocabulary.  Targets must lie in ``[0, V)``."""
    grid = grid or get_grid()
    m = _upcast(logits_shard.max(dim=-1).values)
    all_reduce(m, axes, op=dist.ReduceOp.MAX, grid=grid)
    idx, local = _label_columns(targets, logits_shard.shape[-1], None, axes, grid)
    t = _upcast(logits_shard.gather(-1, idx.unsqueeze(-1)).squeeze(-1)) * local
    all_reduce(t, axes, grid=grid)
    return t >= m
