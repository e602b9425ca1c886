"""Tests of the Slurm job generator (recipes/jobs/generate.py)."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memorization.launch import jobs as gen
from tests.forked import run_python
from tests.support import REPO

_spec = importlib.util.spec_from_file_location("jobs_generate", REPO / "recipes" / "jobs" / "generate.py")
cli = importlib.util.module_from_spec(_spec)  # the command line; the generator is memorization.launch.jobs
_spec.loader.exec_module(cli)


def experiment_of(flags: str):
    """The job experiment of memorize ``flags`` over the job defaults (memorize's own command-line reading)."""
    import shlex

    from memorization.experiment.cli import config_from_argv

    return config_from_argv(shlex.split(flags), base=gen.job_defaults(), resolved=False)

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
    job = gen.make_job(gen.job_spec(machine=machine, size=size, goldfish_k=4, out_dir=str(tmp_path),
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
    job = gen.make_job(gen.job_spec(machine="frontier", size="8b", nodes=2, goldfish_k=0, exposures=7,
                                   time="1-00:00:00", account="ABC123", grid=(2, 2, 2, 2), micro_batch=1,
                                   out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert job.tasks == 16 and job.nodes == 2 and job.grid == (2, 2, 2, 2)
    assert "--goldfish-k 0" in job.text and "--exposures 7" in job.text and "--export-dtype bfloat16" in job.text
    assert "#SBATCH -A ABC123" in job.text and "#SBATCH --time=1-00:00:00" in job.text
    assert "--grad-reduce-dtype fp32" in job.text and "--async-checkpoint" in job.text
    sync = gen.make_job(gen.job_spec(machine="frontier", size="8b", nodes=2, grid=(2, 2, 2, 2), micro_batch=1,
                                    async_checkpoint=False, out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert "--async-checkpoint" not in sync.text
    _bash_n(job.text, tmp_path)
    # bf16 gradient reduction: planned with it (a faster prediction) and passed to the trainer
    fp32 = gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, out_dir=str(tmp_path),
                                    run_root=str(tmp_path)))
    bf16 = gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, grad_reduce_dtype="bf16",
                                    out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert "--grad-reduce-dtype bf16" in bf16.text and bf16.predicted_step_s < fp32.predicted_step_s
    _bash_n(bf16.text, tmp_path)


def test_checkpoint_interval_and_usr1_lead_follow_step_and_write_time(tmp_path):
    """The 405b on 1,024 Frontier GCDs: a checkpoint every ~30 minutes of predicted steps, and USR1
    early enough for 3 steps plus two checkpoint writes (a background one in flight, the stop's own)
    at the assumed per-node bandwidth; the batch shell waits for the tasks until 30 s before the limit."""
    job = gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, out_dir=str(tmp_path),
                                   run_root=str(tmp_path)))
    step, stop = job.predicted_step_s, job.stop
    assert stop.checkpoint_every == round(1800 / step) and f"--checkpoint-every {stop.checkpoint_every}" in job.text
    state = 12 * job.spec.shape().num_params()
    assert stop.save_s == pytest.approx(state / 128 / 2e9)  # 128 nodes at 2 GB/s each
    assert stop.signal_lead_s >= 3 * step + 2 * stop.save_s + 30 and stop.signal_lead_s % 60 == 0
    assert f"#SBATCH --signal=B:USR1@{stop.signal_lead_s}" in job.text
    assert f"seq {stop.signal_lead_s - 30})" in job.text
    # a slower filesystem: a longer lead; the trainer's own blocking saves: one write less
    slow = gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, fs_gbps=0.25,
                                    out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert slow.stop.signal_lead_s > stop.signal_lead_s and slow.stop.save_s == pytest.approx(8 * stop.save_s)
    sync = gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, fs_gbps=0.25, async_checkpoint=False,
                                    out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert sync.stop.stop_s == pytest.approx(slow.stop.stop_s - slow.stop.save_s)
    with pytest.raises(ValueError, match=r"--signal-lead 60 s is too short: stopping cleanly takes ~\d+ s"):
        gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, signal_lead_s=60))
    with pytest.raises(ValueError, match="ask for more time"):
        gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, time="10"))
    # a hand grid the planner prices gets the same treatment; --checkpoint-minutes scales the interval
    hand = gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, grid=(1, 8, 4, 32), micro_batch=4,
                                    checkpoint_minutes=60, out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert hand.predicted_step_s == pytest.approx(step) and hand.stop.checkpoint_every == round(3600 / step)
    assert gen.time_limit_s("1-02:03:04") == 93784 and gen.time_limit_s("90") == 5400


