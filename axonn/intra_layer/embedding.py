"""Vocabulary-parallel embedding.

``weight[V, H]``: the vocabulary ``V`` is split in contiguous chunks over the
tensor group (row × col, size ``Gr·Gc``, chunk index ``r·Gc + c``); replicated
over depth and data.  Forward: each rank looks up the ids that fall in its
chunk (zeros elsewhere) and the partial embeddings are all-reduced over
row × col; backward is the identity (the output is used identically on every
rank of the tensor group), so each rank's weight gradient is exactly the
gradient of its own rows.  Output: full hidden size, replicated over row/col.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..grid import Grid, get_grid
from ..sharding import ShardSpec, extract
from .primitives import reduce_forward

TENSOR_AXES = ("row", "col")


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, *,
                 grid: Grid | None = None, device=None, dtype=None, init: bool = True):
        super().__init__()
        self.grid = grid = grid or get_grid()
        t = grid.size(TENSOR_AXES)
        if num_embeddings % t:
            raise ValueError(
                f"vocabulary size {num_embeddings} is not divisible by the tensor group (row x col) size "
                f"G_intra_r*G_intra_c={t}; pad the vocabulary to a multiple of {t}")
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        self.local_vocab = num_embeddings // t
        i = grid.index(TENSOR_AXES)
        self.vocab_start, self.vocab_end = i * self.local_vocab, (i + 1) * self.local_vocab
        self.weight_spec = ShardSpec((num_embeddings, embedding_dim),
                                     ((self.vocab_start, self.vocab_end), (0, embedding_dim)),
                                     shard_axes=TENSOR_AXES)
        self.weight = nn.Parameter(torch.empty(self.local_vocab, embedding_dim, device=device, dtype=dtype))
        self.weight._axonn_spec = self.weight_spec
        if init:
            full = torch.empty(num_embeddings, embedding_dim, dtype=self.weight.dtype).normal_()
            if padding_idx is not None:
                full[padding_idx] = 0
            self.load_full(full)

    def axonn_specs(self) -> dict[str, ShardSpec]:
        return {"weight": self.weight_spec}

    @torch.no_grad()
    def load_full(self, weight: torch.Tensor) -> None:
        self.weight.copy_(extract(weight.to(self.weight.dtype), self.weight_spec))

    @torch.compiler.disable  # ends in an all-reduce: eager under torch.compile
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = (ids >= self.vocab_start) & (ids < self.vocab_end)
        local_ids = torch.where(mask, ids - self.vocab_start, torch.zeros_like(ids))
        pad = self.padding_idx
        local_pad = pad - self.vocab_start if pad is not None and self.vocab_start <= pad < self.vocab_end else None
        out = F.embedding(local_ids, self.weight, padding_idx=local_pad)
        out = out * mask.unsqueeze(-1).to(out.dtype)
        return reduce_forward(out, TENSOR_AXES, self.grid)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, local_vocab=[{self.vocab_start}:{self.vocab_end})"
