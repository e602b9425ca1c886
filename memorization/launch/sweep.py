"""A resumable grid of memorize runs (sizes x exposures x Goldfish k x h) and its aggregation.

One *cell* is one experiment (:func:`memorization.experiment.run_experiment`, what
``recipes/memorize.py`` runs): a model size, one exposure count (every target
of the run is seen that many times) and one Goldfish setting (k, h), named
``<size>-e<exposures>-k<k>-h<h>`` (``<size>-e<exposures>-standard`` without a k >= 2).  The standard arm is shared: for a (size,
exposures) pair the first Goldfish setting runs with ``--arms both`` (standard + goldfish,
same mixture and seed) and every further (k, h) runs ``--arms goldfish`` only, on the same
mixture (the mixture depends only on the seed, the targets and the exposures, never on k).
Without any k >= 2 a cell runs the standard arm alone.

Resumability:

* a finished cell writes ``cells/<name>/cell.json`` atomically (write to a temporary file,
  then rename); a second sweep invocation skips every cell whose ``cell.json`` says ``ok``
  (when it was evaluated with other evaluation flags, only the evaluations are redone; when
  memorize's options differ, memorize --resume runs and refuses the changed settings);
* an interrupted cell has no ``cell.json`` (or an ``error`` one) and is run again with
  memorize's ``--resume`` (its finished arms are not re-trained, an interrupted arm continues
  from its last checkpoint);
* post-training evaluations (perplexity, MIA, lm-eval, HPC code) are cached per arm in
  ``cells/<name>/<arm>/sweep_eval.json`` (also atomic), so they are not repeated either;
* a failing cell (a memorize error, an exception) is recorded in its ``cell.json`` with the
  error and traceback, and the sweep goes on; failed cells are retried on the next run.

The aggregated ``results.json`` holds every cell record and a flat table of *rows*, one per
(size, exposures, arm, k, h); :mod:`memorization.launch.sweep_report` turns it into the report.
"""
from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import shlex
import time
import traceback
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from memorization.experiment import ExperimentConfig, run_experiment
from memorization.experiment.config import config_from_dict, flat, to_dict
from memorization.data.mixture import atomic_write_json
from memorization.training.train import EXIT_INTERRUPTED

log = logging.getLogger(__name__)


#: MIA scores shown in the report (ref_diff needs a reference model the sweep does not have).
MIA_SCORES = ("loss", "zlib", "min_k", "min_k_pp")


class SweepError(ValueError):
    """A bad sweep specification (refused before anything runs)."""


# --------------------------------------------------------------------------- grid


@dataclass(frozen=True)
class Cell:
    """One memorize run of the sweep.

    ``goldfish_k == 0`` means standard loss only; ``arms`` is memorize's ``--arms``
    (``both``: standard + goldfish k, ``goldfish``: an extra k sharing the standard arm of the
    (size, exposures) cell that runs ``both``, ``standard``: no Goldfish k in the grid).
    """

    size: str
    exposures: int
    goldfish_k: int
    goldfish_h: int
    arms: str

    @property
    def name(self) -> str:
        base = f"{self.size}-e{self.exposures}"
        return f"{base}-standard" if self.goldfish_k == 0 else f"{base}-k{self.goldfish_k}-h{self.goldfish_h}"

    @property
    def arm_names(self) -> tuple[str, ...]:
        from memorization.experiment.config import parse_arms

        return tuple(parse_arms(self.arms, self.goldfish_k))

    def experiment(self, base: ExperimentConfig) -> ExperimentConfig:
        """``base`` with this cell's fields: its size, exposures, Goldfish setting and arms (field overrides)."""
        return replace(base, model=replace(base.model, size=self.size),
                       data=replace(base.data, exposures=str(self.exposures)),
                       goldfish=replace(base.goldfish, k=self.goldfish_k, h=self.goldfish_h, arms=self.arms))

    def config(self, base: ExperimentConfig, out: Path) -> ExperimentConfig:
        """``base`` (the pass-through options' config) with this cell's fields (:meth:`experiment`; ``{size}`` in
        its ``--init`` as the size: each size's checkpoint), run in ``out`` without progress bars."""
        cfg = self.experiment(base)
        init = base.model.init.replace("{size}", self.size) if base.model.init else None  # each size's checkpoint
        return replace(cfg, model=replace(cfg.model, init=init),
                       output=replace(cfg.output, out=str(out), no_progress=True))


