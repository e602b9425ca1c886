#!/usr/bin/env python
"""Validate the planner's cost model: measured step time of every valid grid vs its prediction.

    torchrun --nproc-per-node 8 benchmarks/planner_validation.py --out benchmarks/results/planner_validation
    mpiexec -n 8 python benchmarks/planner_validation.py ...                  # same, launched by MPI

On the ranks it was launched with (CPU + gloo, or GPUs + NCCL) it

1. calibrates the machine (``axonn.planner.calibrate``: GEMM rate and efficiency curve, memory
   bandwidth, collective bandwidth/latency, all ranks measuring at once as during training);
2. asks the planner (``axonn.planner.plan``) to rank every 4D grid ``(D, R, C, Z)`` of the world
   size for a small Llama with the calibrated profile;
3. trains that model with the real trainer (``memorization.training.train.Trainer`` on ``axonn.init``) on
   every valid grid, at the micro-batch the planner chose for it, in a shuffled order, ``--rounds``
   times; the measured time of a grid is the minimum over rounds of the median step time (the
   slowest rank's time of each step);
4. prints predicted vs measured ranking, the Spearman rank correlation, whether the measured
   fastest grid is in the predicted top two, and writes ``OUT.json``, ``OUT.md``, ``OUT.png`` and
   the profile it used, ``OUT.profile.yaml``.

``--rescore OUT.json`` (one process, no training) predicts the grids of a committed measurement
again with the current cost model, on the profile and cost settings it was measured with, and
rewrites the outputs with the same measured times: how a change of the model moves the ranking.
A grid whose planned micro-batch has changed no longer matches its measurement and is left out
(listed in the summary).

The cost model is told what the measured software does (``CostConfig``): fp32 activations and
gradients on the wire (CPU), no overlap (``TrainConfig(overlap=False)`` here: on an
oversubscribed CPU a collective takes cores from compute anyway, and the committed result was
measured so), and no activation checkpointing.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
import axonn  # noqa: E402
from axonn.planner import plan  # noqa: E402
from axonn.grid import launcher_world_size  # noqa: E402
from axonn.grid_shape import GridShape  # noqa: E402
from axonn.planner.calibrate import calibrate  # noqa: E402
from axonn.planner.profiles import load_profile, save_profile  # noqa: E402
from axonn.planner.model import CostConfig  # noqa: E402
from axonn.presets import ModelShape  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402
from memorization.training.train import TrainConfig, Trainer  # noqa: E402


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation of two equally long lists (ties get their mean rank)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic)


def measure_grid(shape: ModelShape, grid: GridShape, seq: int, global_batch: int,
                 micro_batch: int, steps: int, warmup: int, seed: int) -> list[float]:
    """Step times (s, slowest rank per step) of the trainer on ``grid``."""
    from memorization.training.models import causal_lm_class

    g = axonn.init(grid)
    torch.manual_seed(seed)
    config = shape.hf_config(attn_implementation="sdpa")
    model = causal_lm_class(config)(config)
    gen = torch.Generator().manual_seed(seed)
    n = warmup + steps
    rows = torch.randint(0, shape.vocab, (n * global_batch, seq), generator=gen)
    docs = torch.zeros_like(rows, dtype=torch.int32)
    cfg = TrainConfig(batch_size=global_batch, micro_batch=micro_batch, steps=n, lr=1e-4, checkpoint_every=0,
                      progress=False, warmup_steps=1, overlap=False)  # the committed result's setting
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        tr = Trainer(model, rows, docs, rows[:global_batch], cfg, tmp, runtime=Runtime(g), run_name="validate")
        for i in range(n):
            dist.barrier()
            t0 = time.perf_counter()
            tr.train_step()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=g.device)  # NCCL: on the GPU
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            if i >= warmup:
                times.append(float(t))
        del tr
    del model
    g.destroy()  # else every grid's process groups (threads, sockets) pile up and slow the next ones
    gc.collect()
    return times


def score(entries: list, measured: dict[int, list[float]]) -> tuple[list[dict], dict]:
    """Per-grid rows and the summary of planner ``entries`` (best first) against ``measured[i]``, the
    times of entry ``i`` (one per round; the grid's time is their minimum)."""
    meas = [min(measured[i]) for i in range(len(entries))]
    by_meas = sorted(range(len(entries)), key=lambda i: meas[i])
    mrank = {i: r + 1 for r, i in enumerate(by_meas)}
    grids = [dict(grid=list(e.grid), micro_batch=e.micro_batch, predicted_s=e.step_time_s, predicted_rank=i + 1,
                  measured_s=meas[i], measured_rank=mrank[i], measured_rounds_s=measured[i],
                  predicted_breakdown=e.breakdown.to_dict())
             for i, e in enumerate(entries)]
    best = by_meas[0]
    summary = dict(spearman=spearman([e.step_time_s for e in entries], meas),
                   measured_best=list(entries[best].grid), measured_best_s=meas[best],
                   measured_best_predicted_rank=best + 1, predicted_best=list(entries[0].grid),
                   predicted_best_measured_s=meas[0])
    summary["passed"] = summary["spearman"] >= 0.7 and summary["measured_best_predicted_rank"] <= 2
    return grids, summary


def rescore(path: Path, out: Path) -> dict:
    """Predict the grids measured in ``path`` (an ``OUT.json``) again with the current cost model."""
    from axonn.planner.profiles import MachineProfile

    old = json.loads(path.read_text())
    model = {k: v for k, v in old["model"].items() if k != "cpu_ok"}  # a field of older result files
    shape, prof = ModelShape(**model), MachineProfile(**old["profile"])
    res = plan(shape, seq=old["seq"], global_batch=old["global_batch"], gpus=old["world"], machine=prof,
               activation_checkpointing=False, cost_cfg=CostConfig(**old["cost_config"]))
    was = {(tuple(g["grid"]), g["micro_batch"]): g["measured_rounds_s"] for g in old["grids"]}
    entries = [e for e in res.ranked if (tuple(e.grid), e.micro_batch) in was]
    unmatched = [list(e.grid) for e in res.ranked if (tuple(e.grid), e.micro_batch) not in was]
    grids, summary = score(entries, {i: was[(tuple(e.grid), e.micro_batch)] for i, e in enumerate(entries)})
    summary["left_out_new_micro_batch"] = unmatched
    record = {**old, "grids": grids, "summary": summary,
              "rescored": f"python benchmarks/planner_validation.py --rescore {path} --out {out}: predictions of "
                          "the current cost model; measured times as committed",
              "rejected": [dict(grid=list(r.grid), reason=r.reason) for r in res.rejected]}
    write_outputs(out, record)
    return record


def write_outputs(out: Path, record: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    rows = record["grids"]
    lines = [
        "# Planner validation: predicted vs measured step time of every grid",
        "",
        f"Command: `{record['command']}`",
        *([f"Re-scored: `{record['rescored']}`", ""] if record.get("rescored") else [""]),
        f"Model: {record['model']['layers']} layers, hidden {record['model']['hidden']}, "
        f"{record['model']['heads']} heads ({record['model']['kv_heads']} KV), FFN {record['model']['ffn']}, "
        f"vocab {record['model']['vocab']} ({record['params'] / 1e6:.1f} M parameters); seq {record['seq']}, "
        f"global batch {record['global_batch']}; {record['world']} ranks, {record['device']}.",
        f"Calibrated profile: {record['profile']['measured_tflops'] * 1e3:.1f} GFLOP/s per rank at "
        f"{record['profile']['gemm_ref_dim']}³ (d_half {record['profile']['gemm_half_dim']}), "
        f"memory {record['profile']['hbm_gbps']:.1f} GB/s, collectives {record['profile']['intra_node_gbps']:.2f} GB/s "
        f"bus bandwidth, {record['profile']['intra_node_latency_us']:.0f} µs latency per step.",
        "",
        "| grid (D,R,C,Z) | micro-batch | predicted s | predicted rank | measured s | measured rank | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {','.join(map(str, r['grid']))} | {r['micro_batch']} | {r['predicted_s']:.3f} | "
                     f"{r['predicted_rank']} | {r['measured_s']:.3f} | {r['measured_rank']} | "
                     f"{r['measured_s'] / r['predicted_s']:.2f} |")
    s = record["summary"]
    lines += [
        "",
        f"* Spearman rank correlation (predicted vs measured): **{s['spearman']:.3f}** (target >= 0.7: "
        f"{'met' if s['spearman'] >= 0.7 else 'NOT met'})",
        f"* Measured fastest grid {tuple(s['measured_best'])} has predicted rank {s['measured_best_predicted_rank']} "
        f"(target: top two: {'met' if s['measured_best_predicted_rank'] <= 2 else 'NOT met'})",
        f"* Predicted best grid {tuple(s['predicted_best'])}: measured {s['predicted_best_measured_s']:.3f} s, "
        f"{s['predicted_best_measured_s'] / s['measured_best_s']:.2f}x the measured best",
        f"* Rejected by the planner (not measured): {len(record['rejected'])}"
        + "".join(f"\n  * {tuple(r['grid'])}: {r['reason']}" for r in record["rejected"]),
        "",
        f"![predicted vs measured]({out.with_suffix('.png').name})",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    x = [r["predicted_s"] for r in rows]
    y = [r["measured_s"] for r in rows]
    ax.scatter(x, y)
    for r in rows:
        ax.annotate(",".join(map(str, r["grid"])), (r["predicted_s"], r["measured_s"]), fontsize=7,
                    xytext=(3, 3), textcoords="offset points")
    lo, hi = min(x + y) * 0.9, max(x + y) * 1.1
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="measured = predicted")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted step time (s)")
    ax.set_ylabel("measured step time (s)")
    ax.set_title(f"{record['world']} ranks, grid (D,R,C,Z); Spearman {s['spearman']:.2f}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--out", default="benchmarks/results/planner_validation",
                   help="output path without suffix (.json, .md, .png are written)")
    p.add_argument("--layers", type=int, default=4, help="model layers")
    p.add_argument("--hidden", type=int, default=512, help="hidden size")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=8, help="key/value heads")
    p.add_argument("--ffn", type=int, default=1536, help="MLP width")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size")
    p.add_argument("--seq", type=int, default=256, help="sequence length")
    p.add_argument("--global-batch", type=int, default=8, help="sequences per optimizer step")
    p.add_argument("--steps", type=int, default=4, help="timed steps per grid and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per grid and round")
    p.add_argument("--rounds", type=int, default=2, help="passes over all grids (shuffled order each)")
    p.add_argument("--ref-dim", type=int, default=None, help="calibration GEMM size (default 1024 CPU, 8192 GPU)")
    p.add_argument("--comm-mbytes", type=int, default=32, help="calibration collective message size (MiB)")
    p.add_argument("--profile", default=None,
                   help="machine profile YAML to use instead of calibrating (default: calibrate now)")
    p.add_argument("--seed", type=int, default=0, help="model/data seed and grid-order shuffle seed")
    p.add_argument("--rescore", type=Path, default=None, metavar="OUT.json",
                   help="no training: predict the grids of this earlier result again with the current cost model "
                        "(its profile and cost settings) and write the outputs to --out with its measured times")
    a = p.parse_args()
    if a.rescore is not None:
        if not a.rescore.exists():
            p.error(f"--rescore {a.rescore}: no such file (an OUT.json written by this benchmark)")
        record = rescore(a.rescore, Path(a.out))
        print(Path(a.out).with_suffix(".md").read_text())
        return 0 if record["summary"]["passed"] else 1

    if a.profile:  # reuse a calibration (e.g. the one a previous run wrote to OUT.profile.yaml)
        axonn.init(G_data=launcher_world_size())
        prof, raw = load_profile(a.profile), {}
    else:
        prof, raw = calibrate(base="h100-node", ref_dim=a.ref_dim, comm_mbytes=a.comm_mbytes,
                              name="planner-validation")
    world, rank = dist.get_world_size(), dist.get_rank()
    cpu = not torch.cuda.is_available()
    shape = ModelShape(name="validation", layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads,
                       ffn=a.ffn, vocab=a.vocab, max_seq=a.seq)
    cost = CostConfig(overlap_depth=0.0, overlap_tensor_bwd=0.0, overlap_data=0.0,
                      bytes_act=4 if cpu else 2)
    res = plan(shape, seq=a.seq, global_batch=a.global_batch, gpus=world, machine=prof,
               activation_checkpointing=False, cost_cfg=cost)
    entries = list(res.ranked)
    mine = [(tuple(e.grid), e.micro_batch) for e in entries]
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if any(x != mine for x in everyone):  # would pair different collectives across ranks: refuse
        raise RuntimeError("ranks disagree on the planner's ranking (different machine profiles?)")
    order = list(range(len(entries)))
    measured: dict[int, list[float]] = {i: [] for i in order}
    from tqdm import tqdm

    bar = tqdm(total=a.rounds * len(order), desc="grids", disable=rank != 0, file=sys.stdout)
    for rnd in range(a.rounds):
        random.Random(a.seed + rnd).shuffle(order)
        for i in order:
            e = entries[i]
            bar.set_postfix_str(f"round {rnd + 1} grid {tuple(e.grid)} mb {e.micro_batch}")
            ts = measure_grid(shape, e.grid, a.seq, a.global_batch, e.micro_batch, a.steps, a.warmup, a.seed)
            measured[i].append(statistics.median(ts))
            bar.update()
    bar.close()
    if rank == 0:
        grids, summary = score(entries, measured)
        record = dict(command="torchrun --nproc-per-node %d benchmarks/planner_validation.py %s"
                              % (world, " ".join(sys.argv[1:])),
                      model=asdict(shape), params=shape.num_params(), seq=a.seq, global_batch=a.global_batch,
                      world=world, device=prof.gpu, profile=asdict(prof), calibration_raw=raw,
                      cost_config=asdict(cost), grids=grids, summary=summary,
                      rejected=[dict(grid=list(r.grid), reason=r.reason) for r in res.rejected])
        out = Path(a.out)
        write_outputs(out, record)
        save_profile(prof, out.with_suffix(".profile.yaml"), header="calibrated by benchmarks/planner_validation.py")
        print(out.with_suffix(".md").read_text())
        print(f"wrote {out}.json/.md/.png")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    sys.exit(main())
