"""Peak host memory per rank of building a parallel model: the full-copy way vs the sharded build.

    python benchmarks/build_memory.py --size 160m --grid 1,2,1,2

Runs two launches of ``D·R·C·Z`` CPU ranks (gloo), one after the other:

* ``full``: what the trainer did before sharded construction: every rank builds the whole
  seeded ``LlamaForCausalLM`` in fp32, then ``axonn.parallelize`` copies its shards out;
* ``sharded``: ``memorization.training.models.build_model(..., runtime=rt)``: parameters on ``meta``,
  each rank allocates and fills only its own shards (:class:`memorization.training.models.RandomInit`).

Each rank reports the growth of its peak resident memory (``VmHWM``) over its resident memory
just before building, and the bytes of the parameters it keeps; the parent prints both variants
side by side and their ratio.  On GPUs the same difference is GPU memory (the full model used to
be moved to the GPU before sharding) and, for a 70B or 405B model, the difference between a job
that starts and one that cannot.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from axonn.cli import HelpFormatter  # noqa: E402
from axonn.grid_shape import GridShape  # noqa: E402


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def worker(variant: str, size: str, grid: GridShape) -> None:
    import torch

    import axonn
    from memorization.training.runtime import Runtime

    rt = Runtime.create(grid)
    vocab = 32000
    from memorization.training.models import build_model, causal_lm_class, model_config

    def build(size: str):
        if variant == "full":
            torch.manual_seed(0)
            config = model_config(size, vocab)
            return rt.parallelize(causal_lm_class(config)(config))
        return build_model(size, vocab, seed=0, runtime=rt)

    build("tiny")  # warm-up: lazy imports and first-use allocations are not part of the comparison
    rt.barrier()
    base = _vm("VmRSS")
    model = build(size)
    peak = _vm("VmHWM") - base
    kept = sum(p.numel() * p.element_size() for p in model.parameters())
    full = sum(s.full_shape[0] * (s.full_shape[1] if len(s.full_shape) > 1 else 1)
               for s in axonn.param_specs(model).values()) * 4
    rt.barrier()
    print("RESULT " + json.dumps({"variant": variant, "rank": rt.grid.rank, "peak_growth": peak, "kept": kept,
                                  "full_model": full}), flush=True)


def launch(variant: str, size: str, grid: str, nproc: int) -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests" / "axonn_workers"))
    from launcher import free_port

    port = free_port()
    procs = []
    for r in range(nproc):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", variant, "--size", size, "--grid", grid],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{variant} launch failed:\n" + "\n".join(outs))
    return [json.loads(line[7:]) for o in outs for line in o.splitlines() if line.startswith("RESULT ")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    ap.add_argument("--size", default="160m", help="model preset (axonn/presets.yaml) to build")
    ap.add_argument("--grid", default="1,2,1,2", help="data,row,col,depth; the product is the number of ranks")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        grid = GridShape.parse(args.grid)
    except ValueError as e:
        ap.error(f"--grid: {e}")
    if args.worker:
        worker(args.worker, args.size, grid)
        return
    nproc = grid.size
    g = 2**20
    rows = {}
    for variant in ("full", "sharded"):
        res = launch(variant, args.size, args.grid, nproc)
        rows[variant] = max(r["peak_growth"] for r in res), max(r["kept"] for r in res), res[0]["full_model"]
    print(f"{args.size} on grid D,R,C,Z={args.grid} ({nproc} CPU ranks); full fp32 model "
          f"{rows['full'][2] / g:.0f} MiB")
    print("| build | peak host memory growth per rank (max over ranks) | parameters kept per rank |")
    print("|---|---|---|")
    for v, (peak, kept, _) in rows.items():
        print(f"| {v} | {peak / g:.0f} MiB | {kept / g:.0f} MiB |")
    print(f"ratio full / sharded peak: {rows['full'][0] / max(rows['sharded'][0], 1):.1f}x")


if __name__ == "__main__":
    main()
