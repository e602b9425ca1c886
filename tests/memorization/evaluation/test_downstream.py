"""Held-out perplexity and the lm-evaluation-harness bridge (memorization/evaluation/downstream.py).

Runs offline on a tiny Llama with a locally trained tokenizer; the lm-eval tests use the
project's shipped task data/lm_eval_tasks/goldfish_mc and fail if anything opens a socket.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import random
import socket

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from memorization.evaluation import downstream as ds
from memorization.lm import LM
from memorization.evaluation.mia import MissingTokenizerError
from tests.support import REPO, WORKERS, load_eval_cli, one_thread


WORDS = ("amber basil cedar delta ember fjord grove harbor island jasper kelp lumen meadow "
         "nectar orchid pebble quartz river saffron tundra umber violet willow").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."




@contextlib.contextmanager
def no_network():
    """Make any attempt to open a network connection fail loudly."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[:2]}")

    saved = socket.socket.connect, socket.create_connection, socket.getaddrinfo
    socket.socket.connect, socket.create_connection, socket.getaddrinfo = refuse, refuse, refuse
    try:
        yield
    finally:
        socket.socket.connect, socket.create_connection, socket.getaddrinfo = saved


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny LlamaForCausalLM (max length 64) + byte-level BPE tokenizer, saved to disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("downstream")
    rng = random.Random(0)
    corpus = [_text(rng, 40) for _ in range(200)]
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)).eval()
    path = root / "ckpt"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    texts = [_text(rng, n) for n in (5, 12, 30, 45)]
    (root / "heldout.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return {"root": root, "path": path, "model": model, "tok": tok, "texts": texts}


def _manual_nll(model, ids: list[int]) -> np.ndarray:
    """Per-token NLL of ids[1:] with the whole document as context, one doc at a time."""
    x = torch.tensor([ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits[0, :-1].double(), -1)
    return -logp.gather(1, x[0, 1:, None])[:, 0].numpy()


# --------------------------------------------------------------------------- perplexity


@pytest.mark.parametrize("n,L,S", [(1, 8, 4), (2, 8, 4), (8, 8, 4), (9, 8, 4), (50, 8, 3),
                                   (50, 8, 7), (50, 8, 1), (17, 4, 3), (17, 2, 1)])
def test_windows_score_every_token_once(n, L, S):
    spans = ds.window_spans(n, L, S)
    scored = [t for b, e, f in spans for t in range(b + f, e)]
    assert scored == list(range(1, n))
    assert len(spans) == (0 if n < 2 else 1 + max(0, math.ceil((n - L) / S)))
    for i, (b, e, f) in enumerate(spans):
        assert 0 < e - b <= L and 1 <= f < e - b
        if i > 0:  # later windows are full-length and keep >= L - S tokens of context
            assert e - b == L and f >= L - S


def test_window_arguments_validated():
    with pytest.raises(ValueError, match="stride"):
        ds.window_spans(10, 8, 8)  # the first token of a disjoint window has no context
    with pytest.raises(ValueError, match="max_length"):
        ds.window_spans(10, 1, 1)


def test_perplexity_is_exp_mean_nll(ckpt):
    model, tok = ckpt["model"], ckpt["tok"]
    docs = [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"]
            for t in ckpt["texts"][:3]]
    assert all(len(d) <= 64 for d in docs)
    with one_thread():
        out = ds.perplexity(model, docs, batch_size=2)
        nll = np.concatenate([_manual_nll(model, d) for d in docs])
    # token-weighted: all tokens pooled, not a mean of per-document perplexities
    assert out["n_tokens"] == nll.size == sum(len(d) - 1 for d in docs)
    assert out["nll"] == pytest.approx(nll.mean(), rel=1e-5)
    assert out["perplexity"] == pytest.approx(math.exp(nll.mean()), rel=1e-5)
    np.testing.assert_allclose(out["doc_nll"], [_manual_nll(model, d).mean() for d in docs],
                               rtol=1e-5)


def test_sliding_window_equals_single_window_when_text_fits(ckpt):
    model, tok = ckpt["model"], ckpt["tok"]
    doc = tok(ckpt["texts"][2], add_special_tokens=False)["input_ids"]
    n = len(doc)
    with one_thread():
        single = ds.perplexity(model, [doc], max_length=n, stride=n - 1)
        for L, S in [(n, 1), (n, n // 2), (64, 7), (64, None)]:
            other = ds.perplexity(model, [doc], max_length=L, stride=S)
            assert other["n_windows"] == 1
            assert other["perplexity"] == pytest.approx(single["perplexity"], rel=1e-5)


def test_sliding_window_matches_manual_windows(ckpt):
    """A long document: each token is scored with exactly its window's context."""
    model, tok = ckpt["model"], ckpt["tok"]
    doc = tok(" ".join(ckpt["texts"]), add_special_tokens=False)["input_ids"][:90]
    L, S = 16, 6
    with one_thread():
        out = ds.perplexity(model, [doc, doc[:10]], max_length=L, stride=S, batch_size=5)
        manual = []
        for d in (doc, doc[:10]):
            for b, e, f in ds.window_spans(len(d), L, S):
                manual.append(_manual_nll(model, d[b:e])[f - 1:])
    manual = np.concatenate(manual)
    assert out["n_tokens"] == manual.size == len(doc) - 1 + 9
    assert out["nll"] == pytest.approx(manual.mean(), rel=1e-5)


def test_perplexity_reads_text_jsonl_and_manifest_documents(ckpt, tmp_path):
    texts, ids = ds.load_perplexity_docs(ckpt["root"] / "heldout.jsonl")
    assert texts == ckpt["texts"] and ids is None
    (tmp_path / "a.txt").write_text("one document\nover two lines")
    assert ds.load_perplexity_docs(tmp_path / "a.txt")[0] == ["one document\nover two lines"]
    manifest = {"version": 1, "targets": [],
                "nonmembers": [{"id": "n0", "text": "x y", "token_ids": [5, 6, 7]},
                               {"id": "n1", "text": "z", "token_ids": [8, 9]}]}
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    texts, ids = ds.load_perplexity_docs(tmp_path / "m.json")
    assert ids == [[5, 6, 7], [8, 9]]
    with one_thread():
        out = ds.evaluate_perplexity(ckpt["model"], ckpt["tok"], tmp_path / "m.json")
    assert out["n_tokens"] == 3 + 2  # BOS prepended: [bos,5,6,7] and [bos,8,9]
    with pytest.raises(FileNotFoundError):
        ds.load_perplexity_docs(tmp_path / "missing.jsonl")


# --------------------------------------------------------------------------- checkpoints


def test_missing_tokenizer_is_a_clear_error(ckpt, tmp_path):
    bare = tmp_path / "bare"
    ckpt["model"].save_pretrained(bare)
    with pytest.raises(MissingTokenizerError, match=r"no tokenizer.*save_pretrained"):
        ds.run_downstream(bare, perplexity_source=ckpt["root"] / "heldout.jsonl",
                          device="cpu")
    cli = _load_cli()
    assert cli.main(["--model", str(bare), "--perplexity",
                     str(ckpt["root"] / "heldout.jsonl"), "--device", "cpu"]) == 2
    # --tokenizer points at a directory that has one
    rep = ds.run_downstream(bare, perplexity_source=ckpt["root"] / "heldout.jsonl",
                            device="cpu", tokenizer_path=ckpt["path"])
    assert rep["perplexity"]["n_tokens"] > 0


def _load_cli():
    spec = importlib.util.spec_from_file_location("_cli_downstream",
                                                  REPO / "eval" / "downstream.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- lm-eval


def _need_lm_eval():
    pytest.importorskip("lm_eval", reason="lm-eval not installed: pip install "
                        "'lm-eval>=0.4,<0.5' to test the lm-evaluation-harness bridge")
    pytest.importorskip("accelerate", reason="lm-eval's HF backend needs accelerate "
                        "(pip install accelerate, or lm-eval[hf])")


def test_shipped_task_is_well_formed():
    import yaml

    task_dir = ds.DEFAULT_TASK_DIR / "goldfish_mc"
    cfg = yaml.safe_load((task_dir / "goldfish_mc.yaml").read_text())
    assert cfg["task"] == ds.LOCAL_TASK and cfg["dataset_path"] == "json"
    data = task_dir / cfg["dataset_kwargs"]["data_files"]["test"]
    rows = [json.loads(x) for x in data.read_text().splitlines() if x.strip()]
    assert 20 <= len(rows) <= 40
    assert len({r["question"] for r in rows}) == len(rows)
    for r in rows:
        assert len(r["choices"]) == 4 and 0 <= r["answer"] < 4
        assert len(set(r["choices"])) == 4


@pytest.fixture(scope="module")
def downstream_report(ckpt):
    """One end-to-end run: perplexity + the shipped task + a misspelt task, fully offline."""
    _need_lm_eval()
    with no_network(), one_thread():
        return ds.run_downstream(
            ckpt["path"], perplexity_source=ckpt["root"] / "heldout.jsonl",
            tasks=["goldfish_mc", "goldfish_mcq"], include_defaults=False, device="cpu",
            out_dir=ckpt["root"] / "out")


def test_lm_eval_runs_shipped_task_offline(downstream_report, ckpt):
    res = downstream_report["lm_eval"]["results"]["goldfish_mc"]
    assert 0.0 <= res["acc"] <= 1.0 and 0.0 <= res["acc_norm"] <= 1.0
    assert downstream_report["lm_eval"]["n_samples"]["goldfish_mc"] == 32
    assert (ckpt["root"] / "out" / "downstream.json").exists()
    assert "| goldfish_mc | 32 |" in (ckpt["root"] / "out" / "downstream.md").read_text()


def test_unknown_task_is_reported_and_the_rest_goes_on(downstream_report):
    err = downstream_report["lm_eval"]["errors"]["goldfish_mcq"]
    assert "unknown lm-eval task 'goldfish_mcq'" in err
    assert "did you mean: goldfish_mc" in err and "--list-tasks" in err
    assert "goldfish_mc" in downstream_report["lm_eval"]["results"]  # other task ran
    assert downstream_report["perplexity"]["perplexity"] > 1.0  # perplexity ran too


def test_downstream_cli_reports_the_tasks_that_ran_and_exits_1_for_one_that_failed(ckpt, tmp_path, capsys):
    _need_lm_eval()
    cli = _load_cli()
    with no_network(), one_thread():
        rc = cli.main(["--model", str(ckpt["path"]), "--perplexity",
                       str(ckpt["root"] / "heldout.jsonl"), "--tasks", "goldfish_mc,nope_task",
                       "--only-include-path", "--limit", "4", "--device", "cpu",
                       "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert rc == 1  # one task failed, the rest completed
    assert "| goldfish_mc | 4 |" in captured.out and "Perplexity on" in captured.out
    assert "unknown lm-eval task 'nope_task'" in captured.err
    rep = json.loads((tmp_path / "downstream.json").read_text())
    assert rep["lm_eval"]["n_samples"]["goldfish_mc"] == 4


@pytest.mark.slow
def test_unknown_task_against_builtin_index(ckpt):
    """With lm-eval's ~15k built-in names indexed, a typo suggests the real task."""
    _need_lm_eval()
    model, tok = ckpt["model"], ckpt["tok"]
    with no_network():
        out = ds.run_lm_eval(model, tok, ["arc_eazy"], include_defaults=None)
    assert "did you mean: arc_easy" in out["errors"]["arc_eazy"]
    assert "arc_easy" in ds.list_lm_eval_tasks()


def test_bad_input_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """A missing perplexity file or task directory is reported before any work (the model is not
    even loaded), nonsense window sizes and non-object .jsonl rows get a clear error."""
    import memorization.evaluation.downstream as ds

    monkeypatch.setattr(LM, "load", lambda *a, **k: pytest.fail("loaded the model before checking input"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ds.run_downstream(tmp_path, perplexity_source=tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        ds.run_downstream(tmp_path, tasks=["goldfish_mc"], include_path=tmp_path / "nodir")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n"just a string"\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object"):
        ds.load_perplexity_docs(bad)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        ds.perplexity(None, [[1, 2, 3]], max_length=8, stride=0)


def test_cli_exits_2_when_nothing_could_run(ckpt, tmp_path, capsys):
    """docs/eval.md: exit status 2 when no part produced a result (here a manifest without nonmembers)."""
    cli = _load_cli()
    empty = tmp_path / "manifest.json"
    empty.write_text(json.dumps({"version": 1, "targets": [], "nonmembers": []}))
    assert cli.main(["--model", str(ckpt["path"]), "--perplexity", str(empty), "--device", "cpu"]) == 2
    assert "no nonmembers" in capsys.readouterr().err


@pytest.mark.slow  # (~40 s on 2 cores; the default suite checks extraction on the same four grids)
def test_perplexity_on_four_grids_equals_one_process(grid_checkpoint, tmp_path):
    """Sliding-window perplexity (windows of 24 tokens, stride 8: several windows per document) from the model
    sharded over row, column and depth with the windows split over data and depth replicas (1,2,2,1 /
    1,1,2,2 / 2,2,1,1 / 1,2,1,2 on 4 gloo ranks, fp32) equals one process's to 1e-5, every token counted."""
    import json
    import sys as _sys

    from memorization.evaluation.downstream import run_downstream

    _sys.path.insert(0, str(WORKERS))
    import launcher

    root, _, docs, _ = grid_checkpoint
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(root / "model"))
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": tok.decode(d["token_ids"][1:])}) for d in docs))
    run_downstream(root / "model", perplexity_source=tmp_path / "docs.jsonl", batch_size=2, max_length=24,
                   stride=8, out_dir=tmp_path / "one")
    codes, log = launcher.launch("perplexity_grids.py", 4, timeout=240, extra_env={
        "MODEL_DIR": str(root / "model"), "DOCS_JSONL": str(tmp_path / "docs.jsonl"), "OUT_DIR": str(tmp_path)})
    assert codes == [0, 0, 0, 0], log[-3000:]
    want = json.loads((tmp_path / "one" / "downstream.json").read_text())["perplexity"]
    assert want["n_windows"] > len(docs)
    for grid in ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"):
        got = json.loads((tmp_path / grid / "downstream.json").read_text())["perplexity"]
        assert (got["n_tokens"], got["n_windows"], got["n_docs"]) == (want["n_tokens"], want["n_windows"],
                                                                     want["n_docs"])
        assert got["nll"] == pytest.approx(want["nll"], rel=1e-5), grid


# ------------------------------------------------------------ edge cases and bad input

def _tiny_config(vocab: int = 100, ctx: int = 64):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ctx)


def _refuse(*args, **kwargs):
    pytest.fail("the model was loaded before the input was checked")


@pytest.mark.parametrize("name, content, match", [
    # a clear ValueError (which run_downstream records), not an AttributeError / TypeError traceback
    ("m.json", {"version": 1, "targets": [], "nonmembers": ["some held-out text"]},
     r"nonmembers\[0\] is a str, not an object"),
    ("m.json", {"version": 1, "targets": [], "nonmembers": [{"id": "n", "token_ids": None}]},
     r"token_ids must be a list of integers"),
    # a nonmember with neither text nor token_ids is refused, not scored as "" (silently dropped)
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
    ({"tasks": ["goldfish_mc"], "limit": float("inf")}, "limit must be > 0 and finite"),
    ({"tasks": ["goldfish_mc"], "num_fewshot": -2}, "num_fewshot must be >= 0"),
    # max_length 0 silently meant "the model's context" for lm-eval
    ({"tasks": ["goldfish_mc"], "max_length": 0}, "max_length must be >= 2"),
])
def test_downstream_options_are_checked_before_the_model_loads(tmp_path, monkeypatch, kwargs, match):
    _tiny_config().save_pretrained(tmp_path / "m")
    monkeypatch.setattr(LM, "load", _refuse)
    with pytest.raises(ValueError, match=match):
        ds.run_downstream(tmp_path / "m", device="cpu", **kwargs)


def test_downstream_cli_bad_limit_is_exit_2(tmp_path, monkeypatch, capsys):
    _tiny_config().save_pretrained(tmp_path / "m")
    monkeypatch.setattr(LM, "load", _refuse)
    rc = load_eval_cli("downstream").main(["--model", str(tmp_path / "m"), "--tasks", "goldfish_mc",
                                       "--limit", "-3", "--device", "cpu"])
    assert rc == 2 and "limit must be > 0" in capsys.readouterr().err


# ------------------------------------------------------------ the perplexity window is checked before the model loads

def _refuse_work(*args, **kwargs):
    pytest.fail("work started before the input was checked")


def _tiny_llama_ctx(vocab=300, ctx=256):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=ctx)).eval()


@pytest.fixture
def config_only(tmp_path):
    """A checkpoint directory with a config (context 64) and no weights, plus a perplexity file."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                max_position_embeddings=64).save_pretrained(tmp_path / "m")
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    return tmp_path


@pytest.mark.parametrize("kwargs, match", [
    ({"max_length": 128}, r"max_length 128 exceeds the model's context \(64 tokens"),
    ({"max_length": 32, "stride": 32}, "stride must be in"),
    ({"stride": 64}, "stride must be in"),  # default window: the context, 64
    ({"batch_size": 0}, "batch_size must be >= 1"),
])
def test_downstream_window_arguments_are_checked_before_the_model_loads(config_only, monkeypatch, kwargs, match):
    import memorization.evaluation.downstream as ds

    monkeypatch.setattr(LM, "load", _refuse_work)
    with pytest.raises(ValueError, match=match):
        ds.run_downstream(config_only / "m", perplexity_source=config_only / "held.jsonl", **kwargs)


def test_downstream_cli_bad_window_is_exit_2(config_only, monkeypatch, capsys):
    monkeypatch.setattr(LM, "load", _refuse_work)
    rc = load_eval_cli("downstream").main(["--model", str(config_only / "m"), "--perplexity",
                                   str(config_only / "held.jsonl"), "--max-length", "128"])
    assert rc == 2 and "exceeds the model's context" in capsys.readouterr().err


def test_perplexity_refuses_a_window_beyond_the_context():
    """Positions past the context were never trained: the perplexity there measures extrapolation."""
    from memorization.evaluation.downstream import perplexity

    with pytest.raises(ValueError, match="exceeds the model's context"):
        perplexity(_tiny_llama_ctx(ctx=16), [list(range(1, 40))], max_length=32, stride=16, progress=False)


# ------------------------------------------------------------ lm-eval options without --tasks are refused

@pytest.mark.parametrize("flag", [["--limit", "100"], ["--num-fewshot", "5"]])
def test_downstream_lm_eval_options_without_tasks_are_refused(tmp_path, capsys, flag):
    """``--limit``/``--num-fewshot`` only shape lm-eval tasks: with perplexity alone they were ignored in silence."""
    (tmp_path / "held.jsonl").write_text(json.dumps({"text": "held out"}) + "\n")
    with pytest.raises(SystemExit) as e:
        load_eval_cli("downstream").main(["--model", str(tmp_path / "m"), "--perplexity", str(tmp_path / "held.jsonl"),
                                      *flag])
    assert e.value.code == 2 and "apply to lm-eval --tasks" in capsys.readouterr().err
