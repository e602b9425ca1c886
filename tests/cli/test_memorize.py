"""recipes/memorize.py end to end on a very small setting, and every bad input refused before training."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forked import run_python
from tests.support import REPO

sys.path.insert(0, str(REPO / "recipes"))
import memorize  # noqa: E402

sys.path.insert(0, str(REPO / "eval"))
import extract as extract_cli  # noqa: E402

from memorization.experiment import read_targets, validate  # noqa: E402
from memorization.experiment.data import mixture_config, targets_text_field  # noqa: E402

SMALL = ["--num-targets", "4", "--num-nonmembers", "2", "--exposures", "2", "--steps", "12", "--prefix", "10",
         "--suffix", "10", "--seq-len", "64", "--no-progress", "--checkpoint-every", "5"]


def _check_attack_outputs(out) -> None:
    """The adaptive attacks, canaries and MIA of a run: zero hints is exactly greedy exact match (the hinted decoder
    never needs a hint iff greedy reproduces the suffix); the suffix's place among the beams is consistent; every
    canary has an exposure in [0, 2 log2 10], and its copies lie in rows holding no target; MIA reports every score
    for members of exposure 2 against the exposure-0 targets and held-out documents."""
    data = json.loads((out / "results.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    target_rows = {r for t in manifest["targets"] for r in t["rows"]}
    canaries = json.loads((out / "canaries.json").read_text())
    assert [c["exposures"] for c in canaries] == [0, 2, 0, 2]
    assert all(len(c["rows"]) == c["exposures"] and not target_rows & set(c["rows"]) for c in canaries)
    for arm in ("standard", "goldfish", "equal-tokens"):
        ext = json.loads((out / arm / "extraction.json").read_text())
        for d in ext["documents"]:
            assert (d["hints"] == 0) == d["exact_match"] and 0 <= d["longest_run"] <= 10
            assert d["beam_match"] == (d["beam_rank"] is not None) and d["beam_top1"] == (d["beam_rank"] == 1)
        a = data["arms"][arm]
        assert {c["id"] for c in a["canaries"]["canaries"]} == {c["id"] for c in canaries}
        assert all(0 <= c["exposure"] <= 2 * math.log2(10) + 1e-9 for c in a["canaries"]["canaries"])
        assert set(a["canaries"]["by_exposure"]) == {"0", "2"}
        assert set(a["mia"]["scores"]) == {"loss", "zlib", "min_k", "min_k_pp"}
        assert all(0 <= s["auc"] <= 1 and s["n_members"] == 4 for s in a["mia"]["scores"].values())
    md = (out / "results.md").read_text()
    assert "## Adaptive extraction" in md and "## Canary exposure" in md and "## Membership inference" in md


def test_small_run_writes_results_for_every_arm(tmp_path):
    """Also the science options on one run (so their outputs cost one more small arm): the equal-supervised-tokens
    arm, placement with a common last exposure, the static fallback for document starts, tracking during
    training, more prefix:suffix pairs and sampled extraction."""
    out = tmp_path / "run"
    science = ["--arms", "all", "--placement", "last", "--goldfish-doc-start", "static", "--track-every", "6",
               "--extract-lengths", "5:5,all:8", "--samples", "2", "--beam", "2", "--hints", "--mia",
               "--canaries", "4", "--canary-exposures", "0,2", "--canary-digits", "2"]
    res = memorize.main(SMALL + ["--out", str(out)] + science)
    _check_attack_outputs(out)
    data = json.loads((out / "results.json").read_text())
    for arm in ("standard", "goldfish", "equal-tokens"):
        a = data["arms"][arm]
        for key in ("exact_match", "token_match", "rouge_l", "val_loss"):
            assert 0 <= a[key] if key != "val_loss" else a[key] > 0
        assert (out / arm / "model" / "model.safetensors").exists()
    assert data["arms"]["goldfish"]["goldfish_drop_frac"] > 0.1
    assert data["arms"]["standard"]["goldfish_drop_frac"] == 0
    assert data["settings"]["goldfish_k"] == 4 and data["settings"]["exposures"] == "2"
    assert (out / "results.md").read_text().count("| standard") >= 1
    # the rates carry their 95% interval, and the arms are compared pairwise on the same targets
    for arm in ("standard", "goldfish"):
        lo, hi = data["arms"][arm]["exact_match_ci95"]
        assert 0 <= lo <= data["arms"][arm]["exact_match"] <= hi <= 1 and hi - lo > 0.2  # 4 targets: wide
        assert set(data["arms"][arm]["exact_by_target"]) == {t["id"] for t in json.loads(
            (out / "manifest.json").read_text())["targets"]}
    paired = data["paired_exact_match"]
    st, gf = (data["arms"][a]["exact_by_target"] for a in ("standard", "goldfish"))
    assert paired["n"] == 4 and paired["only_a"] == sum(st[d] and not gf[d] for d in st)
    assert "exact McNemar test p =" in (out / "results.md").read_text()
    assert (out / "results.png").stat().st_size > 1000
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(len(t["steps"]) == 2 for t in manifest["targets"])
    from memorization.data.corpus import PYDOCS_SHA256, TOKENIZER_SHA256  # the data the run was built from

    assert (manifest["corpus_sha256"], manifest["tokenizer_sha256"]) == (PYDOCS_SHA256, TOKENIZER_SHA256)
    assert res["arms"].keys() == {"standard", "goldfish", "equal-tokens"}
    _check_science_outputs(data, manifest, (out / "results.md").read_text())
    # the exported HF checkpoint, read back by eval/extract.py, gives the same extraction numbers
    for arm in ("standard", "goldfish"):
        ext = extract_cli.main(["--model", str(out / arm / "model"), "--manifest", str(out / "manifest.json"),
                                "--prefix", "10", "--suffix", "10", "--no-progress", "--out", str(tmp_path / arm)])
        for key in ("exact_match", "token_match", "rouge_l"):
            assert ext["overall"][key] == pytest.approx(res["arms"][arm][key], abs=1e-6)
    longest = max(len(t["token_ids"]) for t in manifest["targets"])
    assert longest <= 64  # each target fits one 64-token row
    with pytest.raises(SystemExit, match="fewer than prefix"):  # a prefix longer than the documents
        extract_cli.main(["--model", str(out / "standard" / "model"), "--manifest", str(out / "manifest.json"),
                          "--prefix", str(longest), "--suffix", "1", "--no-progress"])
    # ... and than the positions it was trained on (64 of the tiny preset's 1024; config.json says so)
    assert json.loads((out / "standard" / "model" / "config.json").read_text())["trained_context"] == 64
    with pytest.raises(SystemExit, match=r"exceeds the model's context \(64 tokens\)"):
        extract_cli.main(["--model", str(out / "standard" / "model"), "--manifest", str(out / "manifest.json"),
                          "--prefix", "60", "--suffix", "10", "--no-progress"])
    # the out directory now holds a run: refused without --resume/--overwrite; --resume finishes instantly
    with pytest.raises(SystemExit, match="already holds a run"):
        memorize.main(SMALL + ["--out", str(out)])
    again = memorize.main(SMALL + science + ["--out", str(out), "--resume"])
    assert again["arms"]["standard"]["exact_match"] == res["arms"]["standard"]["exact_match"]
    with pytest.raises(SystemExit, match="differ"):
        memorize.main(SMALL + science + ["--out", str(out), "--resume", "--lr", "1e-4"])
    with pytest.raises(SystemExit, match=r"'placement': \('last', 'random'\)"):  # a science setting is a setting
        memorize.main(SMALL + ["--out", str(out), "--resume"])


def _check_science_outputs(data: dict, manifest: dict, md: str) -> None:
    arms = data["arms"]
    gf, eq = arms["goldfish"], arms["equal-tokens"]
    # the control trains on exactly as many labels as Goldfish, every step, at other positions
    assert eq["goldfish_drop_frac"] == gf["goldfish_drop_frac"] > 0.1 and eq["goldfish"]["randomize"]
    assert eq["loss_curve"] != gf["loss_curve"] and gf["goldfish"]["doc_start"] == "static"
    assert "from training on fewer labels (equal-tokens - standard)" in md
    # every target's last exposure in the final ceil(4 targets / batch 4) = 1 step; recorded in the manifest
    assert manifest["config"]["placement"] == "last" and data["settings"]["placement"] == "last"
    assert {max(t["steps"]) for t in manifest["targets"]} == {data["num_steps"] - 1}
    for name, a in arms.items():
        assert [b["n"] for b in a["by_recency"]][0] == 4 and sum(b["n"] for b in a["by_recency"]) == 4
        # tracking before step 1, every 6 steps and at the end; its last record is the final model's extraction
        track = a["tracking"]
        assert [r["step"] for r in track] == [0, 6, 12]
        assert track[-1]["exact_match"] == a["exact_match"] and track[-1]["token_match"] == a["token_match"]
        assert track[0]["target_loss"] > track[-1]["target_loss"]
        assert (track[-1]["dropped_loss"] is not None) and track[-1]["kept_loss"] is not None
        lengths = [(b["prefix"], b["suffix"], b["n"] + b["skipped"]) for b in a["by_length"]]
        assert lengths == [(5, 5, 4), ("all", 8, 4)]
        assert 0 <= a["sampled_any"] <= 1 and 0 <= a["sampled_rate"] <= a["sampled_any"]
    for section in ("## By steps since the last exposure (placement: last)", "## Sampled extraction",
                    "## Other prefix and suffix lengths", "## During training"):
        assert section in md


def test_sigusr1_exits_75_after_a_checkpoint_and_resume_finishes(tmp_path, monkeypatch):
    import os
    import signal

    from memorization.training.train import EXIT_INTERRUPTED, Trainer

    step = Trainer.train_step

    def signalling_step(self):
        if self.run_name == "standard" and self.step == 3 and not self.stop_requested:
            os.kill(os.getpid(), signal.SIGUSR1)
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", signalling_step)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        memorize.main(SMALL + ["--out", str(out), "--arms", "standard", "--async-checkpoint"])  # as the job scripts
    assert e.value.code == EXIT_INTERRUPTED == 75
    assert (out / "standard" / "checkpoint" / "LATEST").read_text() == "step_0000005"
    assert not (out / "results.json").exists()
    monkeypatch.setattr(Trainer, "train_step", step)
    res = memorize.main(SMALL + ["--out", str(out), "--arms", "standard", "--resume",
                                 "--async-checkpoint"])["arms"]["standard"]
    assert res["steps"] == 12 and len(res["loss_curve"]) == 12


def _refused(tmp_path, args, match):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit, match=match):
        memorize.main(SMALL + ["--out", str(out)] + args)
    assert not (out / "standard").exists()  # nothing trained


@pytest.mark.parametrize("args,match", [
    (["--size", "huge"], "unknown size"),
    (["--goldfish-k", "1"], "k >= 2|>= 2"),
    (["--goldfish-h", "0"], "h must be >= 1|h=0"),
    (["--exposures", "-1"], ">= 0"),
    (["--init", "/nonexistent/ckpt"], "no Hugging Face checkpoint"),
    (["--targets", "/nonexistent/targets.txt"], "does not exist"),
    (["--corpus", "/nonexistent/corpus.jsonl"], "does not exist"),
    (["--steps", "100000"], "corpus too small"),
    (["--size", "405b"], r"needs ~\d+\.\d GiB on this CPU .* GiB of host memory is available"),
    (["--grid", "1,2,1,1"], "world size|product"),
    (["--plan", "--gpus", "0"], r"^error: --gpus 0: give the number of GPUs to plan for, at least 1$"),
    (["--arms", "standard,goldfsh"], r"unknown arm 'goldfsh'; give both, all or a comma list of standard, goldfish"),
    (["--arms", "equal-tokens", "--goldfish-k", "0"], "equal-tokens arm.* need --goldfish-k >= 2"),
    (["--extract-lengths", "32-32"], r"'32-32' is not PREFIX:SUFFIX"),
    (["--extract-lengths", "all:64"], r"all:64 needs 65 tokens, more than a training row holds \(--seq-len 64\)"),
    (["--track-every", "-1"], r"--track-every -1 \(must be >= 0"),
    (["--samples", "2", "--temperature", "0"], r"--temperature 0.0 \(must be finite, > 0\)"),
])
def test_bad_input_refused_before_training(tmp_path, args, match):
    _refused(tmp_path, args, match)


def test_an_out_that_cannot_be_written_is_refused_before_any_data_work(tmp_path, monkeypatch):
    """--out under a file, or where this user cannot write: one line naming the path, before the store is
    prepared (the cache stays empty) or anything trains."""
    monkeypatch.setenv("GOLDFISH_CACHE", str(tmp_path / "cache"))
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit, match=r"^error: --out .*/file/run: .*/file is a file, not a directory; choose "):
        memorize.main(SMALL + ["--out", str(tmp_path / "file" / "run")])
    import os

    monkeypatch.setattr(os, "access", lambda path, mode: False)  # (root may write anywhere: simulate the denial)
    with pytest.raises(SystemExit, match=r"^error: --out .*/ro/run: .* is not writable by this user; choose a writable"):
        memorize.main(SMALL + ["--out", str(tmp_path / "ro" / "run")])
    assert not (tmp_path / "cache").exists()


def test_short_targets_and_an_empty_target_directory_are_refused(tmp_path):
    t = tmp_path / "targets.jsonl"
    t.write_text(json.dumps({"text": "a short document"}) + "\n" + json.dumps({"text": " ".join(["word"] * 80)}) + "\n")
    _refused(tmp_path, ["--targets", str(t)], "shorter than prefix")
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(tmp_path, ["--targets", str(empty)], "no .txt files")


def test_help_explains_every_flag():
    out = run_python([str(REPO / "recipes" / "memorize.py"), "--help"], check=True).stdout
    for flag in ("--size", "--exposures", "--goldfish-k", "--goldfish-h", "--goldfish-strategy", "--targets",
                 "--corpus", "--tokenizer", "--init", "--seed", "--out", "--grid", "--plan", "--resume"):
        assert flag in out


def test_plan_prints_fitting_grids_for_405b_on_frontier(capsys, tmp_path):
    (tmp_path / "run_config.json").write_text("{}")  # --plan writes nothing, so a run already in --out is fine
    assert memorize.main(["--size", "405b", "--gpus", "4096", "--machine", "frontier", "--plan",
                          "--out", str(tmp_path)]) is None
    captured = capsys.readouterr()
    out = captured.out
    assert "fitting grid" in out and "rejected" in out and "activation checkpointing on" in out
    # without --init the run's model has the built-in tokenizer's 4,096 rows, not Llama 3.1's 128,256: so has the plan
    assert out.startswith("405b (vocabulary 4096): 402B params") and "pass --init <checkpoint>" in captured.err
    # the plan's best grid as a runnable command and as a job; the run's own flags are planned for
    run = next(line.strip() for line in out.splitlines() if line.strip().startswith("python recipes/memorize.py"))
    ns = memorize.parse_args(run.split()[2:])
    assert ns.execution.grid.count(",") == 3 and ns.training.micro_batch >= 1
    assert ns.training.activation_checkpointing and ns.training.batch_size == 1024
    assert "python recipes/jobs/generate.py --machine frontier --size 405b --gpus 4096" in out
    memorize.main(["--size", "8b", "--gpus", "64", "--machine", "frontier", "--plan", "--batch-size", "128",
                   "--micro-batch", "1", "--no-activation-checkpointing", "--grad-reduce-dtype", "bf16"])
    out = capsys.readouterr().out
    assert "(micro-batch 1), activation checkpointing off, gradients reduced in bf16" in out
    assert "--micro-batch 1 --seq-len 2048 --batch-size 128 --no-activation-checkpointing --grad-reduce-dtype bf16" in out
    with pytest.raises(SystemExit, match="smallest GPU count"):
        memorize.main(["--size", "405b", "--gpus", "8", "--machine", "frontier", "--plan"])


def test_init_checkpoint_shape_drives_plan_and_preflight(capsys, tmp_path):
    """With --init, --plan and the memory pre-flight use the checkpoint's shape, not --size's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    ckpt = tmp_path / "MyLlama"
    LlamaForCausalLM(LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=8,
                                 num_key_value_heads=4, vocab_size=1024)).save_pretrained(ckpt)
    memorize.main(["--init", str(ckpt), "--size", "405b", "--plan", "--gpus", "8", "--machine", "h100-node"])
    out = capsys.readouterr().out
    assert out.startswith("MyLlama: 0.00813B params") and "row=8 does not divide kv_heads=4" in out
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"")
    _refused(tmp_path, ["--init", str(ckpt)], "no model.safetensors")


