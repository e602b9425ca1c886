"""The sweep report: ``results.json`` (see :mod:`memorization.launch.sweep`) -> markdown + self-contained HTML.

Figures (PNG files next to the report; the HTML embeds them as base64 so it is one file):

* ``extraction_vs_exposures.png`` -- exact match and Rouge-L against exposure count, one panel
  per model size, one line per arm (standard, Goldfish k/h);
* ``extraction_quality_vs_k.png`` -- exact match (left) and held-out loss / perplexity (right)
  against Goldfish k (k = 0 is the standard loss), one line per (size, exposures);
* ``mia.png`` -- MIA ROC curves of the standard and Goldfish arms of one cell per size (the
  exposure count with the largest standard-minus-Goldfish AUC gap), and the AUC of every arm
  against exposures, for the score of :func:`figure_score`; only when the sweep ran ``--mia``.
"""
from __future__ import annotations

import base64
import html
import math
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from memorization.data.atomic import atomic_write_text
from memorization.evaluation.extraction import exact_with_ci, fmt_metric

FIGURES = ("extraction_vs_exposures.png", "extraction_quality_vs_k.png", "mia.png")


def arm_label(row: dict) -> str:
    """``standard`` or ``goldfish k=4`` (``h=..`` added when the sweep has several h)."""
    if row["arm"] == "standard":
        return "standard"
    return f"goldfish k={row['k']}" + (f" h={row['h']}" if row.get("_multi_h") else "")


def _row_label(row: dict) -> str:
    return arm_label(row) + (" (unfinished cell)" if row.get("partial") else "")


def _mark_multi_h(rows: list[dict]) -> list[dict]:
    multi = len({r["h"] for r in rows if r["arm"] == "goldfish"}) > 1
    return [{**r, "_multi_h": multi} for r in rows]