def test_bad_job_inputs(tmp_path):
    with pytest.raises(ValueError, match="unknown machine"):
        gen.make_job(gen.job_spec(machine="summit", size="8b"))
    with pytest.raises(ValueError, match="does not multiply"):
        gen.make_job(gen.job_spec(machine="alps", size="8b", gpus=16, grid=(1, 2, 2, 2)))
    with pytest.raises(ValueError, match="whole number"):
        gen.make_job(gen.job_spec(machine="alps", size="8b", gpus=18))
    with pytest.raises(ValueError, match="disagree"):
        gen.make_job(gen.job_spec(machine="alps", size="8b", gpus=16, nodes=2))
    with pytest.raises(gen.PlanError, match="smallest GPU count"):
        gen.make_job(gen.job_spec(machine="perlmutter", size="405b", gpus=8))
    # a hand grid the trainer would refuse at start is refused here, before the job waits in the queue
    with pytest.raises(ValueError, match="grid 1,16,1,64: row=16 does not divide kv_heads=8"):
        gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, grid=(1, 16, 1, 64)))
    with pytest.raises(ValueError, match=r"grid 8,8,2,8: global batch 128 is not divisible by .*=8×8×4"):
        gen.make_job(gen.job_spec(machine="frontier", size="405b", gpus=1024, grid=(8, 8, 2, 8), micro_batch=4))


def test_generate_job_api_and_cli(tmp_path, capsys):
    path = gen.generate_job("alps", "8b", gpus=8, goldfish_k=0, out_dir=str(tmp_path), run_root=str(tmp_path),
                            experiment=experiment_of("--steps 1"))  # the built-in corpus fills 1 step of 128 x 2048
    assert path.exists() and path.name == "mem-8b-alps-gf0-8g.sbatch"
    assert path.with_suffix(".yaml").exists()
    assert len(gen.paper_matrix()) == 3 * 3
    out = tmp_path / "all"
    config = tmp_path / "one-step.yaml"
    config.write_text("training: {steps: 1}\n")
    assert cli.main(["--all", "--config", str(config), "--out-dir", str(out), "--run-root", str(tmp_path / "runs")]) == 0
    files = sorted(f for f in out.glob("*.sbatch") if not f.name.endswith(".eval.sbatch"))
    assert len(files) == 9
    assert {f.name for f in files} >= {"mem-405b-frontier-gf4-1024g.sbatch", "mem-8b-alps-gf4-16g.sbatch"}
    assert len(list(out.glob("*.eval.sbatch"))) == len(list(out.glob("*.submit.sh"))) == 9  # each with its evaluation
    r = run_python([str(REPO / "recipes/jobs/generate.py"), "--help"])
    assert r.returncode == 0 and "--goldfish-k" in r.stdout
    assert cli.main(["--machine", "alps", "--size", "405b", "--gpus", "4", "--out-dir", str(tmp_path)]) == 2
    assert "smallest GPU count" in capsys.readouterr().err


