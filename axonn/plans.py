"""The parallel plan of each supported model family, written as data.

One :class:`ModelPlan` per Hugging Face ``model_type`` says, for every module of a decoder block, how
the 4D grid splits it, and which config fields the grid's axes must divide.  Everything that needs to
know the layout reads it from here:

* :func:`axonn.parallelize` swaps the Linears the plan names for axonn's, slices the column shard of
  the activations where the plan says, and refuses a grid whose axes do not divide the plan's fields;
* the planner's cost and memory models (``axonn.planner``) take a block's matmuls, their shapes and
  kinds, and its replicated parameters from :func:`block_linears` and :func:`block_norms`;
* sharded checkpoints need no table (every parameter carries its shard spec, set by the layer that the
  plan chose, and names stay Hugging Face's), but HF export (``axonn.checkpoint.export_hf``, ``to_hf``)
  checks every full tensor against the shapes the plan and the config give (:func:`state_shapes`) before
  it writes, and refuses a model without a plan;
* the experiment layer (``memorization.training.models``) builds, initialises and loads any family with a plan,
  and ``axonn.presets.ModelShape.hf_config`` gives a shape's config in its family.

Kinds of a block module (``Gr`` = row, ``Gc`` = column axis)::

    LINEAR      Y = X Wᵀ, out features over row, in features over column (q, k, v, gate, up)
    TRANSPOSED  out over column, in over row; output all-gathered over column (o, down)
    REPLICATED  a norm: the full weight (and bias) on every rank

and of the model-level modules: the embedding is vocabulary-parallel over row × column (``VOCAB``),
the LM head a ``LINEAR`` whose output is the vocabulary shard of the row group (``VOCAB_HEAD``).

Dimensions are named, not numbers, so that the same table serves a HF config (``parallelize``) and a
planner shape: ``hidden``, ``q`` = heads·head_dim, ``kv`` = kv_heads·head_dim, ``qkv`` = q + 2·kv
(a fused projection), ``ffn`` and ``vocab`` (:func:`dims_of_shape`, :func:`dims_of_config`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

LINEAR = "linear"
TRANSPOSED = "transposed"
REPLICATED = "replicated"
VOCAB = "vocab"
VOCAB_HEAD = "vocab_head"

DIM_LABELS = {"hidden": "hidden", "q": "heads·head_dim", "kv": "kv_heads·head_dim",
              "qkv": "(heads+2·kv_heads)·head_dim", "ffn": "ffn", "vocab": "vocab"}


@dataclass(frozen=True)
class ModuleRule:
    """How one module of a decoder block is parallelized.

    ``path`` is its attribute path inside the block (``self_attn.q_proj``); ``out`` and ``in_`` name
    the dimensions of a Linear's weight (``out × in``) or, for a norm, ``out`` the length of its
    weight.  ``bias`` says whether the family's released checkpoints have a bias there (the planner
    counts it; ``parallelize`` follows the module it is given).
    """

    path: str
    kind: str
    out: str
    in_: str = ""
    bias: bool = False

    @property
    def name(self) -> str:
        """The module's own name (the last part of its path)."""
        return self.path.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Divides:
    """``field`` of the HF config (shown as ``label``) must be a multiple of the product of ``axes``;
    ``dim`` is the same number's name in :func:`dims_of_shape` (a planner shape's)."""

    field: str
    label: str
    axes: tuple[str, ...]
    dim: str


@dataclass(frozen=True)
class ModelPlan:
    """The parallel layout of one model family (a HF ``model_type``).

    ``block`` lists the decoder block's modules in the order they run (the Linears' order is the
    order of their depth prefetches).  ``drop_after`` are block modules whose output is cut to this
    rank's column shard (the input of the next ``LINEAR``s); ``drop_before`` block modules whose
    input is (for blocks without a pre-norm).  ``requires`` are divisibility rules checked before the
    model is touched, in order.  ``row_sharded_norms``: norms over a row-sharded width (OLMo 2's
    q/k norms), computed with a row all-reduce of the sum of squares.  ``per_head_norms``: replicated
    norms applied to each of the rank's heads (Qwen3's q/k norms), whose weight gradients are summed
    over row.
    """

    model_type: str
    hf_class: str
    backbone: str           # attribute of the CausalLM holding the decoder (``model``)
    layers: str             # attribute of the backbone holding the blocks
    embedding: str          # attribute of the backbone
    final_norm: str         # attribute of the backbone
    head: str               # attribute of the CausalLM
    block: tuple[ModuleRule, ...]
    requires: tuple[Divides, ...]
    drop_after: tuple[str, ...] = ()
    drop_before: tuple[str, ...] = ()
    row_sharded_norms: tuple[str, ...] = ()
    per_head_norms: tuple[str, ...] = ()
    final_norm_bias: bool = False
    # (parameter, the name the family's checkpoints store it under where that is another): GPT-NeoX's head,
    # ``lm_head`` in transformers 5, is ``embed_out`` in its releases, in transformers 4 and in what
    # transformers 5's save_pretrained writes; HF export writes it so, and --init reads either
    checkpoint_aliases: tuple[tuple[str, str], ...] = ()

    def linears(self) -> list[ModuleRule]:
        return [r for r in self.block if r.kind in (LINEAR, TRANSPOSED)]

    def norms(self) -> list[ModuleRule]:
        return [r for r in self.block if r.kind == REPLICATED]


