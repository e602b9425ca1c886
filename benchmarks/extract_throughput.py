#!/usr/bin/env python
"""Extraction speed: our batched KV-cache greedy decoder against a per-document HF ``generate`` loop,
on the same model and documents (prefix P -> S new tokens).

    python benchmarks/extract_throughput.py                       # GPU: 1b preset, 128 documents, bf16
    python benchmarks/extract_throughput.py --size tiny --docs 32  # CPU
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from benchmarks.common import device, sync  # noqa: E402
from memorization.lm import LM  # noqa: E402
from memorization.training.models import build_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default=None, help="preset (default: 1b on GPU, tiny on CPU)")
    p.add_argument("--docs", type=int, default=128, help="documents")
    p.add_argument("--prefix", type=int, default=50, help="prefix tokens P given to the model")
    p.add_argument("--suffix", type=int, default=50, help="suffix tokens S generated greedily")
    p.add_argument("--batch", type=int, default=64, help="documents decoded together")
    a = p.parse_args()
    dev = device()
    size = a.size or ("1b" if dev.type == "cuda" else "tiny")
    model = build_model(size, 32000, seed=0).to(dev)
    if dev.type == "cuda":
        model = model.to(torch.bfloat16)
    model.eval()
    model.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(0)
    prefixes = [torch.randint(3, 32000, (a.prefix,), generator=g).tolist() for _ in range(a.docs)]
    lm = LM(model)
    lm.generate_until(prefixes[: a.batch], 4, batch_size=a.batch)  # warm-up
    with torch.no_grad():  # and the generate loop's: its first call's set-up and batch-1 kernels are not timed either
        model.generate(torch.tensor([prefixes[0]], device=dev), max_new_tokens=4, do_sample=False, pad_token_id=0)
    sync(dev)
    t0 = time.perf_counter()
    batched = lm.generate_until(prefixes, a.suffix, batch_size=a.batch)
    sync(dev)
    t_batched = time.perf_counter() - t0
    t0 = time.perf_counter()
    loop = []
    with torch.no_grad():
        for pr in prefixes:
            out = model.generate(torch.tensor([pr], device=dev), max_new_tokens=a.suffix, do_sample=False,
                                 pad_token_id=0)
            loop.append(out[0, a.prefix :].tolist())
    sync(dev)
    t_loop = time.perf_counter() - t0
    agree = sum(x == y for x, y in zip(batched, loop)) / a.docs
    print(f"device {dev}, size {size}, {a.docs} documents, prefix {a.prefix} -> {a.suffix} tokens")
    print(f"per-document generate loop : {t_loop:8.2f} s  {a.docs / t_loop:8.1f} docs/s")
    print(f"batched KV-cache (batch {a.batch}): {t_batched:8.2f} s  {a.docs / t_batched:8.1f} docs/s")
    print(f"speedup = {t_loop / t_batched:.1f}x  (target >= 10x); identical continuations: {agree:.0%}")


if __name__ == "__main__":
    main()
