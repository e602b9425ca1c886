"""Completions from any model or tool (hpc_codegen/completions.py, ``eval/hpc_code.py --completions``)
and the report's tables and plot (hpc_codegen/report.py)."""
from __future__ import annotations

import json

import pytest

from hpc_codegen import load_suite
from hpc_codegen.completions import CompletionsError, load_completions
from tests.support import load_eval_cli


@pytest.mark.parametrize("text, match", [
    ('{"problem": "a", "completion": "x"}\nnot json\n', "line 2: not JSON"),
    ('["a", "x"]\n', "line 1: expected an object"),
    ('\n{"problem": "a"}\n', "line 2: missing completion"),
    ('{"problem": "a", "completion": "x", "benchmark": "mbpp"}\n', "line 1: benchmark 'mbpp'"),
    ('{"problem": "a", "completion": 3}\n', "line 1: .* must be strings"),
    ("\n\n", "no completions in it"),
])
def test_a_malformed_completions_file_is_refused_with_its_line(tmp_path, text, match):
    f = tmp_path / "c.jsonl"
    f.write_text(text)
    with pytest.raises(CompletionsError, match=match):
        load_completions(f)


def test_completions_of_another_tool_are_scored_as_samples_and_reported(tmp_path, capsys):
    """Two samples per problem, the reference and a wrong one: pass@1 = 0.5, pass@2 = 1 on each; the JSON, the
    markdown tables (headline per execution model, rows per type, samples by outcome: the OpenMP reference uses
    OpenMP, the empty body does not) and the plot are written; a problem the suite does not have is refused before
    any work."""
    problems, _ = load_suite(patterns=["reduce_array_sum_serial", "sort_sort_ints_omp"])
    rows = []
    for p in problems:
        rows += [{"problem": p.name, "completion": p.reference + "\nint unused;\n"},  # cut at the function's end
                 {"problem": p.name, "completion": "}\n"}]  # builds, wrong (or empty) answer
    f = tmp_path / "other_tool.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report.json"
    cli = load_eval_cli("hpc_code")
    assert cli.main(["--completions", str(f), "--quick", "--k", "1", "2", "--no-progress", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["problems"] == 2 and report["samples_per_problem"] == 2
    for r in report["results"]:
        assert r["pass@1"] == pytest.approx(0.5) and r["pass@2"] == 1.0 and r["build@1"] == 1.0
        assert set(r["speedup_max@k"]) == set(r["efficiency_max@k"]) == {"1", "2"}
    assert set(report["by_type"]) == {"reduce", "sort"} and set(report["by_model"]) == {"serial", "openmp"}
    assert "efficiency@1" in report and "speedup_max@2" in report
    assert report["outcomes"]["openmp"] == {**report["outcomes"]["openmp"], "samples": 2, "passed": 1,
                                            "wrong output": 1, "uses_api": 1, "passed_with_api": 1}
    assert report["outcomes"]["serial"]["uses_api"] is None
    md = out.with_suffix(".md").read_text()
    assert "| pass@1 | 0.500 |" in md and "| reduce | 1 | 0.500 |" in md and "efficiency_2@1" in md
    assert "| openmp | 2 | 1 | 1 | 1 |" in md  # samples, uses_api, passed_with_api, passed
    assert out.with_suffix(".png").stat().st_size > 10_000
    f.write_text(f.read_text() + json.dumps({"problem": "reduce_array_sum_serial_typo", "completion": "}"}) + "\n")
    assert cli.main(["--completions", str(f), "--quick", "--no-progress"]) == 2
    assert "not in the selected suite: reduce_array_sum_serial_typo" in capsys.readouterr().err
