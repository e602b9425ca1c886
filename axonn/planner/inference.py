r"""Memory per GPU of evaluating a Llama-family model on a 4D AxoNN grid, and the grid to evaluate it on.

The evaluations (``eval/extract.py``, ``eval/mia.py``, ``eval/downstream.py --perplexity``, each with
``--grid D,R,C,Z``) build the model as the trainer does (:func:`memorization.training.models.build_model`,
:func:`axonn.parallelize`) and split the documents over the ``D·Z`` data × depth replicas
(:func:`memorization.training.runtime.map_over_replicas`); each replica's ranks run forwards of ``b`` sequences
(``--batch-size``) of up to ``s`` tokens (the context).  Notation as in :mod:`axonn.planner.memory`:
grid ``(D, R, C, Z)``, ``m = b·s`` tokens per forward, hidden ``h``, FFN ``f``, layers ``L``, vocabulary
``V``, ``q = heads·head_dim``, ``kv = kv_heads·head_dim``.  All figures are bytes on one rank.

Dtypes (:data:`INFERENCE_DTYPES`).  The grid path builds the model in fp32 on every device: weights
``w = 4`` B.  ``"bf16"`` is ``eval/extract.py --grid`` on GPUs (bf16 autocast): matmul outputs ``a = 2``
B.  ``"fp32"`` is everything else on a grid (MIA and perplexity run no autocast; extraction with
``--dtype float32`` or on CPUs): ``a = 4``.  The residual stream and RMSNorm outputs are fp32 either way
(the embedding is fp32), and RoPE multiplies q and k by the fp32 cos/sin of that stream, so cached keys
are fp32 (``k_B = 4``) while cached values keep ``v_proj``'s dtype (``v_B = a``).

Weights (every moment)::

    W = w·(L·Σ_layer Linears ⌈n/(R·C·Z)⌉ + 2·⌈V·h/(R·C·Z)⌉ + (2L + 1)·h)

each Linear's ``n = out·in`` elements cut to an ``out/Gr × in/Gc`` block, zero-padded to a multiple of
``Z`` and split over depth (:class:`axonn.sharding.ShardSpec`), the LM head likewise, the embedding's
``V/(R·C) × h`` chunk likewise, RMSNorm weights replicated; ``R = C = Z = 1`` keeps HF's modules, the
whole model.

KV cache (greedy generation, every moment)::

    KV = L·b·s·(kv/R)·(k_B + v_B)

q/k/v split their output (whole heads) over the row group, so a rank caches its ``kv_heads/R`` heads;
the column ranks of a row hold the same cache and each data × depth replica its own ``b`` sequences;
nothing else divides it.  ``s`` counts the cached positions: after ``S`` new tokens the decoder's
cache holds the prefix and ``S − 1`` of them (the last token is never fed back).

The rest is the largest of a few moments of one forward over ``m`` tokens (no autograd: each
intermediate is freed when the code drops it).  Weight copies (``buffers``):

* ``R = C = Z = 1`` under bf16 autocast: autocast caches the bf16 cast of every Linear weight (they are
  leaves that require grad) until the evaluation's autocast region ends, ``2·P_lin`` at every moment;
* ``Z = 1``, ``R·C > 1``, bf16: the Linear running casts its local block (a view, not cached), ``2·n/(R·C)``;
* ``Z > 1``: the Linear running all-gathers its block over depth in the compute dtype,
  ``a·Z·⌈n/(R·C·Z)⌉`` plus, under autocast, its bf16 shard ``2·⌈n/(R·C·Z)⌉``; the embedding gathers its
  fp32 chunk, ``4·Z·⌈V·h/(R·C·Z)⌉``.

Activations of a decoder layer.  Through the layers live the padding mask ``b·s²`` (bool), RoPE's cos/sin
``8·m·head_dim``, the embedding's output (``LlamaModel`` keeps it) and the running layer's input (its caller
keeps it), ``8·m·h``; on top, the largest of

* the post-attention RMSNorm: its input, ``x·rsqrt(var)`` and the weighted output, ``12·m·h``;
* attention (SDPA under way): the normed input's column slice ``4mh/C``, q after RoPE (fp32), k after RoPE
  and v when nothing caches them (scoring), k and v repeated to every local head when ``kv_heads < heads``
  and more than one KV head is local (one is repeated as a view), autocast's bf16 casts of q and of the
  (repeated) k, the output, and the mask made additive in the compute dtype::

      m·(4h/C + (4q + [scoring]·(4 + a)·kv + g·(4 + a)·q + 4ρ·q + a·q)/R) + a·b·s²

  (``g`` the repeat copy, ``ρ = [autocast]``);
* the MLP: the post-attention residual, the normed slice and, at the up projection, SiLU(gate), up and
  autocast's cast of the slice, or at the product all three of SiLU(gate), up and their product,
  ``m·(4h + 4h/C + max(2a·f/R + 2ρ·h/C, 3a·f/R))``;
* down_proj's output: the residual, the slice, the product, the output shard and, with ``C > 1``, its column
  all-gather (a buffer and its concatenation), ``m·(4h + 4h/C + a·f/R + a·h/C + [C > 1]·2a·h)``;
* the residual add, ``m·(8h + a·h)``.

Embedding: the looked-up rows ``4mh``, with ``R·C > 1`` their all-reduced copy ``4mh``, in axonn's layout the
local ids and mask ``9m``; generation embeds ``m`` tokens before any cache exists and ``b`` tokens beside the
full cache, so its activations count ``max(emb(b), emb(m) − KV)`` beyond the cache.

LM head: the final norm's slice ``4mh/C`` and the logits of ``n`` positions (generation: the last one per
sequence, ``n = b``, ``logits_to_keep``; scoring: all, ``n = m``), ``a·n·V/R`` on the row shard; generation
all-gathers them to the full vocabulary under ``no_grad`` (``gather_output="auto"``: an all-gather buffer and
its concatenation, ``2a·n·V`` when ``R > 1``).  Scoring (MIA, perplexity) keeps them: with ``R > 1`` it takes
its log-probs from the shard (:func:`axonn.intra_layer.vocab_parallel_logprobs`) in row groups of ``c =
r·(s−1)`` positions, ``r = min(b, max(1, 2²⁸ // (2·(s−1)·V/R)))``: the shifted logits, their exponentials and
Min-K%++'s two products over the local vocabulary, ``16·c·V/R`` beside the kept ``a·m·V/R``.  With ``R = 1``
the whole vocabulary: MIA's log-softmax, probabilities and two products ``16·c·V`` (plus the fp32 copy of bf16
logits, ``4·c·V``), with ``r`` from ``V``; perplexity's cross-entropy holds about half of that, so the figure is
an upper bound for it.
Generation's decoding steps hold the full cache and, while ``DynamicCache`` concatenates one layer's new
keys and values, a copy of that layer's cache, ``KV/L``.

Total = ``W + KV + max over moments (buffers + activations + logits)``; it fits when it is at most the
profile's ``memory·usable_fraction − reserved`` (:attr:`~axonn.planner.MachineProfile.usable_memory_bytes`,
the training planner's budget).  The prefill is counted at the full context ``s`` (the prompt is ``s − S``
tokens) beside the whole cache, and a layer's moments with its largest weight copy, so the figure leans
high.  The weights and the KV cache are exact (``tests/axonn/planner/test_inference.py`` measures the parameters
and the cache real ranks hold).  The rest matches the live tensor bytes of the real forwards of rank 0, traced
under fake tensors (:func:`memorization.training.memory_trace.trace_inference`: two batches of prefill and a decoding
step, or MIA's scoring): from the 1b to the 70b, on HF's modules and grids with row, column and depth, scoring
to 0.1 % and generation from 0.1 % below to 1.8 % above (``docs/planner.md`` has the table).

Choosing a grid (:func:`plan_inference`): every grid of ``G`` GPUs that divides the model and fits,
ranked by most data replicas ``D`` first (throughput once the model fits), then the tensor-parallel group
``R·C`` within a node (its all-reduces run in every layer; across nodes they would ride the slower network),
then no depth (it all-gathers every weight in every forward, which a model larger than a node's group needs),
then a larger row before a larger column.  :func:`smallest_inference_gpus` is the smallest model-parallel
group ``R·C·Z`` on which one replica fits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from axonn.grid_shape import GridShape
from axonn.presets import ModelShape

from .memory import GIB
from .model import divisibility_problem, layer_linears, replicated_params
from .profiles import MachineProfile
from .search import MAX_SEARCH_GPUS, PlanError, Rejection, load_machine, resolve_shape

#: logit elements MIA converts to fp32 log-probabilities at once (``memorization.evaluation.mia.scoring``'s chunk: 2^28)
LOGIT_CHUNK_ELEMENTS = 1 << 28


@dataclass(frozen=True)
class InferenceDtype:
    """Bytes per element of what an evaluation on a grid holds (module docstring)."""

    name: str
    weight_bytes: int = 4   # the grid path builds the model in fp32
    compute_bytes: int = 2  # matmul outputs: 2 under bf16 autocast, 4 in fp32
    key_bytes: int = 4      # cached keys: RoPE promotes them to the fp32 residual stream's dtype
    value_bytes: int = 2    # cached values: v_proj's output dtype

    @property
    def autocast(self) -> bool:
        """Whether matmuls run in a narrower dtype than the weights (autocast casts the weights)."""
        return self.compute_bytes < self.weight_bytes


#: ``"bf16"``: eval/extract.py --grid on GPUs (fp32 weights, bf16 autocast); ``"fp32"``: no autocast (MIA and
#: perplexity on a grid, extraction with --dtype float32 or on CPUs)
INFERENCE_DTYPES: dict[str, InferenceDtype] = {
    "bf16": InferenceDtype("bf16", weight_bytes=4, compute_bytes=2, key_bytes=4, value_bytes=2),
    "fp32": InferenceDtype("fp32", weight_bytes=4, compute_bytes=4, key_bytes=4, value_bytes=4),
}


@dataclass
class InferenceMemory:
    """Bytes per GPU: weights and KV cache (held throughout) and, at the peak moment, weight copies
    (``buffers``: autocast's casts, depth all-gathers), activations and logits."""

    weights: float
    kv_cache: float
    buffers: float
    activations: float
    logits: float
    peak: str = ""  # the moment of the peak: embedding, layer, head, log-probs, decode

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.buffers + self.activations + self.logits

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d


def inference_dtype(dtype: str | InferenceDtype) -> InferenceDtype:
    """The :class:`InferenceDtype` named ``dtype`` (``"bf16"`` or ``"fp32"``); :class:`PlanError` otherwise."""
    if isinstance(dtype, InferenceDtype):
        return dtype
    if dtype not in INFERENCE_DTYPES:
        raise PlanError(f"dtype must be one of {', '.join(INFERENCE_DTYPES)}, got {dtype!r}", kind="input")
    return INFERENCE_DTYPES[dtype]


def _held(n: int, grid: GridShape) -> int:
    """Elements of an ``n``-element matrix one rank holds: its ``1/(R·C)`` block, padded and split over depth."""
    return -(-(n // (grid.row * grid.col)) // grid.depth)


def held_weight_elements(shape: ModelShape, grid: GridShape) -> int:
    """Parameters one rank of ``grid`` holds (``W / w`` of the module docstring)."""
    layer = sum(_held(lin.params, grid) for lin in layer_linears(shape))
    return shape.layers * layer + 2 * _held(shape.vocab * shape.hidden, grid) + replicated_params(shape)


def kv_cache_bytes(shape: ModelShape, grid: GridShape, batch: int, context: int,
                   dtype: str | InferenceDtype = "bf16") -> int:
    """``KV = L·b·s·(kv/R)·(k_B + v_B)``: the keys and values one rank caches for ``batch`` sequences of
    ``context`` positions."""
    dt = inference_dtype(dtype)
    kv_local = shape.kv_heads // grid.row * shape.head_dim
    return shape.layers * batch * context * kv_local * (dt.key_bytes + dt.value_bytes)


def _moments(shape: ModelShape, grid: GridShape, b: int, s: int, generate: bool,
             dt: InferenceDtype) -> list[tuple[str, float, float, float]]:
    """``(moment, buffers, activations, logits)`` of one forward (module docstring)."""
    _, R, C, Z = grid
    h, f, L, V, hd = shape.hidden, shape.ffn, shape.layers, shape.vocab, shape.head_dim
    q, kv = shape.heads * hd, shape.kv_heads * hd
    a, rho = dt.compute_bytes, int(dt.autocast)
    m = b * s
    hf = R == C == Z == 1
    layer_block = max(lin.params for lin in layer_linears(shape))
    p_lin = L * sum(lin.params for lin in layer_linears(shape)) + V * h

    def running(n: int) -> float:  # weight copies while a Linear of n elements runs
        if hf:
            return 0.0
        if Z == 1:
            return 2.0 * n / (R * C) if dt.autocast else 0.0
        shard = _held(n, grid)
        return a * shard * Z + (2 * shard if dt.autocast else 0)

    cached = 2.0 * p_lin if hf and dt.autocast else 0.0  # autocast's bf16 casts of HF's Linear weights
    emb_gather = dt.weight_bytes * Z * _held(V * h, grid) if Z > 1 else 0.0

    def emb_act(tokens: int) -> float:  # the looked-up rows, their all-reduced copy, local ids and mask
        return 4 * tokens * h + (4 * tokens * h if R * C > 1 else 0) + (0 if hf else 9 * tokens)

    # keys and values repeated to every local head: a copy unless one KV head is local (then a view)
    g = int(shape.kv_heads < shape.heads and shape.kv_heads // R > 1)
    # through the layers: the padding mask (bool), RoPE's cos/sin, the embedding's output (LlamaModel keeps it)
    # and the running layer's input (its caller keeps it)
    through = b * s * s + 8 * m * hd + 8 * m * h
    norm = 12 * m * h  # post-attention RMSNorm: the residual, x·rsqrt(var), the weighted output
    own_kv = 0 if generate else 4 * kv + a * kv  # k after RoPE and v (generation: they are the cache's)
    attn = m * (4 * h / C + (4 * q + own_kv + g * (4 + a) * q + 4 * rho * q + a * q) / R) + a * b * s * s
    mlp = m * (4 * h + 4 * h / C + max(2 * a * f / R + 2 * rho * h / C, 3 * a * f / R))
    # down_proj's output, all-gathered over the column group (a buffer and its concatenation) while the MLP's
    # input slice and the product are alive; then the residual add
    mlp_out = m * (4 * h + 4 * h / C + a * f / R + a * h / C + (2 * a * h if C > 1 else 0))
    add = m * (8 * h + a * h)
    layer = through + max(norm, attn, mlp, mlp_out, add)
    n = b if generate else m  # positions whose logits the LM head computes
    # generation gathers them to the full vocabulary; scoring keeps them sharded (memorization.lm.logprobs.token_stats)
    head_logits = a * n * V / R + (2 * a * n * V if R > 1 and generate else 0)
    kv_all = kv_cache_bytes(shape, grid, b, s, dt) if generate else 0
    # generation embeds m tokens before any cache exists and b tokens beside the full cache: beyond the cache
    embedding = max(emb_act(b), emb_act(m) - kv_all) if generate else emb_act(m)
    moments = [("embedding", cached + emb_gather, embedding, 0.0),
               ("layer", cached + running(layer_block), layer, 0.0),
               ("head", cached + running(V * h), 4 * m * h / C, head_logits)]
    if generate:
        kv_layer = b * s * (shape.kv_heads // R) * hd * (dt.key_bytes + dt.value_bytes)
        moments.append(("decode", cached + running(layer_block), kv_layer, head_logits))
    elif s > 1 and R > 1:  # vocab-parallel log-probs (and Min-K%++'s moments) of row groups of the local shard
        vl = V // R
        rows = min(b, max(1, LOGIT_CHUNK_ELEMENTS // (2 * (s - 1) * vl)))
        chunk = rows * (s - 1) * vl
        moments.append(("log-probs", cached, 0.0, a * m * vl + 16 * chunk))
    elif s > 1:
        rows = min(b, max(1, LOGIT_CHUNK_ELEMENTS // (2 * (s - 1) * V)))
        chunk = rows * (s - 1) * V
        moments.append(("log-probs", cached, 0.0, a * m * V + (16 + (4 if dt.autocast else 0)) * chunk))
    return moments


def inference_memory_per_gpu(shape: ModelShape, grid: GridShape, batch: int, context: int, generate: bool = True,
                             dtype: str | InferenceDtype = "bf16",
                             reference: ModelShape | None = None) -> InferenceMemory:
    """Bytes on one rank of ``grid`` while it evaluates ``batch`` sequences (per data × depth replica) of
    ``context`` tokens: greedy generation with a KV cache (``generate``) or scoring every position
    (MIA, perplexity); formulas in the module docstring.  ``reference``: a second model held on the same
    grid (MIA's ``--reference-model``): its weights add up, the two forwards run one after the other (a KV
    cache is the first model's)."""
    grid = GridShape(*grid)
    dt = inference_dtype(dtype)
    shapes = [shape] if reference is None else [shape, reference]
    weights = sum(dt.weight_bytes * held_weight_elements(sh, grid) for sh in shapes)
    kv = kv_cache_bytes(shape, grid, batch, context, dt) if generate else 0
    moment = max((mo for sh in shapes for mo in _moments(sh, grid, batch, context, generate, dt)),
                 key=lambda mo: sum(mo[1:]))
    return InferenceMemory(weights=float(weights), kv_cache=float(kv), buffers=moment[1], activations=moment[2],
                           logits=moment[3], peak=moment[0])


@dataclass
class InferenceEntry:
    """One grid that divides the model and fits, with its memory."""

    grid: GridShape
    memory: InferenceMemory
    tensor_in_node: bool  # R·C <= GPUs per node

    @property
    def replicas(self) -> int:
        """Copies of the model (the data axis)."""
        return self.grid.data

    @property
    def model_parallel(self) -> int:
        """GPUs one copy is sharded over, ``R·C·Z``."""
        return self.grid.row * self.grid.col * self.grid.depth

    def to_dict(self) -> dict:
        return {"grid": list(self.grid), "replicas": self.replicas, "model_parallel": self.model_parallel,
                "tensor_in_node": self.tensor_in_node,
                "memory_bytes": {k: (int(v) if isinstance(v, float) else v) for k, v in self.memory.to_dict().items()}}


@dataclass
class InferencePlan:
    """The fitting grids of ``gpus`` GPUs, best first, the rejected ones, and the smallest model-parallel
    group on which one replica fits."""

    shape: ModelShape
    gpus: int
    machine: MachineProfile
    batch: int
    context: int
    generate: bool
    dtype: InferenceDtype
    ranked: list[InferenceEntry]
    rejected: list[Rejection] = field(default_factory=list)
    smallest_group: GridShape | None = None
    reference: ModelShape | None = None

    @property
    def best(self) -> InferenceEntry:
        return self.ranked[0]

    @property
    def grid(self) -> GridShape:
        return self.best.grid

    @property
    def memory(self) -> InferenceMemory:
        return self.best.memory

    @property
    def model_parallel(self) -> int:
        return self.best.model_parallel

    @property
    def replicas(self) -> int:
        return self.best.replicas

    @property
    def smallest_gpus(self) -> int | None:
        """``R·C·Z`` of :attr:`smallest_group`."""
        g = self.smallest_group
        return None if g is None else g.row * g.col * g.depth


def _rank_key(grid: GridShape, total: float, prof: MachineProfile) -> tuple:
    """Most replicas, tensor-parallel within a node, no depth, larger row, less memory."""
    return (-grid.data, grid.row * grid.col > prof.gpus_per_node, grid.depth > 1, -grid.row, total)


def _divides(shapes: list[ModelShape], grid: GridShape) -> str | None:
    return next((why for sh in shapes if (why := divisibility_problem(sh, grid))), None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _smallest_group(shape: ModelShape, prof: MachineProfile, batch: int, context: int, generate: bool,
                    dt: InferenceDtype, reference: ModelShape | None) -> GridShape | None:
    """The grid ``1,R,C,Z`` with the smallest ``R·C·Z`` (up to ``MAX_SEARCH_GPUS``) on which one replica fits,
    ties broken as :func:`plan_inference` ranks; None when none does.  For each valid ``(R, C)`` the smallest
    ``Z``: 1, else a bisection over ``Z >= 2``, where the memory no longer grows with ``Z``."""
    shapes = [shape] if reference is None else [shape, reference]
    cap = prof.usable_memory_bytes

    def fits(g: GridShape) -> bool:
        return inference_memory_per_gpu(shape, g, batch, context, generate, dt, reference).total <= cap

    best: tuple[int, tuple, GridShape] | None = None
    for R in _divisors(min(sh.kv_heads for sh in shapes)):
        for C in _divisors(min(sh.hidden for sh in shapes)):
            rc = R * C
            if (best is not None and rc > best[0]) or rc > MAX_SEARCH_GPUS or _divides(shapes, GridShape(1, R, C, 1)):
                continue
            if fits(GridShape(1, R, C, 1)):
                z = 1
            else:
                lo, hi = 2, MAX_SEARCH_GPUS // rc
                if hi < lo or not fits(GridShape(1, R, C, hi)):
                    continue
                while lo < hi:
                    mid = (lo + hi) // 2
                    lo, hi = (lo, mid) if fits(GridShape(1, R, C, mid)) else (mid + 1, hi)
                z = lo
            g = GridShape(1, R, C, z)
            cand = (rc * z, _rank_key(g, 0.0, prof), g)
            if best is None or cand[:2] < best[:2]:
                best = cand
    return None if best is None else best[2]


def _check_inputs(gpus: int | None, batch: int, context: int, generate: bool) -> None:
    for name, val in (("gpus", gpus), ("batch", batch), ("context", context)):
        if name == "gpus" and val is None:
            continue
        if not isinstance(val, int) or isinstance(val, bool) or val <= 0:
            raise PlanError(f"{name} must be a positive integer, got {val!r}", kind="input")
    if not generate and context < 2:
        raise PlanError(f"scoring needs a context of at least 2 tokens, got {context}", kind="input")


def smallest_inference_gpus(shape: str | ModelShape, machine: str | Path | MachineProfile, batch: int, context: int,
                            generate: bool = True, dtype: str | InferenceDtype = "bf16",
                            reference: ModelShape | None = None) -> int:
    """The smallest model-parallel group ``R·C·Z`` (any count, up to ``MAX_SEARCH_GPUS``) on which one replica
    evaluates ``batch`` sequences of ``context`` tokens within the profile's usable memory.  :class:`PlanError`
    (``kind="memory"``) when none does: the activations, logits or KV cache alone do not fit."""
    shape, prof, dt = resolve_shape(shape), load_machine(machine), inference_dtype(dtype)
    _check_inputs(None, batch, context, generate)
    g = _smallest_group(shape, prof, batch, context, generate, dt, reference)
    if g is None:
        raise PlanError(_no_group_message(shape, prof, batch, context, generate, dt), kind="memory")
    return g.row * g.col * g.depth


def _what(shape: ModelShape, batch: int, context: int, generate: bool, dt: InferenceDtype) -> str:
    job = "greedy generation" if generate else "scoring"
    n = shape.num_params()
    params = f"{n / 1e9:.3g}B" if n >= 1e8 else f"{n / 1e6:.3g}M"
    return (f"{shape.name} ({params} params), {job} of {batch} × {context} tokens per "
            f"replica ({'bf16 autocast' if dt.autocast else 'fp32'}, fp32 weights)")


def _no_group_message(shape: ModelShape, prof: MachineProfile, batch: int, context: int, generate: bool,
                      dt: InferenceDtype) -> str:
    return (f"{_what(shape, batch, context, generate, dt)}: does not fit on any model-parallel group up to "
            f"{MAX_SEARCH_GPUS} {prof.name} GPUs ({prof.usable_memory_bytes / GIB:.1f} GiB usable each): the "
            f"activations, logits and KV cache are not sharded by depth; lower the batch or the context")


def plan_inference(shape: str | ModelShape, gpus: int, machine: str | Path | MachineProfile, batch: int,
                   context: int, generate: bool = True, dtype: str | InferenceDtype = "bf16",
                   reference: ModelShape | None = None) -> InferencePlan:
    """Every grid of ``gpus`` GPUs that divides ``shape`` (and ``reference``) and fits the profile's usable
    memory for ``batch`` sequences of ``context`` tokens, ranked (module docstring): most data replicas,
    tensor-parallel within a node, no depth, larger row.  :class:`PlanError`: ``kind="input"`` for bad numbers,
    ``"machine"`` for an unknown profile, ``"divide"`` when no grid divides, ``"memory"`` when nothing fits
    (``smallest_gpus``: the smallest model-parallel group that fits one replica, None when none does)."""
    shape, prof, dt = resolve_shape(shape), load_machine(machine), inference_dtype(dtype)
    _check_inputs(gpus, batch, context, generate)
    shapes = [shape] if reference is None else [shape, reference]
    cap = prof.usable_memory_bytes
    ranked: list[InferenceEntry] = []
    rejected: list[Rejection] = []
    for grid in GridShape.enumerate(gpus):
        why = _divides(shapes, grid)
        if why:
            rejected.append(Rejection(grid, "divide", why))
            continue
        mem = inference_memory_per_gpu(shape, grid, batch, context, generate, dt, reference)
        if mem.total > cap:
            rejected.append(Rejection(grid, "memory", f"does not fit: needs {mem.total / GIB:.1f} GiB per GPU, "
                                                      f"{cap / GIB:.1f} GiB usable", mem.total))
            continue
        ranked.append(InferenceEntry(grid, mem, grid.row * grid.col <= prof.gpus_per_node))
    ranked.sort(key=lambda e: _rank_key(e.grid, e.memory.total, prof))
    smallest = _smallest_group(shape, prof, batch, context, generate, dt, reference)
    if not ranked:
        what = _what(shape, batch, context, generate, dt)
        if all(r.kind == "divide" for r in rejected):
            raise PlanError(f"{what}: no grid of {gpus} GPUs divides it: "
                            f"{'; '.join(sorted({r.reason for r in rejected})[:4])}", kind="divide")
        if smallest is None:
            raise PlanError(_no_group_message(shape, prof, batch, context, generate, dt), kind="memory")
        need = min(r.memory_per_gpu_bytes for r in rejected if r.kind == "memory")
        n = smallest.row * smallest.col * smallest.depth
        hint = (f"use {n} GPUs or a multiple of it (each {n} more is one more replica)" if n > gpus else
                f"use a multiple of {n} GPUs ({gpus} has no grid that fits)")
        raise PlanError(f"{what}: no grid of {gpus} {prof.name} GPUs fits (the least memory needs "
                        f"{need / GIB:.1f} GiB per GPU, {cap / GIB:.1f} GiB usable). The smallest model-parallel "
                        f"group that fits one replica is {n} GPUs (grid {smallest}): {hint}.",
                        kind="memory", smallest_gpus=n)
    return InferencePlan(shape, gpus, prof, batch, context, generate, dt, ranked, rejected, smallest, reference)


def format_inference_plan(plan: InferencePlan, top: int = 5) -> str:
    """The ``top`` grids as a table (GiB per GPU split into weights, KV cache, activations, logits and weight
    copies), and the smallest model-parallel group that fits one replica."""
    p, prof = plan, plan.machine
    ref = f", with the reference model {p.reference.name} on the same grid" if p.reference is not None else ""
    lines = [
        _what(p.shape, p.batch, p.context, p.generate, p.dtype) + ref,
        f"machine {prof.name}: {p.gpus} GPUs, {prof.memory_gib:g} GiB each ({prof.usable_memory_bytes / GIB:.1f} "
        f"usable), {prof.gpus_per_node} per node",
        f"{len(p.ranked)} fitting grid(s), {len(p.rejected)} rejected",
        "",
        f"{'#':>3} {'grid D,R,C,Z':>14} {'replicas':>8} {'GiB/GPU':>8} {'weights':>8} {'KV':>6} {'act':>6} "
        f"{'logits':>6} {'copies':>6}  peak       TP in node",
    ]
    for i, e in enumerate(p.ranked[:top], 1):
        m = e.memory
        lines.append(f"{i:>3} {str(e.grid):>14} {e.replicas:>8} {m.total / GIB:>8.1f} {m.weights / GIB:>8.1f} "
                     f"{m.kv_cache / GIB:>6.1f} {m.activations / GIB:>6.1f} {m.logits / GIB:>6.1f} "
                     f"{m.buffers / GIB:>6.1f}  {m.peak:<10} {'yes' if e.tensor_in_node else 'no'}")
    if len(p.ranked) > top:
        lines.append(f"    ... {len(p.ranked) - top} more")
    g = p.smallest_group
    if g is not None:
        lines.append(f"smallest model-parallel group that fits one replica: {p.smallest_gpus} GPU(s), grid {g}; "
                     f"best: {p.replicas} replica(s) × {p.model_parallel} GPU(s)")
    return "\n".join(lines)
