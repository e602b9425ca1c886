"""Replicates: counterfactual memorization against a hand-computed case, the seed table's means and t intervals
by hand, the rotations of an exposure list, and the replicate command's refusals."""
import math

import pytest

from memorization.launch.replicates import (aggregate_seeds, counterfactual, distribution, headline_metrics,
                                            replicate_configs, rotations, seeds_markdown)


def _doc(i, e, exact, token):
    return {"id": i, "exposures": e, "exact_match": exact, "token_match": token}


def test_counterfactual_memorization_by_hand():
    """Two splits (64,0 and 0,64): target a is a member in run 0 (exact 1, token 1.0, loss 0.5) and not in run 1
    (exact 0, token 0.2, loss 3.0) -> mem = 1, 0.8 and -0.5 - (-3.0) = 2.5; target b is a member in run 1 only
    (token 0.6 vs 0.4) -> mem exact 0, token 0.2, loss 1.0."""
    runs = [
        {"arms": {"standard": {"documents": [_doc("a", 64, True, 1.0), _doc("b", 0, False, 0.4)],
                               "loss": {"a": 0.5, "b": 2.0}}}},
        {"arms": {"standard": {"documents": [_doc("a", 0, False, 0.2), _doc("b", 64, False, 0.6)],
                               "loss": {"a": 3.0, "b": 1.0}}}},
    ]
    cf = counterfactual(runs)["standard"]
    assert cf["by_target"]["a"] == pytest.approx({"exact_match": 1.0, "token_match": 0.8, "neg_loss": 2.5})
    assert cf["by_target"]["b"] == pytest.approx({"exact_match": 0.0, "token_match": 0.2, "neg_loss": 1.0})
    assert cf["summary"]["exact_match"]["mean"] == 0.5 and cf["summary"]["exact_match"]["share_above_half"] == 0.5
    assert cf["summary"]["neg_loss"]["median"] == pytest.approx(1.75)


def test_a_target_never_held_out_has_no_counterfactual_value():
    runs = [{"arms": {"goldfish": {"documents": [_doc("a", 4, True, 1.0)], "loss": {}}}}] * 2
    assert counterfactual(runs)["goldfish"]["by_target"] == {"a": {}}


def test_distribution_quartiles_by_hand():
    d = distribution([4.0, 1.0, 3.0, 2.0])
    assert (d["q25"], d["median"], d["q75"], d["min"], d["max"]) == (1.75, 2.5, 3.25, 1.0, 4.0)


def test_seed_table_means_and_t_intervals_by_hand():
    """Exact match 0.5, 0.7, 0.9 over three seeds: mean 0.7, sd 0.2, half-width t_2 * 0.2 / sqrt(3) = 0.497."""
    res = [{"arms": {"standard": {"exact_match": x, "by_exposure": {"64": {"exact_match": x, "n": 4}},
                                  "mia": {"scores": {"loss": {"auc": x, "tpr_at_fpr": 0.1, "by_exposure": {}}}},
                                  "canaries": {"by_exposure": {"16": {"mean": 10 * x}}}}}}
           for x in (0.5, 0.7, 0.9)]
    agg = aggregate_seeds(res)["standard"]
    half = 4.302652729911275 * 0.2 / math.sqrt(3)
    assert agg["exact_match"]["mean"] == pytest.approx(0.7)
    assert agg["exact_match"]["ci95"] == pytest.approx([0.7 - half, 0.7 + half])
    assert agg["exact_match@e64"]["values"] == [0.5, 0.7, 0.9] and agg["canary_exposure@c16"]["mean"] == 7.0
    assert agg["mia_auc_loss"]["mean"] == pytest.approx(0.7)
    assert agg["mia_tpr_loss"]["ci95"] == pytest.approx([0.1, 0.1])
    assert "| exact_match | 0.700 ± 0.497 |" in seeds_markdown(aggregate_seeds(res), [0, 1, 2])
    assert headline_metrics({"exact_match": 1.0, "hints_mean": None}) == {"exact_match": 1.0}


def test_the_quality_cost_is_paired_with_each_seeds_standard_arm_and_p_values_are_not_averaged():
    """Held-out losses (standard, goldfish) = (5.0, 5.1), (6.0, 6.06), (4.0, 4.08): the paired gaps are 2%, 1%, 2%
    (mean 5/3%, sd 0.577%, half-width t_2 * 0.577% / sqrt(3) = 1.434%), while the goldfish losses alone spread
    over 4.08-6.06.  The McNemar p of each seed is listed and the table shows the largest; the tracked targets'
    kept/dropped-label losses are the last tracked step's."""
    pairs, ps = [(5.0, 5.1), (6.0, 6.06), (4.0, 4.08)], [1e-9, 3e-8, 2e-9]
    track = [{"step": 50, "kept_loss": 5.0, "dropped_loss": 5.0}, {"step": 100, "kept_loss": 0.1, "dropped_loss": 8.0}]
    res = [{"arms": {"standard": {"val_loss": s}, "goldfish": {"val_loss": g, "tracking": track}},
            "paired_exact_match": {"p_value": p}} for (s, g), p in zip(pairs, ps)]
    agg = aggregate_seeds(res)
    gap = agg["goldfish"]["val_loss_gap"]
    half = 4.302652729911275 * (0.01 / math.sqrt(3)) / math.sqrt(3)
    assert gap["values"] == pytest.approx([0.02, 0.01, 0.02]) and gap["mean"] == pytest.approx(0.05 / 3)
    assert gap["ci95"] == pytest.approx([0.05 / 3 - half, 0.05 / 3 + half])
    assert "val_loss_gap" not in agg["standard"]
    assert agg["goldfish"]["kept_loss"]["values"] == [0.1] * 3 and agg["goldfish"]["dropped_loss"]["mean"] == 8.0
    assert agg["goldfish"]["mcnemar_p"]["values"] == ps and agg["goldfish"]["mcnemar_p"]["ci95"] is None
    md = seeds_markdown(agg, [0, 1, 2])
    assert "| mcnemar_p | – | ≤ 3e-08 |" in md and "| val_loss_gap | – | 0.017 ± 0.014 |" in md


def test_rotations_and_replicate_refusals():
    assert rotations("64,0,0") == ["64,0,0", "0,0,64", "0,64,0"]
    with pytest.raises(ValueError, match="at least one 0"):
        rotations("16,64")
    from memorization.experiment.cli import config_from_argv, explicit_values

    def replicate_argvs(argv, **kw):  # the replicate command's reading of its memorize options
        return replicate_configs(config_from_argv(argv), given=explicit_values(argv), **kw)

    assert [(n, c.training.steps, c.training.seed) for n, c in replicate_argvs(["--steps", "5"], seeds=[0, 2])] == [
        ("seed-0", 5, 0), ("seed-2", 5, 2)]
    assert [c.data.exposures for _, c in replicate_argvs(["--exposures", "8,0"], counterfactual=True)] == ["8,0",
                                                                                                         "0,8"]
    with pytest.raises(ValueError, match="--seed is what --seeds varies"):
        replicate_argvs(["--seed", "3"], seeds=[0, 1])
    with pytest.raises(ValueError, match="give --out to the replicate command"):
        replicate_argvs(["--out", "x"], seeds=[0])
