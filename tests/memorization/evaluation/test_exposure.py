"""Canary exposure: the trie enumeration against scoring every candidate on its own, the rank and exposure
against a hand-computed case, the skew-normal estimate against the exact exposure, and the summary by exposure
count against a hand-computed t interval."""
import itertools
import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization.evaluation.exposure import (enumerate_log_perplexities, estimated_exposure, exact_exposure,
                                              secret_index, secret_log_perplexities, summarize_exposures)
from memorization.evaluation.stats import mean_ci


def _tiny(vocab: int = 16, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).eval()


def test_trie_enumeration_equals_scoring_each_candidate():
    """Px of every candidate of A^m from the level-by-level trie equals -log2 Pr(r | carrier) from one forward
    of carrier + r per candidate, in base-|A| order."""
    model = _tiny()
    carrier, alphabet, m = [3, 1, 4, 1, 5], [7, 2, 9], 3
    px = enumerate_log_perplexities(model, carrier, alphabet, m, batch_size=4)
    cands = [[alphabet[d] for d in digits] for digits in itertools.product(range(3), repeat=m)]
    assert px == pytest.approx(secret_log_perplexities(model, carrier, cands), abs=1e-4)
    assert secret_index([2, 0, 1], 3) == 19


def test_exposure_by_hand():
    """|R| = 8, Px = [5, 1, 3, 3, 7, 2, 9, 4]: candidate 2 (Px 3) has 2 strictly better -> rank 3 and exposure
    log2 8 - log2 3; the best candidate has exposure log2 8 = 3 bits; a tie does not lower the rank."""
    px = np.array([5, 1, 3, 3, 7, 2, 9, 4], dtype=float)
    assert exact_exposure(px, 2) == {"rank": 3, "exposure": pytest.approx(3 - math.log2(3))}
    assert exact_exposure(px, 3)["rank"] == 3
    assert exact_exposure(px, 1) == {"rank": 1, "exposure": 3.0}


def test_skew_normal_estimate_tracks_the_exact_exposure():
    """On a space small enough to enumerate (10^3), the estimate from every candidate's Px lies within half a bit
    of the exact exposure for secrets of low and of middle rank."""
    model = _tiny(vocab=20, seed=3)
    alphabet = list(range(10, 20))
    px = enumerate_log_perplexities(model, [1, 2, 3, 4], alphabet, 3)
    for q in (0.02, 0.2, 0.5):
        i = int(np.argsort(px)[int(q * len(px))])
        assert estimated_exposure(px, px[i]) == pytest.approx(exact_exposure(px, i)["exposure"], abs=0.5)


def test_summary_by_exposure_and_t_interval_by_hand():
    """Mean and median by exposure count; the t interval of [1, 2, 3] is 2 +- 4.303 * 1 / sqrt(3)."""
    s = summarize_exposures([{"exposures": 4, "exposure": x} for x in (1.0, 2.0, 3.0)] +
                            [{"exposures": 0, "exposure": 0.5}])
    assert s["4"]["mean"] == 2.0 and s["4"]["median"] == 2.0 and s["0"]["ci95"] is None
    half = 4.302652729911275 / math.sqrt(3)
    assert s["4"]["ci95"] == pytest.approx([2 - half, 2 + half])
    assert mean_ci([5.0]) is None
