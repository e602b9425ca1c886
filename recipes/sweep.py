#!/usr/bin/env python
"""Sweep memorize over model sizes x exposure counts x Goldfish k (x h) and report it all in one place.

Each cell is one recipes/memorize.py run at one size and one exposure count; the standard arm
is trained once per (size, exposures) and shared by every Goldfish k/h. Every cell's pre-flight
checks (its settings, checkpoint, tokenizer, corpus and grid) run before the first cell: one bad
cell refuses the grid. Finished cells are never re-run, an interrupted cell resumes (memorize
--resume), a cell that fails while it runs is recorded and the sweep goes on, then exits 1 naming
it; SIGUSR1 (a Slurm time limit near) checkpoints the arm in training and ends the sweep with
status 75, and the same command continues it. The report (DIR/report.md,
DIR/report.html with embedded PNG plots, DIR/results.json) has extraction, Rouge-L, held-out
loss and perplexity, and optionally MIA AUCs, lm-eval scores and HPC-code pass@1.

    python recipes/sweep.py --sizes tiny,mini --exposures 16,32,64 --goldfish-k 0,4 --mia --out runs/sweep
    python recipes/sweep.py --sizes tiny --exposures 2,4 --goldfish-k 0,4 --steps 12 --num-targets 4 --out /tmp/s
    python recipes/sweep.py --sizes 8b,70b --exposures 100 --goldfish-k 0,4 --emit-jobs frontier --out jobs/
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # runnable from a checkout without installation
    sys.path.insert(0, str(_REPO))

from axonn.cli import HelpFormatter, run_main  # noqa: E402

EPILOG = """\
Any other option is passed to every memorize run (see `python recipes/memorize.py --help`),
e.g. --steps N, --num-targets N, --num-nonmembers N, --seq-len N, --batch-size N, --prefix N,
--suffix N, --lr X, --seed N, --corpus PATH, --tokenizer NAME, --goldfish-strategy S, --init PATH.
The sweep sets --size, --exposures, --goldfish-k, --goldfish-h, --arms, --out and --resume itself.

Layout of --out: cells/<size>-e<exposures>-{standard|k<k>-h<h>}/ (a memorize run each, with
cell.json once finished), results.json (every cell + a flat table), report.md, report.html,
*.png, command.txt. With --emit-jobs: jobs/ (one Slurm script per cell, jobs.json, submit_all.sh).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG, allow_abbrev=False,
                                formatter_class=HelpFormatter)
    g = p.add_argument_group("grid")
    g.add_argument("--sizes", default="tiny", help="comma list of model-size presets (axonn/presets.yaml), "
                   "e.g. tiny,mini (default: tiny)")
    g.add_argument("--exposures", default="16,32,64", help="comma list of exposure counts; one memorize run per "
                   "count, every target of the run seen that often (default: 16,32,64)")
    g.add_argument("--goldfish-k", default="0,4", help="comma list of Goldfish k; 0 = the standard loss arm, "
                   "k >= 2 drops 1/k of the labels (default: 0,4)")
    g.add_argument("--goldfish-h", default="13", help="comma list of Goldfish hash widths h (default: 13)")
    g = p.add_argument_group("evaluations (held-out perplexity always runs)")
    g.add_argument("--mia", action="store_true", help="membership inference per arm (loss/zlib/min-k AUC, "
                   "TPR@1%%FPR, ROC) of the targets against the held-out nonmembers")
    g.add_argument("--downstream", action="store_true", help="lm-eval tasks per arm (slow; default task: the "
                   "shipped offline goldfish_mc)")
    g.add_argument("--downstream-tasks", default="goldfish_mc", help="comma list of lm-eval tasks for "
                   "--downstream (default: goldfish_mc)")
    g.add_argument("--downstream-limit", type=int, default=None, help="at most N examples per lm-eval task")
    g.add_argument("--hpc-code", action="store_true", help="HPC-code pass@1 per arm via eval/hpc_code.py "
                   "--model (greedy, --quick); a tiny model scores 0, the point is the pipeline")
    g.add_argument("--hpc-problems", default="*_serial", help="comma list of problem globs for --hpc-code "
                   "(default: *_serial)")
    g.add_argument("--hpc-max-new-tokens", type=int, default=64, help="generation cap for --hpc-code "
                   "(default: 64)")
    g.add_argument("--eval-batch-size", type=int, default=8, help="documents per forward in the evaluations")
    g.add_argument("--eval-device", default=None, help="device of the post-training evaluations (default: cuda "
                   "if available, else cpu); on CUDA they run in bfloat16, on CPU in float32")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="runs/sweep", help="sweep directory (default: runs/sweep); rerunning with "
                   "the same --out resumes the sweep")
    g.add_argument("--report-only", action="store_true", help="rebuild the report from --out's finished cells "
                   "without running anything")
    g.add_argument("--no-progress", action="store_true", help="no progress bar over the cells")
    g = p.add_argument_group("at scale: Slurm jobs instead of local runs")
    g.add_argument("--emit-jobs", metavar="MACHINE", default=None, help="write one Slurm script per cell for "
                   "MACHINE (frontier, alps, perlmutter, perlmutter-40) via recipes/jobs/generate.py into "
                   "OUT/jobs/ and run nothing")
    g.add_argument("--gpus", type=int, default=None, help="GPUs per job (default: the paper's count per size)")
    g.add_argument("--nodes", type=int, default=None, help="nodes per job (instead of --gpus)")
    g.add_argument("--account", default="ACCOUNT", help="Slurm account for --emit-jobs")
    g.add_argument("--time", default="02:00:00", help="Slurm time limit per job for --emit-jobs")
    g.add_argument("--run-root", default="runs/sweep-jobs", help="where the jobs write their runs (on the cluster)")
    return p


