"""The extraction evaluation of a model as a library call: :class:`ExtractionEvalConfig` (the settings of
``eval/extract.py``, same names) -> :func:`run_extraction` -> the result of
:func:`memorization.evaluation.extraction.extract` plus ``model`` and ``source``, written to ``out_dir``
(``extraction.json``, ``extraction.md``) if given.

The model is a HF checkpoint directory (one process, one device or spread over the GPUs with ``device_map``), or
with ``grid`` also an axonn training checkpoint resharded onto the grid (:meth:`memorization.lm.LM.load`).  The
documents are a manifest's targets (and with ``include_nonmembers`` its nonmembers, as exposure 0) or the texts of
``documents`` tokenized as memorize tokenizes targets.  Every refusal is one :class:`ExtractionEvalError` line,
raised before the weights load where the model's config suffices to find it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path


class ExtractionEvalError(ValueError):
    """A setting or an input the extraction evaluation refuses (the CLI prints it as ``error: ...``)."""


@dataclass(frozen=True)
class ExtractionEvalConfig:
    """The settings of one extraction evaluation; each field is the ``eval/extract.py`` flag of the same name.
    Exactly one of ``manifest`` and ``documents`` is the source."""

    model: str
    manifest: str | None = None
    documents: str | None = None
    text_field: str = "text"
    include_nonmembers: bool = False
    tokenizer: str | None = None
    prefix: int = 50
    suffix: int = 50
    prefix_mode: str = "fixed"  # or "all-but-suffix"
    max_doc_tokens: int = 2048
    skip_short: bool = False
    batch_size: int = 32
    samples: int = 0
    temperature: float = 1.0
    top_k: int = 40
    seed: int = 0
    device: str | None = None
    device_map: str | None = None
    grid: str | None = None
    dtype: str = "auto"
    out: str | None = None
    progress: bool = True


def _check_settings(cfg: ExtractionEvalConfig, model_dir: Path, step) -> Path:
    """The source, after the model directory and every numeric setting are checked."""
    if not (model_dir / "config.json").exists() and not (step is not None and cfg.grid):
        sharded = any((d / f).exists() for d in (model_dir, model_dir / "checkpoint") for f in ("COMPLETE", "LATEST"))
        raise ExtractionEvalError(
            f"--model {cfg.model}: no Hugging Face checkpoint (config.json) there"
            + (f"; it holds axonn training checkpoints: evaluate one on a --grid (it is resharded "
               f"onto it), turn it into a model with `python -m axonn.convert {cfg.model} OUT_DIR`, "
               f"or pass the run's exported model (<run>/<arm>/model)" if sharded else ""))
    if (cfg.manifest is None) == (cfg.documents is None):
        raise ExtractionEvalError("give exactly one of --manifest and --documents")
    src = Path(cfg.manifest or cfg.documents)
    if not src.exists():
        raise ExtractionEvalError(f"{src} does not exist")
    if cfg.prefix < 1 or cfg.suffix < 1:
        raise ExtractionEvalError("--prefix and --suffix must be >= 1")
    if cfg.batch_size < 1:
        raise ExtractionEvalError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.prefix_mode == "all-but-suffix" and cfg.max_doc_tokens <= cfg.suffix:
        raise ExtractionEvalError(f"--max-doc-tokens {cfg.max_doc_tokens} must exceed --suffix {cfg.suffix}")
    if cfg.samples < 0 or not 0 < cfg.temperature < float("inf") or cfg.top_k < 0:
        raise ExtractionEvalError(f"--samples {cfg.samples}, --temperature {cfg.temperature}, --top-k {cfg.top_k}: "
                                  "need samples >= 0, temperature finite and > 0, top-k >= 0")
    return src


def _documents(cfg: ExtractionEvalConfig, src: Path, tok) -> list[dict]:
    """The documents to extract, token ids made where a manifest gives text only (as memorize tokenizes targets)."""
    from memorization.data.mixture import load_manifest, tokenize_with_bos

    if cfg.manifest:
        try:
            m = load_manifest(src)  # malformed documents and exposure counts refused here, naming the document
        except ValueError as e:
            raise ExtractionEvalError(str(e)) from None
        docs = [dict(t) for t in m["targets"]]
        if cfg.include_nonmembers:
            docs += [{**d, "exposures": 0} for d in m["nonmembers"]]
        for d in docs:  # a hand-written manifest may give text only: tokenized as memorize tokenizes targets
            if "token_ids" not in d:
                d["token_ids"] = tokenize_with_bos(tok, [d["text"]])[0]
        return docs
    from memorization.experiment import read_targets

    texts = read_targets(str(src), cfg.text_field, flag="--documents", field_flag="--text-field")
    ids = tokenize_with_bos(tok, texts)  # as memorize tokenized its targets: BOS first, even if tok adds none
    return [{"id": f"doc-{i:05d}", "token_ids": x, "exposures": None} for i, x in enumerate(ids)]


def run_extraction(cfg: ExtractionEvalConfig) -> dict | None:
    """Extract ``cfg``'s documents from ``cfg.model`` (module docstring); on a grid every rank decodes and rank 0
    alone returns the result (the others None).  :class:`ExtractionEvalError` for a refused setting or input."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorization.evaluation.eval_model import axonn_checkpoint, checkpoint_tokenizer_dir, model_config_of
    from memorization.evaluation.extraction import ExtractionConfig, extract, markdown_table, prepare
    from memorization.data.mixture import atomic_write_json
    from memorization.evaluation.model_files import ModelDirError, check_model_config, check_model_dir

    model_dir = Path(cfg.model)
    step = axonn_checkpoint(model_dir)  # a training checkpoint: evaluated on --grid directly
    src = _check_settings(cfg, model_dir, step)
    if step is None:
        try:  # a broken config.json is named as such, not as a missing tokenizer
            check_model_config(model_dir)
        except ModelDirError as e:
            raise ExtractionEvalError(str(e)) from None
    tok_dir = cfg.tokenizer or (str(model_dir) if step is None else checkpoint_tokenizer_dir(step))
    if tok_dir is None:
        raise ExtractionEvalError(f"--model {model_dir} is a training checkpoint without a tokenizer beside it: pass "
                                  "--tokenizer (the run's tokenizer directory)")
    try:
        tok = AutoTokenizer.from_pretrained(str(tok_dir), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ExtractionEvalError(f"no tokenizer for {tok_dir} ({e}); pass --tokenizer") from None
    docs = _documents(cfg, src, tok)
    ecfg = ExtractionConfig(prefix_len=cfg.prefix, suffix_len=cfg.suffix,
                            all_but_suffix=cfg.prefix_mode == "all-but-suffix", batch_size=cfg.batch_size,
                            skip_short=cfg.skip_short, max_tokens=cfg.max_doc_tokens, samples=cfg.samples,
                            temperature=cfg.temperature, top_k=cfg.top_k, seed=cfg.seed)
    try:  # documents, prefix + suffix and token ids checked against the config before the weights load
        with warnings.catch_warnings():  # extract() warns again, once, about a lowered --max-doc-tokens
            warnings.simplefilter("ignore")
            prepare(model_config_of(model_dir), docs, ecfg)
    except (OSError, ValueError) as e:
        raise ExtractionEvalError(str(e)) from None
    try:  # after the documents are checked, before any weight is read: a damaged file is one line naming it
        if step is None:
            check_model_dir(model_dir)
    except ModelDirError as e:
        raise ExtractionEvalError(str(e)) from None
    if cfg.grid:
        res = _extract_on_grid(cfg, model_dir, docs, ecfg, tok)
        if res is None:  # not rank 0: rank 0 reports
            return None
    else:
        device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        from memorization.evaluation.eval_model import resolve_dtype

        dtype = resolve_dtype(cfg.dtype, device)
        if cfg.device_map:  # accelerate places the layers; inputs go to the embedding's device, outputs come back
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                         device_map=cfg.device_map, trust_remote_code=False).eval()
        else:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                         trust_remote_code=False).to(device).eval()
        try:
            res = extract(model, docs, ecfg, tok, progress=cfg.progress)
        except ValueError as e:
            raise ExtractionEvalError(str(e)) from None
    res["model"], res["source"] = str(model_dir), str(src)
    if cfg.out:
        out = Path(cfg.out)
        atomic_write_json(out / "extraction.json", res)
        (out / "extraction.md").write_text(markdown_table(res, title=f"Extraction: {model_dir}"))
    return res


