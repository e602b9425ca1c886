"""Extraction against the steps since a target's last exposure."""
from memorization.evaluation.recency import by_recency, recency_bins, steps_since_last


def test_steps_since_last_counts_from_the_final_step():
    assert steps_since_last({"steps": [3, 99]}, 100) == 0
    assert steps_since_last({"steps": [10, 40]}, 100) == 59
    assert steps_since_last({"steps": []}, 100) is None


def test_bins_cover_the_run_and_documents_fall_in_their_bin():
    assert recency_bins(100, 4) == [(0, 13), (13, 25), (25, 50), (50, 100)]
    assert recency_bins(3, 4) == [(0, 1), (1, 2), (2, 3)]
    targets = [{"id": "a", "steps": [99]}, {"id": "b", "steps": [5, 60]}, {"id": "c", "steps": [10]},
               {"id": "d", "steps": []}]
    docs = [{"id": "a", "exposures": 1, "exact_match": True, "token_match": 1.0, "rouge_l": 1.0},
            {"id": "b", "exposures": 2, "exact_match": False, "token_match": 0.5, "rouge_l": 0.5},
            {"id": "c", "exposures": 1, "exact_match": False, "token_match": 0.0, "rouge_l": 0.0},
            {"id": "d", "exposures": 0, "exact_match": False, "token_match": 0.0, "rouge_l": 0.0}]
    bins = by_recency(docs, targets, 100, bins=4)
    assert [(b["steps"], b["n"], b["exposures"]) for b in bins] == [
        ([0, 13], 1, [1]), ([13, 25], 0, []), ([25, 50], 1, [2]), ([50, 100], 1, [1])]
    assert bins[0]["exact_match"] == 1.0 and bins[3]["exact_match"] == 0.0  # the control (d) is left out
