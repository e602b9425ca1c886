"""Tables and plots of a memorize run (``results.json`` -> ``results.md``, ``results.png``)."""
from __future__ import annotations

import io
import math
from pathlib import Path

from .atomic import atomic_write_bytes
from .extraction import metric_cells


def results_markdown(results: dict) -> str:
    s = results["settings"]
    arms = results["arms"]
    model = f"model `{s['init']}` (fine-tuned)" if s.get("init") else f"size `{s['size']}`"
    lines = [
        "# Memorization: standard vs Goldfish loss",
        "",
        f"{model}, {results['num_targets']} targets seen "
        f"{s['exposures']} time(s) each, {results['num_steps']} steps of {s['batch_size']} x {s['seq_len']} tokens, "
        f"seed {s['seed']}; extraction: prefix {s['prefix'] if s['prefix_mode'] == 'fixed' else 'all but suffix'}"
        f" -> greedy {s['suffix']} tokens.",
        "",
        "| arm | exact match (95% CI) | token match | Rouge-L | held-out loss | final train loss | dropped labels "
        "| train time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, a in arms.items():
        gf = a["goldfish"]
        label = name if gf["k"] == 0 else f"{name} (k={gf['k']}, h={gf['h']}, {gf['strategy']})"
        lines.append(
            f"| {label} | {metric_cells(a)} | {a['val_loss']:.4f} "
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
    lines += ["", "## By exposure count", "", "| arm | exposures | n | exact match (95% CI) | token match | Rouge-L |",
              "|---|---|---|---|---|---|"]
    for name, a in arms.items():
        for n, v in a["by_exposure"].items():
            lines.append(f"| {name} | {n} | {v['n']} | {metric_cells(v)} |")
    if results.get("skipped_targets"):
        lines.append(f"\n{len(results['skipped_targets'])} target(s) skipped as too short.")
    return "\n".join(lines) + "\n"


def plot_arms(results: dict, path: Path) -> None:
    """Left: extraction metrics per arm (exact match with its 95% interval). Right: training loss curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = results["arms"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
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
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
