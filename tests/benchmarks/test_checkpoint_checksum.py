"""benchmarks/checkpoint_checksum.py: what checksums cost a save and a load."""
from __future__ import annotations


import pytest

from tests.forked import run_python
from tests.support import REPO


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_checkpoint_checksum_benchmark_prints_both_kinds(tmp_path) -> None:
    """benchmarks/checkpoint_checksum.py end to end on the tiny preset: saves and loads with and without
    checksums, removes its checkpoints and prints the three ratios (machine-dependent: not asserted)."""
    import re

    res = run_python(["benchmarks/checkpoint_checksum.py", "--size", "tiny", "--repeat", "1",
                          "--hash-mb", "64", "--dir", str(tmp_path / "ck")],
                         cwd=REPO, timeout=110)
    assert res.returncode == 0, res.stdout + res.stderr
    for row in ("save", "load, cold page cache", "load, warm page cache"):
        assert re.search(rf"{row} \(s\)\s+\d+\.\d+\s+\d+\.\d+\s+\d+\.\d+x", res.stdout), res.stdout
    assert "crc32 over the hash pool" in res.stdout and list((tmp_path / "ck").iterdir()) == []
