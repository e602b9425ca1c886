"""Helpers shared by the test files: where things are, and the ``eval/*.py`` scripts as importable modules.

Test files import it as ``tests.support`` (``tests/`` and its subdirectories are packages).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
WORKERS = TESTS / "axonn_workers"  # scripts run as ranks under torchrun/mpiexec (and their shared helpers)
SHIMS = TESTS / "slurm_shims"  # sbatch, srun, scontrol and module for rehearsing generated jobs


def load_eval_cli(name: str) -> ModuleType:
    """A fresh import of ``eval/<name>.py`` (a new module object each call: monkeypatches do not leak)."""
    spec = importlib.util.spec_from_file_location(f"_eval_cli_{name}", REPO / "eval" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
