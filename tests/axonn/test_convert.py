"""``python -m axonn.convert`` (axonn/convert.py): a training checkpoint to a Hugging Face directory, and its
refusals -- a shard size that is not positive and finite, a --tokenizer/--config it cannot load, an arm directory
given instead of its checkpoint -- each named before anything is written."""
from __future__ import annotations

import pytest

from tests.support import load_eval_cli


@pytest.fixture
def checkpoint(tmp_path):
    """A trainer-style checkpoint root (LATEST) of a tiny model."""
    import torch

    import axonn
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

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


def test_convert_and_extract_point_from_a_run_directory_to_what_they_take(checkpoint, tmp_path, capsys):
    """Given the arm directory (``<arm>/``, not ``<arm>/checkpoint``), convert names the checkpoint directory to
    pass; extract, given a training checkpoint as --model, names the convert command that makes a model of it."""
    from axonn.convert import main as convert

    arm = checkpoint.parent  # the fixture's root holds ckpt/; name it as memorize does
    checkpoint.rename(arm / "checkpoint")
    assert convert([str(arm), str(tmp_path / "hf")]) == 2
    assert f"a trainer keeps them in {arm / 'checkpoint'}: pass that" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
    with pytest.raises(SystemExit, match=r"holds axonn training checkpoints: .*python -m axonn.convert"):
        load_eval_cli("extract").main(["--model", str(arm), "--manifest", str(tmp_path / "m.json")])
    assert convert([str(arm / "checkpoint"), str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "config.json").exists()
