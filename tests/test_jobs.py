"""Tests of the Slurm job generator (recipes/jobs/generate.py)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memorization import jobs as gen

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("jobs_generate", REPO / "recipes" / "jobs" / "generate.py")
cli = importlib.util.module_from_spec(_spec)  # the command line; the generator is memorization.jobs
_spec.loader.exec_module(cli)

MACHINE_ENV = {
    "frontier": ["NCCL_NET_GDR_LEVEL=3", "FI_CXI_ATS=0", "MIOPEN_USER_DB_PATH", "module load rocm",
                 "--gpus-per-node=8", "-A "],
    "alps": ['NCCL_NET="AWS Libfabric"', "FI_CXI_DISABLE_HOST_REGISTER=1", "--uenv", "--gpus-per-node=4"],
    "perlmutter": ["-C \"gpu&hbm80g\"", "module load pytorch", "--gpus-per-node=4", "NCCL_NET_GDR_LEVEL=PHB"],
}


def _bash_n(text: str, tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    f = tmp_path / "job.sbatch"
    f.write_text(text)
    r = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("machine", ["frontier", "alps", "perlmutter"])
@pytest.mark.parametrize("size", ["8b", "70b", "405b"])
def test_paper_jobs(machine, size, tmp_path):
    job = gen.make_job(gen.JobSpec(machine=machine, size=size, goldfish_k=4, out_dir=str(tmp_path),
                                   run_root=str(tmp_path / "runs")))
    text = job.text
    _bash_n(text, tmp_path)
    D, R, C, Z = job.grid
    assert job.nodes * job.tasks_per_node == job.tasks == D * R * C * Z
    assert f"#SBATCH --nodes={job.nodes}" in text
    assert f"#SBATCH --ntasks-per-node={job.tasks_per_node}" in text
    assert f"--ntasks={job.tasks}" in text
    assert re.search(r"^srun .*--nodes=%d --ntasks=%d" % (job.nodes, job.tasks), text, re.M)
    assert f"--grid {D},{R},{C},{Z}" in text and "--resume" in text and "--goldfish-k 4" in text
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:USR1@" in text and "scontrol requeue" in text
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in text
    assert f"--out {tmp_path / 'runs'}/{job.spec.name} " in text
    for needle in MACHINE_ENV[machine]:
        assert needle in text, (machine, needle)
    assert "{{" not in text


def test_goldfish_off_and_overrides(tmp_path):
    job = gen.make_job(gen.JobSpec(machine="frontier", size="8b", nodes=2, goldfish_k=0, exposures=7,
                                   time="1-00:00:00", account="ABC123", grid=(2, 2, 2, 2), micro_batch=1,
                                   out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert job.tasks == 16 and job.nodes == 2 and job.grid == (2, 2, 2, 2)
    assert "--goldfish-k 0" in job.text and "--exposures 7" in job.text and "--export-dtype bfloat16" in job.text
    assert "#SBATCH -A ABC123" in job.text and "#SBATCH --time=1-00:00:00" in job.text
    assert "--grad-reduce-dtype fp32" in job.text and "--async-checkpoint" in job.text
    sync = gen.make_job(gen.JobSpec(machine="frontier", size="8b", nodes=2, grid=(2, 2, 2, 2), micro_batch=1,
                                    async_checkpoint=False, out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert "--async-checkpoint" not in sync.text
    _bash_n(job.text, tmp_path)
    # bf16 gradient reduction: planned with it (a faster prediction) and passed to the trainer
    fp32 = gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, out_dir=str(tmp_path),
                                    run_root=str(tmp_path)))
    bf16 = gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, grad_reduce_dtype="bf16",
                                    out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert "--grad-reduce-dtype bf16" in bf16.text and bf16.predicted_step_s < fp32.predicted_step_s
    _bash_n(bf16.text, tmp_path)


def test_checkpoint_interval_and_usr1_lead_follow_step_and_write_time(tmp_path):
    """The 405b on 1,024 Frontier GCDs: a checkpoint every ~30 minutes of predicted steps, and USR1
    early enough for 3 steps plus two checkpoint writes (a background one in flight, the stop's own)
    at the assumed per-node bandwidth; the batch shell waits for the tasks until 30 s before the limit."""
    job = gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, out_dir=str(tmp_path),
                                   run_root=str(tmp_path)))
    step, stop = job.predicted_step_s, job.stop
    assert stop.checkpoint_every == round(1800 / step) and f"--checkpoint-every {stop.checkpoint_every}" in job.text
    state = 12 * job.spec.shape().num_params()
    assert stop.save_s == pytest.approx(state / 128 / 2e9)  # 128 nodes at 2 GB/s each
    assert stop.signal_lead_s >= 3 * step + 2 * stop.save_s + 30 and stop.signal_lead_s % 60 == 0
    assert f"#SBATCH --signal=B:USR1@{stop.signal_lead_s}" in job.text
    assert f"seq {stop.signal_lead_s - 30})" in job.text
    # a slower filesystem: a longer lead; the trainer's own blocking saves: one write less
    slow = gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, fs_gbps=0.25,
                                    out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert slow.stop.signal_lead_s > stop.signal_lead_s and slow.stop.save_s == pytest.approx(8 * stop.save_s)
    sync = gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, fs_gbps=0.25, async_checkpoint=False,
                                    out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert sync.stop.stop_s == pytest.approx(slow.stop.stop_s - slow.stop.save_s)
    with pytest.raises(ValueError, match=r"--signal-lead 60 s is too short: stopping cleanly takes ~\d+ s"):
        gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, signal_lead_s=60))
    with pytest.raises(ValueError, match="ask for more time"):
        gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, time="10"))
    # a hand grid the planner prices gets the same treatment; --checkpoint-minutes scales the interval
    hand = gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, grid=(1, 8, 4, 32), micro_batch=4,
                                    checkpoint_minutes=60, out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert hand.predicted_step_s == pytest.approx(step) and hand.stop.checkpoint_every == round(3600 / step)
    assert gen.time_limit_s("1-02:03:04") == 93784 and gen.time_limit_s("90") == 5400


def test_bad_job_inputs(tmp_path):
    with pytest.raises(ValueError, match="unknown machine"):
        gen.make_job(gen.JobSpec(machine="summit", size="8b"))
    with pytest.raises(ValueError, match="does not multiply"):
        gen.make_job(gen.JobSpec(machine="alps", size="8b", gpus=16, grid=(1, 2, 2, 2)))
    with pytest.raises(ValueError, match="whole number"):
        gen.make_job(gen.JobSpec(machine="alps", size="8b", gpus=18))
    with pytest.raises(ValueError, match="disagree"):
        gen.make_job(gen.JobSpec(machine="alps", size="8b", gpus=16, nodes=2))
    with pytest.raises(gen.PlanError, match="smallest GPU count"):
        gen.make_job(gen.JobSpec(machine="perlmutter", size="405b", gpus=8))
    # a hand grid the trainer would refuse at start is refused here, before the job waits in the queue
    with pytest.raises(ValueError, match="grid 1,16,1,64: row=16 does not divide kv_heads=8"):
        gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, grid=(1, 16, 1, 64)))
    with pytest.raises(ValueError, match=r"grid 8,8,2,8: global batch 128 is not divisible by .*=8×8×4"):
        gen.make_job(gen.JobSpec(machine="frontier", size="405b", gpus=1024, grid=(8, 8, 2, 8), micro_batch=4))


def test_generate_job_api_and_cli(tmp_path, capsys):
    path = gen.generate_job("alps", "8b", gpus=8, goldfish_k=0, out_dir=str(tmp_path), run_root=str(tmp_path))
    assert path.exists() and path.name == "mem-8b-alps-gf0-8g.sbatch"
    assert len(gen.paper_matrix()) == 3 * 3
    out = tmp_path / "all"
    assert cli.main(["--all", "--out-dir", str(out), "--run-root", str(tmp_path / "runs")]) == 0
    files = sorted(out.glob("*.sbatch"))
    assert len(files) == 9
    assert {f.name for f in files} >= {"mem-405b-frontier-gf4-1024g.sbatch", "mem-8b-alps-gf4-16g.sbatch"}
    r = subprocess.run([sys.executable, str(REPO / "recipes/jobs/generate.py"), "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "--goldfish-k" in r.stdout
    assert cli.main(["--machine", "alps", "--size", "405b", "--gpus", "4", "--out-dir", str(tmp_path)]) == 2
    assert "smallest GPU count" in capsys.readouterr().err


def test_init_checkpoint_per_size_checked_where_visible(tmp_path, capsys):
    from transformers import LlamaConfig

    from axonn.presets import get_preset

    ckpt = tmp_path / "Llama-3.1-8b"
    get_preset("8b").llama_config().save_pretrained(ckpt)
    spec = gen.JobSpec(machine="alps", size="8b", gpus=16, init=str(tmp_path / "Llama-3.1-{size}"),
                       out_dir=str(tmp_path), run_root=str(tmp_path))
    job = gen.make_job(spec)
    assert f"--init {ckpt}" in job.text
    _bash_n(job.text, tmp_path)
    LlamaConfig.from_pretrained(ckpt, num_hidden_layers=16).save_pretrained(ckpt)
    with pytest.raises(ValueError, match=r"is not a 8b model .*layers.*\(16, 32\)"):
        gen.make_job(spec)
    (ckpt / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="only Llama is supported"):
        gen.make_job(spec)
    # a path this machine cannot see is passed on, with a note; the job checks it when it starts
    job = gen.make_job(gen.JobSpec(machine="alps", size="70b", gpus=64, init="/nowhere/Llama-3.1-{size}",
                                   out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert "--init /nowhere/Llama-3.1-70b" in job.text
    assert "not visible here" in capsys.readouterr().err


SRUN_SHIM = r'''#!/usr/bin/env python3
"""srun for one machine: --ntasks (or --nodes x --ntasks-per-node) copies of the command, each with
SLURM_PROCID/LOCALID/NTASKS set (and one thread each); SIGUSR1 and SIGTERM are relayed to every
task, as srun does."""
import os, signal, subprocess, sys
args, opts = sys.argv[1:], {}
while args and args[0].startswith("-"):
    key, _, val = args.pop(0).partition("=")
    opts[key] = val
n = int(opts.get("--ntasks") or int(opts.get("--nodes", 1)) * int(opts.get("--ntasks-per-node", 1)))
procs = [subprocess.Popen(args, env={**os.environ, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i),
                                     "SLURM_NTASKS": str(n), "SLURM_NTASKS_PER_NODE": str(n),
                                     "OMP_NUM_THREADS": "1"})  # 2 CPU cores here, not 7 per task
         for i in range(n)]
relay = lambda sig, frame: [p.send_signal(sig) for p in procs]
signal.signal(signal.SIGUSR1, relay)
signal.signal(signal.SIGTERM, relay)
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
'''
SCONTROL_SHIM = """#!/bin/bash
case "$1" in
  show) echo localhost ;;
  requeue) echo "$2" >> "$SHIM_REQUEUED" ;;