_HIDDEN = Divides("hidden_size", "hidden_size", ("col",), "hidden")
_HEADS = Divides("num_attention_heads", "num_attention_heads", ("row",), "heads")
_KV = Divides("num_key_value_heads", "num_key_value_heads", ("row",), "kv_heads")
_FFN = Divides("intermediate_size", "intermediate_size (FFN)", ("row",), "ffn")
_VOCAB = Divides("vocab_size", "vocab_size", ("row", "col"), "vocab")


def _llama_block(qkv_bias: bool = False, qk_norm: str | None = None) -> tuple[ModuleRule, ...]:
    """Llama's block (pre-norms, q/k/v/o, SwiGLU), with Qwen2's q/k/v biases or Qwen3's per-head q/k norms."""
    qk = (ModuleRule("self_attn.q_norm", REPLICATED, qk_norm), ModuleRule("self_attn.k_norm", REPLICATED, qk_norm)) \
        if qk_norm else ()
    return (ModuleRule("input_layernorm", REPLICATED, "hidden"),
            ModuleRule("self_attn.q_proj", LINEAR, "q", "hidden", qkv_bias),
            ModuleRule("self_attn.k_proj", LINEAR, "kv", "hidden", qkv_bias),
            ModuleRule("self_attn.v_proj", LINEAR, "kv", "hidden", qkv_bias),
            *qk,
            ModuleRule("self_attn.o_proj", TRANSPOSED, "hidden", "q"),
            ModuleRule("post_attention_layernorm", REPLICATED, "hidden"),
            ModuleRule("mlp.gate_proj", LINEAR, "ffn", "hidden"),
            ModuleRule("mlp.up_proj", LINEAR, "ffn", "hidden"),
            ModuleRule("mlp.down_proj", TRANSPOSED, "hidden", "ffn"))


def _llama_like(model_type: str, hf_class: str, **block_kw: Any) -> ModelPlan:
    per_head = ("self_attn.q_norm", "self_attn.k_norm") if block_kw.get("qk_norm") else ()
    return ModelPlan(model_type, hf_class, backbone="model", layers="layers", embedding="embed_tokens",
                     final_norm="norm", head="lm_head", block=_llama_block(**block_kw),
                     requires=(_HIDDEN, _HEADS, _KV, _FFN, _VOCAB),
                     drop_after=("input_layernorm", "post_attention_layernorm"), per_head_norms=per_head)