def parse_int_list(text: str | Sequence[int], what: str, minimum: int = 0) -> tuple[int, ...]:
    """``"16,32,64"`` -> ``(16, 32, 64)`` (order kept, duplicates dropped); clear errors otherwise."""
    if isinstance(text, str):
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise SweepError(f"{what} {text!r}: give a comma list of integers") from None
    else:
        vals = [int(x) for x in text]
    if not vals:
        raise SweepError(f"{what}: empty list")
    bad = [v for v in vals if v < minimum]
    if bad:
        raise SweepError(f"{what}: values must be >= {minimum} (got {bad})")
    return tuple(dict.fromkeys(vals))


def parse_str_list(text: str | Sequence[str], what: str) -> tuple[str, ...]:
    vals = [x.strip() for x in text.split(",")] if isinstance(text, str) else [str(x) for x in text]
    vals = [v for v in vals if v]
    if not vals:
        raise SweepError(f"{what}: empty list")
    return tuple(dict.fromkeys(vals))


def expand_grid(sizes: Sequence[str], exposures: Sequence[int], ks: Sequence[int],
                hs: Sequence[int] = (13,)) -> list[Cell]:
    """All cells of sizes x exposures x (k, h), sharing one standard arm per (size, exposures).

    ``ks`` may hold 0 (the standard arm) and Goldfish k's >= 2; ``hs`` are hash widths >= 1
    (they only multiply the Goldfish settings).  Raises :class:`SweepError` on k = 1 or
    negatives, exposures < 1, or an empty list.
    """
    sizes = parse_str_list(sizes, "--sizes")
    exposures = parse_int_list(exposures, "--exposures", minimum=1)
    ks = parse_int_list(ks, "--goldfish-k", minimum=0)
    hs = parse_int_list(hs, "--goldfish-h", minimum=1)
    if 1 in ks:
        raise SweepError("--goldfish-k: k = 1 would drop every label; use 0 (standard) or k >= 2")
    from memorization.data.mixture import check_hash_width

    if any(k >= 2 for k in ks):
        try:
            check_hash_width(max(hs))
        except ValueError as e:
            raise SweepError(str(e)) from None
    gf = [(k, h) for k in ks if k >= 2 for h in hs]
    standard = 0 in ks
    cells = []
    for size, e in itertools.product(sizes, exposures):
        if not gf:
            cells.append(Cell(size, e, 0, hs[0], "standard"))
            continue
        for i, (k, h) in enumerate(gf):
            cells.append(Cell(size, e, k, h, "both" if (i == 0 and standard) else "goldfish"))
    return cells


def _arms_on_disk(root: Path, cell: Cell) -> str | None:
    """The ``--arms`` the memorize run already started in ``cell``'s directory ran with (None: not started)."""
    with contextlib.suppress(OSError, json.JSONDecodeError, AttributeError):
        return json.loads((root / "cells" / cell.name / "run_config.json").read_text()).get("arms")
    return None


def adopt_standard_arms(cells: Sequence[Cell], root: Path) -> list[Cell]:
    """Keep the standard arm of each (size, exposures) in the cell that already trains it.

    :func:`expand_grid` gives the standard arm to the first Goldfish setting of the list; a grid
    extended on resume (``--goldfish-k 0,4`` then ``0,2,4``) would move it to k=2 and run the
    finished k=4 cell again with ``--arms goldfish``, which memorize's ``--resume`` refuses (the cell
    turns into an error and a second standard arm is trained).  A cell whose run started with
    ``--arms both`` keeps it; otherwise the first cell not started yet gets it.
    """
    cells = list(cells)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cells):
        groups.setdefault((c.size, c.exposures), []).append(i)
    for idx in groups.values():
        if not any(cells[i].arms == "both" for i in idx):
            continue  # no standard arm in this grid (or a standard-only cell)
        disk = {i: _arms_on_disk(root, cells[i]) for i in idx}
        holder = next((i for i in idx if disk[i] == "both"), None)
        if holder is None:
            holder = next((i for i in idx if cells[i].arms == "both" and disk[i] is None), None)
        if holder is None:
            holder = next((i for i in idx if disk[i] is None), None)
        if holder is None:
            continue  # every cell already ran without the standard arm: memorize reports the conflict
        for i in idx:
            cells[i] = replace(cells[i], arms="both" if i == holder else "goldfish")
    return cells


