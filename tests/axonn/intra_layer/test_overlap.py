"""axonn/intra_layer/overlap.py: the weight-gradient reduction holds no more memory than it must."""
from __future__ import annotations


from tests.forked import run_python
from tests.support import REPO


def test_weight_gradient_reduce_frees_its_input_before_the_reduce_scatter():
    """A depth-sharded weight's unreduced gradient (bf16 under autocast) is cast to fp32 for the wire;
    the bf16 block must be gone before the reduce-scatter's output is allocated (held on, it would add one
    local block of the embedding to the 8b's backward peak).

    Peak of N bf16 elements reduced over depth 2: bf16 (2N) + fp32 copy (4N), then fp32 copy + output
    (2N) = 6N bytes; holding the input too makes it 8N.  A fake two-rank world, in a fresh process.
    """
    code = (
        "import torch, torch.distributed as dist\n"
        "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
        "import axonn\n"
        "from axonn.intra_layer.overlap import optimize_communication, reduce_weight_grad\n"
        "from memorization.training.memory_trace import PeakMemory\n"
        "dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=2)\n"
        "grid = axonn.init(1, 1, 1, 2)\n"
        "n = 1 << 20\n"
        "w = torch.nn.Parameter(torch.zeros(n // 2))\n"
        "for overlap in (False, True):\n"
        "    with optimize_communication(overlap_reduce_scatter=overlap), PeakMemory([w]) as t:\n"
        "        reduce_weight_grad(torch.ones(n, dtype=torch.bfloat16), w, n, grid)\n"
        "    print(overlap, (t.peak - t.base) / n)\n"
    )
    res = run_python(["-c", code], cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    peaks = dict(line.split() for line in res.stdout.splitlines())
    assert float(peaks["False"]) == 6.0 and float(peaks["True"]) == 6.0, res.stdout
