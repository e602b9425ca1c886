"""Planner and job generator against what the trainer accepts and what a job script asks it to do."""
from __future__ import annotations

import re

import pytest
import torch

from axonn.planner import Grid, PlanError, divisibility_problem, enumerate_grids, load_profile, plan
from axonn.presets import get_preset
from memorization import jobs as gen


def _fake_grid(data=1, depth=1, row=1, col=1):
    from axonn.grid import Grid as AxonnGrid, coords_of

    sizes = {"data": data, "depth": depth, "row": row, "col": col}
    return AxonnGrid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=data * depth * row * col,
                     backend="gloo", device=torch.device("cpu"))


def _parallelize_accepts(shape, grid: Grid) -> bool:
    import axonn
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(shape.llama_config())
    try:
        axonn.parallelize(model, grid=_fake_grid(data=grid.data, depth=grid.depth, row=grid.row, col=grid.column),
                          device="meta")
    except ValueError:
        return False
    return True


def test_planner_validity_is_what_axonn_parallelize_accepts():
    """A grid is valid for the planner exactly when the trainer's ``axonn.parallelize`` takes it. Depth pads
    a local block it does not divide (``ShardSpec.depth_sharded``), so depth 3 on the tiny preset's
    256 × 256 blocks is a grid the trainer runs (3 gloo ranks on 1,1,1,3 with tests/axonn_workers' tiny Llama
    give the serial gradients: checked by hand, too slow for this suite)."""
    from axonn.presets import ModelShape

    # every dimension divisible by 3 but the vocabulary (2^7·3: R·C = 9 is refused), no local block by 5
    shape = ModelShape("t", layers=1, hidden=48, heads=6, kv_heads=3, ffn=96, vocab=384)
    grids = [g for n in (5, 6, 9, 12) for g in enumerate_grids(n)]
    valid = {g for g in grids if divisibility_problem(shape, g) is None}
    assert {g.depth for g in valid} >= {3, 5} and len(valid) < len(grids)
    for g in grids:
        assert (g in valid) == _parallelize_accepts(shape, g), g
    assert divisibility_problem(get_preset("tiny"), Grid(1, 1, 1, 3)) is None
    res = plan("tiny", seq=256, global_batch=12, gpus=3, machine="h100-node")
    assert Grid(1, 1, 1, 3) in {e.grid for e in res.ranked}


