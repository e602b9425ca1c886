"""Downstream quality of a checkpoint: held-out perplexity and lm-evaluation-harness tasks.

The Goldfish paper's claim is that dropping 1/k of the tokens from the loss costs "little to
none" downstream; this module measures that cost on our own checkpoints.

Perplexity
----------
Token-weighted perplexity over a set of held-out documents::

    PPL = exp( sum_d sum_{t in scored(d)} -log p(x_t | context_t) / sum_d |scored(d)| )

Every token of a document except the first (no context; prepend BOS to score it) is scored
exactly once.  A document longer than the context length ``L`` is split into sliding
windows: window ``w`` covers ``x[b_w : b_w + L]`` with ``b_w = w * S`` (stride ``S <= L``) and
scores only the tokens the previous window has not scored, so each scored token after the
first window sees at least ``L - S`` tokens of context (Hugging Face's "perplexity of
fixed-length models" recipe, with every window after the first a full ``L`` tokens).  A document
that fits in one window is scored in one window, and the result then equals the plain ``exp(mean NLL)``.  Windows of all documents are
batched together (padding + attention mask, one forward pass per batch).

Defaults: ``L`` = the model's context length capped at 4096 (Llama 3.1 declares 131072),
``S = L // 2`` (``S`` must be below ``L``; ``S = L - 1`` gives the cheapest run, windows
overlapping by one token).  Sources: a ``.jsonl`` file (one ``{"text": ...}`` per line), a ``.txt``
file (one document), a ``.json`` list of strings / ``{"text"}`` objects, or a manifest (its
``nonmembers``: held-out documents of the training distribution; their ``token_ids`` are
used as given).

lm-evaluation-harness bridge
----------------------------
:func:`run_lm_eval` wraps an already-loaded model with lm-eval 0.4.x's ``HFLM`` and calls
``lm_eval.simple_evaluate`` once per requested task, so one task failing (an unknown name, a
dataset that cannot be downloaded offline) is reported in ``errors`` and the others still
run.  Task names are checked against a ``TaskManager`` that indexes the built-in tasks plus
``include_path`` (by default the project's ``data/lm_eval_tasks``, which ships the offline
task ``goldfish_mc``); an unknown name gives an error that names close matches and how to
list tasks.  Relative ``dataset_kwargs.data_files`` in a task YAML are resolved against the
YAML's own directory (lm-eval would resolve them against the current directory), so local
tasks run offline from anywhere.

Public API
----------
:func:`perplexity`, :func:`window_spans`, :func:`load_perplexity_docs`,
:func:`evaluate_perplexity`, :func:`run_lm_eval`, :func:`list_lm_eval_tasks`,
:func:`run_downstream`, :func:`report_markdown`.  The CLI is ``python eval/downstream.py``.
"""
from __future__ import annotations

import difflib
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memorization.models import model_context
from memorization.eval_model import (MissingTokenizerError, as_id_lists, axonn_checkpoint, check_vocab, default_device,
                                     grid_runtime, load_checkpoint, load_on_grid, model_config_of, model_device,
                                     model_max_length)
from memorization.mia.scoring import pad_batch, sequence_token_logprobs
from memorization.mixture import check_manifest_doc

log = logging.getLogger(__name__)

#: The project's own lm-eval tasks (YAML + local data), indexed by default.
DEFAULT_TASK_DIR = Path(__file__).resolve().parents[1] / "data" / "lm_eval_tasks"

#: The offline sanity task shipped in :data:`DEFAULT_TASK_DIR`.
LOCAL_TASK = "goldfish_mc"

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


