"""The lm-evaluation-harness bridge: run lm-eval tasks on an already-loaded model.

:func:`run_lm_eval` wraps an already-loaded model with lm-eval 0.4.x's ``HFLM`` and calls
``lm_eval.simple_evaluate`` once per requested task, so one task failing (an unknown name, a
dataset that cannot be downloaded offline) is reported in ``errors`` and the others still
run.  Task names are checked against a ``TaskManager`` that indexes the built-in tasks plus
``include_path`` (by default the project's ``data/lm_eval_tasks``, which ships the offline
task ``goldfish_mc``); an unknown name gives an error that names close matches and how to
list tasks.  Relative ``dataset_kwargs.data_files`` in a task YAML are resolved against the
YAML's own directory (lm-eval would resolve them against the current directory), so local
tasks run offline from anywhere.
"""
from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from memorization.evaluation.eval_model import MissingTokenizerError
from memorization.lm import LM, as_lm

log = logging.getLogger(__name__)

#: The project's own lm-eval tasks (YAML + local data), indexed by default.
DEFAULT_TASK_DIR = Path(__file__).resolve().parents[2] / "data" / "lm_eval_tasks"

#: The offline sanity task shipped in :data:`DEFAULT_TASK_DIR`.
LOCAL_TASK = "goldfish_mc"


class UnknownTaskError(KeyError):
    """An lm-eval task/group/tag name that no indexed task directory defines."""

    def __str__(self) -> str:  # KeyError would print the message with quotes
        return str(self.args[0]) if self.args else ""


class LMEvalNotInstalledError(ImportError):
    """lm-evaluation-harness is not installed (``pip install 'lm-eval>=0.4,<0.5'``)."""


def check_lm_eval_args(limit: int | float | None, num_fewshot: int | None) -> None:
    """lm-eval would fail deep inside (islice of a negative count, "did not find any docs") or
    silently accept a negative few-shot count."""
    if limit is not None and not 0 < limit < float("inf"):
        raise ValueError(f"limit must be > 0 and finite (a count, or a fraction of each task when below 1), got {limit}")
    if num_fewshot is not None and num_fewshot < 0:
        raise ValueError(f"num_fewshot must be >= 0, got {num_fewshot}")



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


def include_dirs(include_path: Any) -> list[Path]:
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
    model: torch.nn.Module | LM,
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
            ``model`` is parallelized on; or ``model`` a :class:`memorization.lm.LM` on a grid), as
            :class:`memorization.evaluation.lm_eval_grid.GridLM`: the same requests scored on the grid, every rank
            returning every result.
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
    check_lm_eval_args(limit, num_fewshot)
    _require_lm_eval()
    model = as_lm(model, tokenizer, grid)
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise MissingTokenizerError(
            "lm-eval tasks need the checkpoint's tokenizer and none was found; save it with "
            "tokenizer.save_pretrained(<checkpoint>) or pass --tokenizer PATH")
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    paths = include_dirs(include_path)
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

    max_length = int(max_length or model.max_length)
    if model.grid is None:
        lm = HFLM(pretrained=model.model, tokenizer=tokenizer, batch_size=batch_size,
                  max_length=max_length, backend="causal")
    else:
        from memorization.evaluation.lm_eval_grid import GridLM

        lm = GridLM(model, batch_size=batch_size, max_length=max_length)
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

