"""HPC-code evaluation: can a model write correct *and fast* serial C, OpenMP, MPI, Kokkos, CUDA and HIP code?

A ParEval-style suite (``data/hpc_code``) of problems we wrote ourselves: each
problem has a prompt (C signature + description that the model completes), a
reference solution and a C driver.  Every candidate is compiled and run in a
sandbox it cannot see out of (own root, no network, no privileges, limits); its
output is checked and its time taken by trusted programs it cannot reach.
Reports pass@k, build@k and speedup_n@k.  HumanEval (Python) runs through the
same sandbox.

Modules: :mod:`.problems` (suite loading), :mod:`.sandbox` (+ :mod:`.sandbox_init`:
isolated, limited commands), :mod:`.toolchain` (compilers, launcher), :mod:`.kokkos`
and :mod:`.gpu` (Kokkos installs; GPU compilers, devices and the adapter between a driver and a kernel),
:mod:`.reference` (the trusted programs and baseline of a problem),
:mod:`.code_blocks` (completion -> function body), :mod:`.harness` (build/run/score
one C candidate), :mod:`.humaneval`, :mod:`.metrics`, :mod:`.generate` (HF
sampling) and :mod:`.runner` (whole evaluations).
"""

from hpc_codegen.metrics import pass_at_k, speedup_at_k
from hpc_codegen.problems import Problem, TaskError, load_suite
from hpc_codegen.sandbox import SandboxLimits, run_sandboxed

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