class UnknownTaskError(KeyError):
    """An lm-eval task/group/tag name that no indexed task directory defines."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0]) if self.args else ""


class LMEvalNotInstalledError(ImportError):
    """lm-evaluation-harness is not installed (``pip install 'lm-eval>=0.4,<0.5'``)."""


# --------------------------------------------------------------------------- perplexity


def window_spans(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """Sliding windows over a document of ``n_tokens`` tokens.

    Returns ``(begin, end, first)`` triples: the window is ``x[begin:end]`` and its targets
    ``x[begin+first : end]`` are scored.  The first window is ``x[0:min(L, n)]`` and scores
    tokens ``1..end-1``; each next window scores the next ``S`` tokens (fewer at the end) and
    is the ``L`` tokens ending at its last target, so every scored token sees at least
    ``L - S >= 1`` tokens of context.  Together the windows score tokens ``1 .. n-1``
    exactly once each.  Requires ``1 <= S <= L - 1``.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    if not 1 <= stride <= max_length - 1:
        raise ValueError(
            f"stride must be in [1, max_length - 1 = {max_length - 1}] so that every scored "
            f"token has context, got {stride}")
    if n_tokens < 2:
        return []
    end = min(max_length, n_tokens)
    spans: list[tuple[int, int, int]] = [(0, end, 1)]
    while end < n_tokens:
        prev_end, end = end, min(end + stride, n_tokens)
        begin = max(0, end - max_length)
        spans.append((begin, end, prev_end - begin))
    return spans


