"""One ``--help`` style for every command of the project (the recipes, ``eval/``, the planner,
the converter and the benchmarks)."""
from __future__ import annotations

import argparse
import sys
from typing import Callable


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's and epilog's line breaks, and ends each flag's help with
    ``(default: X)`` where that says something: not where the help already names its default,
    not on a switch that is off unless given, not for a default of ``None``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "default" in text.lower() or d is None or d is False or d is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


INTERRUPTED = 130  # a shell's status for a command stopped by Ctrl-C (128 + SIGINT)


def run_main(main: Callable[[], object], resume_hint: str) -> None:
    """Run a command's ``main``; Ctrl-C ends it with one line saying how to continue (``resume_hint``)
    and exit status 130, instead of a traceback from every rank."""
    try:
        main()
    except KeyboardInterrupt:
        print(f"\ninterrupted: {resume_hint}", file=sys.stderr)
        sys.exit(INTERRUPTED)
