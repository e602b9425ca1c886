"""Slurm batch scripts for the memorization experiments on Frontier, Alps and Perlmutter.

Each script trains one model size via ``recipes/memorize.py``: by default both arms, the standard loss and
Goldfish (``--goldfish-k 4``), on the same mixture, seed and initial weights, so its report holds the paired
comparison (McNemar); ``--goldfish-k 0`` trains the standard arm alone and ``--arms`` picks one arm. It runs on the
4D grid the planner (:mod:`axonn.planner`) ranks fastest for
that machine and GPU count (passed as ``--grid D,R,C,Z``, with the planner's micro-batch), with
the environment the machine needs, one ``srun`` task per GPU, ``MASTER_ADDR`` from the first
node of ``$SLURM_JOB_NODELIST``, and checkpoint/resume on requeue (``#SBATCH --requeue``,
``--signal=B:USR1@...``, a fixed ``--out`` directory and ``--resume``).  The templates are
``recipes/jobs/templates/``; ``recipes/jobs/generate.py`` is the command line.

With ``--init`` each rank reads only the rows of the checkpoint its shards need (no process holds
the full model; ``memorization.models.build_model``).

API: :func:`make_job` (a :class:`JobSpec` -> :class:`Job`, nothing written), :func:`write_job`,
:func:`generate_job` (keyword arguments -> written script path; what a sweep calls) and
:func:`paper_matrix`.
"""
from __future__ import annotations

import math
import re
import shlex
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from axonn.planner import (GRAD_REDUCE_BYTES, Grid, MachineProfile, MemoryConfig, PlanError,
                           divisibility_problem, load_profile, memory_per_gpu, plan, resolve_shape)
from axonn.presets import ModelShape

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "recipes" / "jobs" / "templates"


@dataclass(frozen=True)
class MachineJobConfig:
    """What a machine's scripts need beyond the planner profile."""

    name: str
    profile: str                 # planner profile name
    template: str                # file in templates/
    gpus_per_node: int
    srun_flags: str
    task_prelude: str = ""       # shell run by every task before python (inside bash -c '...')
    constraint: str = ""         # -C for Perlmutter
    default_gpus: dict[str, int] = field(default_factory=dict)  # paper-matrix GPU counts per size
    # checkpoint write bandwidth one node gets from the shared filesystem: an assumption, not a
    # measurement (a busy Lustre gives a node a few GB/s); it sizes the USR1 lead (--fs-gbps)
    fs_gbps_per_node: float = 2.0


MACHINES: dict[str, MachineJobConfig] = {
    "frontier": MachineJobConfig(
        "frontier", "frontier", "frontier.sbatch", 8,
        "--gpus-per-task=1 --gpu-bind=closest --cpus-per-task=7",
        default_gpus={"8b": 64, "70b": 256, "405b": 1024}),
    "alps": MachineJobConfig(
        "alps", "alps", "alps.sbatch", 4,
        '--cpus-per-task=72 --uenv="$UENV" --view=default',
        task_prelude='if [ -d "$AXONN_VENV" ]; then source "$AXONN_VENV/bin/activate"; fi; ',
        default_gpus={"8b": 16, "70b": 64, "405b": 256}),
    "perlmutter": MachineJobConfig(
        "perlmutter", "perlmutter", "perlmutter.sbatch", 4,
        "--gpus-per-node=4 --gpu-bind=none --cpus-per-task=32", constraint='"gpu&hbm80g"',
        default_gpus={"8b": 32, "70b": 128, "405b": 512}),
    "perlmutter-40": MachineJobConfig(
        "perlmutter-40", "perlmutter-40", "perlmutter.sbatch", 4,
        "--gpus-per-node=4 --gpu-bind=none --cpus-per-task=32", constraint='"gpu&hbm40g"',
        default_gpus={"8b": 32, "70b": 256, "405b": 1024}),
}

ARMS = ("both", "standard", "goldfish")  # memorize.py --arms
PAPER_SIZES = ("8b", "70b", "405b")
PAPER_MACHINES = ("frontier", "alps", "perlmutter")


@lru_cache(maxsize=None)
def _tokenizer_rows(tokenizer: str | None) -> int | None:
    """Embedding rows memorize.py gives the model of ``tokenizer`` (None: its built-in one), or None (with a
    note) when the tokenizer cannot be loaded here: a path only the compute nodes see."""
    from memorization.corpus import DEFAULT_TOKENIZER, load_tokenizer
    from memorization.models import padded_vocab

    try:
        return padded_vocab(len(load_tokenizer(tokenizer or DEFAULT_TOKENIZER)))
    except (OSError, ValueError) as e:
        print(f"note: --tokenizer {tokenizer} cannot be loaded here ({e}); planning with the preset's vocabulary",
              file=sys.stderr)
        return None


