"""axonn.parallelize: the parallel model equals the serial one on every 4D grid (multi-process gloo on CPU), a
model it cannot shard is refused before it is touched, and clip_grad_norm_ equals torch's on one process.

Each worker launch runs *all* checks for several grids inside one process group
(see tests/axonn_workers/grid_checks.py): logits, loss and every gathered
gradient within 1e-5 relative of the serial model, clip_grad_norm_, a Linear
stack with biases, greedy generate, 10 AdamW steps following the serial loss
curve, and overlap on == overlap off.
"""
from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

import axonn
from tests.forked import run_python
from tests.support import WORKERS, fake_grid

_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)


def _run(nproc: int, grids: list[str], timeout: float, env: dict | None = None) -> str:
    codes, out = launcher.launch("grid_checks.py", nproc, grids, timeout=timeout, extra_env=env)
    assert codes == [0] * nproc, f"return codes {codes}\n{out}"
    for g in grids:
        d, r, c, z = g.split(",")
        assert f"OK grid data={d} row={r} col={c} depth={z}" in out, out
    return out


@pytest.mark.timeout(120)
def test_a_one_rank_grid_runs_in_plain_python_without_a_launcher() -> None:
    """A 1x1x1x1 grid works in a plain python process with no launcher env vars."""
    env = launcher._env({"AXONN_TEST_STEPS": "5"})
    res = run_python([str(WORKERS / "grid_checks.py"), "1,1,1,1"], env=env, timeout=110)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK grid data=1 row=1 col=1 depth=1" in res.stdout


@pytest.mark.timeout(300)
def test_each_axis_alone_on_two_ranks_equals_serial() -> None:
    """Also exercises the gloo reduce-scatter fallback (all-reduce + slice); world 8 uses the native one."""
    _run(2, ["1,2,1,1", "1,1,2,1", "1,1,1,2", "2,1,1,1"], timeout=280, env={"AXONN_RS_FALLBACK": "1"})


@pytest.mark.slow  # (42 s; the default suite runs 8-rank grids of all four axes in the compiled-model test)
@pytest.mark.timeout(400)
def test_every_axis_together_on_eight_ranks_equals_serial() -> None:
    _run(8, ["1,2,2,2", "2,2,2,1"], timeout=380)


@pytest.mark.slow  # (60 s on 4 ranks, 110 s on 8; the default suite checks every family on 1,2,2,1 in the
@pytest.mark.timeout(400)  # checkpoint launch)
@pytest.mark.parametrize("nproc,grids", [(4, ["1,2,2,1", "2,1,1,2", "1,1,2,2"]), (8, ["1,2,2,2", "2,2,1,2"])])
def test_model_families_match_serial_on_several_grids(nproc: int, grids: list[str]) -> None:
    """Mistral, Qwen2, Qwen3, OLMo 2 and GPT-NeoX (axonn.plans): loss, logits and every gradient of the
    parallel model (also with activation checkpointing) equal the serial HF model's on grids of every axis."""
    codes, out = launcher.launch("family_checks.py", nproc, grids, timeout=380)
    assert codes == [0] * nproc, f"return codes {codes}\n{out}"
    for g in grids:
        d, r, c, z = g.split(",")
        assert f"OK families grid data={d} row={r} col={c} depth={z}" in out, out


@pytest.mark.parametrize("grid_kw, kw, match", [
    (dict(row=3), dict(num_attention_heads=6, num_key_value_heads=2, hidden_size=96),
     r"num_key_value_heads=2 is not divisible by the row \(G_intra_r\) axis size 3"),
    (dict(row=4), dict(num_attention_heads=2, num_key_value_heads=2, hidden_size=64),
     r"num_attention_heads=2 is not divisible by the row"),
    (dict(col=3), dict(), r"hidden_size=64 is not divisible by the col \(G_intra_c\) axis size 3"),
    (dict(row=2), dict(intermediate_size=129), r"intermediate_size \(FFN\)=129 is not divisible by the row"),
    (dict(row=2, col=2), dict(vocab_size=250), r"vocab_size=250 is not divisible by the row x col .* size 4"),
])
def test_indivisible_model_refused(grid_kw, kw, match) -> None:
    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn

    model = tiny_llama(0, **kw)
    before = {n: p.clone() for n, p in model.named_parameters()}
    with pytest.raises(ValueError, match=match):
        axonn.parallelize(model, grid=fake_grid(**grid_kw))
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), "model modified"


def test_unsupported_model_refused() -> None:
    import axonn

    with pytest.raises(TypeError, match="supports LlamaForCausalLM"):
        axonn.parallelize(torch.nn.Linear(4, 4), grid=fake_grid())


