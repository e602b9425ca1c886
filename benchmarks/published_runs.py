"""Planner predictions next to published at-scale training measurements.

    python benchmarks/published_runs.py                       # table to stdout
    python benchmarks/published_runs.py --out benchmarks/results/published_runs.md

Reads ``benchmarks/results/published_runs.yaml`` (each entry: source, machine, model shape, sequence,
global batch, GPU count, published configuration and figure) and, for every entry, predicts the
model TFLOP/s per GPU with :mod:`axonn.planner`:

* where the entry gives ``grid`` (a configuration the 4D grid represents exactly, e.g. FSDP → depth,
  tensor parallel → row), :func:`axonn.planner.predict_step` on that grid, micro-batch and
  checkpointing setting;
* otherwise (pipeline or context parallelism) the planner's own best grid that fits in memory on the
  same GPU count, model, sequence and global batch, with checkpointing on or off, whichever is faster.

Each entry is predicted twice. ``with terms``: the entry's machine profile as bundled and the cost
settings of the software that ran it (``software``: the fraction of a checkpointed layer it recomputes,
the HBM traffic of its elementwise kernels, eager or compiled). ``base``: the model before those terms,
i.e. the profile a user had for that hardware (``base_profile``, default ``profile``) with the at-scale
terms (message-size bandwidth curve, per-collective launch cost, global-bandwidth taper) off and the
default cost settings (a selective checkpointing policy entered as no checkpointing). The ratio is
predicted / published; a ratio above 1 means the planner is optimistic.

Published figures come in three units; all are turned into model TFLOP/s per GPU:
``published_tflops_per_gpu`` as printed, ``published_mfu`` × 989 (H100 dense bf16 peak),
``published_tokens_per_s_per_gpu`` × (6·N + 12·L·h·s) flops per token, the planner's convention.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from axonn.cli import HelpFormatter  # noqa: E402
from axonn.grid_shape import GridShape  # noqa: E402
from axonn.planner import PlanError, load_profile, plan, predict_step  # noqa: E402
from axonn.planner.model import CostConfig, model_flops_per_token  # noqa: E402
from axonn.planner.profiles import MachineProfile  # noqa: E402
from axonn.presets import ModelShape  # noqa: E402

DEFAULT_TABLE = Path(__file__).resolve().parent / "results" / "published_runs.yaml"
#: HBM bytes per token and decoder layer that the elementwise kernels of a trainer move, per element of the
#: hidden width and of the MLP width, forward + backward (``CostConfig.elementwise_bytes_*``), counted from
#: torchtitan's Llama code (docs/planner.md, "Elementwise traffic"): "eager" = unfused PyTorch ops (fp32
#: RMSNorm in six kernels, complex RoPE in fp32, SiLU and product, residual adds, attention-output copy),
#: "compiled" = each fused group reads its inputs and writes its outputs once.
ELEMENTWISE_BYTES = {"eager": (256.0, 28.0), "compiled": (42.0, 16.0)}
H100_PEAK_TFLOPS = 989.0  # dense bf16; what the published MFU figures of H100 runs divide by
TOLERANCE = 0.25


def base_profile(entry: dict) -> MachineProfile:
    """The profile a user had before the at-scale terms: the entry's ``base_profile`` (default its
    ``profile``) with every at-scale term set to its neutral value."""
    prof = load_profile(entry.get("base_profile", entry["profile"]))
    return dataclasses.replace(prof, **MachineProfile.neutral_scale_terms())


def published_tflops(entry: dict, shape: ModelShape) -> tuple[float, str]:
    """Published model TFLOP/s per GPU and how it was obtained from the printed figure."""
    if "published_tflops_per_gpu" in entry:
        return float(entry["published_tflops_per_gpu"]), f"{entry['published_tflops_per_gpu']} TFLOP/s/GPU"
    if "published_mfu" in entry:
        mfu = float(entry["published_mfu"])
        return mfu * H100_PEAK_TFLOPS, f"MFU {mfu:.0%} × {H100_PEAK_TFLOPS:g}"
    tps = float(entry["published_tokens_per_s_per_gpu"])
    return tps * model_flops_per_token(shape, entry["seq"]) / 1e12, f"{tps:g} tok/s/GPU"


def software_config(entry: dict, terms: bool) -> CostConfig:
    """The cost settings of the software that ran ``entry`` (its ``software`` block; defaults otherwise).

    ``terms=False`` gives the default :class:`CostConfig` (the model before the per-software terms).
    """
    sw = entry.get("software") or {}
    if not terms or not sw:
        return CostConfig()
    eh, ef = ELEMENTWISE_BYTES[sw["elementwise"]] if sw.get("elementwise") else (0.0, 0.0)
    return CostConfig(recompute_fraction=float(sw.get("recompute_fraction", 1.0)),
                      elementwise_bytes_hidden=eh, elementwise_bytes_ffn=ef)


def predict(entry: dict, shape: ModelShape, prof: MachineProfile, cfg: CostConfig) -> tuple[float, str]:
    """Predicted model TFLOP/s per GPU and the grid it was predicted on (``D,R,C,Z mb ckpt``)."""
    seq, batch, gpus = entry["seq"], entry["global_batch"], entry["gpus"]
    if entry.get("grid"):
        grid = GridShape(*entry["grid"])
        ckpt = bool(entry.get("activation_checkpointing", True))
        if ckpt and (entry.get("software") or {}).get("recompute_fraction", 1.0) < 1 and cfg.recompute_fraction == 1:
            ckpt = False  # without the fractional term, a selective policy's nearest setting is no checkpointing
        bd = predict_step(shape, grid, seq, batch, int(entry["micro_batch"]), prof, ckpt, cfg)
        return bd.flops_per_s / gpus / 1e12, f"{grid} mb{entry['micro_batch']}{' ckpt' if ckpt else ''}"
    best = None
    for ckpt in (True, False):
        try:
            res = plan(shape, seq, batch, gpus, prof, activation_checkpointing=ckpt, cost_cfg=cfg)
        except PlanError:
            continue
        e = res.best
        if best is None or e.step_time_s < best[0].step_time_s:
            best = (e, ckpt)
    if best is None:
        raise PlanError(f"{entry['id']}: no grid fits")
    e, ckpt = best
    return e.flops_per_s / gpus / 1e12, f"best {e.grid} mb{e.micro_batch}{' ckpt' if ckpt else ''}"


def run(table: Path) -> tuple[list[dict], str]:
    """Predict every entry of ``table``; returns the rows and the Markdown report."""
    entries = yaml.safe_load(table.read_text())["entries"]
    rows = []
    for entry in entries:
        m = entry["model"]
        shape = ModelShape(m["name"], m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["ffn"], m["vocab"],
                           max_seq=entry["seq"])
        prof = load_profile(entry["profile"])
        pub, pub_note = published_tflops(entry, shape)
        old_prof, old_cfg, new_cfg = base_profile(entry), software_config(entry, False), software_config(entry, True)
        base, base_grid = predict(entry, shape, old_prof, old_cfg)
        full, full_grid = predict(entry, shape, prof, new_cfg)
        machine_only, _ = predict(entry, shape, prof, old_cfg)
        software_only, _ = predict(entry, shape, old_prof, new_cfg)
        rows.append(dict(id=entry["id"], gpus=entry["gpus"], profile=prof.name, published=pub,
                         published_as=pub_note, base=base, base_grid=base_grid, full=full, full_grid=full_grid,
                         ratio_base=base / pub, ratio_full=full / pub, ratio_machine=machine_only / pub,
                         ratio_software=software_only / pub, config=entry.get("published_config", ""),
                         note=" ".join(str(entry.get("note", "")).split())))
    return rows, report(rows)


def report(rows: list[dict]) -> str:
    """The Markdown table of ``rows`` with the share of entries within the tolerance."""
    lines = ["# Planner predictions vs published at-scale training runs", "",
             "`python benchmarks/published_runs.py --out benchmarks/results/published_runs.md`; sources, shapes and "
             "configurations in `benchmarks/results/published_runs.yaml`. Model TFLOP/s per GPU (6·N + 12·L·h·s per "
             "token); ratio = predicted / published. `base`: the model before the at-scale and software terms; "
             "`with terms`: the bundled profile and the run's software settings. `best`: the planner's own best grid "
             "(the run used pipeline parallelism, which the planner does not model).", "",
             "| entry | GPUs | profile | published TFLOP/s/GPU (as printed) | base: pred. | base ratio | "
             "with terms: pred. | ratio | grid (with terms) |",
             "|---|---:|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['gpus']} | {r['profile']} | {r['published']:.0f} ({r['published_as']}) | "
                     f"{r['base']:.0f} | {r['ratio_base']:.2f} | {r['full']:.0f} | {r['ratio_full']:.2f} | "
                     f"{r['full_grid']} |")
    within = lambda key: sum(abs(r[key] - 1) <= TOLERANCE for r in rows)  # noqa: E731
    lines.append("")
    lines.append(f"within ±{TOLERANCE:.0%}: base {within('ratio_base')}/{len(rows)}, "
                 f"with terms {within('ratio_full')}/{len(rows)}")
    lines += ["", "Ratio predicted / published by term group: the machine profile's terms alone (bundled profile, "
              "default cost settings), the software's terms alone (base profile, the run's cost settings), both.", "",
              "| entry | base | machine profile only | software only | both | published configuration |",
              "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['ratio_base']:.2f} | {r['ratio_machine']:.2f} | {r['ratio_software']:.2f} | "
                     f"{r['ratio_full']:.2f} | {r['config']} |")
    misses = [r for r in rows if abs(r["ratio_full"] - 1) > TOLERANCE]
    if misses:
        lines += ["", "Outside ±25 % with the terms, and why:", ""]
        lines += [f"* {r['id']} ({r['ratio_full']:.2f}): {r['note'] or 'no explanation recorded'}" for r in misses]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--table", type=Path, default=DEFAULT_TABLE,
                   help="YAML table of published runs (default: benchmarks/results/published_runs.yaml)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the Markdown report to this path (the report always goes to stdout)")
    a = p.parse_args(argv)
    _, text = run(a.table)
    print(text, end="")
    if a.out:
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