def _small_corpus(tmp_path: Path, n: int = 120) -> Path:
    """The first ``n`` documents of the offline corpus: enough for a few steps of 4 x 64 tokens."""
    from memorization.data.corpus import build_default_corpus

    path = tmp_path / "small.jsonl"
    path.write_text("".join(build_default_corpus().read_text().splitlines(keepends=True)[:n]))
    return path


def _tiny_llama(path: Path, corpus: Path, tok_vocab: int, model_vocab: int | None = None) -> Path:
    """A HF Llama checkpoint of random weights with its own byte-level BPE trained here."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator((json.loads(line)["text"] for line in corpus.read_text().splitlines()),
                            trainer=trainers.BpeTrainer(vocab_size=tok_vocab, special_tokens=["<s>", "</s>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=model_vocab or len(fast), bos_token_id=0,
                                 eos_token_id=1, max_position_embeddings=256)).save_pretrained(path)
    fast.save_pretrained(path)
    return path


TINY = ["--num-targets", "2", "--num-nonmembers", "2", "--exposures", "1", "--steps", "2", "--arms", "standard",
        "--prefix", "10", "--suffix", "10", "--seq-len", "64", "--no-progress", "--extract-batch", "4"]


def test_init_fine_tunes_the_checkpoint_with_its_own_tokenizer(tmp_path):
    """Step 0's loss is the checkpoint's own loss on the first batch, tokenized by the checkpoint's tokenizer; the
    run's config.yaml and run_config.json name that tokenizer (not the unused built-in default)."""
    import torch
    from transformers import AutoModelForCausalLM

    from memorization.data.corpus import load_documents, load_tokenizer
    from memorization.experiment import load_config
    from memorization.data.mixture import build_mixture

    corpus = _small_corpus(tmp_path)
    ckpt = _tiny_llama(tmp_path / "ckpt", corpus, 300)
    argv = TINY + ["--init", str(ckpt), "--corpus", str(corpus), "--out", str(tmp_path / "run")]
    res = memorize.main(argv)
    mixture = build_mixture(load_documents(str(corpus)), load_tokenizer(str(ckpt)),
                            mixture_config(memorize.parse_args(argv)))
    rows = mixture.input_ids[:4]
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(ckpt).float()(input_ids=rows, labels=rows).loss.item()
    assert res["arms"]["standard"]["loss_curve"][0] == pytest.approx(expected, rel=1e-4)
    assert json.loads((tmp_path / "run" / "standard" / "model" / "config.json").read_text())["vocab_size"] == 300
    assert f"model `{ckpt}` (fine-tuned)" in (tmp_path / "run" / "results.md").read_text()  # not the unused --size
    assert load_config(tmp_path / "run" / "config.yaml").data.tokenizer == str(ckpt)
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["tokenizer"] == str(ckpt)


