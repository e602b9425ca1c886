"""Vocabulary-parallel embedding, sharded over row × column × depth.

``weight[V, H]``: the vocabulary ``V`` is split in contiguous chunks over the tensor group
(row × col, size ``Gr·Gc``, chunk index ``r·Gc + c``); that ``V/(Gr·Gc) × H`` chunk is flattened,
zero-padded to a multiple of ``Gz`` and split again over the **depth** group, exactly like a
:class:`~axonn.intra_layer.Linear` weight.  The parameter ``weight`` is this rank's 1-D depth
shard (replicated over data only), so the embedding's weight, gradient and AdamW state cost
``16 B·V·H/(Gr·Gc·Gz)`` per rank instead of ``16 B·V·H/(Gr·Gc)``.

Forward: all-gather the chunk over depth; each rank looks up the ids that fall in its chunk
(zeros elsewhere) and the partial embeddings are all-reduced over row × col (output: full
hidden size, replicated over row/col).  Backward: the all-reduce's backward is the identity (the
output is used identically on every rank of the tensor group); the chunk's dense gradient is
built from this rank's tokens and reduce-scattered over depth (summing the depth ranks'
different micro-batches), as a Linear's weight gradient is; :func:`axonn.sync_gradients` then
averages it over data.
"""
from __future__ import annotations


import torch
import torch.nn as nn

from ..communication import all_gather, comm_tag
from ..grid import Grid, get_grid
from ..sharding import ShardSpec, extract
from .overlap import reduce_weight_grad
from .primitives import reduce_forward

TENSOR_AXES = ("row", "col")


class _EmbeddingFn(torch.autograd.Function):
    """``out[t] = chunk[ids[t] − start]`` for ids in this rank's chunk, 0 elsewhere."""

    @staticmethod
    def forward(ctx, ids, w_shard, layer):
        local_ids, mask = layer._local_ids(ids)
        out = layer._chunk(w_shard)[local_ids]
        out.masked_fill_(~mask.unsqueeze(-1), 0)
        ctx.save_for_backward(local_ids, mask)
        ctx.layer = layer
        return out

    @staticmethod
    def backward(ctx, dout):
        layer = ctx.layer
        local_ids, mask = ctx.saved_tensors
        dout = dout.masked_fill(~mask.unsqueeze(-1), 0)
        pad = layer.local_padding_idx
        with comm_tag(layer.axonn_name):
            # the same kernel as F.embedding's backward (rows of padding_idx get no gradient); no
            # reference is kept to its output, which reduce_weight_grad frees once it is cast
            dw = reduce_weight_grad(torch.ops.aten.embedding_dense_backward(
                dout, local_ids, layer.local_vocab, -1 if pad is None else pad, False),
                layer.weight, layer.weight_spec.padded_len, layer.grid)
        return None, dw, None


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
        pad = padding_idx
        self.local_padding_idx = pad - self.vocab_start if pad is not None and self.vocab_start <= pad < self.vocab_end else None
        self.weight_spec = ShardSpec.depth_sharded((num_embeddings, embedding_dim),
                                                   ((self.vocab_start, self.vocab_end), (0, embedding_dim)),
                                                   grid.size("depth"), grid.index("depth"), ("depth",) + TENSOR_AXES)
        self.weight = nn.Parameter(torch.empty(self.weight_spec.local_numel, device=device, dtype=dtype))
        self.weight._axonn_spec = self.weight_spec
        self.axonn_name = "embedding"  # label for the communication byte counter (set by parallelize)
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

    def _local_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (ids >= self.vocab_start) & (ids < self.vocab_end)
        return torch.where(mask, ids - self.vocab_start, torch.zeros_like(ids)), mask

    def _chunk(self, w_shard: torch.Tensor) -> torch.Tensor:
        """This tensor coordinate's ``local_vocab × H`` rows: the depth shards all-gathered."""
        full = w_shard.detach() if self.grid.size("depth") == 1 else all_gather(w_shard.detach(), "depth", grid=self.grid)
        return full[:self.local_vocab * self.embedding_dim].view(self.local_vocab, self.embedding_dim)

    @torch.compiler.disable  # collectives: eager under torch.compile
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # an id outside [0, V) falls in no rank's chunk and would embed to zeros, silently: refuse it
        # as nn.Embedding does (checked on the device: no host synchronisation on a GPU)
        torch._assert_async(((ids >= 0) & (ids < self.num_embeddings)).all(),
                            f"axonn Embedding: token id out of range [0, {self.num_embeddings})")
        with comm_tag(self.axonn_name):
            return reduce_forward(_EmbeddingFn.apply(ids, self.weight, self), TENSOR_AXES, self.grid)

    def extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.embedding_dim}, local_vocab=[{self.vocab_start}:{self.vocab_end}), "
                f"depth shard={self.weight.numel()}")
