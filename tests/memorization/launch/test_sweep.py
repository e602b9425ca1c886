"""recipes/sweep.py: grid expansion, a micro sweep end to end, resumability, failures, --emit-jobs."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.forked import run_python
from tests.support import REPO

sys.path.insert(0, str(REPO / "recipes"))
import sweep as sweep_cli  # noqa: E402

from memorization.launch import sweep as sw  # noqa: E402
from memorization.experiment import ExperimentConfig, run_experiment  # noqa: E402
from memorization.experiment.cli import config_from_argv  # noqa: E402

MICRO = ["--num-targets", "4", "--num-nonmembers", "2", "--steps", "12", "--prefix", "10", "--suffix", "10",
         "--seq-len", "64", "--checkpoint-every", "5"]
# the e8 cell fails while it runs (a node failure, simulated): the sweep records it, goes on, and exits non-zero
GRID = ["--sizes", "tiny", "--exposures", "2,4,8", "--goldfish-k", "0,4"]
FAILING = "tiny-e8-k4-h13"


# --------------------------------------------------------------------------- grid


def test_grid_shares_the_standard_arm():
    cells = sw.expand_grid("tiny,mini", "16,32", "0,4,8", "13")
    assert [c.name for c in cells[:2]] == ["tiny-e16-k4-h13", "tiny-e16-k8-h13"]
    assert len(cells) == 2 * 2 * 2
    both = [c for c in cells if c.arms == "both"]
    assert len(both) == 4 and all(c.goldfish_k == 4 for c in both)  # one standard arm per (size, exposures)
    assert all(c.arms == "goldfish" for c in cells if c.goldfish_k == 8)
    cfg = cells[0].config(ExperimentConfig(), Path("d"))  # the cell's fields over the experiment every cell shares
    assert (cfg.model.size, cfg.data.exposures, cfg.goldfish.k, cfg.goldfish.h, cfg.goldfish.arms) == (
        "tiny", "16", 4, 13, "both")


def test_grid_variants():
    only_std = sw.expand_grid(["tiny"], [8, 16], [0])
    assert [(c.name, c.arms) for c in only_std] == [("tiny-e8-standard", "standard"), ("tiny-e16-standard", "standard")]
    no_std = sw.expand_grid("tiny", "8", "4")
    assert [c.arms for c in no_std] == ["goldfish"]
    hs = sw.expand_grid("tiny", "8", "0,4", "7,13")
    assert [(c.name, c.arms) for c in hs] == [("tiny-e8-k4-h7", "both"), ("tiny-e8-k4-h13", "goldfish")]
    assert len(sw.expand_grid("tiny,tiny", "8,8", "0,4,4")) == 1  # duplicates dropped


@pytest.mark.parametrize("args,match", [
    (("tiny", "8", "1"), "k = 1"),
    (("tiny", "0", "0,4"), ">= 1"),
    (("tiny", "8", "0,-2"), ">= 0"),
    (("tiny", "8,x", "0"), "comma list"),
    (("", "8", "0"), "empty"),
    (("tiny", "8", "4", "0"), ">= 1"),
])
def test_grid_refuses_bad_values(args, match):
    with pytest.raises(sw.SweepError, match=match):
        sw.expand_grid(*args)


@pytest.mark.parametrize("extra,match", [
    (["--size", "mini"], "set by the sweep"),
    (["--out=x"], "set by the sweep"),
    (["--stepz", "3"], r"bad memorize option in '--stepz 3': unrecognized arguments: --stepz 3$"),
    (["--steps", "abc"], r"bad memorize option in '--steps abc': argument --steps: invalid int value: 'abc'$"),
])
def test_passthrough_checked(extra, match):
    with pytest.raises(sw.SweepError, match=match):
        sweep_cli.check_passthrough(extra)
    assert sweep_cli.check_passthrough(["--steps", "12", "--seq-len", "64"]) == ["--steps", "12", "--seq-len", "64"]


def test_cli_refuses_bad_grid(tmp_path):
    with pytest.raises(SystemExit, match="unknown size"):
        sweep_cli.main(["--sizes", "huge", "--out", str(tmp_path / "s")])
    with pytest.raises(SystemExit):
        sweep_cli.main(["--sizes", "tiny", "--arms", "both", "--out", str(tmp_path / "s")])
    assert not (tmp_path / "s" / "cells").exists()


# --------------------------------------------------------------------------- micro sweep


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    """First invocation interrupted inside the e4 cell; the second completes it while the e8 cell fails as it runs
    (and exits non-zero after the others); the third re-runs only that cell, which fails again."""
    out = tmp_path_factory.mktemp("sweep")
    cells = sw.expand_grid("tiny", "2,4,8", "0,4")
    calls = []

    def interrupted(cfg):
        calls.append(cfg)
        res = run_experiment(cfg)
        if "tiny-e4-k4-h13" in cfg.output.out:
            raise KeyboardInterrupt  # e.g. Ctrl-C after training, during the evaluations
        return res

    def node_failure(cfg):
        if FAILING in cfg.output.out:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
        return run_experiment(cfg)

    with pytest.raises(KeyboardInterrupt):
        sw.run_sweep(cells, out, config_from_argv(MICRO), sw.EvalOptions(mia=True), {"command": "test"},
                     progress=False, run=interrupted, options=MICRO)
    state = {
        "after_interrupt": {c.name: (out / "cells" / c.name / "cell.json").exists() for c in cells},
        "interrupted_results": (out / "cells" / "tiny-e4-k4-h13" / "results.json").exists(),
        "aggregated": sw.aggregate(out, cells, {}),
    }
    exits = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sw, "run_experiment", node_failure)
        for _ in range(2):
            with pytest.raises(SystemExit) as e:
                sweep_cli.main(GRID + MICRO + ["--mia", "--no-progress", "--out", str(out)])
            exits.append(e.value)
            if not exits[1:]:
                mtimes = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/cell.json")}
                models = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*/model/model.safetensors")}
                records = {p.parent.name: json.loads(p.read_text()) for p in (out / "cells").glob("*/cell.json")}
    return {"out": out, "state": state, "exits": exits, "mtimes": mtimes, "models": models, "records": records,
            "results": json.loads((out / "results.json").read_text()), "calls": calls}


def test_a_sweep_with_a_failed_cell_exits_non_zero_after_running_the_others(micro):
    for e in micro["exits"]:
        assert e.code not in (0, None) and FAILING in str(e.code) and "1 of 3 cells failed" in str(e.code)
    assert micro["records"]["tiny-e4-k4-h13"]["status"] == "ok"  # the cells after the failure ran too


def test_interrupted_cell_leaves_no_result_and_resumes(micro):
    st = micro["state"]["after_interrupt"]
    assert st == {"tiny-e2-k4-h13": True, "tiny-e4-k4-h13": False, FAILING: False}
    assert micro["state"]["interrupted_results"]  # memorize had finished: its arms are reused
    agg = micro["state"]["aggregated"]  # the report of an interrupted sweep shows what finished
    assert [c["status"] for c in agg["cells"]] == ["ok", "partial", "pending"]
    assert sorted((r["exposures"], r["arm"], r["partial"]) for r in agg["rows"]) == [
        (2, "goldfish", False), (2, "standard", False), (4, "goldfish", True), (4, "standard", True)]
    rec = micro["records"]["tiny-e4-k4-h13"]
    assert rec["status"] == "ok" and rec["config"]["output"]["resume"] and rec["attempts"] == 1
    assert not list(micro["out"].rglob("*.tmp"))


def test_second_invocation_reruns_no_finished_cell(micro):
    for p, t in micro["mtimes"].items():
        if FAILING not in str(p):
            assert p.stat().st_mtime_ns == t
    for p, t in micro["models"].items():
        assert p.stat().st_mtime_ns == t
    assert len(micro["models"]) == 4
    assert json.loads((micro["out"] / "cells" / FAILING / "cell.json").read_text())["attempts"] == 2  # retried


def test_failing_cell_recorded_rest_goes_on(micro):
    res = micro["results"]
    failed = [c for c in res["cells"] if c["status"] == "error"]
    assert [c["name"] for c in failed] == [FAILING]
    assert "illegal memory access" in failed[0]["error"] and failed[0]["attempts"] == 2
    md = (micro["out"] / "report.md").read_text()
    assert f"{FAILING}` failed" in md


def test_a_grid_with_a_cell_that_would_fail_is_refused_before_any_cell_runs(tmp_path):
    """100000 exposures cannot fit into 12 steps: the pre-flight checks of every cell run first and refuse the
    grid, naming the cell and the fix, before the good cells spend any time."""
    with pytest.raises(SystemExit, match=r"(?s)none was run.*tiny-e100000-k4-h13: \[failed\] corpus: .*fewer than "
                       r"the 400000 target rows"):
        sweep_cli.main(["--sizes", "tiny", "--exposures", "2,100000", "--goldfish-k", "0,4", *MICRO,
                        "--no-progress", "--out", str(tmp_path / "s")])
    assert not list(tmp_path.glob("s/cells/*/cell.json"))
    with pytest.raises(SystemExit, match=r"--steps"):  # a bad memorize value: refused too, nothing run
        sweep_cli.main(["--sizes", "tiny", "--exposures", "2", "--goldfish-k", "4", *MICRO, "--steps", "-3",
                        "--no-progress", "--out", str(tmp_path / "t")])
    assert not list(tmp_path.glob("t/cells/*/cell.json"))


def test_micro_sweep_report(micro):
    out = micro["out"]
    res = json.loads((out / "results.json").read_text())
    rows = {(r["exposures"], r["arm"], r["k"]) for r in res["rows"]}
    assert rows == {(2, "standard", 0), (2, "goldfish", 4), (4, "standard", 0), (4, "goldfish", 4)}
    for r in res["rows"]:
        assert r["perplexity"] is not None, (r, json.loads((out / "cells" / r["cell"] / "cell.json").read_text())
                                             if "cell" in r else res)
        assert 0 <= r["exact_match"] <= 1 and r["val_loss"] > 0 and r["perplexity"] > 1
        assert 0 <= r["mia_auc_loss"] <= 1 and not r["eval_errors"]
        assert r["steps"] == 12
    md = (out / "report.md").read_text()
    for needle in ("| tiny | 2 | standard |", "| tiny | 2 | goldfish k=4 |", "| tiny | 4 | goldfish k=4 |",
                   "## Membership inference", "AUC loss", "extraction_vs_exposures.png", "mia.png",
                   "python recipes/sweep.py"):
        assert needle in md, needle
    for png in ("extraction_vs_exposures.png", "extraction_quality_vs_k.png", "mia.png"):
        assert (out / png).stat().st_size > 5000
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "<table>" in html and 'src="mia.png"' not in html
    assert (out / "cells" / "tiny-e2-k4-h13" / "standard" / "mia" / "mia_roc.png").exists()


def test_report_only_rebuilds_without_running(micro, tmp_path):
    out = micro["out"]
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/cell.json")}
    res = sweep_cli.main(GRID + MICRO + ["--mia", "--report-only", "--out", str(out)])
    assert res["summary"] is None and len(res["results"]["rows"]) == 4
    assert before == {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/cell.json")}
    # given other memorize options, the report still states what the cells ran (and the command that ran them)
    command = (out / "command.txt").read_text()
    other = [*MICRO[:MICRO.index("--steps") + 1], "99", *MICRO[MICRO.index("--steps") + 2:]]
    res = sweep_cli.main(GRID + other + ["--mia", "--report-only", "--out", str(out)])
    assert res["results"]["memorize_options"] == MICRO and (out / "command.txt").read_text() == command
    md = (out / "report.md").read_text()
    assert "--steps 12" in md and "--steps 99" not in md


# --------------------------------------------------------------------------- jobs and CLI


EMIT = ["--sizes", "8b", "--exposures", "50,100", "--goldfish-k", "0,4,8", "--emit-jobs", "frontier", "--account",
        "ABC", "--seq-len", "256", "--batch-size", "8", "--num-targets", "2", "--steps", "100"]


def test_emit_jobs_writes_one_script_per_cell(tmp_path):
    res = sweep_cli.main([*EMIT, "--out", str(tmp_path / "s"), "--run-root", str(tmp_path / "runs")])
    paths = res["jobs"]
    assert len(paths) == 4 and all(p.exists() for p in paths)
    texts = {p.parent.name: p.read_text() for p in paths}
    k4 = texts["8b-e50-k4-h13"]
    assert "--goldfish-k 4" in k4 and "--exposures 50" in k4 and "--steps 100" in k4 and "--seq-len 256" in k4
    assert "--arms" not in k4 and "#SBATCH -A ABC" in k4 or "ABC" in k4
    assert "--arms goldfish" in texts["8b-e100-k8-h13"]
    index = json.loads((tmp_path / "s" / "jobs" / "jobs.json").read_text())
    assert [j["cell"] for j in index] == ["8b-e50-k4-h13", "8b-e50-k8-h13", "8b-e100-k4-h13", "8b-e100-k8-h13"]
    assert (tmp_path / "s" / "jobs" / "submit_all.sh").read_text().count("sbatch ") == 4
    assert not (tmp_path / "s" / "cells").exists()  # nothing ran locally


def test_emit_jobs_refuses_a_grid_whose_jobs_would_fail_and_writes_nothing(tmp_path):
    """The built-in corpus cannot fill 100 steps of 128 rows x 1,024 tokens: every job would die at start, so the
    sweep names each failing job and writes no script (as the generator refuses one job)."""
    argv = [*EMIT, "--batch-size", "128", "--seq-len", "1024", "--out", str(tmp_path / "s")]
    with pytest.raises(SystemExit, match=r"(?s)no script was written.*8b-e50-k4-h13: \[failed\] corpus: .*corpus too "
                       r"small for 100 steps"):
        sweep_cli.main(argv)
    assert not (tmp_path / "s" / "jobs").exists()


def test_help_explains_every_flag():
    out = run_python([str(REPO / "recipes" / "sweep.py"), "--help"], check=True).stdout
    for flag in ("--sizes", "--exposures", "--goldfish-k", "--goldfish-h", "--out", "--mia", "--downstream",
                 "--hpc-code", "--emit-jobs", "--report-only", "--steps", "--num-targets", "--seq-len",
                 "--batch-size"):
        assert flag in out, flag


@pytest.mark.slow
def test_downstream_and_hpc_code_pipeline(tmp_path):
    """lm-eval (goldfish_mc) and HPC-code pass@1 per arm: a tiny model scores ~0, the pipeline runs."""
    pytest.importorskip("lm_eval")
    res = sweep_cli.main(["--sizes", "tiny", "--exposures", "2", "--goldfish-k", "0,4", "--downstream",
                          "--downstream-limit", "8", "--hpc-code", "--hpc-problems", "reduce_array_sum_serial",
                          "--hpc-max-new-tokens", "16", "--no-progress", "--out", str(tmp_path / "s"), *MICRO])
    rows = res["results"]["rows"]
    assert len(rows) == 2
    for r in rows:
        assert not r["eval_errors"], r["eval_errors"]
        assert "goldfish_mc_acc" in r and r["hpc_pass@1"] == 0
    md = (tmp_path / "s" / "report.md").read_text()
    assert "goldfish_mc_acc" in md and "hpc_pass@1" in md


def test_stop_signal_stops_the_sweep_and_leaves_the_cell_to_resume(tmp_path):
    """memorize exiting 75 (SIGUSR1: checkpointed) ends the sweep there; a validation SystemExit is a failed cell."""
    from memorization.training.train import EXIT_INTERRUPTED

    cells = sw.expand_grid("tiny", "2,4", "4")
    seen = []

    def stopped(cfg):
        seen.append(cfg)
        raise SystemExit(EXIT_INTERRUPTED)

    with pytest.raises(SystemExit) as e:
        sw.run_sweep(cells, tmp_path, config_from_argv(MICRO), sw.EvalOptions(), {}, progress=False, run=stopped)
    assert e.value.code == EXIT_INTERRUPTED and len(seen) == 1  # the second cell never started
    assert not list(tmp_path.glob("cells/*/cell.json"))  # nothing recorded: the next run resumes the cell

    def refused(cfg):
        raise SystemExit("error: --lr must be > 0")

    rec = sw.run_cell(cells[0], tmp_path, config_from_argv(MICRO), sw.EvalOptions(), run=refused)
    assert rec["status"] == "error" and rec["error"] == "SystemExit: error: --lr must be > 0"


def test_finished_cell_is_not_reused_for_other_memorize_options(tmp_path):
    """A cell finished with --steps 12 is no result for --steps 24: memorize runs again (with --resume, which
    refuses the changed settings), and the same options still reuse it, whatever --out is called."""
    cell = sw.expand_grid("tiny", "2", "0")[0]
    opts = sw.EvalOptions()
    calls = []

    def fake(cfg):
        calls.append(cfg)
        out = Path(cfg.output.out)
        (out / "standard").mkdir(parents=True, exist_ok=True)
        (out / "run_config.json").write_text("{}")
        (out / "standard" / "sweep_eval.json").write_text(json.dumps({"options": sw._opts_key(opts)}))
        return {"arms": {"standard": {"steps": cfg.training.steps}}}

    assert not sw.run_cell(cell, tmp_path, config_from_argv(["--steps", "12"]), opts, run=fake)["cached"]
    assert sw.run_cell(cell, tmp_path, config_from_argv(["--steps", "12"]), opts, run=fake)["cached"]
    moved = tmp_path.parent / (tmp_path.name + "-moved")
    tmp_path.rename(moved)
    assert sw.run_cell(cell, moved, config_from_argv(["--steps", "12"]), opts, run=fake)["cached"]
    rec = sw.run_cell(cell, moved, config_from_argv(["--steps", "24"]), opts, run=fake)
    assert not rec["cached"] and len(calls) == 2 and calls[-1].output.resume
    assert rec["arms"]["standard"]["memorize"]["steps"] == 24


def test_trailing_comma_in_the_grid(tmp_path):
    res = sweep_cli.main(["--sizes", "tiny,", "--exposures", "2,4,", "--goldfish-k", "0", "--report-only",
                          "--out", str(tmp_path / "s")])
    assert res["results"]["grid"]["exposures"] == [2, 4] and res["results"]["grid"]["sizes"] == ["tiny"]


def test_evaluations_run_on_the_gpu_when_there_is_one(monkeypatch):
    import torch

    assert sw.EvalOptions().device == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    on_gpu = sw.EvalOptions()
    assert on_gpu.device == "cuda" and sw._hpc_dtype(on_gpu) == "bfloat16"
    assert sw._hpc_dtype(sw.EvalOptions(device="cpu")) == "float32"
    assert sw._hpc_dtype(sw.EvalOptions(device="cuda", dtype="float32")) == "float32"
    assert sweep_cli.parse_args(["--eval-device", "cpu"])[0].eval_device == "cpu"


def test_figure_score_counts_the_least_protective_goldfish_setting_in_any_row_order():
    from memorization.launch.sweep_report import figure_score

    def row(arm, k, loss, min_k):
        return {"size": "tiny", "exposures": 8, "arm": arm, "k": k, "mia_auc_loss": loss, "mia_auc_min_k": min_k}

    # loss: k=2 gives 0.5, k=8 gives 1.0 (no protection): the honest gap is 0; min_k: 0.2 with both k
    rows = [row("standard", 0, 1.0, 1.0), row("goldfish", 2, 0.5, 0.8), row("goldfish", 8, 1.0, 0.8)]
    assert figure_score(rows, ("loss", "min_k")) == "min_k"
    assert figure_score([rows[0], rows[2], rows[1]], ("loss", "min_k")) == "min_k"


@pytest.mark.parametrize("extra", [["--siz", "mini"], ["--exposure", "7"], ["--arm", "goldfish"], ["--ste=3"]])
def test_abbreviated_passthrough_is_refused(extra):
    # memorize's parser expands --siz to --size: the cell "tiny-e2-..." would train a mini model
    with pytest.raises(sw.SweepError, match="full option name"):
        sweep_cli.check_passthrough(extra)
    assert sweep_cli.check_passthrough(["--steps", "3", "--lr=0.01"]) == ["--steps", "3", "--lr=0.01"]


def _fake_memorize(calls):
    """memorize's --resume contract: a run started with other --arms/--goldfish-k is refused."""
    def main(cfg):
        calls.append(cfg)
        out = Path(cfg.output.out)
        arms, k = cfg.goldfish.arms, cfg.goldfish.k
        cfg = out / "run_config.json"
        if cfg.exists() and json.loads(cfg.read_text()) != {"arms": arms, "goldfish_k": k}:
            raise SystemExit("error: --resume with settings that differ from the run")
        out.mkdir(parents=True, exist_ok=True)
        cfg.write_text(json.dumps({"arms": arms, "goldfish_k": k}))
        names = ("standard", "goldfish") if arms == "both" else ("goldfish",)
        res = {}
        for a in names:
            (out / a).mkdir(exist_ok=True)
            (out / a / "sweep_eval.json").write_text(json.dumps({"options": sw._opts_key(OPTS)}))
            res[a] = {"goldfish": {"k": k if a == "goldfish" else 0, "h": 13}, "exact_match": 0.5,
                      "token_match": 0.6, "rouge_l": 0.7, "val_loss": 2.0, "final_train_loss": 1.0, "steps": 3,
                      "train_seconds": 1.0, "goldfish_drop_frac": 0.25 if a == "goldfish" else 0.0}
        return {"arms": res}
    return main


