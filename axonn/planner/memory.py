r"""Memory per GPU of a Llama-family model trained by this project's trainer on a 4D AxoNN grid.

The formulas describe what :class:`memorization.train.Trainer` allocates, term by term, and
were fitted to and are checked against ``memorization.memory_trace`` (the real training step
traced op by op under fake tensors: ``benchmarks/memory_validation.py``, tests in
``tests/test_memory_model.py``).  Notation as in :mod:`axonn.planner.model`: grid ``(D, R, C, Z)``,
per-GPU micro-batch ``b``, sequence ``s``, local tokens ``m = b·s``, hidden ``h``, FFN ``f``, KV
width ``kv = kv_heads·head_dim``, vocabulary ``V``, layers ``L``, loss chunk ``c = min(m,
chunk_tokens)``.  All figures are bytes on one rank.

The recipe: fp32 parameters, fp32 gradients, fp32 AdamW moments, bf16 autocast.  Hugging
Face's Llama keeps the residual stream and the RMSNorm outputs in fp32 under autocast (the
embedding is fp32); matmul outputs are bf16.  Two layouts:

* **R = C = Z = 1** (``axonn.parallelize`` keeps HF's modules).  Autocast's cast of each Linear
  weight to bf16 is cached for the forward and saved for backward: ``2·P_lin`` more (``P_lin`` =
  every Linear incl. lm_head).  Each Linear saves its own bf16 cast of its input.  Saved per
  layer: residuals and normalised hidden in fp32 (16 B·h), five bf16 input casts (10 B·h), q and
  the attention output (4 B·h), k, v (4 B·kv), gate, up, silu, product (8 B·f), LSE (4 B·heads)::

      A = m·(30h + 4kv + 8f + 4·heads)

* **otherwise** (axonn's tensor-parallel Linear).  The residual stream stays full-width and
  fp32 (replicated over row and column); each non-transposed Linear saves its fp32 input shard
  (``drop`` over column), the others their bf16 inputs; weights are cast inside the layer, so
  no bf16 copies live across layers::

      A = m·(16h + 8h/C + 4h/R + 4kv/R + 8f/R + 4·heads/R)

States (every rank, the data axis replicates them): ``16 B × (P_lin/(R·C·Z) + V·h/(R·C) + P_norm)``
(the embedding is split over row × column only).  With ``D·Z > 1`` the gradient all-reduce
flattens one bucket of at most 64 Mi fp32 elements at a time.  Depth buffers (Z > 1): the Linear being
back-propagated holds its gathered weight in bf16 and its unreduced weight gradient in bf16 and
fp32, ``8 B`` per element of its local block; the largest is the LM head, ``8·V·h/(R·C)``.

Activations: without checkpointing, ``L·A`` plus ``8·m·h + 8·m·h/C`` (embedding output, final
norm, the loss's shifted input and its gradient), at the start of the loss's backward.  With
checkpointing each layer keeps only its fp32 input, ``L·4·m·h`` in HF's layout and
``L·4·m·h/(R·C)`` in axonn's (the slice :mod:`axonn.checkpointing` keeps), plus ``8·m·h``
around the loss, and the peak is the largest of four moments: the end of the forward (HF's
cached bf16 weights, the forward logits ``8·c·V/R``), the loss's backward (logits ``12·c·V/R``),
the backward of one recomputed layer (``A``, plus that layer's bf16 weights in HF's layout or
its all-gathered ``4·m·h`` input and the depth buffers in axonn's), and the gradient all-reduce
(one bucket).

Logits (one chunk of ``c`` tokens at a time, ``V/R`` columns): the fp32 logits, log-softmax
and its gradient, ``12·c·V/R``.

Total = states + buffers + activations + logits; it fits when it is at most
``memory·usable_fraction − reserved`` of the profile (the reserve covers the CUDA context,
allocator rounding and library workspaces, which no trace sees).  The activation terms count
one micro-step while the gradients of earlier micro-steps are live: exact for steps of two or
more micro-steps, an over-estimate of up to ``4 B × parameters`` for a single micro-step.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from axonn.presets import ModelShape

from axonn.parallelize import GRAD_BUCKET_ELEMENTS

from .model import Grid, layer_linears, lm_head

GIB = 1024**3


@dataclass(frozen=True)
class MemoryConfig:
    """Byte counts of the trainer's recipe (fp32 weights, gradients and AdamW state; bf16 autocast)."""

    bytes_per_param: int = 16        # fp32 weight + fp32 gradient + 2 × fp32 AdamW moment
    chunk_tokens: int = 4096         # the loss's chunk (TrainConfig.chunk_tokens)
    gathered_bytes: int = 8          # depth, per local-block element: bf16 weight, bf16 and fp32 unreduced gradient


