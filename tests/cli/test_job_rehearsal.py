"""Rehearsal of generated jobs under a simulated Slurm (the shims in tests/slurm_shims: sbatch, srun, scontrol,
module): the generated ``<name>.submit.sh`` submits, as a user does, the training script from
recipes/jobs/generate.py -- 2 CPU ranks (gloo) fine-tuning a tiny Llama saved with transformers (``--init``, with
the shipped BPE tokenizer next to it) on a token store prepared from the built-in corpus with that checkpoint's
tokenizer (``--store``) -- and then its evaluation job (``--dependency=afterok``).  USR1 mid-run -> every rank
checkpoints and exits 75 -> ``scontrol requeue`` -> the sbatch shim runs the job again -> it resumes and finishes;
its results equal an uninterrupted run's of the same command (same grid, same computation: exactly).  The
evaluation job then extracts (and, in the slow variants, runs perplexity and an lm-eval task) from the arms'
training checkpoints on the inference planner's grid; its extraction reproduces the run's own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memorization.launch import eval_jobs
from memorization.launch import jobs as gen
from tests.support import REPO, SHIMS, WORKERS

STEPS = 8


def save_tiny_llama(path: Path, vocab_size: int | None = None, tokenizer: bool = True) -> Path:
    """A random ``tiny``-preset Llama saved with transformers (safetensors) at ``path``, with the built-in
    BPE tokenizer next to it (``tokenizer``); ``vocab_size`` overrides the preset's 4,096 rows."""
    import torch
    from transformers import LlamaForCausalLM

    from axonn.presets import get_preset
    from memorization.data.corpus import load_tokenizer

    torch.manual_seed(0)
    LlamaForCausalLM(get_preset("tiny").hf_config(vocab_size)).save_pretrained(path, safe_serialization=True)
    if tokenizer:
        load_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("init") / "Llama-tiny")


@pytest.fixture(scope="module")
def store(tiny_init, tmp_path_factory) -> Path:
    """The token store of the jobs' mixture (as data/prepare.py writes it), tokenized with the checkpoint's own
    tokenizer: the jobs' ranks memory-map it instead of tokenizing the corpus."""
    from memorization.data.corpus import DEFAULT_CORPUS
    from memorization.data.mixture import MixtureConfig
    from memorization.data.token_store import prepare_store

    cfg = MixtureConfig(seq_len=64, batch_size=8, exposures=(2,), num_targets=4, num_nonmembers=2, num_steps=STEPS,
                        min_target_tokens=16, seed=0)
    return prepare_store(DEFAULT_CORPUS, str(tiny_init), cfg, tmp_path_factory.mktemp("store") / "store")


def _job(machine: str, root: Path, init: Path, store: Path, checkpoint_every: int = 2) -> gen.Job:
    extra = (f"--steps {STEPS} --num-targets 4 --num-nonmembers 2 --prefix 8 --suffix 8 --extract-batch 4 "
             f"--no-progress --eval-every 0 --store {store}")
    from memorization.experiment.cli import config_from_argv

    spec = gen.job_spec(machine=machine, size="tiny", gpus=2, seq=64, global_batch=8, exposures=2,
                        time="00:30:00", out_dir=str(root / "jobs"), run_root=str(root / "runs"), init=str(init),
                        checkpoint_every=checkpoint_every,
                        experiment=config_from_argv(extra.split(), base=gen.job_defaults(), resolved=False))
    path = gen.write_job(spec)  # pre-flight checks included
    job = gen.make_job(spec)
    assert job.path == path and "--config" in job.text
    return job


