"""Membership-inference scores and their ROC evaluation (memorization/evaluation/mia/, eval/mia.py).

A tiny Llama (2 layers, hidden 64) with a locally trained byte-level BPE tokenizer is
overfitted on a few "member" documents; held-out documents of the same synthetic
distribution are the nonmembers.  Everything runs offline on CPU in a few seconds.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import pytest
import torch

from memorization.evaluation import downstream as ds
from memorization.evaluation import mia
from memorization.lm import LM, logprobs, pad_batch
from tests.support import REPO, WORKERS, load_eval_cli, one_thread


WORDS = (
    "amber basil cedar delta ember fjord grove harbor island jasper kelp lumen meadow nectar "
    "orchid pebble quartz river saffron tundra umber violet willow xenon yarrow zephyr alpine "
    "breeze canyon dune estuary forest glacier hollow inlet juniper lagoon marsh nimbus ocean "
    "prairie quarry ridge summit thicket valley wetland"
).split()


def _make_text(rng: random.Random, n_words: int) -> str:
    sents = []
    while sum(len(s.split()) for s in sents) < n_words:
        k = rng.randint(5, 10)
        sents.append(" ".join(rng.choice(WORDS) for _ in range(k)).capitalize() + ".")
    return " ".join(sents)


def build_tiny_checkpoint(path: Path, *, seed: int = 0, corpus: list[str] | None = None):
    """Save an untrained tiny LlamaForCausalLM + a locally trained BPE tokenizer to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    rng = random.Random(1234)
    corpus = corpus or [_make_text(rng, 60) for _ in range(300)]
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return model, tok




def overfit(model, docs: list[list[int]], steps: int = 40, lr: float = 3e-3) -> None:
    """Full-batch AdamW on ``docs`` (token-id lists) until they are memorised."""
    ids, mask = pad_batch(docs)
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    with one_thread():
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()


def load_cli(name: str):
    """Import ``eval/<name>.py`` as a module (the CLIs live outside the package)."""
    spec = importlib.util.spec_from_file_location(f"_cli_{name}", REPO / "eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mia_env(tmp_path_factory):
    """Reference (untrained) checkpoint, target checkpoint overfitted on the members, and a
    manifest with members (exposures 1 and 3), controls (exposures 0) and nonmembers."""
    root = tmp_path_factory.mktemp("mia")
    ref_dir, tgt_dir = root / "ref", root / "target"
    model, tok = build_tiny_checkpoint(ref_dir)
    rng = random.Random(7)
    texts = [_make_text(rng, 20) for _ in range(40)]
    ids = [[tok.bos_token_id] + tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    members, controls, nonmembers = list(range(0, 12)), list(range(12, 20)), list(range(20, 40))
    exposures = {i: (1 if i < 6 else 3) for i in members}
    train_docs = [ids[i] for i in members for _ in range(exposures[i])]
    overfit(model, train_docs)
    model.save_pretrained(tgt_dir)
    tok.save_pretrained(tgt_dir)
    manifest = {
        "version": 1,
        "targets": [{"id": f"t{i}", "text": texts[i], "token_ids": ids[i][1:],
                     "exposures": exposures.get(i, 0), "steps": []}
                    for i in members + controls],
        "nonmembers": [{"id": f"n{i}", "text": texts[i], "token_ids": ids[i][1:]}
                       for i in nonmembers],
    }
    man_path = root / "manifest.json"
    man_path.write_text(json.dumps(manifest))
    return {"root": root, "ref": ref_dir, "target": tgt_dir, "manifest": man_path,
            "model": model, "tok": tok, "ids": ids, "texts": texts,
            "members": members, "nonmembers": nonmembers}


# --------------------------------------------------------------------------- ROC / AUC


def test_auc_known_values():
    assert mia.roc_auc([3, 4, 5], [0, 1, 2]) == 1.0
    assert mia.roc_auc([0, 1, 2], [3, 4, 5]) == 0.0
    assert mia.roc_auc([1, 1, 1], [1, 1]) == 0.5
    x = np.random.default_rng(0).normal(size=50)
    assert mia.roc_auc(x, x) == pytest.approx(0.5)
    # hand-computed: pairs won 2 + 2 + 1 of 6
    assert mia.roc_auc([0.9, 0.8, 0.4], [0.7, 0.3]) == pytest.approx(5 / 6)
    # ties count half: (0 + 1 + 0.5 + 1) / 4
    assert mia.roc_auc([1, 2], [2, 0]) == pytest.approx(0.625)


def test_roc_curve_area_equals_auc_and_matches_sklearn():
    rng = np.random.default_rng(1)
    pos = np.round(rng.normal(0.7, 1, 200), 1)  # rounding makes ties
    neg = np.round(rng.normal(0.0, 1, 300), 1)
    fpr, tpr, thr = mia.roc_curve(pos, neg)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.all(np.diff(fpr) >= 0) and np.all(np.diff(tpr) >= 0)
    area = float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) / 2))
    assert area == pytest.approx(mia.roc_auc(pos, neg), abs=1e-12)
    metrics = pytest.importorskip("sklearn.metrics")
    y = np.r_[np.ones_like(pos), np.zeros_like(neg)]
    s = np.r_[pos, neg]
    assert mia.roc_auc(pos, neg) == pytest.approx(metrics.roc_auc_score(y, s), abs=1e-12)
    sk_fpr, sk_tpr, _ = metrics.roc_curve(y, s, drop_intermediate=False)
    np.testing.assert_allclose(np.interp(0.05, sk_fpr, sk_tpr), mia.tpr_at_fpr(fpr, tpr, 0.05))


