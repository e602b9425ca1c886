"""The HPC-code report as a reader sees it: markdown tables and a plot, from :func:`.runner.summarize`'s JSON.

``markdown`` gives the headline (pass@k, build@k, speedup@k, efficiency@k, speedup_max@k, efficiency_max@k over
all problems and per execution model), one row per problem type and the samples by outcome; ``plot`` draws
speedup_n@k and efficiency_n@k against the worker count n per execution model, and pass@k per problem type.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

HEADLINE = ("pass", "build")
SPEED = ("speedup_n@k", "efficiency_n@k")


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3f}"


def markdown(report: dict, ks: Sequence[int]) -> str:
    """Markdown tables of ``report`` (the JSON of ``eval/hpc_code.py``) for the k values ``ks``."""
    top = str(report.get("speedup_n", 1))
    groups = [("all", report), *[(m, agg) for m, agg in report.get("by_model", {}).items()]]
    lines = [f"## HPC code: {report['problems']} problems", ""]
    head = ["metric", *[g for g, _ in groups]]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for k in ks:
        for m in HEADLINE:
            lines.append(f"| {m}@{k} | " + " | ".join(_fmt(agg.get(f"{m}@{k}")) for _, agg in groups) + " |")
        for metric, label in (("speedup_n@k", f"speedup_{top}@{k}"), ("efficiency_n@k", f"efficiency_{top}@{k}")):
            lines.append(f"| {label} | " + " | ".join(
                _fmt((agg.get(metric) or {}).get(top, {}).get(str(k))) for _, agg in groups) + " |")
        for metric in ("speedup_max@k", "efficiency_max@k"):
            lines.append(f"| {metric.replace('@k', f'@{k}')} | " + " | ".join(
                _fmt((agg.get(metric) or {}).get(str(k))) for _, agg in groups) + " |")
    by_type = report.get("by_type", {})
    if by_type:
        k = ks[0]
        lines += ["", f"### By problem type (k={k}, n={top})", "",
                  f"| type | problems | pass@{k} | build@{k} | speedup_{top}@{k} | efficiency_{top}@{k} |",
                  "|---|---|---|---|---|---|"]
        for t, agg in by_type.items():
            sp = (agg.get("speedup_n@k") or {}).get(top, {}).get(str(k))
            ef = (agg.get("efficiency_n@k") or {}).get(top, {}).get(str(k))
            lines.append(f"| {t} | {agg['problems']} | {_fmt(agg.get(f'pass@{k}'))} | "
                         f"{_fmt(agg.get(f'build@{k}'))} | {_fmt(sp)} | {_fmt(ef)} |")
    outcomes = report.get("outcomes", {})
    if outcomes:
        api = ("uses_api", "passed_with_api", "passed")  # shown whenever some model has them, zeros too
        cols = [c for c in next(iter(outcomes.values())) if c != "samples" and any(
            t.get(c) is not None if c in api else t.get(c) for t in outcomes.values())]
        lines += ["", "### Samples by outcome (hpc_codegen.outcomes: a failure's cause, and whether the code calls its "
                  "execution model's parallel API)", "",
                  "| execution model | samples | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
        for m, t in outcomes.items():
            lines.append(f"| {m} | {t['samples']} | " + " | ".join(
                "–" if t.get(c) is None else str(t[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str | Path, k: int = 1) -> Path:
    """speedup_n@k and efficiency_n@k against n per parallel execution model, and pass@k per type, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, metric, label in ((axes[0], "speedup_n@k", f"speedup_n@{k}"), (axes[1], "efficiency_n@k",
                                                                           f"efficiency_n@{k}")):
        for model, agg in report.get("by_model", {}).items():
            curve = agg.get(metric) or {}
            pts = sorted((int(n), v[str(k)]) for n, v in curve.items() if v.get(str(k)) is not None)
            if model != "serial" and pts:
                ax.plot(*zip(*pts), marker="o", label=model)
                ax.set_xticks([n for n, _ in pts])
        ax.set_xlabel("workers n (threads / ranks)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # a serial-only report has no curve to label
            ax.legend()
    types = list(report.get("by_type", {}))
    axes[2].barh(types, [report["by_type"][t].get(f"pass@{k}") or 0.0 for t in types])
    axes[2].set_xlabel(f"pass@{k}")
    axes[2].set_xlim(0, 1)
    fig.suptitle(f"HPC code: {report['problems']} problems")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
