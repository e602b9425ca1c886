"""memorization/evaluations.py: one registry of the evaluations, name -> config -> library function."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from memorization import evaluations as ev


@pytest.mark.parametrize("name, function", [("mia", "memorization.mia:run_mia"),
                                            ("downstream", "memorization.downstream:run_downstream")])
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
    import memorization.mia

    seen = {}
    monkeypatch.setattr(memorization.mia, "run_mia", lambda *a, **k: seen.update(k) or {"ok": True})
    cfg = ev.MiaConfig("model_dir", "manifest.json", k=0.3, batch_size=2)
    assert ev.evaluate("mia", cfg) == {"ok": True}
    assert seen == {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}


def test_an_unknown_evaluation_or_another_evaluations_config_is_refused():
    with pytest.raises(ValueError, match="unknown evaluation 'extraction': choose from extract, mia, downstream, hpc-code"):
        ev.evaluate("extraction", ev.MiaConfig("m", "x"))
    with pytest.raises(TypeError, match="'downstream' takes a DownstreamConfig, got a MiaConfig"):
        ev.evaluate("downstream", ev.MiaConfig("m", "x"))
