"""Slurm scripts that evaluate a training job's models once it has ended: extraction, membership inference and
downstream quality (held-out perplexity, and lm-eval tasks when asked), each on the grid the inference planner
picks.  The evaluations are :mod:`memorization.evaluation.registry`' (``extract``, ``mia``, ``downstream``: the
registry's names and configs).

For a training :class:`~memorization.launch.jobs.Job` this writes ``<name>.eval.sbatch`` -- the machine's template (its
modules and environment, without the training job's requeue and USR1) followed by ``eval.part``: one ``srun`` step
per (evaluation, arm), each running ``python -m memorization.evaluation NAME --config <step>.yaml`` on
``<run>/<arm>/checkpoint`` with the run's own manifest and extraction settings; the step configs are written in
``<name>.eval/`` next to it -- and ``<name>.submit.sh``, which submits the training job and then the evaluation with
``--dependency=afterok:<training job>`` (a requeued training job keeps its id; the evaluation waits until it has
ended with status 0).

Sizing: a model-parallel group is the smallest that holds one replica for the most demanding
evaluation (:func:`axonn.planner.smallest_inference_gpus`: weights, KV cache, activations, logits at
the evaluation's batch and context), rounded up to whole nodes (at least one); each evaluation then
runs on :func:`axonn.planner.plan_inference`'s best grid of those GPUs, which spends the rest on data
replicas (documents split over them).

API: :func:`make_eval_job` (nothing written) and :meth:`EvalJob.write`.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from typing import Any

from axonn.grid_shape import GridShape
from axonn.planner import load_profile
from memorization.evaluation.registry import DownstreamConfig, MiaConfig, dump_config
from memorization.evaluation.extraction_eval import ExtractionEvalConfig
from memorization.launch.jobs import REPO, TEMPLATES, Job, machine_config, time_limit_s

#: the evaluations of :mod:`memorization.evaluation.registry` an evaluation job runs (hpc-code needs compilers:
#: not here)
EVALUATIONS = ("extract", "mia", "downstream")
DEFAULT_EVALUATIONS = EVALUATIONS  # downstream: held-out perplexity; lm-eval tasks only when given
SHIPPED_TASKS = "goldfish_mc"  # shipped with the project (data/lm_eval_tasks): runs offline
MIA_BATCH = MiaConfig.batch_size  # the scoring evaluations' default batch (MIA and downstream)


@dataclass(frozen=True)
class EvalStep:
    """One evaluation of one arm: the registry's ``what`` with its ``config``, on ``grid``, run as
    ``python -m memorization.evaluation`` with ``argv`` (the config written to ``config_path``)."""

    what: str
    arm: str
    grid: GridShape
    config: Any
    config_path: Path

    @property
    def argv(self) -> tuple[str, ...]:
        return (self.what, "--config", str(self.config_path))


@dataclass(frozen=True)
class EvalJob:
    """A rendered evaluation script, the submit script that chains it after its training job, and their facts."""

    train: Job
    text: str
    path: Path
    submit_text: str
    submit_path: Path
    nodes: int
    tasks: int
    steps: tuple[EvalStep, ...]
    memory_bytes: float  # the largest predicted peak per GPU over the steps

    def write(self) -> Path:
        """Write the evaluation script, its step configs and the submit script (executable); returns the evaluation
        script's path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for s in self.steps:
            s.config_path.parent.mkdir(parents=True, exist_ok=True)
            s.config_path.write_text(dump_config(s.what, s.config))
        for path, text in ((self.path, self.text), (self.submit_path, self.submit_text)):
            path.write_text(text)
            path.chmod(0o755)
        return self.path


def _arms(train: Job) -> list[str]:
    from memorization.experiment.run import arms_to_train

    return list(arms_to_train(train.config))


def _demands(train: Job, evaluations: tuple[str, ...]) -> dict[str, tuple[int, int, bool]]:
    """(batch, context, generates) of each evaluation as the step runs it."""
    cfg = train.config
    ex = cfg.extraction
    seq = cfg.data.seq_len
    context = ex.prefix + ex.suffix if ex.prefix_mode == "fixed" else seq
    demands = {"extract": (ex.batch, context, True), "mia": (MIA_BATCH, seq, False),
               "downstream": (MIA_BATCH, seq, False)}
    return {e: demands[e] for e in evaluations}


def step_config(what: str, arm: str, train: Job, grid: GridShape, tasks: tuple[str, ...] | None = None) -> Any:
    """The config of evaluation ``what`` of ``arm``'s training checkpoint on ``grid``: the run's manifest, its
    extraction settings and row length; reports under ``<run>/eval/<arm>/<what>``."""
    cfg = train.config
    ex = cfg.extraction
    run = cfg.output.out
    model, manifest, out = f"{run}/{arm}/checkpoint", f"{run}/manifest.json", f"{run}/eval/{arm}"
    g = str(grid)
    if what == "extract":
        return ExtractionEvalConfig(model=model, manifest=manifest, grid=g, prefix=ex.prefix, suffix=ex.suffix,
                                    prefix_mode=ex.prefix_mode, batch_size=ex.batch, include_nonmembers=True,
                                    out=f"{out}/extraction", progress=False)
    if what == "mia":
        return MiaConfig(model, manifest, grid=g, batch_size=MIA_BATCH, max_length=cfg.data.seq_len,
                         out_dir=f"{out}/mia")
    return DownstreamConfig(model, perplexity_source=manifest, tasks=tasks, grid=g, batch_size=MIA_BATCH,
                            max_length=cfg.data.seq_len, out_dir=f"{out}/downstream")


