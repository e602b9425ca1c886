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
    cpu_ok: bool = False
    rms_norm_eps: float = 1e-6  # LlamaConfig's default; TinyLlama and Llama 3.1 use 1e-5
    # a checkpoint's config.head_dim where it is not hidden / heads (Llama-3.1-Minitron-4B-Width: 3072 / 32 heads
    # of 128); None: hidden / heads, as in every preset
    explicit_head_dim: int | None = None
    family: str = "llama"  # the HF model_type; its block's modules come from axonn.plans

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    def num_params(self, tied_embeddings: bool = False) -> int:
        """Exact parameter count of the family's HF CausalLM with this shape: the block's Linears, their
        biases and norms as :mod:`axonn.plans` lists them, the embedding, the LM head and the final norm."""
        from axonn.plans import dims_of_shape, final_norm_parameters, get_plan, layer_parameters

        plan, dims = get_plan(self.family), dims_of_shape(self)
        per_layer = sum(layer_parameters(plan, dims).values())
        emb = self.vocab * self.hidden
        head = 0 if tied_embeddings else self.vocab * self.hidden
        return self.layers * per_layer + emb + head + final_norm_parameters(plan, dims)

    def llama_config(self, vocab_size: int | None = None, **overrides):
        """A ``transformers.LlamaConfig`` with this shape (vocab_size overrides the preset's); a shape of
        another family is refused (its presets are planner shapes)."""
        from transformers import LlamaConfig

        if self.family != "llama":
            raise ValueError(f"{self.name} is a {self.family} shape, not a Llama one: build it from its own "
                             "HF config (the presets of other families are planner shapes)")

        kw = dict(
            vocab_size=vocab_size or self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.ffn,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_seq,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=False,
        )
        if self.rope_scaling:
            kw["rope_scaling"] = dict(self.rope_scaling)
        if self.explicit_head_dim:
            kw["head_dim"] = self.explicit_head_dim
        kw.update(overrides)
        return LlamaConfig(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_llama_config(config, name: str = "checkpoint") -> "ModelShape":
        """The shape of a ``LlamaConfig`` (e.g. a ``--init`` checkpoint's); CPU-trainable when it is no
        larger than the largest preset marked ``cpu_ok``."""
        head_dim = getattr(config, "head_dim", None)
        if head_dim == config.hidden_size // config.num_attention_heads:
            head_dim = None
        shape = ModelShape(name=name, layers=config.num_hidden_layers, hidden=config.hidden_size,
                           heads=config.num_attention_heads, kv_heads=config.num_key_value_heads,
                           ffn=config.intermediate_size, vocab=config.vocab_size,
                           max_seq=config.max_position_embeddings, explicit_head_dim=head_dim,
                           rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)), **_rope_of(config))
        cpu_max = max(get_preset(n).num_params() for n in preset_names() if get_preset(n).cpu_ok)
        return ModelShape(**{**asdict(shape), "cpu_ok": shape.num_params() <= cpu_max})


def _rope_of(config) -> dict:
    """``rope_theta`` and ``rope_scaling`` (None for plain RoPE) of a LlamaConfig: transformers 5 keeps
    both in ``rope_parameters``, 4.x in ``rope_theta`` and ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if not params:
        params = {**(getattr(config, "rope_scaling", None) or {}), "rope_theta": getattr(config, "rope_theta", 10000.0)}
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    plain = scaling.get("rope_type", scaling.get("type", "default")) == "default"
    return {"rope_theta": float(params.get("rope_theta", 10000.0)), "rope_scaling": None if plain else scaling}


@lru_cache(maxsize=None)
def _load() -> dict[str, dict]:
    with open(_PRESETS_FILE) as f:
        return yaml.safe_load(f)


def preset_names() -> list[str]:
    return list(_load().keys())


def get_preset(name: str) -> ModelShape:
    """Return the named preset; unknown names raise ``ValueError`` listing the valid ones."""
    presets = _load()
    if name not in presets:
        raise ValueError(f"unknown size {name!r}: choose one of {', '.join(presets)}")
    return ModelShape(name=name, **presets[name])
