"""Canaries written into the training rows exactly where they were placed (tokens and document ids), and a
placement that cannot fit refused."""
import pytest
import torch

from memorization.data.canary import Canary, CanaryRows, parse_canary_exposures, place_canaries


def test_canaries_are_written_where_placed():
    """Every copy of a canary appears at its (row, offset), its document ids continue the token before it,
    rows without a copy are untouched, and tensor indexing (a fingerprint's sample) agrees with slicing."""
    rows = torch.arange(20 * 100).view(20, 100) % 50
    docs = (torch.arange(100) // 30).repeat(20, 1).int()
    cans = [Canary("a", [60, 61], [1], [71], 3), Canary("b", [62, 63, 64], [0, 2], [70, 72], 2)]
    place_canaries(cans, 20, 100, busy_rows={0, 1}, seed=1)
    used = [r for c in cans for r in c.rows]
    assert len(set(used)) == 5 and not {0, 1} & set(used)
    view, dview = CanaryRows(rows, cans), CanaryRows(docs, cans, doc_ids=True)
    got, gdocs = view[0:20], dview[0:20]
    for c in cans:
        for r, o in zip(c.rows, c.offsets):
            assert got[r, o:o + len(c.ids)].tolist() == c.ids
            assert (gdocs[r, o:o + len(c.ids)] == docs[r, o - 1]).all()
    untouched = [r for r in range(20) if r not in used]
    assert torch.equal(got[untouched], rows[untouched])
    idx = torch.tensor([used[0], 5, used[-1]])
    assert torch.equal(view[idx], got[idx])
    assert view.token_range == (0, 72)


def test_placement_refuses_more_copies_than_free_rows():
    with pytest.raises(ValueError, match="canary copies"):
        place_canaries([Canary("a", [1] * 2, [0], [2], 5)], 6, 100, busy_rows={0, 1})
    with pytest.raises(ValueError, match="--canary-exposures"):
        parse_canary_exposures("1,x")
