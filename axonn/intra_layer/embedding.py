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

**Tied to the LM head** (:meth:`Embedding.tied`, for models with ``tie_word_embeddings``: Llama 3.2 1B/3B,
SmolLM2, Qwen2.5's small models, Gemma): the embedding *is* the head's weight, one parameter in the head's
layout (the vocabulary over row, the hidden size over column, the block over depth: see
:class:`~axonn.intra_layer.Linear`).  Each rank looks up the ids in its row's vocabulary rows and its column's
hidden slice; the partial embeddings are all-reduced over row and the column slices all-gathered (output: full
hidden size, replicated over row/col).  Backward: the gather's backward takes this rank's column slice of the
output gradient, and the block's dense gradient is reduce-scattered over depth into the head's weight, where
autograd adds it to the head's own gradient: the shared weight's gradient is the sum over both uses, as in
the serial tied model (whose ``padding_idx`` row also gets no gradient from the lookup).
"""
from __future__ import annotations


import torch
import torch.nn as nn

from ..communication import all_gather, comm_tag
from ..grid import Grid, get_grid
from ..sharding import ShardSpec, extract
from .overlap import reduce_weight_grad
from .primitives import gather, reduce_forward

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
    """Vocabulary-parallel ``nn.Embedding`` over row × column × depth (module doc); :meth:`tied` builds one
    that shares an LM head's weight."""

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
        self.local_vocab, self.local_dim = num_embeddings // t, embedding_dim
        i = grid.index(TENSOR_AXES)
        self.vocab_start, self.vocab_end = i * self.local_vocab, (i + 1) * self.local_vocab
        self.reduce_axes, self.gather_axis = TENSOR_AXES, None
        self._set_padding()
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

    @classmethod
    def tied(cls, head, padding_idx: int | None = None) -> "Embedding":
        """An embedding whose weight is ``head``'s (an :class:`~axonn.intra_layer.Linear` with ``transpose=False``
        whose ``out_features`` is the vocabulary): one parameter, in the head's layout (module doc)."""
        if head.transpose:
            raise ValueError("a tied embedding needs the LM head's layout (transpose=False): vocabulary over row")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.grid = head.grid
        self.num_embeddings, self.embedding_dim, self.padding_idx = head.out_features, head.in_features, padding_idx
        self.local_vocab, self.local_dim = head.local_out, head.local_in
        (self.vocab_start, self.vocab_end), _ = head.weight_spec.block
        self.reduce_axes, self.gather_axis = ("row",), "col"
        self._set_padding()
        self.weight_spec = head.weight_spec
        self.weight = head.weight  # the same Parameter: named_parameters() lists it once, under this module
        self.axonn_name = "embedding"
        return self

    def _set_padding(self) -> None:
        pad = self.padding_idx
        self.local_padding_idx = (pad - self.vocab_start if pad is not None and self.vocab_start <= pad < self.vocab_end
                                  else None)

    def axonn_specs(self) -> dict[str, ShardSpec]:
        return {"weight": self.weight_spec}

    @torch.no_grad()
    def load_full(self, weight: torch.Tensor) -> None:
        self.weight.copy_(extract(weight.to(self.weight.dtype), self.weight_spec))

    def _local_ids(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (ids >= self.vocab_start) & (ids < self.vocab_end)
        return torch.where(mask, ids - self.vocab_start, torch.zeros_like(ids)), mask

    def _chunk(self, w_shard: torch.Tensor) -> torch.Tensor:
        """This tensor coordinate's ``local_vocab × local_dim`` block: the depth shards all-gathered."""
        full = w_shard.detach() if self.grid.size("depth") == 1 else all_gather(w_shard.detach(), "depth", grid=self.grid)
        return full[:self.local_vocab * self.local_dim].view(self.local_vocab, self.local_dim)

    @torch.compiler.disable  # collectives: eager under torch.compile
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # an id outside [0, V) falls in no rank's chunk and would embed to zeros, silently: refuse it
        # as nn.Embedding does (checked on the device: no host synchronisation on a GPU)
        torch._assert_async(((ids >= 0) & (ids < self.num_embeddings)).all(),
                            f"axonn Embedding: token id out of range [0, {self.num_embeddings})")
        with comm_tag(self.axonn_name):
            out = reduce_forward(_EmbeddingFn.apply(ids, self.weight, self), self.reduce_axes, self.grid)
            return out if self.gather_axis is None else gather(out, self.gather_axis, self.grid)

    def extra_repr(self) -> str:
        tied = ", tied to the LM head" if self.gather_axis is not None else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}, local_vocab=[{self.vocab_start}:{self.vocab_end}), "
                f"local_dim={self.local_dim}, depth shard={self.weight.numel()}{tied}")