OPTS = sw.EvalOptions(device="cpu")


def test_extended_grid_keeps_the_standard_arm_where_it_was_trained(tmp_path):
    calls = []
    fake = _fake_memorize(calls)
    first = sw.expand_grid("tiny", "2", "0,4")
    for c in first:
        assert sw.run_cell(c, tmp_path, ExperimentConfig(), OPTS, run=fake)["status"] == "ok"
    # the same sweep with k=2 added in front: k=4 keeps its (finished) standard arm, k=2 runs Goldfish only
    cells = sw.adopt_standard_arms(sw.expand_grid("tiny", "2", "0,2,4"), tmp_path)
    assert [(c.name, c.arms) for c in cells] == [("tiny-e2-k2-h13", "goldfish"), ("tiny-e2-k4-h13", "both")]
    recs = [sw.run_cell(c, tmp_path, ExperimentConfig(), OPTS, run=fake) for c in cells]
    assert [r["status"] for r in recs] == ["ok", "ok"] and recs[1]["cached"]
    assert sum(c.goldfish.arms == "both" for c in calls) == 1  # one standard arm per (size, exposures), trained once
    # and a grid without the first k: a cell not started yet takes the standard arm
    cells = sw.adopt_standard_arms(sw.expand_grid("tiny", "2", "0,2,8"), tmp_path)
    assert [(c.name, c.arms) for c in cells] == [("tiny-e2-k2-h13", "goldfish"), ("tiny-e2-k8-h13", "both")]
    # grids without a standard arm are left alone
    assert sw.adopt_standard_arms(sw.expand_grid("tiny", "2", "4"), tmp_path)[0].arms == "goldfish"


