"""Parallel == serial for the 4D grid (multi-process gloo on CPU), and bad-input errors.

Each worker launch runs *all* checks for several grids inside one process group
(see tests/axonn_workers/grid_checks.py): logits, loss and every gathered
gradient within 1e-5 relative of the serial model, clip_grad_norm_, a Linear
stack with biases, greedy generate, 10 AdamW steps following the serial loss
curve, and overlap on == overlap off.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support import REPO, WORKERS

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
def test_single_process_plain_python() -> None:
    """A 1x1x1x1 grid works in a plain python process with no launcher env vars."""
    env = launcher._env({"AXONN_TEST_STEPS": "5"})
    res = subprocess.run([sys.executable, str(WORKERS / "grid_checks.py"), "1,1,1,1"], env=env,
                         capture_output=True, text=True, timeout=110)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK grid data=1 row=1 col=1 depth=1" in res.stdout


@pytest.mark.timeout(300)
def test_world2_each_axis_alone() -> None:
    """Also exercises the gloo reduce-scatter fallback (all-reduce + slice); world 8 uses the native one."""
    _run(2, ["1,2,1,1", "1,1,2,1", "1,1,1,2", "2,1,1,1"], timeout=280, env={"AXONN_RS_FALLBACK": "1"})


@pytest.mark.slow  # (42 s; the default suite runs 8-rank grids of all four axes in the compiled-model test)
@pytest.mark.timeout(400)
def test_world8_axes_together() -> None:
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


@pytest.mark.timeout(60)
def test_dead_rank_fails_fast() -> None:
    t0 = time.time()
    codes, out = launcher.launch("dead_rank.py", 2, timeout=50, extra_env={"AXONN_TIMEOUT": "10"})
    assert codes[1] == 3, out
    assert codes[0] == 7, f"rank 0 should have raised, got rc={codes[0]}\n{out}"
    assert time.time() - t0 < 45


SHAPES = [(1, 1, 1, 1), (2, 4, 1, 8), (3, 1, 2, 1), (1, 2, 3, 2), (2, 3, 2, 5), (5, 1, 1, 3)]


@pytest.mark.parametrize("sizes", SHAPES)
def test_grid_shape_text_round_trips_in_the_order_of_dash_dash_grid(sizes) -> None:
    from axonn.grid import GridShape

    g = GridShape(*sizes)
    assert str(g) == ",".join(map(str, sizes)) and (g.data, g.row, g.col, g.depth) == sizes
    back = GridShape.parse(str(g))
    assert back == g and type(back) is GridShape and back.size == sizes[0] * sizes[1] * sizes[2] * sizes[3]


@pytest.mark.parametrize("sizes", SHAPES)
def test_grid_shape_strides_are_the_live_grids_rank_order(sizes) -> None:
    """For every rank: its coordinates (``axonn.grid.coords_of``) weighted by the strides give the rank back,
    ``Grid.rank_of`` agrees, and one step along an axis moves the rank by that axis's stride."""
    from axonn.grid import AXES, Grid, GridShape, coords_of

    g = GridShape(*sizes)
    live = Grid(sizes=g.sizes(), coords=coords_of(0, g.sizes()), rank=0, world_size=g.size, backend="gloo",
                device=torch.device("cpu"))
    assert live.shape == g and g.stride("col") == 1
    for rank in range(g.size):
        c = coords_of(rank, g.sizes())
        assert sum(c[a] * g.stride(a) for a in AXES) == rank == live.rank_of(**c)
        for a in AXES:
            if c[a] + 1 < getattr(g, a):
                assert live.rank_of(**{**c, a: c[a] + 1}) - rank == g.stride(a), (rank, a)


@pytest.mark.parametrize("text", ["1,2,2", "1,2,x,2", "0,1,1,1", "1,1,1,-2", "", "1,2,2,2,1", "1.5,1,1,1", " "])
def test_bad_grid_text_refused(text: str) -> None:
    from axonn.grid import GridShape

    want = f"grid {text!r}: give four positive integers data,row,column,depth (e.g. 1,2,2,2)"
    with pytest.raises(ValueError, match=f"^{re.escape(want)}$"):
        GridShape.parse(text)
    with pytest.raises(ValueError, match="unknown grid axis 'column'"):
        GridShape(1, 1, 1, 1).stride("column")


def test_init_takes_a_grid_shape() -> None:
    """``axonn.init(GridShape)`` builds the grid the four sizes build; giving both is refused."""
    import axonn
    from axonn.grid import GridShape

    os.environ.pop("WORLD_SIZE", None)
    assert axonn.init(GridShape(1, 1, 1, 1)).shape == axonn.init(1, 1, 1, 1).shape == GridShape(1, 1, 1, 1)
    with pytest.raises(ValueError, match=r"G_intra_c=2 = 2 != world size 1"):
        axonn.init(GridShape.parse("1,1,2,1"))
    with pytest.raises(TypeError, match="as one GridShape or as the four sizes"):
        axonn.init(GridShape(1, 1, 1, 1), 2)


