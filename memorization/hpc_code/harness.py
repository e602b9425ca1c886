"""Build, run and classify one C candidate against its problem's driver.

A candidate is ``problem.prompt + body``.  It is compiled together with the
problem's driver and the generic harness main (``gcc -O2 -fopenmp`` for
serial/OpenMP, ``mpicc`` for MPI) in a fresh temp directory, then run once
per worker count (``OMP_NUM_THREADS=n`` or ``mpiexec -n n``; serial problems
only with 1).  The driver checks the result against its own serial baseline
and prints both kernel times; speedup = baseline time / candidate time.

Status of a sample (first failure wins): ``build_error`` -> ``timeout`` ->
``runtime_error`` (crash, non-zero exit, memory limit, output cap, missing or
malformed result line, worker count other than requested) -> ``wrong_output``
(any candidate run's output wrong) -> ``passed``.  A compiler or launcher
that cannot be found raises ``FileNotFoundError`` instead of failing samples.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from memorization.hpc_code.problems import Problem
from memorization.hpc_code.sandbox import SandboxLimits, SandboxResult, memory_limited, run_sandboxed

SEED = 20240917


@dataclass(frozen=True)
class RunConfig:
    """How candidates are built and run."""

    workers: tuple[int, ...] = (1, 2)  # OpenMP threads / MPI ranks to run with
    quick: bool = False  # small inputs, one repetition (tests)
    repeats: int = 3  # timed repetitions; the best time counts
    run_limits: SandboxLimits = SandboxLimits()
    build_limits: SandboxLimits = SandboxLimits(timeout_s=120.0, memory_mb=0)
    cc: str = "gcc"
    mpicc: str = "mpicc"
    mpiexec: str = "mpiexec"
    cflags: tuple[str, ...] = ("-O2", "-fopenmp", "-std=gnu17")
    keep_dirs: bool = False


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


def _tool(name: str) -> str:
    """Resolve a compiler/launcher, preferring the running venv's bin/ (mpicc, mpiexec).

    A tool that cannot be found raises ``FileNotFoundError``: it is a setup fault,
    not a candidate's, and must not be scored as a build or runtime failure.
    """
    venv_bin = Path(sys.executable).parent / name
    if venv_bin.exists():
        return str(venv_bin)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} not found (looked in {venv_bin.parent} and on PATH)")
    return found


def require_tools(cfg: RunConfig, models: set[str] | list[str]) -> None:
    """Raise ``FileNotFoundError`` unless the compilers/launcher for ``models`` can be found."""
    names = {cfg.cc} if set(models) & {"serial", "openmp"} else set()
    if "mpi" in models:
        names |= {cfg.mpicc, cfg.mpiexec}
    for name in sorted(names):
        _tool(name)


@lru_cache(maxsize=8)
def mpiexec_flags(mpiexec: str) -> tuple[str, ...]:
    """Launcher flags needed here: Open MPI refuses root and oversubscription by default.

    MPICH's hydra (the venv's ``mpich`` wheel) needs none.
    """
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return ()
    if "Open MPI" in text or "OpenRTE" in text or "open-mpi" in text:
        flags = ("--oversubscribe",)
        return flags + ("--allow-run-as-root",) if os.geteuid() == 0 else flags
    return ()


def candidate_env(workdir: str, threads: int) -> dict[str, str]:
    """The minimal environment a candidate runs in (C/OpenMP/MPI here, Python in :mod:`.humaneval`): no
    inherited secrets, ``workdir`` as home and temporary directory, ``threads`` OpenMP threads."""
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    return {
        "PATH": path,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C",
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "passive",  # oversubscribed MPI ranks must not spin
        "OMPI_MCA_plm_rsh_agent": "",  # Open MPI: single node, do not look for ssh/rsh
    }


def tail_text(text: str, limit: int = 1500) -> str:
    """The last ``limit`` characters of ``text`` (stripped), with ``...`` before them when cut: what a report
    keeps of a compiler's or a candidate's output."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


def candidate_source(problem: Problem, body: str) -> str:
    return problem.prompt + body


def build(problem: Problem, body: str, workdir: str, cfg: RunConfig) -> SandboxResult:
    """Write the sources into ``workdir`` and compile ``./prog``."""
    wd = Path(workdir)
    (wd / "candidate.c").write_text(candidate_source(problem, body))
    main = "main_mpi.c" if problem.model == "mpi" else "main_omp.c"
    compiler = _tool(cfg.mpicc if problem.model == "mpi" else cfg.cc)
    cmd = [compiler, *cfg.cflags, f"-I{problem.harness_dir}", "candidate.c",
           str(problem.driver_path), str(problem.harness_dir / main), "-o", "prog", "-lm"]
    return run_sandboxed(cmd, workdir, cfg.build_limits, candidate_env(workdir, 1))