@dataclass
class MemoryBreakdown:
    """Bytes per GPU by category."""

    states: float
    buffers: float
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return self.states + self.buffers + self.activations + self.logits

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def param_counts(shape: ModelShape) -> tuple[int, int, int]:
    """``(P_lin, P_norm, P_layer)``: every Linear (incl. lm_head), the RMSNorm weights, one layer's Linears."""
    p_layer = sum(lin.params for lin in layer_linears(shape))
    p_lin = shape.layers * p_layer + lm_head(shape).params
    p_norm = 2 * shape.layers * shape.hidden + shape.hidden
    return p_lin, p_norm, p_layer


def hf_layout(grid: Grid) -> bool:
    """True when nothing is sharded (R = C = Z = 1): ``axonn.parallelize`` keeps HF's own modules."""
    return grid.row == grid.column == grid.depth == 1


def activation_bytes_per_layer(shape: ModelShape, grid: Grid, seq: int, micro_batch: int,
                               cfg: MemoryConfig | None = None) -> float:
    """``A`` of the module docstring: what one decoder layer saves for backward in one micro-step."""
    R, C = grid.row, grid.column
    m = micro_batch * seq
    h, f, nh = shape.hidden, shape.ffn, shape.heads
    kv = shape.kv_heads * shape.head_dim
    if hf_layout(grid):
        return m * (30 * h + 4 * kv + 8 * f + 4 * nh)
    return m * (16 * h + 8 * h / C + (4 * h + 4 * kv + 8 * f + 4 * nh) / R)


def memory_per_gpu(shape: ModelShape, grid: Grid, seq: int, micro_batch: int,
                   activation_checkpointing: bool = True,
                   cfg: MemoryConfig | None = None) -> MemoryBreakdown:
    """Bytes per GPU at the step's peak (equations in the module docstring)."""
    cfg = cfg or MemoryConfig()
    _, R, C, Z = grid
    h, L, V = shape.hidden, shape.layers, shape.vocab
    p_lin, p_norm, p_layer = param_counts(shape)
    hf = hf_layout(grid)
    states = cfg.bytes_per_param * (p_lin / (R * C * Z) + V * h / (R * C) + p_norm)
    m = micro_batch * seq
    a_layer = activation_bytes_per_layer(shape, grid, seq, micro_batch, cfg)
    c = min(m, cfg.chunk_tokens)
    logits_fwd, logits_bwd = 8 * c * V / R, 12 * c * V / R  # fp32 logits + log-softmax (+ its gradient)
    bf16_weights = 2 * p_lin if hf else 0.0  # HF layout: autocast's cached casts
    largest = max([lin.params for lin in layer_linears(shape)] + [V * h])
    gathered = cfg.gathered_bytes * largest / (R * C) if Z > 1 else 0.0
    # gradient all-reduce over data x depth (sync_gradients): one flattened bucket at a time
    sync = (0.0, 0.0, 0.0) if grid.data * Z == 1 else (min(4.0 * GRAD_BUCKET_ELEMENTS, states / 4), 0.0, 0.0)
    if not activation_checkpointing:
        # the peak is where the loss's backward starts: every layer's activations are still saved
        moment = (bf16_weights, L * a_layer + 8 * m * h + 8 * m * h / C, logits_bwd)
        return MemoryBreakdown(states, *max(moment, sync, key=sum))
    # each layer's fp32 input (axonn layout: a 1/(R·C) slice, axonn.checkpointing); the final norm's output
    # and the loss's input
    inputs = L * 4 * m * h / (R * C) + 8 * m * h
    moments = [  # (buffers, activations, logits) live at the candidate peaks; the largest counts
        (bf16_weights, inputs, logits_fwd),  # end of forward (HF's bf16 weight cache still held)
        (0.0, inputs, logits_bwd),  # the loss's backward
        # recomputing and back-propagating a layer (axonn layout: from its all-gathered input)
        (2 * p_layer if hf else gathered, inputs + a_layer + (0 if hf else 4 * m * h), 0.0),
        sync,
    ]
    buffers, acts, logits = max(moments, key=sum)
    return MemoryBreakdown(states=states, buffers=buffers, activations=acts, logits=logits)