def test_init_problems_refused_before_any_work(tmp_path):
    from transformers import AutoTokenizer

    from memorization.training.models import check_same_vocab, check_tokenizer_fits

    corpus = _small_corpus(tmp_path)
    big = _tiny_llama(tmp_path / "big", corpus, 400, model_vocab=256)  # a tokenizer the checkpoint never saw
    bad = tmp_path / "bad"
    with pytest.raises(SystemExit, match="has 400 tokens but the --init checkpoint .* embeds only 256"):
        memorize.main(TINY + ["--init", str(big), "--out", str(bad)])
    assert not bad.exists()  # refused before the output directory, the corpus or the model
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (big / f).unlink()
    with pytest.raises(SystemExit, match="cannot load the tokenizer .*save its tokenizer into that directory"):
        memorize.main(TINY + ["--init", str(big), "--out", str(bad)])
    assert not bad.exists()
    # a token added to the checkpoint's tokenizer (beyond its embedding) is fine: its row gets the random init
    ok = _tiny_llama(tmp_path / "ok", corpus, 300)
    tok = AutoTokenizer.from_pretrained(ok)
    tok.add_special_tokens({"pad_token": "<pad>"})
    assert len(tok) == 301
    check_tokenizer_fits(tok, str(ok))
    check_same_vocab(tok, AutoTokenizer.from_pretrained(ok), str(ok))  # its own, plus a token: the same ids
    other = _tiny_llama(tmp_path / "other", _small_corpus(tmp_path, 60), 300)  # same size, other merges
    with pytest.raises(SystemExit, match=r"numbers \d+ tokens differently from the --init checkpoint's own"):
        memorize.main(TINY + ["--init", str(ok), "--tokenizer", str(other), "--out", str(bad)])
    assert not bad.exists()
    (ok / "config.json").write_text('{"model_type": "llama", ')  # a truncated copy
    with pytest.raises(SystemExit, match="config.json' is not a valid JSON file"):
        memorize.main(TINY + ["--init", str(ok), "--out", str(bad)])


