"""axonn/recompute.py: activation recomputation (checkpointing) of a layer gives plain autograd's gradients."""
from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("as_tuple", [False, True])
def test_sliced_recompute_gradients_and_layer_return_shapes(as_tuple):
    """The checkpoint function gives plain autograd's gradients, for tensor- and tuple-returning layers."""
    import axonn
    from axonn.recompute import sliced_recompute

    grid = axonn.init()
    w = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(3, 5, 8, dtype=torch.float64)

    def layer(h):
        y = torch.tanh(h @ w) + h
        return (y, None) if as_tuple else y

    x = x0.clone().requires_grad_(True)
    ref = layer(x)
    (ref[0] if as_tuple else ref).pow(2).sum().backward()
    gw, gx = w.grad.clone(), x.grad.clone()
    w.grad = None
    x = x0.clone().requires_grad_(True)
    out = sliced_recompute(grid)(layer, x)
    assert isinstance(out, tuple) == as_tuple and (not as_tuple or (len(out) == 2 and out[1] is None))
    (out[0] if as_tuple else out).pow(2).sum().backward()
    assert torch.allclose(w.grad, gw) and torch.allclose(x.grad, gx)
