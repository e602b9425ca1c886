"""Regression tests for defects found reviewing the parallel core (axonn/grid.py, parallelize.py, ...)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent / "axonn_workers"
_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)


@pytest.mark.timeout(60)
def test_stuck_rank_on_a_subgroup_times_out(tmp_path) -> None:
    """``AXONN_TIMEOUT`` bounds collectives on the row/col/depth sub-groups too, not only the world's:
    ``dist.new_group`` does not inherit the world group's timeout (it takes torch's default, 30 min
    on gloo), so a rank stuck outside a tensor-parallel collective used to hang its peers."""
    codes, out = launcher.launch("stuck_rank.py", 4, timeout=50,
                                 extra_env={"AXONN_TIMEOUT": "3", "AXONN_TEST_DONE": str(tmp_path / "done")})
    m = re.search(r"rank0: error after ([\d.]+)s", out)
    assert codes[0] == 7 and m, f"rank 0 should have raised, got rc={codes[0]}\n{out}"
    assert float(m.group(1)) < 15, f"the sub-group collective waited past AXONN_TIMEOUT=3s\n{out}"


def _fake_grid(data=1, depth=1, row=1, col=1):
    import torch

    from axonn.grid import Grid, coords_of

    sizes = {"data": data, "depth": depth, "row": row, "col": col}
    return Grid(sizes=sizes, coords=coords_of(0, sizes), rank=0, world_size=data * depth * row * col,
                backend="gloo", device=torch.device("cpu"))


@pytest.mark.parametrize("grid_kw, kw, match", [
    # Llama-3-like: fewer KV heads than the row size
    (dict(row=4), dict(num_attention_heads=4, num_key_value_heads=2),
     r"num_key_value_heads=2 is not divisible by the row \(G_intra_r\) axis size 4; use a G_intra_r that "
     r"divides 2 \(nearest: 2\) and put the remaining factor of tensor parallelism on G_intra_c or G_intra_d"),
    (dict(col=3), dict(), r"hidden_size=64 is not divisible .* size 3; use a G_intra_c that divides 64 "
                          r"\(nearest: 2 or 4\) and put .* on G_intra_r or G_intra_d"),
    (dict(row=2), dict(intermediate_size=129), r"intermediate_size \(FFN\)=129 .* divides 129 \(nearest: 1 or 3\)"),
])
def test_indivisible_model_error_says_how_to_fix(grid_kw, kw, match) -> None:
    """A bad grid is refused before the model is touched, with the sizes that would work."""
    import sys

    sys.path.insert(0, str(WORKERS))
    from common import tiny_llama

    import axonn

    with pytest.raises(ValueError, match=match):
        axonn.parallelize(tiny_llama(0, **kw), grid=_fake_grid(**grid_kw))


def test_indivisible_linear_error_says_how_to_fix() -> None:
    from axonn.intra_layer import Linear

    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by the row axis size G_intra_r=4; "
                                         r"use a G_intra_r that divides 10 \(nearest: 2 or 5\)"):
        Linear(8, 10, grid=_fake_grid(row=4))
    with pytest.raises(ValueError, match=r"in_features=8 is not divisible by the row axis size G_intra_r=3; "
                                         r"use a G_intra_r that divides 8 \(nearest: 2 or 4\)"):
        Linear(8, 12, transpose=True, grid=_fake_grid(row=3))


def test_out_of_range_ids_and_labels_are_refused_not_zeroed() -> None:
    """An id outside [0, V) lies in no rank's vocabulary chunk: the vocab-parallel embedding looked up
    nothing (a zero vector) and the loss took no target logit, silently; the serial model refuses it."""
    import torch

    import axonn
    from axonn.intra_layer import Embedding, vocab_parallel_cross_entropy

    grid = axonn.init()
    emb = Embedding(10, 4, grid=grid)
    ok = torch.tensor([[0, 9, 3]])
    assert torch.equal(emb(ok), emb.weight.view(10, 4)[ok])
    for bad in (10, -1):
        with pytest.raises(IndexError):
            torch.nn.functional.embedding(torch.tensor([bad]), torch.zeros(10, 4))  # what serial does
        with pytest.raises(RuntimeError, match=r"token id out of range \[0, 10\)"):
            emb(torch.tensor([[1, bad]]))
    logits = torch.randn(2, 3, 10)
    labels = torch.tensor([[1, -100, 9], [0, 2, 3]])
    torch.testing.assert_close(vocab_parallel_cross_entropy(logits, labels, grid=grid),
                               torch.nn.functional.cross_entropy(logits.reshape(-1, 10), labels.reshape(-1)))
    for bad in (10, -5):
        labels[1, 1] = bad
        with pytest.raises(RuntimeError, match=r"label out of range \[0, 10\)"):
            vocab_parallel_cross_entropy(logits, labels, grid=grid)


def test_collective_on_a_destroyed_grid_fails_instead_of_using_the_world(monkeypatch) -> None:
    """After ``Grid.destroy()`` the grid had no groups left and ``group()`` answered None, which
    torch.distributed reads as the world group: an all-reduce over "row" silently summed over
    every rank.  It must fail, saying what happened."""
    import torch
    import torch.distributed as dist

    from axonn.communication import all_reduce

    grid = _fake_grid(data=2, row=2)  # world 4; the row group has 2 ranks
    grid._groups[("row",)] = "row-group"
    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None, async_op=False: calls.append(group))
    monkeypatch.setattr(dist, "destroy_process_group", lambda g=None: None)
    all_reduce(torch.ones(2), "row", grid=grid)
    assert calls == ["row-group"]
    grid.destroy()
    with pytest.raises(RuntimeError, match=r"was destroyed \(Grid.destroy\(\)\): build a new grid with axonn.init"):
        all_reduce(torch.ones(2), "row", grid=grid)
    assert calls == ["row-group"], f"a collective ran on group {calls[-1]!r} (None = the world)"
