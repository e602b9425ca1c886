"""Tests of the 4D-grid planner (axonn.planner): validity, monotone memory, ranking, errors, CLI."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch
import yaml

from axonn.planner import (GridShape, PlanError, divisibility_problem, format_plan, known_profiles, load_profile,
                           memory_per_gpu, plan, predict_step)
from axonn.planner.__main__ import main as cli_main
from axonn.planner.profiles import PROFILE_DIR
from axonn.presets import get_preset
from memorization.launch import jobs as gen
from tests.forked import run_python
from tests.support import REPO


def test_grid_shape_enumerate_is_every_factorisation():
    grids = list(GridShape.enumerate(16))
    assert all(g.size == 16 for g in grids)
    assert len(set(grids)) == len(grids) == 35  # C(4+3, 3) ordered factorisations of 2^4


@pytest.mark.parametrize("size,gpus,machine", [("8b", 64, "frontier"), ("70b", 128, "alps"),
                                               ("1b", 8, "h100-node")])
def test_planner_emits_valid_grids_only(size, gpus, machine):
    shape = get_preset(size)
    res = plan(size, seq=2048, global_batch=256, gpus=gpus, machine=machine)
    assert res.ranked
    for e in res.ranked:
        D, R, C, Z = e.grid
        assert D * R * C * Z == gpus
        assert shape.heads % R == 0 and shape.kv_heads % R == 0
        assert shape.hidden % C == 0 and shape.ffn % R == 0 and shape.ffn % C == 0 and shape.vocab % R == 0
        assert 256 % (D * Z * e.micro_batch) == 0 and e.grad_accum == 256 // (D * Z * e.micro_batch)
        assert divisibility_problem(shape, e.grid) is None
        assert e.memory_per_gpu_bytes <= res.machine.usable_memory_bytes
    # everything is accounted for: ranked + rejected = all factorisations
    assert len(res.ranked) + len(res.rejected) == len(list(GridShape.enumerate(gpus)))
    assert all(r.reason for r in res.rejected)


def test_divisibility_reasons_name_axis_and_dimension():
    shape = get_preset("405b")
    assert "row=16 does not divide kv_heads=8" == divisibility_problem(shape, GridShape(1, 16, 1, 1))
    msg = divisibility_problem(shape, GridShape(1, 1, 3, 1))
    assert msg.startswith("column=3 does not divide hidden=16384")


@pytest.mark.parametrize("size", ["8b", "70b", "405b"])
@pytest.mark.parametrize("ckpt", [True, False])
def test_memory_monotone_in_sharding(size, ckpt):
    shape = get_preset(size)
    base = GridShape(1, 1, 1, 1)
    for axis in ("depth", "row", "col"):
        prev = memory_per_gpu(shape, base, 2048, 1, ckpt).total
        g = base
        for _ in range(3):
            g = g._replace(**{axis: getattr(g, axis) * 2})
            cur = memory_per_gpu(shape, g, 2048, 1, ckpt).total
            assert cur <= prev, (axis, g)
            prev = cur
    # data parallelism replicates: memory does not depend on D
    assert memory_per_gpu(shape, GridShape(8, 2, 2, 2), 2048, 1, ckpt).total == \
        memory_per_gpu(shape, GridShape(1, 2, 2, 2), 2048, 1, ckpt).total
    # row×col doubled together
    a = memory_per_gpu(shape, GridShape(1, 2, 2, 4), 2048, 1, ckpt).total
    b = memory_per_gpu(shape, GridShape(1, 4, 4, 4), 2048, 1, ckpt).total
    assert b <= a
    # checkpointing never costs memory
    assert memory_per_gpu(shape, base, 2048, 1, True).total <= memory_per_gpu(shape, base, 2048, 1, False).total


def test_chosen_grid_is_cheapest_fitting():
    prof = load_profile("frontier")
    shape = get_preset("70b")
    res = plan(shape, seq=2048, global_batch=512, gpus=256, machine=prof, micro_batch=1)
    best = res.best
    cap = prof.usable_memory_bytes
    for g in GridShape.enumerate(256):
        if divisibility_problem(shape, g) or 512 % (g.data * g.depth):
            continue
        if memory_per_gpu(shape, g, 2048, 1, True).total > cap:
            continue
        t = predict_step(shape, g, 2048, 512, 1, prof, True).step_time_s
        assert best.step_time_s <= t + 1e-12
    times = [e.step_time_s for e in res.ranked]
    assert times == sorted(times)


def test_prediction_is_sane():
    res = plan("8b", seq=2048, global_batch=64, gpus=8, machine="h100-node")
    e = res.best
    assert 0.1 < e.mfu < 0.8
    assert e.flops_per_s == pytest.approx(res.best.breakdown.model_flops / e.step_time_s)
    # more sharding of the same job: fewer bytes per GPU; a smaller machine slower
    slow = plan("8b", seq=2048, global_batch=64, gpus=8, machine="perlmutter").best
    assert slow.step_time_s > e.step_time_s


def test_bf16_gradient_reduction_costs_half_the_gradient_bytes():
    """grad_reduce_dtype="bf16": never slower or larger than fp32, the same where no gradient
    travels (D = Z = 1), strictly faster where the depth reduce-scatters do; the plan says so."""
    from axonn.planner import CostConfig, MemoryConfig

    prof, shape = load_profile("frontier"), get_preset("70b")
    fp32_c, bf16_c = CostConfig(), CostConfig(bytes_grad_comm=2)
    fp32_m, bf16_m = MemoryConfig(), MemoryConfig(grad_reduce_bytes=2)
    for g in (GridShape(1, 8, 8, 1), GridShape(1, 2, 1, 32), GridShape(4, 2, 1, 8), GridShape(8, 8, 1, 1)):
        t32 = predict_step(shape, g, 2048, 256, 1, prof, True, fp32_c)
        t16 = predict_step(shape, g, 2048, 256, 1, prof, True, bf16_c)
        m32 = memory_per_gpu(shape, g, 2048, 1, True, fp32_m, micro_steps=1).total
        m16 = memory_per_gpu(shape, g, 2048, 1, True, bf16_m, micro_steps=1).total
        assert t16.step_time_s <= t32.step_time_s and m16 <= m32, g
        if g.data == g.depth == 1:
            assert t16.step_time_s == t32.step_time_s and m16 == m32, g
        if g.depth > 1:
            assert t16.comm_s["depth"] < t32.comm_s["depth"], g
        if g.data > 1:
            assert t16.comm_s["data"] == pytest.approx(t32.comm_s["data"] / 2, rel=0.05), g
    res32 = plan("405b", seq=2048, global_batch=128, gpus=1024, machine=prof)
    res16 = plan("405b", seq=2048, global_batch=128, gpus=1024, machine=prof, grad_reduce_dtype="bf16")
    assert res16.best.step_time_s < res32.best.step_time_s
    assert "gradients reduced in bf16" in format_plan(res16) and "gradients reduced in fp32" in format_plan(res32)
    with pytest.raises(PlanError, match="grad_reduce_dtype must be one of"):
        plan("8b", 2048, 64, 16, machine=prof, grad_reduce_dtype="fp8")


def test_405b_on_4096_frontier_gcds_fits():
    res = plan("405b", seq=2048, global_batch=1024, gpus=4096, machine="frontier")
    assert len(res.ranked) > 10
    assert res.best.memory_per_gpu_bytes < 64 * 1024**3
    assert "rejected" in format_plan(res, top=3)


def test_405b_on_8_gpus_refuses_with_smallest_count():
    with pytest.raises(PlanError) as ei:
        plan("405b", seq=2048, global_batch=256, gpus=8, machine="frontier")
    err = ei.value
    assert err.kind == "memory" and err.smallest_gpus is not None and err.smallest_gpus > 8
    assert f"smallest GPU count that fits is {err.smallest_gpus}" in str(err)
    assert "GiB" in str(err)
    # the suggested count really works, and one node fewer does not
    ok = plan("405b", seq=2048, global_batch=256, gpus=err.smallest_gpus, machine="frontier")
    assert ok.ranked
    with pytest.raises(PlanError):
        plan("405b", seq=2048, global_batch=256, gpus=err.smallest_gpus - 8, machine="frontier")


def test_unknown_machine_lists_known():
    with pytest.raises(PlanError, match="unknown machine") as ei:
        plan("8b", 2048, 64, 8, machine="summit")
    for name in ("frontier", "alps", "perlmutter", "h100-node"):
        assert name in str(ei.value)
    assert set(known_profiles()) >= {"frontier", "alps", "perlmutter", "perlmutter-40", "h100-node"}


def test_batch_not_divisible_for_any_grid():
    # tiny on 1024 GPUs: row <= kv_heads = 2 and column <= hidden = 256, so every valid grid has
    # data×depth >= 2 and a batch of 1 cannot be split
    with pytest.raises(PlanError, match="not divisible by data×depth") as ei:
        plan("tiny", 256, 1, 1024, machine="h100-node")
    assert ei.value.kind == "batch" and "multiple" in str(ei.value)


def test_gpu_count_errors():
    with pytest.raises(PlanError, match="whole number of frontier nodes"):
        plan("8b", 2048, 64, 12, machine="frontier")
    with pytest.raises(PlanError, match="positive"):
        plan("8b", 2048, 64, 0, machine="frontier")
    with pytest.raises(PlanError, match="unknown size"):
        plan("13b", 2048, 64, 8, machine="frontier")


def test_does_not_fit_anywhere():
    with pytest.raises(PlanError, match="does not fit in memory on any grid"):
        plan("405b", 8192, 64, 8, machine="perlmutter-40", micro_batch=4, activation_checkpointing=False)


def test_user_yaml_profile(tmp_path):
    data = load_profile("alps").to_dict()
    data.update(name="my-cluster", memory_gib=40, gpus_per_node=2)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    res = plan("8b", 2048, 64, 16, machine=str(path))
    assert res.machine.name == "my-cluster" and res.ranked
    assert all(e.memory_per_gpu_bytes <= res.machine.usable_memory_bytes for e in res.ranked)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "x", "gpus_per_node": 4, "warp_speed": 9}))
    with pytest.raises(PlanError, match="unknown profile keys"):
        plan("8b", 2048, 64, 16, machine=str(bad))
    with pytest.raises(PlanError, match="does not exist"):
        plan("8b", 2048, 64, 16, machine=str(tmp_path / "missing.yaml"))


def test_cli_json(capsys):
    rc = cli_main(["--size", "8b", "--gpus", "32", "--machine", "alps", "--global-batch", "128", "--json",
                   "--top", "4"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, list) and 1 <= len(out) <= 4
    for e in out:
        assert {"grid", "step_time_s", "flops_per_s", "memory_per_gpu_bytes"} <= set(e)
        assert len(e["grid"]) == 4 and e["grid"][0] * e["grid"][1] * e["grid"][2] * e["grid"][3] == 32
    assert [e["step_time_s"] for e in out] == sorted(e["step_time_s"] for e in out)
    rc = cli_main(["--size", "8b", "--gpus", "32", "--machine", "alps", "--global-batch", "128", "--json",
                   "--top", "4", "--grad-reduce-dtype", "bf16"])
    bf16 = json.loads(capsys.readouterr().out)
    assert rc == 0 and bf16[0]["step_time_s"] <= out[0]["step_time_s"]


def test_cli_table_shape_and_errors(capsys):
    rc = cli_main(["--layers", "4", "--hidden", "512", "--heads", "8", "--kv-heads", "4", "--ffn", "1536",
                   "--vocab", "4096", "--gpus", "4", "--machine", "perlmutter", "--global-batch", "16",
                   "--seq", "512", "--top", "2"])
    out = capsys.readouterr().out
    assert rc == 0 and "grid D,R,C,Z" in out and "TFLOP/s/GPU" in out
    assert cli_main(["--size", "405b", "--gpus", "8", "--machine", "frontier"]) == 2
    assert "smallest GPU count that fits" in capsys.readouterr().err
    assert cli_main(["--size", "8b", "--gpus", "8", "--machine", "nowhere"]) == 2
    assert "known machines" in capsys.readouterr().err


def test_module_entry_point():
    r = run_python(["-m", "axonn.planner", "--size", "1b", "--nodes", "1", "--machine",
                        "h100-node", "--global-batch", "32", "--json", "--top", "1"],
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["grid"]


def test_embedding_vocabulary_must_divide_row_times_column():
    """axonn.parallelize refuses a vocabulary that row×column does not divide (the embedding splits it
    over the whole tensor group): 128256 = 2^8·501, so R·C = 512 is no grid for the Llama 3.1 shapes."""
    shape = get_preset("405b")
    why = divisibility_problem(shape, GridShape(1, 8, 64, 1))
    assert why == "row×column=8×64 does not divide vocab=128256 (embedding)"
    assert divisibility_problem(shape, GridShape(1, 8, 32, 1)) is None
    res = plan("8b", seq=2048, global_batch=64, gpus=512, machine="frontier")
    assert res.ranked and all(128256 % (e.grid.row * e.grid.col) == 0 for e in res.ranked)


def _wire_profile(gpus_per_node: int = 1 << 20):
    """1 GB/s everywhere and no latency: a collective's time in ns is its bytes per rank."""
    from axonn.planner import MachineProfile

    return MachineProfile(name="wire", gpus_per_node=gpus_per_node, memory_gib=1e6, peak_tflops=1e6,
                          measured_tflops=1e6, intra_node_gbps=1.0, inter_node_gbps=1.0 * gpus_per_node,
                          intra_node_latency_us=0.0, inter_node_latency_us=0.0, hbm_gbps=1e9)


