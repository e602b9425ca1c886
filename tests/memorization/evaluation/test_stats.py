"""The intervals and the paired test that the memorization reports print."""
import math

import pytest

from memorization.evaluation.extraction import summarize
from memorization.evaluation.stats import paired_exact_test, rate_ci


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval from its closed form, to check scipy's against."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 32), (31, 32), (32, 32), (6, 32), (1, 4), (500, 1000)])
def test_rate_ci_is_the_wilson_interval(k, n):
    lo, hi = rate_ci(k, n)
    assert (lo, hi) == pytest.approx(_wilson(k, n), abs=1e-9)
    assert 0 <= lo <= k / n <= hi <= 1
    assert hi - lo > 0  # not zero-width at 0/n or n/n, unlike the normal approximation


def test_rate_ci_narrows_with_more_documents():
    assert rate_ci(16, 32)[1] - rate_ci(16, 32)[0] > rate_ci(160, 320)[1] - rate_ci(160, 320)[0]


def test_rate_ci_refuses_nonsense():
    with pytest.raises(ValueError, match="0 <= k <= n"):
        rate_ci(5, 4)
    with pytest.raises(ValueError, match="n >= 1"):
        rate_ci(0, 0)


def test_paired_test_counts_only_discordant_targets():
    a = {f"d{i}": i < 31 for i in range(32)}  # standard extracts 31 of 32
    b = {f"d{i}": False for i in range(32)}   # goldfish none
    t = paired_exact_test(a, b)
    assert (t["n"], t["only_a"], t["only_b"]) == (32, 31, 0)
    assert t["p_value"] == pytest.approx(2 * 0.5 ** 31)  # two-sided exact binomial
    assert paired_exact_test(b, a)["p_value"] == pytest.approx(t["p_value"])  # symmetric
    # 6 vs 2 on 32 shared targets is not evidence of a difference, although the rates are 3x apart
    c = {f"d{i}": i < 6 for i in range(32)}
    d = {f"d{i}": i < 2 for i in range(32)}
    assert paired_exact_test(c, d)["p_value"] == pytest.approx(0.125)
    assert paired_exact_test(c, c)["p_value"] == 1.0


def test_paired_test_uses_shared_targets_only():
    t = paired_exact_test({"x": True, "y": True}, {"y": False, "z": True})
    assert (t["n"], t["only_a"], t["only_b"]) == (1, 1, 0)
    with pytest.raises(ValueError, match="share no scored document"):
        paired_exact_test({"x": True}, {"y": True})


def test_summaries_carry_the_interval():
    recs = [{"exact_match": i < 3, "token_match": 1.0, "rouge_l": 1.0} for i in range(10)]
    s = summarize(recs)
    assert s["exact_match"] == 0.3 and s["exact_match_ci95"] == pytest.approx(list(_wilson(3, 10)))


@pytest.mark.parametrize("missing", [None, float("nan")])
def test_paired_test_refuses_a_missing_outcome(missing):
    """A document one arm has no outcome for is not read as 'not extracted' (a discordant pair)."""
    with pytest.raises(ValueError, match="no outcome for document 'y'"):
        paired_exact_test({"x": True, "y": True}, {"x": True, "y": missing})
    with pytest.raises(ValueError, match="no outcome for document 'y'"):
        paired_exact_test({"x": True, "y": missing}, {"x": True, "y": True})


def test_paired_test_is_the_exact_binomial_by_brute_force():
    """p = sum of the Binomial(b + c, 1/2) probabilities no larger than that of the observed split."""
    for only_a in range(8):
        for only_b in range(8):
            n = only_a + only_b
            a = {f"d{i}": i < only_a or i >= n for i in range(n + 2)}  # the last two: both arms extract
            b = {f"d{i}": i >= only_a for i in range(n + 2)}
            pk = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
            want = min(1.0, sum(q for q in pk if q <= pk[only_a] * (1 + 1e-9)))
            t = paired_exact_test(a, b)
            assert (t["n"], t["only_a"], t["only_b"]) == (n + 2, only_a, only_b)
            assert t["p_value"] == pytest.approx(want, abs=1e-12)
