"""Extraction: a model that knows the documents extracts 100%, a random one 0%, the batched
KV-cache decoder gives exactly what per-document greedy `generate` gives (computing the prefill's
logits for the last position only), all-but-suffix cuts documents at 2,048 tokens, and Rouge-L
counts punctuation, case and non-Latin text."""
import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization.evaluation.extraction import ExtractionConfig, extract, rouge_l, split_document
from tests.forked import run_python
from tests.support import REPO, WORKERS, load_eval_cli


class OracleLM(torch.nn.Module):
    """Test double that has memorised ``docs``: given a (left-padded) history, it emits the next token
    of the document that history is a prefix of.  Its 'KV cache' is the token history itself."""

    def __init__(self, docs: list[list[int]], vocab: int):
        super().__init__()
        self.docs, self.vocab = docs, vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask, position_ids=None, past_key_values=None, use_cache=True,
                logits_to_keep=0):
        hist = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], 1)
        logits = torch.zeros(hist.shape[0], input_ids.shape[1], self.vocab)
        for r in range(hist.shape[0]):
            h = hist[r][attention_mask[r].bool()].tolist()
            nxt = next(d[len(h)] for d in self.docs if d[: len(h)] == h)
            logits[r, -1, nxt] = 1.0
        return SimpleNamespace(logits=logits[:, -logits_to_keep:], past_key_values=hist)


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


def test_all_but_suffix_cuts_the_document_at_max_tokens():
    ids = list(range(1, 3001))
    prefix, suffix = split_document(ids, ExtractionConfig(all_but_suffix=True))  # Goldfish default: 2,048
    assert prefix == ids[:1998] and suffix == ids[1998:2048]
    prefix, suffix = split_document(ids[:700], ExtractionConfig(all_but_suffix=True))  # shorter: all but S
    assert prefix == ids[:650] and suffix == ids[650:700]

    docs = _docs(n=4, lengths=(100, 140))
    cfg = ExtractionConfig(suffix_len=20, all_but_suffix=True, batch_size=4, max_tokens=80)
    assert split_document(docs[0]["token_ids"], cfg) == (docs[0]["token_ids"][:60], docs[0]["token_ids"][60:80])
    res = extract(OracleLM([d["token_ids"] for d in docs], 300), docs, cfg)
    assert [r["suffix"] for r in res["documents"]] == [" ".join(map(str, d["token_ids"][60:80])) for d in docs]
    assert res["overall"]["exact_match"] == 1.0 and res["config"]["max_tokens"] == 80
    with pytest.raises(ValueError, match="max_tokens"):
        ExtractionConfig(suffix_len=50, all_but_suffix=True, max_tokens=50)


def test_prefix_plus_suffix_must_fit_the_model_context():
    model = _tiny_llama()  # max_position_embeddings = 256
    docs = [{"id": "long", "token_ids": list(range(1, 301)), "exposures": 1}]
    with pytest.raises(ValueError, match=r"exceeds the model's context \(256 tokens\)"):
        extract(model, docs, ExtractionConfig(prefix_len=220, suffix_len=50))
    with pytest.warns(UserWarning, match="cut to 256"):
        res = extract(model, docs, ExtractionConfig(suffix_len=10, all_but_suffix=True))  # max_tokens 2048
    assert res["config"]["max_tokens"] == 256 and res["config"]["model_context"] == 256
    assert res["documents"][0]["suffix"] == " ".join(map(str, range(247, 257)))  # tokens [246, 256)
    model.config.trained_context = 100  # trained from scratch on 100-token rows: positions past 100 never were
    with pytest.raises(ValueError, match=r"\(100 tokens\)"):
        extract(model, docs, ExtractionConfig(prefix_len=60, suffix_len=50))
    with pytest.warns(UserWarning, match="cut to 100"):
        res = extract(model, docs, ExtractionConfig(suffix_len=10, all_but_suffix=True))
    assert res["config"]["model_context"] == 100 and res["documents"][0]["suffix"] == " ".join(map(str, range(91, 101)))


