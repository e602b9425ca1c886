"""The shape of a 4D process grid, without process groups: :class:`GridShape`.

``GridShape(data, row, col, depth)`` holds the four axis sizes in the order of the command line's
``--grid D,R,C,Z``.  Ranks are numbered (the contract of :mod:`axonn.grid`) with the column index
fastest, then row, then depth, then data slowest::

    rank = ((d * depth + z) * row + r) * col + c

so the *stride* of an axis, the rank distance between two ranks that differ by one along it, is
``col: 1``, ``row: C``, ``depth: R·C``, ``data: R·C·Z``.

The module itself imports only the standard library and creates no process group: the planner, the
job generator and the CLIs name and check a grid with it before (or without) any ``torch.distributed``
world; :func:`axonn.init` builds the live :class:`axonn.grid.Grid` from one (``Grid.shape`` gives it back).
"""
from __future__ import annotations

from typing import Iterator, NamedTuple

#: the axes in rank order, slowest to fastest (the live grid's ``sizes`` keys)
AXES: tuple[str, ...] = ("data", "depth", "row", "col")


class GridShape(NamedTuple):
    """Sizes of the 4D grid's axes ``[data, row, col, depth]`` (the order of ``--grid D,R,C,Z``)."""

    data: int
    row: int
    col: int
    depth: int

    @property
    def size(self) -> int:
        """Number of ranks: ``D·R·C·Z``."""
        return self.data * self.row * self.col * self.depth

    def stride(self, axis: str) -> int:
        """Rank distance along ``axis``: the product of the sizes of the axes faster than it in :data:`AXES`."""
        if axis not in AXES:
            raise ValueError(f"unknown grid axis {axis!r}; valid axes are {AXES}")
        s = 1
        for a in AXES[AXES.index(axis) + 1:]:
            s *= getattr(self, a)
        return s

    def sizes(self) -> dict[str, int]:
        """``{axis: size}`` in rank order (:data:`AXES`): the live grid's ``Grid.sizes``."""
        return {a: getattr(self, a) for a in AXES}

    def __str__(self) -> str:
        """``"D,R,C,Z"``: what :meth:`parse` reads back."""
        return f"{self.data},{self.row},{self.col},{self.depth}"

    @classmethod
    def parse(cls, text: str) -> "GridShape":
        """``"D,R,C,Z"`` (four positive integers); ``ValueError`` saying what to give otherwise."""
        try:
            sizes = tuple(int(x) for x in text.split(","))
        except ValueError:
            sizes = ()
        if len(sizes) != 4 or min(sizes) < 1:
            raise ValueError(f"grid {text!r}: give four positive integers data,row,column,depth (e.g. 1,2,2,2)")
        return cls(*sizes)

    @classmethod
    def enumerate(cls, gpus: int) -> Iterator["GridShape"]:
        """Every ordered factorisation ``gpus = D·R·C·Z``, data major, then row, then col."""
        divs = [d for d in range(1, gpus + 1) if gpus % d == 0]
        for d in divs:
            r1 = gpus // d
            for r in divs:
                if r1 % r:
                    continue
                r2 = r1 // r
                for c in divs:
                    if r2 % c:
                        continue
                    yield cls(d, r, c, r2 // c)
