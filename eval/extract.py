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
import warnings
from pathlib import Path

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
    from memorization.eval_model import add_plan_arguments

    add_plan_arguments(p, "weights, KV cache of --batch-size sequences of prefix + suffix tokens, activations")
    p.add_argument("--out", default=None, help="directory for extraction.json and extraction.md")
    p.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.plan:
        _plan(args, sys.argv[1:] if argv is None else argv)
        return {}
    from memorization.eval_model import axonn_checkpoint, checkpoint_tokenizer_dir, model_config_of

    model_dir = Path(args.model)
    step = axonn_checkpoint(model_dir)  # a training checkpoint: evaluated on --grid directly
    if not (model_dir / "config.json").exists() and not (step is not None and args.grid):
        sharded = any((d / f).exists() for d in (model_dir, model_dir / "checkpoint") for f in ("COMPLETE", "LATEST"))
        raise SystemExit(f"error: --model {args.model}: no Hugging Face checkpoint (config.json) there"
                         + (f"; it holds axonn training checkpoints: evaluate one on a --grid (it is resharded "
                            f"onto it), turn it into a model with `python -m axonn.convert {args.model} OUT_DIR`, "
                            f"or pass the run's exported model (<run>/<arm>/model)" if sharded else ""))
    src = Path(args.manifest or args.documents)
    if not src.exists():
        raise SystemExit(f"error: {src} does not exist")
    if args.prefix < 1 or args.suffix < 1:
        raise SystemExit("error: --prefix and --suffix must be >= 1")
    if args.batch_size < 1:
        raise SystemExit(f"error: --batch-size must be >= 1, got {args.batch_size}")
    if args.prefix_mode == "all-but-suffix" and args.max_doc_tokens <= args.suffix:
        raise SystemExit(f"error: --max-doc-tokens {args.max_doc_tokens} must exceed --suffix {args.suffix}")
    if args.samples < 0 or not 0 < args.temperature < float("inf") or args.top_k < 0:
        raise SystemExit(f"error: --samples {args.samples}, --temperature {args.temperature}, --top-k {args.top_k}: "
                         "need samples >= 0, temperature finite and > 0, top-k >= 0")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memorization.extraction import ExtractionConfig, extract, markdown_table, prepare
    from memorization.mixture import atomic_write_json, load_manifest, tokenize_with_bos

    from memorization.model_files import ModelDirError, check_model_config, check_model_dir

    if step is None:
        try:  # a broken config.json is named as such, not as a missing tokenizer
            check_model_config(model_dir)
        except ModelDirError as e:
            raise SystemExit(f"error: {e}") from None
    tok_dir = args.tokenizer or (str(model_dir) if step is None else checkpoint_tokenizer_dir(step))
    if tok_dir is None:
        raise SystemExit(f"error: --model {model_dir} is a training checkpoint without a tokenizer beside it: pass "
                         "--tokenizer (the run's tokenizer directory)")
    try:
        tok = AutoTokenizer.from_pretrained(str(tok_dir), trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: no tokenizer for {tok_dir} ({e}); pass --tokenizer") from None
    if args.manifest:
        try:
            m = load_manifest(src)  # malformed documents and exposure counts refused here, naming the document
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        docs = [dict(t) for t in m["targets"]]
        if args.include_nonmembers:
            docs += [{**d, "exposures": 0} for d in m["nonmembers"]]
        for d in docs:  # a hand-written manifest may give text only: tokenized as memorize tokenizes targets
            if "token_ids" not in d:
                d["token_ids"] = tokenize_with_bos(tok, [d["text"]])[0]
    else:
        from memorization.experiment import read_targets

        texts = read_targets(str(src), args.text_field, flag="--documents", field_flag="--text-field")
        ids = tokenize_with_bos(tok, texts)  # as memorize tokenized its targets: BOS first, even if tok adds none
        docs = [{"id": f"doc-{i:05d}", "token_ids": x, "exposures": None} for i, x in enumerate(ids)]
    cfg = ExtractionConfig(prefix_len=args.prefix, suffix_len=args.suffix,
                           all_but_suffix=args.prefix_mode == "all-but-suffix", batch_size=args.batch_size,
                           skip_short=args.skip_short, max_tokens=args.max_doc_tokens, samples=args.samples,
                           temperature=args.temperature, top_k=args.top_k, seed=args.seed)
    try:  # documents, prefix + suffix and token ids checked against the config before the weights load
        with warnings.catch_warnings():  # extract() warns again, once, about a lowered --max-doc-tokens
            warnings.simplefilter("ignore")
            prepare(model_config_of(model_dir), docs, cfg)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    try:  # after the documents are checked, before any weight is read: a damaged file is one line naming it
        if step is None:
            check_model_dir(model_dir)
    except ModelDirError as e:
        raise SystemExit(f"error: {e}") from None
    if args.grid:
        res = _extract_on_grid(args, model_dir, docs, cfg, tok)
        if res is None:  # not rank 0: rank 0 reports
            return {}
    else:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        from memorization.eval_model import resolve_dtype

        dtype = resolve_dtype(args.dtype, device)
        if args.device_map:  # accelerate places the layers; inputs go to the embedding's device, outputs come back
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                         device_map=args.device_map, trust_remote_code=False).eval()
        else:
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype,
                                                         trust_remote_code=False).to(device).eval()
        try:
            res = extract(model, docs, cfg, tok, progress=not args.no_progress)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    res["model"], res["source"] = str(model_dir), str(src)
    md = markdown_table(res, title=f"Extraction: {model_dir}")
    if args.out:
        out = Path(args.out)
        atomic_write_json(out / "extraction.json", res)
        (out / "extraction.md").write_text(md)
    print(json.dumps({"overall": res["overall"], "by_exposure": res["by_exposure"]}, indent=1) if args.json else md)
    return res


def _plan(args: argparse.Namespace, argv: list[str]) -> None:
    """``--plan``: the inference plan of greedy generation over prefix + suffix tokens (all-but-suffix: the
    documents cut to --max-doc-tokens, at most the model's context); exits unless it printed one."""
    from memorization.eval_model import print_inference_plan

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


def _extract_on_grid(args: argparse.Namespace, model_dir: Path, docs: list[dict], cfg, tok) -> dict | None:
    """Extraction with the model parallelized on ``--grid`` (:func:`memorization.extraction.extract` of a
    :class:`memorization.lm.LM` on the grid); the result on rank 0, None on the other ranks."""
    import torch

    from memorization.eval_model import grid_runtime
    from memorization.extraction import extract
    from memorization.lm import LM

    if args.device_map or args.device:
        raise SystemExit("error: --grid places the model itself (each rank on its own GPU, or the CPU): drop "
                         "--device/--device-map")
    from memorization.runtime import check_replicas

    try:
        rt = grid_runtime(args.grid)
        check_replicas(len(docs), rt.grid, "documents")  # before any weight loads
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    # each rank reads its own shards: of the HF directory, or of a training checkpoint saved on any grid
    lm = LM.load(model_dir, grid=rt, tokenizer_path=args.tokenizer, require_tokenizer=True)
    on_gpu = rt.device.type == "cuda"
    bf16 = on_gpu and args.dtype != "float32"
    with torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False):
        try:
            res = extract(lm, docs, cfg, tok, progress=not args.no_progress)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    res["grid"] = args.grid
    return res if rt.is_main else None


if __name__ == "__main__":
    main()
