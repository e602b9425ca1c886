"""Extraction: a model that knows the documents extracts 100%, a random one 0%, and the batched
KV-cache decoder gives exactly what per-document greedy `generate` gives."""
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization.extraction import ExtractionConfig, extract, greedy_continue


class OracleLM(torch.nn.Module):
    """Test double that has memorised ``docs``: given a (left-padded) history, it emits the next token
    of the document that history is a prefix of.  Its 'KV cache' is the token history itself."""

    def __init__(self, docs: list[list[int]], vocab: int):
        super().__init__()
        self.docs, self.vocab = docs, vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask, position_ids=None, past_key_values=None, use_cache=True):
        hist = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], 1)
        logits = torch.zeros(hist.shape[0], hist.shape[1], self.vocab)
        for r in range(hist.shape[0]):
            h = hist[r][attention_mask[r].bool()].tolist()
            nxt = next(d[len(h)] for d in self.docs if d[: len(h)] == h)
            logits[r, -1, nxt] = 1.0
        return SimpleNamespace(logits=logits, past_key_values=hist)


def _docs(n=10, vocab=300, seed=0, lengths=(100, 140)):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        L = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=g))
        out.append({"id": f"d{i}", "token_ids": torch.randint(1, vocab, (L,), generator=g).tolist(),
                    "exposures": [1, 4][i % 2]})
    return out


@pytest.mark.parametrize("all_but_suffix", [False, True])
def test_oracle_model_extracts_everything(all_but_suffix):
    docs = _docs()
    model = OracleLM([d["token_ids"] for d in docs], 300)
    cfg = ExtractionConfig(prefix_len=50, suffix_len=50, all_but_suffix=all_but_suffix, batch_size=4)
    res = extract(model, docs, cfg)
    assert res["overall"]["exact_match"] == 1.0
    assert res["overall"]["token_match"] == 1.0
    assert res["overall"]["rouge_l"] == pytest.approx(1.0)
    assert set(res["by_exposure"]) == {"1", "4"} and res["by_exposure"]["1"]["n"] == 5


def _tiny_llama(vocab=300, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def test_random_model_extracts_nothing():
    res = extract(_tiny_llama(), _docs(), ExtractionConfig(batch_size=8))
    assert res["overall"]["exact_match"] == 0.0
    assert res["overall"]["token_match"] < 0.1


def test_batched_kv_cache_decoding_equals_per_document_generate():
    model = _tiny_llama(seed=1)
    docs = _docs(n=6, lengths=(60, 90))
    prefixes = [d["token_ids"][: 20 + 7 * i] for i, d in enumerate(docs)]  # different lengths: left padding
    batched = greedy_continue(model, prefixes, 12, batch_size=6, pad_id=0)
    model.generation_config.eos_token_id = None  # extraction never stops early (and never bans EOS)
    for p, b in zip(prefixes, batched):
        ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert ref[0, len(p):].tolist() == b


def test_document_shorter_than_prefix_plus_suffix():
    docs = _docs(n=3) + [{"id": "short", "token_ids": list(range(1, 60)), "exposures": 1}]
    model = OracleLM([d["token_ids"] for d in docs], 300)
    with pytest.raises(ValueError, match="fewer than prefix"):
        extract(model, docs, ExtractionConfig())
    res = extract(model, docs, ExtractionConfig(skip_short=True))
    assert res["skipped"] == ["short"] and res["overall"]["n"] == 3


def test_extract_cli_device_map_gives_the_same_results(tmp_path):
    """``--device-map auto`` (accelerate places the layers; all on the CPU here) changes nothing."""
    import importlib.util
    from pathlib import Path

    from memorization.corpus import load_tokenizer

    tok = load_tokenizer("builtin:bpe4096")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok)))
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(f"Document {i}: the quick brown fox jumps over the lazy dog, then naps under "
                                f"tree number {i} while the farmer counts {i * 7} sheep." for i in range(6)))
    spec = importlib.util.spec_from_file_location("extract_cli", Path(__file__).parents[1] / "eval" / "extract.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    base = ["--model", str(tmp_path / "m"), "--documents", str(docs), "--prefix", "8", "--suffix", "8",
            "--no-progress", "--json"]
    plain = cli.main(base)
    mapped = cli.main(base + ["--device-map", "auto"])
    assert plain["overall"] == mapped["overall"] and plain["overall"]["n"] == 6
    assert [d["generated"] for d in plain["documents"]] == [d["generated"] for d in mapped["documents"]]
