"""Review fixes of the sweep: abbreviated pass-through options, the shared standard arm on a grid extended
on resume, one color per arm across the panels, flags the chosen mode would ignore."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "recipes"))
import sweep as sweep_cli  # noqa: E402

from memorization import sweep as sw  # noqa: E402


@pytest.mark.parametrize("extra", [["--siz", "mini"], ["--exposure", "7"], ["--arm", "goldfish"], ["--ste=3"]])
def test_abbreviated_passthrough_is_refused(extra):
    # memorize's parser expands --siz to --size: the cell "tiny-e2-..." would train a mini model
    with pytest.raises(sw.SweepError, match="full option name"):
        sw.check_passthrough(extra)
    assert sw.check_passthrough(["--steps", "3", "--lr=0.01"]) == ["--steps", "3", "--lr=0.01"]


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
        assert sw.run_cell(c, tmp_path, [], OPTS, run=fake)["status"] == "ok"
    # the same sweep with k=2 added in front: k=4 keeps its (finished) standard arm, k=2 runs Goldfish only
    cells = sw.adopt_standard_arms(sw.expand_grid("tiny", "2", "0,2,4"), tmp_path)
    assert [(c.name, c.arms) for c in cells] == [("tiny-e2-k2-h13", "goldfish"), ("tiny-e2-k4-h13", "both")]
    recs = [sw.run_cell(c, tmp_path, [], OPTS, run=fake) for c in cells]
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
    sw.run_sweep(sw.expand_grid("tiny", "2", "0,4"), tmp_path, small, OPTS, {}, progress=False, run=fake)
    res, summary = sw.run_sweep(sw.expand_grid("tiny", "2", "0,2,4"), tmp_path, small, OPTS, {}, progress=False,
                                run=fake)
    assert not summary.failed and summary.cached == ["tiny-e2-k4-h13"]
    assert sorted((r["arm"], r["k"]) for r in res["rows"]) == [("goldfish", 2), ("goldfish", 4), ("standard", 0)]


def test_arm_colors_agree_across_size_panels(tmp_path, monkeypatch):
    from memorization import sweep_report as rep

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
    from memorization.sweep import SweepError, expand_grid

    assert len(expand_grid(["tiny"], [2], [0, 4], [13, 64])) == 2
    with pytest.raises(SweepError, match="--goldfish-h 65: .* h must be <= 64"):
        expand_grid(["tiny"], [2], [0, 4], [13, 65])