@torch.no_grad()
def perplexity(
    model: torch.nn.Module,
    docs: Sequence[Sequence[int]] | Sequence[torch.Tensor] | torch.Tensor,
    *,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    progress: bool = True,
    grid=None,
) -> dict[str, Any]:
    """Token-weighted sliding-window perplexity of ``model`` on token-id documents.

    With ``grid`` (an axonn grid ``model`` is parallelized on) the windows are split over its data x depth
    replicas (:func:`memorization.runtime.map_over_replicas`: equal shares, so every depth rank runs the same
    forwards) and every rank returns the whole result.

    Args:
        model: causal LM returning ``.logits``, already on ``device``.
        docs: token-id lists, one per document (include BOS yourself if it should be used).
        max_length: window length ``L`` (default: model context length, capped at 4096).
        stride: window stride ``S`` (default ``L // 2``), ``1 <= S <= L - 1``.
        batch_size: windows per forward pass.
        device: default: the model's device.

    Returns:
        ``{"perplexity": exp(nll), "nll": mean NLL per scored token (nats), "n_tokens",
        "n_docs", "n_windows", "max_length", "stride", "doc_nll": per-document mean NLL}``.
    """
    for name, v in (("max_length", max_length), ("stride", stride), ("batch_size", batch_size)):
        if v is not None and int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    from tqdm.auto import tqdm

    _check_context(max_length, model_context(model))
    dev = torch.device(device) if device is not None else model_device(model)
    max_length = int(max_length if max_length is not None else model_max_length(model))
    stride = int(stride if stride is not None else max(1, max_length // 2))
    ids = as_id_lists(docs)
    check_vocab(model, ids, "perplexity")
    windows: list[tuple[int, list[int], int]] = []  # (doc index, window ids, first scored)
    for d, x in enumerate(ids):
        for b, e, first in window_spans(len(x), max_length, stride):
            windows.append((d, x[b:e], first))
    if not windows:
        raise ValueError("no document has 2 or more tokens: nothing to score")

    def window_nll(share: list[tuple[int, list[int], int]]) -> list[tuple[float, int]]:
        """(summed NLL, scored tokens) of each window, longest windows batched first."""
        order = sorted(range(len(share)), key=lambda i: -len(share[i][1]))
        out: list[tuple[float, int]] = [(0.0, 0)] * len(share)
        starts = range(0, len(order), batch_size)
        for s in tqdm(starts, desc="perplexity", unit="batch", disable=not progress or len(starts) <= 1):
            idx = order[s : s + batch_size]
            batch = [share[i] for i in idx]
            input_ids, attn = pad_batch([w[1] for w in batch], dev)
            logp, valid = sequence_token_logprobs(model, input_ids, attn)
            first = torch.tensor([w[2] for w in batch], device=dev)
            # logp[:, c] scores target position c + 1 of the window
            col = torch.arange(logp.size(1), device=dev)[None, :]
            scored = valid & (col >= (first[:, None] - 1))
            sums = (-(logp * scored).sum(dim=1).double()).tolist()
            for i, v, c in zip(idx, sums, scored.sum(dim=1).tolist()):
                out[i] = (v, c)
        return out

    if grid is None:
        per_window = window_nll(windows)
    else:
        from memorization.runtime import map_over_replicas

        per_window = map_over_replicas(window_nll, windows, grid)
    doc_sum = np.zeros(len(ids), dtype=np.float64)
    doc_cnt = np.zeros(len(ids), dtype=np.int64)
    doc_idx = np.array([w[0] for w in windows])
    np.add.at(doc_sum, doc_idx, np.array([v for v, _ in per_window], dtype=np.float64))
    np.add.at(doc_cnt, doc_idx, np.array([c for _, c in per_window], dtype=np.int64))
    n_tok = int(doc_cnt.sum())
    nll = float(doc_sum.sum() / n_tok)
    with np.errstate(invalid="ignore", divide="ignore"):
        doc_nll = np.where(doc_cnt > 0, doc_sum / np.maximum(doc_cnt, 1), np.nan)
    return {
        "perplexity": math.exp(nll),
        "nll": nll,
        "n_tokens": n_tok,
        "n_docs": int((doc_cnt > 0).sum()),
        "n_windows": len(windows),
        "max_length": max_length,
        "stride": stride,
        "doc_nll": doc_nll,
    }


def _check_context(max_length: int | None, ctx: int | None) -> None:
    """A window longer than the model's context would score positions it was never trained on."""
    if max_length is not None and ctx and int(max_length) > ctx:
        raise ValueError(f"max_length {max_length} exceeds the model's context ({ctx} tokens: "
                         "max_position_embeddings, or the trained length of a model trained from scratch)")


def _check_lm_eval_args(limit: int | float | None, num_fewshot: int | None) -> None:
    """lm-eval would fail deep inside (islice of a negative count, "did not find any docs") or
    silently accept a negative few-shot count."""
    if limit is not None and not limit > 0:
        raise ValueError(f"limit must be > 0 (a count, or a fraction of each task when below 1), got {limit}")
    if num_fewshot is not None and num_fewshot < 0:
        raise ValueError(f"num_fewshot must be >= 0, got {num_fewshot}")


def _existing_source(source: str | os.PathLike) -> Path:
    p = Path(source)
    if not p.is_file():
        raise FileNotFoundError(f"perplexity source {str(p)!r} does not exist")
    return p


def load_perplexity_docs(
    source: str | os.PathLike, *, text_key: str = "text"
) -> tuple[list[str], list[list[int]] | None]:
    """Read held-out documents for :func:`perplexity`.

    ``source`` is a manifest (a JSON object with ``nonmembers``), a ``.json`` list of strings or
    ``{text_key: ...}`` objects, a ``.jsonl`` file with one ``{text_key: ...}`` per line, or a
    ``.txt`` file (one document).  Returns ``(texts, token_ids)``; ``token_ids`` is only
    given for a manifest whose nonmembers all carry them.
    """
    p = _existing_source(source)
    if p.suffix == ".jsonl":
        texts = []
        with open(p, encoding="utf-8") as fh:
            for ln, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"{p}:{ln}: expected a JSON object with a {text_key!r} field, "
                                     f"got {type(row).__name__}")
                if text_key not in row:
                    raise ValueError(f"{p}:{ln}: no {text_key!r} field (use --text-key)")
                if not isinstance(row[text_key], str):
                    raise ValueError(f"{p}:{ln}: {text_key!r} is a {type(row[text_key]).__name__}, "
                                     "not a string")
                texts.append(row[text_key])
        return texts, None
    if p.suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "nonmembers" in data:
            docs = data["nonmembers"]
            if not isinstance(docs, list) or not docs:
                raise ValueError(f"manifest {p} has no nonmembers")
            for i, d in enumerate(docs):
                check_manifest_doc(d, f"manifest {p}: nonmembers[{i}]")
            texts = [d.get("text", "") for d in docs]
            ids = [list(map(int, d["token_ids"])) for d in docs] \
                if all("token_ids" in d for d in docs) else None
            if ids is None:  # texts are tokenised: one without text would be silently dropped
                for i, d in enumerate(docs):
                    if "text" not in d:
                        raise ValueError(
                            f"manifest {p}: nonmembers[{i}] has token_ids but no text, and others have "
                            "no token_ids, so the texts are used: give every nonmember its text")
            return texts, ids
        if isinstance(data, list):
            texts = []
            for i, d in enumerate(data):
                t = d.get(text_key) if isinstance(d, dict) else d
                if not isinstance(t, str):
                    raise ValueError(f"{p}: item {i} is not a string or an object with a string "
                                     f"{text_key!r} field (use --text-key)")
                texts.append(t)
            return texts, None
        raise ValueError(f"{p}: expected a manifest (with 'nonmembers') or a list of texts")
    return [p.read_text(encoding="utf-8")], None


def evaluate_perplexity(
    model: torch.nn.Module,
    tokenizer: Any | None,
    source: str | os.PathLike,
    *,
    text_key: str = "text",
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    add_bos: bool = True,
    grid=None,
) -> dict[str, Any]:
    """:func:`perplexity` on the documents of ``source`` (see :func:`load_perplexity_docs`), on ``grid`` if given.

    Texts are tokenised without special tokens; with ``add_bos`` the tokenizer's BOS is
    prepended to every document that does not start with it, so the first real token is
    scored too.
    """
    texts, ids = load_perplexity_docs(source, text_key=text_key)
    if ids is None:
        if tokenizer is None:
            raise MissingTokenizerError(
                f"perplexity on {source}: texts need a tokenizer and the checkpoint has none; "
                "pass --tokenizer PATH")
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    bos = getattr(tokenizer, "bos_token_id", None) if add_bos else None
    if bos is not None:
        ids = [d if d and d[0] == bos else [bos, *d] for d in ids]
    out = perplexity(model, ids, max_length=max_length, stride=stride, batch_size=batch_size,
                     device=device, grid=grid)
    out["source"] = str(source)
    return out


# --------------------------------------------------------------------------- lm-eval


def _require_lm_eval() -> None:
    try:
        import lm_eval  # noqa: F401
    except ImportError as err:
        raise LMEvalNotInstalledError(
            "lm-evaluation-harness is not installed: pip install 'lm-eval>=0.4,<0.5' "
            "(or pip install -e '.[eval]')") from err


def _task_manager(include_path: Sequence[str | os.PathLike], include_defaults: bool) -> Any:
    from lm_eval.tasks import TaskManager

    paths = [str(p) for p in include_path]
    return TaskManager(include_path=paths or None, include_defaults=include_defaults)


def list_lm_eval_tasks(
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = DEFAULT_TASK_DIR,
    include_defaults: bool = True,
) -> list[str]:
    """All task, group and tag names lm-eval knows, plus those under ``include_path``."""
    _require_lm_eval()
    return list(_task_manager(_as_paths(include_path), include_defaults).all_tasks)


def _as_paths(p: Any) -> list[Path]:
    if p is None:
        return []
    if isinstance(p, (str, os.PathLike)):
        return [Path(p)]
    return [Path(x) for x in p]


def _include_dirs(include_path: Any) -> list[Path]:
    """The lm-eval include paths, each checked to be a directory."""
    paths = _as_paths(include_path)
    for p in paths:
        if not p.is_dir():
            raise FileNotFoundError(f"lm-eval include path {str(p)!r} is not a directory")
    return paths


def _load_task_yaml(path: Path) -> dict[str, Any]:
    try:  # lm-eval >= 0.4.10
        from lm_eval.tasks._yaml_loader import load_yaml

        return dict(load_yaml(path, resolve_func=True, recursive=True))
    except ImportError:  # older 0.4.x
        from lm_eval.utils import load_yaml_config

        return dict(load_yaml_config(str(path), mode="full"))


def _resolve_local_data(task_manager: Any, name: str) -> str | dict[str, Any]:
    """The task spec to hand to lm-eval: the name itself, or -- when the task's YAML has
    relative ``dataset_kwargs.data_files``/``data_dir`` that exist next to the YAML -- its
    full config with those paths made absolute."""
    entry = getattr(task_manager, "task_index", {}).get(name)
    yaml_path = getattr(entry, "yaml_path", None) if entry is not None else None
    if yaml_path is None or getattr(entry, "kind", None) is None or \
            getattr(entry.kind, "name", "") != "TASK":
        return name
    yaml_path = Path(yaml_path)
    cfg = _load_task_yaml(yaml_path)
    kwargs = dict(cfg.get("dataset_kwargs") or {})
    base = yaml_path.parent
    changed = False

    def fix(p: Any) -> Any:
        nonlocal changed
        if isinstance(p, str) and not os.path.isabs(p) and "://" not in p and \
                (base / p).exists():
            changed = True
            return str((base / p).resolve())
        if isinstance(p, list):
            return [fix(x) for x in p]
        if isinstance(p, dict):
            return {k: fix(v) for k, v in p.items()}
        return p

    for key in ("data_files", "data_dir"):
        if key in kwargs:
            kwargs[key] = fix(kwargs[key])
    if not changed:
        return name
    cfg["dataset_kwargs"] = kwargs
    for key in ("group", "tag"):  # structural keys are not part of a single task's config
        cfg.pop(key, None)
    return cfg


def _unknown_task_message(name: str, known: Sequence[str], searched: list[Path],
                          defaults: bool) -> str:
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.6)
    where = ", ".join(str(p) for p in searched) or "(none)"
    msg = f"unknown lm-eval task {name!r}"
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    msg += (f" (searched {'the built-in tasks and ' if defaults else ''}include paths: {where}). "
            "List tasks with `python eval/downstream.py --list-tasks` or `lm-eval ls tasks "
            "--include_path data/lm_eval_tasks`.")
    return msg