def test_run_sweep_adopts_the_standard_arm(tmp_path):
    calls = []
    fake = _fake_memorize(calls)
    small = ["--steps", "12", "--seq-len", "64", "--num-targets", "4", "--prefix", "10", "--suffix", "10"]
    sw.run_sweep(sw.expand_grid("tiny", "2", "0,4"), tmp_path, config_from_argv(small), OPTS, {}, progress=False,
                 run=fake)
    res, summary = sw.run_sweep(sw.expand_grid("tiny", "2", "0,2,4"), tmp_path, config_from_argv(small), OPTS, {},
                                progress=False, run=fake)
    assert not summary.failed and summary.cached == ["tiny-e2-k4-h13"]
    assert sorted((r["arm"], r["k"]) for r in res["rows"]) == [("goldfish", 2), ("goldfish", 4), ("standard", 0)]


def test_arm_colors_agree_across_size_panels(tmp_path, monkeypatch):
    from memorization.launch import sweep_report as rep

    def row(size, e, arm, k):
        return {"size": size, "exposures": e, "arm": arm, "k": k, "h": 13 if k else None, "exact_match": 0.5,
                "exact_match_ci95": [0.2, 0.8], "rouge_l": 0.6}

    # the mini goldfish cells failed: mini has a standard arm only
    rows = [row("tiny", e, a, k) for e in (2, 4) for a, k in (("standard", 0), ("goldfish", 4))]
    rows += [row("mini", e, "standard", 0) for e in (2, 4)]
    plt = rep._plt()
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig: figs.append(fig))
    assert rep.plot_extraction_vs_exposures(rows, tmp_path / "x.png")
    colors: dict[str, set] = {}
    for ax in figs[0].axes:
        for line in ax.get_lines():
            colors.setdefault(line.get_label(), set()).add(line.get_color())
    assert all(len(c) == 1 for c in colors.values()), colors
    legend = figs[0].axes[-1].get_legend()
    assert sorted(t.get_text() for t in legend.get_texts()) == sorted(colors)  # every arm, from every panel
    monkeypatch.undo()
    for fig in list(figs):
        plt.close(fig)