@pytest.mark.timeout(300)
@pytest.mark.parametrize("grid,flags", [("1,2,2,2", []),  # with activation checkpointing: slow (50 s)
                                        pytest.param("2,2,1,2", ["--checkpointing"], marks=pytest.mark.slow)])
def test_compiled_parallel_model_shares_graphs_across_layers(grid, flags) -> None:
    """torch.compile splits only at axonn's collectives: no recompilation, as many graphs for 4 layers as for 2,
    and the compiled loss and gradients equal the eager ones (fake world, one process)."""
    env = launcher._env({})
    res = run_python([str(WORKERS / "compile_checks.py"), grid, *flags], env=env, timeout=280)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"OK compile {grid}" in res.stdout


@pytest.mark.parametrize("grid_kw", [dict(row=2), dict()], ids=["tensor-parallel", "data-parallel"])
def test_real_model_is_parallelized_onto_the_grids_device(grid_kw) -> None:
    """A full model built on the host lands on the requested device (the grid's by default: the GPU
    under NCCL, which takes no host tensors), shards and all; nothing stays where it was built."""
    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn

    model = axonn.parallelize(tiny_llama(0), grid=fake_grid(**grid_kw), device="meta")
    assert {str(t.device) for t in [*model.parameters(), *model.buffers()]} == {"meta"}


def test_weight_decay_reaches_the_sharded_matrices() -> None:
    """On a tensor-parallel grid every weight is a flat 1-D shard: weight decay must still go to the
    matrices (judged by their full shape), the same ones as in the serial model, or --weight-decay
    would silently do nothing there."""
    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn
    from memorization.training.train import param_groups

    serial = tiny_llama(0)
    want = {n for n, p in serial.named_parameters() if p.ndim >= 2}
    par = axonn.parallelize(tiny_llama(0), grid=fake_grid(row=2, depth=2), device="meta")
    assert all(p.ndim == 1 for p in par.parameters())  # the shards are flat
    names = {id(p): n for n, p in par.named_parameters()}
    decay, no_decay = param_groups(par, 0.1)
    assert {names[id(p)] for p in decay["params"]} == want and decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0 and len(decay["params"]) + len(no_decay["params"]) == len(names)


# ------------------------------------------------ indivisible shapes are refused with the sizes that work

@pytest.mark.parametrize("grid_kw, kw, match", [
    # Llama-3-like: fewer KV heads than the row size
    (dict(row=4), dict(num_attention_heads=4, num_key_value_heads=2),
     r"num_key_value_heads=2 is not divisible by the row \(G_intra_r\) axis size 4; use a G_intra_r that "
     r"divides 2 \(nearest: 2\) and put the remaining factor of tensor parallelism on G_intra_c or G_intra_d"),
    (dict(col=3), dict(), r"hidden_size=64 is not divisible .* size 3; use a G_intra_c that divides 64 "
                          r"\(nearest: 2 or 4\) and put .* on G_intra_r or G_intra_d"),
    (dict(row=2), dict(intermediate_size=129), r"intermediate_size \(FFN\)=129 .* divides 129 \(nearest: 1 or 3\)"),
])
def test_indivisible_model_error_says_how_to_fix(grid_kw, kw, match) -> None:
    """A bad grid is refused before the model is touched, with the sizes that would work."""
    import sys

    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn

    with pytest.raises(ValueError, match=match):
        axonn.parallelize(tiny_llama(0, **kw), grid=fake_grid(**grid_kw))


# ------------------------------------------------ clip_grad_norm_ on one process

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
def test_clip_grad_norm_equals_torchs_on_one_process(grid, norm_type: float, scale: float) -> None:
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


def test_clip_grad_norm_clips_every_dtype_group(grid) -> None:
    a, _ = _grads(torch.float32, 10.0)
    b, _ = _grads(torch.bfloat16, 10.0)
    params = a + b
    expect = torch.stack([p.grad.float().norm() for p in params if p.grad is not None]).norm()
    tot = axonn.clip_grad_norm_(params, 0.5, grid=grid)
    torch.testing.assert_close(tot, expect, rtol=1e-5, atol=0)
    after = torch.stack([p.grad.float().norm() for p in params if p.grad is not None]).norm()
    torch.testing.assert_close(after, torch.tensor(0.5), rtol=1e-2, atol=0)  # bf16 rounding
    assert all(p.grad.dtype == p.dtype for p in params if p.grad is not None)


def test_clip_grad_norm_reduces_once_over_the_world_weighting_each_shard_by_its_copies(monkeypatch) -> None:
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
