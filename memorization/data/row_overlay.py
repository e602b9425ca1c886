"""Indexing shared by the row overlays (:mod:`memorization.data.canary`, :mod:`memorization.data.perturb`): views of a
``(rows, seq)`` token array that rewrite some rows' tokens when they are read."""
from __future__ import annotations

import torch


def read_rows(base, index, n_rows: int) -> tuple[list[int], torch.Tensor]:
    """``base[index]`` as a 2-D array the caller may write (a copy when ``base`` is a tensor), and the row numbers
    (modulo ``n_rows``) of its rows, for an int, a slice or any integer index array."""
    out = base[index]
    if isinstance(index, slice):
        rows = list(range(*index.indices(n_rows)))
    elif isinstance(index, int):
        rows, out = [index % n_rows], out.unsqueeze(0)
    else:
        rows = [int(i) % n_rows for i in torch.as_tensor(index).reshape(-1)]
    return rows, (out.clone() if isinstance(base, torch.Tensor) else out)
