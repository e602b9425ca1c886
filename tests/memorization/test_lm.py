"""memorization/lm: the one model interface (load, token log-probs, the three request types), each request
checked against a plain Hugging Face forward or an unbatched, uncached loop on a tiny random Llama."""
from __future__ import annotations

import pytest
import torch

from memorization.lm import LM, Sampling, until_tokens, window_spans

VOCAB = 61


def _tiny_llama(seed: int = 0, vocab: int = VOCAB, context: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def model():
    return _tiny_llama()


def _seqs(n: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (int(torch.randint(*lengths, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@torch.no_grad()
def _plain_logprobs(model, seq: list[int]) -> torch.Tensor:
    """``log p(x_t | x_<t)`` for t = 1..n-1 from one unpadded forward of the whole sequence."""
    logits = model(torch.tensor([seq])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(seq[1:])[:, None])[:, 0]


@torch.no_grad()
def _naive_greedy(model, prefix: list[int], n_new: int) -> list[int]:
    """One unbatched forward of the whole sequence per new token: no padding, no KV cache."""
    seq = list(prefix)
    for _ in range(n_new):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prefix):]


def test_loglikelihood_of_a_continuation_is_the_sum_of_its_token_logprobs_under_a_plain_forward(model):
    """``loglikelihood((c, x))`` = Σ_i log p(x_i | c, x_<i) from one plain forward of c + x, and ``is_greedy`` is
    true exactly when every x_i is the argmax (true for the greedy continuation, false after changing a token)."""
    lm = LM(model)
    ctxs = _seqs(5, (3, 20), seed=1)
    conts = _seqs(5, (1, 8), seed=2)
    greedy = _naive_greedy(model, ctxs[0], 4)
    wrong = list(greedy)
    wrong[2] = (wrong[2] + 1) % VOCAB
    requests = list(zip(ctxs, conts)) + [(ctxs[0], greedy), (ctxs[0], wrong)]
    got = lm.loglikelihood(requests, batch_size=3)
    for (c, x), (logp, is_greedy) in zip(requests, got):
        assert logp == pytest.approx(float(_plain_logprobs(model, c + x)[-len(x):].sum()), abs=1e-4)
    assert got[-2][1] and not got[-1][1]


def test_loglikelihood_sees_only_the_last_max_length_plus_one_tokens(model):
    """A request longer than the window is scored on the last ``max_length + 1`` tokens of context + continuation."""
    (c,), x = _seqs(1, (40, 41), seed=3), [5, 6, 7]
    (logp, _), = LM(model).loglikelihood([(c, x)], max_length=10)
    assert logp == pytest.approx(float(_plain_logprobs(model, (c + x)[-11:])[-3:].sum()), abs=1e-4)


def test_rolling_loglikelihood_of_a_text_longer_than_the_context_is_the_sum_over_its_windows(model):
    """A document of 50 tokens in windows of 16, stride 5: the rolling log-likelihood is the sum, over the windows,
    of each window's plain-forward log-probs of the tokens it scores, every token but the first scored once; a
    document that fits one window is the plain forward's sum; one of a single token scores nothing."""
    docs = _seqs(1, (50, 51), seed=4) + _seqs(1, (9, 10), seed=5) + [[7]]
    got = LM(model).loglikelihood_rolling(docs, max_length=16, stride=5, batch_size=2)
    want, scored = 0.0, []
    for b, e, first in window_spans(len(docs[0]), 16, 5):
        want += float(_plain_logprobs(model, docs[0][b:e])[first - 1:].sum())
        scored += list(range(b + first, e))
    assert scored == list(range(1, 50))
    assert got[0][0] == pytest.approx(want, abs=1e-4) and got[0][1] == 49
    assert got[1][0] == pytest.approx(float(_plain_logprobs(model, docs[1]).sum()), abs=1e-4) and got[1][1] == 8
    assert got[2] == (0.0, 0)


def test_greedy_generate_until_with_the_kv_cache_equals_the_argmax_loop_and_stops_at_the_stop_sequence(model):
    """Greedy decoding with the KV cache gives the tokens of an argmax loop without cache; with a stop sequence
    taken from that output (or the end-of-text token) a row keeps exactly the tokens before its first occurrence."""
    prefixes = _seqs(3, (4, 15), seed=6)
    lm = LM(model)
    naive = [_naive_greedy(model, p, 10) for p in prefixes]
    assert lm.generate_until(prefixes, 10, batch_size=3) == naive
    stop = naive[0][4:6]
    first = next(i for i in range(9) if naive[0][i:i + 2] == stop)
    cut = lm.generate_until(prefixes[:1], 10, until=until_tokens([stop]))
    assert cut == [naive[0][:first]]
    eos = naive[1][3]
    assert lm.generate_until(prefixes[1:2], 10, until=until_tokens([], eos_id=eos)) == [naive[1][:naive[1].index(eos)]]


def test_batched_equals_one_at_a_time_with_left_and_right_padding(model):
    """Sequences of different lengths batched together (right padding for log-probs, left padding and position
    ids for decoding) give what each gives alone."""
    lm = LM(model)
    seqs = _seqs(5, (3, 25), seed=7)
    logp, _, valid = lm.token_logprobs(seqs)
    for b, s in enumerate(seqs):
        alone, _, v = lm.token_logprobs([s])
        assert valid[b].sum() == len(s) - 1 and v.all()
        torch.testing.assert_close(logp[b, :len(s) - 1], alone[0], atol=1e-5, rtol=1e-5)
    requests = [(s[:-2], s[-2:]) for s in seqs]
    together, apart = lm.loglikelihood(requests, batch_size=5), [lm.loglikelihood([r])[0] for r in requests]
    assert [g for _, g in together] == [g for _, g in apart]
    assert [x for x, _ in together] == pytest.approx([x for x, _ in apart], abs=1e-5)
    assert lm.generate_until(seqs, 6, batch_size=5) == [lm.generate_until([s], 6)[0] for s in seqs]


def test_sampling_draws_depend_on_the_row_seed_alone_and_a_one_token_nucleus_is_greedy(model):
    """Seeded sampling gives a row the same tokens in any batch, at any place in the call; another seed other
    tokens; a nucleus so small it keeps one token (or top-k 1) is greedy decoding."""
    lm = LM(model)
    prefixes = _seqs(4, (4, 12), seed=8)
    hot = Sampling(temperature=5.0)
    seeds = [11, 22, 33, 44]
    together = lm.generate_until(prefixes, 6, sampling=hot, seeds=seeds, batch_size=4)
    reversed_ = lm.generate_until(prefixes[::-1], 6, sampling=hot, seeds=seeds[::-1], batch_size=3)
    assert together == reversed_[::-1]
    assert lm.generate_until(prefixes, 6, sampling=hot, seeds=[s + 1 for s in seeds]) != together
    greedy = lm.generate_until(prefixes, 6)
    for one in (Sampling(1.0, top_p=1e-6), Sampling(1.0, top_k=1)):
        assert lm.generate_until(prefixes, 6, sampling=one, seeds=seeds) == greedy
    with pytest.raises(ValueError, match="one seed per prefix"):
        lm.generate_until(prefixes, 6, sampling=hot)


def test_shared_prefills_and_rows_leaving_their_batch_change_no_sample_and_shrink_the_forwards(model):
    """Three prompts x three samples each (equal prefixes, own seeds) in one batch, each row done at its own step
    (after 2 + its row number mod 4 tokens): every sample equals the one decoded alone (batch 1: nothing shared,
    nothing dropped); the prefill runs the 3 distinct prefixes once, and each step's forward holds only the rows
    still going."""
    lm = LM(model)
    prompts = _seqs(3, (4, 12), seed=9)
    prefixes = [p for p in prompts for _ in range(3)]
    seeds = list(range(100, 109))
    hot = Sampling(temperature=3.0, top_p=0.9)

    def until(tokens: list[int]) -> int | None:  # row r (known by its first token draw) keeps 2 + r % 4 tokens
        return len(tokens) if len(tokens) >= want[tuple(tokens[:1])] else None

    alone = [lm.generate_until([p], 8, sampling=hot, seeds=[s])[0] for p, s in zip(prefixes, seeds)]
    assert len({tuple(a[:1]) for a in alone}) >= 3
    want = {}
    for r, a in enumerate(alone):  # a row is known by its first token; rows sharing one keep the shortest length
        want[tuple(a[:1])] = min(want.get(tuple(a[:1]), 99), 2 + r % 4)
    expected = [a[:want[tuple(a[:1])]] for a in alone]
    batch_sizes = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: batch_sizes.append(kw["input_ids"].shape),
                                           with_kwargs=True)
    try:
        got = lm.generate_until(prefixes, 8, until=until, sampling=hot, seeds=seeds, batch_size=9)
    finally:
        hook.remove()
    assert got == expected
    assert batch_sizes[0][0] == 3 and batch_sizes[1][0] == 9
    rows = [b for b, _ in batch_sizes[1:]]
    assert rows == sorted(rows, reverse=True) and rows[-1] < 9
    assert len(batch_sizes) - 1 == max(len(e) for e in expected) - 1


def test_load_gives_the_saved_model_in_one_process_as_rank_0_of_1(model, tmp_path):
    """``LM.load`` of a saved HF directory holds the same weights (same log-probs), on rank 0 of a world of 1;
    without tokenizer files it refuses unless a tokenizer is optional."""
    from memorization.evaluation.eval_model import MissingTokenizerError

    model.save_pretrained(tmp_path)
    with pytest.raises(MissingTokenizerError, match="no tokenizer"):
        LM.load(tmp_path, device="cpu")
    lm = LM.load(tmp_path, device="cpu", dtype="float32", require_tokenizer=False)
    assert (lm.rank, lm.world_size, lm.replicas, lm.tokenizer, lm.context) == (0, 1, 1, None, 64)
    seq = _seqs(1, (20, 21), seed=9)
    torch.testing.assert_close(lm.token_logprobs(seq)[0][0], _plain_logprobs(model, seq[0]))


def test_batched_kv_cache_decoding_equals_per_document_generate():
    """(Moved from test_extraction.) Batched decoding with left padding gives HF ``generate``'s greedy tokens
    document by document, and passes the KV cache by the name ``forward`` takes (no deprecation warning)."""
    import warnings

    model = _tiny_llama(seed=1, vocab=101, context=256)
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(1, 101, (20 + 7 * i,), generator=g).tolist() for i in range(6)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batched = LM(model).generate_until(prefixes, 12, batch_size=6, pad_id=0)
    assert not [w for w in caught if "deprecated" in str(w.message)], "the KV cache goes by the name forward takes"
    model.generation_config.eos_token_id = None  # extraction never stops early (and never bans EOS)
    for p, b in zip(prefixes, batched):
        ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert ref[0, len(p):].tolist() == b


def test_prefill_computes_last_position_logits_only_and_changes_no_generation():
    """(Moved from test_extraction.) The prefill forward computes the LM head on the last position only, and
    the generated tokens are the unbatched, uncached argmax loop's."""
    model = _tiny_llama(seed=2, vocab=101, context=256)
    g = torch.Generator().manual_seed(3)
    prefixes = [torch.randint(1, 101, (15 + 9 * i,), generator=g).tolist() for i in range(5)]  # longest 51
    seq_lens = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seq_lens.append(out.shape[1]))
    try:
        batched = LM(model).generate_until(prefixes, 6, batch_size=5, pad_id=0)
    finally:
        hook.remove()
    assert seq_lens == [1] * 6  # the prefill (51 positions) included: batch x 1 x vocab, not x 51
    assert batched == [_naive_greedy(model, p, 6) for p in prefixes]