@pytest.mark.parametrize("pred, ref, expected", [
    ("x = x + 1", "x = x - 1", "below 1"),  # the default tokenizer drops the operator: 1.0
    ("東京は日本の首都です。", "東京は日本の首都です。", 1.0),  # ... and every non-ASCII word: 0.0
    ("The quick brown fox, again.", "The quick brown fox, again.", 1.0),
    ("alpha beta gamma", "delta epsilon zeta", 0.0),
])
def test_rouge_l_keeps_punctuation_case_and_unicode(pred, ref, expected):
    (score,) = rouge_l([pred], [ref])
    if expected == "below 1":
        assert 0.5 < score < 1.0
    else:
        assert score == pytest.approx(expected)


def test_rouge_l_counts_case_and_accented_words():
    assert rouge_l(["Return value"], ["return value"])[0] == pytest.approx(0.5)
    assert rouge_l(["Ünïcödé wörds"], ["Ünïcödé wörds"])[0] == pytest.approx(1.0)


def test_document_shorter_than_prefix_plus_suffix():
    docs = _docs(n=3) + [{"id": "short", "token_ids": list(range(1, 60)), "exposures": 1}]
    model = OracleLM([d["token_ids"] for d in docs], 300)
    with pytest.raises(ValueError, match="fewer than prefix"):
        extract(model, docs, ExtractionConfig())
    res = extract(model, docs, ExtractionConfig(skip_short=True))
    assert res["skipped"] == ["short"] and res["overall"]["n"] == 3


def _cli():
    spec = importlib.util.spec_from_file_location("extract_cli", REPO / "eval" / "extract.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli


def test_extract_cli_max_doc_tokens_flag():
    cli = _cli()
    base = ["--model", "m", "--documents", "d.txt"]
    assert cli.parse_args(base).max_doc_tokens == 2048
    assert cli.parse_args(base + ["--max-doc-tokens", "512"]).max_doc_tokens == 512


def test_extract_cli_device_map_gives_the_same_results(tmp_path):
    """``--device-map auto`` (accelerate places the layers; all on the CPU here) changes nothing."""
    from memorization.data.corpus import load_tokenizer

    tok = load_tokenizer("builtin:bpe4096")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok)))
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(f"Document {i}: the quick brown fox jumps over the lazy dog, then naps under "
                                f"tree number {i} while the farmer counts {i * 7} sheep." for i in range(6)))
    cli = _cli()
    base = ["--model", str(tmp_path / "m"), "--documents", str(docs), "--prefix", "8", "--suffix", "8",
            "--no-progress", "--json"]
    plain = cli.main(base)
    mapped = cli.main(base + ["--device-map", "auto"])
    assert plain["overall"] == mapped["overall"] and plain["overall"]["n"] == 6
    assert plain["config"]["max_tokens"] == 2048
    assert [d["generated"] for d in plain["documents"]] == [d["generated"] for d in mapped["documents"]]


def test_exposure0_controls_are_not_counted_in_the_overall_rates():
    """A model that memorised every trained target extracts 100% of them: the never-trained controls
    (exposure 0) are reported in their own group, not averaged into the overall rates."""
    from memorization.evaluation.extraction import markdown_table

    docs = _docs(n=6)
    for i, d in enumerate(docs):
        d["exposures"] = [0, 4][i % 2]
    known = [d["token_ids"] if d["exposures"] else d["token_ids"][:50] + [1] * 100 for d in docs]
    res = extract(OracleLM(known, 300), docs, ExtractionConfig(batch_size=4))
    assert res["by_exposure"]["0"]["n"] == 3 and res["by_exposure"]["0"]["exact_match"] == 0.0
    o = res["overall"]
    assert (o["n"], o["exact_match"], o["token_match"]) == (3, 1.0, 1.0)
    assert "| **all but exposure 0** | 3 | 1.000" in markdown_table(res)
    # only controls: no trained target, so no overall rate (not the controls' rate)
    controls = [d for d in docs if d["exposures"] == 0]
    only = extract(OracleLM(known, 300), controls, ExtractionConfig(batch_size=4))
    assert only["overall"]["n"] == 0 and only["overall"]["exact_match"] is None
    assert "| **all but exposure 0** | 0 | – | – | – |" in markdown_table(only)


