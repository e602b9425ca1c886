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
import json
import signal
import sys
from pathlib import Path

from axonn.cli import HelpFormatter
from memorization.evaluation.registry import evaluate
from hpc_codegen.evaluate import HpcCodeConfig, HpcCodeError
from hpc_codegen.problems import MODELS, default_suite_dir
from hpc_codegen.toolchain import LAUNCHERS


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
    gen.add_argument("--chat-template", default="auto", choices=["auto", "on", "off"],
                     help="prompt an instruction-tuned model in its tokenizer's chat template: a user turn asking for "
                          "the rest of the function (the prompt in a code fence), the reply begun with the prompt so "
                          "the model writes the body; off: the prompt as raw text (base models); auto: on when the "
                          "tokenizer has a chat template (default: auto)")
    gen.add_argument("--save-completions", type=Path, metavar="FILE",
                     help="append each batch of sampled completions to FILE as JSON lines as soon as they exist "
                          "(completion, extracted body, sample number, generation settings; a --completions input); "
                          "rerun with the same FILE and settings to resume a stopped run: problems already there are "
                          "not sampled again")

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
    run.add_argument("--build-timeout", type=float, default=60.0,
                     help="seconds to compile one preprocessed candidate (default: 60; a Kokkos build takes ~4 here)")
    run.add_argument("--preprocess-timeout", type=float, default=10.0,
                     help="seconds to preprocess one candidate, the build's first step: a macro that expands without "
                          "bound fails here (default: 10; a Kokkos prompt takes ~0.6 here)")
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


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def _exit_on_sigterm(signum: int, frame) -> None:
    """SIGTERM (``kill``, Slurm at the time limit) ends the run as Ctrl-C does: every candidate's and
    reference's temporary directory is removed on the way out (Python's default action skips that)."""
    raise SystemExit(128 + signum)


def config_of(args: argparse.Namespace) -> HpcCodeConfig:
    """The :class:`HpcCodeConfig` of the parsed flags (each field is the flag of the same name)."""
    return HpcCodeConfig(
        use_references=args.use_references, model=args.model, completions=args.completions,
        benchmarks=args.benchmarks, suite=args.suite, problems=tuple(args.problems) if args.problems else None,
        execution_models=tuple(args.execution_models) if args.execution_models else None, tasks=args.tasks,
        humaneval_limit=args.humaneval_limit, samples=args.samples, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
        seed=args.seed, grid=args.grid, chat_template=args.chat_template, save_completions=args.save_completions, workers=tuple(args.workers),
        threads_per_rank=args.threads_per_rank, k=tuple(args.k), quick=args.quick, repeats=args.repeats,
        jobs=args.jobs, timeout=args.timeout, build_timeout=args.build_timeout,
        preprocess_timeout=args.preprocess_timeout, memory_mb=args.memory_mb,
        disk_mb=args.disk_mb, output_limit_kb=args.output_limit_kb, max_processes=args.max_processes,
        allow_network=args.allow_network, keep_temp=args.keep_temp, nvcc=args.nvcc, hipcc=args.hipcc,
        gpu_arch=args.gpu_arch, launcher=args.launcher, mpiexec=args.mpiexec,
        launcher_args=args.launcher_args, srun_mpi=args.srun_mpi, nodes=args.nodes, work_dir=args.work_dir,
        output=args.output, progress=not args.no_progress, print_tables=not args.json)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        report = evaluate("hpc-code", config_of(args), note=_stderr)
    except HpcCodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if report is not None and args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
