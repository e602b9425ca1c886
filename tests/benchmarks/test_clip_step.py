"""benchmarks/clip_step.py: gradient clipping as its own pass against clipping inside fused AdamW."""
import re
import runpy
import sys

from tests.support import REPO


def test_clip_step_runs_both_arms_and_prints_the_ratio(monkeypatch, capsys):
    """The benchmark the GPU runbook runs: both arms on the tiny preset's shapes, and its ratio line."""
    monkeypatch.setattr(sys, "argv", ["clip_step.py", "--size", "tiny", "--layers", "1", "--steps", "1",
                                      "--rounds", "1"])
    runpy.run_path(str(REPO / "benchmarks" / "clip_step.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "clip pass + fused AdamW" in out and "clip inside fused AdamW" in out
    assert re.search(r"speedup clip inside / clip pass = \d+\.\d\dx", out)