# --------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_extraction_vs_exposures(rows: list[dict], path: Path) -> bool:
    """One panel per size: exact match (solid, its 95% interval shaded) and Rouge-L (dotted) vs exposures, per arm."""
    sizes = list(dict.fromkeys(r["size"] for r in rows))
    if not sizes:
        return False
    plt = _plt()
    # one color per arm in every panel (a size missing an arm must not shift the others' colors: the
    # legend is drawn once, from the handles of all panels)
    colors = {lab: f"C{j % 10}" for j, lab in enumerate(sorted({arm_label(r) for r in rows}))}
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False, sharey=True)
    legend: dict[str, object] = {}
    for ax, size in zip(axes[0], sizes):
        by_arm: dict[str, list[dict]] = defaultdict(list)
        for r in rows:
            if r["size"] == size:
                by_arm[arm_label(r)].append(r)
        for label, rs in sorted(by_arm.items()):
            rs = sorted(rs, key=lambda r: r["exposures"])
            xs = [r["exposures"] for r in rs]
            color = colors[label]
            ax.plot(xs, [r["exact_match"] for r in rs], "o-", color=color, label=f"{label}: exact match")
            if all(r.get("exact_match_ci95") for r in rs):  # band: the 95% Wilson interval of each rate
                ax.fill_between(xs, [r["exact_match_ci95"][0] for r in rs], [r["exact_match_ci95"][1] for r in rs],
                                color=color, alpha=0.15, linewidth=0)
            ax.plot(xs, [r["rouge_l"] for r in rs], "s:", color=color, alpha=0.7, label=f"{label}: Rouge-L")
        for handle, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, handle)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["exposures"] for r in rows if r["size"] == size}))
        ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
        ax.set_ylim(-0.03, 1.03)
        ax.set_xlabel("exposures per target")
        ax.set_title(f"size {size}")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("extraction (fraction of targets / score)")
    axes[0][-1].legend(list(legend.values()), list(legend), fontsize=7, loc="best")
    fig.suptitle("Extraction vs exposures")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_extraction_quality_vs_k(rows: list[dict], path: Path) -> bool:
    """Exact match and held-out quality (val loss; perplexity when measured) vs Goldfish k (0 = standard)."""
    if not rows:
        return False
    plt = _plt()
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["size"], r["exposures"], r["h"])].append(r)
    # the standard arm (h None) belongs to every h of its (size, exposures)
    lines: dict[str, list[dict]] = {}
    hs = sorted({r["h"] for r in rows if r["h"] is not None}) or [None]
    multi_h = len(hs) > 1
    for size, e in dict.fromkeys((r["size"], r["exposures"]) for r in rows):
        for h in hs:
            pts = groups.get((size, e, None), []) + (groups.get((size, e, h), []) if h is not None else [])
            if pts:
                lines[f"{size} e={e}" + (f" h={h}" if multi_h else "")] = sorted(pts, key=lambda r: r["k"])
    has_ppl = any(r.get("perplexity") for r in rows)
    fig, axes = plt.subplots(1, 3 if has_ppl else 2, figsize=(15 if has_ppl else 10, 4))
    for i, (label, pts) in enumerate(lines.items()):
        ks = [r["k"] for r in pts]
        axes[0].plot(ks, [r["exact_match"] for r in pts], "o-", color=f"C{i % 10}", label=label)
        axes[1].plot(ks, [r["val_loss"] for r in pts], "o-", color=f"C{i % 10}", label=label)
        if has_ppl:
            axes[2].plot(ks, [r.get("perplexity") or math.nan for r in pts], "o-", color=f"C{i % 10}", label=label)
    kticks = sorted({r["k"] for r in rows})
    titles = ["exact match", "held-out validation loss (nats/token)", "perplexity on held-out nonmembers"]
    for ax, title in zip(axes, titles):
        ax.set_xticks(kticks)
        ax.set_xlabel("Goldfish k (0 = standard loss)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(-0.03, 1.03)
    if has_ppl:
        axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("Extraction and quality vs Goldfish k")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def figure_score(rows: list[dict], scores: Sequence[str] = ("loss", "min_k", "zlib")) -> str:
    """The MIA score the figure shows: the one whose AUC separates the arms most (mean standard-minus-Goldfish
    AUC over the (size, exposures) pairs that have both arms); ``loss`` on ties or without Goldfish arms.
    With several Goldfish settings in a pair, its highest AUC counts (the least protection, as in
    :func:`roc_exposure`), whatever the order of the rows.

    A strong attack saturates (AUC 1.0 for both arms when the targets were seen many times), and then
    only a weaker score still shows the difference; the report's table lists every score.
    """
    best, best_gap = scores[0], 0.0
    for sc in scores:
        auc: dict[tuple, dict[str, float]] = defaultdict(dict)
        for r in rows:
            if r.get(f"mia_auc_{sc}") is not None:
                pair = auc[(r["size"], r["exposures"])]
                pair[r["arm"]] = max(pair.get(r["arm"], -1.0), r[f"mia_auc_{sc}"])
        gaps = [a["standard"] - a["goldfish"] for a in auc.values() if "standard" in a and "goldfish" in a]
        gap = sum(gaps) / len(gaps) if gaps else 0.0
        if gap > best_gap + 1e-9:
            best, best_gap = sc, gap
    return best


def plot_mia(rows: list[dict], cells: Sequence[dict], path: Path, score: str | None = None) -> bool:
    """ROC (``score``) of each arm of one cell per size (see :func:`roc_exposure`), and AUC vs exposures."""
    score = score or figure_score(rows)
    with_mia = [r for r in rows if r.get(f"mia_auc_{score}") is not None]
    if not with_mia:
        return False
    plt = _plt()
    rocs = _rocs(cells, score)
    sizes = list(dict.fromkeys(r["size"] for r in with_mia))
    fig, axes = plt.subplots(1, len(sizes) + 1, figsize=(4.6 * (len(sizes) + 1), 4.2), squeeze=False)
    axes = axes[0]
    for ax, size in zip(axes, sizes):
        e_show = roc_exposure(with_mia, size, score)
        shown = [r for r in with_mia if r["size"] == size and r["exposures"] == e_show]
        colors = {lab: f"C{j}" for j, lab in enumerate(sorted({arm_label(r) for r in rows}))}  # as in the others
        for i, r in enumerate(sorted(shown, key=lambda r: (r["k"], r["h"] or 0))):
            roc = rocs.get((r["size"], r["exposures"], r["arm"], r["k"], r["h"]))
            if roc:
                ax.plot(roc["fpr"], roc["tpr"], color=colors[arm_label(r)], lw=max(0.8, 2.6 - 0.8 * i),
                        clip_on=False, zorder=3 - i,
                        label=f"{arm_label(r)} (AUC {r[f'mia_auc_{score}']:.3f})")
        ax.plot([0, 1], [0, 1], "k--", lw=0.8, label="chance")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title(f"MIA ROC ({score}): {size}, {e_show} exposures")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    ax = axes[-1]
    series: dict[str, list[dict]] = defaultdict(list)
    for r in with_mia:
        series[f"{r['size']} {arm_label(r)}"].append(r)
    for i, (label, rs) in enumerate(sorted(series.items())):
        rs = sorted(rs, key=lambda r: r["exposures"])
        style = "o-" if "standard" in label else "s--"
        ax.plot([r["exposures"] for r in rs], [r[f"mia_auc_{score}"] for r in rs], style, color=f"C{i % 10}",
                label=label)
    ax.axhline(0.5, color="k", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r["exposures"] for r in with_mia}))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("exposures per target")
    ax.set_ylabel(f"AUC ({score} score)")
    ax.set_title("MIA AUC: targets vs nonmembers")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def roc_exposure(rows: list[dict], size: str, score: str = "loss") -> int:
    """The exposure count whose ROC the figure shows for ``size``: the largest standard-minus-Goldfish
    AUC gap (the fewest exposures on ties, where the attack is least saturated)."""
    by_e: dict[int, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["size"] == size and r.get(f"mia_auc_{score}") is not None:
            by_e[r["exposures"]][r["arm"]] = max(by_e[r["exposures"]].get(r["arm"], -1.0), r[f"mia_auc_{score}"])
    gaps = {e: a.get("standard", 0.0) - a.get("goldfish", a.get("standard", 0.0)) for e, a in by_e.items()}
    return max(sorted(gaps), key=lambda e: gaps[e])


def _rocs(cells: Sequence[dict], score: str) -> dict[tuple, dict]:
    out = {}
    for rec in cells:
        if rec.get("status") != "ok":
            continue
        c = rec["cell"]
        for arm, a in rec["arms"].items():
            roc = ((a["eval"].get("mia") or {}).get("roc") or {}).get(score)
            if roc:
                k = c["goldfish_k"] if arm == "goldfish" else 0
                h = c["goldfish_h"] if arm == "goldfish" else None
                out[(c["size"], c["exposures"], arm, k, h)] = roc
    return out


# --------------------------------------------------------------------------- markdown


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(r) + " |" for r in rows]