def _extract_on_grid(cfg: ExtractionEvalConfig, model_dir: Path, docs: list[dict], ecfg, tok) -> dict | None:
    """Extraction with the model parallelized on ``cfg.grid`` (:func:`memorization.evaluation.extraction.extract` of a
    :class:`memorization.lm.LM` on the grid); the result on rank 0, None on the other ranks."""
    import torch

    from memorization.evaluation.eval_model import grid_runtime
    from memorization.evaluation.extraction import extract
    from memorization.lm import LM
    from memorization.training.runtime import check_replicas

    if cfg.device_map or cfg.device:
        raise ExtractionEvalError("--grid places the model itself (each rank on its own GPU, or the CPU): drop "
                                  "--device/--device-map")
    try:
        rt = grid_runtime(cfg.grid)
        check_replicas(len(docs), rt.grid, "documents")  # before any weight loads
    except ValueError as e:
        raise ExtractionEvalError(str(e)) from None
    # each rank reads its own shards: of the HF directory, or of a training checkpoint saved on any grid
    lm = LM.load(model_dir, grid=rt, tokenizer_path=cfg.tokenizer, require_tokenizer=True)
    bf16 = rt.device.type == "cuda" and cfg.dtype != "float32"
    with torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False):
        try:
            res = extract(lm, docs, ecfg, tok, progress=cfg.progress)
        except ValueError as e:
            raise ExtractionEvalError(str(e)) from None
    res["grid"] = cfg.grid
    return res if rt.is_main else None
