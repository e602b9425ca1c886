"""Slurm batch scripts for the memorization experiments on Frontier, Alps and Perlmutter.

Each script trains one model size via ``recipes/memorize.py``: by default both arms, the standard loss and
Goldfish (``--goldfish-k 4``), on the same mixture, seed and initial weights, so its report holds the paired
comparison (McNemar); ``--goldfish-k 0`` trains the standard arm alone and ``--arms`` picks one arm. It runs on the
4D grid the planner (:mod:`axonn.planner`) ranks fastest for
that machine and GPU count (passed as ``--grid D,R,C,Z``, with the planner's micro-batch), with
the environment the machine needs, one ``srun`` task per GPU, ``MASTER_ADDR`` from the first
node of ``$SLURM_JOB_NODELIST``, and checkpoint/resume on requeue (``#SBATCH --requeue``,
``--signal=B:USR1@...``, a fixed ``--out`` directory and ``--resume``).  The templates are this package's
``job_templates/`` (package data); the job runs ``python -m memorization.experiment`` (memorize's command line);
``recipes/jobs/generate.py`` is the generator's command line.

With ``--init`` each rank reads only the rows of the checkpoint its shards need (no process holds
the full model; ``memorization.training.models.build_model``).

A job is a :class:`JobSpec`: its experiment (an :class:`ExperimentConfig`, as a config file gives it) and its
:class:`Launch` (machine, GPUs, grid, micro-batch, time, account, where it writes).  API: :func:`job_spec` (keywords
-> :class:`JobSpec`: the one place where they become fields), :func:`make_job` (a :class:`JobSpec` ->
:class:`Job`, nothing written), :func:`write_job`, :func:`generate_job` (keyword arguments -> written script path)
and :func:`paper_matrix`.
"""
from __future__ import annotations

import contextlib
import math
import re
import shlex
import sys
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path

from axonn.grid_shape import GridShape
from axonn.planner import (GRAD_REDUCE_BYTES, MachineProfile, MemoryConfig, PlanError, divisibility_problem,
                           load_profile, memory_per_gpu, plan, resolve_shape)
from axonn.presets import ModelShape
from memorization.experiment.cli import settings_flags
from memorization.experiment.config import (Data, ExperimentConfig, Model, Output, Training, dump_config, load_config,
                                            resolve)
from memorization.experiment.preflight import NOT_CHECKED, OK, SIZE_PLACEHOLDER, Check, preflight

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).resolve().parent / "job_templates"  # package data


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

PAPER_SIZES = ("8b", "70b", "405b")
PAPER_MACHINES = ("frontier", "alps", "perlmutter")


def job_defaults() -> ExperimentConfig:
    """The experiment a job runs unless its config or flags say otherwise: memorize.py's defaults with the
    job-scale ones -- the 8b, rows of 2,048 tokens, 128 rows a step, each target seen once (the paper's
    headline: a single pass), activation checkpointing, background checkpoints, bf16 exported models."""
    return ExperimentConfig(model=Model(size="8b"),
                            data=Data(seq_len=2048, exposures="1"),
                            training=Training(batch_size=128, activation_checkpointing=True, async_checkpoint=True),
                            output=Output(export_dtype="bfloat16"))


def load_job_config(path: str | Path) -> ExperimentConfig:
    """The experiment config file ``path`` over :func:`job_defaults` (fields it leaves out keep the job's
    defaults); a :class:`~memorization.experiment.config.ConfigError` names a bad key or value."""
    return load_config(path, base=job_defaults())


@lru_cache(maxsize=None)
def _tokenizer_rows(tokenizer: str) -> int | None:
    """Embedding rows memorize.py gives the model of ``tokenizer``, or None (with a note) when the tokenizer
    cannot be loaded here: a path only the compute nodes see."""
    from memorization.data.corpus import load_tokenizer
    from memorization.training.models import padded_vocab

    try:
        return padded_vocab(len(load_tokenizer(tokenizer)))
    except (OSError, ValueError) as e:
        print(f"note: --tokenizer {tokenizer} cannot be loaded here ({e}); planning with the preset's vocabulary",
              file=sys.stderr)
        return None


