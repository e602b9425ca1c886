"""Completions from any model or tool, as a JSON-lines file: what ``eval/hpc_code.py --completions`` scores.

One JSON object per line::

    {"problem": "reduce_array_sum_omp", "completion": "    double s = 0; ... }\\n"}
    {"problem": "HumanEval/0", "benchmark": "humaneval", "completion": "    for i in ..."}

``completion`` is the text the model wrote after the problem's prompt (it is cut at the end of the function as a
sampled completion is); ``benchmark`` is ``hpc`` (default) or ``humaneval``.  The lines of one problem are its N
samples, in order.  Blank lines are skipped.  Anything else is refused with its line number, before any work.
"""
from __future__ import annotations

import json
from pathlib import Path

BENCHMARKS = ("hpc", "humaneval")


class CompletionsError(ValueError):
    """A completions file that cannot be scored; the message names the file and the line."""


def load_completions(path: str | Path) -> dict[str, dict[str, list[str]]]:
    """``{benchmark: {problem: [completion, ...]}}`` of the file at ``path`` (see the module docstring)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CompletionsError(f"--completions {path}: cannot read it ({exc})") from None
    out: dict[str, dict[str, list[str]]] = {}
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"--completions {path}, line {no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CompletionsError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise CompletionsError(f"{where}: expected an object with \"problem\" and \"completion\", "
                                   f"got {type(row).__name__}")
        missing = [k for k in ("problem", "completion") if k not in row]
        if missing:
            raise CompletionsError(f"{where}: missing {', '.join(missing)}")
        bench = row.get("benchmark", "hpc")
        if bench not in BENCHMARKS:
            raise CompletionsError(f"{where}: benchmark {bench!r}: choose {' or '.join(BENCHMARKS)}")
        if not isinstance(row["problem"], str) or not isinstance(row["completion"], str):
            raise CompletionsError(f"{where}: \"problem\" and \"completion\" must be strings")
        out.setdefault(bench, {}).setdefault(row["problem"], []).append(row["completion"])
    if not out:
        raise CompletionsError(f"--completions {path}: no completions in it")
    return out


def check_problems(completions: dict[str, list[str]], known: list[str], bench: str, path: str | Path) -> None:
    """Refuse completions for problems the selected suite does not have (a typo would silently drop them)."""
    unknown = sorted(set(completions) - set(known))
    if unknown:
        raise CompletionsError(f"--completions {path}: {len(unknown)} {bench} problem(s) not in the selected suite: "
                               f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}")
