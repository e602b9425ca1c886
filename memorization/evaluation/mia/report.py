"""What :func:`memorization.evaluation.mia.run_mia` reports: AUC and TPR at a low FPR per score, overall and by exposure
count (:func:`mia_report`), as a markdown table (:func:`report_markdown`) and as ROC plots (:func:`plot_roc`)."""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .roc import finite_scores, roc_auc, roc_curve, score_summary
from .scoring import SCORE_DESCRIPTIONS, SCORE_DIRECTIONS

log = logging.getLogger(__name__)


def mia_report(
    member_scores: dict[str, Any],
    nonmember_scores: dict[str, Any],
    *,
    member_exposures: Sequence[int] | None = None,
    fpr_target: float = 0.01,
    directions: dict[str, float] | None = None,
) -> dict[str, Any]:
    """AUC and TPR at ``fpr_target`` FPR for every score, overall and by exposure count.

    Args:
        member_scores / nonmember_scores: ``{score name: per-document values}`` as returned by
            :func:`mia_scores` (raw, un-oriented).  Only names in ``directions`` are reported.
        member_exposures: exposure count of each member document, for the breakdown.  Entries
            with 0 exposures (controls that were never trained on) are excluded from the
            overall numbers and reported as their own group, where AUC ~ 0.5 is expected.
        fpr_target: FPR at which to read the TPR (default 1%).
        directions: orientation per score (default :data:`SCORE_DIRECTIONS`).

    Returns:
        ``{"fpr_target", "fpr_resolution", "scores": {name: {"auc", "tpr_at_fpr",
        "n_members", "n_nonmembers", "by_exposure": {str(e): {...}}}}}``.  NaN scores are
        dropped.
    """
    if not 0.0 < fpr_target < 1.0:
        raise ValueError(f"fpr_target must be a fraction in (0, 1): 0.01 is 1%, got {fpr_target}")
    directions = directions or SCORE_DIRECTIONS
    names = [n for n in directions if n in member_scores and n in nonmember_scores]
    exp = None if member_exposures is None else np.asarray(member_exposures, dtype=np.int64)
    some = np.asarray(next(iter(member_scores.values())))
    if exp is not None and exp.shape[0] != some.shape[0]:
        raise ValueError("member_exposures must have one entry per member document")
    trained = np.ones(some.shape[0], dtype=bool) if exp is None else exp >= 1
    n_non = int(finite_scores(np.asarray(nonmember_scores[names[0]])).size) if names else 0
    report: dict[str, Any] = {
        "fpr_target": fpr_target,
        "fpr_resolution": (1.0 / n_non) if n_non else None,
        "scores": {},
    }
    if n_non and 1.0 / n_non > fpr_target:
        log.warning(
            "only %d nonmembers: FPR resolution 1/%d > %g, TPR@%g%%FPR is interpolated "
            "from the first ROC segment", n_non, n_non, fpr_target, 100 * fpr_target)
    for name in names:
        sign = directions[name]
        pos = sign * np.asarray(member_scores[name], dtype=np.float64)
        neg = sign * np.asarray(nonmember_scores[name], dtype=np.float64)
        entry = score_summary(pos[trained], neg, fpr_target)
        if exp is not None:
            entry["by_exposure"] = {
                str(int(e)): score_summary(pos[exp == e], neg, fpr_target)
                for e in np.unique(exp)
            }
        report["scores"][name] = entry
    return report


# --------------------------------------------------------------------------- outputs


def report_markdown(report: dict[str, Any], title: str = "Membership inference") -> str:
    """Markdown table: one row per score, overall AUC/TPR and AUC per exposure count."""
    from ..extraction import fmt_metric

    pct = f"{100 * report['fpr_target']:g}%"
    scores = report["scores"]
    exposures = sorted({e for s in scores.values() for e in s.get("by_exposure", {})}, key=int)
    head = ["score", "AUC", f"TPR@{pct}FPR"] + [f"AUC e={e}" for e in exposures]
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for name, s in scores.items():
        row = [f"`{name}`", fmt_metric(s["auc"]), fmt_metric(s["tpr_at_fpr"])]
        row += [fmt_metric(s.get("by_exposure", {}).get(e, {}).get("auc")) for e in exposures]
        lines.append("| " + " | ".join(row) + " |")
    any_s = next(iter(scores.values()), None)
    if any_s:
        lines.append("")
        lines.append(f"{any_s['n_members']} members (exposures >= 1) vs "
                     f"{any_s['n_nonmembers']} nonmembers; AUC 0.5 = chance.")
        if report.get("nonmember_description"):
            lines.append(f"Nonmembers: {report['nonmember_description']}.")
        if exposures:
            counts = ", ".join(f"e={e}: {any_s['by_exposure'][e]['n_members']}"
                               for e in exposures)
            lines.append(f"Documents per exposure count: {counts}.")
        res = report.get("fpr_resolution")
        if res and res > report["fpr_target"]:
            lines.append(f"Note: FPR resolution is {res:.3g} (> {pct}); "
                         "TPR at low FPR is interpolated and coarse.")
    for w in report.get("warnings") or []:
        lines += ["", f"**Warning:** {w}"]
    lines.append("")
    for name in scores:
        lines.append(f"- `{name}`: {SCORE_DESCRIPTIONS.get(name, '')}")
    return "\n".join(lines) + "\n"


def plot_roc(
    member_scores: dict[str, Any],
    nonmember_scores: dict[str, Any],
    path: str | os.PathLike,
    *,
    directions: dict[str, float] | None = None,
) -> None:
    """ROC curves of every score (linear and log-log axes side by side) into a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    directions = directions or SCORE_DIRECTIONS
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for name, sign in directions.items():
        if name not in member_scores or name not in nonmember_scores:
            continue
        pos = sign * np.asarray(member_scores[name], dtype=np.float64)
        neg = sign * np.asarray(nonmember_scores[name], dtype=np.float64)
        if finite_scores(pos).size == 0 or finite_scores(neg).size == 0:
            continue
        fpr, tpr, _ = roc_curve(pos, neg)
        auc = roc_auc(pos, neg)
        for ax in axes:
            ax.plot(fpr, tpr, label=f"{name} (AUC {auc:.3f})", drawstyle="default")
    for ax, scale in zip(axes, ("linear", "log")):
        ax.plot([1e-4, 1], [1e-4, 1], "k--", lw=0.8, label="chance")
        ax.set_xscale(scale)
        ax.set_yscale(scale)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        if scale == "log":
            ax.set_xlim(1e-3, 1)
            ax.set_ylim(1e-3, 1)
            ax.set_title("ROC (log-log)")
        else:
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_title("ROC")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