def test_tpr_at_1pct_fpr_known_cases():
    neg = np.arange(100.0)  # 100 nonmembers: FPR steps of 1%
    pos = np.r_[np.full(5, 99.5), np.full(5, -1.0)]  # half above every nonmember
    fpr, tpr, _ = mia.roc_curve(pos, neg)
    assert mia.tpr_at_fpr(fpr, tpr, 0.01) == pytest.approx(0.5)
    assert mia.tpr_at_fpr(fpr, tpr, 0.0) == pytest.approx(0.5)
    # 50 nonmembers: 4 of 10 members tie with the top nonmember -> diagonal segment
    # (0, 0) -> (0.02, 0.4); at FPR 1% the interpolated TPR is 0.2.
    neg = np.arange(50.0)
    pos = np.r_[np.full(4, 49.0), np.full(6, -1.0)]
    fpr, tpr, _ = mia.roc_curve(pos, neg)
    assert mia.tpr_at_fpr(fpr, tpr, 0.01) == pytest.approx(0.2)
    # perfectly separated -> TPR 1 at any FPR
    fpr, tpr, _ = mia.roc_curve([5, 6], [1, 2])
    assert mia.tpr_at_fpr(fpr, tpr, 0.01) == 1.0


def test_report_orients_scores_and_breaks_down_by_exposure():
    members = {"loss": np.array([0.1, 0.2, 5.0, 5.1]), "min_k": np.array([-1, -1, -9, -9.0])}
    nonmembers = {"loss": np.array([3.0, 4.0]), "min_k": np.array([-5.0, -6.0])}
    rep = mia.mia_report(members, nonmembers, member_exposures=[4, 4, 0, 0])
    # exposures-0 controls are excluded from the overall numbers
    assert rep["scores"]["loss"]["auc"] == 1.0 and rep["scores"]["loss"]["n_members"] == 2
    assert rep["scores"]["min_k"]["auc"] == 1.0
    assert rep["scores"]["loss"]["by_exposure"]["0"]["auc"] == 0.0
    assert rep["scores"]["loss"]["by_exposure"]["4"]["n_members"] == 2
    assert rep["fpr_resolution"] == 0.5
    md = mia.report_markdown(rep)
    assert "| `loss` | 1.000 | 1.000 |" in md and "AUC e=4" in md


# --------------------------------------------------------------------------- scores