def _clean_metrics(res: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in res.items():
        if key == "alias":
            continue
        metric, _, filt = key.partition(",")
        name = metric if filt in ("", "none") else f"{metric}[{filt}]"
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            out[name] = None if isinstance(val, float) and math.isnan(val) else val
        elif val == "N/A":
            out[name] = None
    return out


def run_lm_eval(
    model: torch.nn.Module,
    tokenizer: Any,
    tasks: Sequence[str],
    *,
    include_path: str | os.PathLike | Sequence[str | os.PathLike] | None = DEFAULT_TASK_DIR,
    include_defaults: bool | None = None,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    bootstrap_iters: int = 1000,
    seed: int = 1234,
    grid=None,
) -> dict[str, Any]:
    """Evaluate a loaded model on lm-eval tasks, one ``simple_evaluate`` call per task.

    Args:
        model, tokenizer: a loaded ``transformers`` causal LM (on its device) and tokenizer;
            wrapped as ``HFLM(pretrained=model, tokenizer=tokenizer)``, or, with ``grid`` (the axonn grid
            ``model`` is parallelized on), as :class:`memorization.lm_eval_grid.GridLM`: the same requests
            scored on the grid, every rank returning every result.
        tasks: lm-eval task, group or tag names (e.g. ``arc_easy``, ``hellaswag``,
            ``goldfish_mc``).
        include_path: extra task directories (default: the project's data/lm_eval_tasks).
        include_defaults: also index lm-eval's built-in tasks.  ``None`` (default) indexes
            only ``include_path`` when every requested name is found there (fast: the
            built-in index has ~15k entries) and the built-ins otherwise.
        limit: at most this many examples per task (a fraction if < 1).
        num_fewshot: override the tasks' few-shot count.
        batch_size, max_length: passed to ``HFLM`` (``max_length`` default: model context,
            capped at 4096).
        bootstrap_iters: bootstrap resamples for stderrs of non-mean metrics.

    Returns:
        ``{"results": {task: {metric: value}}, "n_samples": {task: int}, "errors":
        {requested name: message}}``.  An unknown name or a task that fails to load/run is
        put in ``errors`` (with close matches for unknown names) and the rest still runs.
    """
    _check_lm_eval_args(limit, num_fewshot)
    _require_lm_eval()
    if tokenizer is None:
        raise MissingTokenizerError(
            "lm-eval tasks need the checkpoint's tokenizer and none was found; save it with "
            "tokenizer.save_pretrained(<checkpoint>) or pass --tokenizer PATH")
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    paths = _include_dirs(include_path)
    tasks = [t.strip() for t in tasks if t and t.strip()]
    results: dict[str, Any] = {"results": {}, "n_samples": {}, "errors": {}}
    if not tasks:
        return results

    defaults = include_defaults
    tm = None
    if defaults is None:
        tm = _task_manager(paths, include_defaults=False)
        defaults = not all(t in tm.all_tasks for t in tasks)
    if tm is None or defaults:
        if defaults:
            log.info("indexing lm-eval's built-in tasks (takes a few seconds)")
        tm = _task_manager(paths, include_defaults=defaults)
    known = list(tm.all_tasks)

    runnable = []
    for t in tasks:
        if t in known:
            runnable.append(t)
        else:
            msg = _unknown_task_message(t, known, paths, defaults)
            log.error(msg)
            results["errors"][t] = msg
    if not runnable:
        return results

    max_length = int(max_length or model_max_length(model))
    if grid is None:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
                  max_length=max_length, backend="causal")
    else:
        from memorization.lm_eval_grid import GridLM

        lm = GridLM(model, tokenizer, grid, batch_size=batch_size, max_length=max_length)
    for t in runnable:
        try:
            spec = _resolve_local_data(tm, t)
            out = lm_eval.simple_evaluate(
                model=lm, tasks=[spec], task_manager=tm, limit=limit,
                num_fewshot=num_fewshot, bootstrap_iters=bootstrap_iters,
                log_samples=False, random_seed=seed, numpy_random_seed=seed,
                torch_random_seed=seed, fewshot_random_seed=seed)
        except Exception as err:  # noqa: BLE001 - one task failing must not stop the rest
            msg = f"lm-eval task {t!r} failed: {type(err).__name__}: {err}"
            log.error(msg)
            results["errors"][t] = msg
            continue
        if out is None:  # not rank 0
            continue
        for name, res in out.get("results", {}).items():
            results["results"][name] = _clean_metrics(res)
        for name, n in (out.get("n-samples") or {}).items():
            results["n_samples"][name] = n.get("effective", n) if isinstance(n, dict) else n
    return results


