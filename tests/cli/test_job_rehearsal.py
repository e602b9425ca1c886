"""Rehearsal of generated jobs under a simulated Slurm (the shims in tests/slurm_shims: sbatch, srun, scontrol,
module): a script from recipes/jobs/generate.py runs on this machine with 2 CPU ranks (gloo), fine-tuning a
tiny Llama saved with transformers (``--init``, with the shipped BPE tokenizer next to it) on a token store
prepared from the built-in corpus with that checkpoint's tokenizer (``--store``).  USR1 mid-run -> every rank
checkpoints and exits 75 -> ``scontrol requeue`` -> the sbatch shim runs the job again -> it resumes and
finishes; its results equal an uninterrupted run's of the same job (same grid, same computation: exactly).
The uninterrupted run is submitted as a user submits it, by the generated ``<name>.submit.sh``: training,
then the evaluation job (``--dependency=afterok``), which extracts and runs an lm-eval task from the
arms' training checkpoints on the inference planner's grid; its extraction reproduces the run's own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memorization import eval_jobs
from memorization import jobs as gen
from tests.support import REPO, SHIMS

STEPS = 16


def save_tiny_llama(path: Path, vocab_size: int | None = None, tokenizer: bool = True) -> Path:
    """A random ``tiny``-preset Llama saved with transformers (safetensors) at ``path``, with the built-in
    BPE tokenizer next to it (``tokenizer``); ``vocab_size`` overrides the preset's 4,096 rows."""
    import torch
    from transformers import LlamaForCausalLM

    from axonn.presets import get_preset
    from memorization.corpus import load_tokenizer

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
    from memorization.corpus import DEFAULT_CORPUS
    from memorization.mixture import MixtureConfig
    from memorization.token_store import prepare_store

    cfg = MixtureConfig(seq_len=64, batch_size=8, exposures=(2,), num_targets=4, num_nonmembers=2, num_steps=STEPS,
                        min_target_tokens=16, seed=0)
    return prepare_store(DEFAULT_CORPUS, str(tiny_init), cfg, tmp_path_factory.mktemp("store") / "store")


