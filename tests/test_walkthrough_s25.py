"""Walkthrough (session 25) of train -> interrupt -> resume -> convert -> extract: what a user met.

* ``eval/extract.py`` refused a document shorter than prefix + suffix, a prefix + suffix beyond the model's
  context and token ids outside its vocabulary only inside ``extract()``, i.e. after the weights had loaded
  (minutes for a 70B); the same checks now run on the config first.
* ``python -m axonn.convert`` crashed with a traceback on a ``--tokenizer``/``--config`` it could not load and
  on ``--max-shard-gb inf``; ``--max-shard-gb 0`` (or negative) was accepted and wrote one file per tensor.
"""
from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig

from eval_cli import load_eval_cli as _load_cli


@pytest.fixture
def config_only(tmp_path, tokenizer):
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
def test_extract_refuses_bad_documents_before_the_model_loads(config_only, monkeypatch, ids, flags, match):
    import transformers

    manifest = {"version": 1, "targets": [{"id": "t0", "token_ids": ids, "exposures": 4}], "nonmembers": []}
    (config_only / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model loaded before the documents were checked"))
    with pytest.raises(SystemExit, match=match):
        _load_cli("extract").main(["--model", str(config_only / "m"), "--manifest",
                                   str(config_only / "manifest.json"), "--no-progress", *flags])


@pytest.fixture
def checkpoint(tmp_path):
    """A trainer-style checkpoint root (LATEST) of a tiny model."""
    import torch

    import axonn
    from memorization.models import build_model
    from memorization.runtime import Runtime

    rt = Runtime(axonn.init())
    model = build_model("tiny", 512, seed=3, runtime=rt)
    opt = torch.optim.AdamW(model.parameters())
    rt.save_checkpoint(model, opt, tmp_path / "ckpt", {"step": 1})
    return tmp_path / "ckpt"


@pytest.mark.parametrize("gb", ["0", "-1", "nan", "inf"])
def test_convert_refuses_a_shard_size_that_is_not_positive_and_finite(checkpoint, tmp_path, capsys, gb):
    from axonn.convert import main as convert

    assert convert([str(checkpoint), str(tmp_path / "hf"), "--max-shard-gb", gb]) == 2
    assert "--max-shard-gb" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("flag", ["--tokenizer", "--config"])
def test_convert_names_a_tokenizer_or_config_it_cannot_load(checkpoint, tmp_path, capsys, flag):
    from axonn.convert import main as convert

    assert convert([str(checkpoint), str(tmp_path / "hf"), flag, str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag} {tmp_path / 'missing'}: cannot load it" in err
    assert not (tmp_path / "hf").exists()


def test_a_resumed_training_reports_the_time_of_the_whole_run(tmp_path):
    """results.md's "train time" of an arm resumed at step 23 of 48 said 3 s (the part after the resume) where the
    uninterrupted arm took 16 s: the trainer now keeps the time trained so far in its checkpoint and adds to it."""
    import time

    import torch

    from memorization.goldfish import GoldfishConfig
    from memorization.models import build_model
    from memorization.train import TrainConfig, Trainer

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 4096, (8, 32), generator=g).repeat(3, 1)
    docs, val = torch.zeros_like(rows, dtype=torch.int32), rows[:8]

    def trainer():
        cfg = TrainConfig(batch_size=4, micro_batch=2, lr=3e-3, warmup_steps=2, checkpoint_every=4, progress=False,
                          goldfish=GoldfishConfig(k=0))
        return Trainer(build_model("tiny", 4096, seed=0), rows, docs, val, cfg, tmp_path, run_name="t")

    class Interrupt(Exception):
        pass

    def slow_then_stop(rec):  # steps 1-3 are logged before the step-4 checkpoint: >= 0.9 s in it
        time.sleep(0.3)
        if rec["step"] == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        trainer().fit(on_step=slow_then_stop)
    resumed = trainer().fit(resume=True)
    assert resumed["steps"] == 6
    assert resumed["train_seconds"] >= 0.9


@pytest.mark.parametrize("rank, notes", [("0", 1), ("3", 0)])
def test_validate_notes_come_from_the_first_rank_only(tmp_path, monkeypatch, capsys, rank, notes):
    """memorize's checks run on every rank before the grid exists: under torchrun -n 4 a --resume note was
    printed four times; it now comes from rank 0 alone (and an error still from every rank)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes"))
    import memorize

    from memorization.experiment import validate

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr("torch.distributed.is_initialized", lambda: False)  # as before axonn.init, in a fresh process
    args = memorize.parse_args(["--out", str(tmp_path / "none"), "--resume", "--no-progress"])
    validate(args)
    assert capsys.readouterr().err.count("note: --resume: no run in") == notes
    with pytest.raises(SystemExit, match=r"^error: --grid: grid '2,1,1'"):
        validate(memorize.parse_args(["--grid", "2,1,1"]))


def test_convert_and_extract_point_from_a_run_directory_to_what_they_take(checkpoint, tmp_path, capsys):
    """Given the arm directory (``<arm>/``, not ``<arm>/checkpoint``), convert said only "no COMPLETE marker";
    extract, given a training checkpoint as --model, said only "no config.json". Each now names what to pass."""
    from axonn.convert import main as convert

    arm = checkpoint.parent  # the fixture's root holds ckpt/; name it as memorize does
    checkpoint.rename(arm / "checkpoint")
    assert convert([str(arm), str(tmp_path / "hf")]) == 2
    assert f"a trainer keeps them in {arm / 'checkpoint'}: pass that" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
    with pytest.raises(SystemExit, match=r"holds axonn training checkpoints: .*python -m axonn.convert"):
        _load_cli("extract").main(["--model", str(arm), "--manifest", str(tmp_path / "m.json")])
    assert convert([str(arm / "checkpoint"), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").exists()


def test_ctrl_c_ends_memorize_with_one_line_and_status_130(tmp_path):
    """Ctrl-C during training printed a KeyboardInterrupt traceback (one per rank under torchrun); it now ends
    with one line saying how to continue, status 130, and the checkpoint it names is there to resume from."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    cmd = [sys.executable, str(repo / "recipes" / "memorize.py"), "--num-targets", "4", "--num-nonmembers", "2",
           "--exposures", "2", "--steps", "12", "--prefix", "10", "--suffix", "10", "--seq-len", "64",
           "--no-progress", "--checkpoint-every", "5", "--out", str(out)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, "WANDB_MODE": "disabled"})
    latest = out / "standard" / "checkpoint" / "LATEST"
    deadline = time.monotonic() + 240
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted: " in err and "--resume" in err
    assert latest.exists()
