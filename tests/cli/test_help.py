"""Every command of the project has one ``--help`` style, and its help explains every flag."""
from __future__ import annotations

import argparse
import runpy
import sys

import pytest

from axonn.cli import HelpFormatter
from tests.support import REPO, load_eval_cli


SCRIPT_DIRS = ("recipes", "recipes/jobs", "eval", "benchmarks", "data", "data/pydocs")
SCRIPTS = sorted(str(p.relative_to(REPO)) for d in SCRIPT_DIRS
                 for p in (REPO / d).glob("*.py") if p.name not in ("__init__.py", "common.py"))
MODULES = [["axonn.planner"], ["axonn.planner", "calibrate"], ["axonn.convert"]]


def _help_of(monkeypatch, capsys, run, argv: list[str]) -> tuple[argparse.ArgumentParser, str]:
    """Run a command with ``--help`` in this process; return the parser that printed it and the text."""
    seen: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.print_help

    def record(self, file=None):
        seen.append(self)
        original(self, file)

    monkeypatch.setattr(argparse.ArgumentParser, "print_help", record)
    monkeypatch.setattr(sys, "argv", argv + ["--help"])
    with pytest.raises(SystemExit) as e:
        run()
    assert e.value.code in (0, None)
    assert len(seen) == 1
    return seen[0], capsys.readouterr().out


def _check(parser: argparse.ArgumentParser, text: str, name: str) -> None:
    assert parser.formatter_class is HelpFormatter, f"{name}: use axonn.cli.HelpFormatter"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue  # -h, and internal flags hidden on purpose (a worker's entry point)
        flag = action.option_strings[0] if action.option_strings else action.dest
        assert action.help and action.help.strip(), f"{name}: {flag} has no help"
        assert flag in text
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_explains_every_flag(script, monkeypatch, capsys):
    path = REPO / script
    parser, text = _help_of(monkeypatch, capsys, lambda: runpy.run_path(str(path), run_name="__main__"), [script])
    _check(parser, text, script)


@pytest.mark.parametrize("argv", MODULES, ids=" ".join)
def test_every_module_cli_explains_every_flag(argv, monkeypatch, capsys):
    parser, text = _help_of(monkeypatch, capsys, lambda: runpy.run_module(argv[0], run_name="__main__", alter_sys=True),
                            argv)
    _check(parser, text, " ".join(argv))


def test_defaults_are_shown_only_where_they_say_something():
    p = argparse.ArgumentParser(formatter_class=HelpFormatter)
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    p.add_argument("--zero", type=int, default=0, help="a zero is still shown")
    p.add_argument("--out", default=None, help="directory")
    p.add_argument("--fast", action="store_true", help="go fast")
    p.add_argument("--seq", type=int, default=128, help="tokens per row (default 128; 2048 with --plan)")
    text = " ".join(p.format_help().split())
    assert "optimizer steps (default: 1000)" in text
    assert "a zero is still shown (default: 0)" in text
    assert "directory" in text and "None" not in text
    assert "go fast" in text and "False" not in text
    assert text.count("default 128") == 1 and "(default: 128)" not in text


# ------------------------------------------------------------ the usage examples in the eval CLIs' docstrings

@pytest.mark.parametrize("name", ["mia", "downstream"])
def test_cli_help_examples_are_runnable_command_lines(name):
    """The usage examples of ``--help`` lost their line continuations (a ``\\`` at the end of a line
    in a non-raw docstring joins the lines), so the help printed one line with runs of spaces in it,
    and they named ``runs/goldfish_k4/final``, a path memorize.py never writes (``<arm>/model``)."""
    doc = load_eval_cli(name).__doc__
    example = [line for line in doc.splitlines() if line.startswith(f"    python eval/{name}.py")]
    assert example and example[0].endswith(" \\"), example
    assert "goldfish_k4/final" not in doc
    assert "runs/memorize/goldfish/model" in doc and "runs/memorize/manifest.json" in doc