def test_documents_of_unknown_exposure_get_one_row_not_a_none_row():
    """eval/extract.py --documents has no exposure counts: the table shows the overall row only (no
    "None" row repeating it); mixed with known counts, the unknown ones are labelled so."""
    from memorization.evaluation.extraction import markdown_table

    docs = _docs(n=4)
    for d in docs:
        d["exposures"] = None
    table = markdown_table(extract(OracleLM([d["token_ids"] for d in docs], 300), docs, ExtractionConfig(batch_size=4)))
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| exposures")]
    assert rows == ["| **all** | 4 | 1.000 (0.51–1.00) | 1.000 | 1.000 |"], table
    docs[0]["exposures"] = 8
    table = markdown_table(extract(OracleLM([d["token_ids"] for d in docs], 300), docs, ExtractionConfig(batch_size=4)))
    assert "| 8 | 1 |" in table and "| unknown | 3 |" in table and "None" not in table


def test_token_edit_distance_is_levenshtein_on_every_row():
    """The vectorised programme against the textbook recursion on random rows (including equal, shifted and
    empty-overlap rows), and the metrics derived from it."""
    import random

    from memorization.evaluation.extraction import prefix_match, token_edit_distance

    def lev(a, b):
        d = list(range(len(b) + 1))
        for i, x in enumerate(a, 1):
            prev, d[0] = d[0], i
            for j, y in enumerate(b, 1):
                prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
        return d[-1]

    rng = random.Random(0)
    rows_a, rows_b = [], []
    for _ in range(200):
        a = [rng.randrange(4) for _ in range(12)]
        b = rng.choice([a[:], a[1:] + [0], [rng.randrange(4) for _ in range(12)], [9] * 12])
        rows_a.append(a)
        rows_b.append(b)
    got = token_edit_distance(torch.tensor(rows_a), torch.tensor(rows_b)).tolist()
    assert got == [lev(a, b) for a, b in zip(rows_a, rows_b)]
    shifted = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
    ref = torch.tensor([[1, 2, 3, 5, 6, 7, 8, 9, 10, 11]])  # one token left out, one appended
    assert token_edit_distance(shifted, ref).item() == 2 and prefix_match(shifted, ref).item() == 0.3


def test_extraction_on_four_grids_generates_the_tokens_of_one_process(grid_checkpoint, tmp_path):
    """The model sharded over row, column and depth and the documents split over data and depth replicas
    (1,2,2,1 / 1,1,2,2 / 2,2,1,1 / 1,2,1,2 on 4 gloo ranks, fp32, one job) give the greedy tokens of the
    unsharded model decoding every document in one process, up to fp32 near-ties; and so do beam search (width 2,
    its batch rows' KV caches reordered on every rank) and hint counting, wherever greedy agrees."""
    import sys as _sys

    _sys.path.insert(0, str(WORKERS))
    import launcher

    root, model, docs, vocab = grid_checkpoint
    cfg = ExtractionConfig(prefix_len=10, suffix_len=12, batch_size=3, beam=2, hints=True)
    serial = extract(model, docs, cfg)["documents"]
    want = [r["generated_ids"] for r in serial]
    out = tmp_path / "grids.json"
    codes, log = launcher.launch("extract_grids.py", 4, timeout=240, extra_env={
        "MODEL_DIR": str(root / "model"), "DOCS": str(root / "docs.json"), "OUT_JSON": str(out), "VOCAB": str(vocab),
        "BEAM": "2", "HINTS": "1"})
    assert codes == [0, 0, 0, 0], log[-3000:]
    got = json.loads(out.read_text())
    adaptive = {k.split()[1]: v for k, v in got.items() if k.startswith("adaptive ")}
    got = {k: v for k, v in got.items() if not k.startswith("adaptive ")}
    assert sorted(adaptive) == sorted(got)
    for grid, rows in adaptive.items():
        for r, g, w, row in zip(serial, got[grid], want, rows):
            if g == w:  # greedy agrees: no near-tie on this document, so the argmax-based attacks agree too
                assert row == [r["beam_rank"], r["hints"], r["longest_run"]], f"grid {grid}, {r['id']}"
    assert sorted(got) == ["1,1,2,2", "1,2,1,2", "1,2,2,1", "2,2,1,1"]
    for grid, gens in got.items():
        for d, g, w in zip(docs, gens, want):
            if g != w:  # equal up to the first difference, which must be a near-tie of the serial logits
                k = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
                with torch.no_grad():
                    logits = model(torch.tensor([d["token_ids"][:10] + w[:k]])).logits[0, -1].double()
                gap = float(logits[w[k]] - logits[g[k]])
                assert gap <= 1e-4 * float(logits.abs().max()), f"grid {grid}, {d['id']}: step {k} not a near-tie"


