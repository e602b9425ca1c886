"""Replicated memorize runs: the same experiment over seeds (error bars), and over complementary membership
splits of the same targets (counterfactual memorization).

**Seeds.**  Run ``r`` is the experiment with ``--seed s_r`` (mixture, placement, initial weights and sampling all
follow the seed).  For each arm and each headline number ``x`` (:func:`headline_metrics`: extraction rates,
adaptive attacks, canary exposure and MIA AUC, overall and by exposure count) the report gives the mean over the
R runs and its Student-t 95% interval ``mean +- t_{R-1} s / sqrt(R)`` (:func:`memorization.evaluation.stats.mean_ci`):
the spread from the seed, which one run's binomial interval does not show.

**Counterfactual memorization** (Zhang et al. 2021).  ``--exposures`` is a list ``e_0, ..., e_{K-1}`` dealt over the
targets (target ``j`` gets ``e_{j mod K}``); run ``r`` deals its rotation ``e_r, ..., e_{r+K-1}``, so every target
is seen ``e_i`` times in exactly one run for each ``i`` (same targets, seed and background otherwise).  With
``M(f, x)`` a per-document performance of model ``f`` (exact match, token match, or minus the mean token loss) and
``S_r`` the targets run ``r`` trained on (exposures >= 1):

    mem(x) = mean_{r : x in S_r} M(f_r, x) - mean_{r : x not in S_r} M(f_r, x)

defined for the targets both member and non-member of some run (e.g. ``--exposures 64,0``: K = 2 runs, each
target a member of one).  The report gives its distribution over the targets per arm (mean, quantiles, the share
above 0.5 for the rates).
"""
from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from memorization.evaluation.stats import mean_ci

if TYPE_CHECKING:
    from memorization.experiment.config import ExperimentConfig

#: the per-document performances of counterfactual memorization: name -> (extraction record, loss) -> value
PERFORMANCES: dict[str, Callable[[dict, float | None], float | None]] = {
    "exact_match": lambda rec, loss: float(rec["exact_match"]),
    "token_match": lambda rec, loss: float(rec["token_match"]),
    "neg_loss": lambda rec, loss: None if loss is None else -loss,
}


def rotations(exposures: str) -> list[str]:
    """The K rotations of an ``--exposures`` list: ``"64,0"`` -> ``["64,0", "0,64"]``."""
    vals = [v.strip() for v in str(exposures).split(",")]
    if len(vals) < 2 or not all(v.isdigit() for v in vals) or not any(int(v) == 0 for v in vals) \
            or not any(int(v) > 0 for v in vals):
        raise ValueError(f"--exposures {exposures!r}: counterfactual runs need a comma list of counts with at least "
                         "one 0 and one > 0 (e.g. 64,0), so every target is a member of one run and not of another")
    return [",".join(vals[r:] + vals[:r]) for r in range(len(vals))]


def headline_metrics(arm: dict, reference: dict | None = None) -> dict[str, float]:
    """The numbers of one arm's result (``results.json`` ``arms[name]``) that the seed table aggregates, by key:
    ``exact_match``, ``beam_match``, ``hints_mean``, ... overall; ``exact_match@e16`` by exposure count;
    ``canary_exposure@c4`` the mean canary exposure of the canaries seen 4 times; ``mia_auc_loss`` /
    ``mia_tpr_loss`` and ``@e16`` by exposure count; ``val_loss``; with ``--track-every``, the tracked targets'
    loss at the last tracked step on the labels the Goldfish mask keeps and drops (``kept_loss``,
    ``dropped_loss``).  Given the same run's ``reference`` arm (the standard arm), also the paired
    ``val_loss_gap = val_loss / val_loss_reference - 1``: its interval over seeds is the quality cost's, narrower
    than the two arms' intervals because the seed moves both arms' losses together."""
    keys = ("exact_match", "token_match", "rouge_l", "prefix_match", "sampled_any", "beam_match", "beam_top1",
            "hints_mean", "hints_le1", "longest_run_mean", "val_loss")
    out = {k: float(arm[k]) for k in keys if arm.get(k) is not None}
    for e, v in arm.get("by_exposure", {}).items():
        out.update({f"{k}@e{e}": float(v[k]) for k in keys if v.get(k) is not None})
    for c, v in arm.get("canaries", {}).get("by_exposure", {}).items():
        out[f"canary_exposure@c{c}"] = float(v["mean"])
    for score, v in arm.get("mia", {}).get("scores", {}).items():
        for stat, key in (("auc", "auc"), ("tpr", "tpr_at_fpr")):
            if v.get(key) is not None:
                out[f"mia_{stat}_{score}"] = float(v[key])
            for e, w in v.get("by_exposure", {}).items():
                if w.get(key) is not None:
                    out[f"mia_{stat}_{score}@e{e}"] = float(w[key])
    last = (arm.get("tracking") or [{}])[-1]
    out.update({k: float(last[k]) for k in ("kept_loss", "dropped_loss") if last.get(k) is not None})
    if reference is not None and reference is not arm and arm.get("val_loss") is not None \
            and reference.get("val_loss"):
        out["val_loss_gap"] = float(arm["val_loss"]) / float(reference["val_loss"]) - 1.0
    return out