# --------------------------------------------------------------------------- end to end


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
    perplexity windows and the lm-eval requests split over its replicas (:mod:`memorization.lm_eval_grid`).

    The checkpoint must have a tokenizer (or ``tokenizer_path``): a missing one raises
    :class:`MissingTokenizerError` before anything runs.  A failing perplexity source or task
    is recorded (``perplexity_error`` / ``lm_eval.errors``) and the rest goes on.  With
    ``out_dir`` writes ``downstream.json`` and ``downstream.md``.
    """
    # what can be checked without the model is checked before it loads
    if perplexity_source is not None:
        _existing_source(perplexity_source)
    if tasks:
        _include_dirs(include_path)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_length is not None and max_length < 2:  # 0 would silently mean "the default"
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    if tasks:
        _check_lm_eval_args(limit, num_fewshot)
    from transformers import AutoConfig

    from memorization.model_files import check_model_config

    if grid and axonn_checkpoint(model_path) is not None:  # a training checkpoint, resharded onto the grid
        config = model_config_of(model_path)
    else:
        config = AutoConfig.from_pretrained(str(check_model_config(model_path)))  # (weights: load_checkpoint checks)
    _check_context(max_length, model_context(config))
    if perplexity_source is not None:  # window and stride as perplexity() will take them
        L = int(max_length or model_max_length(config))
        window_spans(0, L, int(stride if stride is not None else max(1, L // 2)))
    rt = grid_runtime(grid) if grid else None
    if rt is None:
        device = device or default_device()
        model, tok = load_checkpoint(model_path, device=device, dtype=dtype,
                                     tokenizer_path=tokenizer_path, require_tokenizer=True)
    else:
        model, tok = load_on_grid(model_path, rt, tokenizer_path, require_tokenizer=True)
    report: dict[str, Any] = {"model": str(model_path)}
    if perplexity_source is not None:
        try:
            ppl = evaluate_perplexity(model, tok, perplexity_source, text_key=text_key,
                                      max_length=max_length, stride=stride,
                                      batch_size=batch_size, add_bos=add_bos, grid=rt and rt.grid)
            ppl.pop("doc_nll")
            report["perplexity"] = ppl
        except (FileNotFoundError, ValueError, KeyError, json.JSONDecodeError) as err:
            log.error("perplexity on %s failed: %s", perplexity_source, err)
            report["perplexity_error"] = f"{type(err).__name__}: {err}"
    if tasks:
        report["lm_eval"] = run_lm_eval(
            model, tok, tasks, include_path=include_path, include_defaults=include_defaults,
            limit=limit, num_fewshot=num_fewshot, batch_size=batch_size,
            max_length=max_length, grid=rt and rt.grid)
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
