"""Downstream quality of a checkpoint: held-out perplexity and lm-evaluation-harness tasks.

The Goldfish paper's claim is that dropping 1/k of the tokens from the loss costs "little to
none" downstream; this module measures that cost on our own checkpoints.

:mod:`memorization.evaluation.perplexity` computes the perplexity (sliding windows over held-out documents) and
:mod:`memorization.evaluation.lm_eval_bridge` runs lm-evaluation-harness tasks on a loaded model; this module loads a
checkpoint, runs both, and reports (:func:`run_downstream`, :func:`report_markdown`).  Every public name of the
two is importable from here too.  The CLI is ``python eval/downstream.py``.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memorization.evaluation.eval_model import (MissingTokenizerError, axonn_checkpoint, default_device,
                                                model_config_of, model_max_length)
from memorization.evaluation.lm_eval_bridge import (DEFAULT_TASK_DIR, LOCAL_TASK, LMEvalNotInstalledError,
                                                    UnknownTaskError, check_lm_eval_args, include_dirs,
                                                    list_lm_eval_tasks, run_lm_eval)
from memorization.evaluation.perplexity import (check_context, evaluate_perplexity, existing_source,
                                                load_perplexity_docs, perplexity)
from memorization.lm import LM, window_spans
from memorization.training.models import model_context

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TASK_DIR",
    "LOCAL_TASK",
    "LMEvalNotInstalledError",
    "MissingTokenizerError",
    "UnknownTaskError",
    "window_spans",
    "perplexity",
    "load_perplexity_docs",
    "evaluate_perplexity",
    "list_lm_eval_tasks",
    "run_lm_eval",
    "run_downstream",
    "report_markdown",
]



def report_markdown(report: dict[str, Any]) -> str:
    """Markdown summary: perplexity line and one table row per lm-eval task."""
    lines = [f"## Downstream: `{report.get('model', '?')}`", ""]
    ppl = report.get("perplexity")
    if ppl:
        lines.append(
            f"- Perplexity on `{ppl['source']}`: **{ppl['perplexity']:.3f}** "
            f"(NLL {ppl['nll']:.4f} nats/token over {ppl['n_tokens']} tokens, "
            f"{ppl['n_docs']} docs, window {ppl['max_length']}, stride {ppl['stride']})")
    elif report.get("perplexity_error"):
        lines.append(f"- Perplexity: error: {report['perplexity_error']}")
    lm = report.get("lm_eval") or {}
    res = lm.get("results") or {}
    if res:
        lines += ["", "| task | n | acc | acc_norm | other metrics |", "|---|---|---|---|---|"]
        for task, m in res.items():
            def f(k: str) -> str:
                v = m.get(k)
                if v is None:
                    return "–"
                se = m.get(f"{k}_stderr")
                return f"{v:.4f}" + (f" ± {se:.4f}" if isinstance(se, float) else "")
            other = ", ".join(f"{k}={v:.4g}" for k, v in m.items()
                              if isinstance(v, (int, float)) and k != "sample_len"
                              and not k.startswith("acc") and not k.endswith("_stderr"))
            n = lm.get("n_samples", {}).get(task, "")
            lines.append(f"| {task} | {n} | {f('acc')} | {f('acc_norm')} | {other} |")
    for task, msg in (lm.get("errors") or {}).items():
        lines.append(f"- error in `{task}`: {msg}")
    return "\n".join(lines) + "\n"


def run_downstream(
    model_path: str | os.PathLike,
    *,
    perplexity_source: str | os.PathLike | None = None,
    tasks: Sequence[str] | None = None,
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = DEFAULT_TASK_DIR,
    include_defaults: bool | None = None,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    out_dir: str | os.PathLike | None = None,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str | None = "auto",
    max_length: int | None = None,
    stride: int | None = None,
    text_key: str = "text",
    add_bos: bool = True,
    tokenizer_path: str | os.PathLike | None = None,
    grid: str | None = None,
) -> dict[str, Any]:
    """Perplexity and/or lm-eval tasks for one checkpoint directory.

    With ``grid`` (``"D,R,C,Z"``, under torchrun/mpiexec/srun) the model is parallelized on it as in training, the
    perplexity windows and the lm-eval requests split over its replicas (:mod:`memorization.evaluation.lm_eval_grid`).

    The checkpoint must have a tokenizer (or ``tokenizer_path``): a missing one raises
    :class:`MissingTokenizerError` before anything runs.  A failing perplexity source or task
    is recorded (``perplexity_error`` / ``lm_eval.errors``) and the rest goes on.  With
    ``out_dir`` writes ``downstream.json`` and ``downstream.md``.
    """
    # what can be checked without the model is checked before it loads
    if perplexity_source is not None:
        existing_source(perplexity_source)
    if tasks:
        include_dirs(include_path)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length is not None and max_length < 2:  # 0 would silently mean "the default"
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    if tasks:
        check_lm_eval_args(limit, num_fewshot)
    from transformers import AutoConfig

    from memorization.evaluation.model_files import check_model_config

    if grid and axonn_checkpoint(model_path) is not None:  # a training checkpoint, resharded onto the grid
        config = model_config_of(model_path)
    else:
        config = AutoConfig.from_pretrained(str(check_model_config(model_path)),  # (weights: load_checkpoint checks)
                                            trust_remote_code=False)
    check_context(max_length, model_context(config))
    if perplexity_source is not None:  # window and stride as perplexity() will take them
        L = int(max_length or model_max_length(config))
        window_spans(0, L, int(stride if stride is not None else max(1, L // 2)))
    lm = LM.load(model_path, grid=grid or None, device=None if grid else (device or default_device()), dtype=dtype,
                 tokenizer_path=tokenizer_path, require_tokenizer=True)
    rt = lm.runtime
    report: dict[str, Any] = {"model": str(model_path)}
    if perplexity_source is not None:
        try:
            ppl = evaluate_perplexity(lm, lm.tokenizer, perplexity_source, text_key=text_key,
                                      max_length=max_length, stride=stride,
                                      batch_size=batch_size, add_bos=add_bos)
            ppl.pop("doc_nll")
            report["perplexity"] = ppl
        except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError) as err:
            log.error("perplexity on %s failed: %s", perplexity_source, err)
            report["perplexity_error"] = f"{type(err).__name__}: {err}"
    if tasks:
        report["lm_eval"] = run_lm_eval(
            lm, lm.tokenizer, tasks, include_path=include_path, include_defaults=include_defaults,
            limit=limit, num_fewshot=num_fewshot, batch_size=batch_size, max_length=max_length)
    if rt is not None:
        report["grid"] = grid
    report["markdown"] = report_markdown(report)
    if out_dir is not None and (rt is None or rt.is_main):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "downstream.json", "w", encoding="utf-8") as fh:
            json.dump({k: v for k, v in report.items() if k != "markdown"}, fh, indent=2,
                      default=str)
        (out / "downstream.md").write_text(report["markdown"], encoding="utf-8")
    return report
