"""``python -m memorization.experiment [flags]``: memorize's command line (the flags of
:func:`memorization.experiment.cli.build_parser`, ``--config FILE.yaml`` under them) running
:func:`memorization.experiment.run_experiment`; what the generated Slurm jobs run on every rank."""
from __future__ import annotations

import sys

from axonn.cli import run_main
from memorization.experiment import run_experiment
from memorization.experiment.cli import config_from_argv


def main(argv: list[str] | None = None) -> dict | None:
    """Run the experiment of the command line; returns its results (None with --plan)."""
    return run_experiment(config_from_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    run_main(main, "the last checkpoint of each arm is kept; the same command with --resume continues from it")
