"""benchmarks/collectives.py: measured per-rank bytes of every Linear collective == analytic volume."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("axonn_launcher", ROOT / "tests/axonn_workers/launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)


@pytest.mark.timeout(150)
def test_collective_volumes_match_analytic() -> None:
    codes, out = launcher.launch(str(ROOT / "benchmarks/collectives.py"), 4, ["--grid", "1,2,1,2"], timeout=140)
    assert codes == [0] * 4, out
    assert "linear layers MATCH the analytic volumes" in out, out
    assert "MISMATCH" not in out
    for needle in ("all_gather     depth", "reduce_scatter depth", "all_reduce     row"):
        assert needle in out, out
