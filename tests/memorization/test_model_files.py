"""A model directory is checked before anything loads it: a truncated or damaged file is one line naming it, in
every evaluation entry point and in axonn.convert's output path."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memorization.model_files import ModelDirError, check_model_dir
from tests.support import REPO


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from memorization.corpus import load_tokenizer

    d = tmp_path_factory.mktemp("m") / "model"
    tok = load_tokenizer()
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=1, vocab_size=len(tok))).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _copy(model, tmp_path) -> Path:
    return Path(shutil.copytree(model, tmp_path / "copy"))


def test_a_whole_model_directory_passes(model):
    assert check_model_dir(model) == model


@pytest.mark.parametrize("cut, match", [(1000, "truncated or not a safetensors file"),
                                         (-100, r"truncated: its tensors need [\d,]+ bytes, the file holds")])
def test_a_truncated_safetensors_file_is_named(model, tmp_path, cut, match):
    d = _copy(model, tmp_path)
    f = d / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(cut if cut > 0 else f.stat().st_size + cut)
    with pytest.raises(ModelDirError, match=rf"^--model .*copy: .*model\.safetensors is {match}"):
        check_model_dir(d)


def test_a_broken_config_a_missing_config_or_shard_is_named(model, tmp_path):
    d = _copy(model, tmp_path)
    (d / "config.json").write_text("{broken")
    with pytest.raises(ModelDirError, match=r"config\.json is not valid JSON"):
        check_model_dir(d)
    (d / "config.json").unlink()
    with pytest.raises(ModelDirError, match=r"holds no config\.json: it is not a Hugging Face model directory"):
        check_model_dir(d)
    shutil.copy(model / "config.json", d / "config.json")
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ModelDirError, match=r"model-00002-of-00002\.safetensors, named by .*index\.json, is missing"):
        check_model_dir(d)


@pytest.mark.parametrize("script, extra", [("eval/extract.py", ["--documents", "DOCS", "--prefix", "1",
                                                                "--suffix", "1"]),
                                           ("eval/hpc_code.py", [])])
def test_evaluation_clis_refuse_a_truncated_model_in_one_line(model, tmp_path, script, extra):
    d = _copy(model, tmp_path)
    with open(d / "model.safetensors", "r+b") as fh:
        fh.truncate(2000)
    docs = tmp_path / "docs.jsonl"
    docs.write_text(json.dumps({"id": "a", "text": "some text"}) + "\n")
    argv = [a.replace("DOCS", str(docs)) for a in extra]
    r = subprocess.run([sys.executable, str(REPO / script), "--model", str(d), *argv], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("error: --model ") and "model.safetensors is truncated" in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_mia_and_downstream_loading_refuse_a_truncated_model(model, tmp_path):
    from memorization.mia import load_checkpoint

    d = _copy(model, tmp_path)
    with open(d / "model.safetensors", "r+b") as fh:
        fh.truncate(2000)
    with pytest.raises(ModelDirError, match=r"^--reference-model .*model\.safetensors is truncated"):
        load_checkpoint(d, flag="--reference-model")


def test_convert_refuses_an_output_path_under_a_file_before_reading_tensors(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    from axonn.convert import main

    for out in (tmp_path / "file", tmp_path / "file" / "out"):  # the checkpoint is not even looked at
        assert main([str(tmp_path / "no-checkpoint"), str(out)]) == 2
        assert capsys.readouterr().err == f"error: out {out}: {tmp_path / 'file'} is a file, not a directory; choose " \
                                          "another out\n"
