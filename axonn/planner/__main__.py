"""``python -m axonn.planner``: rank 4D grids (default) or ``calibrate`` a machine profile."""
from __future__ import annotations

import argparse
import sys

from axonn.cli import HelpFormatter
from axonn.plans import FAMILIES
from axonn.presets import ModelShape, preset_names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m axonn.planner", formatter_class=HelpFormatter,
        description="Rank the 4D (data, row, column, depth) AxoNN grids for a model (Llama, Mistral, Qwen2, "
                    "Qwen3, OLMo 2 or GPT-NeoX) on a machine: predicted step time, TFLOP/s per GPU and memory "
                    "per GPU; rejected grids with the reason. `python -m axonn.planner calibrate --out "
                    "profile.yaml` measures a machine profile instead.",
        epilog="example: python -m axonn.planner --size 405b --seq 2048 --global-batch 1024 "
               "--gpus 4096 --machine frontier --top 5")
    m = p.add_argument_group("model (a preset, or an explicit shape)")
    m.add_argument("--size", choices=preset_names(), help="model-shape preset")
    m.add_argument("--family", choices=FAMILIES,
                   help="model family (HF model_type) of the shape: its blocks' Linears, biases and norms "
                        "(default: the preset's own, llama for an explicit shape); GPT-NeoX's KV heads are its heads")
    m.add_argument("--layers", type=int, help="decoder layers (with --hidden ... --vocab instead of --size)")
    m.add_argument("--hidden", type=int, help="hidden size")
    m.add_argument("--heads", type=int, help="attention heads")
    m.add_argument("--kv-heads", type=int, help="key/value heads (grouped-query attention)")
    m.add_argument("--ffn", type=int, help="MLP intermediate size")
    m.add_argument("--vocab", type=int, help="vocabulary size")
    p.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    p.add_argument("--global-batch", type=int, default=256, help="sequences per optimizer step (default 256)")
    p.add_argument("--micro-batch", type=int, default=None,
                   help="sequences per GPU per forward/backward (default: the planner picks per grid)")
    p.add_argument("--gpus", type=int, required=False, help="number of GPUs (GCDs on Frontier)")
    p.add_argument("--nodes", type=int, help="number of nodes (instead of --gpus)")
    p.add_argument("--machine", default="frontier",
                   help="machine profile name (frontier, alps, perlmutter, perlmutter-40, h100-node) or a "
                        "profile YAML path")
    p.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=True,
                   help="checkpoint each decoder layer (default on)")
    p.add_argument("--grad-reduce-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="dtype the trainer sums gradients in over depth and data (its --grad-reduce-dtype): "
                        "bf16 halves those bytes and the reduce buffers")
    p.add_argument("--top", type=int, default=None, help="grids to show (table default 5; JSON default all)")
    p.add_argument("--show-rejected", type=int, default=8, help="rejected grids to list per reason")
    p.add_argument("--json", action="store_true", help="print the ranking as a JSON list, best first")
    p.add_argument("--list-machines", action="store_true", help="list the bundled machine profiles")
    return p


def shape_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ModelShape:
    dims = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
    given = {d: getattr(args, d) for d in dims if getattr(args, d) is not None}
    if args.size and given:
        from axonn.presets import get_preset
        base = get_preset(args.size).to_dict()
        base.update(given)
        base["name"] = f"{args.size}-custom"
        shape = ModelShape(**base)
        return shape.as_family(args.family) if args.family else shape
    if args.size:
        from axonn.presets import get_preset
        return get_preset(args.size, args.family)
    missing = [f"--{d.replace('_', '-')}" for d in dims if d not in given]
    if missing:
        parser.error(f"give --size or a full shape; missing {' '.join(missing)}")
    if given["hidden"] % given["heads"]:
        parser.error("--hidden must be divisible by --heads")
    shape = ModelShape(name=f"custom-{given['layers']}L-{given['hidden']}h", max_seq=max(args.seq, 2048), **given)
    return shape.as_family(args.family) if args.family else shape


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "calibrate":
        from .calibrate import main as calibrate_main
        return calibrate_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    from .profiles import known_profiles, load_profile
    from .search import PlanError, format_plan, plan
    if args.list_machines:
        for name in known_profiles():
            prof = load_profile(name)
            print(f"{name:<15} {prof.description}")
        return 0
    shape = shape_from_args(args, parser)
    try:
        gpus = args.gpus
        if args.nodes is not None:
            if gpus is not None:
                parser.error("give --gpus or --nodes, not both")
            try:
                gpus = args.nodes * load_profile(args.machine).gpus_per_node
            except ValueError as e:
                raise PlanError(str(e), kind="machine") from None
        if gpus is None:
            parser.error("--gpus (or --nodes) is required")
        result = plan(shape, seq=args.seq, global_batch=args.global_batch, gpus=gpus, machine=args.machine,
                      micro_batch=args.micro_batch, activation_checkpointing=args.activation_checkpointing,
                      grad_reduce_dtype=args.grad_reduce_dtype)
    except PlanError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(result.to_json(top=args.top))
    else:
        print(format_plan(result, top=args.top or 5, show_rejected=args.show_rejected))
    return 0


if __name__ == "__main__":
    sys.exit(main())
