"""FP8 Linear (``axonn.intra_layer.fp8``): on one process it computes what torchao's ``Float8Linear`` computes
(forward, input and weight gradients), its products carry FP8 rounding but no more, and :func:`enable_fp8` switches
the Linears but the output head and refuses blocks FP8 GEMMs cannot take."""
from __future__ import annotations

import pytest
import torch

from tests.support import fake_grid

pytest.importorskip("torchao.float8", reason="FP8 needs torchao (pip install 'torchao>=0.18')")


def _pair(recipe: str, n_in: int = 64, n_out: int = 48):
    """(our FP8 Linear on a 1-process grid, torchao's Float8Linear) with the same weight."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from axonn.intra_layer import Linear
    from axonn.intra_layer.fp8 import Float8Matmuls

    ref = torch.nn.Sequential(torch.nn.Linear(n_in, n_out, bias=False))
    ours = Linear(n_in, n_out, bias=False, expert_mode=True, grid=fake_grid(), init=False)
    ours.load_full(ref[0].weight.detach())
    ours.fp8 = Float8Matmuls(recipe)
    convert_to_float8_training(ref, config=Float8LinearConfig.from_recipe_name(recipe))
    return ours, ref


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_linear_equals_torchao_float8_linear(recipe):
    """Same output, input gradient and weight gradient as torchao's Float8Linear with the same recipe."""
    ours, ref = _pair(recipe)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=g)
    dy = torch.randn(3, 5, 48, generator=g)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ours(xa), ref(xb)
    ya.backward(dy)
    yb.backward(dy)
    torch.testing.assert_close(ya, yb, rtol=0, atol=0)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.weight.grad.view(48, 64), ref[0].weight.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_products_carry_fp8_rounding_only(recipe):
    """Each of the three products differs from the fp32 one (the operands were rounded to e4m3/e5m2) by no more
    than FP8's rounding: relative Frobenius error between 1e-4 and 10% (e4m3 keeps 3 mantissa bits: ~2-4%)."""
    from axonn.intra_layer.fp8 import Float8Matmuls

    mm = Float8Matmuls(recipe)
    g = torch.Generator().manual_seed(1)
    x, w, dy = torch.randn(32, 64, generator=g), torch.randn(48, 64, generator=g), torch.randn(32, 48, generator=g)
    for op, a, b, exact in (("fwd", x, w, x @ w.t()), ("dgrad", dy, w, dy @ w), ("wgrad", dy, x, dy.t() @ x)):
        err = float((mm(op, a, b) - exact).norm() / exact.norm())
        assert 1e-4 < err < 0.1, (op, err)


@pytest.mark.parametrize("sharded", [False, True])
def test_enable_fp8_switches_every_linear_but_the_head(sharded):
    """On a grid of one process (HF's nn.Linear kept) the block Linears become torchao's Float8Linear; on a sharded
    grid the axonn Linears get the FP8 products; the output head stays as it was either way."""
    from torchao.float8.float8_linear import Float8Linear

    import axonn
    from axonn.intra_layer import Linear
    from axonn.intra_layer.fp8 import enable_fp8
    from memorization.training.models import build_model

    model = build_model("tiny", 512, seed=0)
    if sharded:  # the swap needs no process group; nothing here communicates
        model = axonn.parallelize(model, grid=fake_grid(row=2))
    names = enable_fp8(model, "rowwise")
    head = model.get_output_embeddings()

    def kind(m):
        return isinstance(m, Linear) and m.fp8 is not None if sharded else isinstance(m, Float8Linear)

    fp8 = {n for n, m in model.named_modules() if kind(m)}
    blocks = {n for n, m in model.named_modules() if isinstance(m, (Linear, torch.nn.Linear)) and m is not head}
    assert set(names) == fp8 == blocks and len(blocks) == 7 * model.config.num_hidden_layers
    assert not kind(head)


def test_enable_fp8_refuses_what_it_cannot_run():
    """A block FP8 GEMMs cannot take, a model without Linears and an unknown recipe are refused with the fix."""
    from axonn.intra_layer import Linear
    from axonn.intra_layer.fp8 import enable_fp8

    with pytest.raises(ValueError, match="multiple of 16"):
        enable_fp8(torch.nn.ModuleDict({"a": Linear(24, 32, expert_mode=True, grid=fake_grid())}))
    with pytest.raises(ValueError, match="multiple of 16"):
        enable_fp8(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 20)))
    with pytest.raises(ValueError, match="no Linear"):
        enable_fp8(torch.nn.Sequential(torch.nn.ReLU()))
    with pytest.raises(ValueError, match="rowwise, tensorwise"):
        enable_fp8(torch.nn.Sequential(torch.nn.Linear(16, 16)), "blockwise")