esac
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("machine", ["frontier", pytest.param("alps", marks=pytest.mark.slow),
                                     pytest.param("perlmutter", marks=pytest.mark.slow)])
def test_generated_script_checkpoints_on_usr1_requeues_and_resumes(machine, tmp_path):
    """The generated batch script itself, run by bash with srun/scontrol/module shims on this machine
    (2 CPU ranks, the tiny preset): USR1 to the batch shell reaches every rank, which checkpoint after
    the same step and exit 75; the shell asks Slurm to requeue; the same script run again resumes from
    that checkpoint and finishes the run."""
    import os
    import signal
    import time

    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip("needs the project's virtual environment (scripts/setup.sh)")
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", SRUN_SHIM.replace("/usr/bin/env python3", sys.executable)),
                       ("scontrol", SCONTROL_SHIM), ("module", "#!/bin/bash\nexit 0\n")):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    extra = ("--steps 100 --num-targets 4 --num-nonmembers 2 --prefix 10 --suffix 10 --arms standard "
             "--no-progress --checkpoint-every 5")  # later flags win: a checkpoint soon, to know training runs
    job = gen.make_job(gen.JobSpec(machine=machine, size="tiny", gpus=2, seq=64, global_batch=4, exposures=2,
                                   time="00:30:00", out_dir=str(tmp_path), run_root=str(tmp_path / "runs"),
                                   extra_args=extra))
    path = job.write()
    run_dir = tmp_path / "runs" / job.spec.name
    requeued = tmp_path / "requeued"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "AXONN_VENV": str(venv), "AXONN_REPO": str(REPO),
           "SLURM_JOB_ID": str(40000 + os.getpid() % 1000), "SLURM_JOB_NODELIST": "localhost",
           "SLURM_JOB_NUM_NODES": "1", "USER": os.environ.get("USER", "ci"), "SHIM_REQUEUED": str(requeued),
           "WANDB_MODE": "disabled", "AXONN_TIMEOUT": "240"}
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        shell = subprocess.Popen(["bash", str(path)], env=env, stdout=out, stderr=subprocess.STDOUT)
        latest = run_dir / "standard" / "checkpoint" / "LATEST"
        deadline = time.time() + 300
        while not latest.exists() and shell.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert latest.exists(), log.read_text()[-3000:]
        shell.send_signal(signal.SIGUSR1)  # what Slurm does --signal-lead seconds before the limit
        code = shell.wait(timeout=job.stop.grace_s + 60)
    text = log.read_text()
    assert code == 75, text[-3000:]
    assert "USR1: time limit near, checkpoint + requeue" in text
    assert requeued.read_text().split() == [env["SLURM_JOB_ID"]]
    stopped_at = int(latest.read_text().split("_")[1])
    assert 5 <= stopped_at < 100 and not (run_dir / "results.json").exists()
    # the requeued job: the same script, the same command, --resume picks up the checkpoint
    second = subprocess.run(["bash", str(path)], env={**env, "SLURM_RESTART_COUNT": "1"}, capture_output=True,
                            text=True, timeout=500)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert f"standard: resumed at step {stopped_at} of 100" in second.stdout + second.stderr
    result = json.loads((run_dir / "results.json").read_text())["arms"]["standard"]
    assert result["steps"] == 100 and len(result["loss_curve"]) == 100


