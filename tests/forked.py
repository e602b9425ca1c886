"""``python ARGS`` as a fork of one server process that has imported torch, transformers, axonn and the library once.

A fresh interpreter on this machine spends ~7 s of CPU importing torch, transformers and torch._dynamo before a test's
script does anything; on 2 cores that was most of a small grid test's time and of every CLI test's.
``multiprocessing``'s forkserver with preloaded modules (:data:`PRELOAD`) starts a process in milliseconds instead.
Each process gets its own environment (replaced whole), working directory, ``sys.argv``, standard streams (files)
and exit code, and runs its script as ``__main__`` (``runpy``; ``-m`` and ``-c`` too), atexit handlers included: what
differs from ``python ARGS`` is only that the preloaded modules were imported before, with the environment of
:func:`server_env`.  The library therefore reads its environment variables when it runs, not at import.

Tests of how a process starts or dies, of resident memory, and the rehearsals under torchrun, mpiexec and the Slurm
shims start real interpreters.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import subprocess
import tempfile
from pathlib import Path

# what the test processes import anyway: the server imports it once, each process is a fork of it
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "numpy", "transformers",
           "transformers.models.llama.modeling_llama", "axonn", "axonn.checkpoint", "memorization.training.models",
           "memorization.training.train", "memorization.evaluation.eval_model", "memorization.evaluation.extraction",
           "memorization.evaluation.mia", "memorization.evaluation.downstream", "memorization.lm",
           "memorization.evaluation.lm_eval_grid", "hpc_codegen.generate",
           "rouge_score.rouge_scorer"]  # Rouge-L imports nltk and scipy.stats: 3 s of CPU


def server_env() -> dict[str, str]:
    """The environment the preloaded modules are imported under (read at import by torch and transformers)."""
    return {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
            "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1"}


# the process, as code run by ``exec`` in the fork (a builtin: nothing of this module has to be importable there)
_MAIN = """
import atexit, io, os, runpy, sys, traceback
os.environ.clear()
os.environ.update(ENV)
os.chdir(CWD)
for fd, path in ((1, STDOUT), (2, STDERR)):
    f = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(f, fd)
    os.close(f)
sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
code = 0
try:
    if ARGV[0] == "-c":
        sys.argv = ["-c", *ARGV[2:]]
        sys.path.insert(0, "")
        exec(compile(ARGV[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    elif ARGV[0] == "-m":
        sys.argv = [ARGV[1], *ARGV[2:]]
        sys.path.insert(0, CWD)
        runpy.run_module(ARGV[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(ARGV)
        sys.path.insert(0, os.path.dirname(os.path.abspath(ARGV[0])))
        runpy.run_path(ARGV[0], run_name="__main__")
except SystemExit as e:
    if e.code is None or isinstance(e.code, int):
        code = e.code or 0
    else:
        print(e.code, file=sys.stderr)
        code = 1
except BaseException:
    traceback.print_exc()
    code = 1
try:
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
finally:
    os._exit(code)
"""


def _context():
    """The forkserver context, its server started (once per test session) under :func:`server_env`."""
    ctx = multiprocessing.get_context("forkserver")
    if not getattr(_context, "started", False):
        ctx.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        os.environ.update(server_env())
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _context.started = True
    return ctx


class Forked:
    """``python argv`` as a fork of the server, with the part of :class:`subprocess.Popen`'s interface tests use.

    ``argv``: a script path and its arguments, or ``["-m", module, ...]``, or ``["-c", code, ...]``.  Its output
    goes to the files ``stdout`` and ``stderr`` (one path for both is fine; they must exist)."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout: str, stderr: str, cwd: str | None = None) -> None:
        names = {"ENV": dict(env), "CWD": str(cwd or os.getcwd()), "STDOUT": stdout, "STDERR": stderr,
                 "ARGV": [str(a) for a in argv]}
        self.proc = _context().Process(target=exec, args=(_MAIN, names), daemon=False)
        self.proc.start()
        self.pid = self.proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    @property
    def returncode(self) -> int | None:
        return self.proc.exitcode

    def kill(self) -> None:
        self.proc.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self.proc.join(timeout)
        return self.proc.exitcode


def run_python(argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
               timeout: float = 300, check: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)`` as a fork of the server:
    the same result (return code, stdout, stderr); past ``timeout`` the process is killed and
    :class:`subprocess.TimeoutExpired` raised; ``check``: a non-zero exit raises
    :class:`subprocess.CalledProcessError`."""
    with tempfile.TemporaryDirectory(prefix="forked_") as d:
        out, err = Path(d) / "stdout", Path(d) / "stderr"
        out.touch()
        err.touch()
        p = Forked(argv, dict(os.environ if env is None else env), str(out), str(err), cwd)
        p.wait(timeout)
        if p.poll() is None:
            p.kill()
            p.wait()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        done = subprocess.CompletedProcess(argv, p.returncode, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
    if check:
        done.check_returncode()
    return done
