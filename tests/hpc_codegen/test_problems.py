"""hpc_codegen/problems.py: the suite's shape, and a broken task file reported while the rest runs."""
from __future__ import annotations

import shutil

from hpc_codegen import load_suite
from hpc_codegen.problems import MODELS, default_suite_dir
from hpc_codegen.translation import SHORT
from tests.support import hpc_code_report


def test_suite_has_five_problems_per_type_each_in_every_model():
    """ParEval's breadth: 12 types x 5 problems x {serial, OpenMP, MPI, MPI+OpenMP, Kokkos, CUDA, HIP} = 420
    prompts, each problem's seven prompts asking for one function (its name unique in the suite) on one driver."""
    problems, errors = load_suite()
    assert not errors
    assert len(problems) == 420
    by_problem: dict[tuple[str, str], list] = {}
    for p in problems:
        by_problem.setdefault((p.type, p.function), []).append(p)
        assert p.name == f"{p.type}_{p.function}_{SHORT[p.model]}", p.name
    types = {t for t, _ in by_problem}
    assert len(types) == 12 and len(by_problem) == 60
    assert all(sum(t == u for u, _ in by_problem) == 5 for t in types) and len(MODELS) == 7
    for key, ps in by_problem.items():
        assert sorted(p.model for p in ps) == sorted(MODELS) and len({p.driver_path for p in ps}) == 1, key
    assert len({f for _, f in by_problem}) == 60


def test_broken_task_file_is_reported_and_rest_runs(tmp_path):
    suite = tmp_path / "suite"
    src = default_suite_dir()
    shutil.copytree(src / "harness", suite / "harness")
    shutil.copytree(src / "drivers", suite / "drivers")
    (suite / "problems").mkdir()
    shutil.copy(src / "problems" / "reduce_array_sum_serial.yaml", suite / "problems")
    (suite / "problems" / "broken.yaml").write_text("name: broken\nprompt: [unclosed\n")
    (suite / "problems" / "incomplete.yaml").write_text("name: incomplete\nmodel: serial\n")
    problems, errors = load_suite(suite)
    assert [p.name for p in problems] == ["reduce_array_sum_serial"]
    assert {e.name for e in errors} == {"broken", "incomplete"}
    assert any("cannot parse" in e.error for e in errors) and any("missing keys" in e.error for e in errors)
    report = hpc_code_report("--use-references", "--quick", "--suite", str(suite))
    assert report["problems"] == 1 and report["pass@1"] == 1.0
    assert {t["name"] for t in report["task_errors"]} == {"broken", "incomplete"}
