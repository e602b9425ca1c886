"""axonn/planner/memory.py: the planner's memory per GPU against the trainer's traced allocations, and the
check before training that uses it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.support import REPO


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


