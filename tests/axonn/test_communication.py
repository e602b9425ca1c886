"""benchmarks/collectives.py: measured per-rank bytes of every Linear and embedding collective == analytic."""
from __future__ import annotations

import importlib.util
import re

import pytest

from tests.support import REPO, WORKERS

_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("autocast,grads", [(False, "fp32"), (True, "bf16")], ids=["fp32", "bf16-autocast-and-grads"])
def test_collective_volumes_match_analytic(autocast: bool, grads: str) -> None:
    """fp32; and bf16 autocast with bf16 gradient reduction: Linear weights gathered, activations
    reduced and every weight gradient reduce-scattered in 2 B per element."""
    args = ["--grid", "1,2,1,2", "--grad-reduce-dtype", grads] + (["--autocast"] if autocast else [])
    codes, out = launcher.launch(str(REPO / "benchmarks/collectives.py"), 4, args, timeout=140)
    assert codes == [0] * 4, out
    assert "linear and embedding layers MATCH the analytic volumes" in out, out
    assert "MISMATCH" not in out
    for needle in ("all_gather     depth", "reduce_scatter depth", "all_reduce     row",
                   "model.embed_tokens               all_gather     depth"):
        assert needle in out, out


class _TwoRankGrid:
    """A grid of two ranks on every axis, for calling the collectives' wrappers in one process."""

    def group(self, axes):
        return "group"

    def size(self, axes):
        return 2


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_reduce_scatter_falls_back_on_gloo_only(backend, monkeypatch):
    """A refused reduce-scatter becomes an all-reduce on gloo (the same on every rank); on NCCL the
    error is real (out of memory, a failed communicator) and is raised: one rank switching to an
    all-reduce alone would leave its peers waiting in a reduce-scatter."""
    import torch
    import torch.distributed as dist

    from axonn import communication as comm

    calls = []

    def refuse(out, t, group=None, async_op=False):
        raise RuntimeError("CUDA out of memory" if backend == "nccl" else "gloo does not support this")

    monkeypatch.setattr(comm, "_REDUCE_SCATTER_T", refuse)
    monkeypatch.setattr(comm, "_RS_SUPPORTED", {})
    monkeypatch.setattr(dist, "get_backend", lambda g: backend)
    monkeypatch.setattr(dist, "get_rank", lambda g=None: 1)
    monkeypatch.setattr(dist, "all_reduce", lambda t, group=None, async_op=False: calls.append(t.clone()))
    t = torch.arange(8.0)
    if backend == "nccl":
        with pytest.raises(RuntimeError, match="out of memory"):
            comm.reduce_scatter(t, "depth", grid=_TwoRankGrid())
        assert comm._RS_SUPPORTED == {} and not calls
    else:
        out = comm.reduce_scatter(t, "depth", grid=_TwoRankGrid())
        assert torch.equal(out, torch.arange(4.0, 8.0)) and len(calls) == 1  # all-reduced, rank 1's half
        assert comm._RS_SUPPORTED == {"gloo": False}


# ------------------------------------------------ sub-group timeouts

@pytest.mark.timeout(60)
def test_stuck_rank_on_a_subgroup_times_out(tmp_path) -> None:
    """``AXONN_TIMEOUT`` bounds collectives on the row/col/depth sub-groups too, not only the world's:
    ``dist.new_group`` does not inherit the world group's timeout (it takes torch's default, 30 min
    on gloo), so without it a rank stuck outside a tensor-parallel collective would hang its peers."""
    codes, out = launcher.launch("stuck_rank.py", 4, timeout=50,
                                 extra_env={"AXONN_TIMEOUT": "3", "AXONN_TEST_DONE": str(tmp_path / "done")})
    m = re.search(r"rank0: error after ([\d.]+)s", out)
    assert codes[0] == 7 and m, f"rank 0 should have raised, got rc={codes[0]}\n{out}"
    assert float(m.group(1)) < 15, f"the sub-group collective waited past AXONN_TIMEOUT=3s\n{out}"
