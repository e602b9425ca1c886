#!/usr/bin/env python
"""The planner's memory per GPU against what the trainer really allocates, side by side.

For each configuration, rank 0 of the grid runs one real training step of
``memorization.training.train.Trainer`` under fake tensors and a fake process group
(``memorization.training.memory_trace``: true shapes and dtypes, nothing allocated, CPU only) and the
peak of live tensor bytes is compared with ``axonn.planner.memory_per_gpu``. The default set
covers both layouts (HF modules at R = C = Z = 1, axonn's tensor-parallel layers otherwise),
activation checkpointing on and off, 1b and 8b shapes, and the planner's own picks for the
paper's runs (70b and 405b on Frontier at their full world sizes).

    python benchmarks/memory_validation.py                      # the default set (~15 min on 2 cores)
    python benchmarks/memory_validation.py --quick              # small models only (~1 min)
    python benchmarks/memory_validation.py --size 70b --grid 1,8,1,32 --micro-batch 1 --show 15
    python benchmarks/memory_validation.py --cuda               # GPU: the 1x1x1x1 rows also run for real and
                                                                # the CUDA allocator's peak checks the trace
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from axonn.grid_shape import GridShape  # noqa: E402
from axonn.planner import GRAD_REDUCE_BYTES, MemoryConfig, memory_per_gpu  # noqa: E402
from axonn.presets import get_preset  # noqa: E402
from memorization.training.memory_trace import measure_cuda_step, trace_train_step  # noqa: E402

GIB = 2**30
QUICK = [  # (size, grid D,R,C,Z, seq, micro-batch, activation checkpointing, micro-steps per optimizer step
    #          [, gradient wire dtype: "fp32" unless given])
    ("tiny", (1, 1, 1, 1), 256, 4, False, 2), ("tiny", (1, 1, 1, 1), 256, 4, True, 2),
    ("mini", (1, 2, 2, 2), 512, 4, False, 2), ("mini", (2, 1, 2, 2), 512, 2, True, 2),
    ("mini", (1, 2, 1, 1), 512, 2, True, 2), ("mini", (2, 1, 1, 4), 512, 2, False, 2),
    ("tiny", (1, 1, 1, 1), 256, 4, False, 1), ("mini", (2, 1, 2, 2), 512, 2, True, 1),
    ("mini", (2, 1, 1, 4), 512, 2, False, 2, "bf16"), ("mini", (2, 1, 2, 2), 512, 2, True, 1, "bf16"),
]
DEFAULT = QUICK + [
    ("1b", (1, 1, 1, 1), 2048, 2, False, 2), ("1b", (1, 1, 1, 1), 2048, 2, True, 2),
    ("1b", (1, 2, 2, 2), 2048, 2, False, 2), ("1b", (1, 2, 2, 2), 2048, 2, True, 2),
    ("1b", (2, 4, 1, 1), 1024, 4, False, 2), ("1b", (1, 1, 4, 2), 2048, 4, True, 2),
    ("8b", (1, 4, 1, 2), 2048, 1, False, 2), ("8b", (1, 2, 2, 2), 2048, 1, True, 2),
    ("8b", (1, 1, 1, 8), 2048, 2, True, 2),
    ("1b", (1, 1, 1, 1), 2048, 2, False, 1), ("1b", (1, 2, 2, 2), 2048, 2, True, 1),
    ("8b", (1, 4, 1, 2), 2048, 1, False, 1), ("8b", (1, 1, 1, 8), 2048, 2, True, 1),
    # the planner's picks for the paper's runs at global batch 128 (one micro-step each)
    ("70b", (1, 2, 1, 128), 2048, 1, True, 1),  # 70b on 256 Frontier GCDs
    ("405b", (1, 8, 4, 32), 2048, 4, True, 1),  # 405b on 1024 Frontier GCDs (the pick)
    ("405b", (8, 8, 2, 8), 2048, 2, True, 1),  # 405b on 1024 Frontier GCDs (the pick before session 16)
    # gradients summed in bf16 (TrainConfig.grad_reduce_dtype)
    ("8b", (1, 1, 1, 8), 2048, 2, True, 2, "bf16"),
    ("405b", (8, 8, 2, 8), 2048, 2, True, 1, "bf16"),  # 405b on 1024 Frontier GCDs, the bf16 pick
]


def run(configs, show: int, cuda: bool = False) -> list[dict]:
    rows = []
    print(f"{'size':5s} {'grid D,R,C,Z':13s} {'seq':>5s} {'mb':>3s} {'ckpt':>4s} {'steps':>5s} {'grads':>5s} "
          f"{'traced GiB':>10s} "
          f"{'planner GiB':>11s} {'error':>7s} {'s':>5s}" + (f" {'CUDA GiB':>9s} {'trace/CUDA':>10s}" if cuda else ""),
          flush=True)
    for size, grid, seq, mb, ac, steps, *rest in configs:
        wire = rest[0] if rest else "fp32"
        t0 = time.perf_counter()
        traced = trace_train_step(size, grid, seq=seq, micro_batch=mb, micro_steps=steps, activation_checkpointing=ac,
                                  grad_reduce_dtype=wire)
        pred = memory_per_gpu(get_preset(size), GridShape(*grid), seq, mb, ac,
                              MemoryConfig(grad_reduce_bytes=GRAD_REDUCE_BYTES[wire]), micro_steps=steps)
        err = pred.total / traced.peak - 1
        secs = time.perf_counter() - t0
        measured = measure_cuda_step(size, seq=seq, micro_batch=mb, micro_steps=steps,
                                     activation_checkpointing=ac) if cuda else None
        print(f"{size:5s} {','.join(map(str, grid)):13s} {seq:5d} {mb:3d} {'on' if ac else 'off':>4s} {steps:5d} "
              f"{wire:>5s} "
              f"{traced.peak / GIB:10.3f} {pred.total / GIB:11.3f} {err:+7.1%} {secs:5.0f}"
              + (f" {measured / GIB:9.3f} {traced.peak / measured:10.3f}" if measured else ""), flush=True)
        if show:
            print(traced.table(show))
        rows.append({"size": size, "grid": list(grid), "seq": seq, "micro_batch": mb, "activation_checkpointing": ac,
                     "micro_steps": steps, "grad_reduce_dtype": wire,
                     "traced_bytes": traced.peak, "predicted_bytes": int(pred.total), "error": err,
                     "cuda_peak_bytes": measured, "predicted": {k: int(v) for k, v in pred.to_dict().items()}})
    errs = [abs(r["error"]) for r in rows]
    print(f"{len(rows)} configurations: |error| max {max(errs):.1%}, mean {sum(errs) / len(errs):.1%}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--quick", action="store_true", help="only the small models (tiny, mini)")
    p.add_argument("--size", help="trace one configuration of this preset instead of the set")
    p.add_argument("--grid", default="1,1,1,1", help="with --size: D,R,C,Z (rank 0 is traced)")
    p.add_argument("--seq", type=int, default=2048, help="with --size: sequence length")
    p.add_argument("--micro-batch", type=int, default=1, help="with --size: sequences per rank per forward")
    p.add_argument("--micro-steps", type=int, default=2,
                   help="with --size: forward/backward passes per optimizer step (1: no gradients live in the forward)")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                   help="with --size: recompute each layer in backward (the planner's default)")
    p.add_argument("--grad-reduce-dtype", default="fp32", choices=sorted(GRAD_REDUCE_BYTES),
                   help="with --size: the dtype gradients are summed in over depth and data")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print the N largest live tensor groups at the peak")
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    p.add_argument("--cuda", action="store_true",
                   help="GPU only: also run the 1x1x1x1 configurations for real and print the CUDA allocator's peak "
                        "(without --size: only those configurations, plus the 1b at 4 x 2048)")
    a = p.parse_args()
    warnings.filterwarnings("ignore")
    if a.cuda:
        import torch

        if not torch.cuda.is_available():
            p.error("--cuda needs a CUDA GPU (the trace alone runs anywhere: leave --cuda out)")
    if a.size:
        try:
            grid = GridShape.parse(a.grid)
        except ValueError as e:
            p.error(f"--grid: {e}")
        configs = [(a.size, grid, a.seq, a.micro_batch, a.activation_checkpointing, a.micro_steps,
                    a.grad_reduce_dtype)]
    elif a.cuda:
        configs = [c for c in DEFAULT if c[1] == (1, 1, 1, 1)] + [("1b", (1, 1, 1, 1), 2048, 4, False, 2)]
    else:
        configs = QUICK if a.quick else DEFAULT
    if a.cuda and any(c[1] != (1, 1, 1, 1) for c in configs):
        p.error("--cuda measures one GPU: use --grid 1,1,1,1")
    rows = run(configs, a.show, a.cuda)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