def test_scores_match_per_document_reference(mia_env):
    """Batched, padded scores equal an unbatched per-document computation."""
    model, ids = mia_env["model"], mia_env["ids"][:5]
    texts = mia_env["texts"][:5]
    s = mia.mia_scores(model, mia_env["tok"], ids, batch_size=3, texts=texts, k=0.2)
    for i, d in enumerate(ids):
        x = torch.tensor([d])
        with torch.no_grad():
            logp = torch.log_softmax(model(x).logits[0, :-1].float(), -1)
        lp = logp.gather(1, x[0, 1:, None])[:, 0].double().numpy()
        assert s["loss"][i] == pytest.approx(-lp.mean(), rel=1e-4)
        kk = max(1, int(0.2 * len(lp)))
        assert s["min_k"][i] == pytest.approx(np.sort(lp)[:kk].mean(), rel=1e-4)
        import zlib
        assert s["zlib"][i] == pytest.approx(-lp.mean() / len(zlib.compress(texts[i].encode())),
                                             rel=1e-4)
        assert s["n_tokens"][i] == len(d) - 1


def test_row_chunked_logprobs_match(mia_env, monkeypatch):
    """Large batches are converted to log-probs in row groups; the result is unchanged."""
    model, ids = mia_env["model"], mia_env["ids"][:6]
    full = mia.mia_scores(model, None, ids, batch_size=6)
    monkeypatch.setattr(logprobs, "LOGIT_CHUNK_ELEMENTS", 1)  # one row at a time
    rows = mia.mia_scores(model, None, ids, batch_size=6)
    np.testing.assert_allclose(rows["loss"], full["loss"], rtol=1e-6)
    np.testing.assert_allclose(rows["min_k"], full["min_k"], rtol=1e-6)


def test_overfit_members_are_detected(mia_env):
    model, tok, ids = mia_env["model"], mia_env["tok"], mia_env["ids"]
    mem = [ids[i] for i in mia_env["members"]]
    non = [ids[i] for i in mia_env["nonmembers"]]
    sm = mia.mia_scores(model, tok, mem, batch_size=8)
    sn = mia.mia_scores(model, tok, non, batch_size=8)
    assert sm["loss"].mean() < sn["loss"].mean()
    assert sm["zlib"].mean() < sn["zlib"].mean()  # lower = member
    assert sm["min_k"].mean() > sn["min_k"].mean()  # higher = member
    rep = mia.mia_report(sm, sn)
    for name in ("loss", "zlib", "min_k"):
        assert rep["scores"][name]["auc"] > 0.8, (name, rep["scores"][name])


def test_ref_diff_is_the_loss_minus_the_reference_models_loss(mia_env):
    from transformers import AutoModelForCausalLM

    model, tok, ids = mia_env["model"], mia_env["tok"], mia_env["ids"]
    ref = AutoModelForCausalLM.from_pretrained(mia_env["ref"]).eval()
    mem = [ids[i] for i in mia_env["members"]]
    non = [ids[i] for i in mia_env["nonmembers"]]
    sm = mia.mia_scores(model, tok, mem, batch_size=5, reference_model=ref)
    sn = mia.mia_scores(model, tok, non, batch_size=5, reference_model=ref)
    direct = mia.mia_scores(ref, tok, mem, batch_size=5)["loss"]
    np.testing.assert_allclose(sm["ref_loss"], direct, rtol=1e-5)
    np.testing.assert_allclose(sm["ref_diff"], sm["loss"] - direct, rtol=1e-5)
    assert mia.mia_report(sm, sn)["scores"]["ref_diff"]["auc"] > 0.8
    # the model as its own reference gives a zero difference
    self_ref = mia.mia_scores(model, tok, mem[:3], reference_model=model)
    np.testing.assert_allclose(self_ref["ref_diff"], 0.0, atol=1e-6)


def test_bos_is_added_max_length_truncates_and_a_one_token_document_is_nan(mia_env):
    model, tok, ids = mia_env["model"], mia_env["tok"], mia_env["ids"]
    no_bos = [d[1:] for d in ids[:3]]
    with_bos = mia.mia_scores(model, tok, no_bos, add_bos=True)
    plain = mia.mia_scores(model, tok, ids[:3])
    np.testing.assert_allclose(with_bos["loss"], plain["loss"], rtol=1e-6)
    short = mia.mia_scores(model, tok, ids[:3], max_length=10)
    assert (short["n_tokens"] == 9).all()
    # a 1-token document has no scored token -> NaN, which the report drops
    one = mia.mia_scores(model, None, [[5], ids[0]])
    assert math.isnan(one["loss"][0]) and not math.isnan(one["loss"][1])
    assert "zlib" not in one  # no texts and no tokenizer


