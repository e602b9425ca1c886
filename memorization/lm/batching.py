"""Token-id lists as one padded batch: right padding for scoring, left padding (with position ids) for decoding."""
from __future__ import annotations

from collections.abc import Sequence

import torch


def pad_batch(seqs: Sequence[Sequence[int]], device: torch.device | str | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id lists into ``(input_ids, attention_mask)`` of shape ``(B, max_len)``.

    The pad id is 0; padded positions are excluded by the attention mask and by every statistic computed from
    the batch, so its value never matters."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids.to(device), mask.to(device)


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str | None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` of left-padded ``seqs`` (pad id ``pad_id``): every row ends at
    the last column, so one decoding step appends to all rows at once; position ids count real tokens from 0."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, T - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[r, T - len(s):] = 1
    ids, mask = ids.to(device), mask.to(device)
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)
