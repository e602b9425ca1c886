"""The parallel plans of axonn/plans.py: one table per model family, read by parallelize and the planner.

The multi-rank equality checks of each family are in tests/axonn_workers/family_checks.py (one grid in the
default suite inside the checkpoint launch, three in the slow test of tests/axonn/test_parallelize.py)."""
from __future__ import annotations

import pytest

from axonn.plans import FAMILIES, LINEAR, TRANSPOSED, get_plan
from axonn.presets import ModelShape, get_preset

# each family's preset and the HF config of that release (config.json's numbers, see presets.yaml)
PRESETS = {
    "8b": ("llama", {}),
    "mistral-7b": ("mistral", dict(sliding_window=4096)),
    "qwen2-7b": ("qwen2", {}),
    "qwen3-8b": ("qwen3", dict(head_dim=128)),
    "olmo2-13b": ("olmo2", {}),
    "pythia-6.9b": ("gpt_neox", dict(rotary_pct=0.25, use_parallel_residual=True)),
}


def _hf_config(shape: ModelShape, **extra):
    from transformers import AutoConfig

    kw = dict(hidden_size=shape.hidden, intermediate_size=shape.ffn, num_hidden_layers=shape.layers,
              num_attention_heads=shape.heads, vocab_size=shape.vocab, tie_word_embeddings=False, **extra)
    if shape.family != "gpt_neox":
        kw["num_key_value_heads"] = shape.kv_heads
    return AutoConfig.for_model(shape.family, **kw)


def test_every_family_has_a_real_size_preset() -> None:
    assert {fam for fam, _ in PRESETS.values()} == set(FAMILIES)


@pytest.mark.parametrize("size", list(PRESETS))
def test_plan_describes_the_hf_model(size: str) -> None:
    """The planner's shape of each preset (parameter count, every Linear's shape and kind) is the HF model's,
    built on the meta device from the release's config."""
    import accelerate
    from transformers import AutoModelForCausalLM

    from axonn.planner.model import layer_linears, lm_head

    family, extra = PRESETS[size]
    shape = get_preset(size)
    assert shape.family == family
    with accelerate.init_empty_weights():
        model = AutoModelForCausalLM.from_config(_hf_config(shape, **extra))
    plan = get_plan(family)
    assert type(model).__name__ == plan.hf_class
    assert shape.num_params() == sum(p.numel() for p in model.parameters())
    block = getattr(getattr(model, plan.backbone), plan.layers)[0]
    rules = {r.name: r for r in plan.linears()}
    for lin in layer_linears(shape):
        mod = block.get_submodule(rules[lin.name].path)
        assert (mod.out_features, mod.in_features) == (lin.out, lin.in_), lin.name
        assert lin.transposed == (rules[lin.name].kind == TRANSPOSED)
    assert {type(m).__name__ for m in block.modules() if "Linear" in type(m).__name__} == {"Linear"}
    assert sum(1 for m in block.modules() if type(m).__name__ == "Linear") == len(layer_linears(shape))
    head = getattr(model, plan.head)
    assert (head.out_features, head.in_features) == (lm_head(shape).out, lm_head(shape).in_)


def test_llama_plan_is_the_documented_layout() -> None:
    plan = get_plan("llama")
    kinds = [(r.name, r.kind) for r in plan.linears()]
    assert kinds == [("q_proj", LINEAR), ("k_proj", LINEAR), ("v_proj", LINEAR), ("o_proj", TRANSPOSED),
                     ("gate_proj", LINEAR), ("up_proj", LINEAR), ("down_proj", TRANSPOSED)]


def test_unknown_family_is_refused() -> None:
    with pytest.raises(ValueError, match="no parallel plan for model_type 'gpt2'.*Qwen3ForCausalLM"):
        get_plan("gpt2")
    with pytest.raises(ValueError, match="no parallel plan for model_type 'gpt2'"):
        get_preset("tiny", family="gpt2")


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "llama"])
def test_planner_validity_is_what_parallelize_accepts(family: str) -> None:
    """For every family a grid is valid for the planner exactly when ``axonn.parallelize`` takes the HF model
    (both read the family's plan; test_planner checks Llama on more grids)."""
    import accelerate
    import torch
    from transformers import AutoModelForCausalLM

    import axonn
    from axonn.grid import Grid as AxisGrid, coords_of
    from axonn.planner import GridShape, divisibility_problem

    kv = 6 if family == "gpt_neox" else 3
    shape = ModelShape("t", layers=1, hidden=48, heads=6, kv_heads=kv, ffn=96, vocab=384, family=family)
    grids = [g for n in (4, 6) for g in GridShape.enumerate(n)]
    valid = {g for g in grids if divisibility_problem(shape, g) is None}
    assert 0 < len(valid) < len(grids)
    for g in grids:
        sizes = g.sizes()
        grid = AxisGrid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=g.size, backend="gloo",
                        device=torch.device("cpu"))
        with accelerate.init_empty_weights():
            model = AutoModelForCausalLM.from_config(_hf_config(shape))
        try:
            axonn.parallelize(model, grid=grid, device="meta")
            accepted = True
        except ValueError:
            accepted = False
        assert (g in valid) == accepted, (g, divisibility_problem(shape, g))


def test_a_subclass_of_a_planned_class_is_parallelized_by_its_plan() -> None:
    """As before the plans, a subclass of ``LlamaForCausalLM`` is a Llama model; an unrelated class is not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from axonn.plans import plan_of_model

    class MyLlama(LlamaForCausalLM):
        pass

    cfg = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32)
    model = MyLlama(LlamaConfig(**cfg))
    assert plan_of_model(model).model_type == "llama"
    model.config.model_type = "mistral"  # class and model_type disagree: no plan
    assert plan_of_model(model) is None
