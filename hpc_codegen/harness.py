"""Build, run and score one C candidate; nothing the candidate can reach decides its verdict.

A candidate is ``problem.prompt + body``, compiled in a sandbox into a shared library
(``gcc -O2 -fopenmp`` for serial/OpenMP, ``mpicc`` for MPI, ``g++`` against Kokkos for Kokkos).  The problem's trusted runner
(:mod:`.reference`) loads it once per timed repetition and worker count
(``OMP_NUM_THREADS=n`` or ``mpiexec -n n``; serial problems only with 1), each run on
fresh inputs from its own random seed, and writes the function's output to a file; the
trusted reference program, outside the sandbox, checks every run's output against the
serial baseline's, and the run's time is the window the sandbox's init timestamped.  So a
candidate cannot pass by printing anything, by rewriting a checker, a driver or a timer,
or by reusing an earlier run's answer.  speedup = baseline kernel time / candidate kernel
time.

Status of a sample (first failure wins): ``build_error`` -> ``timeout`` ->
``runtime_error`` (crash, non-zero exit, memory limit, output cap, no output file) ->
``wrong_output`` (any run's output wrong) -> ``passed``.  A compiler or launcher that
cannot be found raises ``FileNotFoundError``, a reference that does not build or run
:class:`~.reference.SetupError`: faults of the setup, not of a candidate.
"""

from __future__ import annotations

import re
import shutil
import signal
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_codegen.problems import Problem
from hpc_codegen.reference import TIMING_FLOOR_S, Reference, prepare_reference, take_output
from hpc_codegen.sandbox import SandboxResult
from hpc_codegen.toolchain import (RunConfig, candidate_env, compile_library, launch, mpiexec_flags,
                                   require_tools, tail_text, tool)

__all__ = ["RunConfig", "SampleResult", "candidate_env", "evaluate_c", "mpiexec_flags", "require_tools",
           "tail_text", "tool"]


@dataclass
class SampleResult:
    """Outcome of one candidate: status plus per-worker-count timings."""

    status: str
    message: str = ""
    speedups: dict[int, float] = field(default_factory=dict)
    baseline_s: dict[int, float] = field(default_factory=dict)
    candidate_s: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        for key in ("speedups", "baseline_s", "candidate_s"):
            d[key] = {str(k): v for k, v in d[key].items()}
        return d


# mpiexec (hydra) reports a rank killed by a signal as "... (signal 11)" / "KILLED BY SIGNAL: 9"
_HYDRA_SIGNAL = re.compile(r"\(signal (\d+)\)|KILLED BY SIGNAL: (\d+)")


def _signal_name(num: int) -> str | None:
    try:
        return signal.Signals(num).name
    except ValueError:
        return None


def classify_run(res: SandboxResult) -> tuple[str, str] | None:
    """(status, message) of a candidate run that failed before its output could be checked, else None."""
    if res.timed_out:
        return "timeout", f"killed after {res.wall_s:.1f}s"
    if res.output_exceeded:
        return "runtime_error", "output limit exceeded"
    if res.disk_full:
        return "runtime_error", "disk limit exceeded (filled its working directory: --disk-mb)"
    if res.returncode != 0:
        sig = res.signal_name
        m = _HYDRA_SIGNAL.search(res.stdout + res.stderr)  # mpiexec reports a rank's signal itself
        if m:
            sig = _signal_name(int(m.group(1) or m.group(2)))
        what = f"killed by {sig}" if sig else f"exit code {res.returncode}"
        if sig in ("SIGSEGV", "SIGBUS", "SIGKILL", "SIGABRT"):
            what += " (crash, or memory limit exceeded)"
        return "runtime_error", f"{what}: {tail_text(res.stderr or res.stdout, 600)}"
    return None


def evaluate_c(problem: Problem, body: str, cfg: RunConfig, reference: Reference | None = None) -> SampleResult:
    """Build, run and check one candidate body for ``problem``; never raises for candidate faults.

    ``reference`` (from :func:`~.reference.prepare_reference`) is shared by a problem's
    samples; without it one is prepared for this call.
    """
    ref = reference or prepare_reference(problem, cfg)
    workdir = Path(tempfile.mkdtemp(prefix=f"hpc_{problem.name}_", dir=cfg.scratch()))
    try:
        b = compile_library(problem, body, workdir, cfg)
        if b.timed_out:  # the build's last line says which step ran past its time-out
            return SampleResult("build_error", b.stderr.strip().splitlines()[-1])
        if b.returncode != 0 or not (workdir / "candidate.so").is_file():
            return SampleResult("build_error", tail_text(b.stderr or b.stdout))
        result = SampleResult("passed")
        max_bytes = cfg.run_limits.file_mb << 20
        for workers in cfg.worker_counts(problem):
            times = []
            for seed in ref.seeds:
                out = workdir / "out.bin"
                out.unlink(missing_ok=True)
                res = launch(problem, workdir, cfg, workers, ref.runner,
                             [str(ref.n), str(seed), out.name, "./candidate.so"], ro=(str(ref.runner.parent),))
                failed = classify_run(res)
                if failed is None and res.window_s is None:
                    failed = "runtime_error", "the run ended before writing its output (exit in the function?)"
                if failed is None:
                    got = ref.dir / f"got_{workers}_{seed}.bin"
                    missing = take_output(out, got, max_bytes)
                    if missing:
                        failed = "runtime_error", missing
                    else:
                        ok, msg = ref.check(seed, got, cfg.run_limits.timeout_s)
                        got.unlink()
                        failed = None if ok else ("wrong_output", msg)
                if failed:
                    return SampleResult(failed[0], f"[{workers} worker(s)] {failed[1]}")
                times.append(res.window_s)
            kernel = max(min(times) - ref.null_s[workers], TIMING_FLOOR_S)
            result.baseline_s[workers] = ref.baseline_s
            result.candidate_s[workers] = kernel
            result.speedups[workers] = ref.baseline_s / kernel
        return result
    finally:
        if not cfg.keep_dirs:
            shutil.rmtree(workdir, ignore_errors=True)
        if reference is None:
            ref.cleanup()
