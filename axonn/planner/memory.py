r"""Memory per GPU of a Llama-family model trained by this project's trainer on a 4D AxoNN grid.

The formulas describe what :class:`memorization.training.train.Trainer` allocates, term by term, and
were fitted to and are checked against ``memorization.training.memory_trace`` (the real training step
traced op by op under fake tensors: ``benchmarks/memory_validation.py``, tests in
``tests/axonn/planner/test_memory.py``).  Notation as in :mod:`axonn.planner.model`: grid ``(D, R, C, Z)``,
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

States (every rank, the data axis replicates them): ``16 B × ((P_lin + V·h)/(R·C·Z) + P_norm)``
(the embedding is split over row × column and depth, like a Linear).  Gradients travel in the wire
dtype ``w`` (``grad_reduce_bytes``: 4 B fp32 by default, 2 B with ``TrainConfig.grad_reduce_dtype =
"bf16"``).  With ``D·Z > 1`` the gradient all-reduce flattens one bucket of at most 64 Mi
elements at a time (``w`` B each).  Depth buffers (Z > 1): the Linear being back-propagated
holds its gathered weight in bf16, its unreduced weight gradient in bf16 and that gradient's
cast to the wire dtype (none for bf16), ``8 B`` per element of its local block (``4 B`` in bf16); the
largest is the LM head, ``8·V·h/(R·C)``.  With the trainer's overlap, up to two earlier Linears'
reduce-scatters are in flight, each holding its input in the wire dtype, and the next Linear's
bf16 weight is being prefetched: ``2w + 2`` B (10 B fp32, 6 B bf16) per element of the
largest decoder-layer block more while a layer back-propagates (``axonn.intra_layer.overlap``; all
are finished when a backward pass ends; nothing is in flight yet when the LM head runs, so the
buffers are the larger of the two), and ``2 B`` per element (a prefetched weight) in the loss's
backward.  The embedding's chunk (``4·V·h/(R·C)``, fp32) is all-gathered at the start of the forward and
its dense gradient built at the end of the backward, two moments of their own.

Activations: without checkpointing, ``L·A`` plus ``8·m·h + 8·m·h/C`` (embedding output, final
norm, the loss's shifted input and its gradient), at the start of the loss's backward.  With
checkpointing each layer keeps only its fp32 input, ``L·4·m·h`` in HF's layout and
``L·4·m·h/(R·C)`` in axonn's (the slice :mod:`axonn.recompute` keeps), plus ``8·m·h``
around the loss, and the peak is the largest of four moments: the end of the forward (HF's
cached bf16 weights, the loss's forward), the loss's backward,
the backward of one recomputed layer (``A`` and an RMSNorm backward's two fp32 ``m × h`` temporaries, plus that layer's bf16 weights in HF's layout or
its all-gathered ``4·m·h`` input and the depth buffers in axonn's), and the gradient all-reduce
(one bucket).

Logits (one chunk of ``c`` tokens at a time, ``V/R`` columns): in axonn's layout the fp32 logits, log-softmax
and its gradient, ``12·c·V/R`` in the loss's backward (``8·c·V/R`` in its forward).  In HF's layout the loss is
fused (:mod:`memorization.training.loss`): its forward holds a chunk's bf16 logits and their fp32 copy, the chunk's bf16
input and the fp32 ``dW``, ``6·c·V + 4·V·h + 2·c·h``; its backward the stored ``dW`` and ``dh`` and their scaled
copies, ``8·V·h + 4·m·h`` beyond ``dh``.  Without checkpointing the loss's forward and backward are both moments.

Families.  The parameter counts (``P_lin``, ``P_norm``: norms and Linear biases) come from the family's
parallel plan (:mod:`axonn.plans`); the activation terms ``A`` are Llama's block (SwiGLU, pre-norms) for
every family, an approximation for the others (GPT-NeoX's GELU MLP saves less, OLMo 2's and Qwen3's
q/k norms save a little more); only Llama's are validated against traces.

Total = states + buffers + activations + logits; it fits when it is at most
``memory·usable_fraction − reserved`` of the profile (the reserve covers the CUDA context,
allocator rounding and library workspaces, which no trace sees).

Micro-steps.  With two or more forward/backward passes per optimizer step, the gradients of the
earlier passes (``4 B`` of the ``16 B`` per parameter) are live through the last one, at every
moment above.  With one (the planner's picks at the paper's batch), the forward holds no gradient
at all, the loss's backward only the LM head's, and the backward walks from the last layer to the
first, freeing each layer's activations as it produces that layer's gradients; the peak is then at
the start of the backward or at the first layer, so the moments are those two ends with the
gradients produced by then (the ``states`` of the breakdown count only those).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from axonn.grid_shape import GridShape
from axonn.presets import ModelShape

from axonn.parallelize import GRAD_BUCKET_ELEMENTS

from .model import layer_linears, lm_head, block_replicated_params, replicated_params

GIB = 1024**3


@dataclass(frozen=True)
class MemoryConfig:
    """Byte counts of the trainer's recipe (fp32 weights, gradients and AdamW state; bf16 autocast)."""

    bytes_per_param: int = 16        # fp32 weight + fp32 gradient + 2 × fp32 AdamW moment
    chunk_tokens: int = 4096         # the loss's chunk (TrainConfig.chunk_tokens)
    grad_reduce_bytes: int = 4       # gradients on the wire (TrainConfig.grad_reduce_dtype): 4 fp32, 2 bf16

    @property
    def gathered_bytes(self) -> int:
        """Depth, per local-block element: bf16 weight, bf16 unreduced gradient (and its fp32 cast)."""
        return 4 + (self.grad_reduce_bytes if self.grad_reduce_bytes != 2 else 0)

    @property
    def in_flight_bytes(self) -> int:
        """Overlap (TrainConfig.overlap): 2 reduce-scatter inputs in the wire dtype + 1 prefetched bf16 weight."""
        return 2 * self.grad_reduce_bytes + 2


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
    """``(P_lin, P_norm, P_layer)``: every Linear (incl. lm_head), the replicated parameters (norms, biases),
    one layer's Linears; from the family's parallel plan (:mod:`axonn.plans`)."""
    p_layer = sum(lin.params for lin in layer_linears(shape))
    p_lin = shape.layers * p_layer + lm_head(shape).params
    p_norm = replicated_params(shape)
    return p_lin, p_norm, p_layer


