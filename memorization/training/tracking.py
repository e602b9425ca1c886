"""Memorization during training: every N steps, extraction on a fixed sample of the targets and their loss.

At a tracking step the model decodes each tracked target's suffix from its prefix (greedy, the run's extraction
settings: :func:`memorization.evaluation.extraction.extract`) and scores the target's tokens ``x_1..x_T`` (``x_0`` its
BOS):

    target_loss  = (1 / T) sum_t -log p(x_t | x_<t)            over every label
    kept_loss    = the same mean over the labels the Goldfish mask keeps
    dropped_loss = the same mean over the labels it drops

token-weighted over the tracked targets.  The mask is the run's Goldfish configuration applied to the target as
it is trained: a target starts its training row, so each of its labels is decided by its own tokens only
(:func:`memorization.training.goldfish.goldfish_mask` on the target alone gives the decisions of every exposure).  For
the standard arm (and the equal-supervised-tokens control) these are the labels Goldfish *would* drop, so the arms can
be compared on the same tokens: under Goldfish the dropped labels' loss stays high while the kept ones' falls.
"""
from __future__ import annotations

import random
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from memorization.evaluation.extraction import ExtractionConfig, extract, trained
from .goldfish import IGNORE_INDEX, GoldfishConfig, goldfish_mask
from .loss import chunked_lm_loss_sum, cross_entropy_for
from memorization.lm import pad_batch

#: a tracking record's metrics besides its ``step``
TRACK_KEYS = ("exact_match", "token_match", "prefix_match", "target_loss", "kept_loss", "dropped_loss")


def tracked_targets(targets: list[dict], count: int = 0, seed: int = 0) -> list[dict]:
    """The targets tracked during training: the trained ones (exposure > 0), all when ``count`` is 0, else a
    sample of ``count`` of them (the same for a seed, in manifest order)."""
    pool = trained(targets)
    if not count or count >= len(pool):
        return pool
    keep = set(random.Random(seed).sample(range(len(pool)), count))
    return [t for i, t in enumerate(pool) if i in keep]


def goldfish_label_masks(ids: torch.Tensor, lengths: torch.Tensor, gf: GoldfishConfig
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(kept, dropped)`` bool masks of the labels of right-padded target rows ``ids`` (``lengths`` tokens each,
    BOS first): the labels ``1..T-1`` each row has, split by the Goldfish mask ``gf`` gives a row that starts with
    the target (everything kept when ``gf`` is the standard loss; ``gf.randomize`` is not consulted: the
    equal-tokens control is split by the Goldfish arm's positions too)."""
    T = ids.shape[1]
    real = torch.arange(T, device=ids.device)[None] < lengths[:, None]
    real[:, 0] = False  # the BOS is predicted by nothing
    if gf.k == 0:
        return real, torch.zeros_like(real)
    drop = goldfish_mask(ids, gf.k, gf.h, gf.strategy, gf.seed, torch.zeros_like(ids, dtype=torch.int32),
                         gf.doc_start)
    return real & ~drop, real & drop


@torch.no_grad()
def target_losses(model: torch.nn.Module, targets: list[dict], gf: GoldfishConfig, device: torch.device,
                  batch_size: int = 32, autocast=nullcontext) -> dict[str, float | None]:
    """``target_loss``, ``kept_loss`` and ``dropped_loss`` (module docstring) of ``targets`` (manifest records:
    ``token_ids`` from the BOS) under ``model``; None for a mean over no label (no drop under the standard
    loss).  Every rank of a grid passes the same targets (the sharded head's cross-entropy reduces over the row
    group)."""
    was_training = model.training
    model.eval()
    ce = cross_entropy_for(model)
    sums = torch.zeros(3, 2, dtype=torch.float64)
    for i in range(0, len(targets), batch_size):
        ids, attention = pad_batch([t["token_ids"] for t in targets[i : i + batch_size]], device)
        kept, dropped = goldfish_label_masks(ids, attention.sum(1), gf)
        with autocast():
            hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
            for j, mask in enumerate((kept | dropped, kept, dropped)):
                loss = chunked_lm_loss_sum(hidden, model.lm_head, ids.masked_fill(~mask, IGNORE_INDEX), ce)
                sums[j] += torch.tensor([float(loss), float(mask[:, 1:].sum())], dtype=torch.float64)
    model.train(was_training)
    return {name: (float(s / n) if n else None) for name, (s, n) in
            zip(("target_loss", "kept_loss", "dropped_loss"), sums.tolist())}


@dataclass
class Tracker:
    """Called by the trainer at its tracking steps: extraction and :func:`target_losses` of ``targets``."""

    targets: list[dict]
    extraction: ExtractionConfig
    goldfish: GoldfishConfig  # the run's Goldfish settings (also for the standard arm: the labels it would drop)

    def __call__(self, model: torch.nn.Module, device: torch.device, autocast=nullcontext) -> dict:
        was_training = model.training
        with autocast():
            ext = extract(model, self.targets, replace(self.extraction, samples=0, skip_short=True))
        o = ext["overall"]
        out = {"exact_match": o["exact_match"], "token_match": o["token_match"], "prefix_match": o.get("prefix_match"),
               **target_losses(model, self.targets, self.goldfish, device, self.extraction.batch_size, autocast)}
        model.train(was_training)
        return out
