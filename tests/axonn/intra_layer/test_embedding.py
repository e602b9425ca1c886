"""axonn.intra_layer's vocabulary-parallel Embedding and cross entropy: a token id or label outside [0, V) is
refused as the serial model refuses it."""
from __future__ import annotations

import pytest


def test_out_of_range_ids_and_labels_are_refused_not_zeroed() -> None:
    """An id outside [0, V) lies in no rank's vocabulary chunk: the vocab-parallel embedding and cross entropy
    refuse it, as the serial model does, instead of looking up a zero vector or taking no target logit."""
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
