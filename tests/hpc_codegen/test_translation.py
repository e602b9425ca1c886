"""Translation (portability) tasks (hpc_codegen/translation.py, ``eval/hpc_code.py --tasks``)."""
from __future__ import annotations

import json

import pytest

from hpc_codegen import load_suite
from hpc_codegen.harness import RunConfig, evaluate_c
from hpc_codegen.sandbox import SandboxLimits
from hpc_codegen.translation import PAIRS, SHORT, translation_problems
from tests.support import load_eval_cli


def test_every_problem_gets_each_pair_and_the_prompt_carries_the_renamed_source():
    problems, _ = load_suite()
    tasks = translation_problems(problems)
    assert len(tasks) == len({p.function for p in problems}) * len(PAIRS) == 300
    by_name = {p.name: p for p in problems}
    by_function = {(p.function, p.model): p for p in problems}
    for t in tasks:
        source = by_name[t.name.rsplit("_to_", 1)[0]]
        target = by_function[(t.function, t.model)]
        assert (t.source_model, t.task) == (source.model, "translate") and (source.model, t.model) in PAIRS
        assert t.prompt.endswith(target.prompt) and t.function == target.function
        assert f"{target.function}_{SHORT[source.model]}(" in t.prompt
        assert (t.driver_path, t.reference, t.size) == (target.driver_path, target.reference, target.size)


def test_a_translation_is_built_and_checked_as_its_target():
    """Calling the given serial code is a correct OpenMP translation (it passes) that parallelizes nothing;
    a wrong one fails like the target's would."""
    problems, _ = load_suite(patterns=["reduce_array_sum_*"])
    (task,) = [t for t in translation_problems(problems) if t.name == "reduce_array_sum_serial_to_omp"]
    cfg = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=30.0, memory_mb=1024))
    assert evaluate_c(task, "    return array_sum_serial(x, n);\n}\n", cfg).status == "passed"
    assert evaluate_c(task, "    return array_sum_serial(x, n - 1);\n}\n", cfg).status == "wrong_output"


def test_cli_scores_writing_and_translating_side_by_side(tmp_path):
    out = tmp_path / "r.json"
    rc = load_eval_cli("hpc_code").main(["--use-references", "--quick", "--tasks", "write,translate", "--problems",
                                         "sort_sort_ints_*", "--execution-models", "serial", "openmp", "mpi",
                                         "mpi+omp", "--no-progress", "--output", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["problems"] == 4 + 4 and report["pass@1"] == 1.0
    assert set(report["by_task"]) == {"write", "translate"} and report["by_task"]["translate"]["problems"] == 4
    assert {r["name"] for r in report["results"] if r["task"] == "translate"} == {
        "sort_sort_ints_serial_to_omp", "sort_sort_ints_serial_to_mpi", "sort_sort_ints_omp_to_mpi",
        "sort_sort_ints_mpi_to_mpi_omp"}


def test_cli_refuses_an_unknown_task_kind(capsys):
    assert load_eval_cli("hpc_code").main(["--use-references", "--quick", "--tasks", "port"]) == 2
    assert "--tasks port" in capsys.readouterr().err


@pytest.mark.parametrize("models, expected", [(["mpi"], 2), (["openmp"], 1)])
def test_execution_model_filter_applies_to_the_target(models, expected, tmp_path):
    out = tmp_path / "r.json"
    rc = load_eval_cli("hpc_code").main(["--use-references", "--quick", "--tasks", "translate", "--problems",
                                         "search_find_first_*", "--execution-models", *models, "--no-progress",
                                         "--output", str(out)])
    assert rc == 0 and json.loads(out.read_text())["problems"] == expected


@pytest.mark.slow
def test_every_translation_task_passes_with_the_targets_reference(tmp_path):
    """All 240 translation tasks into C models (60 problems x 4 pairs) are scored as their targets: the target's
    reference passes (into Kokkos: test_kokkos.py)."""
    out = tmp_path / "r.json"
    rc = load_eval_cli("hpc_code").main(["--use-references", "--quick", "--tasks", "translate", "--execution-models",
                                         "openmp", "mpi", "mpi+omp", "--no-progress", "--output", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["problems"] == 240 and report["pass@1"] == 1.0
