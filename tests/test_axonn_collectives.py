"""benchmarks/collectives.py: measured per-rank bytes of every Linear and embedding collective == analytic."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("axonn_launcher", ROOT / "tests/axonn_workers/launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("autocast,grads", [(False, "fp32"), (True, "bf16")], ids=["fp32", "bf16-autocast-and-grads"])
def test_collective_volumes_match_analytic(autocast: bool, grads: str) -> None:
    """fp32; and bf16 autocast with bf16 gradient reduction: Linear weights gathered, activations
    reduced and every weight gradient reduce-scattered in 2 B per element."""
    args = ["--grid", "1,2,1,2", "--grad-reduce-dtype", grads] + (["--autocast"] if autocast else [])
    codes, out = launcher.launch(str(ROOT / "benchmarks/collectives.py"), 4, args, timeout=140)
    assert codes == [0] * 4, out
    assert "linear and embedding layers MATCH the analytic volumes" in out, out
    assert "MISMATCH" not in out
    for needle in ("all_gather     depth", "reduce_scatter depth", "all_reduce     row",
                   "model.embed_tokens               all_gather     depth"):
        assert needle in out, out
