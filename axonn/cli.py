"""One ``--help`` style for every command of the project (the recipes, ``eval/``, the planner,
the converter and the benchmarks)."""
from __future__ import annotations

import argparse


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