def _extra_columns(rows: list[dict]) -> list[str]:
    keys = []
    for r in rows:
        for k in r:
            if (k.endswith("_acc") or k.endswith("_acc_norm") or k.startswith("hpc_")) and k not in keys:
                keys.append(k)
    return keys


def _trend_lines(rows: list[dict]) -> list[str]:
    """Plain-language checks of the expected trends, computed from the numbers."""
    out = []
    for size in dict.fromkeys(r["size"] for r in rows):
        for label in dict.fromkeys(arm_label(r) for r in rows if r["size"] == size):
            rs = sorted((r for r in rows if r["size"] == size and arm_label(r) == label), key=lambda r: r["exposures"])
            if len(rs) > 1:
                seq = ", ".join(f"{r['exposures']}: {r['exact_match']:.2f}" for r in rs)
                out.append(f"- `{size}` {label}: exact match by exposures {seq}")
    return out


def sweep_markdown(results: dict, figures: Sequence[str]) -> str:
    """The markdown report: command, grid, main table, MIA table, failures, figures."""
    rows = _mark_multi_h(results.get("rows", []))
    cells = results.get("cells", [])
    g = results.get("grid", {})
    lines = ["# Memorization sweep: standard vs Goldfish loss", ""]
    if results.get("command"):
        lines += ["Command:", "", "```bash", results["command"], "```", ""]
    ok = sum(c.get("status") == "ok" for c in cells)
    options = results.get("memorize_options", [])
    options = "differ by cell (see cells/*/cell.json)" if options is None else f"`{' '.join(options) or '-'}`"
    lines.append(f"Grid: sizes {g.get('sizes')}, exposures {g.get('exposures')}, Goldfish k {g.get('goldfish_k')}, "
                 f"h {g.get('goldfish_h')}; memorize options {options}. {ok}/{len(cells)} cells finished.")
    s = next((c.get("settings") for c in cells if c.get("settings")), None)
    if s and results.get("memorize_options") is not None:
        lines.append(f"Each cell: {s['num_targets']} targets (all seen the cell's exposure count), "
                     f"{s['num_nonmembers']} nonmembers, seq {s['seq_len']}, batch {s['batch_size']}, "
                     f"lr {s['lr']}, seed {s['seed']}; extraction: prefix {s['prefix']} -> greedy {s['suffix']} tokens.")
    if results.get("timing"):
        t = results["timing"]
        lines.append(f"Wall time of the cells: {t.get('cells_seconds', 0) / 60:.1f} min "
                     f"({t.get('host', 'this machine')}).")
    lines += ["", "## Extraction and quality", ""]
    extra = _extra_columns(rows)
    header = ["size", "exposures", "arm", "steps", "exact match", "token match", "Rouge-L", "val loss", "perplexity",
              "dropped labels", "train s", *extra]
    table = []
    for r in rows:
        table.append([r["size"], str(r["exposures"]), _row_label(r), str(r["steps"]), exact_with_ci(r),
                      fmt_metric(r["token_match"]), fmt_metric(r["rouge_l"]), fmt_metric(r["val_loss"], 4), fmt_metric(r["perplexity"], 2),
                      fmt_metric(r["goldfish_drop_frac"]), f"{r['train_seconds']:.0f}", *[fmt_metric(r.get(k)) for k in extra]])
    lines += _table(header, table)
    lines += ["", "exact match: fraction of targets whose greedy suffix equals the true one (95% Wilson "
              "interval); val loss: memorize's "
              "validation loss on packed held-out rows; perplexity: sliding-window perplexity of the held-out "
              "nonmember documents, each from its start with BOS prepended (`memorization.evaluation.downstream`)."]
    trends = _trend_lines(rows)
    if trends:
        lines += ["", *trends]
    if any(r.get("mia_auc_loss") is not None for r in rows):
        lines += ["", "## Membership inference (targets vs held-out nonmembers)", "",
                  "AUC 0.5 = chance; higher = the attack tells the trained targets from unseen documents.", ""]
        mrows = [[r["size"], str(r["exposures"]), arm_label(r), *[fmt_metric(r.get(f"mia_auc_{s}")) for s in
                  ("loss", "zlib", "min_k", "min_k_pp")], fmt_metric(r.get("mia_tpr_loss"))]
                 for r in rows if r.get("mia_auc_loss") is not None]
        lines += _table(["size", "exposures", "arm", "AUC loss", "AUC zlib", "AUC min-k", "AUC min-k++",
                         "TPR@1%FPR loss"], mrows)
        sc = figure_score(rows)
        lines += ["", f"`mia.png` shows the `{sc}` score: of loss, min-k and zlib, the one whose AUC differs most "
                  "between the standard and Goldfish arms (a saturated attack, AUC 1.0 for both arms, "
                  "cannot show the difference)."]
    errs = [(r["cell"], k, v) for r in rows for k, v in r.get("eval_errors", {}).items()]
    failed = [c for c in cells if c.get("status") == "error"]
    pending = [c for c in cells if c.get("status") in ("pending", "partial")]
    if failed or pending or errs:
        lines += ["", "## Failures and missing cells", ""]
        for c in failed:
            lines.append(f"- cell `{c['name']}` failed: {_one_line(c.get('error', '?'))}")
        for c in pending:
            done = ", ".join(c.get("arms", {}))
            lines.append(f"- cell `{c['name']}`: not finished" + (f" (trained and extracted so far: {done}; "
                         "its evaluations run when the cell finishes)" if done else " (not run yet)"))
        for cell, what, msg in errs:
            lines.append(f"- cell `{cell}`: evaluation {what} failed: {_one_line(msg)}")
    if figures:
        lines += ["", "## Figures", ""]
        for f in figures:
            lines += [f"![{f}]({f})", ""]
    return "\n".join(lines).rstrip() + "\n"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# --------------------------------------------------------------------------- html