@dataclass(frozen=True)
class Launch:
    """How and where a job runs -- everything of a job that is not its experiment: the machine and its GPUs
    (``gpus`` or ``nodes``; ``None`` for both: the paper's count for the size), a hand ``grid`` and ``micro_batch``
    instead of the planner's (``micro_batch`` None: the experiment's, else the planner's), the allocation's
    ``time`` and ``account``, where the script goes (``out_dir``) and where the run writes (``run_root``), and
    how it checkpoints and stops before the limit (``signal_lead_s``, ``checkpoint_minutes`` or ``checkpoint_every``,
    ``fs_gbps``)."""

    machine: str = "frontier"
    gpus: int | None = None
    nodes: int | None = None
    grid: GridShape | None = None  # override the planner's choice (any four sizes D, R, C, Z)
    micro_batch: int | None = None
    time: str = "02:00:00"
    account: str = "ACCOUNT"     # placeholder: replace or pass --account
    out_dir: str = "jobs"        # where the script and its config are written
    run_root: str = "runs/jobs"  # checkpoints/logs of the runs: <run_root>/<job name>
    signal_lead_s: int | None = None  # USR1 this many s before the limit; None: from step and save time
    checkpoint_minutes: float = 30.0  # checkpoint interval in wall time (converted with the predicted step)
    checkpoint_every: int | None = None  # or in steps (None: from checkpoint_minutes)
    fs_gbps: float | None = None      # checkpoint write GB/s per node (None: the machine's assumption)


#: a job's keywords that are experiment fields (:func:`job_spec`): keyword -> (section, field)
EXPERIMENT_KEYWORDS: dict[str, tuple[str, str]] = {
    "size": ("model", "size"), "family": ("model", "family"), "init": ("model", "init"),
    "goldfish_k": ("goldfish", "k"), "arms": ("goldfish", "arms"), "exposures": ("data", "exposures"),
    "seq": ("data", "seq_len"), "global_batch": ("training", "batch_size"),
    "activation_checkpointing": ("training", "activation_checkpointing"),
    "async_checkpoint": ("training", "async_checkpoint"), "grad_reduce_dtype": ("execution", "grad_reduce_dtype"),
}


