"""torch.compile on a parallelized model: the graphs split only at axonn's collectives and are reused by every layer.

    python tests/axonn_workers/compile_checks.py D,R,C,Z [--checkpointing]

Runs rank 0 of the grid in one process on a fake process group (collectives are no-ops, shapes
are real).  The compiled loss, forward and backward, runs twice: the second step compiles nothing,
the graph count does not grow with the number of layers (regions between collectives are
compiled once and shared; with checkpointing a region may compile once for the no-grad forward
and once for the rest), and the compiled loss and gradients must equal the eager ones on the same
fake world.  Numerical agreement with the serial model over real collectives is checked by
``tests/cli/test_memorize_parallel.py`` (4 gloo ranks, ``--compile``).
"""
from __future__ import annotations

import copy
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import axonn
from memorization.training.loss import causal_lm_loss_sum

from common import assert_close, tiny_llama


def graphs_for(layers: int, grid, checkpointing: bool) -> int:
    """Graphs compiled for two steps of a ``layers``-layer model (after checking them against eager)."""
    model = tiny_llama(num_hidden_layers=layers)
    model.config._attn_implementation = "sdpa"
    eager = copy.deepcopy(model)
    for m in (model, eager):
        axonn.parallelize(m, grid)
        if checkpointing:
            axonn.enable_activation_checkpointing(m, grid)
    ids = torch.randint(3, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    count = [0]

    def backend(gm, example_inputs):
        count[0] += 1
        return gm.forward

    torch._dynamo.reset()
    for limit in ("recompile_limit", "accumulated_recompile_limit", "cache_size_limit", "accumulated_cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):  # names differ across torch versions
            setattr(torch._dynamo.config, limit, 1000)  # never saturate: per-layer recompiles must show in the count
    fn = torch.compile(causal_lm_loss_sum, backend=backend)
    after = []
    for _ in range(2):
        model.zero_grad()
        loss, _ = fn(model, ids, ids)
        loss.backward()
        after.append(count[0])
    assert after[0] == after[1], f"the second step compiled {after[1] - after[0]} more graphs"
    ref, _ = causal_lm_loss_sum(eager, ids, ids)
    ref.backward()
    assert_close(loss.detach(), ref.detach(), "compiled loss")
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        assert_close(q.grad, p.grad, f"compiled grad {name}", tol=1e-4)
    return count[0]


def main() -> None:
    D, R, C, Z = (int(x) for x in sys.argv[1].split(","))
    checkpointing = "--checkpointing" in sys.argv
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=D * R * C * Z)
    grid = axonn.init(D, R, C, Z)
    two, four = graphs_for(2, grid, checkpointing), graphs_for(4, grid, checkpointing)
    assert two == four, f"{two} graphs for 2 layers but {four} for 4: layers recompile instead of sharing graphs"
    print(f"OK compile {sys.argv[1]} checkpointing={checkpointing}: {two} graphs for 2 and for 4 layers")


if __name__ == "__main__":
    main()
