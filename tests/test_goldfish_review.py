"""Review checks of the Goldfish mask against the stream: limits of the row context."""
import numpy as np
import pytest
import torch

from memorization.goldfish import NO_DOC, RowContext, goldfish_mask, goldfish_mask_in_stream


def _background_rows(stream, seg, L, C):
    """Background-only rows cut from ``stream``, each with the ``C`` stream tokens before it."""
    rows, docs, cids, cdocs = [], [], [], []
    for pos in range(0, len(stream) - L + 1, L):
        rows.append(stream[pos : pos + L]), docs.append(seg[pos : pos + L] - seg[pos])
        lo = max(pos - C, 0)
        ctx, cd = np.zeros(C, np.int64), np.full(C, NO_DOC, np.int32)
        ctx[C - (pos - lo):], cd[C - (pos - lo):] = stream[lo:pos], seg[lo:pos] - seg[pos]
        cids.append(ctx), cdocs.append(cd)
    t = torch.from_numpy
    n = len(rows)
    return (t(np.stack(rows)), t(np.stack(docs).astype(np.int32)),
            RowContext(t(np.stack(cids)), t(np.stack(cdocs)), torch.zeros(n, dtype=torch.long)))


@pytest.mark.parametrize("h", [64, 65, 100])
def test_in_stream_mask_is_the_stream_mask_or_refuses_a_too_wide_h(h):
    """A row context of C tokens decides every background label as the stream does for h <= C; for h > C
    the first h - C labels of each row cannot be decided (they were silently kept: at h = 100, C = 64
    the background drop rate fell from 21% to 18%), so the mask refuses instead of diverging."""
    rng = np.random.default_rng(1)
    doc_lens = rng.integers(300, 900, 40)
    stream = rng.integers(3, 500, int(doc_lens.sum()))
    seg = np.repeat(np.arange(len(doc_lens)), doc_lens).astype(np.int32)
    L, C = 256, 64
    rows, docs, ctx = _background_rows(stream, seg, L, C)
    if h > C:
        with pytest.raises(ValueError, match=r"h=\d+ needs the \d+ stream tokens.*holds only 64"):
            goldfish_mask_in_stream(rows, docs, ctx, 4, h)
        return
    n = rows.numel()
    want = goldfish_mask(torch.from_numpy(stream[:n])[None], 4, h, document_ids=torch.from_numpy(seg[:n])[None])[0]
    assert torch.equal(goldfish_mask_in_stream(rows, docs, ctx, 4, h).reshape(-1), want)


def test_stream_mask_without_document_ids_is_a_clear_error():
    """apply_goldfish with a row context needs the rows' document ids (it used to fail with an AttributeError
    on None deep inside the rotation)."""
    from memorization.goldfish import GoldfishConfig, apply_goldfish

    rows = torch.randint(3, 100, (2, 32))
    ctx = RowContext(torch.zeros(2, 16, dtype=torch.long), torch.full((2, 16), NO_DOC, dtype=torch.int32),
                     torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="document_ids"):
        apply_goldfish(rows.clone(), rows, GoldfishConfig(k=4, h=4), None, ctx)
