"""axonn/planner/memory.py: the planner's memory per GPU against the trainer's traced allocations, and the
check before training that uses it."""
from __future__ import annotations

import json

import pytest
import torch

from axonn.presets import ModelShape

from tests.forked import run_python
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
    res = run_python(["-c", code, str(out)], cwd=REPO, timeout=280)
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
    from memorization.training.models import check_size_runs_here

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

def test_cpu_preflight_refuses_by_memory_not_by_size():
    """On a CPU the same memory model decides (activations and logits counted in fp32, every rank of the grid
    sharing the host's memory): a 135M fine-tune fits a 24 GiB machine, a 70b does not, and a grid of ranks
    that each fit alone is refused when together they do not."""
    from axonn.presets import get_preset
    from memorization.training.models import check_size_runs_here

    cpu, gib = torch.device("cpu"), 2**30
    smol = ModelShape(name="smollm2-135m", layers=30, hidden=576, heads=9, kv_heads=3, ffn=1536, vocab=49152,
                      tied=True)
    assert 134e6 < smol.num_params() < 135e6  # 134,515,008: the converted model's count
    check_size_runs_here(smol, cpu, seq=128, micro_batch=4, free_bytes=24 * gib)  # ~4.0 GiB
    check_size_runs_here(get_preset("1b"), cpu, seq=2048, micro_batch=1, activation_checkpointing=True,
                         free_bytes=24 * gib)
    with pytest.raises(SystemExit, match=r"'70b' \(70\.\d+B parameters\).* needs ~\d+\.\d GiB on this CPU .* but "
                                         r"24\.0 GiB of host memory is available: .*train it on GPUs"):
        check_size_runs_here(get_preset("70b"), cpu, seq=128, micro_batch=1, free_bytes=24 * gib)
    # 1.1B at 1 x 2048 without checkpointing: ~28.7 GiB (16.4 of it training state); checkpointing is the fix
    with pytest.raises(SystemExit, match=r"needs ~2\d\.\d GiB on this CPU .*add --activation-checkpointing"):
        check_size_runs_here(get_preset("1b"), cpu, seq=2048, micro_batch=1, free_bytes=24 * gib)
    one = 6 * gib  # one rank of the 135M (~4 GiB) fits in 6 GiB, four ranks on the host do not
    check_size_runs_here(smol, cpu, (1, 1, 1, 1), seq=128, micro_batch=4, free_bytes=one)
    with pytest.raises(SystemExit, match="4 ranks on this host.*run fewer ranks on this host"):
        check_size_runs_here(smol, cpu, (4, 1, 1, 1), seq=128, micro_batch=4, free_bytes=one)