def aggregate_seeds(results: Sequence[dict], reference: str = "standard") -> dict[str, dict[str, dict]]:
    """``{arm: {metric: {"n", "mean", "ci95", "values"}}}`` over the runs' ``results.json`` (one per seed); a metric
    missing from some run is aggregated over the runs that have it.  The paired metrics are taken against the
    same run's ``reference`` arm where it ran; the standard-vs-Goldfish McNemar p of each run is listed under
    ``mcnemar_p`` of the ``goldfish`` arm (its values; a mean of p-values means nothing, the table shows the
    largest)."""
    table: dict[str, dict[str, list[float]]] = {}
    for res in results:
        ref = res["arms"].get(reference)
        for arm, a in res["arms"].items():
            for k, v in headline_metrics(a, ref).items():
                table.setdefault(arm, {}).setdefault(k, []).append(v)
        p = (res.get("paired_exact_match") or {}).get("p_value")
        if p is not None and "goldfish" in res["arms"]:
            table["goldfish"].setdefault("mcnemar_p", []).append(float(p))
    return {arm: {k: {"n": len(v), "mean": sum(v) / len(v), "ci95": None if k == "mcnemar_p" else mean_ci(v),
                      "values": v} for k, v in metrics.items()} for arm, metrics in table.items()}


def _cell(v: dict | None, metric: str = "", digits: int = 3) -> str:
    if v is None:
        return "–"
    if metric == "mcnemar_p":  # per seed, the largest shown
        return f"≤ {max(v['values']):.2g}"
    ci = v["ci95"]
    return f"{v['mean']:.{digits}f}" + (f" ± {(ci[1] - ci[0]) / 2:.{digits}f}" if ci else "")