def _env(root: Path) -> dict:
    env = {**os.environ, "PATH": f"{SHIMS}:{os.environ['PATH']}", "AXONN_VENV": sys.prefix, "AXONN_REPO": str(REPO),
           "SLURM_SHIM_STATE": str(root / "slurm"), "SLURM_SHIM_JOBS": str(root / "slurm-jobs"),
           "USER": os.environ.get("USER", "ci"), "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "AXONN_TIMEOUT": "240"}
    env.pop("SLURM_JOB_ID", None)
    return env


def _arms(run_dir: Path) -> dict:
    arms = json.loads((run_dir / "results.json").read_text())["arms"]
    return {a: {k: v for k, v in r.items() if k != "train_seconds"} for a, r in arms.items()}


def _descendants(pid: int) -> list[int]:
    """The process ids below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _batch_shim(submit: subprocess.Popen, script: Path) -> int | None:
    """The sbatch shim that runs ``script`` under the submit script ``submit`` (None while there is none)."""
    for pid in _descendants(submit.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"/sbatch") for a in argv) and str(script).encode() in argv:
            return pid
    return None


def _uninterrupted(job: gen.Job, out: Path) -> dict:
    """The arms of the job's training run without interruption: its ranks run the job's command line (its config,
    grid and micro-batch) with ``out`` as the run directory, started as forks (tests/forked.py) instead of through
    the shims: the same computation on the same grid."""
    sys.path.insert(0, str(WORKERS))
    import launcher

    args = ["--config", str(job.config_path), "--grid", str(job.grid), "--micro-batch", str(job.micro_batch),
            "--out", str(out)]
    codes, log = launcher.launch(str(REPO / "recipes" / "memorize.py"), job.tasks, args, timeout=1200,
                                 extra_env={"WANDB_MODE": "disabled", "AXONN_TIMEOUT": "240"})
    assert codes == [0] * job.tasks, log
    return _arms(out)


_SUBMITTED: dict[str, tuple] = {}


def submitted(machine: str, root: Path, init: Path, store: Path, checkpoint_every: int = 2) -> tuple:
    """The job submitted as a user submits it, by the generated ``<name>.submit.sh`` (training, then the evaluation
    job after it), with USR1 sent to the training job once its first checkpoint exists (Slurm's
    ``--signal=B:USR1@lead``): (the job, its run directory, the evaluation job, the submit script's output, the
    training log, the training job's id).  Once per machine, checkpoint and session."""
    key = f"{machine}:{init}"
    if key not in _SUBMITTED:
        job = _job(machine, root, init, store, checkpoint_every)
        assert job.tasks == 2 and job.config.model.init == str(init) and job.config.data.store == str(store)
        # MIA and perplexity on grids: tests/memorization/evaluation/test_mia.py,
        # tests/memorization/evaluation/test_downstream.py; here the checkpoint -> grid path of a generated evaluation
        # job (with downstream: the slow variant)
        evaluation = eval_jobs.make_eval_job(job, EVALUATIONS[machine],
                                             tasks="goldfish_mc" if "downstream" in EVALUATIONS[machine] else None)
        evaluation.write()
        run_dir = Path(job.config.output.out)
        p = subprocess.Popen(["bash", str(evaluation.submit_path)], env=_env(root), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        latest = run_dir / "standard" / "checkpoint" / "LATEST"
        deadline = time.time() + 900
        while not latest.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        shim = _batch_shim(p, job.path)
        assert latest.exists() and shim is not None, (p.poll(), "".join(
            f.read_text()[-3000:] for f in sorted(job.log_dir.glob("*.out"))))
        os.kill(shim, signal.SIGUSR1)  # Slurm: --signal=B:USR1@lead to the batch shell (the shim relays it)
        out, _ = p.communicate(timeout=1800)
        logs = "".join(f.read_text()[-3000:] for f in sorted(job.log_dir.glob("*.out")))
        assert p.returncode == 0, out + logs
        job_id = out.split("training job ")[1].split()[0]
        text = (job.log_dir / f"{job.spec.name}-{job_id}.out").read_text()
        _SUBMITTED[key] = (job, run_dir, evaluation, out, text, job_id)
    return _SUBMITTED[key]


#: the evaluations of the rehearsed evaluation job: downstream (perplexity and lm-eval from the training
#: checkpoints) adds two srun steps, rehearsed with the slow machines
EVALUATIONS = {"frontier": ("extract",), "alps": ("extract", "downstream"), "perlmutter": ("extract", "downstream")}
MACHINES = ["frontier", pytest.param("alps", marks=pytest.mark.slow),
            pytest.param("perlmutter", marks=pytest.mark.slow)]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("machine", MACHINES)
def test_rehearsal_usr1_requeue_resume_equals_uninterrupted(machine, tiny_init, store, tmp_path_factory):
    """submit.sh submits the training job (the sbatch shim runs the generated script); USR1 once the first
    checkpoint exists; the script forwards it, both ranks checkpoint after the same step and exit 75, the shell
    requeues, the shim reruns the job (SLURM_RESTART_COUNT=1), which resumes there and finishes: results.json's
    arms (loss curve, val loss, extraction numbers) equal those of the same command run without interruption
    exactly."""
    assert_resumed_as_uninterrupted(submitted(machine, tmp_path_factory.mktemp(machine), tiny_init, store),
                                    tmp_path_factory)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_real_model_job_resumes_after_usr1_as_uninterrupted_and_its_evaluation_follows(smollm2,
                                                                                          tmp_path_factory):
    """The same submission with the real pretrained SmolLM2-135M-Instruct as ``--init`` (tied embeddings, 9/3
    heads: planned on its own shape, no preset's) and a store tokenized with its own tokenizer: USR1, requeue and
    resume give the uninterrupted run's results exactly, and the evaluation job's extraction from the training
    checkpoints is the run's own."""
    from memorization.data.corpus import DEFAULT_CORPUS
    from memorization.data.mixture import MixtureConfig
    from memorization.data.token_store import prepare_store

    cfg = MixtureConfig(seq_len=64, batch_size=8, exposures=(2,), num_targets=4, num_nonmembers=2, num_steps=STEPS,
                        min_target_tokens=16, seed=0)
    real_store = prepare_store(DEFAULT_CORPUS, str(smollm2), cfg, tmp_path_factory.mktemp("store") / "store")
    sub = submitted("frontier", tmp_path_factory.mktemp("real"), Path(smollm2), real_store, checkpoint_every=4)
    job = sub[0]
    assert job.shape.tied and (job.shape.heads, job.shape.kv_heads, job.shape.layers) == (9, 3, 30)
    assert "smollm2-135m" in job.spec.name
    assert_resumed_as_uninterrupted(sub, tmp_path_factory)
    assert_evaluation_reproduces_extraction(sub, ("extract",))


def assert_resumed_as_uninterrupted(sub: tuple, tmp_path_factory) -> None:
    """The training job of ``sub`` (:func:`submitted`) was stopped by USR1, requeued, resumed and finished with
    the results of an uninterrupted run of its command."""
    job, run_dir, _, _, text, job_id = sub
    assert "USR1: time limit near, checkpoint + requeue" in text and "srun exited with 75" in text
    assert f"job {job_id} (restart 1)" in text
    resumed = [line for line in text.splitlines() if "standard: resumed at step" in line]
    assert resumed, text[-4000:]
    stopped_at = int(resumed[0].split("resumed at step ")[1].split()[0])
    assert 2 <= stopped_at < STEPS
    got = _arms(run_dir)
    assert set(got) == {"standard", "goldfish"}
    assert got == _uninterrupted(job, tmp_path_factory.mktemp("uninterrupted") / "run")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("machine", MACHINES)
def test_the_evaluation_job_follows_training_and_reproduces_its_extraction(machine, tiny_init, store,
                                                                            tmp_path_factory):
    """submit.sh: training (interrupted and requeued, as above), then (afterok) the evaluation job on the inference
    planner's grid, reading the arms' training checkpoints resharded onto it: every target's exact match equals the
    run's own end-of-run extraction; with downstream, the shipped lm-eval task reports for both arms."""
    assert_evaluation_reproduces_extraction(submitted(machine, tmp_path_factory.mktemp(machine), tiny_init, store),
                                            EVALUATIONS[machine])


def assert_evaluation_reproduces_extraction(sub: tuple, evaluations: tuple) -> None:
    """The evaluation job of ``sub`` ran after training and its extraction equals the run's own (its downstream
    evaluation, when it has one, reports the shipped lm-eval task for both arms)."""
    from memorization.evaluation.extraction import trained

    _, run_dir, evaluation, out, _, _ = sub
    arms = _arms(run_dir)
    assert "training job" in out and "evaluation job" in out, out
    log = next(evaluation.train.log_dir.glob(f"{evaluation.train.spec.name}-eval-*.out")).read_text()
    assert "evaluation finished with status 0" in log, log[-4000:]
    assert {s.arm for s in evaluation.steps} == {"standard", "goldfish"} and evaluation.tasks == 2
    assert {s.what for s in evaluation.steps} == set(evaluations)
    for arm in ("standard", "goldfish"):
        ext = json.loads((run_dir / "eval" / arm / "extraction" / "extraction.json").read_text())
        assert {d["id"]: d["exact_match"] for d in trained(ext["documents"])} == arms[arm]["exact_by_target"]
        if "downstream" in evaluations:
            report = json.loads((run_dir / "eval" / arm / "downstream" / "downstream.json").read_text())
            tasks = report["lm_eval"]
            assert not tasks["errors"] and tasks["n_samples"] == {"goldfish_mc": 32}, tasks
            assert 0.0 <= tasks["results"]["goldfish_mc"]["acc"] <= 1.0


def test_an_evaluation_whose_training_failed_never_runs(tmp_path):
    """afterok: the shim holds a job whose dependency ended with a non-zero status, as Slurm does."""
    jobs = tmp_path / "slurm-jobs"
    jobs.mkdir()
    (jobs / "4242.status").write_text("1\n")
    script = tmp_path / "eval.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path}/%x-%j.out\ntouch {tmp_path}/ran\n")
    p = subprocess.run([str(SHIMS / "sbatch"), "--parsable", "--dependency=afterok:4242", str(script)],
                       env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip().isdigit() and "never satisfied" in p.stderr
    assert not (tmp_path / "ran").exists()
    (jobs / "4242.status").write_text("0\n")
    p = subprocess.run([str(SHIMS / "sbatch"), "--dependency=afterok:4242", str(script)], env=_env(tmp_path),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and (tmp_path / "ran").exists()
