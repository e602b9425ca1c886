r"""Memory per GPU of a Llama-family model trained on a 4D AxoNN grid.

Notation as in :mod:`axonn.planner.model`: grid ``(D, R, C, Z)``, per-GPU micro-batch ``b``,
sequence ``s``, local tokens ``m = b·s``, hidden ``h``, FFN ``f``, KV width ``kv = kv_heads·head_dim``,
vocabulary ``V``, layers ``L``. All figures are bytes on one rank.

Model state (mixed precision with AdamW, ``bytes_per_param`` = 2 bf16 weight + 2 bf16 grad +
4 fp32 master + 4 fp32 gradient accumulator + 8 Adam moments = 20)::

    P_sharded = L·(2h² + 2h·kv + 3h·f) + 2·V·h          (Linears, embedding and lm_head)
    P_repl    = 2·L·h + h                               (RMSNorm weights)
    states    = bytes_per_param · (P_sharded/(R·C·Z) + P_repl)

The data axis replicates all of it (no optimizer sharding over data).

Gathered-weight buffers (depth all-gather of the current layer, the prefetched next one, and the
current layer's unreduced weight gradient before its reduce-scatter), bf16::

    buffers = 3 · 2 · max(P_layer, V·h) / (R·C)

Activations of one decoder layer and micro-step, bf16, without checkpointing. The residual
stream / norm outputs feeding non-transposed layers are ``m × h/C`` (replicated over R), the
outputs of q/k/v/gate/up and everything between them and o/down are ``m × ·/R`` (replicated over
C); flash attention keeps no ``s × s`` score matrix::

    A_layer = 2·m·(4h/C + (2h + 2kv)/R + 4f/R) + 4·m·heads/R
              [residual, norm1 out, residual-mid, norm2 out] [q, k, v, attn out]
              [gate, up, silu(gate), product] [fp32 log-sum-exp]

    no checkpointing : L·A_layer + A_layer          (+ one layer of gradient workspace)
    checkpointing    : L·2·m·h/C + 2·A_layer        (layer inputs + recompute + gradients)

Logits (``m × V/R``: bf16 output, fp32 upcast for the loss, fp32 gradient)::

    logits = (2 + 4 + 4) · m · V / R

Total = states + buffers + activations + logits; it fits when it is at most
``memory·usable_fraction − reserved`` of the profile.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from axonn.presets import ModelShape

from .model import Grid, layer_linears, lm_head

GIB = 1024**3


@dataclass(frozen=True)
class MemoryConfig:
    """Byte counts of the training recipe (mixed-precision AdamW by default)."""

    bytes_per_param: int = 20        # bf16 w + bf16 g + fp32 master + fp32 grad accum + 2×fp32 Adam
    bytes_act: int = 2               # bf16 activations
    logits_bytes_per_elem: int = 10  # bf16 logits + fp32 upcast + fp32 gradient
    gathered_buffers: int = 3        # current layer + prefetched layer + unreduced gradient


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
    """``(P_sharded, P_replicated, P_layer)`` as in the module docstring."""
    p_layer = sum(lin.params for lin in layer_linears(shape))
    p_sharded = shape.layers * p_layer + 2 * shape.vocab * shape.hidden
    p_repl = 2 * shape.layers * shape.hidden + shape.hidden
    return p_sharded, p_repl, p_layer


def activation_bytes_per_layer(shape: ModelShape, grid: Grid, seq: int, micro_batch: int,
                               cfg: MemoryConfig | None = None) -> float:
    """``A_layer`` of the module docstring (one decoder layer, one micro-step)."""
    cfg = cfg or MemoryConfig()
    R, C = grid.row, grid.column
    m = micro_batch * seq
    h, f = shape.hidden, shape.ffn
    kv = shape.kv_heads * shape.head_dim
    return (cfg.bytes_act * m * (4 * h / C + (2 * h + 2 * kv) / R + 4 * f / R)
            + 4 * m * shape.heads / R)


def memory_per_gpu(shape: ModelShape, grid: Grid, seq: int, micro_batch: int,
                   activation_checkpointing: bool = True,
                   cfg: MemoryConfig | None = None) -> MemoryBreakdown:
    """Bytes per GPU (equations in the module docstring)."""
    cfg = cfg or MemoryConfig()
    _, R, C, Z = grid
    p_sharded, p_repl, p_layer = param_counts(shape)
    states = cfg.bytes_per_param * (p_sharded / (R * C * Z) + p_repl)
    buffers = cfg.gathered_buffers * cfg.bytes_act * max(p_layer, lm_head(shape).params) / (R * C)
    a_layer = activation_bytes_per_layer(shape, grid, seq, micro_batch, cfg)
    m = micro_batch * seq
    if activation_checkpointing:
        acts = shape.layers * cfg.bytes_act * m * shape.hidden / C + 2 * a_layer
    else:
        acts = shape.layers * a_layer + a_layer
    logits = cfg.logits_bytes_per_elem * m * shape.vocab / R
    return MemoryBreakdown(states=states, buffers=buffers, activations=acts, logits=logits)