@pytest.mark.parametrize("ckpt", [True, False])
def test_bytes_per_axis_are_every_collective_the_trainer_issues(ckpt):
    """The per-axis traffic of one step equals the sum over the collectives the trainer issues, counted
    here from the 3D matmul's per-rank volumes (AxoNN, arXiv:2502.08145), independently of the model's code. Beyond the 3D
    matmul's own: the column re-layouts (o_proj's and down_proj's outputs all-gathered in the forward in
    bf16, the three RMSNorm slices' gradients in the backward in fp32: `benchmarks/collectives.py
    --grid 1,2,2,1 --layers 1 --hidden 64 --seq 32 --batch 2 --autocast` measures 32768 B of them); with
    checkpointing, the decoder layers' forward again (its all-reduces, re-layouts and depth all-gathers:
    a recomputed forward gathers its weight anew), never the lm_head's, plus the sharded checkpoint's
    input all-gather."""
    from axonn.presets import ModelShape

    shape = ModelShape("t", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
    D, R, C, Z = grid = GridShape(1, 2, 2, 2)
    m, h, V, L = 32, 64, 256, 2
    ag = lambda p, n: (p - 1) / p * n  # noqa: E731
    ar = lambda p, n: 2 * (p - 1) / p * n  # noqa: E731
    rec = 2 if ckpt else 1
    want = {"data": 0.0, "row": 0.0, "column": 0.0, "depth": 0.0}
    sizes = {"row": R, "column": C}
    linears = [(64, 64, False), (32, 64, False), (32, 64, False), (64, 64, True),  # q k v o (n out, k in)
               (128, 64, False), (128, 64, False), (64, 128, True)]  # gate up down
    for n, k, transposed in linears:
        out_ax, in_ax = ("column", "row") if transposed else ("row", "column")
        gr, gc = sizes[out_ax], sizes[in_ax]
        w = n * k / (gr * gc)
        want["depth"] += L * ((rec + 1) * 2 * ag(Z, w) + 4 * ag(Z, w))  # bf16 gathers, fp32 reduce-scatter
        want[in_ax] += L * rec * 2 * ar(gc, m * n / gr)  # Y over the in group (bf16)
        want[out_ax] += L * 2 * ar(gr, m * k / gc)  # dX over the out group (bf16)
    want["column"] += L * (rec * 2 * 2 * ag(C, m * h) + 2 * 4 * ag(C, m * h))  # re-layouts
    if ckpt:  # the layer input's 1/(R·C) slices all-gathered (fp32), column then row
        want["column"] += L * 4 * ag(C, m * h / R)
        want["row"] += L * 4 * ag(R, m * h)
    w = V * h / (R * C)  # lm_head: never recomputed
    want["depth"] += 2 * 2 * ag(Z, w) + 4 * ag(Z, w)
    want["column"] += 2 * ar(C, m * V / R) + 4 * ag(C, m * h)  # logits; the final norm's slice gradient
    want["row"] += 2 * ar(R, m * h / C)
    want["depth"] += 4 * ag(Z, w) + 4 * ag(Z, w)  # embedding chunk (fp32) and its gradient
    # the embedding output (fp32): one all-reduce over the R·C row × column group (the code's
    # `reduce_forward(..., ("row", "col"))`), attributed to the two axes as each alone would take
    joint = 4 * ar(R * C, m * h)
    alone = {"column": ar(C, m * h), "row": ar(R, m * h)}
    for ax, t in alone.items():
        want[ax] += joint * t / sum(alone.values())
    got = predict_step(shape, grid, 32, D * Z, 1, _wire_profile(), ckpt).comm_s
    assert {ax: t * 1e9 for ax, t in got.items()} == pytest.approx(want, rel=1e-9)


def test_data_parallel_all_reduce_is_not_hidden():
    """The trainer all-reduces the gradients over data after the last backward (`sync_gradients`), with
    nothing to overlap: a slower data axis costs the step its whole extra all-reduce time."""
    shape = get_preset("tiny")
    grid = GridShape(2, 1, 1, 1)  # one GPU per node: data is the only axis that crosses nodes
    base = replace(_wire_profile(1), intra_node_gbps=100.0, peak_tflops=0.1, measured_tflops=0.1)
    fast, slow = (predict_step(shape, grid, 256, 4, 1, replace(base, inter_node_gbps=bw), True) for bw in (10.0, 1.0))
    assert 0 < slow.comm_s["data"] < slow.compute_s / 10  # a backward long enough to hide it, if anything did
    assert slow.step_time_s - fast.step_time_s == pytest.approx(slow.comm_s["data"] - fast.comm_s["data"], rel=1e-9)


def test_the_row_column_all_reduce_is_one_collective_over_the_group():
    """The embedding all-reduces over row × column at once: on R·C consecutive ranks that is the same
    collective as a column axis of that size, and cheaper than a column then a row all-reduce."""
    from axonn.planner.model import _Comm

    n = 1e6
    for gpn in (4, 2):  # the 4-rank group inside one node, and across two
        prof = _wire_profile(gpn)
        square, flat = _Comm(GridShape(1, 2, 2, 1), prof), _Comm(GridShape(1, 1, 4, 1), prof)
        assert square.allreduce_row_column(n, 4) == pytest.approx(flat.allreduce("col", n, 4), rel=1e-12)
        assert square.allreduce_row_column(n, 4) < square.allreduce("row", n, 4) + square.allreduce("col", n, 4)
    assert _Comm(GridShape(1, 1, 1, 4), _wire_profile()).allreduce_row_column(n, 4) == 0.0


def test_an_axis_is_in_node_only_when_its_groups_tile_the_node():
    from axonn.planner.model import axis_bandwidth

    prof = _wire_profile(4)
    assert axis_bandwidth(GridShape(2, 1, 2, 1), "col", prof)[2]
    assert axis_bandwidth(GridShape(1, 1, 3, 1), "col", prof)[2]  # 3 GPUs: one node
    # 12 GPUs on 4-GPU nodes: column groups {0,1,2}, {3,4,5}, ...: {3,4,5} spans two nodes
    assert not axis_bandwidth(GridShape(4, 1, 3, 1), "col", prof)[2]


def _fake_grid(data=1, depth=1, row=1, col=1):
    from axonn.grid import Grid as AxonnGrid, coords_of

    sizes = {"data": data, "depth": depth, "row": row, "col": col}
    return AxonnGrid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=data * depth * row * col,
                     backend="gloo", device=torch.device("cpu"))


