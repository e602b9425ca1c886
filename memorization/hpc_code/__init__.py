"""HPC-code evaluation: can a model write correct *and fast* serial C, OpenMP and MPI code?

A ParEval-style suite (``data/hpc_code``) of problems we wrote ourselves: each
problem has a prompt (C signature + description that the model completes), a
reference solution and a C driver that checks the candidate against a serial
baseline it computes itself and times both.  The runner builds and runs every
candidate in a sandbox (temp dir, time/memory/output limits, no network) and
reports pass@k, build@k and speedup_n@k.  HumanEval (Python) runs through the
same sandbox.

Modules: :mod:`.problems` (suite loading), :mod:`.sandbox` (limited
subprocesses), :mod:`.extract` (completion -> function body), :mod:`.harness`
(build/run/classify one C candidate), :mod:`.humaneval`, :mod:`.metrics`,
:mod:`.generate` (HF sampling) and :mod:`.runner` (whole evaluations).
"""

from memorization.hpc_code.metrics import pass_at_k, speedup_at_k
from memorization.hpc_code.problems import Problem, TaskError, load_suite
from memorization.hpc_code.sandbox import SandboxLimits, run_sandboxed

STATUSES = ("passed", "wrong_output", "runtime_error", "timeout", "build_error")

__all__ = [
    "STATUSES",
    "Problem",
    "SandboxLimits",
    "TaskError",
    "load_suite",
    "pass_at_k",
    "run_sandboxed",
    "speedup_at_k",
]
