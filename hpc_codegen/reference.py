"""What the verdicts on one problem rest on, built and kept where no candidate can reach it.

For each problem, in a private directory of which a candidate's sandbox shows only ``bin/``
(read-only):

- ``bin/prog`` -- the runner: the driver + ``main_run_*.c``.  It builds a run's inputs, then
  opens the timed window, loads the candidate's shared library, calls its function once,
  writes the output and closes the window (see ``data/hpc_code/harness``);
- ``check/prog`` -- the reference program: the driver + ``main_ref.c``.  It writes the
  serial baseline's output for a seed (``baseline``, timing the kernel alone), and checks a
  candidate's output file against the baseline's (``check``);
- ``null/reference.so`` -- the reference solution as a library, for the null runs: the
  runner's window without the call, under the same launcher, which also reports the
  number of threads/ranks it got.

Timing is decided by trusted code, never inside a candidate's process: a program's time is
its window (:attr:`SandboxResult.window_s`, timestamped by the sandbox's init, which ends
the run when the window closes), and a kernel's time is the best run's window minus the
best null run's with the same workers --
``baseline_s = min W(ref baseline)``,
``candidate_s(w) = min W(candidate, w) - min W(runner skip, w)`` --
each floored at :data:`TIMING_FLOOR_S`.  Every timed run uses fresh inputs (its own
random seed), so nothing learnt in one run helps the next.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hpc_codegen.problems import Problem
from hpc_codegen.sandbox import SandboxResult, run_sandboxed
from hpc_codegen.toolchain import (RunConfig, candidate_env, compile_driver, compile_library, launch,
                                   tail_text, tool_dirs)

TIMING_FLOOR_S = 1e-5  # shorter kernel times are floored (speedups of trivial kernels stay finite)


class SetupError(RuntimeError):
    """The trusted programs of a problem could not be built or run: a fault of the suite or the machine."""


@dataclass
class Reference:
    """The trusted programs, baseline outputs and timings of one problem (picklable: shared by its samples)."""

    problem: Problem
    dir: Path
    n: int
    seeds: tuple[int, ...]
    baseline_s: float = 0.0
    null_s: dict[int, float] = field(default_factory=dict)

    @property
    def runner(self) -> Path:
        return self.dir / "bin" / "prog"

    def want(self, seed: int) -> Path:
        return self.dir / "check" / f"want_{seed}.bin"

    def check(self, seed: int, got: Path, timeout_s: float) -> tuple[bool, str]:
        """(correct, what differs): the candidate output file ``got`` against the baseline's for ``seed``."""
        cmd = [str(self.dir / "check" / "prog"), "check", str(self.n), str(seed), str(self.want(seed)), str(got)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=max(timeout_s, 30.0))
        line = next((ln for ln in res.stdout.splitlines() if ln.startswith("HPC_CHECK ")), None)
        if res.returncode != 0 or line is None:
            raise SetupError(f"{self.problem.name}: the checker failed: {tail_text(res.stderr or res.stdout, 400)}")
        verdict, _, msg = line[len("HPC_CHECK "):].partition(" ")
        return verdict == "ok", msg

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _window(res: SandboxResult, what: str, problem: Problem) -> float:
    if res.returncode != 0 or res.window_s is None:
        reason = "timed out" if res.timed_out else f"exit code {res.returncode}"
        raise SetupError(f"{problem.name}: {what} failed ({reason}): {tail_text(res.stderr or res.stdout, 400)}")
    return res.window_s


def _build(problem: Problem, cfg: RunConfig, private: Path) -> None:
    for sub in ("bin", "check", "null"):
        (private / sub).mkdir()
    main = "main_run_mpi.c" if problem.uses_mpi else "main_run_omp.c"
    for what, res in (("runner", compile_driver(problem, private / "bin", cfg, main)),
                      ("reference program", compile_driver(problem, private / "check", cfg, "main_ref.c")),
                      ("reference solution", compile_library(problem, problem.reference, private / "null", cfg,
                                                             name="reference"))):
        if res.returncode != 0:
            raise SetupError(f"{problem.name}: the {what} does not build: {tail_text(res.stderr or res.stdout, 600)}")


def prepare_reference(problem: Problem, cfg: RunConfig) -> Reference:
    """Build the trusted programs of ``problem`` and time the baseline and the null runs (see the module docstring).

    Raises :class:`SetupError` when they do not build or run, or when the launcher does not
    give the null run the worker count asked for (e.g. an ``mpiexec`` of another MPI than ``mpicc``).
    """
    private = Path(tempfile.mkdtemp(prefix=f"hpc_ref_{problem.name}_", dir=cfg.scratch()))
    try:
        _build(problem, cfg, private)
        n = cfg.size(problem)
        ref = Reference(problem, private, n, tuple(secrets.randbits(62) for _ in range(cfg.runs())))
        check, tools = private / "check", tool_dirs(cfg, problem.model)
        base = []
        for seed in ref.seeds:
            res = run_sandboxed(["./prog", "baseline", str(n), str(seed), ref.want(seed).name], check, cfg.run_limits,
                                candidate_env(1), ro=tools, end_at_mark=False)
            base.append(_window(res, "the baseline", problem))
        ref.baseline_s = max(min(base), TIMING_FLOOR_S)
        for workers in cfg.worker_counts(problem):
            times = []
            for seed in ref.seeds:
                res = launch(problem, private / "null", cfg, workers, ref.runner,
                             [str(n), str(seed), "out.bin", "./reference.so", "skip"], ro=(str(ref.runner.parent),))
                times.append(_window(res, f"the null run with {workers} worker(s)", problem))
                report = private / "null" / "workers"
                got = report.read_text().strip() if report.is_file() else None
                if got != str(workers):
                    launcher = f"{cfg.mpiexec} x OMP_NUM_THREADS" if problem.uses_mpi else "OMP_NUM_THREADS"
                    raise SetupError(f"{problem.name}: asked for {workers} worker(s), {launcher} gave "
                                         f"{got or 'none reported'} (an mpiexec from another MPI than mpicc?)")
            ref.null_s[workers] = min(times)
        return ref
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise


def take_output(src: Path, dst: Path, max_bytes: int) -> str | None:
    """Copy a candidate's output file out of its work directory; the reason when there is none to take.

    ``src`` is the candidate's to shape: it is opened without following a symlink or blocking
    on a FIFO, and must be a regular file of at most ``max_bytes``.
    """
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "the program wrote no output file (did it exit early?)"
    except OSError as exc:
        return f"its output file cannot be read: {exc.strerror}"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "its output file is not a regular file"
        if st.st_size > max_bytes:
            return f"its output file has {st.st_size} bytes, more than {max_bytes}"
        with open(dst, "wb") as out:
            shutil.copyfileobj(f, out)
    return None
