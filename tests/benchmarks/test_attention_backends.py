"""benchmarks/attention_backends.py: one timing line per SDPA backend, on the preset's attention shape."""
import re
import runpy
import sys

from tests.support import REPO


def test_attention_backends_times_each_backend_on_the_presets_gqa_shape(monkeypatch, capsys):
    """The GPU runbook's attention benchmark on CPU: the math and flash-for-CPU backends each print a line;
    K and V keep the preset's KV heads (GQA) unless --repeat-kv."""
    for extra, kv in (([], 2), (["--repeat-kv", "--layout", "bthd"], 4)):
        monkeypatch.setattr(sys, "argv", ["attention_backends.py", "--size", "tiny", "--batch", "1", "--seq", "32",
                                          "--backends", "math,flash", "--steps", "1", *extra])
        runpy.run_path(str(REPO / "benchmarks" / "attention_backends.py"),
                       run_name="__main__")
        out = capsys.readouterr().out
        assert f"4 heads, {kv} kv heads" in out
        assert re.search(r"math\s*:\s*\d+\.\d\d ms", out) and re.search(r"flash\s*:\s*\d+\.\d\d ms", out)
