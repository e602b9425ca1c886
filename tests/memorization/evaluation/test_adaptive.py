"""Adaptive extraction: batched KV-cache beam search against exhaustive search and against a literal one-prefix
beam search on a tiny vocabulary, and hint counting against the literal step-by-step teacher-forced greedy loop."""
import itertools

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memorization.evaluation.adaptive import beam_continue, hint_counts, hint_stats


def _tiny(vocab: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper distributions than the default init: fewer near-ties
        model.lm_head.weight.mul_(20)
    return model


def _seq_logprobs(model, prefix: list[int], conts: list[list[int]]) -> list[float]:
    """log p(c | prefix) of every continuation ``c`` (equal lengths), one unpadded forward for all."""
    ids = torch.tensor([prefix + c for c in conts])
    with torch.no_grad():
        lp = model(input_ids=ids).logits.float().log_softmax(-1)
    P, S = len(prefix), len(conts[0])
    picked = lp[:, P - 1:P - 1 + S].gather(-1, ids[:, P:].unsqueeze(-1)).squeeze(-1)
    return picked.sum(-1).tolist()


def _literal_beam(model, prefix: list[int], n_new: int, beam: int) -> list[list[int]]:
    """Beam search by its definition, one prefix, full forwards without a cache."""
    beams = [([], 0.0)]
    for _ in range(n_new):
        cands = []
        for b, (toks, s) in enumerate(beams):
            with torch.no_grad():
                lp = model(input_ids=torch.tensor([prefix + toks])).logits[0, -1].float().log_softmax(-1)
            cands += [(s + float(lp[v]), b, v) for v in range(lp.numel())]
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        beams = [(beams[b][0] + [v], s) for s, b, v in cands[:beam]]
    return [t for t, _ in beams]


def test_beam_search_with_width_v_pow_s_minus_1_equals_exhaustive_top_b():
    """With B = V^(S-1) nothing is pruned before the last step: the B beams are the B most likely of all V^S
    continuations (exhaustive enumeration), in order, with their log-probabilities, for every prefix of a
    left-padded batch."""
    V, S = 5, 3
    B = V ** (S - 1)
    model = _tiny(V)
    prefixes = [[1, 2, 3, 4], [2], [0, 4, 4]]
    got = beam_continue(model, prefixes, S, B, batch_size=2)
    for p, beams in zip(prefixes, got):
        conts = [list(c) for c in itertools.product(range(V), repeat=S)]
        every = sorted(zip(_seq_logprobs(model, p, conts), conts), key=lambda x: -x[0])
        assert [t for t, _ in beams] == [c for _, c in every[:B]]
        assert [s for _, s in beams] == pytest.approx([s for s, _ in every[:B]], abs=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_batched_beam_search_equals_literal_beam_search(beam):
    """Narrow beams (pruning at every step): the batched KV-cache search returns what the definition's
    one-prefix, cache-free search returns; width 1 is greedy decoding."""
    V, S = 7, 4
    model = _tiny(V, seed=1)
    prefixes = [[1, 2, 3], [6], [5, 0, 2, 2, 1]]
    got = beam_continue(model, prefixes, S, beam, batch_size=3)
    for p, beams in zip(prefixes, got):
        assert [t for t, _ in beams] == _literal_beam(model, p, S, beam)


def test_beam_wider_than_the_candidates_keeps_only_live_beams():
    """A beam wider than V^S returns the V^S continuations, none of log-prob -inf."""
    model = _tiny(3)
    (beams,) = beam_continue(model, [[0, 1]], 2, 20)
    assert len(beams) == 9 and len({tuple(t) for t, _ in beams}) == 9


def _literal_hints(model, prefix: list[int], suffix: list[int]) -> tuple[int, int]:
    """Greedy decoding given the true token whenever it errs: count the hints and the longest verbatim run."""
    ctx, hints, run, best = list(prefix), 0, 0, 0
    for s in suffix:
        with torch.no_grad():
            g = int(model(input_ids=torch.tensor([ctx])).logits[0, -1].argmax())
        if g == s:
            run += 1
            ctx.append(g)
        else:
            hints, run = hints + 1, 0
            ctx.append(s)  # the hint
        best = max(best, run)
    return hints, best


def test_hint_counts_equal_the_step_by_step_hinted_greedy_loop():
    """One teacher-forced forward per batch counts the same hints and longest runs as the literal loop."""
    V = 6
    model = _tiny(V, seed=2)
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 5, 1, 4)]
    suffixes = [torch.randint(0, V, (8,), generator=g).tolist() for _ in prefixes]
    # one suffix the model's own greedy continuation: no hints, a full-length run
    ctx = list(prefixes[0])
    for _ in range(8):
        with torch.no_grad():
            ctx.append(int(model(input_ids=torch.tensor([ctx])).logits[0, -1].argmax()))
    suffixes[0] = ctx[len(prefixes[0]):]
    got = hint_counts(model, prefixes, suffixes, batch_size=3)
    for p, s, h in zip(prefixes, suffixes, got):
        assert (h["hints"], h["longest_run"]) == _literal_hints(model, p, s)
    assert got[0] == {"hints": 0, "longest_run": 8}


def test_hint_stats_by_hand():
    """Hand-computed: hits T T F T T T F -> 2 hints, longest run 3."""
    assert hint_stats([True, True, False, True, True, True, False]) == {"hints": 2, "longest_run": 3}
    assert hint_stats([]) == {"hints": 0, "longest_run": 0}
