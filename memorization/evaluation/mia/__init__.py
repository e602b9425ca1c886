"""Membership inference (MIA) scores for causal LMs, and how well they separate members.

Given a model and a set of documents, each score is a single number per document that an
attacker could compute with (at most) black-box access to token probabilities.  With
``x = (x_0, ..., x_{n-1})`` the token ids of a document and
``log p_t = log p_theta(x_t | x_<t)`` for ``t = 1..n-1`` (the first token has no context and
is not scored; prepend BOS to score it), the scores are:

``loss``      mean token negative log-likelihood (the log-perplexity)::

                  L(x) = -1/(n-1) * sum_t log p_t

              Members were trained on, so they tend to have *lower* loss.
``zlib``      loss divided by the zlib-compressed size in bytes of the text of the *scored*
              tokens (Carlini et al., 2021, "Extracting Training Data from Large Language
              Models")::

                  Z(x) = L(x) / len(zlib.compress(utf8(decode(x_1, ..., x_{n-1}))))

              ``x`` is the document as scored, i.e. after any ``max_length`` truncation: a
              manifest's ``text`` (the whole document) is never used, as its length would add
              noise unrelated to membership.

              Normalises away "generically easy" text (repetitive text compresses well *and*
              has low loss); *lower* is more member-like.
``min_k``     Min-k% Prob (Shi et al., 2023, "Detecting Pretraining Data from Large Language
              Models"): the mean of the lowest ``k`` fraction of the token log-probs::

                  M_k(x) = 1/|S| * sum_{t in S} log p_t,   S = the max(1, floor(k (n-1)))
                                                            tokens with smallest log p_t

              An unseen text has a few very surprising tokens; a memorised one has none, so
              *higher* is more member-like.  ``k = 0.2`` by default.
``min_k_pp``  Min-K%++ (Zhang et al., 2024, "Min-K%++: Improved Baseline for Detecting Pre-Training
              Data from Large Language Models"): each token's log-prob standardised by the
              model's own next-token distribution at that position, then Min-k% of those::

                  z_t = (log p_t - mu_t) / sigma_t,   mu_t = E_{z ~ p(.|x_<t)} log p(z|x_<t),
                  sigma_t^2 = E_{z ~ p(.|x_<t)} (log p(z|x_<t))^2 - mu_t^2
                  K(x) = mean of the max(1, floor(k (n-1))) smallest z_t

              Training pushes a member's tokens towards a local maximum of the likelihood, above
              what the distribution at that position would give a typical token; a position
              whose distribution is a single token (sigma_t = 0) scores z_t = 0.  *Higher* is
              more member-like.
``ref_diff``  loss under the target model minus loss under a reference model that did not see
              the members (e.g. the base checkpoint before fine-tuning, or a model trained on
              the same distribution without the targets)::

                  R(x) = L_target(x) - L_ref(x)

              Both losses cover the same text span: the reference scores the same ids when
              it shares the target's vocabulary, else the decoded scored span re-tokenised
              with its own tokenizer.  Calibrates away per-document difficulty; *lower* is
              more member-like.

All scores are computed in padded batches (right padding + attention mask) with one forward
pass per batch; the per-token work is fully vectorised.

Evaluation
----------
:func:`mia_report` turns raw scores into the numbers that are reported: ROC AUC and the TPR at
1% FPR, for members (targets with ``exposures >= 1``) against nonmembers, overall and broken
down by exposure count.  :func:`run_mia` takes as nonmembers the targets with ``exposures ==
0`` when there are any (never trained on, and drawn like the members), pooled with the
manifest's held-out corpus documents only when the targets come from that same corpus.
Without exposure-0 targets it uses the manifest's nonmembers; for user-supplied targets those
are background-corpus documents, a different distribution, so the AUC then also measures
that shift -- the report says so (``nonmember_source``, ``warnings``).  Each score is first
oriented with :data:`SCORE_DIRECTIONS` so that *higher means "member"*; an AUC of 0.5 is chance
and an AUC above 0.5 means the attack works.

* ``AUC = P(s_member > s_nonmember) + 0.5 P(s_member = s_nonmember)`` -- the normalised
  Mann-Whitney U statistic, computed from average ranks (ties count half).  It equals the
  trapezoidal area under the ROC curve returned by :func:`roc_curve`.
* ``TPR@FPR=f`` -- the ROC curve (one point per distinct threshold, so tied scores give a
  diagonal segment) is linearly interpolated at ``FPR = f``.  With ``N`` nonmembers the FPR
  resolution is ``1/N``: below ``N = 100`` the 1% point is an interpolation between the
  ``FPR = 0`` and ``FPR = 1/N`` points, which the report flags as ``fpr_resolution``.

Modules
-------
:mod:`.scoring` (token log-probs and :func:`mia_scores`), :mod:`.roc` (:func:`roc_curve`, :func:`roc_auc`,
:func:`tpr_at_fpr`), :mod:`.report` (:func:`mia_report`, :func:`report_markdown`, :func:`plot_roc`) and
:mod:`.runner` (:func:`run_mia`, :func:`select_nonmembers`); every public name is importable from
``memorization.evaluation.mia``.  The CLI is ``python eval/mia.py``.
"""
from __future__ import annotations

from ..eval_model import MissingTokenizerError, load_checkpoint, model_max_length
from memorization.data.mixture import load_manifest
from .report import mia_report, plot_roc, report_markdown
from .roc import finite_scores, roc_auc, roc_curve, score_summary, tpr_at_fpr
from .runner import NONMEMBER_SOURCES, USER_TARGETS_WARNING, run_mia, select_nonmembers
from .scoring import SCORE_DESCRIPTIONS, SCORE_DIRECTIONS, check_max_length, mia_scores

__all__ = [
    "SCORE_DIRECTIONS",
    "MissingTokenizerError",
    "load_checkpoint",
    "load_manifest",
    "mia_scores",
    "roc_curve",
    "roc_auc",
    "tpr_at_fpr",
    "mia_report",
    "report_markdown",
    "plot_roc",
    "run_mia",
    "select_nonmembers",
    "NONMEMBER_SOURCES",
    "SCORE_DESCRIPTIONS",
    "USER_TARGETS_WARNING",
    "check_max_length",
    "finite_scores",
    "model_max_length",
    "score_summary",
]
