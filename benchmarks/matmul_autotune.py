"""When does matmul layout autotuning pay?  Every layout variant of the Linear's three products, side by side.

    python benchmarks/matmul_autotune.py                       # CPU: fp32, tiny/mini/1b, m=128,512
    python benchmarks/matmul_autotune.py --presets 1b,8b --m 2048,8192   # GPU: bf16 by default
    python benchmarks/matmul_autotune.py --tp 2,2 --write-cache          # local shapes of a 2x2 row x col grid

For each preset, the Linear weight shapes ``n × k`` (out × in) of a Llama block
(q, o, k/v, gate/up, down; ``--lm-head`` adds the output head), divided by the
tensor-parallel sizes ``--tp Gr,Gc`` (out over row, in over col; o and down, transposed Linears, the
other way round), and each
``m`` (tokens on the rank), times every variant of ``fwd`` (X Wᵀ), ``dgrad``
(dY W) and ``wgrad`` (dYᵀ X) with :meth:`MatmulTuner.time_variants`
(warm-up, then ``--reps`` round-robin rounds over the variants, median; on CUDA each sample is the
device time of 10 back-to-back calls between CUDA events, not one synchronised call's launch + sync
overhead).  Columns: microseconds per variant, the winner, ``ref/best`` (speed-up of tuning over the layer's default
call: this is "when it pays") and ``worst/best`` (the spread between layouts).
``--write-cache`` merges the winners into the autotune cache (pre-tuning a run).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from axonn.cli import HelpFormatter  # noqa: E402
from axonn.intra_layer import autotune as at  # noqa: E402
from axonn.presets import get_preset  # noqa: E402


def linear_shapes(preset: str, lm_head: bool, tp: tuple[int, int]) -> list[tuple[str, int, int]]:
    """Unique (names, n, k) of the preset's Linear weights, local to a row x col rank.

    As :func:`axonn.parallelize` shards them: q, k, v, gate, up and lm_head split out over row and in over
    col; o_proj and down_proj are transposed Linears (out over col, in over row)."""
    s = get_preset(preset)
    h, kv, heads = s.hidden, s.kv_heads * s.head_dim, s.heads * s.head_dim
    full = [("q", heads, h, False), ("o", h, heads, True), ("k,v", kv, h, False), ("gate,up", s.ffn, h, False),
            ("down", h, s.ffn, True)]
    if lm_head:
        full.append(("lm_head", s.vocab, h, False))
    gr, gc = tp
    out = []
    for name, n, k, transpose in full:
        g_out, g_in = (gc, gr) if transpose else (gr, gc)
        if n % g_out or k % g_in:
            continue
        out.append((name, n // g_out, k // g_in))
    merged: dict[tuple[int, int], list[str]] = {}  # one entry per local shape (q and o on a square grid)
    for name, n, k in out:
        merged.setdefault((n, k), []).append(name)
    return [(",".join(names), n, k) for (n, k), names in merged.items()]


def main(argv=None) -> int:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--presets", default="1b,8b" if cuda else "tiny,mini,1b",
                   help="model-shape presets whose Linear shapes are timed, comma list "
                   "(default 1b,8b on GPU, tiny,mini,1b on CPU)")
    p.add_argument("--m", default="512,2048,8192" if cuda else "128,512", help="tokens per rank, comma list")
    p.add_argument("--dtype", default="bfloat16" if cuda else "float32",
                   help="operand dtype (default bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--device", default="cuda" if cuda else "cpu", help="torch device (default cuda when available)")
    p.add_argument("--tp", default="1,1", help="Gr,Gc: divide out by Gr and in by Gc (local shapes)")
    p.add_argument("--ops", default="fwd,dgrad,wgrad",
                   help="products to time: fwd (X W^T), dgrad (dY W), wgrad (dY^T X)")
    p.add_argument("--lm-head", action="store_true", help="include the (large) output head")
    p.add_argument("--reps", type=int, default=10 if cuda else 3,
                   help="timed round-robin rounds per variant; the median is reported")
    p.add_argument("--warmup", type=int, default=3 if cuda else 1, help="untimed calls per variant first")
    p.add_argument("--write-cache", action="store_true", help="merge the winners into the autotune cache")
    args = p.parse_args(argv)

    dev, dtype = torch.device(args.device), getattr(torch, args.dtype)
    tp = tuple(int(v) for v in args.tp.split(","))
    ms = [int(v) for v in args.m.split(",")]
    ops = args.ops.split(",")
    print(f"# device {at.device_name(dev)}  dtype {args.dtype}  tp {tp}  reps {args.reps} (median)")
    header = f"{'preset':6} {'layer':8} {'op':5} {'m':>6} {'n':>6} {'k':>6}  variants (us)"
    print(header)
    gains, seen = [], set()
    tuner = at.MatmulTuner(warmup=args.warmup, reps=args.reps) if args.write_cache else None
    new_entries = {}
    for preset in args.presets.split(","):
        for name, n, k in linear_shapes(preset, args.lm_head, tp):
            for m in ms:
                for op in ops:
                    if (op, m, n, k) in seen:
                        continue
                    seen.add((op, m, n, k))
                    a, b = at.operands(op, m, n, k, dtype, dev)
                    ttuner = tuner or at.MatmulTuner(persist=False)
                    times = ttuner.time_variants(op, a, b, warmup=args.warmup, reps=args.reps)
                    best = min(times, key=times.get)
                    ref = times[at.REFERENCE[op]]
                    worst = max(times.values())
                    gains.append(ref / times[best])
                    cols = "  ".join(f"{v}={t * 1e6:9.1f}" for v, t in times.items())
                    tflops = 2 * m * n * k / times[best] / 1e12
                    print(f"{preset:6} {name:8} {op:5} {m:6d} {n:6d} {k:6d}  {cols}  | best {best:8} "
                          f"ref/best {ref / times[best]:5.2f}  worst/best {worst / times[best]:5.2f}  "
                          f"{tflops:6.2f} TFLOP/s", flush=True)
                    if args.write_cache:
                        new_entries[at.make_key(op, m, n, k, dtype, dev)] = {
                            "best": best, "us": {v: round(t * 1e6, 2) for v, t in times.items()}}
                    del a, b
    if gains:
        pays = sum(g > 1.05 for g in gains)
        print(f"# tuning beats the default layout by >5% on {pays}/{len(gains)} products; "
              f"geomean ref/best {torch.tensor(gains).log().mean().exp().item():.3f}, max {max(gains):.2f}")
    if args.write_cache and new_entries:
        at.merge_into_cache(tuner.cache_path, new_entries)
        print(f"# wrote {len(new_entries)} entries to {tuner.cache_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
