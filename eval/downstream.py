#!/usr/bin/env python
"""Downstream quality of a checkpoint: held-out perplexity and lm-evaluation-harness tasks.

    python eval/downstream.py --model runs/memorize/goldfish/model \\
        --perplexity runs/memorize/manifest.json \\
        --tasks arc_easy,hellaswag,goldfish_mc [--limit 500] [--out runs/memorize/goldfish/downstream]

--perplexity takes a .jsonl ({"text": ...} per line), .txt, .json list, or a manifest (its
nonmembers).  --tasks takes lm-eval task/group names; the project's offline task
`goldfish_mc` lives in data/lm_eval_tasks (indexed by default, see --include-path).
Exit status: 0 all done, 1 some part failed (the rest still ran), 2 nothing could run.
See docs/eval.md.

Both run on a 4D grid too (``--grid D,R,C,Z`` under srun/torchrun/mpiexec: the model sharded as in training, the
perplexity windows and lm-eval's requests split over the data x depth replicas; lm-eval generation is greedy only
there); ``--plan`` prints which grid::

    python eval/downstream.py --model runs/jobs/.../model --perplexity held_out.jsonl --plan --gpus 32
    srun -n 32 python eval/downstream.py --model runs/jobs/.../model --perplexity held_out.jsonl \\
        --tasks arc_easy,goldfish_mc --grid 4,8,1,1

It reads only the model's config and prints the memory per GPU of every grid of --gpus GPUs (weights,
activations, the fp32 logits of --batch-size windows of --max-length tokens, gathered over the whole
vocabulary), the smallest model-parallel group that fits, and the command for the best grid (exit 1 when
none fits).
"""
from __future__ import annotations

import argparse
import logging
import sys

from axonn.cli import HelpFormatter
from memorization.evaluation.downstream import (
                                                DEFAULT_TASK_DIR,
                                                LMEvalNotInstalledError,
                                                MissingTokenizerError,
                                                list_lm_eval_tasks,
                                                )
from memorization.evaluation.registry import DownstreamConfig, downstream_status, evaluate
from memorization.evaluation.eval_model import add_plan_arguments


def config_of(args: argparse.Namespace, include: list[str]) -> DownstreamConfig:
    """The ``downstream`` evaluation's config of the parsed flags (``include``: the lm-eval task directories)."""
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip()) if args.tasks else None
    limit = args.limit
    if limit is not None and limit >= 1:
        limit = int(limit)
    return DownstreamConfig(
        args.model, perplexity_source=args.perplexity, tasks=tasks, include_path=include,
        include_defaults=False if args.only_include_path else None, limit=limit, num_fewshot=args.num_fewshot,
        out_dir=args.out, batch_size=args.batch_size, device=args.device, dtype=args.dtype,
        max_length=args.max_length, stride=args.stride, text_key=args.text_key, add_bos=not args.no_bos,
        tokenizer_path=args.tokenizer, grid=args.grid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=HelpFormatter)
    ap.add_argument("--model", help="checkpoint directory (HF format, with tokenizer)")
    ap.add_argument("--perplexity", default=None, metavar="FILE_OR_MANIFEST",
                    help="held-out text for perplexity: .jsonl/.txt/.json or a manifest")
    ap.add_argument("--text-key", default="text", help="text field of .jsonl/.json rows")
    ap.add_argument("--tasks", default=None,
                    help="comma-separated lm-eval tasks, e.g. arc_easy,hellaswag,goldfish_mc")
    ap.add_argument("--include-path", action="append", default=None, metavar="DIR",
                    help=f"extra lm-eval task directory (repeatable; default {DEFAULT_TASK_DIR})")
    ap.add_argument("--only-include-path", action="store_true",
                    help="do not index lm-eval's built-in tasks (faster; local tasks only)")
    ap.add_argument("--limit", type=float, default=None,
                    help="max examples per task (a fraction if < 1)")
    ap.add_argument("--num-fewshot", type=int, default=None,
                    help="few-shot examples per lm-eval prompt (default: the task's own)")
    ap.add_argument("--list-tasks", action="store_true", help="list lm-eval task names and exit")
    ap.add_argument("--out", default=None, help="output directory for downstream.json/.md")
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory if the checkpoint has none")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per forward pass (perplexity and lm-eval)")
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    ap.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    ap.add_argument("--grid", default=None, metavar="D,R,C,Z",
                    help="run on a data,row,column,depth grid of the launcher's processes (torchrun, mpiexec, "
                         "srun): the model sharded as in training (an HF directory or a training checkpoint), the "
                         "perplexity windows and lm-eval requests split over data x depth (lm-eval generation: "
                         "greedy only)")
    ap.add_argument("--max-length", type=int, default=None,
                    help="context window (default: model context, capped at 4096)")
    ap.add_argument("--stride", type=int, default=None,
                    help="perplexity sliding-window stride (default: max-length // 2)")
    ap.add_argument("--no-bos", action="store_true",
                    help="do not prepend BOS to perplexity documents")
    add_plan_arguments(ap, "scoring --batch-size sequences of --max-length tokens (perplexity windows, lm-eval "
                           "requests): weights, activations, fp32 logits")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    include = args.include_path or [str(DEFAULT_TASK_DIR)]

    if args.list_tasks:
        try:
            names = list_lm_eval_tasks(include, include_defaults=not args.only_include_path)
        except LMEvalNotInstalledError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print("\n".join(names))
        return 0
    if not args.model:
        ap.error("--model is required")
    if not args.perplexity and not args.tasks:
        ap.error("nothing to do: give --perplexity and/or --tasks")
    if not args.tasks and (args.limit is not None or args.num_fewshot is not None):
        ap.error("--limit and --num-fewshot apply to lm-eval --tasks, and none is given: add --tasks or drop them")
    if args.plan:
        return _plan(args, sys.argv[1:] if argv is None else argv)
    try:
        report = evaluate("downstream", config_of(args, include))
    except (MissingTokenizerError, LMEvalNotInstalledError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from axonn.cli import launched_rank

    if launched_rank() != 0:  # rank 0 reports
        return 0
    print(report["markdown"])
    errors = dict((report.get("lm_eval") or {}).get("errors") or {})
    if report.get("perplexity_error"):
        errors["perplexity"] = report["perplexity_error"]
    for what, msg in errors.items():
        print(f"error ({what}): {msg}", file=sys.stderr)
    if args.out:
        print(f"wrote {args.out}/downstream.json and downstream.md", file=sys.stderr)
    return downstream_status(report)  # 2: nothing could run (docs/eval.md)


def _plan(args: argparse.Namespace, argv: list[str]) -> int:
    """``--plan``: the inference plan of --batch-size sequences of --max-length tokens scored in fp32 (the
    perplexity windows and lm-eval's log-likelihood requests; no autocast on a grid)."""
    from memorization.evaluation.eval_model import print_inference_plan

    bad = ""
    for flag, v, ok, want in (("--batch-size", args.batch_size, args.batch_size >= 1, ">= 1"),
                              ("--max-length", args.max_length, args.max_length is None or args.max_length >= 2,
                               ">= 2")):
        bad = bad or ("" if ok else f"{flag} {v} ({want})")
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    return print_inference_plan("eval/downstream.py", argv, args.model, args.gpus, args.machine,
                                batch=args.batch_size, generate=False, dtype="fp32", context=args.max_length)


if __name__ == "__main__":
    sys.exit(main())
