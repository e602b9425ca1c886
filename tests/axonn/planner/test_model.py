"""The cost model's at-scale terms (message-size bandwidth, launch cost, global taper) and software terms
(recompute fraction, elementwise traffic): each is monotone where physics says so, and each is neutral
at its default, so the CPU validation and the bundled profiles predict exactly as before."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from axonn.planner import CostConfig, GridShape, load_profile, plan, predict_step
from axonn.planner.calibrate import fit_half_bytes
from axonn.planner.model import _Comm, group_bandwidth, group_span_nodes, message_efficiency
from axonn.planner.profiles import SCALE_TERMS_NEUTRAL, MachineProfile, known_profiles
from axonn.presets import ModelShape
from tests.support import REPO, WORKERS

SHAPE = ModelShape("s", 8, 1024, 16, 4, 2816, 32000, max_seq=2048)


def _profile(**kw) -> MachineProfile:
    return dataclasses.replace(load_profile("h100-node"), **kw)


def test_message_efficiency_rises_monotonically_to_one() -> None:
    sizes = [2.0**k for k in range(8, 34)]
    eff = [message_efficiency(s, 4e6) for s in sizes]
    assert all(a < b for a, b in zip(eff, eff[1:]))
    assert eff[0] < 0.001 and eff[-1] > 0.999 and message_efficiency(4e6, 4e6) == 0.5
    assert all(message_efficiency(s, 0.0) == 1.0 for s in sizes)  # neutral: every size at full bandwidth


def test_collective_bandwidth_monotone_in_message_size_and_half_size() -> None:
    grid = GridShape(1, 1, 1, 64)
    comm = _Comm(grid, _profile(inter_node_half_bw_mbytes=8.0))
    sizes = [2**k for k in range(12, 32)]
    # effective bandwidth (bytes per second of collective time) grows with the buffer
    rates = [n / comm.allgather("depth", n, 1) for n in sizes]
    assert all(a < b for a, b in zip(rates, rates[1:]))
    # a larger S½ never makes a collective faster
    times = [_Comm(grid, _profile(inter_node_half_bw_mbytes=h)).allgather("depth", 2**24, 2) for h in (0, 1, 4, 16)]
    assert times == sorted(times) and times[0] < times[-1]
    # inside a node the intra S½ applies, not the inter one
    node = GridShape(1, 1, 1, 8)
    assert _Comm(node, _profile(inter_node_half_bw_mbytes=64.0)).allgather("depth", 2**20, 2) == \
        _Comm(node, _profile()).allgather("depth", 2**20, 2)
    assert _Comm(node, _profile(intra_node_half_bw_mbytes=64.0)).allgather("depth", 2**20, 2) > \
        _Comm(node, _profile()).allgather("depth", 2**20, 2)


def test_launch_cost_is_paid_once_per_collective() -> None:
    grid = GridShape(2, 2, 2, 2)
    base, launch = _Comm(grid, _profile()), _Comm(grid, _profile(collective_launch_us=25.0))
    for ax in ("data", "row", "col", "depth"):
        assert launch.allreduce(ax, 4096, 2) - base.allreduce(ax, 4096, 2) == pytest.approx(25e-6)
        assert launch.allgather(ax, 4096, 2) - base.allgather(ax, 4096, 2) == pytest.approx(25e-6)
    one = GridShape(16, 1, 1, 1)  # an axis of one rank runs no collective and pays nothing
    assert _Comm(one, _profile(collective_launch_us=25.0)).allgather("depth", 4096, 2) == 0.0
    steps = [predict_step(SHAPE, grid, 2048, 16, 1, _profile(collective_launch_us=us), True).step_time_s
             for us in (0, 5, 20, 80)]
    assert steps == sorted(steps) and steps[0] < steps[-1]


def test_global_taper_only_for_groups_leaving_a_domain_and_monotone() -> None:
    assert group_span_nodes(8, 1, 8) == 1 and group_span_nodes(16, 8, 8) == 16 and group_span_nodes(4, 16, 8) == 7
    prof = _profile(nodes_per_group=4, global_taper=0.25)
    grid = GridShape(1, 1, 1, 64)
    inside = group_bandwidth(grid, 32, 1, prof)[0]  # 32 consecutive ranks: 4 nodes, one domain
    leaving = group_bandwidth(grid, 64, 1, prof)[0]  # 8 nodes: two domains
    assert inside == group_bandwidth(grid, 32, 1, _profile())[0]
    assert leaving == pytest.approx(0.25 * 400e9) and leaving < inside
    steps = [predict_step(SHAPE, GridShape(2, 1, 1, 64), 2048, 128, 1, _profile(nodes_per_group=4, global_taper=t),
                          True).step_time_s for t in (1.0, 0.5, 0.25, 0.1)]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    with pytest.raises(ValueError, match="global_taper"):
        _profile(global_taper=0.0)
    with pytest.raises(ValueError, match="nodes_per_group"):
        _profile(nodes_per_group=-1)


def test_software_terms_monotone() -> None:
    grid, prof = GridShape(1, 2, 1, 8), load_profile("h100-node")
    steps = [predict_step(SHAPE, grid, 2048, 16, 1, prof, True, CostConfig(recompute_fraction=f)).step_time_s
             for f in (0.0, 0.25, 0.5, 1.0)]
    assert steps == sorted(steps) and steps[0] < steps[-1]
    no_ckpt = predict_step(SHAPE, grid, 2048, 16, 1, prof, False).step_time_s
    assert steps[0] == pytest.approx(no_ckpt, rel=1e-3)  # nothing recomputed: close to no checkpointing
    elem = [predict_step(SHAPE, grid, 2048, 16, 1, prof, True,
                         CostConfig(elementwise_bytes_hidden=e, elementwise_bytes_ffn=e / 8)).step_time_s
            for e in (0.0, 50.0, 250.0)]
    assert elem == sorted(elem) and elem[0] < elem[-1]


def test_neutral_terms_change_no_prediction_of_any_bundled_profile() -> None:
    grids = [GridShape(1, 1, 1, 16), GridShape(2, 2, 2, 2), GridShape(1, 4, 1, 4), GridShape(4, 1, 4, 1)]
    # only the profile whose documentation gives a taper carries an at-scale term; the others are neutral
    assert {n for n in known_profiles()
            if load_profile(n) != dataclasses.replace(load_profile(n), **SCALE_TERMS_NEUTRAL)} == {"meta-h100-roce"}
    for name in known_profiles():
        prof = load_profile(name)
        neutral = dataclasses.replace(prof, **SCALE_TERMS_NEUTRAL)
        for g in grids:
            for cfg in (CostConfig(), CostConfig(recompute_fraction=1.0, elementwise_bytes_hidden=0.0)):
                a = predict_step(SHAPE, g, 2048, 16, 1, neutral, True, cfg)
                b = predict_step(SHAPE, g, 2048, 16, 1, neutral, True)
                assert a.step_time_s == b.step_time_s and a.comm_s == b.comm_s


def test_cpu_validation_predicts_exactly_the_committed_times() -> None:
    """benchmarks/results/planner_validation.json holds the predictions of the model before these terms, on the
    calibrated 8-rank CPU profile: the current model gives every one of them bit for bit."""
    old = json.loads((REPO / "benchmarks/results/planner_validation.json").read_text())
    prof = MachineProfile(**old["profile"])
    assert all(getattr(prof, k) == v for k, v in SCALE_TERMS_NEUTRAL.items())
    res = plan(ModelShape(**old["model"]), seq=old["seq"], global_batch=old["global_batch"], gpus=old["world"],
               machine=prof, activation_checkpointing=False, cost_cfg=CostConfig(**old["cost_config"]))
    pred = {(tuple(e.grid), e.micro_batch): e.step_time_s for e in res.ranked}
    assert len(old["grids"]) == 20
    for g in old["grids"]:
        assert pred[(tuple(g["grid"]), g["micro_batch"])] == g["predicted_s"]
    # and exact step times of the bundled GPU profiles, computed before the terms existed
    big = ModelShape("b", 32, 4096, 32, 8, 14336, 128256, max_seq=2048)
    for name, g, t in (("frontier", (2, 2, 2, 8), 3.99743541587722), ("alps", (1, 4, 1, 16), 3.353678565919559),
                       ("perlmutter", (4, 2, 2, 2), 4.495025112951382)):
        assert predict_step(big, GridShape(*g), 2048, 64, 1, load_profile(name), True).step_time_s == t


def test_fit_half_bytes_recovers_the_curve() -> None:
    half, big = 3e6, 200e9
    curve = {s: big * s / (s + half) for s in (2**16, 2**18, 2**20, 2**22, 2**24, 2**30)}
    assert fit_half_bytes(curve) == pytest.approx(half, rel=0.02)
    assert fit_half_bytes({2**20: 5e9, 2**24: 5e9}) == 0.0 and fit_half_bytes({}) == 0.0


def test_calibrate_without_sweep_resets_the_base_network_terms(tmp_path: Path) -> None:
    from axonn.planner.calibrate import calibrate
    prof, _ = calibrate(base="meta-h100-roce", ref_dim=64)
    assert all(getattr(prof, k) == v for k, v in SCALE_TERMS_NEUTRAL.items())
    assert load_profile("meta-h100-roce").global_taper < 1  # the base had a taper; the calibrated profile not


def _published_runs():
    spec = importlib.util.spec_from_file_location("published_runs", REPO / "benchmarks/published_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_published_runs_table_is_complete_and_the_script_predicts_a_grid_entry(tmp_path: Path) -> None:
    table = REPO / "benchmarks/results/published_runs.yaml"
    entries = yaml.safe_load(table.read_text())["entries"]
    assert len(entries) >= 8 and len({e["profile"] for e in entries}) >= 3
    chips = {load_profile(e["profile"]).gpu.split()[0].split("-")[0] for e in entries}
    assert len(chips) >= 3 and "MI250X" in chips  # H100, A100 and MI250X: three machine types, one not NVIDIA
    for e in entries:
        assert e["source"] and e["machine"] and e["published_config"]
        assert {"layers", "hidden", "heads", "kv_heads", "ffn", "vocab"} <= set(e["model"])
        assert e["seq"] > 0 and e["global_batch"] > 0 and e["gpus"] > 0
        assert sum(k in e for k in ("published_tflops_per_gpu", "published_mfu", "published_tokens_per_s_per_gpu")) == 1
        load_profile(e["profile"])
    one = [e for e in entries if e["id"] == "torchtitan-70b-64-a100"]
    small = tmp_path / "one.yaml"
    small.write_text(yaml.safe_dump({"entries": one}))
    rows, text = _published_runs().run(small)
    assert len(rows) == 1 and "within ±25%" in text
    r = rows[0]
    assert r["published"] == pytest.approx(331 * (6 * ModelShape("x", 80, 8192, 64, 8, 28672, 128256).num_params()
                                                  + 12 * 80 * 8192 * 8192) / 1e12)
    assert abs(r["ratio_full"] - 1) <= 0.25
    committed = (REPO / "benchmarks/results/published_runs.md").read_text()
    assert f"| {r['id']} |" in committed and "with terms 10/12" in committed


@pytest.mark.slow  # two gloo ranks measure the sweep (about 30 s on 2 cores)
@pytest.mark.timeout(240)
def test_calibrate_sweep_measures_the_terms_on_two_ranks(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
    launcher = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launcher)
    entry = tmp_path / "cal.py"
    entry.write_text("import sys\nfrom axonn.planner.calibrate import main\nsys.exit(main(sys.argv[1:]))\n")
    out = tmp_path / "p.yaml"
    codes, log = launcher.launch(str(entry), 2, ["--out", str(out), "--ref-dim", "64", "--comm-mbytes", "1",
                                                 "--sweep"], timeout=230)
    assert codes == [0, 0], log
    prof = load_profile(out)
    assert prof.collective_launch_us > 0 and prof.intra_node_half_bw_mbytes >= 0
    assert prof.inter_node_half_bw_mbytes == 0 and prof.global_taper == 1  # one node: nothing across nodes
    header = out.read_text()
    assert "intra_busbw_gbps_64KiB" in header and "collective_launch_us" in header