@dataclass(frozen=True)
class JobSpec:
    """One training job: its ``experiment`` (an :class:`ExperimentConfig` as a config file gives it, not yet
    resolved; :func:`job_defaults` under it) and its :class:`Launch`.  The job runs the composed, resolved config
    (:meth:`run_config`), written next to its script.  :func:`job_spec` builds one from keywords."""

    experiment: ExperimentConfig = field(default_factory=job_defaults)
    launch: Launch = field(default_factory=Launch)

    @property
    def size(self) -> str:
        return self.experiment.model.size

    @property
    def machine(self) -> str:
        return self.launch.machine

    @property
    def micro_batch(self) -> int | None:
        """The hand micro-batch: the launch's, else the experiment's (None: the planner's)."""
        return self.launch.micro_batch or self.experiment.training.micro_batch

    @property
    def model_label(self) -> str:
        """What the job trains, in its name and messages: the size (``family-size`` with a family), or with an
        ``--init`` checkpoint of no preset's shape, the checkpoint's directory name."""
        e = self.experiment
        if self.checkpoint_shape() is not None:
            return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(self.run_config().model.init).name) or "checkpoint"
        return f"{e.model.family}-{e.model.size}" if e.model.family else e.model.size

    @property
    def name(self) -> str:
        return f"mem-{self.model_label}-{self.machine}-gf{self.experiment.goldfish.k}-{self.total_gpus()}g"

    def run_config(self, grid: GridShape | None = None, micro_batch: int | None = None,
                   checkpoint_every: int | None = None, out: str | None = None) -> ExperimentConfig:
        """The resolved experiment this job runs: ``experiment`` with ``{size}`` in ``--init`` as the size, the
        launch's micro-batch, and the job's execution settings when given (grid, micro-batch, checkpoint
        interval, ``out`` with ``resume``)."""
        cfg = self.experiment
        cfg = replace(cfg, training=replace(cfg.training, micro_batch=self.micro_batch,
                                            checkpoint_every=cfg.training.checkpoint_every if checkpoint_every is None
                                            else checkpoint_every))
        if cfg.model.init:
            cfg = replace(cfg, model=replace(cfg.model, init=cfg.model.init.replace(SIZE_PLACEHOLDER, self.size)))
        if grid is not None:
            cfg = replace(cfg, execution=replace(cfg.execution, grid=str(GridShape(*grid))),
                          training=replace(cfg.training, micro_batch=micro_batch))
        if out is not None:
            cfg = replace(cfg, output=replace(cfg.output, out=out, resume=True, overwrite=False))
        return resolve(cfg)

    def shape(self) -> ModelShape:
        """The model the job trains, which the planner prices: with ``--init`` the checkpoint's shape and
        vocabulary where this machine sees it (Llama 3.1's 128,256 rows), else the preset's; without it the
        preset's layers as the run's ``--family`` with the vocabulary of the run's tokenizer (memorize.py's
        built-in one: 4,096 rows), padded as memorize.py pads it, so step time, memory and checkpoint interval
        describe that model (an 8b of 7.0 B parameters).  A visible checkpoint of no preset's shape is planned as
        itself (:meth:`checkpoint_shape`)."""
        from axonn.presets import get_preset
        from memorization.training.models import model_config

        cfg = self.run_config()
        own = self.checkpoint_shape()
        if own is not None:
            return own
        resolve_shape(self.size)  # an unknown size is a PlanError naming the presets
        preset = get_preset(self.size, cfg.model.family)
        if cfg.model.init is not None:
            if not Path(cfg.model.init).exists():
                print(f"note: --init {cfg.model.init} is not visible here; the job checks it when it starts "
                      f"(planned as the {self.size} preset)", file=sys.stderr)
                return preset
            got = ModelShape.from_hf_config(model_config(None, 0, init=cfg.model.init), name=preset.name)
            return replace(preset, vocab=got.vocab) if got.vocab != preset.vocab else preset
        vocab = _tokenizer_rows(cfg.data.tokenizer)
        if vocab is None or vocab == preset.vocab:
            return preset
        return replace(preset, name=f"{preset.name} (vocabulary {vocab})", vocab=vocab)

    def checkpoint_shape(self) -> ModelShape | None:
        """The ``--init`` checkpoint's own shape when the job plans it instead of a preset: the checkpoint is
        visible here and its layers, hidden, heads, KV heads or FFN width differ from the ``size`` preset's (a
        SmolLM2, a Qwen2.5 0.5B: memorize.py trains the checkpoint, whatever ``--size`` says).  None without
        ``--init``, when it is not visible, or when it has the preset's shape (then the preset, with the
        checkpoint's vocabulary, is planned).  With ``{size}`` in ``--init`` the checkpoint stands for that size
        and must have its shape (:func:`check_init`)."""
        init = self.experiment.model.init
        if init is None:
            return None
        return _checkpoint_shape(self.run_config().model.init, self.size, self.experiment.model.family,
                                 SIZE_PLACEHOLDER in init)

    def total_gpus(self) -> int:
        cfg = machine_config(self.machine)
        gpus, nodes = self.launch.gpus, self.launch.nodes
        if gpus is not None and nodes is not None and gpus != nodes * cfg.gpus_per_node:
            raise ValueError(f"--gpus {gpus} and --nodes {nodes} disagree "
                             f"({cfg.gpus_per_node} GPUs per {self.machine} node)")
        if gpus is not None:
            return gpus
        if nodes is not None:
            return nodes * cfg.gpus_per_node
        if self.checkpoint_shape() is not None:
            return fewest_gpus(self)
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
    grid: GridShape
    micro_batch: int
    predicted_step_s: float | None
    path: Path
    log_dir: Path
    stop: StopPlan
    config: ExperimentConfig     # the resolved experiment the script runs (written to config_path)
    config_path: Path
    shape: ModelShape            # the model planned
    memory_bytes: float | None   # predicted peak per GPU (None: not priced)

    def write(self) -> Path:
        """Write the script and its config next to it (and create the Slurm log directory it names); no
        checks (:func:`write_job` checks first)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        from memorization.data.atomic import atomic_write_text

        atomic_write_text(self.config_path, f"# the experiment of {self.path.name} (memorization.launch.jobs), "
                          "resolved\n" + dump_config(self.config))
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


def stop_plan(spec: JobSpec, step_s: float | None, nodes: int, fs_gbps: float,
              shape: ModelShape | None = None) -> StopPlan:
    """The :class:`StopPlan` of ``spec`` (its model ``shape``, default ``spec.shape()``) at ``step_s``."""
    save_s = STATE_BYTES_PER_PARAM * (shape or spec.shape()).num_params() / nodes / (fs_gbps * 1e9)
    step = step_s if step_s is not None else 60.0  # a hand grid the planner cannot price: assume a slow step
    launch = spec.launch
    stop_s = 3 * step + (2 if spec.experiment.training.async_checkpoint else 1) * save_s + 30
    lead = launch.signal_lead_s if launch.signal_lead_s is not None else max(120, 60 * math.ceil(stop_s / 60))
    if lead < stop_s:
        raise ValueError(f"--signal-lead {lead} s is too short: stopping cleanly takes ~{stop_s:.0f} s "
                         f"(3 steps of {step:.1f} s and {save_s:.0f} s per checkpoint write at {fs_gbps:g} GB/s per "
                         f"node): use at least {math.ceil(stop_s)} or leave it out")
    every = (launch.checkpoint_every if launch.checkpoint_every is not None
             else max(1, round(launch.checkpoint_minutes * 60 / step_s)) if step_s is not None
             else DEFAULT_CHECKPOINT_EVERY)
    return StopPlan(every, save_s, stop_s, int(lead), max(10, int(lead) - 30))


def make_job(spec: JobSpec) -> Job:
    """Render the batch script of ``spec`` (planner picks grid and micro-batch unless given)."""
    cfg = machine_config(spec.machine)
    launch = spec.launch
    gpus = spec.total_gpus()
    if gpus % cfg.gpus_per_node and gpus > cfg.gpus_per_node:
        raise ValueError(f"{gpus} GPUs is not a whole number of {spec.machine} nodes ({cfg.gpus_per_node} each)")
    if not _TIME.match(launch.time):
        raise ValueError(f"--time {launch.time!r}: use [D-]HH:MM:SS or minutes")
    if (launch.checkpoint_minutes <= 0 or (launch.fs_gbps is not None and launch.fs_gbps <= 0)
            or (launch.checkpoint_every is not None and launch.checkpoint_every < 1)):
        raise ValueError("checkpoint_minutes, checkpoint_every and fs_gbps must be positive")
    exp = spec.run_config()
    k = exp.goldfish.k
    if k < 0 or k == 1:  # memorize.py refuses k = 1 at start
        raise ValueError(f"goldfish_k must be 0 (standard loss) or >= 2, got {k}")
    try:
        exposures = [int(x) for x in str(exp.data.exposures).split(",")]
    except ValueError:
        exposures = [-1]
    if min(exposures) < 0 or max(exposures) == 0:
        raise ValueError(f"exposures {exp.data.exposures!r}: give a count >= 1 (or a comma list of counts >= 0, one "
                         ">= 1)")
    from memorization.experiment.config import ConfigError, parse_arms

    try:
        parse_arms(exp.goldfish.arms, k)
    except ConfigError as e:
        raise ValueError(str(e.code).removeprefix("error: ")) from None
    nodes = max(1, gpus // cfg.gpus_per_node)
    tpn = gpus // nodes
    shape = spec.shape()

    seq, batch = exp.data.seq_len, exp.training.batch_size

    def ranking(micro_batch: int | None):
        return plan(shape, seq=seq, global_batch=batch, gpus=gpus, machine=load_profile(cfg.profile),
                    micro_batch=micro_batch, activation_checkpointing=exp.training.activation_checkpointing,
                    grad_reduce_dtype=exp.execution.grad_reduce_dtype)

    if launch.grid is not None:
        if len(launch.grid) != 4 or math.prod(launch.grid) != gpus:
            raise ValueError(f"grid {tuple(launch.grid)} does not multiply to {gpus} GPUs")
        grid = GridShape(*launch.grid)
        mb = spec.micro_batch or 1
        why = divisibility_problem(shape, grid)
        if why is None and batch % (grid.data * grid.depth * mb):
            why = (f"global batch {batch} is not divisible by data×depth×micro-batch="
                   f"{grid.data}×{grid.depth}×{mb}")
        if why:  # the trainer refuses it at start: say so now, not after the queue
            raise ValueError(f"grid {grid}: {why}")
        memory = check_hand_grid_memory(spec, grid, mb, load_profile(cfg.profile), shape)
        note = "grid given by hand"
        try:  # the planner's price of this grid, if it considers it at all
            predicted = next((e.step_time_s for e in ranking(mb).ranked if e.grid == grid), None)
        except PlanError:
            predicted = None
    else:
        best = ranking(spec.micro_batch).best
        grid, mb, predicted = best.grid, best.micro_batch, best.step_time_s
        memory = best.memory_per_gpu_bytes
        note = (f"planner: {predicted:.2f} s/step, {best.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                f"{best.memory_per_gpu_bytes / 1024**3:.1f} GiB/GPU")
    stop = stop_plan(spec, predicted, nodes, launch.fs_gbps or cfg.fs_gbps_per_node, shape)
    if time_limit_s(launch.time) < stop.signal_lead_s + 600:
        raise ValueError(f"--time {launch.time} leaves under 10 minutes of training before the USR1 "
                         f"{stop.signal_lead_s} s ahead of the limit: ask for more time")
    note += (f"; checkpoint every {stop.checkpoint_every} steps, ~{stop.save_s:.0f} s per write, "
             f"USR1 {stop.signal_lead_s} s before the limit")
    run_dir = f"{launch.run_root}/{spec.name}"
    # Slurm opens --output before the script runs: an absolute directory that write() creates
    log_dir = Path(launch.run_root) / "logs"
    log_dir = log_dir if log_dir.is_absolute() else REPO / log_dir
    run = spec.run_config(grid, mb, stop.checkpoint_every, run_dir)
    config_path = (Path(launch.out_dir) / f"{spec.name}.yaml").resolve()
    # the job decides only how it executes; the experiment is the config file
    args = ["--config", str(config_path), "--grid", str(grid), "--micro-batch", str(mb),
            "--out", run_dir, "--resume"]
    odd = next((a for a in args if shlex.quote(a) != a), None)
    if odd is not None:  # shlex.quote would wrap it in single quotes, which cannot go inside bash -c '...'
        raise ValueError(f"{odd!r}: paths and values in a job script must not contain spaces, quotes or other "
                         "shell characters (they go inside bash -c '...'); use a path without them")
    train_args = " ".join(args)
    if "'" in cfg.task_prelude:
        raise ValueError("the machine's task prelude must not contain single quotes (it goes inside bash -c '...')")
    values = {
        "HEADER": f"generated by memorization.launch.jobs: {spec.model_label} on {gpus} {spec.machine} GPUs, "
                  f"goldfish k={k}, grid D,R,C,Z={grid}",
        "JOB_NAME": spec.name, "ACCOUNT": launch.account, "NODES": str(nodes), "TASKS": str(gpus),
        "TASKS_PER_NODE": str(tpn), "TIME": launch.time, "SIGNAL_LEAD": str(stop.signal_lead_s),
        "CHECKPOINT_GRACE": str(stop.grace_s),
        "LOG_DIR": str(log_dir), "REPO": str(REPO), "RUN_DIR": run_dir,
        "GRID": str(grid), "PLAN_NOTE": note, "SRUN_FLAGS": cfg.srun_flags,
        "TRAIN_ARGS": train_args, "CONSTRAINT": cfg.constraint, "CONFIG": str(config_path),
        "SETTINGS": " ".join(shlex.quote(a) for a in settings_flags(
            run, HEADER_SETTINGS, skip=EXECUTION_FLAGS + (("size",) if spec.checkpoint_shape() else ()))),
        "TASK_PRELUDE": cfg.task_prelude,
    }
    text = (TEMPLATES / cfg.template).read_text() + (TEMPLATES / "launch.part").read_text()
    for key, val in values.items():
        text = text.replace("{{" + key + "}}", val)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise RuntimeError(f"template placeholders left unfilled: {left}")
    path = Path(launch.out_dir) / f"{spec.name}.sbatch"
    return Job(spec, text, nodes, tpn, gpus, grid, mb, predicted, path, log_dir, stop, run, config_path, shape,
               memory)


#: settings a script's header always names as memorize flags (with every other one that is not memorize.py's
#: default), and those it leaves out: how the job executes, which its command line passes
EXECUTION_FLAGS = ("grid", "micro_batch", "out", "resume", "overwrite", "plan", "gpus", "machine")
HEADER_SETTINGS = ("size", "family", "init", "goldfish_k", "exposures", "seq_len", "batch_size", "steps", "lr",
                   "checkpoint_every", "warmup_steps", "weight_decay", "corpus", "tokenizer", "grad_reduce_dtype")


def check_hand_grid_memory(spec: JobSpec, grid: GridShape, micro_batch: int, prof: MachineProfile,
                           shape: ModelShape | None = None) -> float:
    """The predicted peak per GPU of a hand grid (bytes); refused when the trainer's start-up check refuses
    it even on an empty device (it would fail after the queue wait); a warning when it is over the planner's
    usable memory only."""
    from memorization.training.models import PREFLIGHT_FRACTION  # memorize.py's start-up check (check_size_runs_here)

    shape = shape or spec.shape()
    exp = spec.run_config()
    seq, batch, ckpt = exp.data.seq_len, exp.training.batch_size, exp.training.activation_checkpointing
    reduce = exp.execution.grad_reduce_dtype
    steps = batch // (grid.data * grid.depth * micro_batch)
    mem = memory_per_gpu(shape, grid, seq, micro_batch, ckpt, MemoryConfig(grad_reduce_bytes=GRAD_REDUCE_BYTES[reduce]),
                         micro_steps=steps).total
    gib, text = 1024**3, str(grid)
    if mem > PREFLIGHT_FRACTION * prof.memory_bytes:
        try:
            best = plan(shape, seq=seq, global_batch=batch, gpus=grid.size, machine=prof,
                        micro_batch=spec.micro_batch, activation_checkpointing=ckpt, grad_reduce_dtype=reduce).best
            hint = f"the planner's best grid here is {best.grid} with micro-batch {best.micro_batch} (leave out --grid)"
        except PlanError as e:
            hint = str(e)
        raise ValueError(f"grid {text} at micro-batch {micro_batch}: {spec.model_label} needs ~{mem / gib:.1f} GiB per GPU, "
                         f"more than memorize.py's start-up check allows on a {prof.memory_gib:g} GiB {prof.name} GPU "
                         f"({PREFLIGHT_FRACTION:g} of it): {hint}")
    if mem > prof.usable_memory_bytes:
        print(f"warning: grid {text} needs ~{mem / gib:.1f} GiB per GPU, over the planner's "
              f"{prof.usable_memory_bytes / gib:.1f} GiB usable on {prof.name}: it may run out of memory",
              file=sys.stderr)
    return mem


#: the fields that make two models the same shape for the planner (the vocabulary is priced as the checkpoint's)
SHAPE_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn")


def check_init(path: str, size: str, family: str | None = None) -> str:
    """``path`` if it is a checkpoint of ``size``'s shape (as ``family`` when given: its model_type must be that
    family); refused when it is another model or a model without a parallel plan.  Used where ``--init`` names
    a checkpoint per size (``{size}`` in it: the paper matrix, a sweep over sizes).

    Checked only where this machine sees the path (scripts are often written on a login node
    that mounts the same filesystem); one it cannot see is left for the job to check.
    """
    from axonn.presets import get_preset
    from memorization.training.models import model_config

    if not Path(path).exists():
        print(f"note: --init {path} is not visible here; the job checks it when it starts", file=sys.stderr)
        return path
    config = model_config(None, 0, init=path, family=family)
    got, want = ModelShape.from_hf_config(config), get_preset(size, family or config.model_type)
    diff = {f: (getattr(got, f), getattr(want, f)) for f in SHAPE_FIELDS if getattr(got, f) != getattr(want, f)}
    if diff:
        raise ValueError(f"--init {path} is not a {size} model (checkpoint vs preset: {diff}): the job's --init "
                         f"names one checkpoint per size ({SIZE_PLACEHOLDER}); point it at the {size} checkpoint, "
                         "or give the checkpoint's own path to plan the job on its shape")
    return path


def _checkpoint_shape(init: str, size: str, family: str | None, per_size: bool) -> ModelShape | None:
    """:meth:`JobSpec.checkpoint_shape` for the resolved ``init`` (``per_size``: it had ``{size}`` in it).  A job
    asks for it several times (GPU count, plan, header): the answer is kept per checkpoint and its ``config.json``'s
    modification time, so the file is read once and an edited one is read again."""
    if not Path(init).exists():
        return None
    config_file = Path(init) / "config.json"
    stamp = config_file.stat().st_mtime_ns if config_file.is_file() else None
    return _checkpoint_shape_read(init, size, family, per_size, stamp)


@lru_cache(maxsize=64)
def _checkpoint_shape_read(init: str, size: str, family: str | None, per_size: bool,
                           stamp: int | None) -> ModelShape | None:
    from axonn.presets import get_preset
    from memorization.training.models import model_config

    if per_size:
        check_init(init, size, family)
        return None
    config = model_config(None, 0, init=init, family=family)
    got = ModelShape.from_hf_config(config, name=Path(init).name)
    want = get_preset(size, family or config.model_type)
    return None if all(getattr(got, f) == getattr(want, f) for f in SHAPE_FIELDS) else got


def fewest_gpus(spec: JobSpec) -> int:
    """The fewest GPUs of ``spec``'s machine on which the planner fits its model (1, 2, 4, ... up to a node, then
    whole nodes, doubling): the default GPU count of a checkpoint that is no preset (the presets have the
    machine's paper-matrix counts).  A model that fits on none up to 4,096 nodes is refused."""
    cfg = machine_config(spec.machine)
    exp = spec.run_config()
    shape, prof = spec.shape(), load_profile(cfg.profile)
    counts = [1 << i for i in range(cfg.gpus_per_node.bit_length()) if 1 << i < cfg.gpus_per_node]
    counts += [cfg.gpus_per_node * (1 << i) for i in range(13)]
    last = None
    for gpus in counts:
        try:
            plan(shape, seq=exp.data.seq_len, global_batch=exp.training.batch_size, gpus=gpus, machine=prof,
                 micro_batch=spec.micro_batch, activation_checkpointing=exp.training.activation_checkpointing,
                 grad_reduce_dtype=exp.execution.grad_reduce_dtype)
            return gpus
        except PlanError as e:
            last = e
    raise ValueError(f"{spec.model_label} fits no grid of up to {counts[-1]} {spec.machine} GPUs ({last}): "
                     "turn on --activation-checkpointing, or shorten --seq or --batch-size")


class JobRefused(ValueError):
    """A job whose experiment would fail when it starts: ``checks`` say what failed and how to fix it."""

    def __init__(self, job: Job, checks: list[Check]):
        self.job, self.checks = job, checks
        failed = "\n".join("  " + c.line() for c in checks if c.failed)
        super().__init__(f"{job.spec.name} would fail when it starts:\n{failed}")


def check_job(job: Job) -> list[Check]:
    """The pre-flight checks of ``job`` (:func:`~memorization.experiment.preflight.preflight` of its exact
    config, paths read as the job reads them: relative to the checkout), plus the model it plans and the
    memory its grid needs on the machine's GPUs.  Nothing written."""
    prof = load_profile(machine_config(job.spec.machine).profile)
    with contextlib.chdir(REPO):  # the job runs there (cd "$AXONN_REPO")
        checks = preflight(job.config, shape=job.shape)
    init = job.config.model.init
    size = (f"{job.spec.model_label}: {job.shape.num_params() / 1e9:.2f} B parameters, {job.shape.vocab:,}-row vocabulary"
            + (f" (the --init checkpoint's shape)" if init and Path(init).exists() else
               " (the preset's: --init not visible here)" if init else " (the run's tokenizer's)"))
    checks.append(Check("model", OK, size))
    if job.memory_bytes is None:
        checks.append(Check("memory", NOT_CHECKED, "no price for this grid"))
    else:
        checks.append(Check("memory", OK, f"~{job.memory_bytes / 1024**3:.1f} GiB per GPU at grid "
                            f"{job.grid}, micro-batch {job.micro_batch}, of "
                            f"{prof.memory_gib:g} GiB on {prof.name}"))
    return checks


def write_job(spec: JobSpec, check: bool = True) -> Path:
    """Render ``spec``'s script, run its pre-flight checks (``check``; :func:`check_job`) and write script and
    config; returns the script's path.  A failed check raises :class:`JobRefused` and writes nothing; a check
    that cannot be made here is a note on stderr."""
    job = make_job(spec)
    if check:
        checks = check_job(job)
        if any(c.failed for c in checks):
            raise JobRefused(job, checks)
        for c in checks:
            if c.status == NOT_CHECKED:
                print(f"note: {job.spec.name}: {c.name} not checked: {c.detail}", file=sys.stderr)
    return job.write()


def generate_job(machine: str, size: str, gpus: int | None = None, nodes: int | None = None,
                 goldfish_k: int = 4, check: bool = True, **kwargs) -> Path:
    """Emit one job script for the given arguments; returns its path.

    ``kwargs`` are :func:`job_spec`'s other keywords (exposures, time, account, out_dir, seq, ...); ``check`` as in
    :func:`write_job`.
    """
    return write_job(job_spec(machine, size=size, gpus=gpus, nodes=nodes, goldfish_k=goldfish_k, **kwargs),
                     check=check)


def job_spec(machine: str = "frontier", experiment: ExperimentConfig | None = None, **settings) -> JobSpec:
    """The :class:`JobSpec` that runs ``experiment`` (default :func:`job_defaults`; e.g. :func:`load_job_config`'s)
    on ``machine``, with ``settings`` over it: those of :data:`EXPERIMENT_KEYWORDS` (size, family, init,
    goldfish_k, arms, exposures, seq, global_batch, activation_checkpointing, async_checkpoint, grad_reduce_dtype)
    replace the experiment's fields, the others are :class:`Launch`'s fields (gpus, nodes, grid, micro_batch,
    time, account, out_dir, run_root, ...); ``None`` is not given.  The one place where a job's keywords become
    its config."""
    e = experiment or job_defaults()
    given = {k: v for k, v in settings.items() if v is not None}
    sections: dict[str, dict] = {}
    for key in [k for k in given if k in EXPERIMENT_KEYWORDS]:
        section, name = EXPERIMENT_KEYWORDS[key]
        value = given.pop(key)
        sections.setdefault(section, {})[name] = str(value) if name == "exposures" else value
    e = replace(e, **{sec: replace(getattr(e, sec), **values) for sec, values in sections.items()})
    known = {f.name for f in fields(Launch)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"job_spec: unknown settings {unknown}: the experiment's are {sorted(EXPERIMENT_KEYWORDS)}, "
                        f"the launch's {sorted(known)}")
    return JobSpec(e, Launch(machine=machine, **given))


def paper_matrix(base: JobSpec | None = None, machines=PAPER_MACHINES, sizes=PAPER_SIZES) -> list[JobSpec]:
    """The paper's memorization runs: one job per machine × size (8b/70b/405b), each training Goldfish off and
    on (``base``'s k, 4 by default) as the two arms of one run: each arm trained once, on the same mixture, seed
    and initial weights, with the paired comparison in the run's report."""
    base = base or job_spec("frontier", size="8b")
    e = base.experiment
    return [JobSpec(replace(e, model=replace(e.model, size=s)), replace(base.launch, machine=m, gpus=None, nodes=None))
            for m in machines for s in sizes]
