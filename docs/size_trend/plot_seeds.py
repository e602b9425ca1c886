"""Draw size_trend_seeds.png from the committed seeds-<size>.json (recipes/replicate.py's seed tables): each size's
mean over seeds with its 95% t interval, by exposure count (python docs/size_trend/plot_seeds.py)."""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
SIZES = ("nano", "tiny", "mini", "small")

if __name__ == "__main__":
    from axonn.presets import get_preset

    sizes = [s for s in SIZES if (HERE / f"seeds-{s}.json").exists()]
    tables = {s: json.loads((HERE / f"seeds-{s}.json").read_text())["arms"]["standard"] for s in sizes}
    params = [get_preset(s).num_params() / 1e6 for s in sizes]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (metric, label) in zip(axes, (("exact_match", "exact match"), ("token_match", "token match"),
                                          ("rouge_l", "Rouge-L"))):
        for e in ("4", "16", "64"):
            cells = [tables[s][f"{metric}@e{e}"] for s in sizes]
            means = [c["mean"] for c in cells]
            err = [[c["mean"] - c["ci95"][0] for c in cells], [c["ci95"][1] - c["mean"] for c in cells]]
            ax.errorbar(params, means, yerr=err, marker="o", capsize=3, label=f"{e} exposures")
        ax.set_xscale("log")
        ax.set_xticks(params, [f"{s}\n{p:.1f}M" for s, p in zip(sizes, params)])
        n = tables[sizes[0]][f"{metric}@e64"]["n"]
        ax.set(xlabel="parameters", ylabel=label, ylim=(-0.05, 1.05), title=f"{label} vs model size ({n} seeds, 95% t)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "size_trend_seeds.png", dpi=100)
