"""recipes/memorize.py end to end on a very small setting, and every bad input refused before training."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "recipes"))
import memorize  # noqa: E402

sys.path.insert(0, str(REPO / "eval"))
import extract as extract_cli  # noqa: E402

SMALL = ["--num-targets", "4", "--num-nonmembers", "2", "--exposures", "2", "--steps", "12", "--prefix", "10",
         "--suffix", "10", "--seq-len", "64", "--no-progress", "--checkpoint-every", "5"]


def test_small_run_writes_results_for_both_arms(tmp_path):
    out = tmp_path / "run"
    res = memorize.main(SMALL + ["--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    for arm in ("standard", "goldfish"):
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
    assert res["arms"].keys() == {"standard", "goldfish"}
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
    again = memorize.main(SMALL + ["--out", str(out), "--resume"])
    assert again["arms"]["standard"]["exact_match"] == res["arms"]["standard"]["exact_match"]
    with pytest.raises(SystemExit, match="differ"):
        memorize.main(SMALL + ["--out", str(out), "--resume", "--lr", "1e-4"])


def test_sigusr1_exits_75_after_a_checkpoint_and_resume_finishes(tmp_path, monkeypatch):
    import os
    import signal

    from memorization.train import EXIT_INTERRUPTED, Trainer

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
    (["--size", "405b"], "cannot be trained on this CPU"),
    (["--grid", "1,2,1,1"], "world size|product"),
])
def test_bad_input_refused_before_training(tmp_path, args, match):
    _refused(tmp_path, args, match)


def test_short_and_empty_targets(tmp_path):
    t = tmp_path / "targets.jsonl"
    t.write_text(json.dumps({"text": "a short document"}) + "\n" + json.dumps({"text": " ".join(["word"] * 80)}) + "\n")
    _refused(tmp_path, ["--targets", str(t)], "shorter than prefix")
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(tmp_path, ["--targets", str(empty)], "no .txt files")


def test_help_explains_every_flag():
    out = subprocess.run([sys.executable, str(REPO / "recipes" / "memorize.py"), "--help"], capture_output=True,
                         text=True, check=True).stdout
    for flag in ("--size", "--exposures", "--goldfish-k", "--goldfish-h", "--goldfish-strategy", "--targets",
                 "--corpus", "--tokenizer", "--init", "--seed", "--out", "--grid", "--plan", "--resume"):
        assert flag in out


def test_plan_prints_fitting_grids_for_405b_on_frontier(capsys, tmp_path):
    (tmp_path / "run_config.json").write_text("{}")  # --plan writes nothing, so a run already in --out is fine
    assert memorize.main(["--size", "405b", "--gpus", "4096", "--machine", "frontier", "--plan",
                          "--out", str(tmp_path)]) is None
    out = capsys.readouterr().out
    assert "fitting grid" in out and "rejected" in out and "activation checkpointing on" in out
    # the plan's best grid as a runnable command and as a job; the run's own flags are planned for
    run = next(line.strip() for line in out.splitlines() if line.strip().startswith("python recipes/memorize.py"))
    ns = memorize.parse_args(run.split()[2:])
    assert ns.grid.count(",") == 3 and ns.micro_batch >= 1 and ns.activation_checkpointing and ns.batch_size == 1024
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
