"""Helpers shared by the test files: the repository's paths, the ``eval/*.py`` scripts imported as modules or run
as subprocesses, and a grid without a process group.

Test files import it as ``tests.support`` (``tests/`` and its subdirectories are packages).
"""
from __future__ import annotations

import contextlib
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


def fake_grid(data: int = 1, depth: int = 1, row: int = 1, col: int = 1):
    """Rank 0's :class:`axonn.grid.Grid` of the given axis sizes on CPU/gloo, without a process group: for
    the checks ``parallelize`` and the layers make before any communication."""
    import torch

    from axonn.grid import Grid, coords_of

    sizes = {"data": data, "depth": depth, "row": row, "col": col}
    return Grid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=data * depth * row * col,
                backend="gloo", device=torch.device("cpu"))


def hpc_code_report(*args: str, timeout: float = 300) -> dict:
    """``eval/hpc_code.py ARGS --json --no-progress`` in a process of its own (tests/forked.py) from the repository root: its JSON report
    (the run must exit 0)."""
    import json

    from tests.forked import run_python

    out = run_python([str(REPO / "eval" / "hpc_code.py"), *args, "--json", "--no-progress"], timeout=timeout,
                     cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@contextlib.contextmanager
def one_thread():
    """Run tiny-model work on one intra-op thread: on a shared 2-core machine, two spinning
    OpenMP threads are several times slower than one.  Restores the previous setting."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class MarkerPayload:
    """A pickled object whose unpickling creates the file ``marker`` (``open(marker, "w")``): what a hostile file
    would use to run code, made harmless.  A loader that refuses untrusted pickles must leave ``marker`` absent."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_malicious_torch_file(path, marker, wrap=None) -> None:
    """``torch.save`` of ``MarkerPayload(marker)`` (inside ``wrap(payload)`` when given, e.g. a dict) to ``path``."""
    import torch

    payload = MarkerPayload(marker)
    torch.save(payload if wrap is None else wrap(payload), path)


def rewrite_checksum(ckpt_dir, name: str) -> None:
    """Recompute the crc32s that ``ckpt_dir/checksums.json`` records for ``name`` (as an attacker who replaced the
    file would: a checksum proves integrity, not origin)."""
    import json
    import zlib

    from axonn.checkpoint import CHECKSUM_BLOCK, CHECKSUMS

    f = Path(ckpt_dir) / CHECKSUMS
    sums = json.loads(f.read_text())
    data = (Path(ckpt_dir) / name).read_bytes()
    crcs = [zlib.crc32(data[i:i + CHECKSUM_BLOCK]) for i in range(0, len(data), CHECKSUM_BLOCK)]
    sums["files"][name] = {"bytes": len(data), "crc32": [f"{c:08x}" for c in crcs]}
    f.write_text(json.dumps(sums))
