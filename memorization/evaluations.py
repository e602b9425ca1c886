"""The evaluations of a trained model, by name: each name's config (a dataclass) and the one library function that
runs it.  The sweep (:func:`memorization.sweep.evaluate_arm`) runs them by name through :func:`evaluate`; the CLIs
``eval/extract.py``, ``eval/mia.py``, ``eval/downstream.py`` and ``eval/hpc_code.py`` are shells that parse their
flags into the config's fields and call the function.

- ``extract``: :class:`memorization.extraction_eval.ExtractionEvalConfig` ->
  :func:`memorization.extraction_eval.run_extraction`;
- ``mia``: :class:`MiaConfig` -> :func:`memorization.mia.run_mia`;
- ``downstream`` (held-out perplexity and/or lm-eval tasks): :class:`DownstreamConfig` ->
  :func:`memorization.downstream.run_downstream`;
- ``hpc-code``: :class:`memorization.hpc_code.evaluate.HpcCodeConfig` ->
  :func:`memorization.hpc_code.evaluate.evaluate_hpc_code`.

A config's fields are its function's parameters, by name (:func:`memorization.mia.run_mia`'s ``model_path``,
``manifest_path``, ``out_dir``, ...), so a setting has one name from the CLI flag to the function.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memorization.extraction_eval import ExtractionEvalConfig
from memorization.hpc_code.evaluate import HpcCodeConfig
from memorization.lm_eval_bridge import DEFAULT_TASK_DIR

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MiaConfig:
    """Membership inference on a manifest's members and nonmembers (:func:`memorization.mia.run_mia`)."""

    model_path: str | os.PathLike
    manifest_path: str | os.PathLike
    reference_model_path: str | os.PathLike | None = None
    out_dir: str | os.PathLike | None = None
    batch_size: int = 8
    device: str | None = None
    dtype: str | None = "auto"
    k: float = 0.2
    max_length: int | None = None
    add_bos: bool = True
    fpr_target: float = 0.01
    tokenizer_path: str | os.PathLike | None = None
    grid: str | None = None


@dataclass(frozen=True)
class DownstreamConfig:
    """Held-out perplexity and/or lm-eval tasks (:func:`memorization.downstream.run_downstream`)."""

    model_path: str | os.PathLike
    perplexity_source: str | os.PathLike | None = None
    tasks: tuple[str, ...] | None = None
    include_path: Any = DEFAULT_TASK_DIR
    include_defaults: bool | None = None
    limit: int | float | None = None
    num_fewshot: int | None = None
    out_dir: str | os.PathLike | None = None
    batch_size: int = 8
    device: str | None = None
    dtype: str | None = "auto"
    max_length: int | None = None
    stride: int | None = None
    text_key: str = "text"
    add_bos: bool = True
    tokenizer_path: str | os.PathLike | None = None
    grid: str | None = None


def _fields(config: Any) -> dict[str, Any]:
    """A config's fields by name (not copied)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _extract(config: ExtractionEvalConfig) -> dict | None:
    from memorization.extraction_eval import run_extraction

    return run_extraction(config)


def _mia(config: MiaConfig) -> dict:
    from memorization.mia import run_mia

    return run_mia(**_fields(config))


def _downstream(config: DownstreamConfig) -> dict:
    from memorization.downstream import run_downstream

    kwargs = _fields(config)
    kwargs["tasks"] = list(config.tasks) if config.tasks is not None else None
    return run_downstream(**kwargs)


def _hpc_code(config: HpcCodeConfig) -> dict | None:
    from memorization.hpc_code.evaluate import evaluate_hpc_code

    return evaluate_hpc_code(config, note=log.warning)  # its notes and warnings as log records, not on stderr


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: its ``name``, its ``config`` class and ``function(config) -> report`` (None on a grid's
    ranks other than 0 where the function reports on rank 0 alone)."""

    name: str
    config: type
    function: Callable[[Any], dict | None]
    summary: str


EVALUATIONS: dict[str, Evaluation] = {e.name: e for e in (
    Evaluation("extract", ExtractionEvalConfig, _extract, "greedy (and sampled, beam, hint) extraction of documents"),
    Evaluation("mia", MiaConfig, _mia, "membership inference: loss, zlib, Min-K%, Min-K%++ and reference scores"),
    Evaluation("downstream", DownstreamConfig, _downstream, "held-out perplexity and/or lm-evaluation-harness tasks"),
    Evaluation("hpc-code", HpcCodeConfig, _hpc_code, "pass@k, build@k and speedup@k of generated HPC code"),
)}


def evaluate(name: str, config: Any) -> dict | None:
    """Run the evaluation ``name`` with ``config`` (an instance of its config class); ``ValueError`` for an unknown
    name, ``TypeError`` for another evaluation's config."""
    if name not in EVALUATIONS:
        raise ValueError(f"unknown evaluation {name!r}: choose from {', '.join(EVALUATIONS)}")
    ev = EVALUATIONS[name]
    if not isinstance(config, ev.config):
        raise TypeError(f"evaluation {name!r} takes a {ev.config.__name__}, got a {type(config).__name__}")
    return ev.function(config)