@pytest.mark.slow
def test_extract_cli_on_a_grid_reports_what_one_process_reports(grid_checkpoint, tmp_path):
    """`torchrun ... eval/extract.py --grid 1,2,2,1` (each rank reading its own shards): the same report."""
    import subprocess
    import sys as _sys

    root, _, docs, _ = grid_checkpoint
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in _texts(root, docs)))
    common = ["--model", str(root / "model"), "--documents", str(tmp_path / "docs.jsonl"), "--prefix", "10",
              "--suffix", "12", "--no-progress", "--json"]
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    one = run_python([str(REPO / "eval" / "extract.py"), *common, "--out", str(tmp_path / "a")], env=env,
                     timeout=300)
    four = subprocess.run([_sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
                           str(REPO / "eval" / "extract.py"), *common, "--grid", "1,2,2,1", "--out",
                           str(tmp_path / "b")], capture_output=True, text=True, env=env, timeout=300)
    assert one.returncode == 0 and four.returncode == 0, one.stderr[-2000:] + four.stderr[-2000:]
    a, b = (json.loads((tmp_path / d / "extraction.json").read_text()) for d in ("a", "b"))
    assert b["grid"] == "1,2,2,1" and len(b["documents"]) == len(a["documents"]) == len(docs)
    assert [d["id"] for d in b["documents"]] == [d["id"] for d in a["documents"]]
    same = sum(x["generated_ids"] == y["generated_ids"] for x, y in zip(a["documents"], b["documents"]))
    assert same >= len(docs) - 1  # fp32 near-ties aside (the test above checks each difference)


def _texts(root, docs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(root / "model"))
    return [tok.decode(d["token_ids"][1:]) for d in docs]


def test_a_training_checkpoint_is_extracted_on_another_grid_without_conversion(grid_checkpoint, tmp_path):
    """A checkpoint in the trainer's sharded format saved on 1,2,2,1 is resharded onto 2,1,1,2 for evaluation
    (no HF export, no rank holding the model) and generates the tokens the HF model generates in one process,
    up to fp32 near-ties of the serial logits."""
    import sys as _sys

    _sys.path.insert(0, str(WORKERS))
    import launcher

    root, model, docs, vocab = grid_checkpoint
    want = [r["generated_ids"] for r in extract(model, docs, ExtractionConfig(prefix_len=10, suffix_len=12,
                                                                             batch_size=3))["documents"]]
    out = tmp_path / "ids.json"
    codes, log = launcher.launch("extract_from_training_checkpoint.py", 4, timeout=240, extra_env={
        "MODEL_DIR": str(root / "model"), "DOCS": str(root / "docs.json"), "OUT_JSON": str(out),
        "VOCAB": str(vocab), "CKPT": str(tmp_path / "checkpoint")})
    assert codes == [0, 0, 0, 0], log[-3000:]
    got = json.loads(out.read_text())
    for d, g, w in zip(docs, got, want):
        if g != w:
            k = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
            with torch.no_grad():
                logits = model(torch.tensor([d["token_ids"][:10] + w[:k]])).logits[0, -1].double()
            assert float(logits[w[k]] - logits[g[k]]) <= 1e-4 * float(logits.abs().max()), (d["id"], k)
    assert sum(g == w for g, w in zip(got, want)) >= len(docs) - 1


