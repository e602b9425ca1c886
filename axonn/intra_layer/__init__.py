"""Intra-layer (row × column × depth) tensor parallelism: layers, loss, overlap."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch.nn as nn

from . import autotune
from .autotune import set_matmul_autotune
from .cross_entropy import vocab_parallel_cross_entropy, vocab_parallel_is_max, vocab_parallel_logprobs
from .embedding import Embedding
from .linear import Linear
from .overlap import finish_pending_grads, optimize_communication
from .primitives import drop, gather, reduce_forward

__all__ = ["Linear", "Embedding", "vocab_parallel_cross_entropy", "vocab_parallel_is_max", "vocab_parallel_logprobs",
           "auto_parallelize",
           "optimize_communication", "finish_pending_grads", "drop", "gather", "reduce_forward", "autotune",
           "set_matmul_autotune"]


class _AutoLinear(Linear):
    """Drop-in for ``nn.Linear(in, out, bias, device, dtype)``: full input, full output."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)


@contextmanager
def auto_parallelize() -> Iterator[None]:
    """Inside the block, ``torch.nn.Linear(...)`` builds an :class:`axonn.intra_layer.Linear`.

    The replacement takes and returns full (replicated) activations (it drops
    its input over the column group and all-gathers its output over the row
    group), so any plain ``nn.Linear`` model works unchanged.  It initialises
    the full matrix exactly like ``nn.Linear`` (same RNG draws), so a model built
    under the same seed equals the serial one.  Only code that looks up
    ``nn.Linear`` at call time is affected (``from torch.nn import Linear``
    executed before the block is not).
    """
    orig = nn.Linear
    nn.Linear = _AutoLinear
    try:
        yield
    finally:
        nn.Linear = orig