def seeds_markdown(agg: dict, seeds: Sequence[int]) -> str:
    """The seed table: one row per metric, one column per arm, ``mean ± half-width of the 95% t interval``."""
    arms = list(agg)
    metrics = sorted({k for a in agg.values() for k in a}, key=_metric_order)
    paired = "; `val_loss_gap` is each run's held-out loss relative to its standard arm's, `mcnemar_p` the " \
             "largest per-seed exact McNemar p of standard vs Goldfish exact match" if "val_loss_gap" in metrics else ""
    lines = [f"# Over seeds {', '.join(map(str, seeds))}", "",
             f"Mean ± half-width of the 95% Student-t interval over {len(seeds)} runs (one per seed){paired}.", "",
             "| metric | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for m in metrics:
        lines.append(f"| {m} | " + " | ".join(_cell(agg[a].get(m), m) for a in arms) + " |")
    return "\n".join(lines) + "\n"


def _metric_order(key: str) -> tuple:
    base, _, group = key.partition("@")
    num = int(group[1:]) if group[1:].isdigit() else -1
    return (base, group[:1], num)


def counterfactual(runs: Sequence[dict]) -> dict[str, dict]:
    """Counterfactual memorization (module docstring) of each target, per arm and performance.

    ``runs``: one per membership split, each ``{"arms": {arm: {"documents": extraction records (id, exposures,
    exact_match, token_match), "loss": {id: loss} or {}}}}``.  Returns ``{arm: {"by_target": {id: {performance:
    mem}}, "summary": {performance: distribution}}}``."""
    out: dict[str, dict] = {}
    arms = [a for a in runs[0]["arms"] if all(a in r["arms"] for r in runs)]
    for arm in arms:
        seen: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
        for run in runs:
            a = run["arms"][arm]
            for rec in a["documents"]:
                member = rec["exposures"] is None or int(rec["exposures"]) >= 1
                for name, perf in PERFORMANCES.items():
                    v = perf(rec, a.get("loss", {}).get(str(rec["id"])))
                    if v is not None:
                        pair = seen.setdefault(str(rec["id"]), {}).setdefault(name, ([], []))
                        pair[0 if member else 1].append(v)
        by_target = {tid: {name: sum(i) / len(i) - sum(o) / len(o) for name, (i, o) in perfs.items() if i and o}
                     for tid, perfs in seen.items()}
        summary = {}
        for name in PERFORMANCES:
            xs = sorted(m[name] for m in by_target.values() if name in m)
            if xs:
                summary[name] = distribution(xs)
        out[arm] = {"by_target": by_target, "summary": summary}
    return out


def distribution(xs: Sequence[float]) -> dict[str, Any]:
    """``n``, mean with its 95% t interval, quartiles (linear interpolation), min, max and the share above 0.5."""
    xs = sorted(xs)
    n = len(xs)

    def q(p: float) -> float:
        pos = p * (n - 1)
        lo = math.floor(pos)
        return xs[lo] + (xs[min(lo + 1, n - 1)] - xs[lo]) * (pos - lo)

    return {"n": n, "mean": sum(xs) / n, "ci95": mean_ci(list(xs)), "q25": q(0.25), "median": q(0.5),
            "q75": q(0.75), "min": xs[0], "max": xs[-1], "share_above_half": sum(x > 0.5 for x in xs) / n}


def counterfactual_markdown(cf: dict, splits: Sequence[str]) -> str:
    lines = ["# Counterfactual memorization", "",
             f"{len(splits)} runs on the same targets, exposures dealt as {' / '.join(splits)}: mem(x) = mean "
             "performance of the runs that trained on x - mean of those that did not (Zhang et al. 2021).", "",
             "| arm | performance | targets | mean (95% CI) | q25 | median | q75 | max | share > 0.5 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for arm, v in cf.items():
        for name, d in v["summary"].items():
            ci = f" ({d['ci95'][0]:.3f}–{d['ci95'][1]:.3f})" if d["ci95"] else ""
            lines.append(f"| {arm} | {name} | {d['n']} | {d['mean']:.3f}{ci} | {d['q25']:.3f} | {d['median']:.3f} "
                         f"| {d['q75']:.3f} | {d['max']:.3f} | {d['share_above_half']:.3f} |")
    return "\n".join(lines) + "\n"


def run_record(out: Path) -> dict:
    """What :func:`counterfactual` needs of the finished run in ``out``: each arm's extraction records and, when
    the run scored MIA, every document's loss."""
    results = json.loads((out / "results.json").read_text())
    arms = {}
    for arm, a in results["arms"].items():
        docs = json.loads((out / arm / "extraction.json").read_text())["documents"]
        arms[arm] = {"documents": docs, "loss": a.get("mia", {}).get("loss_by_document", {})}
    return {"arms": arms}


def replicate_configs(base: ExperimentConfig, seeds: Sequence[int] = (), counterfactual: bool = False,
                      given: Collection[str] = ()) -> list[tuple[str, ExperimentConfig]]:
    """``(name, config)`` of each replicated run, field overrides of ``base``: ``seed-<s>`` with ``training.seed``
    s for every seed, or (with ``counterfactual``) ``split-<r>`` with the r-th rotation of ``base``'s exposures.
    ``given`` names the settings the command line set (flat names): it must not set what the replicates vary
    (``seed`` with seeds, ``out``): a ``ValueError`` says so."""
    if "out" in given:
        raise ValueError("give --out to the replicate command itself, not as a memorize option: each run goes to "
                         "<out>/<run>")
    if counterfactual == bool(seeds):
        raise ValueError("give either --seeds or --counterfactual")
    if seeds:
        if "seed" in given:
            raise ValueError("--seed is what --seeds varies: drop it from the memorize options")
        return [(f"seed-{s}", replace(base, training=replace(base.training, seed=s))) for s in seeds]
    splits = rotations(base.data.exposures)
    return [(f"split-{r}", replace(base, data=replace(base.data, exposures=e))) for r, e in enumerate(splits)]


def run_replicates(root: Path, runs: Sequence[tuple[str, ExperimentConfig]]) -> list[Path]:
    """Run every replicate into ``root/<name>`` (memorize's experiment; a run whose ``results.json`` exists is
    kept, an interrupted one continues with ``resume``); returns the run directories."""
    from memorization.experiment import run_experiment

    outs = []
    for name, cfg in runs:
        out = Path(root) / name
        if not (out / "results.json").exists():
            resume = (out / "run_config.json").exists()
            run_experiment(replace(cfg, output=replace(cfg.output, out=str(out), resume=resume)))
        outs.append(out)
    return outs