# --------------------------------------------------------------------------- end to end


def test_run_mia_end_to_end(mia_env, tmp_path):
    rep = mia.run_mia(mia_env["target"], mia_env["manifest"], mia_env["ref"], out_dir=tmp_path,
                      batch_size=8, device="cpu")
    # the 8 never-trained (exposure-0) targets are the nonmembers; the manifest's own
    # nonmembers are of unrecorded origin and are not pooled with them
    assert rep["n_targets"] == 20 and rep["n_members"] == 12 and rep["n_nonmembers"] == 8
    assert rep["nonmember_source"] == "exposure0_targets" and rep["warnings"] == []
    for name in ("loss", "zlib", "min_k", "ref_diff"):
        s = rep["scores"][name]
        assert s["n_members"] == 12 and s["n_nonmembers"] == 8 and s["auc"] > 0.8
        assert set(s["by_exposure"]) == {"1", "3"}
        assert 0.0 <= s["tpr_at_fpr"] <= 1.0
    for f in ("mia.json", "mia.md", "mia_scores.jsonl", "mia_roc.png"):
        assert (tmp_path / f).stat().st_size > 0
    rows = [json.loads(x) for x in (tmp_path / "mia_scores.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and rows[0]["split"] == "target" and "ref_diff" in rows[0]
    controls = [r for r in rows if r["split"] == "nonmember"]
    assert len(controls) == 8 and all(r["from"] == "targets" and r["exposures"] == 0
                                      for r in controls)
    assert json.loads((tmp_path / "mia.json").read_text())["scores"]["loss"]["auc"] > 0.8


def _write_manifest(path: Path, targets: list[dict], nonmembers: list[dict], **extra) -> Path:
    path.write_text(json.dumps({"version": 1, **extra, "targets": targets,
                                "nonmembers": nonmembers}))
    return path


def test_zlib_and_reference_score_exactly_the_scored_span(mia_env, tmp_path):
    """As in a mixture manifest, token_ids are a truncated prefix of the text.  zlib must
    compress the decoded scored tokens, not the whole text, and the reference model must
    score the same span -- also when its tokenizer differs and it re-tokenises."""
    import zlib

    from transformers import AutoTokenizer

    tok, texts = mia_env["tok"], mia_env["texts"]

    def doc(i: int, n_texts: int = 2) -> dict:
        text = " ".join(texts[i : i + n_texts])
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) > 30
        return {"text": text, "token_ids": ids[:30]}

    # two documents with the same 30 scored tokens, one twice as long as the other in text
    docs = [{"id": "short", **doc(0), "exposures": 1},
            {"id": "long", **doc(0, 4), "exposures": 1}]
    assert docs[0]["token_ids"] == docs[1]["token_ids"]
    docs += [{"id": f"t{i}", **doc(i), "exposures": 1} for i in range(2, 8)]
    non = [{"id": f"n{i}", **doc(i)} for i in mia_env["nonmembers"][:8]]
    man = _write_manifest(tmp_path / "m.json", docs, non)
    # the target model as its own reference, saved with a tokenizer that has one extra
    # (unused) token: a different vocabulary, so run_mia re-tokenises for the reference
    ref_dir = tmp_path / "self_ref"
    mia_env["model"].save_pretrained(ref_dir)
    ref_tok = AutoTokenizer.from_pretrained(mia_env["target"])
    ref_tok.add_tokens(["<never-used>"])
    ref_tok.save_pretrained(ref_dir)
    assert not mia.scoring._same_vocab(tok, ref_tok)
    for max_length in (None, 20):  # 31 tokens with BOS; 20 truncates further
        out = tmp_path / f"out{max_length}"
        mia.run_mia(mia_env["target"], man, ref_dir, out_dir=out, device="cpu",
                    max_length=max_length, batch_size=4)
        rows = {r["id"]: r for r in map(json.loads, (out / "mia_scores.jsonl").read_text()
                                        .splitlines())}
        assert len(rows) == 16
        assert rows["short"]["zlib"] == rows["long"]["zlib"]
        n = 30 if max_length is None else max_length - 1  # scored tokens (after BOS)
        for d in docs + non:
            r = rows[d["id"]]
            assert r["n_tokens"] == n
            scored = tok.decode(d["token_ids"][:n], skip_special_tokens=True)
            assert r["zlib"] == pytest.approx(r["loss"] / len(zlib.compress(scored.encode())),
                                              rel=1e-9)
            # same model, same span -> zero difference
            assert r["ref_diff"] == pytest.approx(0.0, abs=1e-6), d["id"]


def _user_manifest(mia_env, path: Path, with_controls: bool, source: str = "user") -> Path:
    """Members (exposures 1/3) and optional exposure-0 targets from the synthetic corpus, and
    "background" nonmembers of a visibly different distribution (digit strings)."""
    tok, ids, texts = mia_env["tok"], mia_env["ids"], mia_env["texts"]
    exposures = {i: (1 if i < 6 else 3) for i in mia_env["members"]}
    idx = mia_env["members"] + (list(range(12, 20)) if with_controls else [])
    prefix = "user" if source == "user" else "doc"
    targets = [{"id": f"{prefix}-{i:05d}", "text": texts[i], "token_ids": ids[i][1:],
                "exposures": exposures.get(i, 0)} for i in idx]
    rng = random.Random(3)
    bg = [" ".join(str(rng.randint(0, 99999)) for _ in range(12)) for _ in range(10)]
    non = [{"id": f"doc-{j:06d}", "text": t, "token_ids": tok(t, add_special_tokens=False)
            ["input_ids"]} for j, t in enumerate(bg)]
    return _write_manifest(path, targets, non, targets_source=source)


def test_user_targets_are_compared_with_their_exposure0_controls(mia_env, tmp_path):
    man = _user_manifest(mia_env, tmp_path / "m.json", with_controls=True)
    rep = mia.run_mia(mia_env["target"], man, out_dir=tmp_path, device="cpu")
    assert rep["nonmember_source"] == "exposure0_targets" and rep["warnings"] == []
    assert rep["n_members"] == 12 and rep["n_nonmembers"] == 8
    # the reported AUC is members vs the 8 held-out user documents, not vs the background
    model, tok, ids = mia_env["model"], mia_env["tok"], mia_env["ids"]
    mem = mia.mia_scores(model, tok, [ids[i] for i in mia_env["members"]])["loss"]
    ctl = mia.mia_scores(model, tok, [ids[i] for i in range(12, 20)])["loss"]
    assert rep["scores"]["loss"]["auc"] == pytest.approx(mia.roc_auc(-mem, -ctl), abs=1e-12)
    assert rep["scores"]["loss"]["n_nonmembers"] == 8
    assert "exposures = 0" in rep["markdown"] and "Warning" not in rep["markdown"]
    # with targets drawn from the corpus, controls and held-out corpus documents are pooled
    man = _user_manifest(mia_env, tmp_path / "c.json", with_controls=True, source="corpus")
    rep = mia.run_mia(mia_env["target"], man, device="cpu")
    assert rep["nonmember_source"] == "exposure0_targets+heldout_corpus"
    assert rep["n_nonmembers"] == 18 and rep["warnings"] == []


def test_user_targets_without_controls_warn_about_background_nonmembers(mia_env, tmp_path,
                                                                       caplog):
    man = _user_manifest(mia_env, tmp_path / "m.json", with_controls=False)
    with caplog.at_level("WARNING", logger="memorization.evaluation.mia"):
        rep = mia.run_mia(mia_env["target"], man, out_dir=tmp_path, device="cpu")
    assert rep["nonmember_source"] == "background_corpus" and rep["n_nonmembers"] == 10
    assert any("--exposures 0,N" in r.getMessage() for r in caplog.records)
    assert len(rep["warnings"]) == 1 and "background corpus" in rep["warnings"][0]
    md = (tmp_path / "mia.md").read_text()
    assert "**Warning:**" in md and "--exposures 0,N" in md and "NOT the user's" in md
    saved = json.loads((tmp_path / "mia.json").read_text())
    assert saved["nonmember_source"] == "background_corpus" and saved["warnings"]
    # older manifests without targets_source: user targets are recognised by their ids
    m = json.loads(man.read_text())
    del m["targets_source"]
    man.write_text(json.dumps(m))
    assert mia.run_mia(mia_env["target"], man, device="cpu")["nonmember_source"] == \
        "background_corpus"


def test_mia_cli_writes_its_report_and_refuses_a_missing_model(mia_env, tmp_path, capsys):
    cli = load_cli("mia")
    rc = cli.main(["--model", str(mia_env["target"]), "--manifest", str(mia_env["manifest"]),
                   "--reference-model", str(mia_env["ref"]), "--out", str(tmp_path),
                   "--device", "cpu"])
    assert rc == 0
    assert "| `ref_diff` |" in capsys.readouterr().out
    assert (tmp_path / "mia.json").exists()
    # a bad path is a clear error with exit code 2, not a traceback
    assert cli.main(["--model", str(tmp_path / "nope"), "--manifest",
                     str(mia_env["manifest"])]) == 2
    assert capsys.readouterr().err == f"error: --model {tmp_path / 'nope'} does not exist\n"


def test_missing_tokenizer_is_clear(mia_env, tmp_path):
    from transformers import AutoModelForCausalLM

    bare = tmp_path / "bare"
    AutoModelForCausalLM.from_pretrained(mia_env["ref"]).save_pretrained(bare)
    with pytest.raises(mia.MissingTokenizerError, match="no tokenizer"):
        mia.load_checkpoint(bare, device="cpu")
    # MIA itself only needs token ids: a manifest with token_ids works without a tokenizer
    rep = mia.run_mia(bare, mia_env["manifest"], device="cpu")
    assert "loss" in rep["scores"]


def test_min_k_pp_is_the_mean_of_the_lowest_standardised_log_probs():
    """Min-K%++ against a float64 implementation written from the paper's formula, position by position:
    z_t = (log p_t - E_p[log p]) / sqrt(Var_p[log p]) over the model's next-token distribution, then the mean
    of the lowest max(1, floor(k (n-1))) z_t of each document (documents of different lengths, padded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from memorization.evaluation.mia import mia_scores

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=50)).eval()
    docs = [torch.randint(0, 50, (n,)).tolist() for n in (12, 7, 20)]
    k = 0.3
    got = mia_scores(model, None, docs, batch_size=2, k=k, texts=["a", "b", "c"])["min_k_pp"]
    for d, g in zip(docs, got):
        with torch.no_grad():
            lsm = model(torch.tensor([d])).logits[0, :-1].double().log_softmax(-1)
        p = lsm.exp()
        mu = (p * lsm).sum(-1)
        sigma = ((p * lsm**2).sum(-1) - mu**2).sqrt()
        z = (lsm.gather(-1, torch.tensor(d[1:])[:, None])[:, 0] - mu) / sigma
        want = z.sort().values[: max(1, int(k * (len(d) - 1)))].mean().item()
        assert g == pytest.approx(want, rel=1e-4, abs=1e-5)


@pytest.mark.slow  # (~65 s on 2 cores; the default suite checks extraction on the same four grids)
def test_mia_on_four_grids_scores_what_one_process_scores(grid_checkpoint, tmp_path):
    """Every score of every document (loss, zlib, Min-k%, Min-K%++, the reference difference) from the model
    sharded over row, column and depth with the documents split over data and depth replicas (1,2,2,1 /
    1,1,2,2 / 2,2,1,1 / 1,2,1,2 on 4 gloo ranks, fp32) equals the single-process score to 1e-5."""
    import sys as _sys

    from memorization.evaluation.mia import run_mia

    _sys.path.insert(0, str(WORKERS))
    import launcher

    root, _, docs, _ = grid_checkpoint
    manifest = {"targets": [{**d, "exposures": 1 + i % 2} for i, d in enumerate(docs[:4])]
                + [{**d, "exposures": 0} for d in docs[4:]], "nonmembers": []}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    run_mia(root / "model", tmp_path / "manifest.json", root / "model", batch_size=2, out_dir=tmp_path / "one")
    codes, log = launcher.launch("mia_grids.py", 4, timeout=240, extra_env={
        "MODEL_DIR": str(root / "model"), "MANIFEST": str(tmp_path / "manifest.json"), "OUT_DIR": str(tmp_path)})
    assert codes == [0, 0, 0, 0], log[-3000:]

    def rows(d):
        return [json.loads(x) for x in (tmp_path / d / "mia_scores.jsonl").read_text().splitlines()]

    want = rows("one")
    names = ("loss", "zlib", "min_k", "min_k_pp", "ref_diff", "ref_loss")
    for grid in ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"):
        got = rows(grid)
        assert [r["id"] for r in got] == [r["id"] for r in want]
        for g, w in zip(got, want):
            for n in names:
                assert g[n] == pytest.approx(w[n], rel=1e-5, abs=1e-6), (grid, g["id"], n)


# ------------------------------------------------------------ edge cases and bad input

def _tiny_config(vocab: int = 100, ctx: int = 64):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ctx)


def _refuse(*args, **kwargs):
    pytest.fail("the model was loaded before the input was checked")


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(_tiny_config()).eval()


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
    # batch_size -1 would give all-NaN scores silently (no batch runs), 0 a bare range() error
    for bs in (-1, 0):
        with pytest.raises(ValueError, match="batch_size must be an integer >= 1"):
            mia.mia_scores(tiny, None, doc, batch_size=bs)
    # max_length -2 would cut the last 2 tokens off every document (d[:-2]) and score the rest
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
    _tiny_config().save_pretrained(tmp_path / "m")
    (tmp_path / "m.json").write_text(json.dumps({"version": 1, "targets": [
        {"id": "t", "token_ids": [1, 2, 3], "exposures": 1}], "nonmembers": [{"id": "n", "token_ids": [4, 5]}]}))
    monkeypatch.setattr(LM, "load", _refuse)
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
    monkeypatch.setattr(LM, "load", _refuse)
    rc = load_eval_cli("mia").main(["--model", str(tmp_path / "m"), "--manifest", str(man), "--device", "cpu"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error:" in err and str(man) in err


def test_manifest_that_is_not_json_names_the_file(tmp_path):
    (tmp_path / "m.json").write_text('{"version": 1, "targets": [')
    with pytest.raises(ValueError, match=r"manifest .*m\.json is not valid JSON"):
        mia.load_manifest(tmp_path / "m.json")


# ------------------------------------------------------------ the MIA CLI checks its numbers before loading

def _refuse_work(*args, **kwargs):
    pytest.fail("work started before the input was checked")


@pytest.mark.parametrize("flags, match", [(["--k", "20"], "--k 20"), (["--fpr", "1.5"], "--fpr 1.5"),
                                          (["--batch-size", "0"], "--batch-size 0"),
                                          (["--max-length", "1"], "--max-length 1")])
def test_mia_cli_checks_its_numbers_before_loading(tmp_path, monkeypatch, capsys, flags, match):
    cli = load_eval_cli("mia")
    monkeypatch.setattr(cli, "evaluate", _refuse_work)
    assert cli.main(["--model", str(tmp_path), "--manifest", str(tmp_path / "m.json"), *flags]) == 2
    assert match in capsys.readouterr().err


# --- a manifest document with out-of-vocabulary ids is named by its id

def test_run_mia_names_the_manifest_document_whose_token_ids_are_outside_the_vocabulary(tmp_path):
    """docs/eval.md: token ids outside the model's vocabulary are refused, "naming the document".
    run_mia reported the document's place in members + nonmembers ("document 1": here the
    exposure-0 control, which is the manifest's targets[0]), which the user cannot find in the
    manifest; eval/extract.py names the document by its id."""
    from transformers import LlamaConfig, LlamaForCausalLM

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
