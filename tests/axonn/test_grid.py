"""axonn.grid: GridShape (the text D,R,C,Z, the strides of the rank order), the world size axonn.init must match,
the launcher's rank and node variables, and the process group's end: a dead rank, a killed launcher or a
destroyed grid stops the collectives."""
from __future__ import annotations

import importlib.util
import os
import re
import time
from pathlib import Path

import pytest
import torch

from tests.forked import run_python
from tests.support import REPO, WORKERS, fake_grid

_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)


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
    r = run_python([*cmd], cwd=REPO, timeout=120)
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
def test_local_device_index_is_the_launchers_node_local_rank(env, rank, count, want) -> None:
    from axonn.grid import local_device_index

    assert local_device_index(rank, count, env) == want


@pytest.mark.parametrize("env, want", [
    ({"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "4"}, 8),  # torchrun's own count first
    ({"SLURM_NTASKS_PER_NODE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"}, 4),  # mpiexec inside sbatch
    ({"SLURM_TASKS_PER_NODE": "8(x2)"}, 8),  # plain srun -n16 -N2: no SLURM_NTASKS_PER_NODE
    ({"SLURM_TASKS_PER_NODE": "3(x2),2"}, 3),  # uneven: the fullest node's share
    ({"PALS_LOCAL_SIZE": "4"}, 4),
])
def test_ranks_per_node_come_from_the_launchers_variables(env, want) -> None:
    from axonn.grid import ranks_per_node

    assert ranks_per_node(env) == want


def test_local_device_index_without_a_gpu_says_what_to_check() -> None:
    from axonn.grid import local_device_index

    with pytest.raises(RuntimeError, match="sees none: check CUDA_VISIBLE_DEVICES"):
        local_device_index(0, 0, {})


def test_workers_end_when_their_launcher_is_killed(tmp_path) -> None:
    """Workers end with their launcher when it is killed (kill -9 of torchrun): axonn.init arms the parent-death
    signal, so no orphaned rank goes on writing a run that a resume is about to take over."""
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


def test_collective_on_a_destroyed_grid_fails_instead_of_using_the_world(monkeypatch) -> None:
    """After ``Grid.destroy()`` a collective over one of its axes fails, saying the grid was destroyed; it must
    not reach torch.distributed with group None, which it reads as the world group (an all-reduce over "row"
    would sum over every rank)."""
    import torch
    import torch.distributed as dist

    from axonn.communication import all_reduce

    grid = fake_grid(data=2, row=2)  # world 4; the row group has 2 ranks
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
