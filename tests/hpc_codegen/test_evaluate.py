"""hpc_codegen/evaluate.py: the HPC-code evaluation as a library call, and eval/hpc_code.py as its shell."""
from __future__ import annotations

import dataclasses

import pytest

from hpc_codegen import evaluate as ev
from tests.support import load_eval_cli


def test_every_flag_of_the_cli_is_a_field_of_the_config_and_reaches_it():
    """Each option of ``eval/hpc_code.py`` (but the CLI's own --json and --no-progress) is the config field of the
    same name, and a value given on the command line is the config's."""
    cli = load_eval_cli("hpc_code")
    dests = {a.dest for a in cli.build_parser()._actions if a.dest != "help"} - {"json", "no_progress"}
    fields = {f.name for f in dataclasses.fields(ev.HpcCodeConfig)} - {"progress", "print_tables"}
    assert dests == fields
    args = cli.build_parser().parse_args(["--model", "m", "--samples", "3", "--top-p", "0.5", "--workers", "1,4",
                                          "--k", "1", "2", "--problems", "a*", "--json", "--no-progress"])
    cfg = cli.config_of(args)
    assert (cfg.model, cfg.samples, cfg.top_p, cfg.workers, cfg.k, cfg.problems) == ("m", 3, 0.5, (1, 4), (1, 2),
                                                                                     ("a*",))
    assert not cfg.progress and not cfg.print_tables and cfg.temperature == ev.HpcCodeConfig().temperature


@pytest.mark.parametrize("changes, match", [
    ({"k": (0,)}, "--k values must be >= 1"),
    ({"grid": "1,2,1,1"}, "--grid runs generation on a grid: it needs --model"),
    ({"top_p": 0.0}, "out of range: --top-p 0.0"),
    ({"benchmarks": "hpc,mbpp"}, "unknown benchmark"),
    ({"launcher_args": "'unclosed"}, "--launcher-args"),
])
def test_a_refused_setting_is_an_error_before_any_problem_is_loaded(monkeypatch, changes, match):
    """A setting out of range is one :class:`HpcCodeError` line, raised before the suite is read."""
    monkeypatch.setattr(ev, "load_suite", lambda *a, **k: pytest.fail("loaded the suite before checking settings"))
    with pytest.raises(ev.HpcCodeError, match=match):
        ev.evaluate_hpc_code(dataclasses.replace(ev.HpcCodeConfig(use_references=True), **changes))
