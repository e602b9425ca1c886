#!/usr/bin/env python
"""Decoding with the KV cache written in place (``memorization.lm.kv_cache.GrowingCache``, the decoder's) against
transformers' ``DynamicCache``, which copies the whole cache at every step: the same model, prefixes and tokens.

``memorization.lm.decoding.decode`` runs the batch both ways in turns (``--rounds`` each, the order alternating;
medians), greedy, and prints the seconds, the decoded tokens per second, the ratio, and whether both gave the same
tokens (they must: the growing cache returns the values ``torch.cat`` would).  The prefill is the same work both
ways and is timed separately (one forward of the prefixes) so that the decoding steps can be read alone; the
cache's ``update`` alone, at the run's middle length, is timed first.

    python benchmarks/kv_cache.py --init "$(python data/models/get.py smollm2-135m)"   # 8 x (512 + 512) tokens
    python benchmarks/kv_cache.py --size tiny --prefix 64 --new 64                      # a quick look
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from memorization.lm import decoding  # noqa: E402
from memorization.training.models import build_model, model_config  # noqa: E402


def run(model, prefixes, new: int, batch: int, grow: bool) -> tuple[float, list[list[int]]]:
    """Seconds and tokens of one ``decode`` of ``prefixes``; ``grow=False`` lets the model make its DynamicCache."""
    saved = decoding.growing_cache
    if not grow:
        decoding.growing_cache = lambda *a: {}
    try:
        t0 = time.perf_counter()
        out = decoding.decode(model, prefixes, new, batch_size=batch)
        return time.perf_counter() - t0, out
    finally:
        decoding.growing_cache = saved


def update_ms(layer_factory, batch: int, kv_heads: int, head_dim: int, length: int, layers: int,
              steps: int = 32) -> float:
    """Milliseconds a decoding step spends in the cache's ``update`` alone: ``layers`` layers holding ``length``
    positions of ``batch`` rows, one position appended to each per step."""
    cache = [layer_factory() for _ in range(layers)]
    for layer in cache:
        layer.update(torch.randn(batch, kv_heads, length, head_dim), torch.randn(batch, kv_heads, length, head_dim))
    new = torch.randn(batch, kv_heads, 1, head_dim)
    t0 = time.perf_counter()
    for _ in range(steps):
        for layer in cache:
            layer.update(new, new)
    return (time.perf_counter() - t0) / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--init", default=None, metavar="DIR", help="a pretrained HF checkpoint (default: the preset)")
    p.add_argument("--size", default="tiny", help="model preset when no --init (default: tiny)")
    p.add_argument("--prefix", type=int, default=512, help="prefix tokens per row (default: 512)")
    p.add_argument("--new", type=int, default=512, help="tokens decoded per row (default: 512)")
    p.add_argument("--batch", type=int, default=8, help="rows decoded together (default: 8)")
    p.add_argument("--rounds", type=int, default=2, help="timed decodes per cache (default: 2)")
    a = p.parse_args()
    if min(a.prefix, a.new, a.batch, a.rounds) < 1:
        p.error("--prefix, --new, --batch and --rounds must be >= 1")
    config = model_config(None, 0, init=a.init) if a.init else model_config(a.size, 4096)
    vocab = config.vocab_size
    from transformers.cache_utils import DynamicLayer

    from memorization.lm.kv_cache import GrowingLayer

    kv, hd = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    shape = (a.batch, kv, hd, a.prefix + a.new // 2, config.num_hidden_layers)
    copy_ms = update_ms(DynamicLayer, *shape)
    grow_ms = update_ms(lambda: GrowingLayer(room=64), *shape)
    print(f"cache update alone, one step of {a.batch} rows at {a.prefix + a.new // 2} positions "
          f"({config.num_hidden_layers} layers, {kv} KV heads of {hd}): DynamicCache {copy_ms:.1f} ms, "
          f"GrowingCache {grow_ms:.1f} ms ({copy_ms / grow_ms:.0f}x)")
    model = build_model(None if a.init else a.size, vocab, init=a.init, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(3, vocab, (a.prefix,), generator=g).tolist() for _ in range(a.batch)]
    with torch.no_grad():
        t0 = time.perf_counter()
        model(torch.tensor(prefixes), logits_to_keep=1)
        prefill = time.perf_counter() - t0
    times: dict[bool, list[float]] = {True: [], False: []}
    outs = {}
    for r in range(a.rounds):
        for grow in ((True, False) if r % 2 == 0 else (False, True)):
            s, outs[grow] = run(model, prefixes, a.new, a.batch, grow)
            times[grow].append(s)
    med = {k: statistics.median(v) for k, v in times.items()}
    toks = a.batch * a.new
    print(f"{a.init or a.size}: {a.batch} rows x ({a.prefix} prefix + {a.new} decoded) tokens, greedy, "
          f"{torch.get_num_threads()} threads; prefill alone {prefill:.1f} s\n")
    print("| cache | seconds (median) | decoding seconds (less the prefill) | decoded tokens/s |")
    print("|---|---|---|---|")
    for grow, name in ((False, "DynamicCache (torch.cat every step)"), (True, "GrowingCache (written in place)")):
        dec = med[grow] - prefill
        print(f"| {name} | {med[grow]:.1f} | {dec:.1f} | {toks / dec:.1f} |")
    print(f"\nspeedup: {med[False] / med[True]:.2f}x overall, "
          f"{(med[False] - prefill) / (med[True] - prefill):.2f}x in the decoding steps; "
          f"same tokens: {'yes' if outs[True] == outs[False] else 'NO'}")


if __name__ == "__main__":
    main()