@pytest.mark.parametrize("flags,match", [
    (["--emit-jobs", "frontier", "--mia"], "--mia would not run"),
    (["--emit-jobs", "frontier", "--report-only"], "contradict"),
    (["--gpus", "8"], "--gpus only shape"),
    (["--eval-device", "gpu0"], "--eval-device"),
])
def test_flags_the_mode_would_ignore_are_refused(tmp_path, flags, match):
    with pytest.raises(SystemExit, match=match):
        sweep_cli.main(["--sizes", "tiny", "--exposures", "2", "--out", str(tmp_path / "s"), *flags])
    assert not (tmp_path / "s").exists()


def test_a_hash_wider_than_the_row_context_is_refused_before_any_cell():
    """memorize refuses --goldfish-h > 64 (a row carries 64 stream tokens); the sweep says so for the whole grid
    up front, not cell by cell after the first ones trained."""
    from memorization.launch.sweep import SweepError, expand_grid

    assert len(expand_grid(["tiny"], [2], [0, 4], [13, 64])) == 2
    with pytest.raises(SweepError, match="--goldfish-h 65: .* h must be <= 64"):
        expand_grid(["tiny"], [2], [0, 4], [13, 65])


def test_report_html_renders_the_markdown_escapes_text_and_inlines_only_known_figures():
    from memorization.launch.sweep_report import markdown_to_html

    md = ("# Sweep\n\nSome **bold**, `code` and <script>x</script>.\n\n| arm | exact |\n|---|---:|\n"
          "| standard | 0.97 |\n\n- one\n- two\n\n![fig](f.png)\n\n![missing](g.png)\n\n```\nx < y\n```\n")
    page = markdown_to_html(md, {"f.png": b"PNG"}, "T <1>")
    assert "<title>T &lt;1&gt;</title>" in page and "<h1>Sweep</h1>" in page
    assert "<strong>bold</strong>" in page and "<code>code</code>" in page
    assert "<script>" not in page and "&lt;script&gt;" in page and "x &lt; y" in page
    assert "<th>arm</th>" in page and '<td style="text-align:right">0.97</td>' in page
    assert "<li>one</li>" in page and "<li>two</li>" in page
    assert page.count("data:image/png;base64,UE5H") == 1 and "g.png" not in page and "missing" not in page
    assert "<p><figure>" not in page and "<p></p>" not in page