def test_init_checkpoint_per_size_checked_where_visible(tmp_path, capsys):
    from transformers import LlamaConfig

    from axonn.presets import get_preset

    ckpt = tmp_path / "Llama-3.1-8b"
    get_preset("8b").hf_config().save_pretrained(ckpt)
    spec = gen.job_spec(machine="alps", size="8b", gpus=16, init=str(tmp_path / "Llama-3.1-{size}"),
                       out_dir=str(tmp_path), run_root=str(tmp_path))
    job = gen.make_job(spec)
    assert f"--init {ckpt}" in job.text
    _bash_n(job.text, tmp_path)
    LlamaConfig.from_pretrained(ckpt, num_hidden_layers=16).save_pretrained(ckpt)
    with pytest.raises(ValueError, match=r"is not a 8b model .*layers.*\(16, 32\)"):
        gen.make_job(spec)
    (ckpt / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(ValueError, match="has no parallel plan: supported are llama"):
        gen.make_job(spec)
    # a path this machine cannot see is passed on, with a note; the job checks it when it starts
    job = gen.make_job(gen.job_spec(machine="alps", size="70b", gpus=64, init="/nowhere/Llama-3.1-{size}",
                                   out_dir=str(tmp_path), run_root=str(tmp_path)))
    assert "--init /nowhere/Llama-3.1-70b" in job.text
    assert "not visible here" in capsys.readouterr().err



def test_a_checkpoint_of_no_presets_shape_is_planned_as_itself(tmp_path):
    """A visible --init whose layers/heads/FFN are no preset's (a SmolLM2: 9/3 heads, tied) is what memorize.py
    trains, so the job plans that shape: the planner's grid divides its heads, the job is named after the
    checkpoint and runs on the fewest GPUs the planner fits it on (fewer GPUs: no grid fits); a checkpoint edited
    since is planned as it is now; the same checkpoint named per size ({size} in --init) must be that size's."""
    from transformers import LlamaConfig

    from axonn.planner import PlanError, divisibility_problem, load_profile, plan

    ckpt = tmp_path / "Odd-Llama_v2"
    LlamaConfig(vocab_size=1000, hidden_size=96, intermediate_size=250, num_hidden_layers=3, num_attention_heads=3,
                num_key_value_heads=1, tie_word_embeddings=True).save_pretrained(ckpt)
    base = dict(machine="alps", size="8b", seq=64, global_batch=6, out_dir=str(tmp_path), run_root=str(tmp_path))
    job = gen.make_job(gen.job_spec(**base, init=str(ckpt)))
    assert (job.shape.layers, job.shape.hidden, job.shape.heads, job.shape.kv_heads, job.shape.ffn, job.shape.vocab,
            job.shape.tied) == (3, 96, 3, 1, 250, 1000, True)
    assert job.tasks == 1 and job.spec.name == "mem-Odd-Llama_v2-alps-gf4-1g" and "--size" not in job.text
    three = gen.make_job(gen.job_spec(**base, init=str(ckpt), gpus=3))
    assert three.tasks == 3 and divisibility_problem(three.shape, three.grid) is None
    LlamaConfig(vocab_size=1000, hidden_size=96, intermediate_size=250, num_hidden_layers=5, num_attention_heads=3,
                num_key_value_heads=1, tie_word_embeddings=True).save_pretrained(ckpt)  # the checkpoint changed:
    os.utime(ckpt / "config.json", ns=(1, 1))  # (a time of its own, whatever the file system's resolution)
    assert gen.make_job(gen.job_spec(**base, init=str(ckpt))).shape.layers == 5  # read again, not remembered
    per_size = gen.job_spec(**{**base, "init": str(tmp_path / "Odd-Llama_{size}"), "gpus": 16})
    assert gen.make_job(per_size).shape.name == "8b"  # not visible here: planned as the size it stands for
    (tmp_path / "Odd-Llama_8b").symlink_to(ckpt)
    with pytest.raises(ValueError, match=r"is not a 8b model .*give the checkpoint's own path"):
        gen.make_job(per_size)

    big = tmp_path / "Wide"  # 70b's layers with another FFN width: several nodes' worth of training state
    LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28000, num_hidden_layers=80,
                num_attention_heads=64, num_key_value_heads=8).save_pretrained(big)
    spec = gen.job_spec(**{**base, "global_batch": 64, "seq": 2048}, init=str(big))
    gpus = spec.total_gpus()
    assert gpus > 4 and gpus % 4 == 0
    fewer = gpus // 2
    with pytest.raises(PlanError):
        plan(spec.shape(), seq=2048, global_batch=64, gpus=fewer, machine=load_profile("alps"),
             activation_checkpointing=spec.run_config().training.activation_checkpointing)


SCONTROL_SHIM = """#!/bin/bash
case "$1" in
  show) echo localhost ;;
  requeue) echo "$2" >> "$SHIM_REQUEUED" ;;
esac
"""


# The generated script run end to end under simulated Slurm (sbatch/srun/scontrol shims in tests/slurm_shims):
# tests/cli/test_job_rehearsal.py.


FAKE_SRUN = """#!/bin/bash
# srun that runs set-up steps as they are, and stands in for the training tasks: they stop on USR1 with status
# $SHIM_EXIT (0: the run had just finished)
while [[ "$1" == -* ]]; do shift; done
[[ "$*" == *memorization.experiment* ]] || exec "$@"
trap 'exit $SHIM_EXIT' USR1
touch "$SHIM_STARTED"
while :; do sleep 0.05; done
"""