@dataclass(frozen=True)
class JobSpec:
    """One training job. ``gpus`` or ``nodes`` (``None`` for both: the paper default for the size)."""

    machine: str
    size: str
    gpus: int | None = None
    nodes: int | None = None
    goldfish_k: int = 4
    arms: str = "both"           # memorize.py --arms: both (its default), standard or goldfish
    exposures: int = 100
    time: str = "02:00:00"
    account: str = "ACCOUNT"     # placeholder: replace or pass --account
    out_dir: str = "recipes/jobs/out"
    run_root: str = "runs/jobs"  # checkpoints/logs of the runs: <run_root>/<job name>
    seq: int = 2048
    global_batch: int = 128
    micro_batch: int | None = None
    grid: tuple[int, int, int, int] | None = None  # override the planner's choice
    activation_checkpointing: bool = True
    grad_reduce_dtype: str = "fp32"  # "bf16": gradients summed in bf16 (planned and trained so)
    async_checkpoint: bool = True    # checkpoints written while training goes on (host memory is ample there)
    signal_lead_s: int | None = None  # USR1 this many s before the limit; None: from step and save time
    checkpoint_minutes: float = 30.0  # checkpoint interval in wall time (converted with the predicted step)
    fs_gbps: float | None = None      # checkpoint write GB/s per node (None: the machine's assumption)
    init: str | None = None      # HF checkpoint to fine-tune; "{size}" in it becomes the size (8b, 70b, ...)
    extra_args: str = ""         # appended verbatim to the memorize.py command

    @property
    def name(self) -> str:
        return f"mem-{self.size}-{self.machine}-gf{self.goldfish_k}-{self.total_gpus()}g"

    def shape(self) -> ModelShape:
        """The model the job trains, which the planner prices: the preset's layers, and its vocabulary with
        ``init`` (a Llama 3.1 checkpoint: 128,256 rows); without ``init``, the vocabulary of the run's tokenizer
        (``--tokenizer`` in ``extra_args``, else memorize.py's built-in one: 4,096 rows), padded as memorize.py
        pads it, so step time, memory and checkpoint interval describe that model (an 8b of 7.0 B parameters)."""
        preset = resolve_shape(self.size)
        if self.init is not None:
            return preset
        args = shlex.split(self.extra_args)
        given = [v for k, v in zip(args, args[1:]) if k == "--tokenizer"]
        vocab = _tokenizer_rows(given[-1] if given else None)
        if vocab is None or vocab == preset.vocab:
            return preset
        return replace(preset, name=f"{preset.name} (vocabulary {vocab})", vocab=vocab)

    def total_gpus(self) -> int:
        cfg = machine_config(self.machine)
        if self.gpus is not None and self.nodes is not None and self.gpus != self.nodes * cfg.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} and --nodes {self.nodes} disagree "
                             f"({cfg.gpus_per_node} GPUs per {self.machine} node)")
        if self.gpus is not None:
            return self.gpus
        if self.nodes is not None:
            return self.nodes * cfg.gpus_per_node
        if self.size not in cfg.default_gpus:
            resolve_shape(self.size)  # an unknown size is named as such (PlanError lists the presets)
            raise ValueError(f"no default GPU count for {self.size} on {self.machine}: pass --gpus or --nodes")
        return cfg.default_gpus[self.size]