# --- edge cases: token-less Rouge-L, out-of-vocabulary ids, batch size, BOS on --documents

def test_rouge_l_of_texts_without_tokens():
    """A suffix that decodes to nothing Rouge can tokenise (newlines, special tokens), reproduced
    exactly, is a perfect match, not 0; against a non-empty text it is still 0."""
    assert rouge_l(["", "\n\n  \n"], ["", "\n\t\n"]) == [1.0, 1.0]
    assert rouge_l(["x", ""], ["", "x"]) == [0.0, 0.0]


def _tiny_llama_ctx(vocab=300, ctx=256):
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
        extract(_tiny_llama_ctx(), docs, ExtractionConfig(prefix_len=50, suffix_len=50))


def test_extraction_batch_size_is_validated(tmp_path, capsys):
    with pytest.raises(ValueError, match="batch size"):
        ExtractionConfig(batch_size=0)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "d.txt").write_text("some text")
    with pytest.raises(SystemExit, match="--batch-size must be >= 1"):
        load_eval_cli("extract").main(["--model", str(tmp_path / "m"), "--documents", str(tmp_path / "d.txt"),
                               "--batch-size", "0", "--no-progress"])


def test_documents_get_a_bos_as_the_memorize_run_gave_its_targets(tmp_path, monkeypatch):
    """``--documents`` with a tokenizer that adds no BOS by itself: the memorize run trained on
    ``[bos] doc`` (memorization.data.mixture), so extraction must prefix the same BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    import memorization.evaluation.extraction as ex

    texts = [f"document {i}: the quick brown fox jumps over the lazy dog near tree {i}" for i in range(3)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                      show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="</s>")
    assert tok("fox")["input_ids"][0] != tok.bos_token_id  # no post-processor: no BOS of its own
    _tiny_llama_ctx(vocab=len(tok)).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    (tmp_path / "d.txt").write_text("\n\n".join(texts))
    seen = []
    real = ex.extract
    monkeypatch.setattr(ex, "extract", lambda model, docs, *a, **k: seen.extend(docs) or real(model, docs, *a, **k))
    load_eval_cli("extract").main(["--model", str(tmp_path / "m"), "--documents", str(tmp_path / "d.txt"), "--prefix", "4",
                           "--suffix", "4", "--device", "cpu", "--no-progress", "--json"])
    assert len(seen) == 3
    assert [d["token_ids"] for d in seen] == [[tok.bos_token_id] + tok(t)["input_ids"] for t in texts]


# ------------------------------------------------------------ sampled ((n, p)-discoverable) extraction


def _memorizer(vocab: int = 64):
    """A tiny Llama trained to continue one sequence: its greedy continuation is that sequence."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64))
    seq = torch.randint(1, vocab, (1, 24))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        loss = model(input_ids=seq, labels=seq).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), seq[0].tolist()


