#!/usr/bin/env python
"""Extraction: for each document, give the model a prefix and check whether its greedy continuation
reproduces the true suffix (exact match of all S tokens, token match fraction, Rouge-L), by exposure count.

    python eval/extract.py --model runs/memorize/standard/model --manifest runs/memorize/manifest.json
    python eval/extract.py --model ckpt/ --documents docs.jsonl --prefix-mode all-but-suffix --out results/
    python eval/extract.py --model runs/jobs/mem-70b-.../goldfish/model --manifest ... --device-map auto
    torchrun --nproc_per_node 8 eval/extract.py --model .../model --manifest ... --grid 2,4,1,1   # on a 4D grid
    python eval/extract.py --model .../model --manifest ... --plan --gpus 64 --machine frontier   # which grid?

With ``--grid D,R,C,Z`` (under torchrun, mpiexec or srun, like training) the model is parallelized as in
training, each rank reading only its own shards of the safetensors files: no rank holds the whole model, and
the documents are split over the D x Z replicas. The generated tokens are those of one process.

``--plan --gpus N [--machine NAME]`` reads only the model's config and prints the memory per GPU of every grid
of N GPUs (weights, the KV cache of --batch-size sequences of prefix + suffix tokens, or --max-doc-tokens with
all-but-suffix, activations), the smallest model-parallel group that fits, the best grid (as many data replicas
as fit) and the ``srun`` command that runs it (:mod:`axonn.planner.inference`).
"""
from __future__ import annotations

import argparse
import json
import sys

from axonn.cli import HelpFormatter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", required=True, help="Hugging Face checkpoint directory (config.json + weights); with "
                   "--grid also an axonn training checkpoint (<run>/<arm>/checkpoint or one of its step_* "
                   "directories), resharded onto the grid")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--manifest", help="manifest.json of a memorize run: its targets (with exposure counts)")
    src.add_argument("--documents", help="documents to test: .jsonl/.json (field --text-field), a .txt file "
                     "(blank-line-separated documents) or a directory of .txt files")
    p.add_argument("--text-field", default="text", help="text field of --documents json(l)")
    p.add_argument("--include-nonmembers", action="store_true", help="also extract the manifest's held-out "
                   "non-members (reported as exposure 0, in their own row: the overall rates cover trained "
                   "documents only)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (default: the checkpoint's)")
    p.add_argument("--prefix", type=int, default=50, help="prefix length P in tokens (Carlini et al.: 50)")
    p.add_argument("--suffix", type=int, default=50, help="suffix length S to reproduce")
    p.add_argument("--prefix-mode", default="fixed", choices=["fixed", "all-but-suffix"],
                   help="fixed: the first P tokens; all-but-suffix: the document minus its last S tokens "
                        "(the Goldfish paper's protocol)")
    p.add_argument("--max-doc-tokens", type=int, default=2048,
                   help="all-but-suffix only: cut each document to its first N tokens before splitting, so the "
                        "prefix is tokens [0, N-S) and the suffix [N-S, N) (Goldfish: 2048; lowered to the model's "
                        "context if that is smaller: max_position_embeddings, or the trained length of a model "
                        "trained from scratch)")
    p.add_argument("--skip-short", action="store_true", help="skip (and count) documents shorter than P + S "
                   "instead of refusing")
    p.add_argument("--batch-size", type=int, default=32, help="documents decoded together (KV cache)")
    p.add_argument("--samples", type=int, default=0,
                   help="also sample N continuations per document ((n, p)-discoverable extraction: the report's "
                        "sampled_any and sampled_rate); 0: greedy only (default)")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampled continuations")
    p.add_argument("--top-k", type=int, default=40, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sampled continuations (a document's draws depend on it and its id only)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda if available)")
    p.add_argument("--device-map", default=None, choices=["auto", "balanced", "sequential"],
                   help="spread the layers over every visible GPU (then CPU) with accelerate, for a model larger "
                        "than one GPU (a 70B in bf16 is 140 GB); replaces --device")
    p.add_argument("--grid", default=None, metavar="D,R,C,Z",
                   help="run on a data,row,column,depth grid of the launcher's processes (torchrun, mpiexec, "
                        "srun): the model sharded as in training, the documents split over data x depth (default: "
                        "one process)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="weights dtype (auto: bf16 on CUDA, fp32 on CPU)")
    from memorization.evaluation.eval_model import add_plan_arguments

    add_plan_arguments(p, "weights, KV cache of --batch-size sequences of prefix + suffix tokens, activations")
    p.add_argument("--out", default=None, help="directory for extraction.json and extraction.md")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def config_of(args: argparse.Namespace):
    """The :class:`memorization.evaluation.extraction_eval.ExtractionEvalConfig` of the parsed flags (same names)."""
    from memorization.evaluation.extraction_eval import ExtractionEvalConfig

    return ExtractionEvalConfig(
        model=args.model, manifest=args.manifest, documents=args.documents, text_field=args.text_field,
        include_nonmembers=args.include_nonmembers, tokenizer=args.tokenizer, prefix=args.prefix, suffix=args.suffix,
        prefix_mode=args.prefix_mode, max_doc_tokens=args.max_doc_tokens, skip_short=args.skip_short,
        batch_size=args.batch_size, samples=args.samples, temperature=args.temperature, top_k=args.top_k,
        seed=args.seed, device=args.device, device_map=args.device_map, grid=args.grid, dtype=args.dtype,
        out=args.out, progress=not args.no_progress)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.plan:
        _plan(args, sys.argv[1:] if argv is None else argv)
        return {}
    from memorization.evaluation.registry import EVALUATIONS, evaluate
    from memorization.evaluation.extraction_eval import ExtractionEvalError

    try:
        res = evaluate("extract", config_of(args))
    except ExtractionEvalError as e:
        raise SystemExit(f"error: {e}") from None
    if res is None:  # not rank 0: rank 0 reports
        return {}
    md = EVALUATIONS["extract"].text(res)
    print(json.dumps({"overall": res["overall"], "by_exposure": res["by_exposure"]}, indent=1) if args.json else md)
    return res


def _plan(args: argparse.Namespace, argv: list[str]) -> None:
    """``--plan``: the inference plan of greedy generation over prefix + suffix tokens (all-but-suffix: the
    documents cut to --max-doc-tokens, at most the model's context); exits unless it printed one."""
    from memorization.evaluation.eval_model import print_inference_plan

    bad = [f"{flag} {v} ({want})" for flag, v, ok, want in (
        ("--prefix", args.prefix, args.prefix >= 1, ">= 1"), ("--suffix", args.suffix, args.suffix >= 1, ">= 1"),
        ("--batch-size", args.batch_size, args.batch_size >= 1, ">= 1")) if not ok]
    if bad:
        print(f"error: {'; '.join(bad)}", file=sys.stderr)
        raise SystemExit(2)
    abs_ = args.prefix_mode == "all-but-suffix"
    status = print_inference_plan(
        "eval/extract.py", argv, args.model, args.gpus, args.machine, batch=args.batch_size, generate=True,
        dtype="fp32" if args.dtype == "float32" else "bf16",
        context=args.max_doc_tokens if abs_ else args.prefix + args.suffix, cap_context=abs_)
    if status:
        raise SystemExit(status)


if __name__ == "__main__":
    main()