def hf_layout(grid: GridShape) -> bool:
    """True when nothing is sharded (R = C = Z = 1): ``axonn.parallelize`` keeps HF's own modules."""
    return grid.row == grid.col == grid.depth == 1


def activation_bytes_per_layer(shape: ModelShape, grid: GridShape, seq: int, micro_batch: int,
                               cfg: MemoryConfig | None = None) -> float:
    """``A`` of the module docstring: what one decoder layer saves for backward in one micro-step."""
    R, C = grid.row, grid.col
    m = micro_batch * seq
    h, f, nh = shape.hidden, shape.ffn, shape.heads
    kv = shape.kv_heads * shape.head_dim
    if hf_layout(grid):
        return m * (30 * h + 4 * kv + 8 * f + 4 * nh)
    return m * (16 * h + 8 * h / C + (4 * h + 4 * kv + 8 * f + 4 * nh) / R)


def memory_per_gpu(shape: ModelShape, grid: GridShape, seq: int, micro_batch: int,
                   activation_checkpointing: bool = True,
                   cfg: MemoryConfig | None = None, micro_steps: int = 2) -> MemoryBreakdown:
    """Bytes per GPU at the step's peak (equations in the module docstring).

    ``micro_steps``: forward/backward passes per optimizer step on this rank.  From 2 on, the
    gradients of the earlier passes are live through the last one; with 1, each moment counts
    only the gradients produced by then (none in the forward).
    """
    cfg = cfg or MemoryConfig()
    _, R, C, Z = grid
    h, L, V = shape.hidden, shape.layers, shape.vocab
    p_lin, p_norm, p_layer = param_counts(shape)
    hf = hf_layout(grid)
    states = cfg.bytes_per_param * ((p_lin + V * h) / (R * C * Z) + p_norm)
    m = micro_batch * seq
    a_layer = activation_bytes_per_layer(shape, grid, seq, micro_batch, cfg)
    c = min(m, cfg.chunk_tokens)
    if hf:  # the fused head + cross-entropy (memorization.training.loss): gradients made in the forward
        logits_fwd = 6 * c * V + 4 * V * h + 2 * c * h  # a chunk's bf16 and fp32 logits, the fp32 dW, its bf16 input
        logits_bwd = 8 * V * h + 4 * m * h  # the stored dW and dh scaled (dh itself is in around_loss)
    else:  # checkpointed chunks: fp32 logits + log-softmax (+ its gradient, the logits recomputed)
        logits_fwd, logits_bwd = 8 * c * V / R, 12 * c * V / R
    bf16_weights = 2 * p_lin if hf else 0.0  # HF layout: autocast's cached casts
    # depth buffers of the Linear being back-propagated: the LM head's alone (nothing is in flight yet
    # when it runs), or a decoder layer's largest with two reduce-scatters in flight and a prefetch
    block = max(lin.params for lin in layer_linears(shape)) / (R * C)
    head_buffers = cfg.gathered_bytes * V * h / (R * C)
    layer_buffers_z = (cfg.gathered_bytes + cfg.in_flight_bytes) * block
    gathered = max(head_buffers, layer_buffers_z) if Z > 1 else 0.0
    prefetched = 2 * block if Z > 1 else 0.0  # the LM head's backward prefetches the last layer's weight
    # gradient all-reduce over data x depth (sync_gradients): one flattened bucket at a time
    grb = cfg.grad_reduce_bytes
    bucket = grb * min(GRAD_BUCKET_ELEMENTS, states / cfg.bytes_per_param)
    sync = (0.0, 0.0, 0.0) if grid.data * Z == 1 else (bucket, 0.0, 0.0)
    # gradients not yet produced at a moment of a single-micro-step step (fp32, this rank's shards)
    grads = states / 4
    head_grad = 4 * V * h / (R * C * Z)
    layer_grads = 4 * (p_layer / (R * C * Z) + block_replicated_params(shape))
    if micro_steps >= 2:
        in_forward = before_backward = bottom_layer = 0.0
    else:
        in_forward = grads  # no gradient exists before the backward
        before_backward = grads - head_grad  # only the LM head's gradient exists once the loss is back-propagated
        bottom_layer = grads - head_grad - L * layer_grads  # only the embedding's is still missing
    around_loss = 8 * m * h + 8 * m * h / C  # embedding output, final norm, the loss's input and its gradient
    layer_buffers = 2 * p_layer if hf else gathered  # one layer's bf16 weights (HF) or depth buffers (axonn)
    # the embedding's chunk gathered over depth (forward) and its dense gradient (end of the backward)
    emb_chunk = 4 * V * h / (R * C) if Z > 1 and not hf else 0.0
    embedding = [(in_forward, emb_chunk, 0.0, 0.0), (0.0, emb_chunk, 4 * m * h, 0.0)]
    if not activation_checkpointing:
        moments = [  # (missing gradients, buffers, activations, logits); the largest total counts
            # the loss's forward (the fused loss's peak) and its backward: every layer's activations are saved
            (in_forward, bf16_weights, L * a_layer + around_loss, logits_fwd),
            (before_backward, bf16_weights + prefetched, L * a_layer + around_loss, logits_bwd),
            # the first layer's backward: the other layers' activations and bf16 weights are freed
            (bottom_layer, layer_buffers, a_layer + around_loss, 0.0),
            (0.0, *sync),
            *embedding,
        ]
    else:
        # each layer's fp32 input (axonn layout: a 1/(R·C) slice, axonn.recompute); the final norm's
        # output and the loss's input
        layer_input = 4 * m * h / (R * C)
        inputs = L * layer_input + 8 * m * h
        # a layer rerun and back-propagated (axonn: its regathered input), with an RMSNorm backward's two
        # full-width fp32 temporaries (traced at the peak of the 405b on 1,8,4,32)
        recompute = a_layer + 8 * m * h + (0 if hf else 4 * m * h)
        moments = [
            (in_forward, bf16_weights, inputs, logits_fwd),  # end of forward (HF: bf16 cache)
            (before_backward, prefetched, inputs, logits_bwd),  # the loss's backward
            (before_backward, layer_buffers, inputs + recompute, 0.0),  # the last layer's recomputation
            (bottom_layer, layer_buffers, layer_input + 8 * m * h + recompute, 0.0),  # the first layer's
            (0.0, *sync),
            *embedding,
        ]
    missing, buffers, acts, logits = max(moments, key=lambda mo: sum(mo[1:]) - mo[0])
    return MemoryBreakdown(states=states - missing, buffers=buffers, activations=acts, logits=logits)
