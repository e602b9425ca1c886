"""Nothing a file can make us do: every loader of a file a user hands us refuses code in it, and never asks.

A model or tokenizer directory whose ``config.json``/``tokenizer_config.json`` names custom code (``auto_map``, an
unknown ``model_type``) is refused by every place that loads one with ``transformers`` (``trust_remote_code=False``
passed explicitly: without it ``transformers`` asks on a terminal, and one "y" runs the code).  The payload here
creates a marker file when imported; each test asserts the marker is absent afterwards.  (Checkpoint pickles:
tests/axonn/test_checkpoint.py.)
"""
from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

PAYLOAD = "import pathlib\npathlib.Path({marker!r}).write_text('ran')\n"


def _remote_code_dir(root: Path, marker: Path) -> Path:
    """A HF directory (config, tokenizer config, a tiny safetensors file) whose classes are custom code that creates
    ``marker`` when imported."""
    import torch
    from safetensors.torch import save_file

    d = root / "remote_code_model"
    d.mkdir()
    (d / "evil.py").write_text(PAYLOAD.format(marker=str(marker)) + (
        "from transformers import PretrainedConfig, PreTrainedTokenizerFast, PreTrainedModel\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil_model'\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n"
        "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n"))
    auto = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
            "AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (d / "config.json").write_text(json.dumps({"model_type": "evil_model", "auto_map": auto,
                                               "architectures": ["EvilModel"]}))
    (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "EvilTokenizer", "auto_map": auto}))
    save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
    return d


@pytest.fixture(scope="module")
def axonn_checkpoint(tmp_path_factory) -> Path:
    """A complete tiny axonn training checkpoint (what ``python -m axonn.convert`` converts)."""
    import torch

    import axonn
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    model = build_model("tiny", 64, seed=0, runtime=rt)
    root = tmp_path_factory.mktemp("ckpt")
    rt.save_checkpoint(model, torch.optim.AdamW(model.parameters()), root, {"step": 1})
    return root / "step_0000001"


def _loaders(ckpt: Path):
    """Every function that loads a user's HF directory with transformers, by name."""
    from axonn import convert
    from memorization.evaluation import eval_model
    from memorization.training import models
    from memorization.data import corpus
    from tests.support import load_eval_cli

    def extract(d: Path) -> None:
        (d.parent / "docs.jsonl").write_text(json.dumps({"text": "a b c"}) + "\n")
        load_eval_cli("extract").main(["--model", str(d), "--documents", str(d.parent / "docs.jsonl")])

    return {
        "eval_model.load_tokenizer": eval_model.load_tokenizer,
        "eval_model.model_config_of": eval_model.model_config_of,
        "eval_model.load_checkpoint": lambda d: eval_model.load_checkpoint(d, device="cpu", require_tokenizer=False),
        "corpus.load_tokenizer": lambda d: corpus.load_tokenizer(str(d)),
        "models.model_config(init=)": lambda d: models.model_config(None, 100, init=str(d)),
        "convert --tokenizer": lambda d: convert.main([str(ckpt), str(d.parent / "out"), "--tokenizer", str(d)]),
        "convert --config": lambda d: convert.main([str(ckpt), str(d.parent / "out"), "--config", str(d)]),
        "eval/extract.py --model": extract,
    }


LOADERS = ["eval_model.load_tokenizer", "eval_model.model_config_of", "eval_model.load_checkpoint",
           "corpus.load_tokenizer", "models.model_config(init=)", "convert --tokenizer", "convert --config",
           "eval/extract.py --model"]


@pytest.mark.parametrize("loader", LOADERS)
def test_custom_code_in_a_model_directory_is_refused_without_asking(tmp_path, monkeypatch, loader,
                                                                   axonn_checkpoint) -> None:
    """A directory whose config names custom code: the loader refuses it (or fails) without asking whether to run
    the code -- a user answering "y" to a prompt would run it -- and the code's import never happens."""
    marker = tmp_path / "PWNED"
    d = _remote_code_dir(tmp_path, marker)
    asked: list[str] = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "y")
    try:
        _loaders(axonn_checkpoint)[loader](d)
    except (Exception, SystemExit):  # noqa: BLE001 - refused: what is checked is that nothing ran or was asked
        pass
    assert not asked, asked
    assert not marker.exists()


def test_every_transformers_load_names_trust_remote_code() -> None:
    """Every ``from_pretrained`` call in the library and the CLIs passes ``trust_remote_code=False`` (without it,
    transformers asks on a terminal whether to run a directory's custom code)."""
    import re

    from tests.support import REPO

    missing = []
    for f in [*REPO.glob("axonn/**/*.py"), *REPO.glob("memorization/**/*.py"), *REPO.glob("eval/*.py"),
              *REPO.glob("recipes/*.py"), *REPO.glob("benchmarks/*.py")]:
        text = f.read_text()
        for m in re.finditer(r"\.from_pretrained\(", text):
            depth, i = 1, m.end()
            while depth and i < len(text):
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            if "trust_remote_code=False" not in text[m.end():i]:
                missing.append(f"{f.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}")
    assert not missing, missing


def test_a_pickled_pytorch_model_bin_that_runs_code_is_refused(tmp_path):
    """A model directory whose weights are a pytorch_model.bin pickle that runs code when unpickled: every evaluation
    entry point's check_model_dir refuses it in one line (not transformers' page of advice to set
    weights_only=False), and the payload never runs."""
    from transformers import LlamaConfig

    from memorization.evaluation.eval_model import load_checkpoint
    from memorization.evaluation.model_files import ModelDirError
    from tests.support import write_malicious_torch_file

    marker = tmp_path / "PWNED"
    d = tmp_path / "model"
    LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64).save_pretrained(d)
    write_malicious_torch_file(d / "pytorch_model.bin", marker, wrap=lambda p: {"model.embed_tokens.weight": p})
    with pytest.raises(ModelDirError, match=r"^--model .*model: .*pytorch_model.bin holds something other than "
                                            r"tensors and plain data and is refused: loading it could run code"):
        load_checkpoint(d, device="cpu", require_tokenizer=False)
    assert not marker.exists()