@pytest.mark.parametrize("cmd", [["recipes/memorize.py", "--grid", "2,2"],
                                 ["benchmarks/collectives.py", "--grid", "1,x,1,1"]])
def test_cli_grid_errors_say_what_to_give(cmd: list[str]) -> None:
    r = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "four positive integers data,row,column,depth" in r.stderr, r.stderr


def test_grid_product_mismatch_refused() -> None:
    import axonn

    os.environ.pop("WORLD_SIZE", None)
    with pytest.raises(ValueError, match=r"G_intra_r=2 x G_intra_c=1 = 4 != world size 1; change G_intra_r"):
        axonn.init(G_data=2, G_intra_r=2)


@pytest.mark.parametrize("env, rank, count, want", [
    ({"LOCAL_RANK": "3"}, 11, 4, 3),                     # torchrun, all 4 GPUs visible (Perlmutter, Alps)
    ({"LOCAL_RANK": "5", "SLURM_LOCALID": "5"}, 13, 1, 0),  # srun --gpu-bind=closest: one visible GCD (Frontier)
    ({"SLURM_LOCALID": "2"}, 6, 4, 2),                   # srun without torchrun's variables
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "1"}, 9, 8, 1),      # Open MPI mpiexec
    ({"MPI_LOCALRANKID": "7"}, 7, 8, 7),                 # MPICH / Hydra mpiexec
    # mpiexec inside an sbatch job: every rank inherits the batch shell's SLURM_LOCALID=0
    ({"SLURM_LOCALID": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3, 8, 3),
    ({"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "5"}, 13, 8, 5),
    ({}, 6, 4, 2),                                       # nothing said: the global rank modulo the devices
])
def test_local_device_index(env, rank, count, want) -> None:
    from axonn.grid import local_device_index

    assert local_device_index(rank, count, env) == want


@pytest.mark.parametrize("env, want", [
    ({"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "4"}, 8),  # torchrun's own count first
    ({"SLURM_NTASKS_PER_NODE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),  # mpiexec inside sbatch
    ({"SLURM_TASKS_PER_NODE": "8(x2)"}, 8),  # plain srun -n16 -N2: no SLURM_NTASKS_PER_NODE
    ({"SLURM_TASKS_PER_NODE": "3(x2),2"}, 3),  # uneven: the fullest node's share
    ({"PALS_LOCAL_SIZE": "4"}, 4),
])
def test_ranks_per_node(env, want) -> None:
    from axonn.grid import ranks_per_node

    assert ranks_per_node(env) == want


def test_local_device_index_without_a_gpu_says_what_to_check() -> None:
    from axonn.grid import local_device_index

    with pytest.raises(RuntimeError, match="sees none: check CUDA_VISIBLE_DEVICES"):
        local_device_index(0, 0, {})


def _fake_grid(data=1, depth=1, row=1, col=1):
    from axonn.grid import Grid, coords_of

    sizes = {"data": data, "depth": depth, "row": row, "col": col}
    return Grid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=data * depth * row * col,
                backend="gloo", device=torch.device("cpu"))


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
        axonn.parallelize(model, grid=_fake_grid(**grid_kw))
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters()), "model modified"


def test_unsupported_model_refused() -> None:
    import axonn

    with pytest.raises(TypeError, match="supports LlamaForCausalLM"):
        axonn.parallelize(torch.nn.Linear(4, 4), grid=_fake_grid())


def test_linear_indivisible_refused() -> None:
    from axonn.intra_layer import Linear

    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by the row axis size G_intra_r=4"):
        Linear(8, 10, grid=_fake_grid(row=4))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("grid,flags", [("1,2,2,2", []), ("2,2,1,2", ["--checkpointing"])])
def test_compiled_parallel_model_shares_graphs_across_layers(grid, flags) -> None:
    """torch.compile splits only at axonn's collectives: no recompilation, as many graphs for 4 layers as for 2,
    and the compiled loss and gradients equal the eager ones (fake world, one process)."""
    env = launcher._env({})
    res = subprocess.run([sys.executable, str(WORKERS / "compile_checks.py"), grid, *flags], env=env,
                         capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"OK compile {grid}" in res.stdout


@pytest.mark.parametrize("grid_kw", [dict(row=2), dict()], ids=["tensor-parallel", "data-parallel"])
def test_real_model_is_parallelized_onto_the_grids_device(grid_kw) -> None:
    """A full model built on the host lands on the requested device (the grid's by default: the GPU
    under NCCL, which takes no host tensors), shards and all; nothing stays where it was built."""
    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn

    model = axonn.parallelize(tiny_llama(0), grid=_fake_grid(**grid_kw), device="meta")
    assert {str(t.device) for t in [*model.parameters(), *model.buffers()]} == {"meta"}


def test_weight_decay_reaches_the_sharded_matrices() -> None:
    """On a tensor-parallel grid every weight is a flat 1-D shard: weight decay must still go to the
    matrices (judged by their full shape), the same ones as in the serial model, or --weight-decay
    would silently do nothing there."""
    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn
    from memorization.train import param_groups

    serial = tiny_llama(0)
    want = {n for n, p in serial.named_parameters() if p.ndim >= 2}
    par = axonn.parallelize(tiny_llama(0), grid=_fake_grid(row=2, depth=2), device="meta")
    assert all(p.ndim == 1 for p in par.parameters())  # the shards are flat
    names = {id(p): n for n, p in par.named_parameters()}
    decay, no_decay = param_groups(par, 0.1)
    assert {names[id(p)] for p in decay["params"]} == want and decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0 and len(decay["params"]) + len(no_decay["params"]) == len(names)


def test_workers_end_when_their_launcher_is_killed(tmp_path) -> None:
    """kill -9 of torchrun used to leave its workers running (they finished a run 54 s later, racing a resume):
    axonn.init arms the parent-death signal, so they end with the launcher."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, "ORPHAN_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    worker = WORKERS / "orphan_check.py"
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                 "2", str(worker)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.time() < deadline:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("rank*.pid")]
        assert len(pids) == 2, "the workers never started"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()

        def alive(pid: int) -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"  # a zombie has ended

        deadline = time.time() + 15
        while any(alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.2)
        assert not any(alive(p) for p in pids), "workers outlived their launcher"
    finally:
        launcher.kill()
        for p in tmp_path.glob("rank*.pid"):
            try:
                os.kill(int(p.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


# ------------------------------------------------ indivisible shapes and out-of-range ids are refused

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
        axonn.parallelize(tiny_llama(0, **kw), grid=_fake_grid(**grid_kw))


def test_indivisible_linear_error_says_how_to_fix() -> None:
    from axonn.intra_layer import Linear

    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by the row axis size G_intra_r=4; "
                                         r"use a G_intra_r that divides 10 \(nearest: 2 or 5\)"):
        Linear(8, 10, grid=_fake_grid(row=4))
    with pytest.raises(ValueError, match=r"in_features=8 is not divisible by the row axis size G_intra_r=3; "
                                         r"use a G_intra_r that divides 8 \(nearest: 2 or 4\)"):
        Linear(8, 12, transpose=True, grid=_fake_grid(row=3))


def test_out_of_range_ids_and_labels_are_refused_not_zeroed() -> None:
    """An id outside [0, V) lies in no rank's vocabulary chunk: the vocab-parallel embedding looked up
    nothing (a zero vector) and the loss took no target logit, silently; the serial model refuses it."""
    import torch

    import axonn
    from axonn.intra_layer import Embedding, vocab_parallel_cross_entropy

    grid = axonn.init()
    emb = Embedding(10, 4, grid=grid)
    ok = torch.tensor([[0, 9, 3]])
    assert torch.equal(emb(ok), emb.weight.view(10, 4)[ok])
    for bad in (10, -1):
        with pytest.raises(IndexError):
            torch.nn.functional.embedding(torch.tensor([bad]), torch.zeros(10, 4))  # what serial does
        with pytest.raises(RuntimeError, match=r"token id out of range \[0, 10\)"):
            emb(torch.tensor([[1, bad]]))
    logits = torch.randn(2, 3, 10)
    labels = torch.tensor([[1, -100, 9], [0, 2, 3]])
    torch.testing.assert_close(vocab_parallel_cross_entropy(logits, labels, grid=grid),
                               torch.nn.functional.cross_entropy(logits.reshape(-1, 10), labels.reshape(-1)))
    for bad in (10, -5):
        labels[1, 1] = bad
        with pytest.raises(RuntimeError, match=r"label out of range \[0, 10\)"):
            vocab_parallel_cross_entropy(logits, labels, grid=grid)


def test_collective_on_a_destroyed_grid_fails_instead_of_using_the_world(monkeypatch) -> None:
    """After ``Grid.destroy()`` the grid had no groups left and ``group()`` answered None, which
    torch.distributed reads as the world group: an all-reduce over "row" silently summed over
    every rank.  It must fail, saying what happened."""
    import torch
    import torch.distributed as dist

    from axonn.communication import all_reduce

    grid = _fake_grid(data=2, row=2)  # world 4; the row group has 2 ranks
    grid._groups[("row",)] = "row-group"
    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: calls.append(group))
    monkeypatch.setattr(dist, "destroy_process_group", lambda g=None: None)
    all_reduce(torch.ones(2), "row", grid=grid)
    assert calls == ["row-group"]
    grid.destroy()
    with pytest.raises(RuntimeError, match=r"was destroyed \(Grid.destroy\(\)\): build a new grid with axonn.init"):
        all_reduce(torch.ones(2), "row", grid=grid)
    assert calls == ["row-group"], f"a collective ran on group {calls[-1]!r} (None = the world)"