def _job(machine: str, root: Path, init: Path, store: Path) -> gen.Job:
    extra = (f"--steps {STEPS} --num-targets 4 --num-nonmembers 2 --prefix 8 --suffix 8 --extract-batch 4 "
             f"--no-progress --eval-every 0 --store {store}")
    from memorization.experiment.cli import config_from_argv

    spec = gen.job_spec(machine=machine, size="tiny", gpus=2, seq=64, global_batch=8, exposures=2,
                        time="00:30:00", out_dir=str(root / "jobs"), run_root=str(root / "runs"), init=str(init),
                        checkpoint_every=2,
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


def _sbatch(job: gen.Job, root: Path, job_id: int) -> subprocess.Popen:
    env = {**_env(root), "SLURM_JOB_ID": str(job_id)}
    return subprocess.Popen([str(SHIMS / "sbatch"), str(job.path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _arms(run_dir: Path) -> dict:
    arms = json.loads((run_dir / "results.json").read_text())["arms"]
    return {a: {k: v for k, v in r.items() if k != "train_seconds"} for a, r in arms.items()}


_REFERENCE: dict[str, tuple] = {}


def reference(machine: str, root: Path, init: Path, store: Path) -> tuple[dict, Path, eval_jobs.EvalJob, str]:
    """The uninterrupted run of the same job and its evaluation, submitted by the generated submit script (once per
    machine and session): (its arms' results, its run directory, the evaluation job, the submit script's output)."""
    if machine not in _REFERENCE:
        job = _job(machine, root, init, store)
        # MIA and perplexity on grids: tests/memorization/test_mia.py, tests/memorization/test_downstream.py; here the checkpoint -> grid path
        evaluation = eval_jobs.make_eval_job(job, ("extract", "downstream"), tasks="goldfish_mc")
        evaluation.write()
        p = subprocess.run(["bash", str(evaluation.submit_path)], env=_env(root), capture_output=True, text=True,
                           timeout=900)
        logs = "".join(f.read_text()[-3000:] for f in sorted(job.log_dir.glob("*.out")))
        assert p.returncode == 0, p.stdout + p.stderr + logs
        run_dir = Path(job.config.output.out)
        _REFERENCE[machine] = (_arms(run_dir), run_dir, evaluation, p.stdout + p.stderr)
    return _REFERENCE[machine]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("machine", ["frontier", pytest.param("alps", marks=pytest.mark.slow),
                                     pytest.param("perlmutter", marks=pytest.mark.slow)])
def test_rehearsal_usr1_requeue_resume_equals_uninterrupted(machine, tiny_init, store, tmp_path):
    """sbatch (shim) runs the generated script; USR1 once the first checkpoint exists; the script forwards it,
    both ranks checkpoint after the same step and exit 75, the shell requeues, the shim reruns the job
    (SLURM_RESTART_COUNT=1), which resumes there and finishes: results.json's arms (loss curve, val loss,
    extraction numbers) equal the uninterrupted job's exactly."""
    job = _job(machine, tmp_path, tiny_init, store)
    run_dir = Path(job.config.output.out)
    assert job.tasks == 2 and job.config.model.init == str(tiny_init) and job.config.data.store == str(store)
    job_id = 32000 + os.getpid() % 1000
    p = _sbatch(job, tmp_path, job_id)
    latest = run_dir / "standard" / "checkpoint" / "LATEST"
    deadline = time.time() + 300
    while not latest.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    log = job.log_dir / f"{job.spec.name}-{job_id}.out"
    assert latest.exists(), log.read_text()[-3000:] if log.exists() else ""
    p.send_signal(signal.SIGUSR1)  # Slurm: --signal=B:USR1@lead to the batch shell
    out, _ = p.communicate(timeout=600)
    text = log.read_text()
    assert p.returncode == 0, out + text[-4000:]
    assert "USR1: time limit near, checkpoint + requeue" in text and "srun exited with 75" in text
    assert f"job {job_id} (restart 1)" in text
    resumed = [line for line in text.splitlines() if "standard: resumed at step" in line]
    assert resumed, text[-4000:]
    stopped_at = int(resumed[0].split("resumed at step ")[1].split()[0])
    assert 2 <= stopped_at < STEPS
    got = _arms(run_dir)
    want = reference(machine, tmp_path / "reference", tiny_init, store)[0]
    assert set(got) == {"standard", "goldfish"}
    assert got == want


def test_the_evaluation_job_follows_training_and_reproduces_its_extraction(tiny_init, store, tmp_path):
    """submit.sh: training, then (afterok) the evaluation job on the inference planner's grid, reading the arms'
    training checkpoints resharded onto it: every target's exact match equals the run's own end-of-run
    extraction, and the shipped lm-eval task reports for both arms."""
    from memorization.extraction import trained

    arms, run_dir, evaluation, out = reference("frontier", tmp_path / "reference", tiny_init, store)
    assert "training job" in out and "evaluation job" in out, out
    log = next(evaluation.train.log_dir.glob(f"{evaluation.train.spec.name}-eval-*.out")).read_text()
    assert "evaluation finished with status 0" in log, log[-4000:]
    assert {s.arm for s in evaluation.steps} == {"standard", "goldfish"} and evaluation.tasks == 2
    for arm in ("standard", "goldfish"):
        ext = json.loads((run_dir / "eval" / arm / "extraction" / "extraction.json").read_text())
        assert {d["id"]: d["exact_match"] for d in trained(ext["documents"])} == arms[arm]["exact_by_target"]
        tasks = json.loads((run_dir / "eval" / arm / "downstream" / "downstream.json").read_text())["lm_eval"]
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
