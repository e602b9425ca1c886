#!/usr/bin/env python
"""Does a language model memorize documents it saw n times, and does Goldfish loss stop it?

Builds one mixture (targets seen exactly ``--exposures`` times inside a background stream),
trains the same initial model on it twice -- standard loss and Goldfish loss -- then runs
extraction (prefix -> greedy suffix) on both, and writes ``results.json``, ``results.md``
and ``results.png`` to ``--out``, with the run's resolved ``config.yaml`` (``--config`` runs it again).

    python recipes/memorize.py                       # tiny model, offline corpus, CPU, minutes
    python recipes/memorize.py --family qwen3 --size tiny   # the tiny shape as a Qwen3 model (any family with a plan)
    python recipes/memorize.py --init /path/to/hf-pythia --steps 100  # fine-tune a Pythia, OLMo 2, Qwen, Mistral, Llama
    python recipes/memorize.py --size 8b --grid 8,2,2,2 --init /path/to/hf-llama   # on GPUs
    python recipes/memorize.py --config runs/memorize/config.yaml --out runs/again --seed 1
    torchrun --nproc_per_node 8 recipes/memorize.py --size tiny --grid 1,2,2,2
    python recipes/memorize.py --size 405b --gpus 4096 --machine frontier --plan

SIGUSR1 (sent by the Slurm scripts of recipes/jobs before the time limit) or SIGTERM (Slurm at the
limit or on scancel, or a plain kill) makes every rank checkpoint after the same step and exit with
status 75 (EX_TEMPFAIL); the same command with --resume continues the loss curve exactly.  The experiment itself is
memorization.experiment.run_experiment; this is its command line.
"""
from __future__ import annotations

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # runnable from a checkout without installation
    sys.path.insert(0, str(_REPO))

from axonn.cli import run_main  # noqa: E402
from memorization.experiment import ExperimentConfig, run_experiment  # noqa: E402
from memorization.experiment.cli import build_parser, config_from_argv  # noqa: E402

__all__ = ["build_parser", "main", "parse_args"]


def parse_args(argv: list[str] | None = None) -> ExperimentConfig:
    """The resolved experiment config of a command line (``--config`` file, then the flags given)."""
    return config_from_argv(sys.argv[1:] if argv is None else argv)


def main(argv: list[str] | None = None) -> dict | None:
    """Run the experiment of the command line; returns its results (None with --plan)."""
    return run_experiment(parse_args(argv))


if __name__ == "__main__":
    run_main(main, "the last checkpoint of each arm is kept; the same command with --resume continues from it")