# mpiexec (hydra) reports a rank killed by a signal as "... (signal 11)" / "KILLED BY SIGNAL: 9"
_HYDRA_SIGNAL = re.compile(r"\(signal (\d+)\)|KILLED BY SIGNAL: (\d+)")


def _signal_name(num: int) -> str | None:
    try:
        return signal.Signals(num).name
    except ValueError:
        return None


def _classify_run(res: SandboxResult, nonce: str, workers: int) -> tuple[str, str, dict | None]:
    """Map one driver run with ``workers`` threads/ranks to (status, message, parsed result line or None)."""
    if res.timed_out:
        return "timeout", f"killed after {res.wall_s:.1f}s", None
    if res.output_exceeded:
        return "runtime_error", "output limit exceeded", None
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith(f"HPC_RESULT {nonce} ")), None)
    if res.returncode != 0:
        sig = res.signal_name
        m = _HYDRA_SIGNAL.search(res.stdout + res.stderr)  # mpiexec reports a rank's signal itself
        if m:
            sig = _signal_name(int(m.group(1) or m.group(2)))
        what = f"killed by {sig}" if sig else f"exit code {res.returncode}"
        if sig in ("SIGSEGV", "SIGBUS", "SIGKILL", "SIGABRT"):
            what += " (crash, or memory limit exceeded)"
        return "runtime_error", f"{what}: {tail_text(res.stderr or res.stdout, 600)}", None
    if line is None:
        return "runtime_error", f"driver printed no result line: {tail_text(res.stderr or res.stdout, 600)}", None
    head, _, msg = line.partition(" msg=")
    try:
        fields = dict(tok.split("=", 1) for tok in head.split()[2:])
        parsed = {"ok": fields["ok"] == "1", "workers": int(fields["workers"]),
                  "baseline_s": float(fields["baseline_s"]), "candidate_s": float(fields["candidate_s"])}
    except (KeyError, ValueError):
        return "runtime_error", f"malformed result line: {tail_text(line, 600)}", None
    if parsed["workers"] != workers:  # e.g. mpiexec from another MPI than mpicc: n singleton ranks
        return "runtime_error", f"ran with {parsed['workers']} worker(s), expected {workers}", None
    if not parsed["ok"]:
        return "wrong_output", msg, parsed
    return "passed", "", parsed


def evaluate_c(problem: Problem, body: str, cfg: RunConfig) -> SampleResult:
    """Build and run one candidate body for ``problem``; never raises for candidate faults."""
    workdir = tempfile.mkdtemp(prefix=f"hpc_{problem.name}_")
    try:
        b = build(problem, body, workdir, cfg)
        if b.timed_out:
            return SampleResult("build_error", "compiler timed out")
        if b.returncode != 0 or not (Path(workdir) / "prog").exists():
            return SampleResult("build_error", tail_text(b.stderr or b.stdout))
        n = problem.quick_size if cfg.quick else problem.size
        repeats = 1 if cfg.quick else cfg.repeats
        result = SampleResult("passed")
        for workers in ((1,) if problem.model == "serial" else cfg.workers):
            nonce = secrets.token_hex(8)
            args = ["./prog", nonce, str(n), str(repeats), str(SEED)]
            limits = cfg.run_limits
            if problem.model == "mpi":  # memory limit per rank, not on the launcher
                launcher = _tool(cfg.mpiexec)
                args = [launcher, *mpiexec_flags(launcher), "-n", str(workers),
                        *memory_limited(args, limits.memory_mb)]
                limits = replace(limits, memory_mb=0)
            threads = workers if problem.model == "openmp" else 1
            res = run_sandboxed(args, workdir, limits, candidate_env(workdir, threads))
            status, msg, parsed = _classify_run(res, nonce, workers)
            if status != "passed":
                return SampleResult(status, f"[{workers} worker(s)] {msg}")
            result.baseline_s[workers] = parsed["baseline_s"]
            result.candidate_s[workers] = parsed["candidate_s"]
            result.speedups[workers] = parsed["baseline_s"] / max(parsed["candidate_s"], 1e-9)
        return result
    finally:
        if not cfg.keep_dirs:
            shutil.rmtree(workdir, ignore_errors=True)