FAKE_SRUN = """#!/bin/bash
# srun that runs set-up steps as they are, and stands in for the training tasks: they stop on USR1 with status
# $SHIM_EXIT (0: the run had just finished)
while [[ "$1" == -* ]]; do shift; done
[[ "$*" == *memorize.py* ]] || exec "$@"
trap 'exit $SHIM_EXIT' USR1
touch "$SHIM_STARTED"
while :; do sleep 0.05; done
"""


def test_a_job_plans_the_model_it_trains(tmp_path):
    """Without --init memorize.py trains the preset's layers with its tokenizer's vocabulary (the built-in one's
    4,096 rows, or a --tokenizer in the extra arguments): the job is planned for that model; with --init, for the
    preset (Llama 3.1's 128,256). The planner's grid, step time and checkpoint write size follow."""
    from axonn.planner import load_profile, plan, resolve_shape
    from memorization.corpus import load_tokenizer
    from transformers import PreTrainedTokenizerFast

    base = dict(machine="alps", size="405b", gpus=256, out_dir=str(tmp_path), run_root=str(tmp_path))
    preset = resolve_shape("405b")
    own = gen.JobSpec(**base)
    assert own.shape().vocab == len(load_tokenizer()) == 4096 and own.shape().layers == preset.layers
    tuned = gen.JobSpec(**base, init=str(tmp_path / "not-here" / "Llama-3.1-405B"))
    assert tuned.shape() == preset
    small = tmp_path / "tok"  # a --tokenizer of 1,000 tokens: 1,024 rows once padded to a multiple of 64
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="w1", bos_token="w2").save_pretrained(str(small))
    assert gen.JobSpec(**base, extra_args=f"--tokenizer {small}").shape().vocab == 1024
    for spec in (own, tuned):
        job = gen.make_job(spec)
        best = plan(spec.shape(), seq=spec.seq, global_batch=spec.global_batch, gpus=256,
                    machine=load_profile("alps"), activation_checkpointing=True).best
        assert (job.grid, job.predicted_step_s) == (tuple(best.grid), best.step_time_s)
        assert job.stop.save_s == pytest.approx(12 * spec.shape().num_params() / 64 / 2e9)
    assert gen.make_job(own).predicted_step_s < gen.make_job(tuned).predicted_step_s


