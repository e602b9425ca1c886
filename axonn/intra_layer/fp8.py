"""FP8 GEMMs for the tensor-parallel :class:`~axonn.intra_layer.linear.Linear`, with torchao's float8 training recipe.

A :class:`Float8Matmuls` takes the place of the Linear's three local products (``autotune.matmul``'s contract)::

    fwd(x[..., k], w[n, k])   = x wᵀ    -> [..., n]
    dgrad(dy[..., n], w[n, k]) = dy w   -> [..., k]
    wgrad(dy[m, n], x[m, k])  = dyᵀ x   -> [n, k]

Each operand is cast to float8 (e4m3; e5m2 for gradients where the recipe says so) with a dynamic scale
``s = fp8_max / amax`` over the axis the recipe names -- ``"tensorwise"``: one scale per tensor; ``"rowwise"``:
one per row of the GEMM's reduction dimension (the inner ``k`` of ``fwd``, ``n`` of ``dgrad``, ``m`` of ``wgrad``)
-- and the product runs as ``torch._scaled_mm`` (the scales divided out of the high-precision result).  The casts and
their axes are torchao's (``torchao.float8``: ``hp_tensor_to_float8_dynamic`` with the roles and axes of its
``matmul_with_hp_or_float8_args``), so on one process an FP8 Linear computes what torchao's ``Float8Linear`` does.

What stays as it was: the collectives of the 4D grid (the weight is all-gathered over depth in the compute dtype
and cast after the gather, Y is all-reduced over col, dX over row, dW reduce-scattered over depth) and the fp32
master weights, gradients and optimizer.  On a sharded grid each rank scales its own shard (the amax of its
slice, not of the full tensor): the result differs from one process's FP8 by FP8 rounding, not in meaning.

Opt-in per layer (``Linear.fp8``); :func:`enable_fp8` sets it on a model's Linears but its output head.  Needs
torchao (an optional dependency) and a GPU with FP8 tensor cores (H100/H200) to be fast; on CPU ``_scaled_mm``
runs (slowly) and the numerics can be tested.
"""
from __future__ import annotations

import torch
import torch.nn as nn

RECIPES = ("rowwise", "tensorwise")


class Float8Matmuls:
    """The Linear's ``fwd``/``dgrad``/``wgrad`` products in float8 with torchao's ``recipe`` (see module doc)."""

    def __init__(self, recipe: str = "rowwise"):
        if recipe not in RECIPES:
            raise ValueError(f"fp8 recipe must be one of {', '.join(RECIPES)}, got {recipe!r}")
        try:
            from torchao.float8 import Float8LinearConfig
            from torchao.float8.float8_training_tensor import LinearMMConfig, ScaledMMConfig
        except ImportError as e:
            raise ImportError("FP8 training needs torchao: pip install 'torchao>=0.18' (see pyproject.toml's fp8 "
                              f"extra) ({e})") from e
        self.recipe = recipe
        self.config = c = Float8LinearConfig.from_recipe_name(recipe)
        self.mm_config = LinearMMConfig(*(ScaledMMConfig(c.emulate, g.use_fast_accum, False, c.pad_inner_dim)
                                          for g in (c.gemm_config_output, c.gemm_config_grad_input,
                                                    c.gemm_config_grad_weight)))

    def _cast(self, t: torch.Tensor, cast, role: str, axis: int) -> torch.Tensor:
        """``t`` as torchao's Float8 tensor under ``cast`` (a CastConfig), scaled along ``axis`` if rowwise."""
        from torchao.float8.config import ScalingType
        from torchao.float8.float8_scaling_utils import get_maybe_axiswise_dim, hp_tensor_to_float8_dynamic
        from torchao.float8.float8_training_tensor import GemmInputRole

        if cast.scaling_type is ScalingType.DISABLED:
            return t
        return hp_tensor_to_float8_dynamic(t, cast.target_dtype, self.mm_config, gemm_input_role=GemmInputRole[role],
                                           scaling_granularity=cast.scaling_granularity,
                                           axiswise_dim=get_maybe_axiswise_dim(axis, cast.scaling_granularity),
                                           round_scales_to_power_of_2=self.config.round_scales_to_power_of_2)

    def __call__(self, op: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        c = self.config
        if op == "wgrad":  # dy[m, n]ᵀ x[m, k]
            dy = self._cast(a, c.cast_config_grad_output_for_grad_weight, "GRAD_OUTPUT", 0)
            x = self._cast(b, c.cast_config_input_for_grad_weight, "INPUT", 0)
            return torch.mm(dy.t(), x)
        lead = a.shape[:-1]
        a2 = a.reshape(-1, a.shape[-1])
        if op == "fwd":  # x[m, k] w[n, k]ᵀ
            x = self._cast(a2, c.cast_config_input, "INPUT", -1)
            w_t = self._cast(b.t(), c.cast_config_weight, "WEIGHT", 0)
            out = torch.mm(x, w_t)
        elif op == "dgrad":  # dy[m, n] w[n, k]
            dy = self._cast(a2, c.cast_config_grad_output, "GRAD_OUTPUT", -1)
            w_t = self._cast(b.t(), c.cast_config_weight_for_grad_input, "WEIGHT", -1)
            out = torch.mm(dy, w_t.t())
        else:
            raise ValueError(f"unknown product {op!r}: fwd, dgrad or wgrad")
        return out.reshape(*lead, out.shape[-1])

    def __repr__(self) -> str:
        return f"Float8Matmuls({self.recipe!r})"


def enable_fp8(model: nn.Module, recipe: str = "rowwise") -> list[str]:
    """Run ``model``'s Linears in FP8 (``recipe``) but the output head (``model.get_output_embeddings()``, kept in
    the compute dtype as usual for FP8 training); the names of the layers switched.

    axonn :class:`~axonn.intra_layer.linear.Linear` layers (a sharded grid) get :class:`Float8Matmuls` as their
    ``fp8`` products; plain ``nn.Linear`` layers (what ``axonn.parallelize`` keeps on a grid of one process) become
    torchao's ``Float8Linear`` with the same recipe (``convert_to_float8_training``).  FP8 tensor cores need both
    dimensions of each local weight block divisible by 16; a layer that is not is refused before anything changes.
    """
    from .linear import Linear

    mm = Float8Matmuls(recipe)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    ours, plain = [], []
    for name, m in model.named_modules():
        if m is head or not isinstance(m, (Linear, nn.Linear)):
            continue
        out, in_ = (m.local_out, m.local_in) if isinstance(m, Linear) else (m.out_features, m.in_features)
        if out % 16 or in_ % 16:
            raise ValueError(f"{name}: local block {out} x {in_} is not a multiple of 16, which FP8 GEMMs need; use "
                             "a grid that leaves multiples of 16 or train without --fp8")
        (ours if isinstance(m, Linear) else plain).append(name)
    if not ours and not plain:
        raise ValueError("no Linear layer to run in FP8 (the output head stays in the compute dtype)")
    for name in ours:
        model.get_submodule(name).fp8 = mm
    if plain:
        from torchao.float8 import convert_to_float8_training

        chosen = set(plain)
        convert_to_float8_training(model, config=mm.config, module_filter_fn=lambda m, fqn: fqn in chosen)
    return ours + plain
