"""Review of memorization/mia.py and memorization/downstream.py: edge cases and bad input.

Tiny Llamas built from configs, no tokenizer needed; everything runs offline in seconds.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization import downstream as ds
from memorization import mia

from eval_cli import load_eval_cli as _load_cli


def _config(vocab: int = 100, ctx: int = 64) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ctx)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return LlamaForCausalLM(_config()).eval()




def _refuse(*args, **kwargs):
    pytest.fail("the model was loaded before the input was checked")


# --------------------------------------------------------------------------- scoring edge cases


def test_a_batch_of_only_too_short_documents_is_nan_not_a_crash(tiny):
    """Documents are scored longest first, so with a small batch the last batches held only the
    empty documents (e.g. --no-bos with an empty token_ids): a zero-width forward pass crashed
    the whole run, and only for some batch sizes.  They are NaN, whatever the batch size."""
    docs = [[5, 6, 7, 8, 9], [], [11], [12, 13, 14]]
    with torch.no_grad():
        per_doc = [-torch.log_softmax(tiny(torch.tensor([d])).logits[0, :-1], -1)
                   .gather(1, torch.tensor(d[1:])[:, None]).mean().item() for d in (docs[0], docs[3])]
    for bs in (1, 2, 3, 4):
        s = mia.mia_scores(tiny, None, docs, batch_size=bs)
        assert s["n_tokens"].tolist() == [4, 0, 0, 2]
        assert math.isnan(s["loss"][1]) and math.isnan(s["loss"][2]) and math.isnan(s["min_k"][1])
        np.testing.assert_allclose(s["loss"][[0, 3]], per_doc, rtol=1e-5)
    # only empty documents: NaN, no forward pass
    assert np.isnan(mia.mia_scores(tiny, None, [[], []], batch_size=1)["loss"]).all()


def test_token_ids_outside_the_vocabulary_are_a_clear_error(tiny):
    """Token ids of another tokenizer gave an opaque 'IndexError: index out of range in self' on
    CPU (a device-side assert that kills the CUDA context on GPU), and a traceback from the CLI."""
    docs = [[5, 6, 7], [8, 150, 9]]  # vocabulary 0..99
    with pytest.raises(ValueError, match=r"document 1 has token id 150, outside the model's vocabulary \(0..99\)"):
        mia.mia_scores(tiny, None, docs)
    with pytest.raises(ValueError, match=r"token id -1, outside the model's vocabulary"):
        mia.mia_scores(tiny, None, [[5, -1, 7]])
    with pytest.raises(ValueError, match=r"token id 150, outside the model's vocabulary"):
        ds.perplexity(tiny, docs, progress=False)


# --------------------------------------------------------------------------- numbers


def test_mia_scores_refuse_nonsense_batch_size_and_max_length(tiny):
    doc = [list(range(5, 15))]
    # batch_size -1 used to give all-NaN scores silently (no batch ran), 0 a bare range() error
    for bs in (-1, 0):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            mia.mia_scores(tiny, None, doc, batch_size=bs)
    # max_length -2 used to cut the last 2 tokens off every document (d[:-2]) and score the rest
    for n in (-2, 1):
        with pytest.raises(ValueError, match="max_length must be an integer >= 2"):
            mia.mia_scores(tiny, None, doc, max_length=n)
    # past the context (64): positions never trained, as perplexity() already refuses
    with pytest.raises(ValueError, match=r"max_length 128 exceeds the model's context \(64 tokens"):
        mia.mia_scores(tiny, None, doc, max_length=128)
    assert mia.mia_scores(tiny, None, doc, max_length=64)["n_tokens"].tolist() == [9]


def test_mia_report_refuses_an_fpr_that_is_not_a_fraction():
    """fpr_target=5 (meant as 5%) read the ROC at FPR 500% and reported TPR 1.0 silently."""
    members, nonmembers = {"loss": np.array([1.0, 2.0, 3.0])}, {"loss": np.array([2.5, 4.0, 5.0])}
    for bad in (5, 1.0, 0.0, -0.01):
        with pytest.raises(ValueError, match="fpr_target must be a fraction in"):
            mia.mia_report(members, nonmembers, fpr_target=bad)
    assert mia.mia_report(members, nonmembers, fpr_target=0.05)["scores"]["loss"]["auc"] == pytest.approx(8 / 9)


@pytest.mark.parametrize("kwargs, match", [
    ({"fpr_target": 5}, "fpr_target must be a fraction"),
    ({"k": 20}, "k must be a fraction"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"max_length": -3}, "max_length must be an integer >= 2"),
    ({"max_length": 128}, r"max_length 128 exceeds the model's context \(64 tokens"),
])
def test_run_mia_checks_its_numbers_before_loading(tmp_path, monkeypatch, kwargs, match):
    _config().save_pretrained(tmp_path / "m")
    (tmp_path / "m.json").write_text(json.dumps({"version": 1, "targets": [
        {"id": "t", "token_ids": [1, 2, 3], "exposures": 1}], "nonmembers": [{"id": "n", "token_ids": [4, 5]}]}))
    monkeypatch.setattr(mia, "load_checkpoint", _refuse)
    with pytest.raises(ValueError, match=match):
        mia.run_mia(tmp_path / "m", tmp_path / "m.json", device="cpu", **kwargs)


# --------------------------------------------------------------------------- manifests and sources


@pytest.mark.parametrize("targets, nonmembers, match", [
    # a list of texts (as --perplexity .json accepts) passed the check and crashed after the model loaded
    ([{"id": "t", "token_ids": [1, 2], "exposures": 1}], ["amber basil text"],
     r"nonmembers\[0\] is a str, not an object"),
    ([{"id": "t", "token_ids": [1, 2], "exposures": 1}], [{"id": "n", "token_ids": None}],
     r"nonmembers\[0\] \(n\): token_ids must be a list of integers"),
    ([{"id": "t", "token_ids": [1, "x"], "exposures": 1}], [{"id": "n", "token_ids": [3, 4]}],
     r"targets\[0\] \(t\): token_ids must be a list of integers"),
    ([{"id": "t", "text": None, "exposures": 1}], [{"id": "n", "token_ids": [3, 4]}],
     r"targets\[0\] \(t\): text must be a string"),
    # a negative count was neither member nor nonmember: the target silently vanished from the report
    ([{"id": "t", "token_ids": [1, 2], "exposures": 1}, {"id": "u", "token_ids": [1, 2], "exposures": -1}],
     [{"id": "n", "token_ids": [3, 4]}], r"targets\[1\] has exposures -1; it must be a non-negative integer"),
])
def test_malformed_manifest_documents_are_refused_before_the_model_loads(tmp_path, monkeypatch, capsys,
                                                                         targets, nonmembers, match):
    man = tmp_path / "m.json"
    man.write_text(json.dumps({"version": 1, "targets": targets, "nonmembers": nonmembers}))
    with pytest.raises(ValueError, match=match):
        mia.load_manifest(man)
    monkeypatch.setattr(mia, "load_checkpoint", _refuse)
    rc = _load_cli("mia").main(["--model", str(tmp_path / "m"), "--manifest", str(man), "--device", "cpu"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error:" in err and str(man) in err


def test_manifest_that_is_not_json_names_the_file(tmp_path):
    (tmp_path / "m.json").write_text('{"version": 1, "targets": [')
    with pytest.raises(ValueError, match=r"manifest .*m\.json is not valid JSON"):
        mia.load_manifest(tmp_path / "m.json")


@pytest.mark.parametrize("name, content, match", [
    # AttributeError / TypeError escaped run_downstream (which records ValueErrors) as a traceback
    ("m.json", {"version": 1, "targets": [], "nonmembers": ["some held-out text"]},
     r"nonmembers\[0\] is a str, not an object"),
    ("m.json", {"version": 1, "targets": [], "nonmembers": [{"id": "n", "token_ids": None}]},
     r"token_ids must be a list of integers"),
    # a nonmember with neither text nor token_ids used to be scored as "" (silently dropped)
    ("m.json", {"version": 1, "targets": [], "nonmembers": [{"id": "n"}]}, "has neither token_ids nor text"),
    ("m.json", {"version": 1, "targets": [], "nonmembers": [{"id": "a", "token_ids": [1, 2, 3]}, {"text": "b c"}]},
     r"nonmembers\[0\] has token_ids but no text, and others have no token_ids"),
    ("l.json", ["fine", 3], r"item 1 is not a string or an object with a string 'text' field"),
    ("l.json", [{"body": "x"}], r"item 0 is not a string or an object with a string 'text' field"),
])
def test_malformed_perplexity_sources_are_a_clear_value_error(tmp_path, name, content, match):
    (tmp_path / name).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=match):
        ds.load_perplexity_docs(tmp_path / name)
    (tmp_path / "r.jsonl").write_text(json.dumps({"text": None}) + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:1: 'text' is a NoneType, not a string"):
        ds.load_perplexity_docs(tmp_path / "r.jsonl")


# --------------------------------------------------------------------------- downstream options


@pytest.mark.parametrize("kwargs, match", [
    # lm-eval failed per task with "Indices for islice() must be None or an integer" (limit -3),
    # "did not find any docs" (limit 0), and took a negative few-shot count silently
    ({"tasks": ["goldfish_mc"], "limit": -3}, "limit must be > 0"),
    ({"tasks": ["goldfish_mc"], "limit": 0}, "limit must be > 0"),
    ({"tasks": ["goldfish_mc"], "num_fewshot": -2}, "num_fewshot must be >= 0"),
    # max_length 0 silently meant "the model's context" for lm-eval
    ({"tasks": ["goldfish_mc"], "max_length": 0}, "max_length must be >= 2"),
])
def test_downstream_options_are_checked_before_the_model_loads(tmp_path, monkeypatch, kwargs, match):
    _config().save_pretrained(tmp_path / "m")
    monkeypatch.setattr(ds, "load_checkpoint", _refuse)
    with pytest.raises(ValueError, match=match):
        ds.run_downstream(tmp_path / "m", device="cpu", **kwargs)


def test_downstream_cli_bad_limit_is_exit_2(tmp_path, monkeypatch, capsys):
    _config().save_pretrained(tmp_path / "m")
    monkeypatch.setattr(ds, "load_checkpoint", _refuse)
    rc = _load_cli("downstream").main(["--model", str(tmp_path / "m"), "--tasks", "goldfish_mc",
                                       "--limit", "-3", "--device", "cpu"])
    assert rc == 2 and "limit must be > 0" in capsys.readouterr().err