def test_a_job_plans_the_model_it_trains(tmp_path):
    """Without --init memorize.py trains the preset's layers with its tokenizer's vocabulary (the built-in one's
    4,096 rows, or a --tokenizer in the extra arguments): the job is planned for that model; with --init, for the
    preset (Llama 3.1's 128,256). The planner's grid, step time and checkpoint write size follow."""
    from axonn.planner import load_profile, plan, resolve_shape
    from memorization.data.corpus import load_tokenizer
    from transformers import PreTrainedTokenizerFast

    base = dict(machine="alps", size="405b", gpus=256, out_dir=str(tmp_path), run_root=str(tmp_path))
    preset = resolve_shape("405b")
    own = gen.job_spec(**base)
    assert own.shape().vocab == len(load_tokenizer()) == 4096 and own.shape().layers == preset.layers
    tuned = gen.job_spec(**base, init=str(tmp_path / "not-here" / "Llama-3.1-405B"))
    assert tuned.shape() == preset
    small = tmp_path / "tok"  # a --tokenizer of 1,000 tokens: 1,024 rows once padded to a multiple of 64
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=t, eos_token="w1", bos_token="w2").save_pretrained(str(small))
    assert gen.job_spec(**base, experiment=experiment_of(f"--tokenizer {small}")).shape().vocab == 1024
    for spec in (own, tuned):
        job = gen.make_job(spec)
        best = plan(spec.shape(), seq=spec.experiment.data.seq_len, global_batch=spec.experiment.training.batch_size,
                    gpus=256,
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
    job = gen.make_job(gen.job_spec(machine="frontier", size="tiny", gpus=2, seq=64, global_batch=4, exposures=2,
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
        gen.make_job(gen.job_spec(machine="alps", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path / "my runs")))
    # memorize flags are folded into the job's config file: quoting them is fine
    job = gen.make_job(gen.job_spec(machine="alps", size="8b", out_dir=str(tmp_path), run_root=str(tmp_path),
                                   experiment=experiment_of("--targets 'my docs'")))
    assert job.config.data.targets == "my docs"


# --------------------------------------------------------------------------- the job's config and pre-flight


def test_generator_refuses_a_job_that_would_fail_and_check_says_why(tmp_path, capsys):
    """The built-in corpus cannot fill 1000 steps of 128 rows x 2048 tokens: refused before a script is written
    (memorize.py would say it only once the job started); --check prints every check and exits 1; one step fits."""
    out = tmp_path / "jobs"
    assert cli.main(["--size", "8b", "--out-dir", str(out), "--run-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "would fail when it starts" in err and "corpus too small for 1000 steps: its 401018 background tokens" in err
    assert not out.exists() or not list(out.iterdir())
    assert cli.main(["--size", "8b", "--check", "--run-root", str(tmp_path / "runs")]) == 1
    printed = capsys.readouterr().out
    assert "[failed] corpus" in printed and "[ok] tokenizer" in printed and "[ok] memory" in printed
    config = tmp_path / "one-step.yaml"
    config.write_text("training: {steps: 1}\n")
    assert cli.main(["--size", "8b", "--check", "--config", str(config), "--run-root", str(tmp_path / "runs")]) == 0
    printed = capsys.readouterr().out
    assert "[ok] corpus: --corpus builtin:pydocs fills 1 steps of 128 rows x 2048 tokens" in printed
    assert "1 of 1 job(s) passed" in printed and not out.exists()


def test_job_runs_its_resolved_config_with_only_execution_flags(tmp_path):
    """--config gives the experiment, flags override it; the script runs memorize (python -m memorization.experiment) --config <the resolved
    config next to it> plus grid, micro-batch, out and resume only; the file reads back to the job's config."""
    import shlex

    from memorization.experiment.config import load_config

    config = tmp_path / "exp.yaml"
    config.write_text("training: {steps: 1, lr: 1.0e-4}\ndata: {exposures: 2}\ngoldfish: {k: 8}\n")
    assert cli.main(["--machine", "alps", "--size", "8b", "--gpus", "16", "--config", str(config), "--exposures", "1",
                     "--out-dir", str(tmp_path / "jobs"), "--run-root", str(tmp_path / "runs")]) == 0
    script = tmp_path / "jobs" / "mem-8b-alps-gf8-16g.sbatch"
    written = script.with_suffix(".yaml")
    line = next(x for x in script.read_text().splitlines() if "exec python -m memorization.experiment" in x)
    argv = shlex.split(line.split("exec python -m memorization.experiment", 1)[1].rstrip("' &"))
    flags = [a for a in argv if a.startswith("--")]
    assert flags == ["--config", "--grid", "--micro-batch", "--out", "--resume"] and argv[1] == str(written)
    cfg = load_config(written)
    assert (cfg.training.lr, cfg.training.steps, cfg.data.exposures, cfg.goldfish.k) == (1e-4, 1, "1", 8)
    assert (cfg.data.seq_len, cfg.training.batch_size, cfg.model.size) == (2048, 128, "8b")
    assert cfg.output.out == str(tmp_path / "runs" / "mem-8b-alps-gf8-16g") and cfg.execution.grid == argv[3]
    assert "--lr 0.0001" in script.read_text()  # the header names the settings for a reader


def test_init_checked_for_tokenizer_and_planned_with_its_vocabulary(tmp_path, capsys):
    """A visible --init is planned with its own vocabulary and its tokenizer is checked against it; an invisible
    one is 'not checked' (never silently passed); {size} where no size fills it is refused."""
    from tests.cli.test_job_rehearsal import save_tiny_llama

    from memorization.experiment.config import ExperimentConfig, Model, resolve
    from memorization.experiment.preflight import preflight

    flags = "--steps 5 --num-targets 4 --num-nonmembers 2 --prefix 8 --suffix 8"
    base = dict(machine="frontier", size="tiny", gpus=2, seq=64, global_batch=4, out_dir=str(tmp_path),
                run_root=str(tmp_path / "runs"), experiment=experiment_of(flags))
    small = save_tiny_llama(tmp_path / "small-tiny", vocab_size=1024, tokenizer=False)
    shipped = REPO / "data" / "pydocs" / "tokenizer-bpe4096"  # 4,096 tokens: more than the checkpoint's rows
    mismatch = {**base, "experiment": experiment_of(flags + f" --tokenizer {shipped}")}
    job = gen.make_job(gen.job_spec(**mismatch, init=str(tmp_path / "small-{size}")))
    assert job.shape.vocab == 1024 and job.config.model.init == str(small)
    checks = {c.name: c for c in gen.check_job(job)}
    assert checks["tokenizer"].failed and "1024" in checks["tokenizer"].detail
    with pytest.raises(gen.JobRefused, match=r"\[failed\] tokenizer"):
        gen.write_job(gen.job_spec(**mismatch, init=str(small)))
    own = save_tiny_llama(tmp_path / "own-tiny")
    checks = {c.name: c.status for c in gen.check_job(gen.make_job(gen.job_spec(**base, init=str(own))))}
    assert set(checks.values()) == {"ok"}, checks
    hidden = {c.name: c for c in gen.check_job(gen.make_job(gen.job_spec(**base, init="/nowhere/{size}")))}
    assert hidden["init"].status == hidden["tokenizer"].status == hidden["corpus"].status == "not checked"
    assert "not visible here" in hidden["init"].detail
    nosize = preflight(resolve(ExperimentConfig(model=Model(init="/models/Llama-3.1-{size}"))))
    assert nosize[0].failed and "{size} has no size to fill" in nosize[0].detail


def test_sweep_emit_jobs_maps_size_in_init_and_plans_its_vocabulary(tmp_path):
    """recipes/sweep.py --init '/models/Llama-3.1-{size}' --emit-jobs: each size's job gets its own checkpoint
    and is planned with the Llama 3.1 vocabulary (128,256 rows), not the built-in tokenizer's 4,096."""
    from memorization.experiment.config import load_config

    spec = importlib.util.spec_from_file_location("sweep_cli", REPO / "recipes" / "sweep.py")
    sweep_cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep_cli)
    res = sweep_cli.main(["--sizes", "8b,70b", "--exposures", "1", "--goldfish-k", "4", "--emit-jobs", "frontier",
                          "--out", str(tmp_path / "s"), "--run-root", str(tmp_path / "runs"), "--steps", "1",
                          "--init", "/nowhere/Llama-3.1-{size}"])
    for path in res["jobs"]:
        size = path.parent.name.split("-")[0]
        cfg = load_config(path.with_suffix(".yaml"))
        assert cfg.model.init == f"/nowhere/Llama-3.1-{size}" and "{size}" not in path.read_text()
        assert "vocabulary" not in path.read_text().split("grid D,R,C,Z")[0]  # planned as the preset (128,256 rows)
    assert gen.job_spec(machine="frontier", size="8b",
                        experiment=experiment_of("--init /nowhere/Llama-3.1-{size}")).shape().vocab \
        == 128256