def test_a_depth_three_hand_grid_gets_a_script(tmp_path):
    job = gen.make_job(gen.JobSpec(machine="alps", size="1b", gpus=12, grid=(1, 4, 1, 3), micro_batch=1,
                                   global_batch=96, out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert job.grid == (1, 4, 1, 3) and "--grid 1,4,1,3" in job.text and job.nodes == 3


def _arms(job) -> tuple[int, list[str]]:
    """The Goldfish k of the experiment a job runs (its resolved config) and the arms it trains."""
    from memorization.experiment.run import arms_to_train

    return job.config.goldfish.k, arms_to_train(job.config)


def test_the_paper_matrix_trains_each_arm_once(tmp_path):
    """One job per machine and size trains both arms, Goldfish off and on (each once, paired in one report);
    --arms trains one alone, and 'goldfish' without a Goldfish k is refused."""
    base = gen.JobSpec(machine="frontier", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path))
    trained = []
    for spec in gen.paper_matrix(base, machines=("frontier", "alps"), sizes=("8b", "70b")):
        k, arms = _arms(gen.make_job(spec))
        trained.append((spec.machine, spec.size, k, tuple(arms)))
    assert trained == [(m, s, 4, ("standard", "goldfish")) for m in ("frontier", "alps") for s in ("8b", "70b")]
    assert _arms(gen.make_job(gen.JobSpec(**{**base.__dict__, "arms": "goldfish"})))[1] == ["goldfish"]
    assert _arms(gen.make_job(gen.JobSpec(**{**base.__dict__, "goldfish_k": 0})))[1] == ["standard"]
    with pytest.raises(ValueError, match="'goldfish' needs goldfish_k >= 2"):
        gen.make_job(gen.JobSpec(**{**base.__dict__, "arms": "goldfish", "goldfish_k": 0}))


def test_a_hand_grid_the_trainer_preflight_refuses_is_refused_before_the_queue(tmp_path, capsys):
    """memorize.py refuses at start a grid whose predicted peak exceeds 95 % of the free GPU memory
    (``check_size_runs_here``, the planner's memory model): the generator says so before the job waits."""
    from memorization.models import check_size_runs_here

    prof = load_profile("frontier")
    cuda = torch.device("cuda")
    spec = gen.JobSpec(machine="frontier", size="405b", gpus=8, grid=(1, 8, 1, 1), micro_batch=1,
                       out_dir=str(tmp_path), run_root=str(tmp_path))
    with pytest.raises(SystemExit, match="needs ~"):  # the trainer, even on an empty 64 GiB GCD
        check_size_runs_here(get_preset("405b"), cuda, (1, 8, 1, 1), seq=2048, micro_batch=1,
                             activation_checkpointing=True, free_bytes=prof.memory_bytes, micro_steps=128)
    with pytest.raises(ValueError, match=r"grid 1,8,1,1 at micro-batch 1: 405b needs ~\d+\.\d GiB per GPU.*start-up "
                                         r"check.*smallest GPU count that fits is 128"):
        gen.make_job(spec)
    # a hand grid the trainer takes still gets its script, with no warning
    ok = gen.JobSpec(machine="frontier", size="405b", gpus=1024, grid=(1, 8, 4, 32), micro_batch=4,
                     out_dir=str(tmp_path), run_root=str(tmp_path))
    check_size_runs_here(get_preset("405b"), cuda, (1, 8, 4, 32), seq=2048, micro_batch=4,
                         activation_checkpointing=True, free_bytes=prof.memory_bytes, micro_steps=1)
    assert gen.make_job(ok).grid == (1, 8, 4, 32) and "warning" not in capsys.readouterr().err


def test_an_unknown_size_is_named(tmp_path):
    with pytest.raises(PlanError, match="unknown size '8B': choose one of"):
        gen.make_job(gen.JobSpec(machine="frontier", size="8B"))
    with pytest.raises(ValueError, match="no default GPU count for 1b on frontier"):
        gen.make_job(gen.JobSpec(machine="frontier", size="1b"))


def test_goldfish_k_one_is_refused_as_memorize_refuses_it(tmp_path):
    from memorization.goldfish import validate_goldfish_args

    with pytest.raises(ValueError, match="k=1 is invalid"):
        validate_goldfish_args(1, 13, "hash", allow_zero=True)
    with pytest.raises(ValueError, match="goldfish_k must be 0 .* or >= 2, got 1"):  # memorize.py refuses k = 1
        gen.make_job(gen.JobSpec(machine="frontier", size="8b", goldfish_k=1, out_dir=str(tmp_path)))


def test_batch_error_only_when_some_grid_fits_and_its_suggestion_plans():
    """The 405b on 5 Alps nodes: no grid of 20 GPUs divides a batch of 256, but none fits in memory either
    (the 405b needs 128 GPUs): the error is about memory and names that count, not a batch of 260 that
    would only lead to the memory error. Where some grid fits, the suggested batch plans."""
    with pytest.raises(PlanError) as ei:
        plan("405b", seq=2048, global_batch=256, gpus=20, machine="alps")
    assert ei.value.kind == "memory" and ei.value.smallest_gpus == 128, str(ei.value)
    assert plan("405b", seq=2048, global_batch=256, gpus=128, machine="alps").ranked
    with pytest.raises(PlanError) as ei:
        plan("8b", seq=2048, global_batch=128, gpus=24, machine="frontier")
    assert ei.value.kind == "batch"
    suggested = int(re.search(r"e\.g\. (\d+)", str(ei.value)).group(1))
    assert plan("8b", seq=2048, global_batch=suggested, gpus=24, machine="frontier").ranked
