"""The planner's memory model against the trainer's traced allocations, and the memory-saving code it models."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from memorization.memory_trace import PeakMemory
from tests.support import REPO


def test_peak_memory_counts_live_storages_once():
    a = torch.zeros(1000)  # 4000 B, existing
    with PeakMemory([a, a[10:]]) as tracker:  # a view shares the storage
        b = torch.ones(2000)  # 8000 B
        c = b.view(40, 50)  # no new storage
        c.add_(1)  # in place: no new storage
        del b, c  # freed: live back to 4000
        d = torch.ones(500)  # 2000 B
    assert tracker.base == 4000
    assert tracker.peak == 12000
    assert tracker.live == 6000
    ops = {op for op, *_ in tracker.at_peak}
    assert ops == {"existing", "ones"}
    del d


@pytest.mark.timeout(300)
def test_planner_memory_matches_traced_training_step(tmp_path):
    """Both layouts (HF modules; axonn tensor-parallel), checkpointing on and off, data x depth > 1, one micro-step
    per optimizer step (no gradients in the forward) and two (the first pass's gradients live through the second).

    Runs in a fresh process: the trace builds a fake torch.distributed world.
    """
    out = tmp_path / "rows.json"
    code = (
        "import sys, warnings; warnings.filterwarnings('ignore'); sys.argv = ['x', '--json', sys.argv[1]]\n"
        "import benchmarks.memory_validation as mv\n"
        "mv.QUICK = [('tiny', (1, 1, 1, 1), 256, 4, False, 2), ('mini', (1, 2, 2, 2), 512, 4, True, 2),\n"
        "            ('mini', (2, 1, 1, 4), 512, 2, False, 2), ('tiny', (1, 1, 1, 1), 256, 4, False, 1),\n"
        "            ('mini', (2, 1, 2, 2), 512, 2, True, 1)]\n"
        "sys.argv.append('--quick'); mv.main()\n"
    )
    res = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, capture_output=True, text=True,
                         timeout=280)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 5
    for r in rows:
        assert abs(r["error"]) < 0.06, r
    one, two = rows[3], rows[0]  # the same tiny step with one and with two micro-steps
    assert one["traced_bytes"] < two["traced_bytes"] and one["predicted_bytes"] < two["predicted_bytes"]


def test_gpu_preflight_uses_the_memory_model():
    """memorize.py's check before any allocation: the planner's peak against the device's free memory."""
    from axonn.presets import get_preset
    from memorization.models import check_size_runs_here

    gpu, gib = torch.device("cuda"), 2**30
    shape = get_preset("1b")
    # 1.1B at 4 x 2048 without checkpointing: ~36 GiB on one GPU (traced 36.0)
    check_size_runs_here(shape, gpu, (1, 1, 1, 1), seq=2048, micro_batch=4, free_bytes=80 * gib)
    with pytest.raises(SystemExit, match=r"needs ~3\d\.\d GiB per GPU.*24\.0 GiB is free: add --activation-checkpointing"):
        check_size_runs_here(shape, gpu, (1, 1, 1, 1), seq=2048, micro_batch=4, free_bytes=24 * gib)
    with pytest.raises(SystemExit, match="lower --micro-batch; or shard over more GPUs"):
        check_size_runs_here(get_preset("8b"), gpu, (1, 1, 1, 1), seq=2048, micro_batch=2,
                             activation_checkpointing=True, free_bytes=80 * gib)
    # the same 8b sharded over 8 GPUs fits
    check_size_runs_here(get_preset("8b"), gpu, (1, 2, 2, 2), seq=2048, micro_batch=2, activation_checkpointing=True,
                         free_bytes=80 * gib)
    with pytest.raises(SystemExit, match="cannot be trained on this CPU-only machine"):
        check_size_runs_here(shape, torch.device("cpu"))


@pytest.mark.parametrize("as_tuple", [False, True])
def test_sharded_checkpoint_gradients_and_layer_return_shapes(as_tuple):
    """The checkpoint function gives plain autograd's gradients, for tensor- and tuple-returning layers."""
    import axonn
    from axonn.checkpointing import sharded_checkpoint

    grid = axonn.init()
    w = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    x0 = torch.randn(3, 5, 8, dtype=torch.float64)

    def layer(h):
        y = torch.tanh(h @ w) + h
        return (y, None) if as_tuple else y

    x = x0.clone().requires_grad_(True)
    ref = layer(x)
    (ref[0] if as_tuple else ref).pow(2).sum().backward()
    gw, gx = w.grad.clone(), x.grad.clone()
    w.grad = None
    x = x0.clone().requires_grad_(True)
    out = sharded_checkpoint(grid)(layer, x)
    assert isinstance(out, tuple) == as_tuple and (not as_tuple or (len(out) == 2 and out[1] is None))
    (out[0] if as_tuple else out).pow(2).sum().backward()
    assert torch.allclose(w.grad, gw) and torch.allclose(x.grad, gx)


def test_weight_gradient_reduce_frees_its_input_before_the_reduce_scatter():
    """A depth-sharded weight's unreduced gradient (bf16 under autocast) is cast to fp32 for the wire;
    the bf16 block must be gone before the reduce-scatter's output is allocated (it lived on, one local
    block of the embedding more at the 8b's backward peak, until this was caught by the memory trace).

    Peak of N bf16 elements reduced over depth 2: bf16 (2N) + fp32 copy (4N), then fp32 copy + output
    (2N) = 6N bytes; holding the input too makes it 8N.  A fake two-rank world, in a fresh process.
    """
    code = (
        "import torch, torch.distributed as dist\n"
        "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
        "import axonn\n"
        "from axonn.intra_layer.overlap import optimize_communication, reduce_weight_grad\n"
        "from memorization.memory_trace import PeakMemory\n"
        "dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=2)\n"
        "grid = axonn.init(1, 1, 1, 2)\n"
        "n = 1 << 20\n"
        "w = torch.nn.Parameter(torch.zeros(n // 2))\n"
        "for overlap in (False, True):\n"
        "    with optimize_communication(overlap_reduce_scatter=overlap), PeakMemory([w]) as t:\n"
        "        reduce_weight_grad(torch.ones(n, dtype=torch.bfloat16), w, n, grid)\n"
        "    print(overlap, (t.peak - t.base) / n)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    peaks = dict(line.split() for line in res.stdout.splitlines())
    assert float(peaks["False"]) == 6.0 and float(peaks["True"]) == 6.0, res.stdout
