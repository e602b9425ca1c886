"""axonn/sharding.py: a shard cut from checkpoint rows equals the shard by definition, for every pair of
grids, reading only the rows and the pieces it needs."""
from __future__ import annotations

import itertools
import math

import torch


def _reference_shard(full: torch.Tensor, spec) -> torch.Tensor:
    """The shard by definition: the block, flattened, zero-padded to ``padded_len``, cut to ``flat``."""
    blk = full[spec.block_slices()]
    if spec.flat is None:
        return blk.clone()
    flat = torch.cat([blk.reshape(-1), blk.new_zeros(spec.padded_len - blk.numel())])
    return flat[spec.flat[0]:spec.flat[1]].clone()


def test_shard_from_rows_equals_extract_and_reads_only_its_rows() -> None:
    from axonn.sharding import ShardSpec, extract, rows_needed, shard_from_rows

    full = torch.randn(12, 10)
    for gr, gc, gz in itertools.product([1, 2, 3], [1, 2], [1, 2, 3, 4, 7]):
        lo, li = 12 // gr, 10 // gc
        per = math.ceil(lo * li / gz)
        for r, c, z in itertools.product(range(gr), range(gc), range(gz)):
            spec = ShardSpec((12, 10), ((r * lo, (r + 1) * lo), (c * li, (c + 1) * li)),
                             flat=(z * per, (z + 1) * per), padded_len=per * gz)
            asked = []
            got = shard_from_rows(spec, lambda a, b: asked.append((a, b)) or full[a:b])
            assert torch.equal(got, _reference_shard(full, spec)), (gr, gc, gz, r, c, z)
            assert torch.equal(extract(full, spec), got)
            assert asked == [rows_needed(spec)]
            a, b = rows_needed(spec)
            assert b - a <= math.ceil(per / li) + 1, "reads more rows than its flat range touches"
    bias = ShardSpec((12,), ((4, 8),))
    assert torch.equal(shard_from_rows(bias, lambda a, b: full[a:b, 0]), full[4:8, 0])


def _linear_specs(out: int, inn: int, gr: int, gc: int, gz: int):
    from axonn.sharding import ShardSpec

    lo, li = out // gr, inn // gc
    per = math.ceil(lo * li / gz)
    return [ShardSpec((out, inn), ((r * lo, (r + 1) * lo), (c * li, (c + 1) * li)), flat=(z * per, (z + 1) * per),
                      padded_len=per * gz, shard_axes=("depth", "row", "col"))
            for r, c, z in itertools.product(range(gr), range(gc), range(gz))]


def test_resharding_reads_each_shard_from_the_rows_it_needs() -> None:
    """A checkpoint's pieces from one grid give exactly the shard of ``full`` for every spec of another,
    and the rows read from the pieces are only the rows that spec needs."""
    from axonn.sharding import rows_from_pieces, rows_needed, shard_from_rows

    full = torch.randn(12, 10)
    grids = [(1, 1, 1), (2, 1, 3), (3, 2, 2), (1, 2, 4), (6, 2, 1), (2, 2, 7)]
    for src, dst in itertools.product(grids, grids):
        pieces = [(_reference_shard(full, s), s) for s in _linear_specs(12, 10, *src)]
        for spec in _linear_specs(12, 10, *dst):
            asked = []

            def rows(a, b):
                asked.append((a, b))
                return rows_from_pieces(pieces, a, b)

            assert torch.equal(shard_from_rows(spec, rows), _reference_shard(full, spec)), (src, dst, spec)
            assert asked == [rows_needed(spec)]
    pieces = [(_reference_shard(full, s), s) for s in _linear_specs(12, 10, 3, 2, 2)]
    assert torch.equal(rows_from_pieces(pieces, 0, 12), full)


def test_resharding_needs_only_the_pieces_that_overlap() -> None:
    """Cutting a shard from the overlapping pieces alone (what ``ckpt.load`` opens) gives the exact
    shard for every pair of grids, and skips pieces of other rows, columns and depth ranges."""
    from axonn.sharding import ShardSpec, overlaps, rows_from_pieces, shard_from_rows

    full = torch.randn(12, 10)
    grids = [(1, 1, 1), (2, 1, 3), (3, 2, 2), (1, 2, 4), (6, 2, 1), (2, 2, 7)]
    used = total = 0
    for src, dst in itertools.product(grids, grids):
        pieces = [(_reference_shard(full, s), s) for s in _linear_specs(12, 10, *src)]
        for spec in _linear_specs(12, 10, *dst):
            mine = [(t, s) for t, s in pieces if overlaps(s, spec)] or pieces[:1]
            got = shard_from_rows(spec, lambda a, b: rows_from_pieces(mine, a, b))
            assert torch.equal(got, _reference_shard(full, spec)), (src, dst, spec)
            if src == dst and spec.flat[0] < 12 * 10 // (src[0] * src[1]):  # (not all padding)
                # the identical piece overlaps; pieces of other blocks do not
                assert sum(s.block == spec.block for _, s in mine) == len(mine)
            used, total = used + len(mine), total + len(pieces)
    assert used < 0.2 * total, f"overlap keeps {used} of {total} pieces"
    a = ShardSpec((8, 4), ((0, 4), (0, 2)))
    assert overlaps(a, ShardSpec((8, 4), ((2, 6), (1, 3)))) and not overlaps(a, ShardSpec((8, 4), ((4, 8), (0, 2))))
    assert not overlaps(a, ShardSpec((8, 4), ((0, 4), (2, 4))))
    deep = ShardSpec((8, 4), ((0, 8), (0, 4)), flat=(16, 32), padded_len=32)  # rows 4..7 only
    assert not overlaps(deep, a) and overlaps(deep, ShardSpec((8, 4), ((3, 5), (3, 4))))
