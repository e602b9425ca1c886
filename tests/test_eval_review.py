"""Edge cases of the evaluation code: Rouge-L of token-less texts, token ids outside the model's
vocabulary, BOS on --documents, bad CLI input refused before any work (the sandbox's tests are in
test_hpc_code_sandbox.py)."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization.extraction import ExtractionConfig, extract, rouge_l

from eval_cli import load_eval_cli as _load


def _refuse(*args, **kwargs):
    pytest.fail("work started before the input was checked")


# ------------------------------------------------------------------ extraction


def test_rouge_l_of_texts_without_tokens():
    """A suffix that decodes to nothing Rouge can tokenise (newlines, special tokens), reproduced
    exactly, is a perfect match, not 0; against a non-empty text it is still 0."""
    assert rouge_l(["", "\n\n  \n"], ["", "\n\t\n"]) == [1.0, 1.0]
    assert rouge_l(["x", ""], ["", "x"]) == [0.0, 0.0]


def _tiny_llama(vocab=300, ctx=256):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1,
                                        max_position_embeddings=ctx)).eval()


@pytest.mark.parametrize("where", ["prefix", "suffix"])
def test_token_ids_outside_the_vocabulary_are_refused(where):
    """Token ids from another tokenizer: in the prefix they crashed inside the embedding (a device
    assert on CUDA), in the suffix they could never be generated: a silent 0% extraction."""
    ids = list(range(1, 101))
    ids[10 if where == "prefix" else 70] = 300  # vocabulary 0..299
    docs = [{"id": "d0", "token_ids": ids, "exposures": 1}]
    with pytest.raises(ValueError, match=r"'d0' has token id 300, outside the model's vocabulary \(0..299\)"):
        extract(_tiny_llama(), docs, ExtractionConfig(prefix_len=50, suffix_len=50))


def test_extraction_batch_size_is_validated(tmp_path, capsys):
    with pytest.raises(ValueError, match="batch size"):
        ExtractionConfig(batch_size=0)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "d.txt").write_text("some text")
    with pytest.raises(SystemExit, match="--batch-size must be >= 1"):
        _load("extract").main(["--model", str(tmp_path / "m"), "--documents", str(tmp_path / "d.txt"),
                               "--batch-size", "0", "--no-progress"])


def test_documents_get_a_bos_as_the_memorize_run_gave_its_targets(tmp_path, monkeypatch):
    """``--documents`` with a tokenizer that adds no BOS by itself: the memorize run trained on
    ``[bos] doc`` (memorization.mixture), so extraction must prefix the same BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    import memorization.extraction as ex

    texts = [f"document {i}: the quick brown fox jumps over the lazy dog near tree {i}" for i in range(3)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    assert tok("fox")["input_ids"][0] != tok.bos_token_id  # no post-processor: no BOS of its own
    _tiny_llama(vocab=len(tok)).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "d.txt").write_text("\n\n".join(texts))
    seen = []
    real = ex.extract
    monkeypatch.setattr(ex, "extract", lambda model, docs, *a, **k: seen.extend(docs) or real(model, docs, *a, **k))
    _load("extract").main(["--model", str(tmp_path / "m"), "--documents", str(tmp_path / "d.txt"), "--prefix", "4",
                           "--suffix", "4", "--device", "cpu", "--no-progress", "--json"])
    assert len(seen) == 3
    assert [d["token_ids"] for d in seen] == [[tok.bos_token_id] + tok(t)["input_ids"] for t in texts]


# ------------------------------------------------------------------ downstream and MIA CLIs


@pytest.fixture
def config_only(tmp_path):
    """A checkpoint directory with a config (context 64) and no weights, plus a perplexity file."""
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
    import memorization.downstream as ds

    monkeypatch.setattr(ds, "load_checkpoint", _refuse)
    with pytest.raises(ValueError, match=match):
        ds.run_downstream(config_only / "m", perplexity_source=config_only / "held.jsonl", **kwargs)


def test_downstream_cli_bad_window_is_exit_2(config_only, monkeypatch, capsys):
    import memorization.downstream as ds

    monkeypatch.setattr(ds, "load_checkpoint", _refuse)
    rc = _load("downstream").main(["--model", str(config_only / "m"), "--perplexity",
                                   str(config_only / "held.jsonl"), "--max-length", "128"])
    assert rc == 2 and "exceeds the model's context" in capsys.readouterr().err


def test_perplexity_refuses_a_window_beyond_the_context():
    """Positions past the context were never trained: the perplexity there measures extrapolation."""
    from memorization.downstream import perplexity

    with pytest.raises(ValueError, match="exceeds the model's context"):
        perplexity(_tiny_llama(ctx=16), [list(range(1, 40))], max_length=32, stride=16, progress=False)


@pytest.mark.parametrize("flags, match", [(["--k", "20"], "--k 20"), (["--fpr", "1.5"], "--fpr 1.5"),
                                          (["--batch-size", "0"], "--batch-size 0"),
                                          (["--max-length", "1"], "--max-length 1")])
def test_mia_cli_checks_its_numbers_before_loading(tmp_path, monkeypatch, capsys, flags, match):
    cli = _load("mia")
    monkeypatch.setattr(cli, "run_mia", _refuse)
    assert cli.main(["--model", str(tmp_path), "--manifest", str(tmp_path / "m.json"), *flags]) == 2
    assert match in capsys.readouterr().err


# ------------------------------------------------------------------ HPC code


@pytest.mark.parametrize("flags", [["--output", "{tmp}/no/such/dir/report.json"], ["--output", "{tmp}"],
                                   ["--save-completions", "{tmp}/missing/c.jsonl"], ["--timeout", "0"],
                                   ["--humaneval-limit", "-1"], ["--repeats", "0"]])
def test_hpc_cli_refuses_bad_flags_before_evaluating(tmp_path, monkeypatch, capsys, flags):
    """The report is written at the very end: an unwritable --output used to crash after the whole
    run; --timeout 0 scored every candidate as a timeout; --humaneval-limit -1 dropped a task."""
    cli = _load("hpc_code")
    monkeypatch.setattr(cli, "evaluate_samples", _refuse)
    flags = [f.format(tmp=tmp_path) for f in flags]
    rc = cli.main(["--use-references", "--quick", "--no-progress", "--problems", "reduce_array_sum_serial", *flags])
    assert rc == 2 and "error:" in capsys.readouterr().err
