"""memorization/evaluation/registry.py: one registry of the evaluations, name -> config -> library function."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from memorization.evaluation import registry as ev


@pytest.mark.parametrize("name, function", [("mia", "memorization.evaluation.mia:run_mia"),
                                            ("downstream", "memorization.evaluation.downstream:run_downstream")])
def test_a_config_has_its_functions_parameters_with_the_same_defaults(name, function):
    """A config's fields are its function's parameters, by name and default: a setting left at its default in the
    config runs as the function's default (a config default that drifted would change results silently)."""
    import importlib

    module, attr = function.split(":")
    params = inspect.signature(getattr(importlib.import_module(module), attr)).parameters
    fields = {f.name: f for f in dataclasses.fields(ev.EVALUATIONS[name].config)}
    assert list(fields) == list(params)
    for n, p in params.items():
        default = fields[n].default
        assert (default is dataclasses.MISSING) == (p.default is inspect.Parameter.empty), n
        if default is not dataclasses.MISSING:
            assert default == p.default, n


def test_evaluate_runs_the_function_with_the_configs_settings(monkeypatch):
    """``evaluate(name, config)`` calls the evaluation's function with the config's settings as given."""
    import memorization.evaluation.mia

    seen = {}
    monkeypatch.setattr(memorization.evaluation.mia, "run_mia", lambda *a, **k: seen.update(k) or {"ok": True})
    cfg = ev.MiaConfig("model_dir", "manifest.json", k=0.3, batch_size=2)
    assert ev.evaluate("mia", cfg) == {"ok": True}
    assert seen == {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def test_an_unknown_evaluation_or_another_evaluations_config_is_refused():
    with pytest.raises(ValueError, match="unknown evaluation 'extraction': choose from extract, mia, downstream, hpc-code"):
        ev.evaluate("extraction", ev.MiaConfig("m", "x"))
    with pytest.raises(TypeError, match="'downstream' takes a DownstreamConfig, got a MiaConfig"):
        ev.evaluate("downstream", ev.MiaConfig("m", "x"))


@pytest.mark.parametrize("name", list(ev.EVALUATIONS))
def test_a_config_file_reads_back_as_the_same_config(name, tmp_path):
    """``dump_config`` then ``load_config`` gives an equal config, paths and tuples included (the settings a job
    step runs are the ones it was generated with)."""
    from pathlib import Path

    required = {"extract": {"model": "m", "manifest": "x.json", "grid": "1,2,1,1"},
                "mia": {"model_path": "m", "manifest_path": "x.json", "max_length": 64},
                "downstream": {"model_path": "m", "tasks": ("goldfish_mc", "arc_easy"), "limit": 0.5},
                "hpc-code": {"model": "m", "problems": ("sort_*",), "workers": (1, 4), "output": Path("o.json")}}[name]
    cfg = ev.EVALUATIONS[name].config(**required)
    path = tmp_path / "step.yaml"
    path.write_text(ev.dump_config(name, cfg))
    assert ev.load_config(name, path) == cfg


def test_the_entry_point_runs_the_evaluation_of_its_config_file(monkeypatch, tmp_path, capsys):
    """``python -m memorization.evaluation mia --config FILE`` calls the evaluation's function with the file's
    settings, and the others at their defaults; it prints the report."""
    import memorization.evaluation.mia

    seen = {}
    monkeypatch.setattr(memorization.evaluation.mia, "run_mia", lambda **k: seen.update(k) or {"markdown": "| auc |"})
    path = tmp_path / "mia.yaml"
    path.write_text("model_path: run/standard/checkpoint\nmanifest_path: run/manifest.json\ngrid: 1,2,1,1\nk: 0.1\n")
    assert ev.main(["mia", "--config", str(path)]) == 0
    assert seen == ev.config_to_mapping(ev.MiaConfig("run/standard/checkpoint", "run/manifest.json", grid="1,2,1,1",
                                                     k=0.1))
    assert capsys.readouterr().out.strip() == "| auc |"


def test_a_bad_config_file_is_refused_before_anything_runs(monkeypatch, tmp_path, capsys):
    """An unknown setting (with the closest one named), a missing required one, or a file that is not a mapping:
    one line, exit status 2, the evaluation never called."""
    import memorization.evaluation.mia

    monkeypatch.setattr(memorization.evaluation.mia, "run_mia", lambda **k: pytest.fail("ran"))
    path = tmp_path / "mia.yaml"
    for text, want in (("model_path: m\nmanifest_path: x\nbatch: 4\n", "unknown setting 'batch'; did you mean "
                                                                        "batch_size?"),
                       ("model_path: m\n", "mia: give manifest_path"),
                       ("- m\n", "give a mapping of the mia settings")):
        path.write_text(text)
        assert ev.main(["mia", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1, err
