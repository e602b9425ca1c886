"""axonn.clip_grad_norm_ on one process equals torch.nn.utils.clip_grad_norm_ (total and clipped grads)."""
from __future__ import annotations

import pytest
import torch

import axonn


@pytest.fixture(scope="module")
def grid():
    return axonn.init()


def _grads(dtype: torch.dtype, scale: float) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (7, 3, 5), (1,), (300,)]
    a = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        p.grad = (torch.randn(p.shape, generator=g) * scale).to(dtype)
        q.grad = p.grad.clone()
    a[1].grad = None  # a parameter without a gradient is skipped
    b[1].grad = None
    return a, b


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
@pytest.mark.parametrize("scale", [10.0, 1e-5])  # clipped / untouched
def test_matches_torch_clip(grid, norm_type: float, scale: float) -> None:
    ours, ref = _grads(torch.float32, scale)
    tot = axonn.clip_grad_norm_(ours, 1.0, norm_type=norm_type, grid=grid)
    tot_ref = torch.nn.utils.clip_grad_norm_(ref, 1.0, norm_type=norm_type)
    torch.testing.assert_close(tot, tot_ref.float(), rtol=1e-5, atol=0)
    for p, q in zip(ours, ref):
        if q.grad is None:
            assert p.grad is None
        else:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)
    if scale < 1:  # total below max_norm: gradients are bit-identical (multiplied by exactly 1)
        fresh, _ = _grads(torch.float32, scale)
        assert all(p.grad is None or torch.equal(p.grad, f.grad) for p, f in zip(ours, fresh))


def test_mixed_dtypes_clip_every_group(grid) -> None:
    a, _ = _grads(torch.float32, 10.0)
    b, _ = _grads(torch.bfloat16, 10.0)
    params = a + b
    expect = torch.stack([p.grad.float().norm() for p in params if p.grad is not None]).norm()
    tot = axonn.clip_grad_norm_(params, 0.5, grid=grid)
    torch.testing.assert_close(tot, expect, rtol=1e-5, atol=0)
    after = torch.stack([p.grad.float().norm() for p in params if p.grad is not None]).norm()
    torch.testing.assert_close(after, torch.tensor(0.5), rtol=1e-2, atol=0)  # bf16 rounding
    assert all(p.grad.dtype == p.dtype for p in params if p.grad is not None)


def test_one_world_all_reduce_weights_each_shard_by_its_copies(monkeypatch) -> None:
    """On a 2 x 2 x 2 tensor grid: one all-reduce per step, over the world, whatever axes the
    parameters are sharded on; a shard split over axes S enters with weight |S| / world (its
    world / |S| copies then sum to one)."""
    import torch.distributed as dist

    from axonn.grid import Grid, coords_of
    from axonn.sharding import ShardSpec

    sizes = {"data": 1, "depth": 2, "row": 2, "col": 2}
    grid = Grid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=8, backend="gloo",
                device=torch.device("cpu"))
    monkeypatch.setattr(grid, "group", lambda axes: f"group{tuple(axes)}")
    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: calls.append(group))
    params = []
    for axes, value in (((), 1.0), (("row",), 2.0), (("depth", "row", "col"), 3.0)):
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.full((4,), value)
        p._axonn_spec = ShardSpec((4,), ((0, 4),), shard_axes=axes)
        params.append(p)
    total = axonn.clip_grad_norm_(params, 1e9, grid=grid)
    assert calls == ["group('data', 'depth', 'row', 'col')"]  # one, over the world
    # the mocked all-reduce leaves this rank's weighted share, which the 8 ranks' shares would sum
    want = (4 * 1.0 * 1 / 8 + 4 * 4.0 * 2 / 8 + 4 * 9.0 * 8 / 8) ** 0.5
    assert float(total) == pytest.approx(want)
