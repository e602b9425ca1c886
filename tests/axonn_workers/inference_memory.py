"""What each rank really holds when it evaluates on a grid: for the HF checkpoints in $MODELS (``name=dir``,
comma-separated) and the grids of $GRIDS (``name:D,R,C,Z;...``), the model loaded as the eval CLIs load it
(:func:`memorization.evaluation.eval_model.load_on_grid`), the bytes of its parameters, and the bytes of the KV cache
the extractor's decoder (:meth:`memorization.lm.LM.generate_until`) holds after a batch, in fp32 and under
CPU bf16 autocast (the GPU recipe's dtypes).  Each rank writes ``$OUT_DIR/rank<r>.json``."""
from __future__ import annotations

import json
import os

import torch

from memorization.evaluation.eval_model import load_on_grid
from memorization.lm import LM, cache_nbytes
from memorization.training.runtime import Runtime

BATCH, PREFIX, NEW = 3, 10, 6
models = dict(item.split("=", 1) for item in os.environ["MODELS"].split(","))
out: dict = {}
for item in os.environ["GRIDS"].split(";"):
    name, grid = item.split(":")
    g = tuple(int(x) for x in grid.split(","))
    rt = Runtime.create(*g)
    model, _ = load_on_grid(models[name], rt)
    vocab = model.config.vocab_size
    prefixes = torch.randint(3, vocab, (BATCH, PREFIX), generator=torch.Generator().manual_seed(0)).tolist()
    kv = {}
    for dtype, ctx in (("fp32", torch.autocast("cpu", enabled=False)),
                       ("bf16", torch.autocast("cpu", dtype=torch.bfloat16))):
        sizes: list[int] = []
        with ctx:
            LM(model).generate_until(prefixes, NEW, batch_size=BATCH, on_cache=lambda c: sizes.append(cache_nbytes(c)))
        kv[dtype] = sizes
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    out.setdefault(name, {})[grid] = {"params": params, "kv": kv, "vocab": vocab,
                                      "cached_positions": PREFIX + NEW - 1, "batch": BATCH}
    rt.grid.destroy()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(out, f)