PLANS: dict[str, ModelPlan] = {
    "llama": _llama_like("llama", "LlamaForCausalLM"),
    # sliding-window attention lives in the attention mask, which is the same on every rank
    "mistral": _llama_like("mistral", "MistralForCausalLM"),
    "qwen2": _llama_like("qwen2", "Qwen2ForCausalLM", qkv_bias=True),
    # q/k RMSNorms over head_dim, applied per head: whole heads per row rank; each rank's weight gradient
    # comes from its heads only and is summed over row
    "qwen3": _llama_like("qwen3", "Qwen3ForCausalLM", qk_norm="head_dim"),
    # OLMo 2: no pre-norms (the block input goes to q/k/v and the MLP: drop it there), norms after
    # attention and MLP (full width, replicated), and q/k RMSNorms over the whole projected width,
    # which row splits: their sum of squares is all-reduced over row
    "olmo2": ModelPlan(
        "olmo2", "Olmo2ForCausalLM", backbone="model", layers="layers", embedding="embed_tokens",
        final_norm="norm", head="lm_head",
        block=(ModuleRule("self_attn.q_proj", LINEAR, "q", "hidden"),
               ModuleRule("self_attn.k_proj", LINEAR, "kv", "hidden"),
               ModuleRule("self_attn.v_proj", LINEAR, "kv", "hidden"),
               ModuleRule("self_attn.q_norm", REPLICATED, "q"),
               ModuleRule("self_attn.k_norm", REPLICATED, "kv"),
               ModuleRule("self_attn.o_proj", TRANSPOSED, "hidden", "q"),
               ModuleRule("post_attention_layernorm", REPLICATED, "hidden"),
               ModuleRule("mlp.gate_proj", LINEAR, "ffn", "hidden"),
               ModuleRule("mlp.up_proj", LINEAR, "ffn", "hidden"),
               ModuleRule("mlp.down_proj", TRANSPOSED, "hidden", "ffn"),
               ModuleRule("post_feedforward_layernorm", REPLICATED, "hidden")),
        requires=(_HIDDEN, _HEADS, _KV, _FFN, _VOCAB),
        drop_before=("self_attn", "mlp"), row_sharded_norms=("self_attn.q_norm", "self_attn.k_norm")),
    # GPT-NeoX (Pythia): fused query_key_value whose rows are per head [q; k; v] (whole heads per row
    # rank), LayerNorms with biases, GELU MLP, biases everywhere; the parallel residual feeds both
    # norms the same block input, which changes nothing here
    "gpt_neox": ModelPlan(
        "gpt_neox", "GPTNeoXForCausalLM", backbone="gpt_neox", layers="layers", embedding="embed_in",
        final_norm="final_layer_norm", head="lm_head",  # transformers 5 names embed_out lm_head
        block=(ModuleRule("input_layernorm", REPLICATED, "hidden", bias=True),
               ModuleRule("attention.query_key_value", LINEAR, "qkv", "hidden", True),
               ModuleRule("attention.dense", TRANSPOSED, "hidden", "q", True),
               ModuleRule("post_attention_layernorm", REPLICATED, "hidden", bias=True),
               ModuleRule("mlp.dense_h_to_4h", LINEAR, "ffn", "hidden", True),
               ModuleRule("mlp.dense_4h_to_h", TRANSPOSED, "hidden", "ffn", True)),
        requires=(_HIDDEN, _HEADS, _FFN, _VOCAB),
        drop_after=("input_layernorm", "post_attention_layernorm"), final_norm_bias=True,
        checkpoint_aliases=(("lm_head.weight", "embed_out.weight"),)),
}

FAMILIES = tuple(PLANS)


def get_plan(model_type: str) -> ModelPlan:
    """The plan of a HF ``model_type``; an unknown one raises ``ValueError`` naming the supported ones."""
    if model_type not in PLANS:
        raise ValueError(f"no parallel plan for model_type {model_type!r}: supported are "
                         f"{', '.join(f'{t} ({p.hf_class})' for t, p in PLANS.items())}")
    return PLANS[model_type]


def plan_of_model(model: Any) -> ModelPlan | None:
    """The plan of a HF CausalLM (an instance of the plan's class, subclasses included, whose
    ``config.model_type`` selects the plan), or None."""
    config = getattr(model, "config", None)
    plan = PLANS.get(getattr(config, "model_type", None))
    if plan is None:
        return None
    import transformers

    cls = getattr(transformers, plan.hf_class, None)
    return plan if cls is not None and isinstance(model, cls) else None


def dims_of_config(config: Any) -> dict[str, int]:
    """The named dimensions of a HF config (``head_dim`` from the config where it has one)."""
    h, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hd = getattr(config, "head_dim", None) or h // heads
    return _dims(h, heads, kv_heads, hd, config.intermediate_size, config.vocab_size)


def dims_of_shape(shape: Any) -> dict[str, int]:
    """The named dimensions of a planner shape (``axonn.presets.ModelShape``)."""
    return _dims(shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.vocab)


def _dims(h: int, heads: int, kv_heads: int, hd: int, ffn: int, vocab: int) -> dict[str, int]:
    q, kv = heads * hd, kv_heads * hd
    return {"hidden": h, "q": q, "kv": kv, "qkv": q + 2 * kv, "ffn": ffn, "vocab": vocab, "head_dim": hd,
            "heads": heads, "kv_heads": kv_heads}