def _quote(arg: str) -> str:
    """``arg`` for the script as it is, or refused when the shell would read it otherwise."""
    if shlex.quote(arg) != arg:
        raise ValueError(f"{arg!r}: paths and values in a job script must not contain spaces, quotes or other "
                         "shell characters; use a path without them")
    return arg


def make_eval_job(train: Job, evaluations: tuple[str, ...] = DEFAULT_EVALUATIONS, time: str = "01:00:00",
                  gpus: int | None = None, tasks: str | None = None) -> EvalJob:
    """The evaluation job of ``train`` (see the module docstring); ``gpus`` overrides the planner's count
    (whole nodes); ``tasks`` are lm-eval tasks (a comma list) the ``downstream`` evaluation runs besides the
    held-out perplexity (None: none)."""
    from axonn.planner import PlanError, plan_inference, smallest_inference_gpus

    unknown = [e for e in evaluations if e not in EVALUATIONS]
    if unknown or not evaluations:
        raise ValueError(f"evaluations {list(evaluations)}: choose from {', '.join(EVALUATIONS)}")
    if tasks and "downstream" not in evaluations:
        raise ValueError(f"lm-eval tasks {tasks} run in the downstream evaluation: add it to the evaluations")
    if time_limit_s(time) < 60:
        raise ValueError(f"--eval-time {time}: give at least a minute")
    mcfg = machine_config(train.spec.machine)
    prof = load_profile(mcfg.profile)
    demands = _demands(train, evaluations)
    gpn = mcfg.gpus_per_node
    if gpus is None:
        need = max(smallest_inference_gpus(train.shape, prof, batch, ctx, generate=gen)
                   for batch, ctx, gen in demands.values())
        gpus = gpn * math.ceil(need / gpn)
        if train.tasks < gpn:  # a job smaller than a node (a rehearsal) evaluates on as many tasks as it trained on
            gpus = max(need, train.tasks)
    elif gpus < 1 or (gpus > gpn and gpus % gpn):
        raise ValueError(f"--eval-gpus {gpus}: give a whole number of {train.spec.machine} nodes ({gpn} GPUs each)")
    nodes = max(1, gpus // gpn)
    task_list = tuple(t.strip() for t in tasks.split(",") if t.strip()) if tasks else None
    name = train.spec.name
    path = train.path.with_name(f"{name}.eval.sbatch")
    step_dir = path.with_name(f"{name}.eval").resolve()
    steps, peak = [], 0.0
    for what, (batch, ctx, gen) in demands.items():
        try:
            best = plan_inference(train.shape, gpus, prof, batch, ctx, generate=gen)
        except PlanError as e:
            raise ValueError(f"{what} of {train.spec.name} on {gpus} GPUs: {e}") from None
        peak = max(peak, best.memory.total)
        grid = best.grid
        steps += [EvalStep(what, arm, grid, step_config(what, arm, train, grid, task_list),
                           step_dir / f"{what}-{arm}.yaml") for arm in _arms(train)]
    run_dir = train.config.output.out
    submit_path = train.path.with_name(f"{name}.submit.sh")
    commands = "\n".join(f'run_eval "{s.what} {s.arm}" ' + " ".join(_quote(a) for a in s.argv) for s in steps)
    note = (f"inference planner: {gpus} GPUs on {nodes} node(s); grids "
            + ", ".join(sorted({f"{s.what} {s.grid}" for s in steps}))
            + f"; ~{peak / 1024**3:.1f} GiB per GPU at most")
    values = {
        "HEADER": f"generated by memorization.launch.eval_jobs: evaluation of {name} ({', '.join(evaluations)})",
        "JOB_NAME": f"{name}-eval", "ACCOUNT": train.spec.launch.account, "NODES": str(nodes), "TASKS": str(gpus),
        "TASKS_PER_NODE": str(gpus // nodes), "TIME": time, "LOG_DIR": str(train.log_dir), "REPO": str(REPO),
        "RUN_DIR": run_dir, "SRUN_FLAGS": mcfg.srun_flags, "CONSTRAINT": mcfg.constraint, "EVAL_NOTE": note,
        "EVAL_COMMANDS": commands, "TASK_PRELUDE": mcfg.task_prelude, "SUBMIT": submit_path.name,
    }
    head = (TEMPLATES / mcfg.template).read_text()
    # not requeued, no USR1: an evaluation that runs out of time is rerun by hand (it writes only its reports)
    head = "\n".join(line for line in head.splitlines()
                     if not re.match(r"#SBATCH --(requeue|signal|open-mode)", line)) + "\n"
    text = head + (TEMPLATES / "eval.part").read_text()
    for key, val in values.items():
        text = text.replace("{{" + key + "}}", val)
    left = re.findall(r"\{\{\w+\}\}", text)
    if left:
        raise RuntimeError(f"template placeholders left unfilled: {left}")
    submit = SUBMIT.format(train=train.path.name, eval=path.name, name=name)
    return EvalJob(train, text, path, submit, submit_path, nodes, gpus, tuple(steps), peak)


SUBMIT = """#!/bin/bash
# generated by memorization.launch.eval_jobs: submits {name}'s training job, then its evaluation, which
# Slurm starts only once training has ended with status 0 (--dependency=afterok; a requeued job keeps its id)
here="$(cd "$(dirname "$0")" && pwd)"
train="$(sbatch --parsable "$here/{train}")" || true
train="${{train%%;*}}"   # --parsable prints id[;cluster]
if [ -z "$train" ]; then
    echo "the training job was not submitted: nothing to evaluate" >&2
    exit 1
fi
echo "training job $train"
evaluation="$(sbatch --parsable --dependency=afterok:"$train" "$here/{eval}")" || exit 1
echo "evaluation job ${{evaluation%%;*}}, after job $train ends with status 0"
"""
