#!/usr/bin/env python
"""Prepare a token store: tokenize a corpus once, build the run's mixture, write memory-mapped arrays.

Training ranks then memory-map the store and read only the rows of their own steps; no rank tokenizes at
job start.  The store holds the mixture's rows, document ids and row context (uint16 token ids below a
65,536-token vocabulary, else uint32), the validation rows, the manifest (targets, non-members) and
store.json with the fingerprints of corpus, targets and tokenizer; a run naming other data or settings is
refused with the command that prepares the right store (memorization/data/token_store.py).

    python data/prepare.py --out runs/store                      # the default experiment's mixture
    python data/prepare.py --config recipes/configs/paper/llama3.1-8b.yaml --out /scratch/store-8b --num-proc 32
    python data/prepare.py --corpus my.jsonl --tokenizer /models/Llama-3.1-8B --seq-len 2048 \\
        --batch-size 128 --steps 5000 --exposures 16 --num-proc 16 --out /scratch/store
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # runnable from a checkout without installation
    sys.path.insert(0, str(_REPO))

from axonn.cli import HelpFormatter  # noqa: E402
from memorization.data.mixture import PLACEMENTS  # noqa: E402


#: what --config decides (the experiment's fields); with --config only --out, --num-proc and --overwrite are given
MIXTURE_FLAGS = ("corpus", "text_field", "targets", "tokenizer", "seq_len", "batch_size", "steps", "exposures",
                 "num_targets", "num_nonmembers", "val_docs", "prefix", "suffix", "min_target_tokens",
                 "max_target_tokens", "skip_short_targets", "skip_overlapping_targets", "seed", "placement")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter, allow_abbrev=False)
    p.add_argument("--config", help="an experiment config (recipes/memorize.py --config): prepare exactly the "
                   "store its run needs -- corpus, targets, tokenizer (with model.init, the checkpoint's own) and "
                   "mixture; --out defaults to its data.store. The other data flags below are then refused")
    p.add_argument("--corpus", default="builtin:pydocs",
                   help="background corpus: builtin:pydocs, a local .jsonl/.json/.parquet/.csv/.txt file or "
                        "directory (also one written by datasets' save_to_disk), or a Hugging Face hub dataset name")
    p.add_argument("--text-field", default="text", help="the field of the corpus (and --targets) records holding text")
    p.add_argument("--targets", help="your target documents (a directory of .txt files, a .json/.jsonl file or a "
                                     "blank-line-separated .txt), as the experiment's --targets; without it "
                                     "--num-targets targets are drawn from the corpus")
    p.add_argument("--tokenizer", default="builtin:bpe4096",
                   help="the run's tokenizer: builtin:bpe4096, a Hugging Face name, or a directory (fine-tuning: "
                        "the --init checkpoint's own directory)")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per row")
    p.add_argument("--batch-size", type=int, default=4, help="rows per optimizer step (global batch)")
    p.add_argument("--steps", type=int, default=1000,
                   help="optimizer steps the stream holds (0: as many whole steps as the corpus fills)")
    p.add_argument("--exposures", default="64",
                   help="times each target is seen; a comma list splits the targets into groups (0: a held-out "
                        "control)")
    p.add_argument("--num-targets", type=int, default=32, help="targets drawn from the corpus (without --targets)")
    p.add_argument("--num-nonmembers", type=int, default=32, help="corpus documents held out as non-members")
    p.add_argument("--val-docs", type=int, default=64, help="corpus documents held out for the validation rows")
    p.add_argument("--prefix", type=int, default=50, help="extraction prefix tokens (a target needs prefix + suffix)")
    p.add_argument("--suffix", type=int, default=50, help="extraction suffix tokens")
    p.add_argument("--min-target-tokens", type=int,
                   help="tokens a target needs (default: --prefix + --suffix; all-but-suffix extraction: suffix + 1)")
    p.add_argument("--max-target-tokens", type=int, help="tokens of a target kept in its row (default: seq-len - 1)")
    p.add_argument("--skip-short-targets", action="store_true", help="skip (and count) targets shorter than needed")
    p.add_argument("--skip-overlapping-targets", action="store_true",
                   help="skip (and count) targets sharing a 32-token span with an earlier one")
    p.add_argument("--seed", type=int, default=0, help="the mixture's seed (the experiment's --seed)")
    p.add_argument("--placement", default="random", choices=PLACEMENTS,
                   help="which steps a target's exposures take (the experiment's --placement): random, spaced "
                   "evenly over the run, or last (spaced, every target's last exposure in the final steps)")
    p.add_argument("--num-proc", type=int, default=1, help="processes tokenizing the corpus (datasets.map num_proc)")
    p.add_argument("--out", help="the store's directory (written whole, then renamed into place); required "
                   "unless --config names a data.store")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at --out")
    return p


def from_config(args: argparse.Namespace, argv: list[str]) -> tuple:
    """(corpus, tokenizer spec, MixtureConfig, targets, targets path, text field, out) of ``--config``."""
    from memorization.experiment.config import load_config, resolve
    from memorization.experiment.data import mixture_config, read_targets, targets_text_field, tokenizer_spec

    flags = [f"--{k.replace('_', '-')}" for k in MIXTURE_FLAGS]
    given = [f for f in flags if any(a == f or a.startswith(f + "=") for a in argv)]
    if given:
        raise SystemExit(f"error: --config decides the store's data and mixture; drop {', '.join(given)} (or "
                         "change the config)")
    cfg = resolve(load_config(args.config))
    out = args.out or cfg.data.store
    if not out:
        raise SystemExit(f"error: --config {args.config} names no data.store: pass --out")
    d = cfg.data
    targets = read_targets(d.targets, targets_text_field(cfg)) if d.targets else None
    return d.corpus, tokenizer_spec(cfg), mixture_config(cfg), targets, d.targets, d.text_field, out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    from memorization.data.mixture import MixtureConfig

    if args.config:
        corpus, tokenizer, cfg, targets, targets_path, text_field, out = from_config(args, argv)
        prepare(corpus, tokenizer, cfg, targets, targets_path, text_field, out, args)
        return
    if not args.out:
        raise SystemExit("error: --out is required (or --config naming a data.store)")
    try:
        exposures = tuple(int(x) for x in args.exposures.split(","))
    except ValueError:
        raise SystemExit(f"error: --exposures {args.exposures!r}: give an integer or a comma list of integers"
                         ) from None
    try:
        cfg = MixtureConfig(seq_len=args.seq_len, batch_size=args.batch_size, exposures=exposures,
                            num_targets=args.num_targets, num_nonmembers=args.num_nonmembers, val_docs=args.val_docs,
                            num_steps=args.steps or None,
                            min_target_tokens=args.min_target_tokens or args.prefix + args.suffix,
                            max_target_tokens=args.max_target_tokens, skip_short_targets=args.skip_short_targets,
                            skip_overlapping_targets=args.skip_overlapping_targets, seed=args.seed,
                            placement=args.placement)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    targets = None
    if args.targets:
        from memorization.experiment.data import read_targets  # (the experiment's reader: the same documents)

        targets = read_targets(args.targets, args.text_field)
    prepare(args.corpus, args.tokenizer, cfg, targets, args.targets, args.text_field, args.out, args)


def prepare(corpus: str, tokenizer: str, cfg, targets, targets_path, text_field: str, out: str,
            args: argparse.Namespace) -> None:
    from memorization.data.token_store import StoreError, prepare_store, store_info

    t0 = time.perf_counter()
    try:
        out = prepare_store(corpus, tokenizer, cfg, out, targets=targets, targets_path=targets_path,
                            text_field=text_field, num_proc=args.num_proc, overwrite=args.overwrite)
    except (StoreError, ValueError, FileNotFoundError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    info = store_info(out)
    tokens = info["num_rows"] * info["seq_len"]
    print(f"{out}: {info['num_steps']} steps x {cfg.batch_size} rows x {info['seq_len']} tokens = {tokens:,} "
          f"tokens (token ids stored as {info['arrays']['input_ids']['dtype']}), prepared in "
          f"{time.perf_counter() - t0:.1f} s; a run uses it with the same corpus, tokenizer, targets and settings")


if __name__ == "__main__":
    main()
