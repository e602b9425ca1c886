#!/usr/bin/env python
"""Membership inference against a checkpoint: loss, zlib, min-k% and reference-difference scores.

    python eval/mia.py --model runs/memorize/goldfish/model --manifest runs/memorize/manifest.json \\
        [--reference-model runs/base] [--out runs/memorize/goldfish/mia]

Prints a markdown table (AUC and TPR@1%FPR per score, AUC per exposure count); with --out also
writes mia.json, mia.md, mia_scores.jsonl and mia_roc.png.  See docs/eval.md.

On a 4D grid (``--grid D,R,C,Z`` under srun/torchrun/mpiexec), and the grid to use::

    python eval/mia.py --model runs/jobs/.../model --manifest ... --plan --gpus 32 --machine frontier
    srun -n 32 python eval/mia.py --model runs/jobs/.../model --manifest ... --grid 4,8,1,1

``--plan`` reads only the models' configs and prints the memory per GPU of every grid of --gpus GPUs (weights,
activations, the logits of --batch-size documents of --max-length tokens: scoring on a grid runs in fp32 and
gathers every position's logits over the whole vocabulary), the smallest model-parallel group that fits, and the
command for the best grid (as many data replicas as fit).

Members are the targets with exposures >= 1.  Nonmembers are the targets with exposure 0 when
the run has them (build it with --exposures 0,N), else the manifest's held-out corpus
documents; with user-supplied --targets those come from a different distribution, and the
report warns about it.  Every score covers exactly the scored (possibly --max-length
truncated) token span: zlib compresses its decoded text, and the reference model scores the
same text.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from axonn.cli import HelpFormatter
from memorization.evaluation.eval_model import add_plan_arguments
from memorization.evaluation.registry import MiaConfig, evaluate
from memorization.evaluation.mia import MissingTokenizerError


def config_of(args: argparse.Namespace) -> MiaConfig:
    """The ``mia`` evaluation's config of the parsed flags."""
    return MiaConfig(args.model, args.manifest, args.reference_model, out_dir=args.out, batch_size=args.batch_size,
                     device=args.device, dtype=args.dtype, k=args.k, max_length=args.max_length,
                     add_bos=not args.no_bos, fpr_target=args.fpr, tokenizer_path=args.tokenizer, grid=args.grid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=HelpFormatter)
    ap.add_argument("--model", required=True, help="target checkpoint directory (HF format)")
    ap.add_argument("--manifest", required=True, help="manifest JSON with targets + nonmembers")
    ap.add_argument("--reference-model", default=None,
                    help="reference checkpoint for the ref_diff score (e.g. the base model)")
    ap.add_argument("--tokenizer", default=None,
                    help="tokenizer directory, if the checkpoint has none")
    ap.add_argument("--out", default=None, help="output directory for JSON/markdown/PNG")
    ap.add_argument("--batch-size", type=int, default=8, help="documents scored per forward pass")
    ap.add_argument("--device", default=None, help="cuda / cpu (default: cuda if available)")
    ap.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    ap.add_argument("--grid", default=None, metavar="D,R,C,Z",
                    help="run on a data,row,column,depth grid of the launcher's processes (torchrun, mpiexec, "
                         "srun): the models sharded as in training, no rank holding a whole one, the documents "
                         "split over data x depth (default: one process)")
    ap.add_argument("--k", type=float, default=0.2, help="fraction for min-k%% prob (0.2 = 20%%)")
    ap.add_argument("--max-length", type=int, default=None,
                    help="truncate documents to this many tokens; zlib and the reference "
                         "model use the same truncated span (default: model context, capped "
                         "at 4096)")
    ap.add_argument("--fpr", type=float, default=0.01, help="FPR at which to report the TPR")
    ap.add_argument("--no-bos", action="store_true",
                    help="do not prepend the tokenizer's BOS token to the documents")
    ap.add_argument("--json", action="store_true", help="print the JSON report, not markdown")
    add_plan_arguments(ap, "weights of the model and of --reference-model, activations, fp32 logits of "
                           "--batch-size documents of --max-length tokens")
    args = ap.parse_args(argv)
    bad = [f"{flag} {v} ({want})" for flag, v, ok, want in (
        ("--batch-size", args.batch_size, args.batch_size >= 1, ">= 1"),
        ("--k", args.k, 0 < args.k <= 1, "a fraction in (0, 1]: 0.2 is 20%"),
        ("--fpr", args.fpr, 0 < args.fpr < 1, "in (0, 1): 0.01 is 1%"),
        ("--max-length", args.max_length, args.max_length is None or args.max_length >= 2, ">= 2")) if not ok]
    if bad:  # before any model loads
        print(f"error: {'; '.join(bad)}", file=sys.stderr)
        return 2
    if args.plan:  # MIA on a grid scores in fp32 (no autocast)
        from memorization.evaluation.eval_model import print_inference_plan

        return print_inference_plan("eval/mia.py", sys.argv[1:] if argv is None else argv, args.model, args.gpus,
                                    args.machine, batch=args.batch_size, generate=False, dtype="fp32",
                                    context=args.max_length, reference=args.reference_model)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    try:
        report = evaluate("mia", config_of(args))
    except (MissingTokenizerError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from axonn.cli import launched_rank

    if launched_rank() != 0:  # rank 0 reports
        return 0
    if args.json:
        print(json.dumps({k: v for k, v in report.items() if k != "markdown"}, indent=2))
    else:
        print(report["markdown"])
    if args.out:
        print(f"wrote {args.out}/mia.json, mia.md, mia_scores.jsonl, mia_roc.png",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