# --------------------------------------------------------------------------- evaluations


@dataclass
class EvalOptions:
    """Which post-training evaluations every arm gets (perplexity always: it is cheap)."""

    mia: bool = False
    downstream: bool = False
    downstream_tasks: tuple[str, ...] = ("goldfish_mc",)
    downstream_limit: int | None = None
    hpc_code: bool = False
    hpc_problems: tuple[str, ...] = ("*_serial",)
    hpc_max_new_tokens: int = 64
    hpc_samples: int = 1
    batch_size: int = 8
    device: str | None = None  # None: cuda if available, else cpu
    dtype: str = "auto"  # bfloat16 on CUDA, float32 otherwise

    def __post_init__(self) -> None:
        from memorization.evaluation.eval_model import default_device

        self.device = self.device or default_device()


def _mia_summary(report: dict) -> dict:
    scores = report["scores"]
    return {
        name: {"auc": s["auc"], "tpr_at_fpr": s["tpr_at_fpr"],
               "by_exposure": {e: v["auc"] for e, v in (s.get("by_exposure") or {}).items()}}
        for name, s in scores.items()
    } | {"fpr_target": report["fpr_target"], "n_targets": report["n_targets"],
         "n_nonmembers": report["n_nonmembers"]}


def roc_points(scores_jsonl: Path, max_points: int = 200) -> dict:
    """ROC curves (oriented: higher = member) of each MIA score from ``mia_scores.jsonl``, trained targets only."""
    import numpy as np

    from memorization.evaluation.mia.roc import roc_curve
    from memorization.evaluation.mia.scoring import SCORE_DIRECTIONS

    rows = [json.loads(x) for x in scores_jsonl.read_text().splitlines() if x.strip()]
    members = [r for r in rows if r["split"] == "target" and (r.get("exposures") or 0) >= 1]
    non = [r for r in rows if r["split"] == "nonmember"]
    out = {}
    for name in MIA_SCORES:
        sign = SCORE_DIRECTIONS[name]
        pos = np.array([sign * r[name] for r in members if r.get(name) is not None], dtype=np.float64)
        neg = np.array([sign * r[name] for r in non if r.get(name) is not None], dtype=np.float64)
        if pos.size == 0 or neg.size == 0:
            continue
        fpr, tpr, _ = roc_curve(pos, neg)
        idx = np.unique(np.linspace(0, len(fpr) - 1, min(len(fpr), max_points)).round().astype(int))
        out[name] = {"fpr": fpr[idx].round(5).tolist(), "tpr": tpr[idx].round(5).tolist()}
    return out


