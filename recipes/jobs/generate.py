#!/usr/bin/env python
"""Generate Slurm batch scripts for the memorization experiments on Frontier, Alps and Perlmutter.

Each script trains one model size with memorize (``python -m memorization.experiment``, the program of
``recipes/memorize.py``; both arms by default, paired in one report) on the 4D grid the planner ranks fastest for the machine and GPU count, one ``srun`` task per GPU, with
checkpoint/resume on requeue (how: :mod:`memorization.launch.jobs` and docs/planner.md, "Job scripts").  Next to
it go the evaluation job (``<name>.eval.sbatch``: extraction, membership inference and held-out perplexity of
each arm's checkpoint on the grid the inference planner picks; :mod:`memorization.launch.eval_jobs`) and
``<name>.submit.sh``, which submits training and then the evaluation with ``--dependency=afterok``.

The experiment is a memorize config (``--config FILE.yaml``: corpus, targets, tokenizer, steps, learning
rate, ...; the flags below override it, and fields neither gives keep the job defaults: the 8b, rows of 2,048
tokens, 128 rows a step, each target seen once). The job runs ``python -m memorization.experiment --config <the
resolved config, written next to the script>`` plus only what the job decides: ``--grid``, ``--micro-batch``, ``--out``,
``--resume``. Before a script is written, the experiment's own checks run for the job's exact configuration:
the config is valid, the corpus fills the steps with the targets, the tokenizer fits the ``--init``
checkpoint's vocabulary, the checkpoint has the size's shape, the grid divides the model, its memory fits the
machine's GPUs. A failure refuses the job with the reason and the fix; a check that needs data this machine
cannot see (an ``--init`` only the compute nodes mount) is reported as not checked. ``--check`` runs the checks
alone and prints them (exit status 1 when one fails).

    python recipes/jobs/generate.py --machine frontier --size 405b --gpus 1024 --config recipes/configs/X.yaml
    python recipes/jobs/generate.py --all --config X.yaml --init '/lustre/models/Llama-3.1-{size}' --check
    python recipes/jobs/generate.py --all --account ABC123 --out-dir jobs/ --config X.yaml  # the paper matrix

The generator itself is the library module :mod:`memorization.launch.jobs`; this is its command line.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(REPO))

from axonn.cli import HelpFormatter  # noqa: E402
from axonn.grid_shape import GridShape  # noqa: E402
from axonn.plans import FAMILIES  # noqa: E402
from axonn.planner import GRAD_REDUCE_BYTES, PlanError  # noqa: E402
from memorization.experiment.config import ConfigError  # noqa: E402
from memorization.experiment.preflight import NOT_CHECKED  # noqa: E402
from memorization.launch.eval_jobs import DEFAULT_EVALUATIONS, EVALUATIONS, SHIPPED_TASKS, make_eval_job  # noqa: E402
from memorization.launch.jobs import (MACHINES, JobRefused, check_job, job_defaults, job_spec,  # noqa: E402
                                      load_job_config, make_job, paper_matrix)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter,
                                epilog="examples:\n  python recipes/jobs/generate.py --machine frontier --size 405b "
                                       "--gpus 1024\n  python recipes/jobs/generate.py --all --account ABC123")
    p.add_argument("--config", metavar="FILE.yaml", default=None,
                   help="the experiment: a memorize config (sections model, data, goldfish, training, ...; see "
                        "recipes/memorize.py --help); the flags below override it; fields neither gives keep the "
                        "job defaults (8b, --seq 2048, --global-batch 128, --exposures 1)")
    p.add_argument("--check", action="store_true",
                   help="run the pre-flight checks of each job (config, corpus fills the steps, tokenizer, --init "
                        "shape and vocabulary, grid, memory) and print them; write nothing; exit status 1 when one "
                        "fails (checks that need data not visible here are listed as not checked)")
    p.add_argument("--machine", choices=list(MACHINES), default="frontier",
                   help="target system (its Slurm template and planner profile)")
    p.add_argument("--size", default=None, help="model preset (8b, 70b, 405b, ...; default: the config's, else 8b)")
    p.add_argument("--family", default=None, choices=FAMILIES,
                   help="memorize.py --family: train --size's shape as this model family (default: the config's, "
                        "else the preset's own)")
    p.add_argument("--gpus", type=int, help="total GPUs (GCDs on Frontier); default: the paper's count")
    p.add_argument("--nodes", type=int, help="nodes instead of --gpus")
    p.add_argument("--goldfish-k", type=int, default=None,
                   help="Goldfish k (0 = standard loss; default: the config's, else 4)")
    p.add_argument("--arms", default=None,
                   help="memorize.py --arms: both (default: the standard arm, and the Goldfish one when k >= 2, "
                        "paired in one report), all (both and the equal-supervised-tokens control), or a comma "
                        "list of standard, goldfish, equal-tokens")
    p.add_argument("--exposures", default=None,
                   help="times each target document is seen (a comma list splits the targets into groups); "
                        "default: the config's, else 1 (the paper's headline: a single pass)")
    p.add_argument("--time", default="02:00:00", help="wall time per allocation (requeues continue)")
    p.add_argument("--account", default="ACCOUNT", help="allocation/project to charge (placeholder by default)")
    p.add_argument("--out-dir", default="recipes/jobs/out", help="where to write the .sbatch files")
    p.add_argument("--run-root", default="runs/jobs", help="runs' checkpoint/log root (fixed per job)")
    p.add_argument("--seq", type=int, default=None,
                   help="sequence length (memorize --seq-len; default: the config's, else 2048)")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per optimizer step (memorize --batch-size; default: the config's, else 128)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="per GPU (default: the config's, else the planner's)")
    p.add_argument("--grid", default=None, help="D,R,C,Z instead of the planner's best grid")
    p.add_argument("--init", default=None, help="Hugging Face checkpoint (safetensors) to fine-tune, as the paper "
                   "does; '{size}' in the path becomes each job's size, e.g. /models/Llama-3.1-{size} with --all. "
                   "Checked against the size's shape where this machine sees it. Default: random init")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="plan and train with per-layer activation checkpointing (default: the config's, else on)")
    p.add_argument("--grad-reduce-dtype", default=None, choices=sorted(GRAD_REDUCE_BYTES),
                   help="sum gradients over depth and data in bf16 (half the bytes; planned and trained so); "
                        "default: the config's, else fp32")
    p.add_argument("--async-checkpoint", action=argparse.BooleanOptionalAction, default=None,
                   help="write checkpoints in the background while training continues (default: the config's, else on: each "
                        "rank needs host memory for its share of the state, a few GB at the planned grids)")
    p.add_argument("--checkpoint-minutes", type=float, default=30.0,
                   help="wall time between checkpoints (turned into --checkpoint-every with the predicted step "
                        "time; 50 steps when the grid is given by hand and the planner cannot price it)")
    p.add_argument("--signal-lead", type=int, default=None, metavar="S",
                   help="seconds before the time limit at which Slurm sends USR1 (checkpoint, exit, requeue); "
                        "default: what a clean stop needs, 3 steps plus the checkpoint writes, at least 120")
    p.add_argument("--fs-gbps", type=float, default=None,
                   help="checkpoint write bandwidth per node in GB/s, to size --signal-lead (default: an assumed "
                        "2 GB/s on every machine; measure yours)")
    p.add_argument("--all", action="store_true",
                   help="emit the paper matrix: frontier/alps/perlmutter × 8b/70b/405b, each job Goldfish off "
                        "and on (both arms, --goldfish-k)")
    p.add_argument("--eval", default=",".join(DEFAULT_EVALUATIONS), metavar="LIST",
                   help="evaluations of the trained arms written as a second job, <name>.eval.sbatch, that starts "
                        "once training has ended with status 0 (<name>.submit.sh submits both with "
                        f"--dependency=afterok): a comma list of {', '.join(EVALUATIONS)} "
                        "(memorization.evaluation.registry's names; downstream is held-out perplexity, plus "
                        "--eval-tasks), or none "
                        f"(default: {','.join(DEFAULT_EVALUATIONS)}), each on the grid the inference planner picks")
    p.add_argument("--eval-tasks", default=None, metavar="LIST",
                   help="lm-eval tasks the downstream evaluation runs besides perplexity (a comma list; tasks other "
                        f"than the shipped {SHIPPED_TASKS} need their datasets in the cluster's HF cache: the job runs "
                        "offline); default: none")
    p.add_argument("--eval-time", default="01:00:00", help="wall time of the evaluation job")
    p.add_argument("--eval-gpus", type=int, default=None,
                   help="GPUs of the evaluation job (whole nodes; default: the fewest whole nodes on which one "
                        "replica fits, from the inference planner)")
    p.add_argument("--print", action="store_true", help="print the script instead of writing it (single job)")
    a = p.parse_args(argv)
    try:
        grid = GridShape.parse(a.grid) if a.grid else None
    except ValueError as e:
        p.error(f"--grid: {e}")
    evaluations = () if a.eval.strip() == "none" else tuple(e.strip() for e in a.eval.split(",") if e.strip())
    if not set(evaluations) <= set(EVALUATIONS) or (a.eval.strip() != "none" and not evaluations):
        p.error(f"--eval {a.eval}: a comma list of {', '.join(EVALUATIONS)}, or none")
    try:
        experiment = load_job_config(a.config) if a.config else job_defaults()
    except ConfigError as e:
        print(e.code, file=sys.stderr)
        return 2
    spec = job_spec(
        a.machine, experiment, size=a.size, family=a.family, gpus=a.gpus, nodes=a.nodes, goldfish_k=a.goldfish_k,
        arms=a.arms, exposures=a.exposures, time=a.time, account=a.account, out_dir=a.out_dir, run_root=a.run_root,
        seq=a.seq, global_batch=a.global_batch, micro_batch=a.micro_batch, grid=grid,
        activation_checkpointing=a.activation_checkpointing, grad_reduce_dtype=a.grad_reduce_dtype,
        async_checkpoint=a.async_checkpoint, init=a.init, checkpoint_minutes=a.checkpoint_minutes,
        signal_lead_s=a.signal_lead, fs_gbps=a.fs_gbps)
    specs = paper_matrix(spec) if a.all else [spec]
    failed = 0
    try:
        for s in specs:
            job = make_job(s)
            step = f"{job.predicted_step_s:.2f} s/step" if job.predicted_step_s else "grid by hand"
            summary = (f"nodes={job.nodes} tasks={job.tasks} grid={','.join(map(str, job.grid))} "
                       f"mb={job.micro_batch} ({step}; checkpoint every {job.stop.checkpoint_every} steps, "
                       f"USR1 {job.stop.signal_lead_s} s ahead)")
            checks = check_job(job)
            evaluation = (make_eval_job(job, evaluations, time=a.eval_time, gpus=a.eval_gpus, tasks=a.eval_tasks)
                          if evaluations else None)
            if evaluation is not None:
                summary += f"; evaluation: {evaluation.nodes} node(s), {evaluation.tasks} tasks"
            if a.check:
                print(f"{job.spec.name}: {summary}")
                for c in checks:
                    print(f"  {c.line()}")
                failed += any(c.failed for c in checks)
                continue
            if any(c.failed for c in checks):
                raise JobRefused(job, checks)
            for c in checks:
                if c.status == NOT_CHECKED:
                    print(f"note: {job.spec.name}: {c.name} not checked: {c.detail}", file=sys.stderr)
            if a.print and not a.all:
                print(job.text)
                if evaluation is not None:
                    print(evaluation.text)
                continue
            print(f"{job.write()}  {summary}")
            if evaluation is not None:
                print(f"{evaluation.write()}  submit both: {evaluation.submit_path}")
    except (PlanError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.check:
        print(f"{len(specs) - failed} of {len(specs)} job(s) passed the checks" + (
            "; fix the failed ones (each says how) before generating" if failed else ""))
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