@dataclass(frozen=True)
class Job:
    """A rendered batch script and the facts it encodes."""

    spec: JobSpec
    text: str
    nodes: int
    tasks_per_node: int
    tasks: int
    grid: tuple[int, int, int, int]
    micro_batch: int
    predicted_step_s: float | None
    path: Path
    log_dir: Path
    stop: StopPlan

    def write(self) -> Path:
        """Write the script (and create the Slurm log directory it names)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.path.write_text(self.text)
        self.path.chmod(0o755)
        return self.path


def machine_config(machine: str) -> MachineJobConfig:
    if machine not in MACHINES:
        raise ValueError(f"unknown machine {machine!r} for job scripts: choose one of {', '.join(MACHINES)}")
    return MACHINES[machine]


_TIME = re.compile(r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$|^\d+$")
STATE_BYTES_PER_PARAM = 12  # what a checkpoint holds: fp32 weight + AdamW's two fp32 moments
DEFAULT_CHECKPOINT_EVERY = 50  # memorize.py's, used when no step time is predicted


def time_limit_s(text: str) -> int:
    """Slurm ``[D-]HH:MM:SS`` or minutes, in seconds."""
    if text.isdigit():
        return int(text) * 60
    days, _, hms = text.rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return (int(days) if days else 0) * 86400 + h * 3600 + m * 60 + sec


@dataclass(frozen=True)
class StopPlan:
    """How the job checkpoints: interval, write time, and the USR1 lead a clean stop needs.

    At USR1 a rank finishes its step, the next step all-reduces the request and ``fit`` reads it
    one step later (3 steps at most), finishes a background save still in flight, then writes the
    stop's checkpoint: ``stop_s = 3·step + (2 if async else 1)·save + 30 s``.  ``save_s`` is the
    node's share of the state (``12 B/param · params / nodes``: every rank writes its own part) at
    the filesystem bandwidth a node gets.
    """

    checkpoint_every: int
    save_s: float
    stop_s: float
    signal_lead_s: int
    grace_s: int  # how long the batch shell waits for the tasks before requeueing


def stop_plan(spec: JobSpec, step_s: float | None, nodes: int, fs_gbps: float) -> StopPlan:
    save_s = STATE_BYTES_PER_PARAM * spec.shape().num_params() / nodes / (fs_gbps * 1e9)
    step = step_s if step_s is not None else 60.0  # a hand grid the planner cannot price: assume a slow step
    stop_s = 3 * step + (2 if spec.async_checkpoint else 1) * save_s + 30
    lead = spec.signal_lead_s if spec.signal_lead_s is not None else max(120, 60 * math.ceil(stop_s / 60))
    if lead < stop_s:
        raise ValueError(f"--signal-lead {lead} s is too short: stopping cleanly takes ~{stop_s:.0f} s "
                         f"(3 steps of {step:.1f} s and {save_s:.0f} s per checkpoint write at {fs_gbps:g} GB/s per "
                         f"node): use at least {math.ceil(stop_s)} or leave it out")
    every = (max(1, round(spec.checkpoint_minutes * 60 / step_s)) if step_s is not None
             else DEFAULT_CHECKPOINT_EVERY)
    return StopPlan(every, save_s, stop_s, int(lead), max(10, int(lead) - 30))


def make_job(spec: JobSpec) -> Job:
    """Render the batch script of ``spec`` (planner picks grid and micro-batch unless given)."""
    cfg = machine_config(spec.machine)
    gpus = spec.total_gpus()
    if gpus % cfg.gpus_per_node and gpus > cfg.gpus_per_node:
        raise ValueError(f"{gpus} GPUs is not a whole number of {spec.machine} nodes ({cfg.gpus_per_node} each)")
    if not _TIME.match(spec.time):
        raise ValueError(f"--time {spec.time!r}: use [D-]HH:MM:SS or minutes")
    if spec.checkpoint_minutes <= 0 or (spec.fs_gbps is not None and spec.fs_gbps <= 0):
        raise ValueError("checkpoint_minutes and fs_gbps must be positive")
    if spec.goldfish_k < 0 or spec.goldfish_k == 1 or spec.exposures <= 0:  # memorize.py refuses k = 1 at start
        raise ValueError(f"goldfish_k must be 0 (standard loss) or >= 2, got {spec.goldfish_k}; exposures > 0")
    if spec.arms not in ARMS or (spec.arms == "goldfish" and spec.goldfish_k == 0):
        raise ValueError(f"arms {spec.arms!r}: choose one of {', '.join(ARMS)} ('goldfish' needs goldfish_k >= 2)")
    nodes = max(1, gpus // cfg.gpus_per_node)
    tpn = gpus // nodes
    shape = spec.shape()

    def ranking(micro_batch: int | None):
        return plan(shape, seq=spec.seq, global_batch=spec.global_batch, gpus=gpus,
                    machine=load_profile(cfg.profile), micro_batch=micro_batch,
                    activation_checkpointing=spec.activation_checkpointing, grad_reduce_dtype=spec.grad_reduce_dtype)

    if spec.grid is not None:
        grid = tuple(spec.grid)
        if len(grid) != 4 or grid[0] * grid[1] * grid[2] * grid[3] != gpus:
            raise ValueError(f"grid {grid} does not multiply to {gpus} GPUs")
        mb = spec.micro_batch or 1
        why = divisibility_problem(shape, Grid(*grid))
        if why is None and spec.global_batch % (grid[0] * grid[3] * mb):
            why = (f"global batch {spec.global_batch} is not divisible by data×depth×micro-batch="
                   f"{grid[0]}×{grid[3]}×{mb}")
        if why:  # the trainer refuses it at start: say so now, not after the queue
            raise ValueError(f"grid {','.join(map(str, grid))}: {why}")
        check_hand_grid_memory(spec, Grid(*grid), mb, load_profile(cfg.profile))
        note = "grid given by hand"
        try:  # the planner's price of this grid, if it considers it at all
            predicted = next((e.step_time_s for e in ranking(mb).ranked if tuple(e.grid) == grid), None)
        except PlanError:
            predicted = None
    else:
        best = ranking(spec.micro_batch).best
        grid, mb, predicted = tuple(best.grid), best.micro_batch, best.step_time_s
        note = (f"planner: {predicted:.2f} s/step, {best.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                f"{best.memory_per_gpu_bytes / 1024**3:.1f} GiB/GPU")
    stop = stop_plan(spec, predicted, nodes, spec.fs_gbps or cfg.fs_gbps_per_node)
    if time_limit_s(spec.time) < stop.signal_lead_s + 600:
        raise ValueError(f"--time {spec.time} leaves under 10 minutes of training before the USR1 "
                         f"{stop.signal_lead_s} s ahead of the limit: ask for more time")
    note += (f"; checkpoint every {stop.checkpoint_every} steps, ~{stop.save_s:.0f} s per write, "
             f"USR1 {stop.signal_lead_s} s before the limit")
    run_dir = f"{spec.run_root}/{spec.name}"
    # Slurm opens --output before the script runs: an absolute directory that write() creates
    log_dir = Path(spec.run_root) / "logs"
    log_dir = log_dir if log_dir.is_absolute() else REPO / log_dir
    args = ["--size", spec.size, "--grid", ",".join(map(str, grid)), "--goldfish-k", str(spec.goldfish_k),
            "--exposures", str(spec.exposures), "--seq-len", str(spec.seq), "--batch-size", str(spec.global_batch),
            "--micro-batch", str(mb), "--out", run_dir, "--resume", "--export-dtype", "bfloat16",
            "--checkpoint-every", str(stop.checkpoint_every)]
    if spec.arms != "both":  # memorize.py's default: the standard arm, and the Goldfish one when k >= 2
        args += ["--arms", spec.arms]
    args.append("--activation-checkpointing" if spec.activation_checkpointing else "--no-activation-checkpointing")
    args += ["--grad-reduce-dtype", spec.grad_reduce_dtype]
    if spec.async_checkpoint:
        args.append("--async-checkpoint")
    if spec.init:
        args += ["--init", check_init(spec.init.replace("{size}", spec.size), spec.size)]
    odd = next((a for a in args if shlex.quote(a) != a), None)
    if odd is not None:  # shlex.quote would wrap it in single quotes, which cannot go inside bash -c '...'
        raise ValueError(f"{odd!r}: paths and values in a job script must not contain spaces, quotes or other "
                         "shell characters (they go inside bash -c '...'); use a path without them")
    train_args = " ".join(args)
    if spec.extra_args:
        train_args += " " + spec.extra_args
    if "'" in train_args or "'" in cfg.task_prelude:
        raise ValueError("extra_args must not contain single quotes (they go inside bash -c '...')")
    values = {
        "HEADER": f"generated by recipes/jobs/generate.py: {spec.size} on {gpus} {spec.machine} GPUs, "
                  f"goldfish k={spec.goldfish_k}, grid D,R,C,Z={','.join(map(str, grid))}",
        "JOB_NAME": spec.name, "ACCOUNT": spec.account, "NODES": str(nodes), "TASKS": str(gpus),
        "TASKS_PER_NODE": str(tpn), "TIME": spec.time, "SIGNAL_LEAD": str(stop.signal_lead_s),
        "CHECKPOINT_GRACE": str(stop.grace_s),
        "LOG_DIR": str(log_dir), "REPO": str(REPO), "RUN_DIR": run_dir,
        "GRID": ",".join(map(str, grid)), "PLAN_NOTE": note, "SRUN_FLAGS": cfg.srun_flags,
        "TRAIN_ARGS": train_args, "CONSTRAINT": cfg.constraint,
    }
    text = (TEMPLATES / cfg.template).read_text() + (TEMPLATES / "launch.part").read_text()
    text = text.replace("exec python recipes/memorize.py", f"{cfg.task_prelude}exec python recipes/memorize.py")
    for key, val in values.items():
        text = text.replace("{{" + key + "}}", val)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise RuntimeError(f"template placeholders left unfilled: {left}")
    path = Path(spec.out_dir) / f"{spec.name}.sbatch"
    return Job(spec, text, nodes, tpn, gpus, grid, mb, predicted, path, log_dir, stop)


def check_hand_grid_memory(spec: JobSpec, grid: Grid, micro_batch: int, prof: MachineProfile) -> None:
    """Refuse a hand grid whose predicted peak per GPU the trainer's start-up check refuses even on an empty
    device (it would fail after the queue wait); warn when it is over the planner's usable memory only."""
    from memorization.models import PREFLIGHT_FRACTION  # memorize.py's start-up check (check_size_runs_here)

    shape = spec.shape()
    steps = spec.global_batch // (grid.data * grid.depth * micro_batch)
    mem = memory_per_gpu(shape, grid, spec.seq, micro_batch, spec.activation_checkpointing,
                         MemoryConfig(grad_reduce_bytes=GRAD_REDUCE_BYTES[spec.grad_reduce_dtype]),
                         micro_steps=steps).total
    gib, text = 1024**3, ",".join(map(str, grid))
    if mem > PREFLIGHT_FRACTION * prof.memory_bytes:
        try:
            best = plan(shape, seq=spec.seq, global_batch=spec.global_batch, gpus=grid.size, machine=prof,
                        micro_batch=spec.micro_batch, activation_checkpointing=spec.activation_checkpointing,
                        grad_reduce_dtype=spec.grad_reduce_dtype).best
            hint = f"the planner's best grid here is {best.grid} with micro-batch {best.micro_batch} (leave out --grid)"
        except PlanError as e:
            hint = str(e)
        raise ValueError(f"grid {text} at micro-batch {micro_batch}: {spec.size} needs ~{mem / gib:.1f} GiB per GPU, "
                         f"more than memorize.py's start-up check allows on a {prof.memory_gib:g} GiB {prof.name} GPU "
                         f"({PREFLIGHT_FRACTION:g} of it): {hint}")
    if mem > prof.usable_memory_bytes:
        print(f"warning: grid {text} needs ~{mem / gib:.1f} GiB per GPU, over the planner's "
              f"{prof.usable_memory_bytes / gib:.1f} GiB usable on {prof.name}: it may run out of memory",
              file=sys.stderr)


