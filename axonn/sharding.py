"""Shard specifications: how a rank's local parameter maps to the full tensor.

A :class:`ShardSpec` says that the local tensor is the sub-block
``full[block[0][0]:block[0][1], block[1][0]:block[1][1], ...]`` of the full
(HF-named, HF-shaped) tensor, optionally flattened, zero-padded to
``padded_len`` and cut to ``flat = (start, stop)`` (depth sharding).
``shard_axes`` lists the grid axes over which the shards are *distinct*; the
parameter is replicated over every other axis.  The same spec applies to the
gradient and to optimizer state of the same shape.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .communication import all_gather
from .grid import Grid


@dataclass(frozen=True)
class ShardSpec:
    full_shape: tuple[int, ...]
    block: tuple[tuple[int, int], ...]
    flat: tuple[int, int] | None = None
    padded_len: int | None = None
    shard_axes: tuple[str, ...] = ()

    @staticmethod
    def depth_sharded(full_shape: tuple[int, ...], block: tuple[tuple[int, int], ...], depth_size: int,
                      depth_index: int, shard_axes: tuple[str, ...]) -> "ShardSpec":
        """``block`` flattened, zero-padded to a multiple of ``depth_size`` and cut to this depth
        rank's equal part (a Linear weight's or the embedding's layout)."""
        per = math.ceil(_numel(tuple(b - a for a, b in block)) / depth_size)
        return ShardSpec(tuple(full_shape), tuple(block), flat=(depth_index * per, (depth_index + 1) * per),
                         padded_len=per * depth_size, shard_axes=tuple(shard_axes))

    @staticmethod
    def replicated(shape: Iterable[int]) -> "ShardSpec":
        shape = tuple(int(s) for s in shape)
        return ShardSpec(shape, tuple((0, s) for s in shape))

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.block)

    @property
    def local_numel(self) -> int:
        """Elements of the local tensor: the flat range's length, or the block's size."""
        return self.flat[1] - self.flat[0] if self.flat else _numel(self.block_shape)

    def block_slices(self) -> tuple[slice, ...]:
        return tuple(slice(a, b) for a, b in self.block)

    def to_dict(self) -> dict:
        return {"full_shape": list(self.full_shape), "block": [list(b) for b in self.block],
                "flat": list(self.flat) if self.flat else None, "padded_len": self.padded_len,
                "shard_axes": list(self.shard_axes)}

    @staticmethod
    def from_dict(d: dict) -> "ShardSpec":
        return ShardSpec(tuple(d["full_shape"]), tuple(tuple(b) for b in d["block"]),
                         tuple(d["flat"]) if d["flat"] else None, d["padded_len"], tuple(d["shard_axes"]))


