"""benchmarks/checkpoint_stall.py: how long training waits for a blocking and a background save."""
from __future__ import annotations


import pytest

from tests.forked import run_python
from tests.support import REPO


@pytest.mark.timeout(200)
def test_checkpoint_stall_benchmark_prints_both_stalls(tmp_path) -> None:
    """benchmarks/checkpoint_stall.py end to end on the tiny preset: both kinds of save run, their
    checkpoints are removed, and the ratio is printed (its value is machine-dependent: not asserted)."""
    import re

    res = run_python(["benchmarks/checkpoint_stall.py", "--size", "tiny", "--seq", "32",
                          "--steps", "1", "--repeat", "1", "--dir", str(tmp_path / "ck")],
                         cwd=REPO, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"blocking save: training waits\s+\d+\.\d+ s", res.stdout), res.stdout
    assert re.search(r"checkpoint stall, blocking / background:\s+\d+\.\d+x", res.stdout), res.stdout
    assert list((tmp_path / "ck").iterdir()) == []