#: memorize options the sweep sets itself per cell (memorization.launch.sweep.Cell); refused as pass-through options.
RESERVED_OPTIONS = ("--size", "--exposures", "--goldfish-k", "--goldfish-h", "--arms", "--out", "--resume",
                    "--overwrite", "--plan", "--gpus", "--machine")


def check_passthrough(extra: Sequence[str]) -> list[str]:
    """``extra`` as given, after refusing memorize options the sweep sets itself, abbreviations, unknown options
    and bad values (memorize's own parser); a :class:`~memorization.launch.sweep.SweepError` says which."""
    import contextlib
    import io

    from memorization.experiment.cli import config_from_argv, explicit_values
    from memorization.launch.sweep import SweepError

    extra = list(extra)
    known = memorize_option_strings()
    for tok in extra:
        name = tok.split("=", 1)[0]
        if name in RESERVED_OPTIONS:
            raise SweepError(f"{name} is set by the sweep per cell; use the sweep's own flag (see --help)")
        if name.startswith("--") and name.replace("_", "-") != name:
            raise SweepError(f"unknown option {name}")
        if name.startswith("--") and len(name) > 2 and name not in known:
            # memorize's parser expands a unique prefix (--siz -> --size): it would override the cell's own
            # --size/--exposures/--arms... while the cell keeps its label, so only full names pass through
            full = sorted(o for o in known if o.startswith(name))
            if full:
                raise SweepError(f"{name}: give the full option name ({', '.join(full)}); abbreviations are "
                                 "not passed to memorize")
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            explicit_values(extra)
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        why = msg[-1].split(" error: ", 1)[-1] if msg else "invalid"  # argparse's "prog: error: ..." prefix dropped
        raise SweepError(f"bad memorize option in {' '.join(extra)!r}: {why}") from None
    try:
        config_from_argv(extra)  # a --config file: read and checked before any cell
    except SystemExit as e:
        raise SweepError(str(e.code).removeprefix("error: ")) from None
    return extra


