#!/usr/bin/env python
"""Generate Slurm batch scripts for the memorization experiments on Frontier, Alps and Perlmutter.

Each script trains one model size via ``recipes/memorize.py``: by default both arms, the standard loss and
Goldfish (``--goldfish-k 4``), on the same mixture, seed and initial weights, so its report holds the paired
comparison (McNemar); ``--goldfish-k 0`` trains the standard arm alone and ``--arms`` picks one arm. It runs on the
4D grid the planner (:mod:`axonn.planner`) ranks fastest for
that machine and GPU count (passed as ``--grid D,R,C,Z``, with the planner's micro-batch), with
the environment the machine needs, one ``srun`` task per GPU, ``MASTER_ADDR`` from the first
node of ``$SLURM_JOB_NODELIST``, and checkpoint/resume on requeue (``#SBATCH --requeue``,
``--signal=B:USR1@...``, a fixed ``--out`` directory and ``--resume``).

    python recipes/jobs/generate.py --machine frontier --size 405b --gpus 1024 --goldfish-k 4
    python recipes/jobs/generate.py --all --account ABC123 --out-dir jobs/   # the paper matrix
    python recipes/jobs/generate.py --all --init '/lustre/models/Llama-3.1-{size}'  # fine-tuning, as the paper

With ``--init`` each rank reads only the rows of the checkpoint its shards need (no process holds
the full model; ``memorization.models.build_model``).

The generator itself is the library module :mod:`memorization.jobs`; this is its command line.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # runnable as a plain script from anywhere
    sys.path.insert(0, str(REPO))

from axonn.cli import HelpFormatter  # noqa: E402
from axonn.grid import parse_grid  # noqa: E402
from axonn.planner import GRAD_REDUCE_BYTES, PlanError  # noqa: E402
from memorization.jobs import ARMS, MACHINES, JobSpec, make_job, paper_matrix  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter,
                                epilog="examples:\n  python recipes/jobs/generate.py --machine frontier --size 405b "
                                       "--gpus 1024\n  python recipes/jobs/generate.py --all --account ABC123")
    p.add_argument("--machine", choices=list(MACHINES), default="frontier",
                   help="target system (its Slurm template and planner profile)")
    p.add_argument("--size", default="8b", help="model preset (8b, 70b, 405b, ...)")
    p.add_argument("--gpus", type=int, help="total GPUs (GCDs on Frontier); default: the paper's count")
    p.add_argument("--nodes", type=int, help="nodes instead of --gpus")
    p.add_argument("--goldfish-k", type=int, default=4, help="Goldfish k (0 = standard loss; default 4)")
    p.add_argument("--arms", default="both", choices=ARMS,
                   help="memorize.py --arms: both (default: the standard arm, and the Goldfish one when k >= 2, "
                        "paired in one report), or one arm alone")
    p.add_argument("--exposures", type=int, default=100, help="times each target document is seen")
    p.add_argument("--time", default="02:00:00", help="wall time per allocation (requeues continue)")
    p.add_argument("--account", default="ACCOUNT", help="allocation/project to charge (placeholder by default)")
    p.add_argument("--out-dir", default="recipes/jobs/out", help="where to write the .sbatch files")
    p.add_argument("--run-root", default="runs/jobs", help="runs' checkpoint/log root (fixed per job)")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--global-batch", type=int, default=128, help="sequences per optimizer step (default 128)")
    p.add_argument("--micro-batch", type=int, default=None, help="per GPU (default: the planner's)")
    p.add_argument("--grid", default=None, help="D,R,C,Z instead of the planner's best grid")
    p.add_argument("--init", default=None, help="Hugging Face checkpoint (safetensors) to fine-tune, as the paper "
                   "does; '{size}' in the path becomes each job's size, e.g. /models/Llama-3.1-{size} with --all. "
                   "Checked against the size's shape where this machine sees it. Default: random init")
    p.add_argument("--no-activation-checkpointing", action="store_true",
                   help="plan and train without per-layer activation checkpointing")
    p.add_argument("--grad-reduce-dtype", default="fp32", choices=sorted(GRAD_REDUCE_BYTES),
                   help="sum gradients over depth and data in bf16 (half the bytes; planned and trained so)")
    p.add_argument("--async-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="write checkpoints in the background while training continues (default on: each "
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
    p.add_argument("--print", action="store_true", help="print the script instead of writing it (single job)")
    a = p.parse_args(argv)
    try:
        grid = parse_grid(a.grid) if a.grid else None
    except ValueError as e:
        p.error(f"--grid: {e}")
    spec = JobSpec(machine=a.machine, size=a.size, gpus=a.gpus, nodes=a.nodes, goldfish_k=a.goldfish_k,
                   arms=a.arms, exposures=a.exposures, time=a.time, account=a.account, out_dir=a.out_dir,
                   run_root=a.run_root,
                   seq=a.seq, global_batch=a.global_batch, micro_batch=a.micro_batch, grid=grid,
                   activation_checkpointing=not a.no_activation_checkpointing,
                   grad_reduce_dtype=a.grad_reduce_dtype, async_checkpoint=a.async_checkpoint, init=a.init,
                   checkpoint_minutes=a.checkpoint_minutes, signal_lead_s=a.signal_lead, fs_gbps=a.fs_gbps)
    specs = paper_matrix(spec) if a.all else [spec]
    try:
        for s in specs:
            job = make_job(s)
            if a.print and not a.all:
                print(job.text)
                continue
            path = job.write()
            step = f"{job.predicted_step_s:.2f} s/step" if job.predicted_step_s else "grid by hand"
            print(f"{path}  nodes={job.nodes} tasks={job.tasks} grid={','.join(map(str, job.grid))} "
                  f"mb={job.micro_batch} ({step}; checkpoint every {job.stop.checkpoint_every} steps, "
                  f"USR1 {job.stop.signal_lead_s} s ahead)")
    except (PlanError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
