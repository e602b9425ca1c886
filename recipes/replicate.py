#!/usr/bin/env python
"""The memorize experiment replicated: over seeds (every headline number as mean ± 95% t interval), or over
complementary membership splits of the same targets (counterfactual memorization).

    python recipes/replicate.py --seeds 0,1,2 --out runs/seeds --arms all --beam 4 --hints --mia
    python recipes/replicate.py --counterfactual --out runs/cf --exposures 64,0 --mia

Every option besides --seeds, --counterfactual and --out is a memorize option (recipes/memorize.py --help), the
same for every run.  Each run goes to <out>/<run>; a finished run is kept and an interrupted one resumed, so the
same command continues a partial replicate.  Writes <out>/seeds.json and seeds.md, or counterfactual.json and
counterfactual.md (memorization.launch.replicates).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # runnable from a checkout without installation
    sys.path.insert(0, str(_REPO))

from axonn.cli import run_main  # noqa: E402
from memorization.launch import replicates  # noqa: E402
from memorization.data.atomic import atomic_write_text  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    from axonn.cli import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                formatter_class=HelpFormatter,
                                epilog="any other option is passed to every memorize run")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds: one run per seed, the table of means and "
                   "95%% t intervals over them (the mode unless --counterfactual)")
    p.add_argument("--counterfactual", action="store_true", help="one run per rotation of --exposures (which must "
                   "hold a 0 and a count > 0, e.g. 64,0): each target a member of some runs and not of others; "
                   "reports per-target counterfactual memorization of exact match, token match and loss (--mia)")
    p.add_argument("--out", required=True, help="directory of the runs and the aggregated report")
    return p


def main(argv: list[str] | None = None) -> dict:
    ns, extra = build_parser().parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        seeds = [] if ns.counterfactual else [int(s) for s in ns.seeds.split(",") if s.strip()]
    except ValueError:
        raise SystemExit(f"error: --seeds {ns.seeds!r}: give a comma list of integers, e.g. 0,1,2") from None
    from memorization.experiment.cli import config_from_argv, explicit_values

    try:  # the memorize options, once: every replicate is field overrides of this config
        runs = replicates.replicate_configs(config_from_argv(extra), seeds, ns.counterfactual,
                                            given=explicit_values(extra))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    root = Path(ns.out)
    outs = replicates.run_replicates(root, runs)
    if seeds:
        agg = replicates.aggregate_seeds([json.loads((o / "results.json").read_text()) for o in outs])
        report, name = {"seeds": seeds, "runs": [str(o) for o in outs], "arms": agg}, "seeds"
        md = replicates.seeds_markdown(agg, seeds)
    else:
        cf = replicates.counterfactual([replicates.run_record(o) for o in outs])
        splits = [cfg.data.exposures for _, cfg in runs]
        report, name = {"splits": splits, "runs": [str(o) for o in outs], "arms": cf}, "counterfactual"
        md = replicates.counterfactual_markdown(cf, splits)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(root / f"{name}.json", json.dumps(report, indent=1))
    atomic_write_text(root / f"{name}.md", md)
    print(md)
    return report


if __name__ == "__main__":
    run_main(main, "the same command continues: finished runs are kept, an interrupted one resumes")