@pytest.mark.parametrize("args,match", [
    (["--prefix", "50", "--suffix", "50"], r"need 100 tokens \(prefix \+ suffix\) but rows hold only 63: raise"),
    (["--micro-batch", "3"], "--micro-batch 3 does not divide the 4 rows per step .* give a divisor of 4"),
    (["--grid", "3,1,1,1"], r"global batch 4 rows is not divisible by data x depth = 3: change --batch-size"),
    (["--batch-size", "0"], r"--batch-size 0 \(must be >= 1\)"),
    (["--steps", "-1"], r"--steps -1 \(must be >= 0"),
    (["--lr", "-1"], r"--lr -1.0 \(must be finite, > 0\)"),
    (["--lr", "inf"], r"--lr inf \(must be finite, > 0\)"),
    (["--lr", "nan"], r"--lr nan \(must be finite, > 0\)"),
    (["--weight-decay", "inf"], r"--weight-decay inf \(must be finite, >= 0\)"),
    (["--temperature", "inf"], r"--temperature inf \(must be finite, > 0\)"),
    (["--goldfish-h", "65"], r"--goldfish-h 65: a row carries the 64 stream tokens .* use --goldfish-h <= 64"),
    (["--grad-clip", "0"], r"--grad-clip 0.0 \(must be > 0; inf = no clipping\)"),
    (["--weight-decay", "-0.1"], r"--weight-decay -0.1 \(must be finite, >= 0\)"),
    (["--checkpoint-every", "-5"], r"--checkpoint-every -5 \(must be >= 0"),
    (["--num-targets", "0"], "num_targets must be >= 1"),
])
def test_numbers_the_trainer_refuses_are_refused_by_validate(tmp_path, args, match):
    """Caught in validate: before the runtime, the corpus or the mixture (which take minutes at scale)."""
    with pytest.raises(SystemExit, match=match):
        validate(memorize.parse_args(SMALL + ["--out", str(tmp_path / "bad")] + args))