def extract(full: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    """This rank's local shard of ``full`` according to ``spec`` (a fresh tensor)."""
    if tuple(full.shape) != spec.full_shape:
        raise ValueError(f"full tensor has shape {tuple(full.shape)}, expected {spec.full_shape}")
    t = shard_from_rows(spec, lambda r0, r1: full[r0:r1])
    return t.clone() if spec.flat is None else t  # a block may still be a view of ``full``


def rows_needed(spec: ShardSpec) -> tuple[int, int]:
    """The rows ``[r0, r1)`` of the full tensor (dim 0) that this shard is cut from.

    A 1-D tensor's rows are its elements.  With depth sharding only the rows of the block that
    the flat range ``[f0, f1)`` touches are needed (none when it lies entirely in the padding).
    """
    (a0, a1) = spec.block[0]
    if spec.flat is None:
        return a0, a1
    cols = _numel(spec.block_shape[1:])
    f0, f1 = spec.flat
    total = (a1 - a0) * cols
    if f0 >= total:
        return a0, a0
    return a0 + f0 // cols, a0 + min(a1 - a0, -(-min(f1, total) // cols))


def overlaps(piece: ShardSpec, spec: ShardSpec) -> bool:
    """Whether the stored shard ``piece`` holds any element that the shard ``spec`` is cut from.

    Both are reduced to a box of the full tensor: the rows :func:`rows_needed` names times the
    block's other dimensions (a superset for a depth shard whose flat range starts or ends
    inside a row).  Pieces that do not overlap need not be read when resharding.
    """
    (p0, p1), (s0, s1) = rows_needed(piece), rows_needed(spec)
    if min(p1, s1) <= max(p0, s0):
        return False
    return all(min(b1, d1) > max(b0, d0) for (b0, b1), (d0, d1) in zip(piece.block[1:], spec.block[1:]))


def shard_from_rows(spec: ShardSpec, read_rows: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """This rank's local shard, built from ``read_rows(r0, r1) = full[r0:r1]`` alone.

    The shard ``spec`` describes (block, flattened, zero-padded, cut to ``flat``; :func:`extract`
    is this on an in-memory tensor), but only the rows :func:`rows_needed` names are ever read, so a rank can cut its shard from a file or a generator without holding the full
    tensor (``full[r0:r1]`` of a 2-D tensor is full width; the column block is cut here).
    """
    r0, r1 = rows_needed(spec)
    rows = read_rows(r0, r1)  # empty when a depth shard lies entirely in the padding
    blk = rows[(slice(None),) + tuple(slice(a, b) for a, b in spec.block[1:])]
    if spec.flat is None:
        return blk.contiguous()
    f0, f1 = spec.flat
    blk = blk.reshape(-1)
    start = (r0 - spec.block[0][0]) * _numel(spec.block_shape[1:])  # flat index of rows[0] in the block
    piece = blk[f0 - start:f1 - start]
    pad = (f1 - f0) - piece.numel()
    return torch.cat([piece, piece.new_zeros(pad)]) if pad else piece.clone()


def gather_full(local: torch.Tensor, spec: ShardSpec, grid: Grid) -> torch.Tensor:
    """Collectively reassemble the full tensor from every rank's ``local`` shard.

    Depth shards are all-gathered over ``depth`` (flat, then unpadded and
    reshaped to the block); blocks are all-gathered over the remaining shard
    axes together with their offsets and placed into the full tensor.
    """
    t = local.detach()
    if spec.flat is not None:
        t = all_gather(t.contiguous(), "depth", grid=grid)[: _numel(spec.block_shape)].view(spec.block_shape)
    axes = tuple(a for a in spec.shard_axes if a != "depth")
    if not axes or grid.size(axes) == 1:
        return t.clone()
    p = grid.size(axes)
    blocks = all_gather(t.contiguous().unsqueeze(0), axes, grid=grid)
    offs = torch.tensor([a for a, _ in spec.block], dtype=torch.long, device=t.device).unsqueeze(0)
    offs = all_gather(offs, axes, grid=grid)
    full = t.new_empty(spec.full_shape)
    bs = spec.block_shape
    for i in range(p):
        sl = tuple(slice(int(o), int(o) + s) for o, s in zip(offs[i].tolist(), bs))
        full[sl] = blocks[i]
    return full


def rows_from_pieces(pieces: list[tuple[torch.Tensor, ShardSpec]], r0: int, r1: int) -> torch.Tensor:
    """Rows ``[r0, r1)`` of the full tensor that ``pieces`` (local tensor, spec) cover, offline.

    Only the parts of each piece that fall in those rows are read (with memory-mapped pieces,
    only those bytes leave the disk): a rank cutting its shard for another grid
    (:func:`shard_from_rows`) reads about its own share, not the whole tensor.
    """
    spec0 = pieces[0][1]
    full_shape = spec0.full_shape
    out = pieces[0][0].new_zeros((r1 - r0, *full_shape[1:]))
    flats: dict[tuple, torch.Tensor] = {}
    for t, s in pieces:
        (a0, a1), cols = s.block[0], s.block[1:]
        lo, hi = max(r0, a0), min(r1, a1)
        if hi <= lo:
            continue
        dst = (slice(lo - r0, hi - r0),) + tuple(slice(c0, c1) for c0, c1 in cols)
        if s.flat is None:
            out[dst] = t.view(s.block_shape)[lo - a0:hi - a0]
            continue
        width = _numel(s.block_shape[1:])
        b0 = (lo - a0) * width  # flat range of these rows inside the block
        g0, g1 = max(b0, s.flat[0]), min((hi - a0) * width, s.flat[1])
        if g1 <= g0:
            continue
        key = (s.block, lo, hi)
        if key not in flats:
            flats[key] = t.new_zeros((hi - lo) * width)
        flats[key][g0 - b0:g1 - b0] = t[g0 - s.flat[0]:g1 - s.flat[0]]
    for (block, lo, hi), buf in flats.items():
        shape = (hi - lo,) + tuple(b - a for a, b in block[1:])
        out[(slice(lo - r0, hi - r0),) + tuple(slice(a, b) for a, b in block[1:])] = buf.view(shape)
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