def evaluate_arm(arm_dir: Path, manifest: Path, opts: EvalOptions) -> dict:
    """Perplexity (held-out nonmembers), and optionally MIA, lm-eval and HPC-code pass@k, of one arm: the
    evaluations ``downstream``, ``mia`` and ``hpc-code`` of :mod:`memorization.evaluation.registry`.

    Each evaluation that fails is recorded under ``errors`` and the others still run.
    """
    from memorization.evaluation.registry import DownstreamConfig, MiaConfig, evaluate

    model = arm_dir / "model"
    out: dict[str, Any] = {"errors": {}}
    t0 = time.perf_counter()
    try:
        rep = evaluate("downstream", DownstreamConfig(
            model, perplexity_source=manifest, tasks=tuple(opts.downstream_tasks) if opts.downstream else None,
            limit=opts.downstream_limit, batch_size=opts.batch_size, device=opts.device, dtype=opts.dtype))
        if "perplexity" in rep:
            p = rep["perplexity"]
            out["perplexity"] = {"perplexity": p["perplexity"], "nll": p["nll"], "n_tokens": p["n_tokens"]}
        if rep.get("perplexity_error"):
            out["errors"]["perplexity"] = rep["perplexity_error"]
        if opts.downstream:
            lm = rep.get("lm_eval") or {}
            out["downstream"] = lm.get("results", {})
            for t, msg in (lm.get("errors") or {}).items():
                out["errors"][f"downstream:{t}"] = msg
    except Exception as e:  # noqa: BLE001 - recorded, the rest goes on
        out["errors"]["perplexity/downstream"] = f"{type(e).__name__}: {e}"
    out["seconds_quality"] = time.perf_counter() - t0
    if opts.mia:
        t0 = time.perf_counter()
        try:
            rep = evaluate("mia", MiaConfig(model, manifest, out_dir=arm_dir / "mia", batch_size=opts.batch_size,
                                            device=opts.device, dtype=opts.dtype))
            out["mia"] = _mia_summary(rep)
            out["mia"]["roc"] = roc_points(arm_dir / "mia" / "mia_scores.jsonl")
        except Exception as e:  # noqa: BLE001
            out["errors"]["mia"] = f"{type(e).__name__}: {e}"
        out["seconds_mia"] = time.perf_counter() - t0
    if opts.hpc_code:
        t0 = time.perf_counter()
        try:
            out["hpc_code"] = run_hpc_code(model, arm_dir / "hpc_code.json", opts)
        except Exception as e:  # noqa: BLE001
            out["errors"]["hpc_code"] = f"{type(e).__name__}: {e}"
        out["seconds_hpc_code"] = time.perf_counter() - t0
    return out


def _hpc_dtype(opts: EvalOptions) -> str:
    """``opts.dtype`` as eval/hpc_code.py's ``--dtype`` (``auto`` resolved as the other evaluations resolve it)."""
    from memorization.evaluation.eval_model import resolve_dtype

    return str(resolve_dtype(opts.dtype, opts.device)).removeprefix("torch.")


def run_hpc_code(model: Path, output: Path, opts: EvalOptions) -> dict:
    """The ``hpc-code`` evaluation of ``model`` (:func:`hpc_codegen.evaluate.evaluate_hpc_code`: greedy,
    quick inputs, one worker, no tables on stdout; its report written to ``output``); returns its pass/build@1."""
    from memorization.evaluation.registry import evaluate
    from hpc_codegen.evaluate import HpcCodeConfig, HpcCodeError

    cfg = HpcCodeConfig(model=str(model), quick=True, temperature=0.0, samples=opts.hpc_samples,
                        max_new_tokens=opts.hpc_max_new_tokens, workers=(1,), progress=False, output=output,
                        device=opts.device, dtype=_hpc_dtype(opts), problems=tuple(opts.hpc_problems) or None,
                        print_tables=False)
    try:
        rep = evaluate("hpc-code", cfg)
    except HpcCodeError as e:
        raise RuntimeError(f"hpc-code evaluation: {e}") from None
    return {k: rep.get(k) for k in ("problems", "pass@1", "build@1", "speedup@1", "samples_per_problem")}


# --------------------------------------------------------------------------- cells


