"""A sharded checkpoint at job scale: what each rank writes, and which files a rank opens to load it
on the same grid or another one, for the checkpoint layout of session 14 and the current one.

    python benchmarks/reshard_reads.py --size 405b --src 32,8,4,4 --dst 64,4,4,4

No processes and no tensors: each rank's shard specs come from ``axonn.parallelize`` on the
``meta`` device with a process-group-free :class:`axonn.grid.Grid` at that rank's coordinates
(two decoder layers are built; every layer is sharded alike, so the others' specs are the second
one's under their names).  Then, as :func:`axonn.checkpoint.save` and ``load`` do:

* the layout: :func:`axonn.checkpoint.build_index` of what each tensor coordinate owns.  The
  current one splits each coordinate's shards over its ``G_data`` replicas
  (:func:`axonn.checkpoint.writers`); the old one (session 14) had data slice 0 write everything,
  which is the same index with ``G_data = 1``;
* the load: :func:`axonn.checkpoint.pieces_to_read`, for ``--sample`` ranks of data slice 0
  (every data slice loads the same shards).  The old load opened every file of the job when the grid changed.

Printed side by side: files written, the largest number of bytes one rank writes (fp32 weights
and AdamW's two moments), files a rank opens (mean and max), and the bytes of the pieces a rank
maps against the bytes of its own shards (a memory-mapped piece is read only where it overlaps,
so this bounds what is read).
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from axonn.cli import HelpFormatter  # noqa: E402
from axonn.checkpoint import TENSOR_AXES, build_index, pieces_by_name, pieces_to_read, tensor_owned  # noqa: E402
from axonn.grid import Grid, GridShape, coords_of  # noqa: E402
from axonn.sharding import ShardSpec  # noqa: E402

STATE_BYTES = 12  # per element written: fp32 weight, AdamW exp_avg and exp_avg_sq


def specs_on(config, sizes: dict[str, int], rank: int) -> dict[str, ShardSpec]:
    """The shard spec of every parameter on ``rank`` of the grid ``sizes``; nothing is allocated."""
    from accelerate import init_empty_weights

    import axonn
    from memorization.training.models import causal_lm_class

    layers = config.num_hidden_layers
    small = type(config).from_dict({**config.to_dict(), "num_hidden_layers": min(layers, 2)})
    grid = Grid(sizes=dict(sizes), coords=coords_of(rank, sizes), rank=rank, world_size=math.prod(sizes.values()),
                backend="gloo", device=torch.device("meta"))
    with init_empty_weights():
        model = causal_lm_class(small)(small)
    axonn.parallelize(model, grid, device="meta")
    specs = axonn.param_specs(model)
    for name, spec in list(specs.items()):  # layers 2.. are sharded exactly as layer 1
        if name.startswith("model.layers.1."):
            for i in range(2, layers):
                specs[re.sub(r"^model\.layers\.1\.", f"model.layers.{i}.", name)] = spec
    return specs


def slice0(sizes: dict[str, int]) -> range:
    return range(math.prod(sizes[a] for a in TENSOR_AXES))


def owned_by_slice0(config, sizes: dict[str, int]) -> dict[int, dict[str, ShardSpec]]:
    """What each tensor coordinate (its rank in data slice 0) owns on the grid ``sizes``."""
    return {r: tensor_owned(specs_on(config, sizes, r), coords_of(r, sizes)) for r in slice0(sizes)}


def written(index: dict[str, dict[str, ShardSpec]]) -> list[int]:
    """Bytes in each file of ``index``."""
    return [sum(s.local_numel for s in part.values()) * STATE_BYTES for part in index.values()]


def reads(config, index, sizes: dict[str, int], sample: int) -> list[tuple[int, int, int]]:
    """For ``sample`` ranks of data slice 0 of grid ``sizes``, evenly spaced: (files opened, elements
    of the pieces read, elements of its own shards)."""
    held = pieces_by_name(index)
    ranks = slice0(sizes)
    out = []
    n = min(sample, len(ranks))
    for r in (ranks[i * len(ranks) // n] for i in range(n)):
        specs = specs_on(config, sizes, r)
        wanted = pieces_to_read(held, specs)
        mapped = sum(index[f][n].local_numel for f, names in wanted.items() for n in names)
        out.append((len(wanted), mapped, sum(s.local_numel for s in specs.values())))
    return out


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=HelpFormatter)
    ap.add_argument("--size", default="405b", help="model preset (default 405b)")
    ap.add_argument("--src", default="32,8,4,4", help="grid the checkpoint is saved on: data,row,col,depth")
    ap.add_argument("--dst", default="64,4,4,4", help="grid it is loaded onto: data,row,col,depth")
    ap.add_argument("--sample", type=int, default=16,
                    help="loading ranks to evaluate, evenly spaced over data slice 0 (default 16)")
    args = ap.parse_args()
    from memorization.training.models import model_config

    config = model_config(args.size, 128256)
    try:
        src, dst = GridShape.parse(args.src).sizes(), GridShape.parse(args.dst).sizes()
    except ValueError as e:
        ap.error(str(e))
    world = math.prod(src.values())
    print(f"{args.size}, saved on {args.src} ({world} ranks), loaded onto {args.dst} ({math.prod(dst.values())} "
          f"ranks); fp32 weights + AdamW state")
    parts = owned_by_slice0(config, src)
    old, new = build_index(parts, {**src, "data": 1}), build_index(parts, src)
    w_old, w_new = written(old), written(new)
    print(f"{'':<44}{'session 14':>20}{'now':>20}{'ratio':>8}")
    print(f"{'files written':<44}{f'{world} ({len(old)} non-empty)':>20}{len(new):>20}")
    print(f"{'largest write by one rank':<44}{_gb(max(w_old)):>20}{_gb(max(w_new)):>20}"
          f"{max(w_old) / max(w_new):>7.1f}x")
    for label, sizes in (("resume on the same grid", src), ("reshard onto --dst", dst)):
        now = reads(config, new, sizes, args.sample)
        f_new = [f for f, _, _ in now]
        if sizes is src:
            f_old = [f for f, _, _ in reads(config, old, sizes, args.sample)]
            was = f"{statistics.mean(f_old):.1f} (max {max(f_old)})"
        else:
            was = f"{world} (all)"  # the old load opened every file of the job to reshard
        print(f"{f'files a rank opens: {label}':<44}{was:>20}{f'{statistics.mean(f_new):.1f} (max {max(f_new)})':>20}")
        print(f"{'  piece bytes mapped / own bytes':<44}{'':>20}{sum(m for _, m, _ in now) / sum(o for _, _, o in now):>20.2f}")


if __name__ == "__main__":
    main()
