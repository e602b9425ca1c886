"""Turn a sharded axonn checkpoint into a Hugging Face model directory, offline (one process, no GPU).

    python -m axonn.convert runs/memorize/standard/checkpoint runs/standard-latest --dtype bfloat16 \\
        --tokenizer data/pydocs/tokenizer-bpe4096

``CHECKPOINT`` is one checkpoint (a directory with ``COMPLETE``) or a trainer's checkpoint root,
whose ``LATEST`` names the newest.  Whatever grid wrote it, the output is what ``from_pretrained``
loads; see :func:`axonn.checkpoint.to_hf`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .cli import HelpFormatter


def resolve(checkpoint: Path) -> Path:
    """``checkpoint`` itself, or the checkpoint its ``LATEST`` file names."""
    from axonn.checkpoint import latest

    if (checkpoint / "COMPLETE").exists():
        return checkpoint
    found = latest(checkpoint)
    if found is None:
        hint = (f"; a trainer keeps them in {checkpoint / 'checkpoint'}: pass that"
                if (checkpoint / "checkpoint" / "LATEST").exists() else "")
        raise FileNotFoundError(f"{checkpoint} is not a complete axonn checkpoint (no COMPLETE marker), nor a "
                                f"checkpoint root (no LATEST file){hint}")
    return found


def _load(flag: str, value: str | None, auto_class: str):
    """``transformers.<auto_class>.from_pretrained(value, trust_remote_code=False)`` (custom code is refused),
    None without a value; a ``ValueError`` naming ``flag`` when it cannot be loaded."""
    if not value:
        return None
    import transformers

    try:
        return getattr(transformers, auto_class).from_pretrained(value, trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise ValueError(f"{flag} {value}: cannot load it ({e}); give a local directory that holds it") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m axonn.convert", description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("checkpoint", type=Path, help="a checkpoint directory, or a checkpoint root with a LATEST file")
    ap.add_argument("out", type=Path, help="the HF directory to write (replaced atomically if it is a model directory)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                    help="convert floating-point weights (default: as stored, fp32 master weights)")
    ap.add_argument("--tokenizer", default=None, help="a tokenizer directory to save alongside (AutoTokenizer)")
    ap.add_argument("--config", default=None,
                    help="config.json directory of the model, only for checkpoints whose meta.json has no hf_config")
    ap.add_argument("--max-shard-gb", type=float, default=5.0, help="largest safetensors file, GiB (default 5, HF's)")
    args = ap.parse_args(argv)
    if not (0 < args.max_shard_gb < float("inf")):  # 0 or less wrote one file per tensor; nan, inf crashed
        print(f"error: --max-shard-gb {args.max_shard_gb}: give a size in GiB > 0 (default 5)", file=sys.stderr)
        return 2

    from axonn.checkpoint import to_hf
    from axonn.cli import writable_dir_problem

    why = writable_dir_problem(args.out, "out")
    if why is None and args.out.is_file():
        why = f"out {args.out} is a file: give the directory to write the model into"
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        path = resolve(args.checkpoint)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:  # before any tensor is read: a wrong path is an error naming the flag, not a traceback
        tokenizer = _load("--tokenizer", args.tokenizer, "AutoTokenizer")
        config = _load("--config", args.config, "AutoConfig")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        to_hf(path, args.out, tokenizer=tokenizer, config=config,
              dtype=getattr(torch, args.dtype) if args.dtype else None, max_shard_bytes=int(args.max_shard_gb * 2**30))
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} from {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
