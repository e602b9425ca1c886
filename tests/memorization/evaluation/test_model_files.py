"""A model directory is checked before anything loads it: a truncated or damaged file is one line naming it, in
every evaluation entry point and in axonn.convert's output path."""
import json
import shutil
from pathlib import Path

import pytest

from memorization.evaluation.model_files import ModelDirError, check_model_dir
from tests.forked import run_python
from tests.support import REPO


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from memorization.data.corpus import load_tokenizer

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
    r = run_python([str(REPO / script), "--model", str(d), *argv], timeout=120, cwd=REPO)
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert lines[-1].startswith("error: --model ") and "model.safetensors is truncated" in lines[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_mia_and_downstream_loading_refuse_a_truncated_model(model, tmp_path):
    from memorization.evaluation.mia import load_checkpoint

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


def _safetensors(path: Path, header, data: bytes = b"", claim: int | None = None) -> Path:
    """A file in the safetensors layout: u64 header length (``claim`` if given), the JSON header, ``data``."""
    import struct

    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if claim is None else claim) + raw + data)
    return path


@pytest.mark.parametrize("header, data, match", [
    ({"w": 5}, b"", r"tensor 'w' is not an object of dtype, shape and data_offsets"),
    ([1, 2, 3], b"", r"its header is a JSON list, not an object of tensors"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12), r"tensor 'b' at bytes 4..12 overlaps"),
    ({"w": {"dtype": "F32", "shape": [10**12, 10**12], "data_offsets": [0, 8]}}, bytes(8),
     r"tensor 'w' of shape \[1000000000000, 1000000000000\] \(F32\) needs [\d,]+ bytes, its data_offsets \[0, 8\] "
     r"span 8"),
    ({"w": {"dtype": "Q9", "shape": [2], "data_offsets": [0, 8]}}, bytes(8), r"tensor 'w' has an unknown dtype 'Q9'"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, bytes(8),
     r"tensor 'w' has data_offsets \[8, 0\], not \[begin, end\]"),
    ({"__metadata__": {"format": 1}}, b"", r"its header's __metadata__ is not an object of strings"),
], ids=["entry-not-object", "list", "overlap", "huge-shape", "dtype", "offsets-reversed", "metadata"])
def test_a_malformed_safetensors_header_is_one_line(model, tmp_path, header, data, match):
    """Headers that made safetensors or our own check raise TypeError, AttributeError or SafetensorError
    tracebacks are refused by check_model_dir in one line naming the file and what is wrong."""
    d = _copy(model, tmp_path)
    _safetensors(d / "model.safetensors", header, data)
    with pytest.raises(ModelDirError, match=rf"^--model .*copy: .*model\.safetensors is damaged: {match}"):
        check_model_dir(d)


def test_a_header_longer_than_safetensors_allows_is_refused_unread(model, tmp_path):
    """A sparse file whose header claims 1.5 GB (safetensors caps headers at 100 MB) is refused without reading
    the header: well under a second and no memory to speak of (it took 23 s and 2.1 GB)."""
    import resource
    import time

    d = _copy(model, tmp_path)
    f = _safetensors(d / "model.safetensors", {}, claim=1_500_000_000)
    with open(f, "r+b") as fh:
        fh.truncate(1_600_000_000)  # sparse: no disk used
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    with pytest.raises(ModelDirError, match=r"its header claims 1,500,000,000 bytes, more than the 100,000,000 it "
                                            r"allows"):
        check_model_dir(d)
    assert time.perf_counter() - t < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100_000  # KiB: under 100 MB more


def test_an_index_naming_a_file_outside_the_directory_is_refused(model, tmp_path):
    """model.safetensors.index.json's weight_map may only name files of the model directory."""
    d = _copy(model, tmp_path)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "../../etc/passwd"}}))
    with pytest.raises(ModelDirError, match=r"names '../../etc/passwd', not a file of the model directory"):
        check_model_dir(d)
