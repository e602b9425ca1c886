"""Building and launching a problem's programs: compilers, MPI launcher, sandboxed environment.

A problem has two kinds of program (see :mod:`.reference` and :mod:`.harness`): trusted
ones compiled from its driver and a generic main of ``data/hpc_code/harness``
(:func:`compile_driver`), and shared libraries compiled from the prompt and a body -- the
candidate's, or the reference solution (:func:`compile_library`).  Sources are copied into
the program's directory, so compiling in a sandbox needs nothing outside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from memorization.hpc_code.problems import MPI_MODELS, Problem
from memorization.hpc_code.sandbox import SandboxLimits, SandboxResult, memory_limited, run_sandboxed, system_paths


@dataclass(frozen=True)
class RunConfig:
    """How candidates are built and run."""

    workers: tuple[int, ...] = (1, 2)  # OpenMP threads / MPI ranks to run with
    threads_per_rank: int = 2  # OpenMP threads of each MPI rank in mpi+omp runs
    quick: bool = False  # small inputs, one run per worker count (tests)
    repeats: int = 3  # timed runs per worker count, each on fresh inputs; the best time counts
    run_limits: SandboxLimits = SandboxLimits()
    build_limits: SandboxLimits = SandboxLimits(timeout_s=120.0, memory_mb=None)
    cc: str = "gcc"
    mpicc: str = "mpicc"
    mpiexec: str = "mpiexec"
    cflags: tuple[str, ...] = ("-O2", "-fopenmp", "-std=gnu17")
    keep_dirs: bool = False

    def worker_counts(self, problem: Problem) -> tuple[int, ...]:
        """The worker counts n a problem runs with: cores a run may use (ranks x threads for mpi+omp)."""
        if problem.model == "serial":
            return (1,)
        if problem.model == "mpi+omp":
            return tuple(r * self.threads_per_rank for r in self.workers)
        return self.workers

    def layout(self, problem: Problem, workers: int) -> tuple[int, int]:
        """(MPI ranks, OpenMP threads per rank) of a run with ``workers`` workers."""
        if problem.model == "mpi+omp":
            return workers // self.threads_per_rank, self.threads_per_rank
        if problem.model == "mpi":
            return workers, 1
        return 1, workers

    def size(self, problem: Problem) -> int:
        return problem.quick_size if self.quick else problem.size

    def runs(self) -> int:
        return 1 if self.quick else self.repeats


def tool(name: str) -> str:
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
    if set(models) & set(MPI_MODELS):
        names |= {cfg.mpicc, cfg.mpiexec}
    for name in sorted(names):
        tool(name)


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


def candidate_env(threads: int) -> dict[str, str]:
    """The whole environment a sandboxed program gets (no inherited secrets; the sandbox sets HOME and TMPDIR)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    return {
        "PATH": path,
        "LANG": "C",
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "passive",  # oversubscribed MPI ranks must not spin
        "OMPI_MCA_plm_rsh_agent": "",  # Open MPI: single node, do not look for ssh/rsh
    }


def tool_dirs(cfg: RunConfig, model: str) -> tuple[str, ...]:
    """Install prefixes of the tools ``model`` needs that a sandbox does not show already (e.g. a cluster's
    MPI module): bound read-only into it."""
    names = [cfg.mpicc, cfg.mpiexec] if model in MPI_MODELS else [cfg.cc]
    shown = system_paths()
    dirs = set()
    for name in names:
        path = Path(tool(name))
        prefix = path.parent.parent if path.parent.name == "bin" else path.parent
        if not any(str(path).startswith(s.rstrip("/") + "/") for s in shown):
            dirs.add(str(prefix))
    return tuple(sorted(dirs))


def _compiler(problem: Problem, cfg: RunConfig) -> str:
    return tool(cfg.mpicc if problem.uses_mpi else cfg.cc)


def compile_library(problem: Problem, body: str, workdir: str | Path, cfg: RunConfig,
                    name: str = "candidate") -> SandboxResult:
    """Compile prompt + ``body`` alone into the shared library ``workdir/<name>.so``, sandboxed.

    Every symbol must resolve (``--no-undefined``), so a wrong call is a build error here,
    not a failed load at run time.
    """
    wd = Path(workdir)
    (wd / f"{name}.c").write_text(problem.prompt + body)
    cmd = [_compiler(problem, cfg), *cfg.cflags, "-fPIC", "-shared", f"{name}.c", "-o", f"{name}.so", "-lm",
           "-Wl,--no-undefined"]
    return run_sandboxed(cmd, wd, cfg.build_limits, candidate_env(1), ro=tool_dirs(cfg, problem.model))


def compile_driver(problem: Problem, workdir: str | Path, cfg: RunConfig, main: str) -> SandboxResult:
    """Compile the problem's driver with ``main`` into ``workdir/prog`` (trusted: no candidate code).

    The driver's calls to the candidate's function go through ``hpc_kernel``, a pointer the
    runner sets from the library it loads (see ``hpc_harness.h``).
    """
    wd = Path(workdir)
    for src in (problem.driver_path, problem.harness_dir / "hpc_harness.h", problem.harness_dir / main):
        shutil.copyfile(src, wd / src.name)
    fn = problem.function
    cmd = [_compiler(problem, cfg), *cfg.cflags, f"-D{fn}=(*hpc_kernel)", f'-DHPC_KERNEL_NAME="{fn}"', "-I.",
           problem.driver_path.name, main, "-o", "prog", "-lm", "-ldl"]
    return run_sandboxed(cmd, wd, cfg.build_limits, candidate_env(1), ro=tool_dirs(cfg, problem.model))


def launch(problem: Problem, workdir: str | Path, cfg: RunConfig, workers: int, program: str | Path,
           args: list[str], ro: tuple[str, ...] = ()) -> SandboxResult:
    """Run ``program args`` in ``workdir`` with ``workers`` workers, sandboxed: OpenMP threads, MPI ranks
    (``mpiexec -n``) or ranks x threads (:meth:`RunConfig.layout`); ``ro`` are extra host paths the run may read
    (the trusted runner's directory)."""
    limits = cfg.run_limits
    cmd = [str(program), *args]
    ranks, threads = cfg.layout(problem, workers)
    if problem.uses_mpi:  # memory limit per rank, not on the launcher
        launcher = tool(cfg.mpiexec)
        cmd = [launcher, *mpiexec_flags(launcher), "-n", str(ranks), *memory_limited(cmd, limits.memory_mb)]
        limits = replace(limits, memory_mb=None)
    return run_sandboxed(cmd, workdir, limits, candidate_env(threads), ro=(*tool_dirs(cfg, problem.model), *ro))


def tail_text(text: str, limit: int = 1500) -> str:
    """The last ``limit`` characters of ``text`` (stripped), with ``...`` before them when cut: what a report
    keeps of a compiler's or a candidate's output."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]
