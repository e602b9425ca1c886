"""The evaluation jobs that follow a training job (memorization/launch/eval_jobs.py, recipes/jobs/generate.py --eval).

What runs them end to end under a simulated Slurm is tests/cli/test_job_rehearsal.py (the submit script, training,
then the evaluation on the planner's grid reproducing the run's own extraction); here: what the scripts say."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from axonn.planner import GridShape, divisibility_problem, plan_inference
from memorization.launch import eval_jobs
from memorization.evaluation import registry as evaluations
from memorization.launch import jobs as gen
from tests.support import REPO

_spec = importlib.util.spec_from_file_location("jobs_generate", REPO / "recipes" / "jobs" / "generate.py")
cli = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cli)


def _bash_n(path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("machine, size", [("frontier", "405b"), ("alps", "70b"), ("perlmutter", "8b")])
def test_an_evaluation_job_runs_every_evaluation_of_every_arm_on_a_planned_grid(machine, size, tmp_path):
    train = gen.make_job(gen.job_spec(machine=machine, size=size, out_dir=str(tmp_path), run_root=str(tmp_path / "r")))
    ev = eval_jobs.make_eval_job(train)
    ev.write()
    _bash_n(ev.path)
    _bash_n(ev.submit_path)
    text = ev.text
    # not a training job: no requeue, no USR1 (bash would die of it without a trap)
    assert "#SBATCH --requeue" not in text and "--signal" not in text and "scontrol requeue" not in text
    assert f"#SBATCH --nodes={ev.nodes}" in text and f"--ntasks={ev.tasks}" in text and ev.tasks <= train.tasks
    assert f'RUN_DIR="{train.config.output.out}"' in text
    gpn = gen.machine_config(machine).gpus_per_node
    assert ev.tasks % gpn == 0
    arms = ("standard", "goldfish")
    assert {(s.what, s.arm) for s in ev.steps} == {(w, a) for w in eval_jobs.DEFAULT_EVALUATIONS for a in arms}
    run_dir = train.config.output.out
    for s in ev.steps:
        g = GridShape(*s.grid)
        assert g.size == ev.tasks and divisibility_problem(train.shape, g) is None
        # each step runs the registry's evaluation with the config written beside the script, read back as is
        assert f"python -m memorization.evaluation" in text and f"{s.what} --config {s.config_path}" in text
        step = evaluations.load_config(s.what, s.config_path)
        assert step == s.config and step.grid == ",".join(map(str, s.grid))
        assert (step.model if s.what == "extract" else step.model_path) == f"{run_dir}/{s.arm}/checkpoint"
    x = train.config.extraction
    (extract, *_) = [s.config for s in ev.steps if s.what == "extract"]
    assert (extract.prefix, extract.suffix, extract.prefix_mode, extract.batch_size) == (x.prefix, x.suffix,
                                                                                         x.prefix_mode, x.batch)
    # the model-parallel group is the smallest that holds a replica: one node fewer would not
    prof = gen.load_profile(gen.machine_config(machine).profile)
    if ev.tasks > gpn:
        with pytest.raises(Exception):
            plan_inference(train.shape, ev.tasks - gpn, prof, x.batch, x.prefix + x.suffix, generate=True)
    submit = ev.submit_path.read_text()
    assert f'sbatch --parsable "$here/{train.path.name}"' in submit
    assert f'sbatch --parsable --dependency=afterok:"$train" "$here/{ev.path.name}"' in submit


def test_bad_evaluation_requests_are_refused(tmp_path, capsys):
    train = gen.make_job(gen.job_spec(machine="frontier", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path)))
    for kwargs, match in (({"evaluations": ("extract", "lm_eval")}, "choose from"), ({"evaluations": ()}, "choose"),
                          ({"gpus": 12}, "whole number"), ({"time": "00:00:10"}, "at least a minute"),
                          ({"evaluations": ("mia",), "tasks": "goldfish_mc"}, "add it to the evaluations")):
        with pytest.raises(ValueError, match=match):
            eval_jobs.make_eval_job(train, **kwargs)
    with pytest.raises(SystemExit):
        cli.main(["--machine", "frontier", "--size", "8b", "--eval", "extract,bogus", "--out-dir", str(tmp_path)])
    assert "--eval extract,bogus" in capsys.readouterr().err


def test_generate_writes_the_evaluation_and_the_submit_script_unless_told_not_to(tmp_path):
    config = tmp_path / "one-step.yaml"
    config.write_text("training: {steps: 1}\n")
    base = ["--machine", "alps", "--size", "8b", "--gpus", "8", "--config", str(config), "--run-root", str(tmp_path)]
    assert cli.main([*base, "--out-dir", str(tmp_path / "a"), "--eval", "mia"]) == 0
    (ev,) = (tmp_path / "a").glob("*.eval.sbatch")
    text = ev.read_text()
    assert " mia --config " in text and " extract --config " not in text and " downstream --config " not in text
    assert len(re.findall(r"^run_eval ", text, re.M)) == 2  # both arms
    assert sorted(p.name for p in (tmp_path / "a").glob("*.eval/*.yaml")) == ["mia-goldfish.yaml", "mia-standard.yaml"]
    assert cli.main([*base, "--out-dir", str(tmp_path / "c"), "--eval", "downstream", "--eval-tasks",
                     "goldfish_mc,arc_easy"]) == 0
    (ev,) = (tmp_path / "c").glob("*.eval.sbatch")
    steps = [ln for ln in ev.read_text().splitlines() if ln.startswith("run_eval ")]
    assert len(steps) == 2 and all(" downstream --config " in ln for ln in steps)
    configs = [evaluations.load_config("downstream", ln.split(" --config ")[1]) for ln in steps]
    assert all(c.tasks == ("goldfish_mc", "arc_easy") and c.perplexity_source.endswith("manifest.json")
               for c in configs)
    assert cli.main([*base, "--out-dir", str(tmp_path / "b"), "--eval", "none"]) == 0
    assert not list((tmp_path / "b").glob("*.eval.sbatch")) and not list((tmp_path / "b").glob("*.submit.sh"))


def test_an_evaluation_job_speaks_the_registrys_vocabulary(tmp_path):
    """One vocabulary: every evaluation a job can run is a name of memorization.evaluation.registry, and each step's
    config is that evaluation's config class (what ``python -m memorization.evaluation NAME`` reads back)."""
    assert set(eval_jobs.EVALUATIONS) <= set(evaluations.EVALUATIONS)
    train = gen.make_job(gen.job_spec(machine="frontier", size="tiny", gpus=2, seq=64, global_batch=8,
                                      out_dir=str(tmp_path), run_root=str(tmp_path / "r")))
    ev = eval_jobs.make_eval_job(train, eval_jobs.EVALUATIONS, tasks="goldfish_mc")
    assert {s.what for s in ev.steps} == set(eval_jobs.EVALUATIONS)
    for s in ev.steps:
        assert isinstance(s.config, evaluations.EVALUATIONS[s.what].config), s.what
        assert s.argv == (s.what, "--config", str(s.config_path))
