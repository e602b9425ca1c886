"""The experiment as a library call: YAML configs and flags give one config, the run writes it back, bad
configs are refused before any work, --init gets fine-tuning defaults, and the sweep calls the library."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from memorization.launch import sweep as sw
from memorization.experiment import (ConfigError, ExperimentConfig, Training, load_config, resolve, run_experiment,
                                     validate)
from memorization.experiment.cli import config_from_argv, explicit_values, to_argv
from tests.support import REPO

sys.path.insert(0, str(REPO / "recipes"))
import memorize  # noqa: E402

TINY = ["--num-targets", "2", "--num-nonmembers", "2", "--exposures", "1", "--steps", "2", "--arms", "standard",
        "--prefix", "10", "--suffix", "10", "--seq-len", "64", "--no-progress", "--extract-batch", "4"]


def _yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_yaml_file_gives_the_config_the_same_flags_give(tmp_path):
    f = _yaml(tmp_path / "x.yaml", {"model": {"size": "mini"}, "data": {"exposures": [1, 4], "seq_len": 64},
                                    "goldfish": {"k": 8, "h": 7}, "training": {"steps": 12, "lr": 1e-3},
                                    "execution": {"overlap": False}, "extraction": {"batch": 3}})
    flags = ["--size", "mini", "--exposures", "1,4", "--seq-len", "64", "--goldfish-k", "8", "--goldfish-h", "7",
             "--steps", "12", "--lr", "1e-3", "--no-overlap", "--extract-batch", "3"]
    from_file = config_from_argv(["--config", str(f)])
    assert from_file == config_from_argv(flags)
    assert from_file.training.lr == 1e-3 and from_file.data.exposures == "1,4" and from_file.extraction.batch == 3
    assert from_file != config_from_argv([])  # the file did change something


def test_a_flag_given_overrides_the_file(tmp_path):
    f = _yaml(tmp_path / "x.yaml", {"training": {"steps": 12, "lr": 1e-3}, "goldfish": {"k": 8}})
    cfg = config_from_argv(["--config", str(f), "--steps", "5", "--goldfish-k", "4"])
    assert (cfg.training.steps, cfg.training.lr, cfg.goldfish.k) == (5, 1e-3, 4)  # k 4 is the default, given
    assert explicit_values(["--steps", "5", "--no-overlap"]) == {"steps": 5, "overlap": False}


@pytest.mark.parametrize("data, message", [
    ({"training": {"learnng_rate": 1e-3}}, r"unknown key training\.learnng_rate in \S*x\.yaml; did you mean "
                                           r"training\.lr\?"),
    ({"goldfish": {"goldfish_k": 8}}, r"unknown key goldfish\.goldfish_k in \S*x\.yaml; did you mean goldfish\.k\?"),
    ({"trainig": {"lr": 1e-3}}, r"unknown key trainig in \S*x\.yaml; did you mean training\?"),
    ({"training": {"steps": "12"}}, r"training\.steps in \S*x\.yaml: '12' is not a int"),
])
def test_an_unknown_key_is_refused_naming_the_closest(tmp_path, data, message):
    f = _yaml(tmp_path / "x.yaml", data)
    with pytest.raises(ConfigError, match=message):
        load_config(f)
    with pytest.raises(SystemExit, match=message):  # and from the command line, before anything runs
        memorize.main(["--config", str(f), "--out", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_the_run_writes_its_resolved_config_which_runs_it_again(tmp_path):
    out = tmp_path / "run"
    argv = TINY + ["--corpus", str(_small_corpus(tmp_path)), "--out", str(out)]
    first = memorize.main(argv)
    written = load_config(out / "config.yaml")
    assert written == memorize.parse_args(argv)  # resolved: every default filled in, nothing left to the reader
    assert written.data.seq_len == 64 and written.training.batch_size == 4 and written.training.lr == 3e-3
    assert json.loads((out / "run_config.json").read_text())["steps"] == 2
    again = memorize.main(["--config", str(out / "config.yaml"), "--resume"])  # the same settings: --resume accepts
    assert again["arms"]["standard"]["loss_curve"] == first["arms"]["standard"]["loss_curve"]


def _small_corpus(tmp_path: Path, n: int = 120) -> Path:
    from memorization.data.corpus import build_default_corpus

    path = tmp_path / "small.jsonl"
    path.write_text("".join(build_default_corpus().read_text().splitlines(keepends=True)[:n]))
    return path


def test_init_gets_fine_tuning_defaults():
    scratch, tune = config_from_argv([]), config_from_argv(["--init", "/ckpt"])
    assert (scratch.training.lr, scratch.training.warmup_steps, scratch.training.weight_decay) == (3e-3, 10, 0.0)
    assert (tune.training.lr, tune.training.warmup_steps, tune.training.weight_decay) == (2e-5, 30, 0.1)
    assert config_from_argv(["--init", "/ckpt", "--steps", "0"]).training.warmup_steps is None  # 3% of the filled
    assert config_from_argv(["--init", "/ckpt", "--lr", "1e-4", "--weight-decay", "0"]).training.weight_decay == 0
    assert resolve(tune) == tune


def _checkpoint(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, vocab_size=64)).save_pretrained(path)
    return path


@pytest.fixture
def no_work(monkeypatch):
    """Any model or data work fails the test: a refusal must come first."""
    def work(*a, **k):
        raise AssertionError("model or data work started")

    import memorization.experiment.run as run

    for target in ("memorization.data.corpus.load_documents", "memorization.data.corpus.load_tokenizer",
                   "memorization.training.models.build_model", "memorization.data.mixture.build_mixture"):
        monkeypatch.setattr(target, work)
    monkeypatch.setattr(run, "load_run_tokenizer", work)
    monkeypatch.setattr(run, "make_runtime", work)


def test_a_high_lr_with_init_is_refused_unless_acknowledged(tmp_path, no_work):
    ckpt = str(_checkpoint(tmp_path / "ckpt"))
    argv = ["--init", ckpt, "--lr", "3e-3", "--out", str(tmp_path / "run")]
    with pytest.raises(ConfigError, match=r"--lr 0.003 with --init: a learning rate above 0.001 .* --allow-high-lr"):
        memorize.main(argv)
    with pytest.raises(ConfigError, match="allow_high_lr"):  # the same refusal for a library caller
        run_experiment(ExperimentConfig(model=replace(ExperimentConfig().model, init=ckpt), training=Training(lr=3e-3)))
    validate(config_from_argv(argv + ["--allow-high-lr"]))  # acknowledged
    validate(config_from_argv(["--init", ckpt, "--lr", "1e-3", "--out", str(tmp_path / "run")]))  # at the threshold


@pytest.mark.parametrize("cfg, match", [
    (ExperimentConfig(training=Training(lr=-1.0)), r"--lr -1.0 \(must be finite, > 0\)"),
    (ExperimentConfig(training=Training(micro_batch=3)), "--micro-batch 3 does not divide"),
    (replace(ExperimentConfig(), goldfish=replace(ExperimentConfig().goldfish, strategy="hsah")),
     "unknown goldfish strategy 'hsah'"),
    (replace(ExperimentConfig(), output=replace(ExperimentConfig().output, export_dtype="fp16")),
     "--export-dtype 'fp16': choose from float32, bfloat16"),
    (replace(ExperimentConfig(), goldfish=replace(ExperimentConfig().goldfish, doc_start="drop")),
     "unknown goldfish doc_start 'drop'"),
    (replace(ExperimentConfig(), data=replace(ExperimentConfig().data, placement="recent")),
     "placement 'recent' unknown: choose one of random, spaced, last"),
])
def test_library_callers_get_every_refusal_before_any_work(tmp_path, no_work, cfg, match):
    cfg = replace(cfg, output=replace(cfg.output, out=str(tmp_path / "run")))
    with pytest.raises(ConfigError, match=match):
        run_experiment(cfg)


def test_to_argv_inverts_explicit_values():
    argv = ["--steps", "5", "--no-overlap", "--compile", "--lr", "0.001", "--init", "/c"]
    assert explicit_values(to_argv(explicit_values(argv))) == explicit_values(argv)


def test_the_sweep_runs_cells_through_the_library(tmp_path, monkeypatch):
    seen = []

    def fake(cfg):
        seen.append(cfg)
        out = Path(cfg.output.out)
        (out / "standard").mkdir(parents=True, exist_ok=True)
        (out / "standard" / "sweep_eval.json").write_text(json.dumps({"options": sw._opts_key(opts)}))
        return {"arms": {"standard": {"steps": cfg.training.steps}}}

    monkeypatch.setattr(sw, "run_experiment", fake)  # the default runner is the library function
    opts = sw.EvalOptions(device="cpu")
    cell = sw.expand_grid("mini", "8", "0,4")[0]
    rec = sw.run_cell(cell, tmp_path, config_from_argv(["--steps", "12", "--lr", "1e-3"]), opts)
    assert rec["status"] == "ok" and len(seen) == 1 and isinstance(seen[0], ExperimentConfig)
    cfg = seen[0]
    assert (cfg.model.size, cfg.data.exposures, cfg.goldfish.k, cfg.goldfish.h, cfg.goldfish.arms) == \
        ("mini", "8", 4, 13, "both")
    assert (cfg.training.steps, cfg.training.lr, cfg.output.out, cfg.output.no_progress) == \
        (12, 1e-3, str(tmp_path / "cells" / cell.name), True)
    assert cfg == replace(cell.config(config_from_argv(["--steps", "12", "--lr", "1e-3"]), tmp_path / "cells" /
                                      cell.name))


def test_no_library_module_loads_a_script_or_edits_sys_path():
    offenders = [str(p.relative_to(REPO)) for d in ("memorization", "axonn", "eval") for p in (REPO / d).rglob("*.py")
                 if any(s in p.read_text() for s in ("spec_from_file_location", "sys.path.insert", "sys.path.append"))]
    assert offenders == []