def test_targets_keep_every_record_and_refuse_one_without_text(tmp_path):
    long = " ".join(f"w{j}" for j in range(40))
    t = tmp_path / "t.jsonl"
    t.write_text("".join(json.dumps(r) + "\n" for r in [{"text": long}, {"text": ""}, {"text": "ü漢字 " + long}]))
    assert read_targets(str(t), "text") == [long, "", "ü漢字 " + long]  # user-00002 is record 2
    t.write_text("".join(json.dumps(r) + "\n" for r in [{"text": long}, {"body": long}]))
    with pytest.raises(SystemExit, match=r"--targets \S*t.jsonl: 1 record\(s\) have no text in field 'text' \(e.g. "
                       r"record #1.*pass --targets-text-field"):
        read_targets(str(t), "text")
    with pytest.raises(SystemExit, match=r"--documents \S*t.jsonl: .*pass --text-field"):  # eval/extract.py's flags
        read_targets(str(t), "text", flag="--documents", field_flag="--text-field")
    t.write_text("".join(json.dumps(r) + "\n" for r in [{"body": long}, {"body": "x"}]))
    with pytest.raises(SystemExit, match=r"t.jsonl: \S*t.jsonl has no field 'text' \(fields: \['body'\]\); pass "
                       r"--targets-text-field"):
        read_targets(str(t), "text")
    # the corpus and the targets may keep their text in different fields
    args = memorize.parse_args(SMALL + ["--text-field", "content", "--targets", str(t), "--targets-text-field", "body"])
    assert read_targets(args.data.targets, targets_text_field(args)) == [long, "x"]
    assert targets_text_field(memorize.parse_args(SMALL + ["--text-field", "body"])) == "body"
    d = tmp_path / "dir"
    d.mkdir()
    for name, text in [("a.txt", long), ("b.txt", "\n"), ("._a.txt", "\0\1")]:  # an empty one; a macOS resource fork
        (d / name).write_text(text)
    assert read_targets(str(d), "text") == [long, ""]