def markdown_to_html(md: str, images: dict[str, bytes], title: str) -> str:
    """The report's markdown (CommonMark + tables, rendered by ``markdown-it-py``) -> one HTML page, each
    image that ``images`` holds (by its link target) inlined as a base64 PNG in a captioned figure;
    images it does not hold are dropped (the HTML stays one self-contained file)."""
    from markdown_it import MarkdownIt

    parser = MarkdownIt("commonmark", {"html": False}).enable("table")

    def image(renderer, tokens, idx, options, env) -> str:
        token = tokens[idx]
        data = images.get(token.attrGet("src") or "")
        if data is None:
            return ""
        alt = html.escape(token.content)
        b64 = base64.b64encode(data).decode("ascii")
        return f'<figure><img alt="{alt}" src="data:image/png;base64,{b64}"><figcaption>{alt}</figcaption></figure>'

    parser.add_render_rule("image", image)
    # a figure is a block: not inside the paragraph markdown puts an image line in
    body = parser.render(md).replace("<p><figure>", "<figure>").replace("</figure></p>", "</figure>")
    body = body.replace("<p></p>\n", "")  # the paragraph of an image not in ``images``
    style = ("body{font-family:system-ui,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}th,td{border:1px solid #ccc;"
             "padding:3px 8px;text-align:right}th{background:#f3f3f3}td:nth-child(-n+3){text-align:left}"
             "pre{background:#f6f8fa;padding:0.8em;overflow-x:auto}img{max-width:100%}"
             "figure{margin:1em 0}figcaption{color:#666;font-size:0.85em}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + body + "</body></html>\n")


def write_report(results: dict, out_dir: Path) -> dict[str, Path]:
    """Write ``report.md``, ``report.html`` and the PNGs into ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = _mark_multi_h(results.get("rows", []))
    cells = results.get("cells", [])
    made = []
    for name, fn in (("extraction_vs_exposures.png", lambda p: plot_extraction_vs_exposures(rows, p)),
                     ("extraction_quality_vs_k.png", lambda p: plot_extraction_quality_vs_k(rows, p)),
                     ("mia.png", lambda p: plot_mia(rows, cells, p))):
        if fn(out_dir / name):
            made.append(name)
        elif (out_dir / name).exists():
            (out_dir / name).unlink()  # stale figure of an earlier report
    md = sweep_markdown(results, made)
    paths = {"markdown": out_dir / "report.md", "html": out_dir / "report.html"}
    atomic_write_text(paths["markdown"], md)
    images = {n: (out_dir / n).read_bytes() for n in made}
    atomic_write_text(paths["html"], markdown_to_html(md, images, "Memorization sweep"))
    paths.update({n: out_dir / n for n in made})
    return paths