def _parallelize_accepts(shape, grid: GridShape) -> bool:
    import axonn
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(shape.hf_config())
    try:
        axonn.parallelize(model, grid=_fake_grid(**grid.sizes()), device="meta")
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
    grids = [g for n in (5, 6, 9, 12) for g in GridShape.enumerate(n)]
    valid = {g for g in grids if divisibility_problem(shape, g) is None}
    assert {g.depth for g in valid} >= {3, 5} and len(valid) < len(grids)
    for g in grids:
        assert (g in valid) == _parallelize_accepts(shape, g), g
    assert divisibility_problem(get_preset("tiny"), GridShape(1, 1, 1, 3)) is None
    res = plan("tiny", seq=256, global_batch=12, gpus=3, machine="h100-node")
    assert GridShape(1, 1, 1, 3) in {e.grid for e in res.ranked}


def test_a_depth_three_hand_grid_gets_a_script(tmp_path):
    job = gen.make_job(gen.job_spec(machine="alps", size="1b", gpus=12, grid=(1, 4, 1, 3), micro_batch=1,
                                   global_batch=96, out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert job.grid == (1, 4, 1, 3) and "--grid 1,4,1,3" in job.text and job.nodes == 3


def _arms(job) -> tuple[int, list[str]]:
    """The Goldfish k of the experiment a job runs (its resolved config) and the arms it trains."""
    from memorization.experiment.run import arms_to_train

    return job.config.goldfish.k, arms_to_train(job.config)


def test_the_paper_matrix_trains_each_arm_once(tmp_path):
    """One job per machine and size trains both arms, Goldfish off and on (each once, paired in one report);
    --arms trains one alone, and 'goldfish' without a Goldfish k is refused."""
    given = dict(machine="frontier", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path))
    base = gen.job_spec(**given)
    trained = []
    for spec in gen.paper_matrix(base, machines=("frontier", "alps"), sizes=("8b", "70b")):
        k, arms = _arms(gen.make_job(spec))
        trained.append((spec.machine, spec.size, k, tuple(arms)))
    assert trained == [(m, s, 4, ("standard", "goldfish")) for m in ("frontier", "alps") for s in ("8b", "70b")]
    assert _arms(gen.make_job(gen.job_spec(**{**given, "arms": "goldfish"})))[1] == ["goldfish"]
    assert _arms(gen.make_job(gen.job_spec(**{**given, "goldfish_k": 0})))[1] == ["standard"]
    with pytest.raises(ValueError, match=r"the goldfish arm\(s\) need --goldfish-k >= 2"):
        gen.make_job(gen.job_spec(**{**given, "arms": "goldfish", "goldfish_k": 0}))


def test_a_hand_grid_the_trainer_preflight_refuses_is_refused_before_the_queue(tmp_path, capsys):
    """memorize.py refuses at start a grid whose predicted peak exceeds 95 % of the free GPU memory
    (``check_size_runs_here``, the planner's memory model): the generator says so before the job waits."""
    from memorization.training.models import check_size_runs_here

    prof = load_profile("frontier")
    cuda = torch.device("cuda")
    spec = gen.job_spec(machine="frontier", size="405b", gpus=8, grid=(1, 8, 1, 1), micro_batch=1,
                       out_dir=str(tmp_path), run_root=str(tmp_path))
    with pytest.raises(SystemExit, match="needs ~"):  # the trainer, even on an empty 64 GiB GCD
        check_size_runs_here(get_preset("405b"), cuda, (1, 8, 1, 1), seq=2048, micro_batch=1,
                             activation_checkpointing=True, free_bytes=prof.memory_bytes, micro_steps=128)
    with pytest.raises(ValueError, match=r"grid 1,8,1,1 at micro-batch 1: 405b needs ~\d+\.\d GiB per GPU.*start-up "
                                         r"check.*smallest GPU count that fits is 128"):
        gen.make_job(spec)
    # a hand grid the trainer takes still gets its script, with no warning
    ok = gen.job_spec(machine="frontier", size="405b", gpus=1024, grid=(1, 8, 4, 32), micro_batch=4,
                     out_dir=str(tmp_path), run_root=str(tmp_path))
    check_size_runs_here(get_preset("405b"), cuda, (1, 8, 4, 32), seq=2048, micro_batch=4,
                         activation_checkpointing=True, free_bytes=prof.memory_bytes, micro_steps=1)
    assert gen.make_job(ok).grid == (1, 8, 4, 32) and "warning" not in capsys.readouterr().err


def test_an_unknown_size_is_named(tmp_path):
    with pytest.raises(PlanError, match="unknown size '8B': choose one of"):
        gen.make_job(gen.job_spec(machine="frontier", size="8B"))
    with pytest.raises(ValueError, match="no default GPU count for 1b on frontier"):
        gen.make_job(gen.job_spec(machine="frontier", size="1b"))


def test_goldfish_k_one_is_refused_as_memorize_refuses_it(tmp_path):
    from memorization.training.goldfish import validate_goldfish_args

    with pytest.raises(ValueError, match="k=1 is invalid"):
        validate_goldfish_args(1, 13, "hash", allow_zero=True)
    with pytest.raises(ValueError, match="goldfish_k must be 0 .* or >= 2, got 1"):  # memorize.py refuses k = 1
        gen.make_job(gen.job_spec(machine="frontier", size="8b", goldfish_k=1, out_dir=str(tmp_path)))


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


# ------------------------------------------------ batch errors list the right products; bad profile YAML

def _products(msg: str) -> list[int]:
    m = re.search(r"products: ([\d, ]+)\)", msg)
    assert m, msg
    return [int(x) for x in m.group(1).split(",")]


@pytest.mark.parametrize("micro_batch", [3, 5])
def test_batch_error_with_micro_batch_lists_the_products_the_batch_must_divide_by(micro_batch):
    with pytest.raises(PlanError) as ei:
        plan("8b", 2048, 128, 8, machine="frontier", micro_batch=micro_batch)
    msg = str(ei.value)
    assert ei.value.kind == "batch", msg
    prods = _products(msg)
    # the advice "use a global batch that is a multiple of one of them" must not be met by the refused batch
    assert not any(128 % p == 0 for p in prods), msg
    assert all(p % micro_batch == 0 for p in prods), msg
    assert "data×depth×micro-batch" in msg
    suggested = int(re.search(r"e\.g\. (\d+)", msg).group(1))
    assert any(suggested % p == 0 for p in prods)
    assert plan("8b", 2048, suggested, 8, machine="frontier", micro_batch=micro_batch).ranked


def test_batch_error_without_micro_batch_is_unchanged():
    with pytest.raises(PlanError) as ei:
        plan("8b", 2048, 256, 6, machine="frontier")
    msg = str(ei.value)
    assert ei.value.kind == "batch" and "(their data×depth products: 3, 6)" in msg, msg


@pytest.mark.parametrize("edit, match", [
    (lambda t: t + "oops: [1, 2\n", r"not valid YAML"),
    (lambda t: t.replace("memory_gib: 80", 'memory_gib: "80"'), r"memory_gib must be a number, got '80'"),
    (lambda t: t.replace("gpus_per_node: 4", "gpus_per_node: 4.5"), r"gpus_per_node must be an integer"),
])
def test_bad_profile_yaml_is_a_plan_error_not_a_traceback(tmp_path, edit, match):
    text = (PROFILE_DIR / "perlmutter.yaml").read_text()
    path = tmp_path / "my_profile.yaml"
    path.write_text(edit(text))
    with pytest.raises(PlanError, match=match) as ei:
        plan("8b", 2048, 128, 8, machine=path)
    assert ei.value.kind == "machine"
    proc = run_python(["-m", "axonn.planner", "--size", "8b", "--gpus", "8",
                           "--machine", str(path)], cwd=REPO)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(match, proc.stderr), proc.stderr


def test_bundled_and_numeric_profiles_still_load():
    import numpy as np

    for name in ("frontier", "alps", "perlmutter", "perlmutter-40", "h100-node"):
        load_profile(name)
    from dataclasses import replace
    p = load_profile("alps")
    assert replace(p, gpus_per_node=np.int64(4), memory_gib=np.float64(96.0)).gpus_per_node == 4