def test_overwrite_deletes_the_run_and_nothing_else(tmp_path):
    out = tmp_path / "out"
    (out / "standard").mkdir(parents=True)
    (out / "run_config.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    corpus = str(_small_corpus(tmp_path))
    _refused(tmp_path, ["--corpus", corpus, "--steps", "100000", "--out", str(out), "--overwrite"], "corpus too small")
    assert (out / "run_config.json").exists() and (out / "standard").is_dir()  # refused: the old run stays
    memorize.main(TINY + ["--corpus", corpus, "--out", str(out), "--overwrite"])
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "run_config.json").read_text())["steps"] == 2  # the new run's


def test_resume_refuses_targets_that_changed_since_the_run(tmp_path):
    """A finished arm is not re-run on --resume: with other targets its results would describe other data."""
    def texts(tag: str) -> str:
        return "".join(json.dumps({"text": " ".join(f"{tag}{i}w{j}" for j in range(40))}) + "\n" for i in range(2))

    targets = tmp_path / "t.jsonl"
    targets.write_text(texts("a"))
    argv = TINY + ["--corpus", str(_small_corpus(tmp_path)), "--targets", str(targets), "--exposures", "0,1",
                   "--out", str(tmp_path / "run")]
    memorize.main(argv)
    assert memorize.main(argv + ["--resume"])["arms"]["standard"]  # the same data: resumes (finished, instantly)
    targets.write_text(texts("b"))
    with pytest.raises(SystemExit, match="the targets of the run in .* changed since it started"):
        memorize.main(argv + ["--resume"])