def test_sampling_with_top_k_1_is_greedy_and_draws_do_not_depend_on_the_batch():
    """top_k = 1 leaves one token to sample: every sample is the greedy continuation, so a memorized document is
    sampled-extracted n out of n times and the others as often as greedy extracts them; with top_k = 0 and a
    high temperature the draws of a document are the same in any batch (seeded by the document's id alone) and
    differ between seeds."""
    from memorization.evaluation.extraction import sample_continue

    model, seq = _memorizer()
    docs = [{"id": "mem", "token_ids": seq, "exposures": 1},
            {"id": "other", "token_ids": list(range(3, 27)), "exposures": 1}]
    cfg = ExtractionConfig(prefix_len=8, suffix_len=8, batch_size=2, samples=3, top_k=1)
    res = extract(model, docs, cfg)
    by_id = {d["id"]: d for d in res["documents"]}
    assert by_id["mem"]["exact_match"] and by_id["mem"]["sampled_matches"] == 3
    for d in res["documents"]:
        assert d["sampled_matches"] == (3 if d["exact_match"] else 0)
    assert res["overall"]["sampled_any"] == res["overall"]["exact_match"]
    prefixes, keys = [seq[:8], list(range(3, 11)), seq[2:10]], [11, 22, 33]
    one = sample_continue(model, prefixes, keys, 6, 4, temperature=5.0, top_k=0, seed=1, batch_size=1)
    together = sample_continue(model, prefixes, keys, 6, 4, temperature=5.0, top_k=0, seed=1, batch_size=5)
    alone = sample_continue(model, prefixes[2:], keys[2:], 6, 4, temperature=5.0, top_k=0, seed=1, batch_size=3)
    assert one == together and one[2] == alone[0]
    assert sample_continue(model, prefixes, keys, 6, 4, temperature=5.0, top_k=0, seed=2, batch_size=5) != one
    with pytest.raises(ValueError, match="temperature > 0"):
        ExtractionConfig(samples=2, temperature=0.0)


# --- a manifest target with a bad exposure count is refused before loading

@pytest.mark.parametrize("bad, what", [(-1, "exposures -1"), (1.5, "exposures 1.5"), ("x", "exposures 'x'")])
def test_extract_refuses_a_manifest_target_with_a_bad_exposure_count(tmp_path, tokenizer, monkeypatch, bad, what):
    """``eval/extract.py --manifest`` reads the manifest with the one manifest check that MIA and perplexity use,
    before the model loads: a target with exposures -1 (counted as trained in the overall rate, where only
    exposure 0 is a control) or 1.5 (a group of its own) is refused."""
    import transformers

    LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    target = {"id": "t0", "token_ids": [1, 5, 6, 7], "exposures": bad}
    (tmp_path / "manifest.json").write_text(json.dumps({"version": 1, "targets": [target], "nonmembers": []}))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model loaded before the manifest was checked"))
    with pytest.raises(SystemExit, match=f"targets\\[0\\] has {what}"):
        load_eval_cli("extract").main(["--model", str(tmp_path / "m"), "--manifest", str(tmp_path / "manifest.json"),
                                   "--no-progress"])


# ------------------------------------------------------------ bad documents are refused before the model loads

@pytest.fixture
def weightless_model_dir(tmp_path, tokenizer):
    """A model directory with a config (context 64) and a tokenizer, but no weights: loading them fails."""
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=64).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path


@pytest.mark.parametrize("ids, flags, match", [
    (list(range(1, 11)), ["--prefix", "8", "--suffix", "8"],
     r"document 't0' has 10 tokens, fewer than prefix \+ suffix = 16: lower --prefix/--suffix or pass --skip-short"),
    (list(range(1, 101)), ["--prefix", "50", "--suffix", "50"], r"prefix \+ suffix = 100 tokens exceeds the model's "
                                                                r"context \(64 tokens\)"),
    ([1, 2, 3, 10**6, 5, 6, 7, 8], ["--prefix", "4", "--suffix", "4"], r"document 't0' has token id 1000000, outside "
                                                                       r"the model's vocabulary"),
])
def test_extract_refuses_bad_documents_before_the_model_loads(weightless_model_dir, monkeypatch, ids, flags, match):
    import transformers

    manifest = {"version": 1, "targets": [{"id": "t0", "token_ids": ids, "exposures": 4}], "nonmembers": []}
    (weightless_model_dir / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model loaded before the documents were checked"))
    with pytest.raises(SystemExit, match=match):
        load_eval_cli("extract").main(["--model", str(weightless_model_dir / "m"), "--manifest",
                                   str(weightless_model_dir / "manifest.json"), "--no-progress", *flags])
