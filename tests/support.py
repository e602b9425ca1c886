"""The ``eval/*.py`` command-line scripts imported as modules, so tests call their ``main(argv)`` in-process."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_eval_cli(name: str) -> ModuleType:
    """A fresh import of ``eval/<name>.py`` (a new module object each call: monkeypatches do not leak)."""
    spec = importlib.util.spec_from_file_location(f"_eval_cli_{name}", REPO / "eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