def test_controls_are_left_out_of_the_rates_and_the_paired_test(tmp_path):
    """With --exposures 0,1 the arms' rates and the McNemar test cover the trained targets only; the
    exposure-0 controls appear in the by-exposure table.  A run of controls alone has no rate, and says so."""
    corpus = str(_small_corpus(tmp_path))
    argv = [*TINY, "--num-targets", "4", "--arms", "both", "--exposures", "0,1", "--corpus", corpus]
    res = memorize.main(argv + ["--out", str(tmp_path / "run")])
    targets = json.loads((tmp_path / "run" / "manifest.json").read_text())["targets"]
    members = {t["id"] for t in targets if t["exposures"] >= 1}
    assert len(members) == 2 and len(targets) == 4
    for arm in ("standard", "goldfish"):
        a = res["arms"][arm]
        assert a["n"] == 2 and a["by_exposure"]["0"]["n"] == 2 and set(a["exact_by_target"]) == members
    assert res["paired_exact_match"]["n"] == 2
    only = memorize.main([*TINY, "--exposures", "0", "--corpus", corpus, "--out", str(tmp_path / "controls")])
    assert only["arms"]["standard"]["n"] == 0 and only["arms"]["standard"]["exact_match"] is None
    assert "| standard | – | – | – |" in (tmp_path / "controls" / "results.md").read_text()