def memorize_option_strings() -> frozenset[str]:
    """Every option string of memorize's parser (``--steps``, ``-h``, ...)."""
    from memorization.experiment.cli import build_parser as memorize_parser

    return frozenset(o for a in memorize_parser()._actions for o in a.option_strings)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Sweep flags and the memorize pass-through options (validated by memorize's own parser)."""
    from memorization.launch.sweep import SweepError

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    try:
        extra = check_passthrough(extra)
    except SweepError as e:
        parser.error(str(e))
    return args, extra


def main(argv: list[str] | None = None) -> dict:
    """Run (or emit) the sweep and write its report; returns ``{"results", "summary", "report"}``."""
    from memorization.experiment.cli import config_from_argv, explicit_values
    from memorization.launch.sweep import EvalOptions, SweepError, aggregate, expand_grid, run_sweep
    from memorization.launch.sweep_report import write_report

    args, extra = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cells = expand_grid(args.sizes, args.exposures, args.goldfish_k, args.goldfish_h)
        _check_sizes(args.sizes)
        _check_flags(args)
    except SweepError as e:
        raise SystemExit(f"error: {e}") from None
    out = Path(args.out)
    given = sys.argv[1:] if argv is None else argv
    # the command that runs (and resumes) this sweep: --report-only only rebuilds its report
    command = "python recipes/sweep.py " + " ".join(shlex.quote(a) for a in given if a != "--report-only")
    if args.emit_jobs:
        from memorization.launch.jobs import job_defaults
        from memorization.launch.sweep import emit_jobs

        # the memorize options (a --config file under them) over the job defaults, resolved by each job
        base = config_from_argv(extra, base=job_defaults(), resolved=False)
        try:
            paths = emit_jobs(cells, out / "jobs", args.emit_jobs, base, gpus=args.gpus, nodes=args.nodes,
                              account=args.account, time_limit=args.time, run_root=args.run_root,
                              checkpoint_every=explicit_values(extra).get("checkpoint_every"))
        except ValueError as e:
            raise SystemExit(f"error: --emit-jobs {args.emit_jobs}: {e}") from None
        print(f"wrote {len(paths)} job scripts to {out / 'jobs'} (submit: bash {out / 'jobs' / 'submit_all.sh'})")
        return {"jobs": paths}
    opts = EvalOptions(mia=args.mia, downstream=args.downstream,
                       downstream_tasks=tuple(t for t in args.downstream_tasks.split(",") if t),
                       downstream_limit=args.downstream_limit, hpc_code=args.hpc_code,
                       hpc_problems=tuple(t for t in args.hpc_problems.split(",") if t),
                       hpc_max_new_tokens=args.hpc_max_new_tokens, batch_size=args.eval_batch_size,
                       device=args.eval_device)
    meta = {"command": command,
            "grid": {"sizes": list(dict.fromkeys(c.size for c in cells)),
                     "exposures": list(dict.fromkeys(c.exposures for c in cells)),
                     "goldfish_k": args.goldfish_k, "goldfish_h": args.goldfish_h},
            "memorize_options": extra, "evaluations": {"mia": args.mia, "downstream": args.downstream,
                                                       "hpc_code": args.hpc_code, "device": opts.device}}
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only and (out / "command.txt").is_file():  # the command that ran the cells, not this one
        meta["command"] = (out / "command.txt").read_text().strip()
    else:
        (out / "command.txt").write_text(command + "\n")
    if args.report_only:
        results = aggregate(out, cells, meta)
        summary = None
    else:
        os.environ.setdefault("WANDB_MODE", "disabled")
        try:
            results, summary = run_sweep(cells, out, config_from_argv(extra), opts, meta,
                                         progress=not args.no_progress, options=extra)
        except SweepError as e:
            raise SystemExit(f"error: {e}") from None
        print(f"sweep: {len(summary.ran)} cell(s) run, {len(summary.cached)} already done, "
              f"{len(summary.failed)} failed, {summary.seconds / 60:.1f} min", file=sys.stderr)
    ok = [c for c in results["cells"] if c.get("status") == "ok"]
    results["timing"] = {"cells_seconds": sum(c.get("seconds", 0) for c in ok),
                         "host": f"{platform.machine()}, {os.cpu_count()} CPU cores", "written_at": time.time()}
    from memorization.data.mixture import atomic_write_json

    atomic_write_json(out / "results.json", results)
    paths = write_report(results, out)
    print(f"report: {paths['markdown']} and {paths['html']}", file=sys.stderr)
    if summary is not None and summary.failed:  # after every other cell ran and the report was written
        raise SystemExit(f"error: {len(summary.failed)} of {len(cells)} cells failed ({', '.join(summary.failed)}): "
                         f"each cell's error is in {out}/cells/<cell>/cell.json and the report; the same command "
                         "runs the failed cells again and reuses the finished ones")
    return {"results": results, "summary": summary, "report": paths}


#: flags that only shape the Slurm scripts of --emit-jobs
JOB_FLAGS = ("gpus", "nodes", "account", "time", "run_root")
#: flags of the local evaluations, which the emitted jobs do not run
EVAL_FLAGS = ("mia", "downstream", "hpc_code")


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that the chosen mode would silently ignore, and an evaluation device that does not exist."""
    from memorization.launch.sweep import SweepError

    defaults = build_parser().parse_args([])

    def flags(dests: list[str]) -> str:
        return ", ".join("--" + d.replace("_", "-") for d in dests)

    if args.emit_jobs:
        if args.report_only:
            raise SweepError("--emit-jobs and --report-only contradict each other")
        used = [f for f in EVAL_FLAGS if getattr(args, f)]
        if used:
            raise SweepError(f"--emit-jobs writes memorize jobs only: {flags(used)} "
                             "would not run (run eval/mia.py or eval/downstream.py on the jobs' checkpoints)")
        return
    used = [f for f in JOB_FLAGS if getattr(args, f) != getattr(defaults, f)]
    if used:
        raise SweepError(f"{flags(used)} only shape the Slurm scripts of "
                         "--emit-jobs; a local sweep runs each cell on this machine")
    if args.eval_device and not args.report_only:
        import torch

        try:
            dev = torch.device(args.eval_device)
        except (RuntimeError, ValueError) as e:
            raise SweepError(f"--eval-device {args.eval_device!r}: {e}") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise SweepError(f"--eval-device {args.eval_device}: no CUDA device on this machine")


def _check_sizes(sizes: str) -> None:
    from axonn.presets import get_preset
    from memorization.launch.sweep import SweepError

    for s in sizes.split(","):
        if not s.strip():
            continue
        try:
            get_preset(s.strip())
        except ValueError as e:
            raise SweepError(f"--sizes: {e}") from None


if __name__ == "__main__":
    run_main(main, "finished cells and each arm's last checkpoint are kept; the same command resumes the sweep")
