"""memorization/lm/kv_cache.py: the KV cache written in place holds what transformers' DynamicCache holds -- the same
keys and values after every update, row selection, repeat and crop -- so decoding with it gives the same logits at
every step, with left padding, shared prefills and rows leaving the batch; and it stops copying the cache at every
step (no buffer is reallocated while the room lasts)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer

from memorization.lm import decoding
from memorization.lm.kv_cache import GrowingCache, GrowingLayer


def test_a_growing_layer_holds_what_a_dynamic_layer_holds_through_every_operation():
    """Prefill, single-token steps past its room (the buffer doubles), row reorders with repeats, boolean and index
    selection, repeat_interleave and crop: keys and values equal DynamicLayer's exactly after each."""
    g = torch.Generator().manual_seed(0)
    ours, ref = GrowingLayer(room=3), DynamicLayer()
    kv = lambda b, n: (torch.randn(b, 2, n, 4, generator=g), torch.randn(b, 2, n, 4, generator=g))  # noqa: E731

    def same():
        assert ours.get_seq_length() == ref.get_seq_length()
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values)

    for step, n in enumerate((5, 1, 1, 1, 1, 2, 1)):  # 5 + 3 fit the room; the 9th position doubles the buffer
        k, v = kv(3, n)
        got, want = ours.update(k, v), ref.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        same()
    buffer = ours._k
    ours.reorder_cache(torch.tensor([2, 0, 0])), ref.reorder_cache(torch.tensor([2, 0, 0]))
    same()
    keep = torch.tensor([True, False, True])
    ours.batch_select_indices(keep), ref.batch_select_indices(keep)
    same()
    ours.batch_repeat_interleave(2), ref.batch_repeat_interleave(2)
    same()
    ours.crop(-3), ref.crop(-3)
    same()
    k, v = kv(4, 1)
    ours.update(k, v), ref.update(k, v)
    same()
    assert buffer.data_ptr() != ours._k.data_ptr()  # selections made new buffers; updates wrote into them


def test_steps_within_the_room_write_into_one_buffer():
    """The point of the cache: a decoding step within the reserved room reallocates nothing."""
    layer = GrowingLayer(room=4)
    layer.update(torch.zeros(2, 1, 3, 8), torch.zeros(2, 1, 3, 8))
    ptr = layer._k.data_ptr()
    for _ in range(4):
        layer.update(torch.ones(2, 1, 1, 8), torch.ones(2, 1, 1, 8))
        assert layer._k.data_ptr() == ptr
    assert layer.keys.shape == (2, 1, 7, 8) and layer.keys[:, :, 3:].eq(1).all()


@pytest.mark.parametrize("share", [False, True], ids=["own-prefills", "shared-prefills"])
def test_decoding_with_it_gives_dynamic_caches_logits_at_every_step(share):
    """decode() with the growing cache (its default) and with the model's own DynamicCache: the same logits, bit
    for bit, at every step of every row, on a GQA model with left-padded prefixes of different lengths, repeated
    prefixes sharing one prefill, and rows leaving the batch as they finish."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    g = torch.Generator().manual_seed(1)
    prefixes = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (4, 9, 9, 13, 2, 13)]
    prefixes[2], prefixes[5] = prefixes[1], prefixes[3]

    def run(grow: bool):
        seen, caches = [], []

        def pick(logits, rows):
            seen.append(logits.clone())
            return logits.argmax(-1, keepdim=True)

        stop = lambda gen, rows: [r % 2 == 0 and gen.shape[1] >= 5 for r in rows]  # noqa: E731
        saved = decoding.growing_cache
        if not grow:
            decoding.growing_cache = lambda *a: {}
        try:
            out = decoding.decode(model, prefixes, 12, batch_size=4, pick=pick, stop=stop, share_prefixes=share,
                                  on_cache=caches.append)
        finally:
            decoding.growing_cache = saved
        assert caches and all(isinstance(c, GrowingCache) == grow for c in caches)  # the cache decode really used
        return out, seen

    (got, got_logits), (want, want_logits) = run(True), run(False)
    assert got == want and [len(x) for x in got].count(12) == 3
    assert len(got_logits) == len(want_logits) and all(torch.equal(a, b) for a, b in zip(got_logits, want_logits))