@pytest.mark.parametrize("tasks_exit,requeued", [(75, True), (0, False), (138, True)],
                         ids=["stopped-75", "finished-0", "killed-by-usr1"])
def test_usr1_requeues_unless_the_run_finished(tasks_exit, requeued, tmp_path):
    """The batch shell's USR1 trap (no training: a fake srun): tasks that stop with 75, or die of the signal
    outside training (128 + 10), are requeued; a run that ends with 0 anyway (USR1 during its last step) is
    not (it would start a job only to find the run done)."""
    import os
    import signal
    import time

    shims = tmp_path / "bin"
    shims.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", SCONTROL_SHIM), ("module", "#!/bin/bash\nexit 0\n")):
        (shims / name).write_text(text)
        (shims / name).chmod(0o755)
    job = gen.make_job(gen.JobSpec(machine="frontier", size="tiny", gpus=2, seq=64, global_batch=4, exposures=2,
                                   out_dir=str(tmp_path), run_root=str(tmp_path / "runs")))
    started, log = tmp_path / "started", tmp_path / "requeued"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "AXONN_VENV": sys.prefix, "AXONN_REPO": str(REPO),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
           "SHIM_REQUEUED": str(log), "SHIM_STARTED": str(started), "SHIM_EXIT": str(tasks_exit)}
    shell = subprocess.Popen(["bash", str(job.write())], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    deadline = time.time() + 60
    while not started.exists() and time.time() < deadline:
        time.sleep(0.05)
    shell.send_signal(signal.SIGUSR1)
    out, _ = shell.communicate(timeout=60)
    assert shell.returncode == tasks_exit, out
    assert (log.read_text().split() if log.exists() else []) == (["4242"] if requeued else []), out
    assert ("finished before stopping: not requeued" in out) == (not requeued)


def test_a_path_the_script_cannot_quote_is_named(tmp_path):
    """Arguments go inside ``bash -c '...'``: one that needs shell quoting (a space) is refused by name,
    not with a complaint about single quotes nobody typed."""
    refused = r"'.*my runs/mem-8b-alps-gf4-16g': paths and values .* must not contain spaces"
    with pytest.raises(ValueError, match=refused):
        gen.make_job(gen.JobSpec(machine="alps", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path / "my runs")))
    with pytest.raises(ValueError, match="extra_args must not contain single quotes"):
        gen.make_job(gen.JobSpec(machine="alps", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path),
                                 extra_args="--targets 'my docs'"))
