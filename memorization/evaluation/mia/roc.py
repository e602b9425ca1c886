"""ROC statistics of "higher score = member": the ROC curve, its AUC and the TPR at a given FPR.

* ``AUC = P(s_member > s_nonmember) + 0.5 P(s_member = s_nonmember)`` -- the Mann-Whitney U statistic of the
  members against the nonmembers divided by ``n1 * n0`` (average ranks: ties count half).  It equals the
  trapezoidal area under the ROC curve returned by :func:`roc_curve`.
* ``TPR@FPR=f`` -- the ROC curve (one point per distinct threshold, so tied scores give a diagonal segment) is
  linearly interpolated at ``FPR = f``.

Non-finite scores (NaN: a document too short to score) are dropped before any statistic.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def finite_scores(x: Any) -> np.ndarray:
    """``x`` as a flat float64 array with its non-finite entries (NaN, +-inf) dropped."""
    a = np.asarray(x, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def roc_curve(
    member_scores: Any, nonmember_scores: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ROC curve for "higher score = member".

    Returns ``(fpr, tpr, thresholds)``: one point per distinct score value ``thr`` (classify
    ``score >= thr`` as member), in increasing FPR order, starting at ``(0, 0)`` with
    threshold ``+inf``.  Tied scores across the classes give a diagonal segment.
    This is ``sklearn.metrics.roc_curve(..., drop_intermediate=False)`` on the finite scores.
    """
    from sklearn.metrics import roc_curve as sk_roc_curve

    pos, neg = finite_scores(member_scores), finite_scores(nonmember_scores)
    if pos.size == 0 or neg.size == 0:
        raise ValueError("roc_curve needs at least one member and one nonmember score")
    labels = np.r_[np.ones(pos.size), np.zeros(neg.size)]
    fpr, tpr, thr = sk_roc_curve(labels, np.r_[pos, neg], drop_intermediate=False)
    return fpr, tpr, thr


def roc_auc(member_scores: Any, nonmember_scores: Any) -> float:
    """ROC AUC = P(member > nonmember) + 0.5 P(tie): the Mann-Whitney U of the members, from average ranks::

        AUC = U / (n1 * n0),   U = (sum of member ranks) - n1 (n1 + 1) / 2

    NaN when either class has no finite score.  The rank form, not the trapezoidal area of
    ``sklearn.metrics.roc_auc_score``: the two are equal in exact arithmetic but round differently in the last
    bit, and the reported figures use the rank form.
    """
    from scipy.stats import mannwhitneyu

    pos, neg = finite_scores(member_scores), finite_scores(nonmember_scores)
    if pos.size == 0 or neg.size == 0:
        return float("nan")
    # the statistic does not depend on the p-value method; "asymptotic" skips the exact distribution
    u = mannwhitneyu(pos, neg, alternative="two-sided", method="asymptotic").statistic
    return float(u / (pos.size * neg.size))


def tpr_at_fpr(fpr: np.ndarray, tpr: np.ndarray, target: float = 0.01) -> float:
    """TPR of an ROC curve at ``FPR = target``, linearly interpolated between its points.

    Takes the last point with ``fpr <= target`` (the highest TPR reached at that FPR) and the
    next point, and interpolates on the segment between them.
    """
    fpr, tpr = np.asarray(fpr, dtype=np.float64), np.asarray(tpr, dtype=np.float64)
    i = int(np.searchsorted(fpr, target, side="right")) - 1
    if i < 0:
        return 0.0
    if fpr[i] == target or i == fpr.size - 1:
        return float(tpr[i])
    x0, x1, y0, y1 = fpr[i], fpr[i + 1], tpr[i], tpr[i + 1]
    return float(y0 + (y1 - y0) * (target - x0) / (x1 - x0))


def score_summary(pos: np.ndarray, neg: np.ndarray, fpr_target: float) -> dict[str, Any]:
    """``{"auc", "tpr_at_fpr", "n_members", "n_nonmembers"}`` of oriented scores (higher = member), counted
    over their finite entries; the two statistics are None when either class has none."""
    pos, neg = finite_scores(pos), finite_scores(neg)
    if pos.size == 0 or neg.size == 0:
        return {"auc": None, "tpr_at_fpr": None, "n_members": int(pos.size),
                "n_nonmembers": int(neg.size)}
    fpr, tpr, _ = roc_curve(pos, neg)
    return {
        "auc": roc_auc(pos, neg),
        "tpr_at_fpr": tpr_at_fpr(fpr, tpr, fpr_target),
        "n_members": int(pos.size),
        "n_nonmembers": int(neg.size),
    }