def test_options_must_be_given_in_full(capsys):
    """No abbreviations: a sweep appends options after each cell's own, where --siz would override --size."""
    with pytest.raises(SystemExit):
        memorize.parse_args(["--siz", "mini"])
    assert "unrecognized arguments: --siz mini" in capsys.readouterr().err


# ------------------------------------------------------------ notes from rank 0 only; Ctrl-C

@pytest.mark.parametrize("rank, notes", [("0", 1), ("3", 0)])
def test_validate_notes_come_from_the_first_rank_only(tmp_path, monkeypatch, capsys, rank, notes):
    """memorize's checks run on every rank before the grid exists: under torchrun -n 4 a --resume note is
    printed once, by rank 0 (and an error still by every rank)."""
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: False)  # as before axonn.init, in a fresh process
    args = memorize.parse_args(["--out", str(tmp_path / "none"), "--resume", "--no-progress"])
    validate(args)
    assert capsys.readouterr().err.count("note: --resume: no run in") == notes
    with pytest.raises(SystemExit, match=r"^error: --grid: grid '2,1,1'"):
        validate(memorize.parse_args(["--grid", "2,1,1"]))


def test_ctrl_c_ends_memorize_with_one_line_and_status_130(tmp_path):
    """Ctrl-C during training ends memorize with one line saying how to continue (no KeyboardInterrupt
    traceback), status 130, and the checkpoint it names is there to resume from."""
    import os
    import signal
    import time

    out = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "recipes" / "memorize.py"), "--num-targets", "4", "--num-nonmembers", "2",
           "--exposures", "2", "--steps", "12", "--prefix", "10", "--suffix", "10", "--seq-len", "64",
           "--no-progress", "--checkpoint-every", "5", "--out", str(out)]
    # as from a terminal: SIGINT at its default disposition (a suite started in the background by a
    # non-interactive shell runs with SIGINT ignored, which a child would inherit and never see Ctrl-C)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    latest = out / "standard" / "checkpoint" / "LATEST"
    deadline = time.monotonic() + 240
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    running = proc.poll() is None
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert running, f"memorize ended (status {proc.returncode}) before Ctrl-C; LATEST seen: {latest.exists()}; {err}"
    assert proc.returncode == 130, f"LATEST seen: {latest.exists()}; stderr: {err}"
    assert "Traceback" not in err and "interrupted: " in err and "--resume" in err
    assert latest.exists()