def check_init(path: str, size: str) -> str:
    """``path`` if it is a checkpoint of ``size``'s shape; refused when it is another model.

    Checked only where this machine sees the path (scripts are often written on a login node
    that mounts the same filesystem); one it cannot see is left for the job to check.
    """
    from axonn.presets import get_preset
    from memorization.models import model_config

    if not Path(path).exists():
        print(f"note: --init {path} is not visible here; the job checks it when it starts", file=sys.stderr)
        return path
    got, want = ModelShape.from_llama_config(model_config(None, 0, init=path)), get_preset(size)
    diff = {f: (getattr(got, f), getattr(want, f)) for f in ("layers", "hidden", "heads", "kv_heads", "ffn")
            if getattr(got, f) != getattr(want, f)}
    if diff:
        raise ValueError(f"--init {path} is not a {size} model (checkpoint vs preset: {diff}): the planner's grid "
                         "and memory are for the preset; pass the matching --size")
    return path


def write_job(spec: JobSpec) -> Path:
    """Render and write ``spec``'s script; returns its path."""
    return make_job(spec).write()


def generate_job(machine: str, size: str, gpus: int | None = None, nodes: int | None = None,
                 goldfish_k: int = 4, **kwargs) -> Path:
    """Emit one job script for the given arguments (the sweep entry point); returns its path.

    ``kwargs`` are the other :class:`JobSpec` fields (exposures, time, account, out_dir, seq, ...).
    """
    return write_job(JobSpec(machine=machine, size=size, gpus=gpus, nodes=nodes, goldfish_k=goldfish_k, **kwargs))


def paper_matrix(base: JobSpec | None = None, machines=PAPER_MACHINES, sizes=PAPER_SIZES) -> list[JobSpec]:
    """The paper's memorization runs: one job per machine × size (8b/70b/405b), each training Goldfish off and
    on (``base``'s k, 4 by default) as the two arms of one run: each arm trained once, on the same mixture, seed
    and initial weights, with the paired comparison in the run's report."""
    base = base or JobSpec(machine="frontier", size="8b")
    return [replace(base, machine=m, size=s, gpus=None, nodes=None) for m in machines for s in sizes]
