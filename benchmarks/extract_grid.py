#!/usr/bin/env python
"""Extraction on a grid: tokens/s and memory per rank on 1, 2 and 4 CPU ranks, the same model and documents.

Each grid runs under ``torchrun`` (gloo) and extracts the same documents with
:func:`memorization.evaluation.extraction.extract_on_grid` (prefix P, S greedy tokens, batched with the KV cache) from
the same randomly initialised preset built sharded on the grid.  Printed per grid: the generated tokens per second
(documents x S / wall time of the extraction, after one warm-up document), the model's bytes on each rank (its
weight shards: falling as 1 / (row x column x depth)), the peak resident memory of the largest rank, and whether
every grid generated the tokens the 1-rank run did.

    python benchmarks/extract_grid.py                      # 160m, 32 documents, P = 32, S = 32
    python benchmarks/extract_grid.py --size tiny --docs 8 # a quick look

Each rank uses one torch thread.  On a machine with fewer cores than ranks (4 ranks on 2 cores) the ranks share
them, so tokens/s there shows the cost of the collectives rather than a speedup; memory per rank is what the grid
is for.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from axonn.grid_shape import GridShape  # noqa: E402
from benchmarks.common import torchrun_result  # noqa: E402

GRIDS = ("1,1,1,1", "2,1,1,1", "1,2,1,1", "4,1,1,1", "1,4,1,1", "1,2,2,1", "1,1,2,2")


def worker(a: argparse.Namespace) -> None:
    import torch

    from memorization.evaluation.extraction import ExtractionConfig, extract_on_grid
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime.create(GridShape.parse(a.grid))
    torch.set_num_threads(1)  # one core per rank: the grids differ in ranks only
    model = build_model(a.size, a.vocab, seed=0, runtime=rt).eval()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    docs = [{"id": f"d{i}", "token_ids": torch.randint(3, a.vocab, (a.prefix + a.suffix,), generator=g).tolist()}
            for i in range(a.docs)]
    cfg = ExtractionConfig(prefix_len=a.prefix, suffix_len=a.suffix, batch_size=a.batch)
    extract_on_grid(model, docs[:1], rt.grid, cfg)  # warm-up
    rt.barrier()
    t0 = time.perf_counter()
    res = extract_on_grid(model, docs, rt.grid, cfg)
    rt.barrier()
    seconds = time.perf_counter() - t0
    gen = [r["generated_ids"] for r in res["documents"]]
    stats = torch.tensor([weights, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024], dtype=torch.float64)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rt.is_main:
        print("RESULT " + json.dumps({
            "grid": a.grid, "ranks": rt.grid.world_size, "seconds": seconds,
            "tokens_per_s": a.docs * a.suffix / seconds,
            "weights_per_rank": stats[0].item(), "peak_rss": stats[1].item(),
            "tokens_sha": hashlib.sha256(json.dumps(gen).encode()).hexdigest()[:12]}), flush=True)


def main() -> None:
    from axonn.cli import HelpFormatter

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="160m", help="model preset, randomly initialised (default: 160m)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary size (default: 32000)")
    p.add_argument("--docs", type=int, default=32, help="documents (default: 32)")
    p.add_argument("--prefix", type=int, default=32, help="prefix tokens P (default: 32)")
    p.add_argument("--suffix", type=int, default=32, help="greedy tokens S per document (default: 32)")
    p.add_argument("--batch", type=int, default=16, help="documents decoded together per replica (default: 16)")
    p.add_argument("--grids", default=";".join(GRIDS), help=f"';'-separated D,R,C,Z grids (default: {';'.join(GRIDS)})")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--grid", default="1,1,1,1", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    rows = []
    for grid in a.grids.split(";"):
        try:
            n = GridShape.parse(grid).size
        except ValueError as e:
            p.error(f"--grids: {e}")
        rows.append(torchrun_result(__file__, n, [
            "--worker", "--grid", grid, "--size", a.size, "--vocab", str(a.vocab), "--docs", str(a.docs),
            "--prefix", str(a.prefix), "--suffix", str(a.suffix), "--batch", str(a.batch)]))
        print(f"  {grid}: {rows[-1]['tokens_per_s']:.1f} tokens/s", file=sys.stderr, flush=True)
    base = rows[0]
    print(f"Extraction of {a.docs} documents (P = {a.prefix}, S = {a.suffix}, batch {a.batch}), {a.size} fp32, "
          f"{os.cpu_count()} CPU cores, gloo\n")
    print("| grid D,R,C,Z | ranks | tokens/s | vs 1 rank | weights per rank (MiB) | vs 1 rank | peak RSS, largest "
          "rank (MiB) | tokens = 1 rank's |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['grid']} | {r['ranks']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}"
              f" | {r['weights_per_rank'] / 2**20:.0f} | {r['weights_per_rank'] / base['weights_per_rank']:.2f} | "
              f"{r['peak_rss'] / 2**20:.0f} | {'yes' if r['tokens_sha'] == base['tokens_sha'] else 'no'} |")


if __name__ == "__main__":
    main()
