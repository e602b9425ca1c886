"""Walkthrough of the documented commands: what a new user met that did not match the docs.

Tiny Llamas built from configs, no tokenizer needed; everything runs offline in seconds.
"""
from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization import mia

from eval_cli import load_eval_cli as _load_cli


@pytest.mark.parametrize("name", ["mia", "downstream"])
def test_cli_help_examples_are_runnable_command_lines(name):
    """The usage examples of ``--help`` lost their line continuations (a ``\\`` at the end of a line
    in a non-raw docstring joins the lines), so the help printed one line with runs of spaces in it,
    and they named ``runs/goldfish_k4/final``, a path memorize.py never writes (``<arm>/model``)."""
    doc = _load_cli(name).__doc__
    example = [line for line in doc.splitlines() if line.startswith(f"    python eval/{name}.py")]
    assert example and example[0].endswith(" \\"), example
    assert "goldfish_k4/final" not in doc
    assert "runs/memorize/goldfish/model" in doc and "runs/memorize/manifest.json" in doc


def test_run_mia_names_the_manifest_document_whose_token_ids_are_outside_the_vocabulary(tmp_path):
    """docs/eval.md: token ids outside the model's vocabulary are refused, "naming the document".
    run_mia reported the document's place in members + nonmembers ("document 1": here the
    exposure-0 control, which is the manifest's targets[0]), which the user cannot find in the
    manifest; eval/extract.py names the document by its id."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "model")
    manifest = {
        "version": 1,
        "targets": [
            {"id": "control-with-bad-ids", "token_ids": [1, 5, 6, 150, 7], "exposures": 0},
            {"id": "member", "token_ids": [1, 8, 9, 10, 11], "exposures": 2},
        ],
        "nonmembers": [{"id": "held-out", "token_ids": [1, 12, 13, 14, 15]}],
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"document 'control-with-bad-ids' has token id 150, outside the model's "
                                         r"vocabulary \(0\.\.99\)"):
        mia.run_mia(tmp_path / "model", tmp_path / "manifest.json", device="cpu")


@pytest.mark.parametrize("bad, what", [(-1, "exposures -1"), (1.5, "exposures 1.5"), ("x", "exposures 'x'")])
def test_extract_refuses_a_manifest_target_with_a_bad_exposure_count(tmp_path, tokenizer, monkeypatch, bad, what):
    """``eval/extract.py --manifest`` read the manifest loosely: a target with exposures -1 was counted as trained
    in the overall rate (only exposure 0 is a control) and 1.5 became its own group. It now reads it with the one
    manifest check that MIA and perplexity use, before the model loads."""
    import transformers

    LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    target = {"id": "t0", "token_ids": [1, 5, 6, 7], "exposures": bad}
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "targets": [target], "nonmembers": []}))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model loaded before the manifest was checked"))
    with pytest.raises(SystemExit, match=f"targets\\[0\\] has {what}"):
        _load_cli("extract").main(["--model", str(tmp_path / "m"), "--manifest", str(tmp_path / "manifest.json"),
                                   "--no-progress"])


@pytest.mark.parametrize("flag", [["--limit", "100"], ["--num-fewshot", "5"]])
def test_downstream_lm_eval_options_without_tasks_are_refused(tmp_path, capsys, flag):
    """``--limit``/``--num-fewshot`` only shape lm-eval tasks: with perplexity alone they were ignored in silence."""
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    with pytest.raises(SystemExit) as e:
        _load_cli("downstream").main(["--model", str(tmp_path / "m"), "--perplexity", str(tmp_path / "held.jsonl"),
                                      *flag])
    assert e.value.code == 2 and "apply to lm-eval --tasks" in capsys.readouterr().err
