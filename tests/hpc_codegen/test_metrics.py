"""hpc_codegen/metrics.py: pass@k, speedup@k and efficiency@k are the expectations over k-subsets of
samples."""
from __future__ import annotations

from math import comb

import pytest

from hpc_codegen import pass_at_k, speedup_at_k
from hpc_codegen.metrics import best_over_workers, efficiency_at_k


@pytest.mark.parametrize("n,c,k", [(10, 3, 1), (10, 3, 2), (10, 3, 5), (20, 0, 5), (5, 5, 1), (7, 2, 7), (100, 17, 10)])
def test_pass_at_k_matches_closed_form(n, c, k):
    expected = 1.0 - comb(n - c, k) / comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_known_values():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 1, 10) == 1.0  # k = n with c > 0
    assert pass_at_k(10, 0, 10) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_speedup_at_k_is_the_expected_best_of_k_samples():
    s = [0.0, 2.0, 1.0, 4.0]
    assert speedup_at_k(s, 1) == pytest.approx(sum(s) / 4)  # k=1: the mean
    assert speedup_at_k(s, 4) == pytest.approx(4.0)  # k=N: the max
    # k=2: average over the 6 pairs of the pair maximum
    pairs = [max(a, b) for i, a in enumerate(s) for b in s[i + 1 :]]
    assert speedup_at_k(s, 2) == pytest.approx(sum(pairs) / len(pairs))


def test_efficiency_and_best_over_workers_are_the_expected_maxima_over_k_subsets():
    """ParEval: efficiency_n@k = E[max over k samples of speedup_n / n]; speedup_max@k and efficiency_max@k take
    each sample's best over its worker counts first (a failed sample, {}, counts 0). Checked against the
    expectation over every k-subset, computed directly."""
    from itertools import combinations

    per = [{1: 0.9, 2: 1.6, 4: 2.0}, {}, {1: 1.1, 2: 2.1, 4: 3.6}, {1: 1.0, 2: 1.2, 4: 1.1}]

    def expect(values, k):
        subsets = list(combinations(values, k))
        return sum(max(c) for c in subsets) / len(subsets)

    for k in (1, 2, 3):
        s4 = [d.get(4, 0.0) for d in per]
        assert efficiency_at_k(s4, 4, k) == pytest.approx(expect([v / 4 for v in s4], k))
        assert speedup_at_k(best_over_workers(per), k) == pytest.approx(expect([2.0, 0.0, 3.6, 1.2], k))
        assert speedup_at_k(best_over_workers(per, efficiency=True), k) == pytest.approx(
            expect([0.9, 0.0, 1.1, 1.0], k))