def _cell_done(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return rec if rec.get("status") == "ok" else None


def cell_config(cell: Cell, root: Path, base: ExperimentConfig) -> ExperimentConfig:
    """The config ``cell`` runs next, in ``root/cells/<name>``: ``--resume`` where memorize recorded its
    settings there, ``--overwrite`` where a run failed or died before that (nothing to keep)."""
    cell_dir = root / "cells" / cell.name
    cfg = cell.config(base, cell_dir)
    if (cell_dir / "run_config.json").exists():
        return replace(cfg, output=replace(cfg.output, resume=True))
    if cell_dir.exists() and any(cell_dir.iterdir()):
        return replace(cfg, output=replace(cfg.output, overwrite=True))
    return cfg


def run_key(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a cell's run computes and how, by flat name: ``cfg`` without its ``out`` (the sweep directory may move)
    and the flags the sweep adds to continue or restart it (``resume``, ``overwrite``).  A finished cell is reused
    for the same key only."""
    return {k: v for k, v in flat(cfg).items() if k not in ("out", "resume", "overwrite")}


def _recorded_key(record: dict) -> dict[str, Any] | None:
    """The :func:`run_key` of the config a cell record ran (None: a record without one)."""
    with contextlib.suppress(Exception):
        return run_key(config_from_dict(record["config"]))
    return None


def run_cell(cell: Cell, root: Path, base: ExperimentConfig, opts: EvalOptions,
             run: Callable[[ExperimentConfig], dict | None] | None = None, options: Sequence[str] = ()) -> dict:
    """Run (or resume) one cell and its evaluations; returns its record (also in ``cell.json``).

    ``base`` is the experiment every cell starts from (the cell's fields go over it: :func:`cell_config`);
    ``options`` says how it was given, for a reader (the pass-through memorize options: recorded, never read);
    ``run`` runs a config (default :func:`~memorization.experiment.run_experiment`).  Never raises for a failing
    run (except ``KeyboardInterrupt`` and the SIGUSR1 stop): the error is recorded.
    """
    cell_dir = root / "cells" / cell.name
    record_path = cell_dir / "cell.json"
    cfg = cell_config(cell, root, base)
    done = _cell_done(record_path)
    # a finished cell is reused only for the same run: with other settings (--steps, --seed, ...) memorize runs
    # again (--resume refuses settings that differ from the cell's run, a clear error)
    if done is not None and done.get("eval_options") == _opts_key(opts) and _recorded_key(done) == run_key(cfg):
        return {**done, "cached": True}
    prev = None
    if record_path.exists():
        with contextlib.suppress(OSError, json.JSONDecodeError):
            prev = json.loads(record_path.read_text())
    attempts = int((prev or {}).get("attempts", 0)) + 1
    run = run or run_experiment
    rec: dict[str, Any] = {"cell": asdict(cell), "name": cell.name, "dir": str(cell_dir.relative_to(root)),
                           "config": to_dict(cfg), "memorize_options": list(options), "attempts": attempts,
                           "eval_options": _opts_key(opts), "started_at": time.time()}
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # memorize prints its markdown table
            results = run(cfg)
        if not results or not results.get("arms"):
            raise RuntimeError("memorize returned no results")
        arms = {}
        for arm, a in results["arms"].items():
            arm_eval_path = cell_dir / arm / "sweep_eval.json"
            ev = json.loads(arm_eval_path.read_text()) if arm_eval_path.exists() else None
            if ev is None or ev.get("options") != _opts_key(opts):
                ev = {"options": _opts_key(opts), **evaluate_arm(cell_dir / arm, cell_dir / "manifest.json", opts)}
                atomic_write_json(arm_eval_path, ev)
            arms[arm] = {"memorize": a, "eval": ev}
        rec.update(status="ok", num_steps=results.get("num_steps"), num_targets=results.get("num_targets"),
                   settings=results.get("settings"), arms=arms)
    except KeyboardInterrupt:
        raise
    except SystemExit as e:
        if e.code == EXIT_INTERRUPTED:  # SIGUSR1: the arm checkpointed; stop the sweep, the cell resumes next time
            raise
        rec.update(status="error", error=f"SystemExit: {e.code}", traceback=traceback.format_exc(limit=8))
        log.error("cell %s failed: %s", cell.name, rec["error"])
    except Exception as e:  # noqa: BLE001 - any failure of one cell is recorded, the sweep goes on
        rec.update(status="error", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
        log.error("cell %s failed: %s", cell.name, rec["error"])
    rec["seconds"] = time.perf_counter() - t0
    rec["finished_at"] = time.time()
    atomic_write_json(record_path, rec)
    return {**rec, "cached": False}


def _opts_key(opts: EvalOptions) -> dict:
    return json.loads(json.dumps(asdict(opts)))


# --------------------------------------------------------------------------- aggregation


def arm_rows(records: Sequence[dict]) -> list[dict]:
    """One flat row per (size, exposures, arm, k, h) of the successful cells."""
    rows = []
    for rec in records:
        if rec.get("status") not in ("ok", "partial"):
            continue
        c = rec["cell"]
        for arm, a in rec["arms"].items():
            m, ev = a["memorize"], a["eval"]
            gf = m.get("goldfish", {})
            row = {
                "cell": rec["name"], "size": c["size"], "exposures": c["exposures"], "arm": arm,
                "k": gf.get("k", 0) if arm == "goldfish" else 0, "h": gf.get("h") if arm == "goldfish" else None,
                "exact_match": m["exact_match"], "exact_match_ci95": m.get("exact_match_ci95"),
                "token_match": m["token_match"], "rouge_l": m["rouge_l"],
                "val_loss": m["val_loss"], "final_train_loss": m["final_train_loss"], "steps": m["steps"],
                "train_seconds": m["train_seconds"], "goldfish_drop_frac": m["goldfish_drop_frac"],
                "perplexity": (ev.get("perplexity") or {}).get("perplexity"),
                "eval_errors": ev.get("errors") or {},
                "partial": rec["status"] == "partial",
            }
            mia = ev.get("mia") or {}
            for s in MIA_SCORES:
                row[f"mia_auc_{s}"] = (mia.get(s) or {}).get("auc")
                row[f"mia_tpr_{s}"] = (mia.get(s) or {}).get("tpr_at_fpr")
            for task, metrics in (ev.get("downstream") or {}).items():
                for key in ("acc", "acc_norm"):
                    if isinstance(metrics.get(key), (int, float)):
                        row[f"{task}_{key}"] = metrics[key]
            hpc = ev.get("hpc_code") or {}
            if hpc:
                row["hpc_pass@1"] = hpc.get("pass@1")
                row["hpc_build@1"] = hpc.get("build@1")
            rows.append(row)
    return rows


@dataclass
class SweepSummary:
    """What one sweep invocation did."""

    ran: list[str] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _partial_record(root: Path, cell: Cell) -> dict:
    """An unfinished cell: ``pending``, or ``partial`` with the arms memorize already finished (not evaluated)."""
    rec: dict[str, Any] = {"name": cell.name, "cell": asdict(cell), "status": "pending"}
    arms = {}
    for arm in cell.arm_names:
        p = root / "cells" / cell.name / arm / "arm_result.json"
        with contextlib.suppress(OSError, json.JSONDecodeError):
            arms[arm] = {"memorize": json.loads(p.read_text()), "eval": {}}
    if arms:
        rec.update(status="partial", arms=arms)
    return rec


def aggregate(root: Path, cells: Sequence[Cell], meta: dict) -> dict:
    """Collect every cell record of the grid into ``root/results.json`` (atomically); returns it."""
    cells = adopt_standard_arms(cells, root)
    records = []
    for cell in cells:
        p = root / "cells" / cell.name / "cell.json"
        if p.exists():
            with contextlib.suppress(OSError, json.JSONDecodeError):
                records.append(json.loads(p.read_text()))
                continue
        records.append(_partial_record(root, cell))
    data = {**meta, "cells": records, "rows": arm_rows(records)}
    ran = {tuple(r.get("memorize_options") or ()) for r in records if r.get("status") == "ok"}
    if ran:  # what the finished cells ran with (a --report-only may be given other options)
        data["memorize_options"] = list(next(iter(ran))) if len(ran) == 1 else None
    atomic_write_json(root / "results.json", data)
    return data


def preflight_cells(cells: Sequence[Cell], root: Path, base: ExperimentConfig) -> None:
    """Run every unfinished cell's pre-flight checks (:func:`memorization.experiment.preflight.preflight`:
    its config, ``--init``, tokenizer, corpus and grid) before the first cell starts, so a grid with one bad
    cell is refused whole (:class:`SweepError` naming each cell, the check and the fix) instead of failing
    hours in.  The corpus check prepares each cell's token store into the cache, where the cell's run finds it."""
    from memorization.experiment.preflight import preflight

    failed = []
    for cell in cells:
        if _cell_done(root / "cells" / cell.name / "cell.json") is not None:
            continue
        failed += [f"{cell.name}: {c.line()}" for c in preflight(cell_config(cell, root, base)) if c.failed]
    if failed:
        raise SweepError("these cells would fail; none was run:\n  " + "\n  ".join(failed))


def run_sweep(cells: Sequence[Cell], root: Path, base: ExperimentConfig, opts: EvalOptions, meta: dict,
              progress: bool = True, run: Callable[[ExperimentConfig], dict | None] | None = None,
              options: Sequence[str] = ()) -> tuple[dict, SweepSummary]:
    """Run every cell in order (finished ones are skipped), aggregating after each; returns (results, summary).
    ``base`` is the experiment every cell starts from and ``options`` how it was given (:func:`run_cell`).
    Every unfinished cell's pre-flight checks run first (:func:`preflight_cells`: a :class:`SweepError`)."""
    from tqdm.auto import tqdm

    root.mkdir(parents=True, exist_ok=True)
    cells = adopt_standard_arms(cells, root)
    preflight_cells(cells, root, base)
    summary = SweepSummary()
    t0 = time.perf_counter()
    bar = tqdm(cells, desc="sweep", unit="cell", disable=not progress)
    for cell in bar:
        bar.set_postfix_str(cell.name)
        rec = run_cell(cell, root, base, opts, run=run, options=options)
        if rec["cached"]:
            summary.cached.append(cell.name)
        else:
            summary.ran.append(cell.name)
            aggregate(root, cells, meta)
        if rec["status"] != "ok":
            summary.failed.append(cell.name)
    summary.seconds = time.perf_counter() - t0
    return aggregate(root, cells, meta), summary


# --------------------------------------------------------------------------- Slurm jobs


def emit_jobs(cells: Sequence[Cell], out_dir: Path, machine: str, base: ExperimentConfig, *,
              gpus: int | None = None, nodes: int | None = None, account: str = "ACCOUNT",
              time_limit: str = "02:00:00", run_root: str = "runs/sweep-jobs",
              checkpoint_every: int | None = None) -> list[Path]:
    """One Slurm script per cell via :mod:`memorization.launch.jobs` (each running its resolved config, written
    next to it).

    Scripts go to ``out_dir/<size>-e<exposures>-.../`` (generate names a job by size, machine,
    k and GPUs only, so each cell gets its own directory and run root).  Also writes
    ``out_dir/jobs.json`` (cell -> script) and ``out_dir/submit_all.sh``.  ``base`` is the experiment every
    cell's job starts from (not resolved: the job resolves it; e.g. memorize options over
    :func:`memorization.launch.jobs.job_defaults`); the cell's size, exposures and Goldfish setting go over it as
    fields (:meth:`Cell.experiment`); ``checkpoint_every`` fixes the jobs' checkpoint interval (None: every 30
    minutes of predicted steps).  ``{size}`` in ``--init`` becomes each
    cell's size, and the job is planned with that checkpoint's shape and vocabulary (the preset's where this
    machine does not see it).  Every job's pre-flight checks run (:func:`memorization.launch.jobs.check_job`) before
    any script is written: a failed one refuses the whole grid (:class:`SweepError` naming each job and the
    fix), as the generator refuses one job.
    """
    from memorization.launch.jobs import check_job, job_spec, make_job

    jobs, failed = [], []
    for cell in cells:
        job = make_job(job_spec(machine, cell.experiment(base), gpus=gpus, nodes=nodes, time=time_limit,
                                account=account, out_dir=str(out_dir / cell.name), run_root=f"{run_root}/{cell.name}",
                                checkpoint_every=checkpoint_every))
        failed += [f"{cell.name}: {c.line()}" for c in check_job(job) if c.failed]
        jobs.append((cell, job))
    if failed:
        raise SweepError("these jobs would fail when they start; no script was written:\n  " + "\n  ".join(failed))
    paths, index = [], []
    for cell, job in jobs:
        path = job.write()
        paths.append(path)
        index.append({"cell": cell.name, **asdict(cell), "script": str(path)})
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out_dir / "jobs.json", index)
    lines = ["#!/bin/bash", "# submit every cell of the sweep (generated by memorization.launch.sweep.emit_jobs)",
             "set -e"]
    lines += [f"sbatch {shlex.quote(str(p))}" for p in paths]
    (out_dir / "submit_all.sh").write_text("\n".join(lines) + "\n")
    (out_dir / "submit_all.sh").chmod(0o755)
    return paths
