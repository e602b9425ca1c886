"""memorization/training/runtime.py: splitting evaluation work over a grid's replicas."""
from __future__ import annotations

import pytest
import torch

from axonn.grid import Grid
from memorization.training.runtime import check_replicas


@pytest.mark.parametrize("dims, n, ok", [((4, 1, 1, 1), 3, False), ((4, 1, 1, 1), 4, True), ((2, 2, 1, 1), 1, False),
                                         ((1, 2, 2, 1), 1, True), ((1, 1, 1, 4), 2, True)])
def test_a_grid_with_more_data_replicas_than_documents_is_refused_naming_the_fix(dims, n, ok):
    """Every data replica needs a document (depth replicas share their weights' all-gathers, so an idle depth
    rank repeats a document instead); the message names the largest data axis that works."""
    sizes = dict(zip(("data", "row", "column", "depth"), dims))
    world = dims[0] * dims[1] * dims[2] * dims[3]
    grid = Grid(sizes, {a: 0 for a in sizes}, rank=0, world_size=world, backend="gloo", device=torch.device("cpu"))
    if ok:
        check_replicas(n, grid, "documents")
    else:
        with pytest.raises(ValueError, match=rf"{dims[0]} data replicas for {n} documents.*D <= {n}"):
            check_replicas(n, grid, "documents")
