"""Tables and plots of a memorize run (``results.json`` -> ``results.md``, ``results.png``)."""
from __future__ import annotations

import io
import math
from pathlib import Path

from memorization.data.atomic import atomic_write_bytes
from .extraction import exact_with_ci, fmt_metric, metric_cells


def results_markdown(results: dict) -> str:
    s = results["settings"]
    arms = results["arms"]
    family = f" as `{s['family']}`" if s.get("family") else ""
    model = f"model `{s['init']}` (fine-tuned)" if s.get("init") else f"size `{s['size']}`{family}"
    lines = [
        "# Memorization: standard vs Goldfish loss",
        "",
        f"{model}, {results['num_targets']} targets seen "
        f"{s['exposures']} time(s) each, {results['num_steps']} steps of {s['batch_size']} x {s['seq_len']} tokens, "
        f"seed {s['seed']}; extraction: prefix {s['prefix'] if s['prefix_mode'] == 'fixed' else 'all but suffix'}"
        f" -> greedy {s['suffix']} tokens." + (
            f" Every target copy in training was a near-duplicate: {s['perturb_fraction']:g} of its tokens "
            f"perturbed ({s.get('perturb_kind', 'substitute')}), extraction scores the original."
            if s.get("perturb_fraction") else ""),
        "",
        "| arm | exact match (95% CI) | token match | Rouge-L | held-out loss | final train loss | dropped labels "
        "| train time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, a in arms.items():
        lines.append(
            f"| {arm_label(name, a['goldfish'])} | {metric_cells(a)} | {a['val_loss']:.4f} "
            f"| {a['final_train_loss']:.4f} | {a['goldfish_drop_frac']:.3f} | {a['train_seconds']:.0f} s |"
        )
    if "standard" in arms and "goldfish" in arms:
        st, gf = arms["standard"], arms["goldfish"]
        ratio = (f"**{gf['exact_match'] / st['exact_match']:.3f}**" if st["exact_match"] else
                 "none (the standard arm extracted no target: more exposures, steps or a larger model)")
        lines += ["", f"Goldfish / standard exact-match ratio: {ratio}; held-out loss ratio: "
                      f"**{gf['val_loss'] / st['val_loss']:.3f}**."]
        if "paired_exact_match" in results:
            t = results["paired_exact_match"]
            lines.append(f"Paired on the same {t['n']} targets: {t['only_a']} extracted by the standard arm alone, "
                         f"{t['only_b']} by the Goldfish arm alone; exact McNemar test p = {t['p_value']:.2g}.")
        if "equal-tokens" in arms:
            eq = arms["equal-tokens"]
            lines.append(f"Held-out loss gap Goldfish - standard = {gf['val_loss'] - st['val_loss']:+.4f}: "
                         f"{eq['val_loss'] - st['val_loss']:+.4f} from training on fewer labels (equal-tokens - "
                         f"standard) and {gf['val_loss'] - eq['val_loss']:+.4f} from which labels are dropped "
                         "(Goldfish - equal-tokens: the same count, a mask that repeats with the text).")
    lines += ["", "## By exposure count", "", "| arm | exposures | n | exact match (95% CI) | token match | Rouge-L |",
              "|---|---|---|---|---|---|"]
    for name, a in arms.items():
        for n, v in a["by_exposure"].items():
            lines.append(f"| {name} | {n} | {v['n']} | {metric_cells(v)} |")
    lines += recency_lines(results)
    lines += sampled_lines(arms)
    lines += adaptive_lines(arms, s.get("beam"))
    lines += canary_lines(arms)
    lines += mia_lines(arms)
    lines += length_lines(arms)
    lines += tracking_lines(arms)
    if results.get("skipped_targets"):
        lines.append(f"\n{len(results['skipped_targets'])} target(s) skipped as too short.")
    return "\n".join(lines) + "\n"


def arm_label(name: str, gf: dict) -> str:
    """An arm's row label: its name and, when it drops labels, its Goldfish settings."""
    if gf["k"] == 0:
        return name
    start = "" if gf.get("doc_start", "keep") == "keep" else f", doc start {gf['doc_start']}"
    kind = ", positions random per row" if gf.get("randomize") else ""
    return f"{name} (k={gf['k']}, h={gf['h']}, {gf['strategy']}{start}{kind})"


def recency_lines(results: dict) -> list[str]:
    """The table of extraction by steps since the last exposure (:mod:`memorization.evaluation.recency`)."""
    arms = {n: a for n, a in results["arms"].items() if any(b["n"] for b in a.get("by_recency", []))}
    if not arms:
        return []
    placement = results["settings"].get("placement", "random")
    lines = ["", f"## By steps since the last exposure (placement: {placement})", "",
             "| arm | steps since last exposure | exposures | n | exact match (95% CI) | token match | Rouge-L |",
             "|---|---|---|---|---|---|---|"]
    for name, a in arms.items():
        for b in a["by_recency"]:
            if b["n"]:
                lo, hi = b["steps"]
                exposures = ",".join(map(str, b["exposures"]))
                lines.append(f"| {name} | {lo}–{hi - 1} | {exposures} | {b['n']} | {metric_cells(b)} |")
    return lines


def sampled_lines(arms: dict) -> list[str]:
    """The table of sampled extraction (``--samples``), when the run sampled."""
    rows = [(n, a) for n, a in arms.items() if a.get("sampled_any") is not None]
    if not rows:
        return []
    lines = ["", "## Sampled extraction", "", "| arm | extracted by any sample | per-sample rate |", "|---|---|---|"]
    lines += [f"| {n} | {fmt_metric(a['sampled_any'])} | {fmt_metric(a['sampled_rate'])} |" for n, a in rows]
    return lines


def adaptive_lines(arms: dict, width: int | None = None) -> list[str]:
    """The table of the adaptive attacks (``--beam``, ``--hints``) beside greedy, by exposure count."""
    beam = any("beam_match" in v for a in arms.values() for v in a["by_exposure"].values())
    hints = any("hints_mean" in v for a in arms.values() for v in a["by_exposure"].values())
    if not (beam or hints):
        return []
    head = ["arm", "exposures", "n", "greedy exact (95% CI)"]
    if any("sampled_any" in v for a in arms.values() for v in a["by_exposure"].values()):
        head.append("any sample")
    if beam:
        head += ["suffix in beams (95% CI)", "best beam = suffix"]
    if hints:
        head += ["hints mean", "hints median", "hints <= 1", "longest verbatim run"]
    lines = ["", "## Adaptive extraction", "",
             "Beam search: a target counts when its suffix is one of the beams; hints: greedy decoding given the "
             "true token at each error (hints per suffix, and the longest run of tokens it reproduces between "
             "hints)." + (f" Beam width {width}." if width else ""), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, a in arms.items():
        for n, v in [*a["by_exposure"].items(), ("all but 0", a)]:
            cells = [name, n, str(v["n"]), exact_with_ci(v)]
            if "any sample" in head:
                cells.append(fmt_metric(v.get("sampled_any")))
            if beam:
                ci = v.get("beam_match_ci95")
                cells += [f"{fmt_metric(v.get('beam_match'))}" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else ""),
                          fmt_metric(v.get("beam_top1"))]
            if hints:
                cells += [fmt_metric(v.get("hints_mean"), 2), fmt_metric(v.get("hints_median"), 1),
                          fmt_metric(v.get("hints_le1")), fmt_metric(v.get("longest_run_mean"), 1)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def canary_lines(arms: dict) -> list[str]:
    """The table of canary exposure (``--canaries``), by exposure count."""
    rows = [(n, a["canaries"]) for n, a in arms.items() if a.get("canaries")]
    if not rows:
        return []
    first = rows[0][1]["canaries"][0]
    lines = ["", "## Canary exposure", "",
             f"Exposure = log2|R| - log2 rank of the secret among all {2 ** first['max_exposure']:.0f} candidates "
             f"(at most {first['max_exposure']:.1f} bits; ~1 bit for an unseen secret); {first['method']}; "
             "mean (95% t interval) over the canaries.", "",
             "| arm | exposures | canaries | exposure mean (95% CI) | median | max |", "|---|---|---|---|---|---|"]
    for name, c in rows:
        for n, v in c["by_exposure"].items():
            ci = f" ({v['ci95'][0]:.2f}–{v['ci95'][1]:.2f})" if v["ci95"] else ""
            lines.append(f"| {name} | {n} | {v['n']} | {v['mean']:.2f}{ci} | {v['median']:.2f} | {v['max']:.2f} |")
    return lines


def mia_lines(arms: dict) -> list[str]:
    """The table of membership inference (``--mia``): AUC and TPR at 1% FPR of every score, by exposure count."""
    rows = [(n, a["mia"]) for n, a in arms.items() if a.get("mia")]
    if not rows:
        return []
    m = rows[0][1]
    lines = ["", "## Membership inference", "",
             f"Members: targets seen >= 1 time; nonmembers: {m['nonmember_source']} ({m['n_nonmembers']}). "
             f"AUC / TPR at {100 * m['fpr_target']:g}% FPR (FPR resolution {fmt_metric(m['fpr_resolution'])}).", ""]
    scores = list(m["scores"])
    exposures = list(next(iter(m["scores"].values())).get("by_exposure", {}))
    head = ["arm", "exposures", *scores]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows:
        for e in [*exposures, "all but 0"]:
            cells = [name, e]
            for s in scores:
                v = r["scores"][s] if e == "all but 0" else r["scores"][s]["by_exposure"].get(e)
                cells.append("–" if v is None else f"{fmt_metric(v.get('auc'))} / {fmt_metric(v.get('tpr_at_fpr'))}")
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def length_lines(arms: dict) -> list[str]:
    """The table of the ``--extract-lengths`` pairs."""
    rows = [(n, b) for n, a in arms.items() for b in a.get("by_length", [])]
    if not rows:
        return []
    lines = ["", "## Other prefix and suffix lengths", "",
             "| arm | prefix | suffix | n | exact match (95% CI) | token match | Rouge-L | prefix match "
             "| edit similarity | skipped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for n, b in rows:
        lines.append(f"| {n} | {b['prefix']} | {b['suffix']} | {b['n']} | {metric_cells(b)} "
                     f"| {fmt_metric(b.get('prefix_match'))} | {fmt_metric(b.get('edit_similarity'))} "
                     f"| {b['skipped']} |")
    return lines


def tracking_lines(arms: dict) -> list[str]:
    """The table of memorization during training (``--track-every``)."""
    rows = [(n, r) for n, a in arms.items() for r in a.get("tracking", [])]
    if not rows:
        return []
    lines = ["", "## During training", "", "Tracked targets' extraction and loss (all labels; the labels the Goldfish "
             "mask keeps and drops).", "",
             "| arm | step | exact match | token match | target loss | kept-label loss | dropped-label loss |",
             "|---|---|---|---|---|---|---|"]
    for n, r in rows:
        lines.append(f"| {n} | {r['step']} | {fmt_metric(r['exact_match'])} | {fmt_metric(r['token_match'])} "
                     f"| {fmt_metric(r['target_loss'])} | {fmt_metric(r['kept_loss'])} "
                     f"| {fmt_metric(r['dropped_loss'])} |")
    return lines


def plot_arms(results: dict, path: Path) -> None:
    """Left: extraction metrics per arm (exact match with its 95% interval). Middle: training loss curves.
    Right (with ``--track-every``): the tracked targets' exact match and dropped-label loss during training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = results["arms"]
    tracked = {n: a["tracking"] for n, a in arms.items() if a.get("tracking")}
    fig, axes = plt.subplots(1, 3 if tracked else 2, figsize=(16.5 if tracked else 11, 4))
    ax1, ax2 = axes[:2]
    metrics = ["exact_match", "token_match", "rouge_l"]
    width = 0.8 / max(1, len(arms))
    for i, (name, a) in enumerate(arms.items()):
        xs = [m + i * width for m in range(len(metrics))]
        ci = a.get("exact_match_ci95")  # whiskers: the exact-match rate's 95% Wilson interval
        em = a["exact_match"]
        err = None if ci is None or em is None else [[em - ci[0], 0, 0], [ci[1] - em, 0, 0]]
        heights = [math.nan if a[m] is None else a[m] for m in metrics]  # None: no trained target, no bar
        bars = ax1.bar(xs, heights, width, yerr=err, capsize=3, label=name)
        ax1.bar_label(bars, fmt="%.2f", fontsize=8)
        ax2.plot(range(1, len(a["loss_curve"]) + 1), a["loss_curve"], label=f"{name} (held-out {a['val_loss']:.3f})")
    ax1.set_xticks([m + width * (len(arms) - 1) / 2 for m in range(len(metrics))], ["exact match", "token match",
                                                                                     "Rouge-L"])
    ax1.set_ylim(0, 1.1)
    ax1.set_title(f"Extraction of {results['num_targets']} targets ({results['settings']['exposures']} exposures)")
    ax1.legend()
    ax2.set_xlabel("step")
    ax2.set_ylabel("training loss (kept labels)")
    ax2.set_title("Training loss")
    ax2.legend()
    if tracked:
        ax3 = axes[2]
        ax4 = ax3.twinx()
        for name, recs in tracked.items():
            line, = ax3.plot([r["step"] for r in recs], [r["exact_match"] for r in recs], marker="o", label=name)
            ax4.plot([r["step"] for r in recs], [math.nan if r["dropped_loss"] is None else r["dropped_loss"]
                                                 for r in recs], ls="--", color=line.get_color())
        ax3.set_xlabel("step")
        ax3.set_ylabel("exact match of the tracked targets (solid)")
        ax4.set_ylabel("loss on the labels Goldfish drops (dashed)")
        ax3.set_ylim(-0.05, 1.05)
        ax3.set_title("Memorization during training")
        ax3.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
