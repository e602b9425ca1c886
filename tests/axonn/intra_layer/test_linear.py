"""axonn.intra_layer.Linear: a weight that does not divide over its grid axis is refused, naming the sizes that
would."""
from __future__ import annotations

import pytest

from tests.support import fake_grid


def test_linear_indivisible_refused() -> None:
    from axonn.intra_layer import Linear

    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by the row axis size G_intra_r=4"):
        Linear(8, 10, grid=fake_grid(row=4))


def test_indivisible_linear_error_says_how_to_fix() -> None:
    from axonn.intra_layer import Linear

    with pytest.raises(ValueError, match=r"out_features=10 is not divisible by the row axis size G_intra_r=4; "
                                         r"use a G_intra_r that divides 10 \(nearest: 2 or 5\)"):
        Linear(8, 10, grid=fake_grid(row=4))
    with pytest.raises(ValueError, match=r"in_features=8 is not divisible by the row axis size G_intra_r=3; "
                                         r"use a G_intra_r that divides 8 \(nearest: 2 or 4\)"):
        Linear(8, 12, transpose=True, grid=fake_grid(row=3))
