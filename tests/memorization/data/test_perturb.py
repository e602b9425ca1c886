"""Near-duplicates: each perturbation changes what its definition says and no more, copies differ by row and
are reproducible, only target rows are perturbed; the min-hash Goldfish mask against its definition computed
token by token, invariant to reordering inside its window, and far more stable than the hash mask under
substitutions."""
import random

import pytest
import torch

from memorization.training.goldfish import goldfish_mask, minhash_context
from memorization.data.perturb import SPAN, PerturbedRows, perturb, target_copies


def test_substitution_changes_exactly_that_fraction_never_the_first_token():
    ids = list(range(100, 200))
    out = perturb(ids, 0.1, "substitute", 300, random.Random(0))
    changed = [i for i, (a, b) in enumerate(zip(ids, out)) if a != b]
    assert len(changed) == 10 and 0 not in changed and all(0 <= t < 300 for t in out)


def test_shuffle_reorders_tokens_inside_chosen_spans_only():
    ids = list(range(1, 81))
    out = perturb(ids, 0.2, "shuffle", 300, random.Random(3))
    assert out[0] == ids[0] and len(out) == len(ids)
    spans = [(lo, min(lo + SPAN, 80)) for lo in range(1, 80, SPAN)]
    moved = [s for s in spans if out[s[0]:s[1]] != ids[s[0]:s[1]]]
    assert all(sorted(out[lo:hi]) == ids[lo:hi] for lo, hi in spans)  # every span keeps its own tokens
    assert 1 <= len(moved) <= round(0.2 * 80 / SPAN)


def test_perturbed_rows_change_target_copies_only_and_differ_per_copy():
    """Rows 1 and 3 hold copies of the same 20-token target: each is perturbed, differently, and reproducibly;
    row 2 (background) and the tokens after the target are the base's."""
    base = torch.arange(4 * 32).view(4, 32) % 97
    base[1, :20] = base[3, :20] = torch.arange(20)
    copies = target_copies([{"token_ids": list(range(19)), "rows": [1, 3]}], 32)
    assert copies == {1: 20, 3: 20}
    view = PerturbedRows(base, copies, 0.25, "substitute", 97, seed=5)
    got = view[0:4]
    assert torch.equal(got[[0, 2]], base[[0, 2]]) and torch.equal(got[:, 20:], base[:, 20:])
    assert (got[1, :20] != base[1, :20]).sum() == 5 and (got[3, :20] != base[3, :20]).sum() == 5
    assert not torch.equal(got[1], got[3])
    assert torch.equal(view[torch.tensor([3, 1])], got[[3, 1]])
    assert view.token_range == (0, 96)


def _mix32(x: int) -> int:
    """The 32-bit finaliser of memorization.training.goldfish, on Python ints: two rounds of xor-shift 16 and multiply
    by 0x45D9F3B mod 2^32, then a last xor-shift."""
    for _ in range(2):
        x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


def test_minhash_mask_equals_its_definition_token_by_token():
    """``u_t = mix32(min_j mix32(x[t-h+j] ^ seed) ^ mix32(x[t-1] + golden))``, drop iff u_t < 2^32 / k."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50_000, (2, 40), generator=g)
    h, k, seed = 5, 3, 7
    got = minhash_context(ids, h, seed)
    mask = goldfish_mask(ids, k, h, "minhash", seed)
    for b in range(2):
        for t in range(40):
            if t < h:
                assert got[b, t] == 0 and not mask[b, t]
                continue
            m = min(_mix32(int(x) ^ seed) for x in ids[b, t - h:t])
            u = _mix32(m ^ _mix32((int(ids[b, t - 1]) + 0x9E3779B9) & 0xFFFFFFFF))
            assert int(got[b, t]) == u and bool(mask[b, t]) == (u < -(-(1 << 32) // k))


def test_minhash_ignores_order_inside_the_window_but_not_the_previous_token():
    ids = torch.arange(1000, 1020).unsqueeze(0)
    h, t = 8, 15
    shuffled = ids.clone()
    shuffled[0, t - h:t - 1] = ids[0, t - h:t - 1].flip(0)  # reorder all but the previous token
    assert minhash_context(shuffled, h)[0, t] == minhash_context(ids, h)[0, t]
    other = ids.clone()
    other[0, t - 1] = 5
    assert minhash_context(other, h)[0, t] != minhash_context(ids, h)[0, t]


@pytest.mark.parametrize("kind", ["substitute", "shuffle"])
def test_minhash_decisions_survive_perturbation_far_more_than_hash_decisions(kind):
    """Over 4,000 labels of copies perturbed at 10%, the min-hash mask changes its decision at under half as
    many labels as the 13-token hash mask, and keeps a drop rate near 1/4."""
    g = torch.Generator().manual_seed(1)
    orig = torch.randint(0, 4096, (20, 200), generator=g)
    copy = torch.tensor([perturb(r, 0.1, kind, 4096, random.Random(i)) for i, r in enumerate(orig.tolist())])
    flips = {s: (goldfish_mask(orig, 4, 13, s) != goldfish_mask(copy, 4, 13, s))[:, 13:].float().mean().item()
             for s in ("hash", "minhash")}
    assert flips["minhash"] < 0.5 * flips["hash"]
    assert goldfish_mask(orig, 4, 13, "minhash")[:, 13:].float().mean().item() == pytest.approx(0.25, abs=0.03)
