"""Redraw size_trend.png from the four committed results-<size>.json (python docs/size_trend/plot.py)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
SIZES = ("nano", "tiny", "mini", "small")

if __name__ == "__main__":
    from axonn.presets import get_preset

    params = {s: get_preset(s).num_params() / 1e6 for s in SIZES}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (metric, label) in zip(axes, (("exact_match", "exact match"), ("token_match", "token match"),
                                          ("rouge_l", "Rouge-L"))):
        for e in ("4", "16", "64"):
            ys = [json.loads((HERE / f"results-{s}.json").read_text())["arms"]["standard"]["by_exposure"][e][metric]
                  for s in SIZES]
            ax.plot(list(params.values()), ys, marker="o", label=f"{e} exposures")
        ax.set_xscale("log")
        ax.set_xticks(list(params.values()), [f"{s}\n{p:.1f}M" for s, p in params.items()])
        ax.set(xlabel="parameters", ylabel=label, ylim=(-0.05, 1.05), title=f"{label} vs model size")
        ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "size_trend.png", dpi=100)
