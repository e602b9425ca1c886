"""axonn.intra_layer.cross_entropy on one rank: the vocabulary-sharded loss against torch's."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from axonn.intra_layer import vocab_parallel_cross_entropy
from tests.support import fake_grid


def test_float64_logits_keep_their_precision() -> None:
    """float64 logits are not rounded to float32 on the way (only narrower ones are upcast): with logits as large
    as a trained model's (|z| ~ 35, where float32 leaves ~4e-6 of relative error in softmax), the loss and its
    gradient equal torch's float64 cross-entropy to 1e-12."""
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(12, 300, generator=g, dtype=torch.float64) * 12).requires_grad_(True)
    labels = torch.randint(0, 300, (12,), generator=g)
    labels[::5] = -100
    loss = vocab_parallel_cross_entropy(z, labels, grid=fake_grid())
    (dz,) = torch.autograd.grad(loss, z)
    ref = F.cross_entropy(z, labels, ignore_index=-100)
    (dref,) = torch.autograd.grad(ref, z)
    assert loss.dtype == torch.float64 and dz.dtype == torch.float64
    assert abs(float(loss - ref)) <= 1e-12 * abs(float(ref))
    assert float((dz - dref).abs().max() / dref.abs().max()) <= 1e-12
