"""Slurm scripts that evaluate a training job's models once it has ended: extraction, membership
inference, held-out perplexity and lm-eval tasks, each on the grid the inference planner picks.

For a training :class:`~memorization.jobs.Job` this writes ``<name>.eval.sbatch`` -- the machine's
template (its modules and environment, without the training job's requeue and USR1) followed by
``templates/eval.part``: one ``srun`` step per (evaluation, arm), each running ``eval/extract.py``,
``eval/mia.py``, ``eval/downstream.py --perplexity`` or ``eval/downstream.py --tasks`` on
``<run>/<arm>/checkpoint`` with the run's own manifest and extraction settings -- and ``<name>.submit.sh``,
which submits the training job and then the evaluation with ``--dependency=afterok:<training job>`` (a requeued training job keeps its id;
the evaluation waits until it has ended with status 0).

Sizing: a model-parallel group is the smallest that holds one replica for the most demanding
evaluation (:func:`axonn.planner.smallest_inference_gpus`: weights, KV cache, activations, logits at
the evaluation's batch and context), rounded up to whole nodes (at least one); each evaluation then
runs on :func:`axonn.planner.plan_inference`'s best grid of those GPUs, which spends the rest on data
replicas (documents split over them).

API: :func:`make_eval_job` (nothing written) and :meth:`EvalJob.write`; ``recipes/jobs/generate.py``
writes them next to each training job unless ``--eval none``.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from axonn.grid_shape import GridShape
from axonn.planner import load_profile
from memorization.jobs import REPO, TEMPLATES, Job, machine_config, time_limit_s

EVALUATIONS = ("extract", "mia", "perplexity", "lm-eval")
DEFAULT_EVALUATIONS = ("extract", "mia", "perplexity")  # lm-eval tasks other than the shipped one need datasets
DEFAULT_TASKS = "goldfish_mc"  # shipped with the project (data/lm_eval_tasks): runs offline
MIA_BATCH = 8  # eval/mia.py's and eval/downstream.py's default --batch-size


@dataclass(frozen=True)
class EvalStep:
    """One evaluation of one arm: the script and its arguments, on ``grid``."""

    what: str
    arm: str
    grid: GridShape
    argv: tuple[str, ...]


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
        """Write the evaluation script and the submit script (executable); returns the evaluation script's path."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for path, text in ((self.path, self.text), (self.submit_path, self.submit_text)):
            path.write_text(text)
            path.chmod(0o755)
        return self.path


def _arms(train: Job) -> list[str]:
    from memorization.experiment.run import arms_to_train

    return list(arms_to_train(train.config))


def _demands(train: Job, evaluations: tuple[str, ...]) -> dict[str, tuple[int, int, bool]]:
    """(batch, context, generates) of each evaluation as the script runs it."""
    cfg = train.config
    ex = cfg.extraction
    seq = cfg.data.seq_len
    context = ex.prefix + ex.suffix if ex.prefix_mode == "fixed" else seq
    demands = {"extract": (ex.batch, context, True), "mia": (MIA_BATCH, seq, False),
               "perplexity": (MIA_BATCH, seq, False), "lm-eval": (MIA_BATCH, seq, False)}
    return {e: demands[e] for e in evaluations}


def _argv(what: str, arm: str, train: Job, grid: GridShape, tasks: str) -> tuple[str, ...]:
    cfg = train.config
    ex = cfg.extraction
    model, manifest, out = f"$RUN_DIR/{arm}/checkpoint", "$RUN_DIR/manifest.json", f"$RUN_DIR/eval/{arm}"
    g = str(grid)
    if what == "extract":
        return ("eval/extract.py", "--model", model, "--manifest", manifest, "--grid", g, "--prefix", str(ex.prefix),
                "--suffix", str(ex.suffix), "--prefix-mode", ex.prefix_mode, "--batch-size", str(ex.batch),
                "--include-nonmembers", "--out", f"{out}/extraction", "--no-progress")
    if what == "mia":
        return ("eval/mia.py", "--model", model, "--manifest", manifest, "--grid", g, "--batch-size", str(MIA_BATCH),
                "--max-length", str(cfg.data.seq_len), "--out", f"{out}/mia")
    if what == "lm-eval":
        return ("eval/downstream.py", "--model", model, "--tasks", tasks, "--grid", g, "--batch-size", str(MIA_BATCH),
                "--max-length", str(cfg.data.seq_len), "--out", f"{out}/lm_eval")
    return ("eval/downstream.py", "--model", model, "--perplexity", manifest, "--grid", g, "--batch-size",
            str(MIA_BATCH), "--max-length", str(cfg.data.seq_len), "--out", f"{out}/perplexity")


def _quote(arg: str) -> str:
    """``arg`` for the script: ``$RUN_DIR`` stays expandable (double quotes), anything else plain or refused."""
    if arg.startswith("$RUN_DIR"):
        return f'"{arg}"'
    if shlex.quote(arg) != arg:
        raise ValueError(f"{arg!r}: paths and values in a job script must not contain spaces, quotes or other "
                         "shell characters; use a path without them")
    return arg


def make_eval_job(train: Job, evaluations: tuple[str, ...] = DEFAULT_EVALUATIONS, time: str = "01:00:00",
                  gpus: int | None = None, tasks: str = DEFAULT_TASKS) -> EvalJob:
    """The evaluation job of ``train`` (see the module docstring); ``gpus`` overrides the planner's count
    (whole nodes); ``tasks`` are the lm-eval tasks of the ``lm-eval`` evaluation (a comma list)."""
    from axonn.planner import PlanError, plan_inference, smallest_inference_gpus

    unknown = [e for e in evaluations if e not in EVALUATIONS]
    if unknown or not evaluations:
        raise ValueError(f"evaluations {list(evaluations)}: choose from {', '.join(EVALUATIONS)}")
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
    steps, peak = [], 0.0
    for what, (batch, ctx, gen) in demands.items():
        try:
            best = plan_inference(train.shape, gpus, prof, batch, ctx, generate=gen)
        except PlanError as e:
            raise ValueError(f"{what} of {train.spec.name} on {gpus} GPUs: {e}") from None
        peak = max(peak, best.memory.total)
        grid = best.grid
        steps += [EvalStep(what, arm, grid, _argv(what, arm, train, grid, tasks)) for arm in _arms(train)]
    run_dir = train.config.output.out
    name = train.spec.name
    path = train.path.with_name(f"{name}.eval.sbatch")
    submit_path = train.path.with_name(f"{name}.submit.sh")
    commands = "\n".join(f'run_eval "{s.what} {s.arm}" ' + " ".join(_quote(a) for a in s.argv) for s in steps)
    note = (f"inference planner: {gpus} GPUs on {nodes} node(s); grids "
            + ", ".join(sorted({f"{s.what} {s.grid}" for s in steps}))
            + f"; ~{peak / 1024**3:.1f} GiB per GPU at most")
    values = {
        "HEADER": f"generated by recipes/jobs/generate.py: evaluation of {name} ({', '.join(evaluations)})",
        "JOB_NAME": f"{name}-eval", "ACCOUNT": train.spec.account, "NODES": str(nodes), "TASKS": str(gpus),
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
# generated by recipes/jobs/generate.py: submits {name}'s training job, then its evaluation, which
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