@dataclass(frozen=True)
class Matmul:
    """One Linear of a block with its shape: ``W`` is ``out × in_``; ``transposed`` swaps row and column."""

    name: str
    out: int
    in_: int
    transposed: bool
    out_dim: str
    in_dim: str
    bias: bool


def block_linears(plan: ModelPlan, dims: Mapping[str, int]) -> list[Matmul]:
    """The block's Linears in order, with shapes from ``dims`` (:func:`dims_of_shape` / ``_config``)."""
    return [Matmul(r.name, dims[r.out], dims[r.in_], r.kind == TRANSPOSED, DIM_LABELS[r.out], DIM_LABELS[r.in_],
                   r.bias) for r in plan.linears()]


def block_norms(plan: ModelPlan, dims: Mapping[str, int]) -> list[tuple[str, int]]:
    """``(name, parameters)`` of the block's replicated norms (weight, plus bias where it has one)."""
    return [(r.name, dims[r.out] * (2 if r.bias else 1)) for r in plan.norms()]


def layer_parameters(plan: ModelPlan, dims: Mapping[str, int]) -> dict[str, int]:
    """Parameters of one block: ``linear`` (weights), ``bias`` (Linear biases), ``norm`` (norm weights and biases)."""
    lins = block_linears(plan, dims)
    return {"linear": sum(m.out * m.in_ for m in lins), "bias": sum(m.out for m in lins if m.bias),
            "norm": sum(n for _, n in block_norms(plan, dims))}


def final_norm_parameters(plan: ModelPlan, dims: Mapping[str, int]) -> int:
    return dims["hidden"] * (2 if plan.final_norm_bias else 1)


def embedding_name(plan: ModelPlan) -> str:
    """The state-dict name of the input embedding's weight (``model.embed_tokens.weight``)."""
    return f"{plan.backbone}.{plan.embedding}.weight"


def head_name(plan: ModelPlan) -> str:
    """The state-dict name of the LM head's weight (``lm_head.weight``)."""
    return f"{plan.head}.weight"


def state_shapes(plan: ModelPlan, config: Any) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Every tensor the HF state dict of ``plan``'s model with ``config`` may hold: ``name -> (full shape,
    required)``.

    Required: the embedding and the head (``vocab × hidden``; the head is absent from a model whose config ties
    it to the embedding, ``tie_word_embeddings``, and optional in its state dict), the final norm's weight (and bias where the
    plan has one), and in each of the ``num_hidden_layers`` blocks every Linear's weight (``out × in`` of
    its rule's dimensions, :func:`dims_of_config`) and every norm's weight (``out``), with its bias where the
    plan's rule has one (LayerNorms).  Optional: a Linear's bias (``out``): a config may switch them on or off
    (Llama's ``attention_bias``, GPT-NeoX's).
    """
    dims = dims_of_config(config)
    h, v = dims["hidden"], dims["vocab"]
    out: dict[str, tuple[tuple[int, ...], bool]] = {
        embedding_name(plan): ((v, h), True),
        head_name(plan): ((v, h), not getattr(config, "tie_word_embeddings", False)),
        f"{plan.backbone}.{plan.final_norm}.weight": ((h,), True),
        f"{plan.backbone}.{plan.final_norm}.bias": ((h,), plan.final_norm_bias)}
    for i in range(config.num_hidden_layers):
        prefix = f"{plan.backbone}.{plan.layers}.{i}."
        for r in plan.block:
            shape = (dims[r.out], dims[r.in_]) if r.kind in (LINEAR, TRANSPOSED) else (dims[r.out],)
            out[prefix + r.path + ".weight"] = (shape, True)
            out[prefix + r.path + ".bias"] = ((dims[r.out],), r.bias and r.kind == REPLICATED)
    return out


def state_problems(plan: ModelPlan, config: Any, shapes: Mapping[str, tuple[int, ...]]) -> list[str]:
    """What is wrong with a state dict of full tensors ``shapes`` (name -> shape) for ``plan`` and ``config``
    (:func:`state_shapes`): a tensor the plan does not know, a shape other than the plan's, a required
    tensor missing.  Empty when it is the family's model."""
    want = state_shapes(plan, config)
    problems = []
    for name, shape in shapes.items():
        if name not in want:
            problems.append(f"{name}: not a tensor of {plan.hf_class} in its plan")
        elif tuple(shape) != want[name][0]:
            problems.append(f"{name}: shape {list(shape)}, the plan and config say {list(want[name][0])}")
    problems += [f"{n}: missing" for n, (_, required) in want.items() if required and n not in shapes]
    return problems
