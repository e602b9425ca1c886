"""Model-shape presets (``presets.yaml``): configuration, not code.

A :class:`ModelShape` is everything the trainer, the planner and the job generator need to
know about a model: layers L, hidden h, heads, KV heads, FFN width, vocabulary V, and its family
(a HF ``model_type`` with a parallel plan in :mod:`axonn.plans`; ``llama`` unless the preset says).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

_PRESETS_FILE = Path(__file__).with_name("presets.yaml")


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    max_seq: int = 2048
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)  # e.g. Llama 3.1's {"rope_type": "llama3", ...}
    rms_norm_eps: float = 1e-6  # LlamaConfig's default; TinyLlama and Llama 3.1 use 1e-5
    # a checkpoint's config.head_dim where it is not hidden / heads (Llama-3.1-Minitron-4B-Width: 3072 / 32 heads
    # of 128); None: hidden / heads, as in every preset
    explicit_head_dim: int | None = None
    family: str = "llama"  # the HF model_type; its block's modules come from axonn.plans
    tied: bool = False  # the LM head is the input embedding (tie_word_embeddings: SmolLM2, Llama 3.2 1B/3B, ...)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    def num_params(self, tied_embeddings: bool | None = None) -> int:
        """Exact parameter count of the family's HF CausalLM with this shape: the block's Linears, their
        biases and norms as :mod:`axonn.plans` lists them, the embedding, the LM head (none of its own when
        ``tied_embeddings``, default: the shape's ``tied``) and the final norm."""
        tied_embeddings = self.tied if tied_embeddings is None else tied_embeddings
        from axonn.plans import dims_of_shape, final_norm_parameters, get_plan, layer_parameters

        plan, dims = get_plan(self.family), dims_of_shape(self)
        per_layer = sum(layer_parameters(plan, dims).values())
        emb = self.vocab * self.hidden
        head = 0 if tied_embeddings else self.vocab * self.hidden
        return self.layers * per_layer + emb + head + final_norm_parameters(plan, dims)

    def as_family(self, family: str) -> "ModelShape":
        """This shape as a model of ``family`` (a HF ``model_type`` with a plan in :mod:`axonn.plans`): the same
        layers, widths, vocabulary and RoPE.  GPT-NeoX has no grouped-query attention: its KV heads are its heads
        (and its head_dim is hidden / heads).  The name says the family when it is not the preset's own."""
        from dataclasses import replace

        from axonn.plans import get_plan

        get_plan(family)  # an unknown family is refused, naming the supported ones
        if family == self.family:
            return self
        if family == "gpt_neox" and self.explicit_head_dim:
            raise ValueError(f"{self.name} has head_dim {self.explicit_head_dim}, not hidden / heads = "
                             f"{self.hidden // self.heads}: GPT-NeoX cannot hold it (its head_dim is hidden / heads)")
        kv = self.heads if family == "gpt_neox" else self.kv_heads
        return replace(self, name=f"{self.name} ({family})", family=family, kv_heads=kv)

    def hf_config(self, vocab_size: int | None = None, **overrides):
        """The family's own ``transformers`` config with this shape (``vocab_size`` overrides the preset's;
        ``overrides`` any config field): ``LlamaConfig``, ``MistralConfig``, ``Qwen2Config``, ``Qwen3Config``,
        ``Olmo2Config`` or ``GPTNeoXConfig``, tied as the shape says.

        Every family gets layers, hidden, heads, FFN width, vocabulary, context and RoPE theta/scaling from the
        shape, and its norm epsilon from ``rms_norm_eps`` (GPT-NeoX: ``layer_norm_eps``); the rest are the
        family's own defaults (Mistral's 4096-token sliding window, Qwen2's q/k/v biases, GPT-NeoX's rotary
        fraction 0.25, parallel residual and biases).  Llama keeps ``LlamaConfig``'s token ids; the other
        families get none (``pad_token_id`` None: no embedding row is frozen as padding; the tokenizer knows its
        own ids).  KV heads other than the heads are refused for GPT-NeoX.
        """
        import transformers

        from axonn.plans import get_plan

        plan = get_plan(self.family)
        if self.family == "gpt_neox" and (self.kv_heads != self.heads or self.explicit_head_dim):
            raise ValueError(f"{self.name}: GPT-NeoX has no grouped-query attention and head_dim hidden / heads; "
                             f"kv_heads {self.kv_heads} != heads {self.heads} (use ModelShape.as_family('gpt_neox'))")
        kw = dict(vocab_size=vocab_size or self.vocab, hidden_size=self.hidden, intermediate_size=self.ffn,
                  num_hidden_layers=self.layers, num_attention_heads=self.heads,
                  max_position_embeddings=self.max_seq, tie_word_embeddings=self.tied)
        if self.family == "gpt_neox":
            kw.update(rotary_emb_base=self.rope_theta, layer_norm_eps=self.rms_norm_eps)
        else:
            kw.update(num_key_value_heads=self.kv_heads, rope_theta=self.rope_theta, rms_norm_eps=self.rms_norm_eps)
        if self.family != "llama":
            kw.update(pad_token_id=None, bos_token_id=None, eos_token_id=None)
        if self.rope_scaling:
            kw["rope_scaling"] = dict(self.rope_scaling)
        if self.explicit_head_dim or self.family == "qwen3":  # Qwen3Config's default head_dim is 128, not h / heads
            kw["head_dim"] = self.head_dim
        kw.update(overrides)
        return getattr(transformers, plan.hf_class.replace("ForCausalLM", "Config"))(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_hf_config(config, name: str = "checkpoint") -> "ModelShape":
        """The shape of a HF config of a family with a plan (e.g. a ``--init`` checkpoint's): its ``model_type`` is
        the family; GPT-NeoX's fields are its own (no KV heads: the heads; ``layer_norm_eps``; RoPE base
        ``rotary_emb_base``)."""
        from axonn.plans import get_plan

        family = config.model_type
        get_plan(family)  # a model_type without a plan is refused, naming the supported ones
        head_dim = getattr(config, "head_dim", None)
        if head_dim == config.hidden_size // config.num_attention_heads:
            head_dim = None
        neox = family == "gpt_neox"
        eps = getattr(config, "layer_norm_eps" if neox else "rms_norm_eps", 1e-5 if neox else 1e-6)
        kv_heads = config.num_attention_heads if neox else config.num_key_value_heads
        return ModelShape(name=name, layers=config.num_hidden_layers, hidden=config.hidden_size,
                           heads=config.num_attention_heads, kv_heads=kv_heads or config.num_attention_heads,
                           ffn=config.intermediate_size, vocab=config.vocab_size,
                           max_seq=config.max_position_embeddings, explicit_head_dim=head_dim,
                           rms_norm_eps=float(eps), family=family,
                           tied=bool(getattr(config, "tie_word_embeddings", False)), **_rope_of(config))


def _rope_of(config) -> dict:
    """``rope_theta`` and ``rope_scaling`` (None for plain RoPE) of a HF config: transformers 5 keeps both in
    ``rope_parameters``, 4.x in ``rope_theta`` (GPT-NeoX: ``rotary_emb_base``) and ``rope_scaling``.  Keys that
    are not scaling (GPT-NeoX's ``partial_rotary_factor``) are left out."""
    params = getattr(config, "rope_parameters", None)
    if not params:
        theta = getattr(config, "rope_theta", None) or getattr(config, "rotary_emb_base", None) or 10000.0
        params = {**(getattr(config, "rope_scaling", None) or {}), "rope_theta": theta}
    scaling = {k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    plain = scaling.get("rope_type", scaling.get("type", "default")) == "default"
    return {"rope_theta": float(params.get("rope_theta", 10000.0)), "rope_scaling": None if plain else scaling}


@lru_cache(maxsize=None)
def _load() -> dict[str, dict]:
    with open(_PRESETS_FILE) as f:
        return yaml.safe_load(f)


def preset_names() -> list[str]:
    return list(_load().keys())


def get_preset(name: str, family: str | None = None) -> ModelShape:
    """The named preset, as a model of ``family`` when given (:meth:`ModelShape.as_family`; None: the preset's
    own); an unknown name or family raises ``ValueError`` listing the valid ones."""
    presets = _load()
    if name not in presets:
        raise ValueError(f"unknown size {name!r}: choose one of {', '.join(presets)}")
    shape = ModelShape(name=name, **presets[name])
    return shape if family is None else shape.as_family(family)
