"""What one rank opens to load a sharded checkpoint: every file (before ``index.json``) vs only the
files holding the pieces it needs (now), for a real model shape on a real job size.

    python benchmarks/reshard_reads.py --size 405b --src 32,8,4,4 --dst 64,4,4,4

No processes and no tensors: each rank's shard specs are computed by ``axonn.parallelize`` on the
``meta`` device with a process-group-free :class:`axonn.grid.Grid` at that rank's coordinates,
the source grid's owners give the checkpoint's ``index.json``, and
:func:`axonn.checkpoint.pieces_to_read` says what each destination rank opens (all data slices
need the same shards, so the ranks of data slice 0 are the sample).  Every layer is sharded
alike, so ``--layers`` (default 2) changes the bytes, not the file counts.

Printed side by side: files per rank before and now, for a resume on the same grid (which already
read only its shards' owners) and for a resharding load (which read every file), and the bytes
of the pieces a rank maps against the bytes of its own shards (a memory-mapped piece is read only
where it overlaps, so this bounds the bytes read).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from axonn.checkpoint import _owner, pieces_to_read  # noqa: E402
from axonn.grid import AXES, Grid, _coords_of  # noqa: E402
from axonn.sharding import ShardSpec  # noqa: E402


def specs_on(config, sizes: dict[str, int], rank: int) -> tuple[dict[str, ShardSpec], Grid]:
    """The shard spec of every parameter on ``rank`` of the grid ``sizes`` (nothing allocated), and that grid."""
    from accelerate import init_empty_weights
    from transformers import LlamaForCausalLM

    import axonn

    grid = Grid(sizes=dict(sizes), coords=_coords_of(rank, sizes), rank=rank, world_size=math.prod(sizes.values()),
                backend="gloo", device=torch.device("meta"))
    with init_empty_weights():
        model = LlamaForCausalLM(config)
    axonn.parallelize(model, grid, device="meta")
    return axonn.param_specs(model), grid


def slice0(sizes: dict[str, int]) -> range:
    return range(math.prod(sizes[a] for a in AXES if a != "data"))


def index_of(config, sizes: dict[str, int]) -> dict[str, dict[str, ShardSpec]]:
    """The ``index.json`` a save on grid ``sizes`` writes: each owner's file and its shards."""
    index = {}
    for r in slice0(sizes):
        specs, grid = specs_on(config, sizes, r)
        mine = {n: s for n, s in specs.items() if _owner(s, grid)}
        if mine:
            index[f"rank{r:05d}.pt"] = mine
    return index


def reads(config, index, sizes: dict[str, int], elsize: int) -> list[tuple[int, int, int]]:
    """Per rank of data slice 0 of grid ``sizes``: (files opened, bytes of the pieces read, own bytes)."""
    out = []
    for r in slice0(sizes):
        specs, _ = specs_on(config, sizes, r)
        wanted = pieces_to_read(index, specs)
        mapped = sum(_nbytes(index[f][n], elsize) for f, names in wanted.items() for n in names)
        own = sum(_nbytes(s, elsize) for s in specs.values())
        out.append((len(wanted), mapped, own))
    return out


def _nbytes(spec: ShardSpec, elsize: int) -> int:
    n = spec.flat[1] - spec.flat[0] if spec.flat else math.prod(spec.block_shape)
    return n * elsize


def _grid(text: str) -> dict[str, int]:
    d, r, c, z = (int(x) for x in text.split(","))
    return {"data": d, "depth": z, "row": r, "col": c}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="405b", help="model preset (default 405b)")
    ap.add_argument("--layers", type=int, default=2,
                    help="decoder layers to build (file counts do not depend on it; default 2)")
    ap.add_argument("--src", default="32,8,4,4", help="grid the checkpoint was saved on: data,row,col,depth")
    ap.add_argument("--dst", default="64,4,4,4", help="grid it is loaded onto: data,row,col,depth")
    args = ap.parse_args()
    from memorization.models import model_config

    config = model_config(args.size, 128256)
    config.num_hidden_layers = args.layers
    src, dst = _grid(args.src), _grid(args.dst)
    world = math.prod(src.values())
    print(f"{args.size} ({args.layers} layers), saved on {args.src} ({world} ranks), loaded onto {args.dst} "
          f"({math.prod(dst.values())} ranks); fp32 master weights")
    index = index_of(config, src)
    print(f"files in the checkpoint: before {world} (one per rank), now {len(index)} (owners only)")
    print(f"{'load':<26}{'files a rank opens: before':>28}{'now':>18}{'fewer':>8}{'piece / own bytes':>19}")
    for label, sizes, before in (("resume on the same grid", src, "owners'"), ("reshard onto --dst", dst, "all")):
        rows = reads(config, index, sizes, 4)
        files = [f for f, _, _ in rows]
        now = statistics.mean(files)
        ratio = sum(m for _, m, _ in rows) / sum(o for _, _, o in rows)
        was = now if before == "owners'" else world  # same-grid resume already read only the owners' files
        print(f"{label:<26}{f'{was:.{1 if was == now else 0}f} ({before})':>28}{f'{now:.1f} (max {max(files)})':>18}"
              f"{f'{was / now:.0f}x':>8}{ratio:>19.2f}")

if __name__ == "__main__":
    main()
