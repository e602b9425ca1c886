"""Process grid for 4D (data x depth x row x column) parallelism.

Rank order (documented contract)::

    rank = ((d * G_intra_d + z) * G_intra_r + r) * G_intra_c + c

i.e. the **column** index ``c`` varies fastest, then **row** ``r``, then
**depth** ``z``, then **data** ``d`` slowest.  Consecutive ranks therefore
share a column group first (the group that all-reduces the forward output of
a non-transposed layer), which keeps the most frequent collective on-node.

Axes and what they split
------------------------
* ``row``   (size ``G_intra_r``): output features of a non-transposed Linear
  (input features of a transposed one); attention heads; FFN units; vocab of
  ``lm_head``.
* ``col``   (size ``G_intra_c``): input features of a non-transposed Linear
  (output features of a transposed one), i.e. the hidden dimension.
* ``depth`` (size ``G_intra_d``): the flattened local weight block (FSDP-like)
  *and* the batch.
* ``data``  (size ``G_data``): the batch (pure replication of parameters).

Groups for every combination of axes are built eagerly (``Grid.group``), e.g.
``("row", "col")`` (the tensor group that splits the embedding vocabulary) and
``("data", "depth")`` (over which replicated parameters' gradients are
reduced).  A combination of size one has group ``None`` and every collective on
it is a no-op.

The sizes alone, with the strides of this rank order, are an
:class:`axonn.grid_shape.GridShape` (``Grid.shape``; ``init`` takes one).
"""
from __future__ import annotations

import datetime as _dt
import itertools
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch
import torch.distributed as dist

from .grid_shape import AXES, GridShape  # AXES: slowest ... fastest



def default_timeout_s() -> float:
    """Seconds a collective may wait before it fails: ``$AXONN_TIMEOUT`` when :func:`init` runs, else 300."""
    return float(os.environ.get("AXONN_TIMEOUT", "300"))

_GRID: "Grid | None" = None


def _canon(axes: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(axes, str):
        axes = (axes,)
    axes = tuple(axes)
    bad = [a for a in axes if a not in AXES]
    if bad:
        raise ValueError(f"unknown grid axis {bad}; valid axes are {AXES}")
    return tuple(a for a in AXES if a in axes)


@dataclass
class Grid:
    """Holds sizes, this rank's coordinates and the process groups of a grid."""

    sizes: dict[str, int]
    coords: dict[str, int]
    rank: int
    world_size: int
    backend: str
    device: torch.device
    _groups: dict[tuple[str, ...], object] = field(default_factory=dict, repr=False)
    _destroyed: bool = field(default=False, repr=False)

    # -- convenience -----------------------------------------------------
    @property
    def shape(self) -> GridShape:
        """The axis sizes as a :class:`GridShape` (``D,R,C,Z``)."""
        return GridShape(self.sizes["data"], self.sizes["row"], self.sizes["col"], self.sizes["depth"])

    @property
    def G_data(self) -> int:
        return self.sizes["data"]

    @property
    def G_intra_d(self) -> int:
        return self.sizes["depth"]

    @property
    def G_intra_r(self) -> int:
        return self.sizes["row"]

    @property
    def G_intra_c(self) -> int:
        return self.sizes["col"]

    def size(self, axes: str | Iterable[str]) -> int:
        """Product of the sizes of ``axes``."""
        n = 1
        for a in _canon(axes):
            n *= self.sizes[a]
        return n

    def index(self, axes: str | Iterable[str]) -> int:
        """This rank's index inside the group spanned by ``axes`` (slowest axis major)."""
        i = 0
        for a in _canon(axes):
            i = i * self.sizes[a] + self.coords[a]
        return i

    def group(self, axes: str | Iterable[str]):
        """Process group spanning ``axes`` (``None`` when its size is 1)."""
        if self._destroyed:
            # None would mean "the world group" to torch.distributed: a collective on a destroyed
            # grid would silently reduce over every rank instead of failing
            raise RuntimeError(f"{self} was destroyed (Grid.destroy()): build a new grid with axonn.init(...) "
                               "and parallelize a fresh model on it")
        return self._groups.get(_canon(axes))

    def rank_of(self, data: int = 0, depth: int = 0, row: int = 0, col: int = 0) -> int:
        """Global rank of grid coordinates (column fastest, then row, depth, data)."""
        return ((data * self.sizes["depth"] + depth) * self.sizes["row"] + row) * self.sizes["col"] + col

    def destroy(self) -> None:
        """Destroy the process groups this grid created (not the world group).

        For a process that tries many grids in turn (``benchmarks/planner_validation.py``):
        every gloo/NCCL group holds threads, sockets and buffers until destroyed. The grid and
        every model parallelized on it are unusable afterwards; ``torch.distributed`` stays up.
        """
        for g in set(self._groups.values()):
            if g is not None and g is not dist.group.WORLD:
                dist.destroy_process_group(g)
        self._groups.clear()
        self._destroyed = True

    def __str__(self) -> str:
        s = " x ".join(f"{a}={self.sizes[a]}" for a in AXES)
        return f"Grid({s}; rank {self.rank} at {self.coords})"


def coords_of(rank: int, sizes: dict[str, int]) -> dict[str, int]:
    c: dict[str, int] = {}
    for a in reversed(AXES):  # fastest first
        c[a] = rank % sizes[a]
        rank //= sizes[a]
    return c


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _mpi_world() -> tuple[int, int] | None:
    """(rank, size) when launched by mpiexec/srun, else None."""
    keys = [("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")]
    for rk, sk in keys:
        if rk in os.environ and sk in os.environ and int(os.environ[sk]) > 1:
            return int(os.environ[rk]), int(os.environ[sk])
    return None


# The launcher that started this process sets its own variables; Slurm's come last because a
# batch shell's SLURM_LOCALID=0 (and its SLURM_*TASKS_PER_NODE) is inherited by every rank an
# mpiexec inside the job starts, while Open MPI's / MPICH's / PALS's are set per process.
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK",
                    "PALS_LOCAL_RANKID", "SLURM_LOCALID")
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE",
                   "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE")


def local_device_index(rank: int, device_count: int, env: Mapping[str, str] = os.environ) -> int:
    """The CUDA device this rank drives: its node-local rank modulo the devices it can see.

    The node-local rank comes from the launcher (torchrun ``LOCAL_RANK``, Open MPI, MPICH/Hydra,
    Cray PALS, then Slurm ``SLURM_LOCALID``, which an mpiexec inside a batch job inherits as 0 on
    every rank), else the global rank.  The modulo matters on machines
    whose launcher binds one GPU per task (``srun --gpu-bind=closest`` on Frontier,
    ``CUDA_VISIBLE_DEVICES`` per task): there task 5 of a node sees a single device, index 0.
    """
    if device_count < 1:
        raise RuntimeError("the NCCL backend needs a GPU but this process sees none: check CUDA_VISIBLE_DEVICES "
                           "/ ROCR_VISIBLE_DEVICES and the launcher's --gpus-per-task, or use backend='gloo'")
    local = next((int(env[k]) for k in _LOCAL_RANK_VARS if env.get(k, "").strip().isdigit()), rank)
    return local % device_count


def ranks_per_node(env: Mapping[str, str] = os.environ) -> int:
    """Processes sharing this node (its host memory): from the launcher (torchrun, Slurm, Open MPI,
    MPICH/Hydra, Cray PALS), else the GPUs this process sees, else 1."""
    for k in LOCAL_SIZE_VARS:
        # Slurm writes "8(x2)" (8 on each of 2 nodes) or "3(x2),2" (uneven): take the largest count
        counts = [int(c) for c in re.findall(r"(?:^|,)\s*(\d+)", env.get(k, ""))]
        if counts and max(counts) > 0:
            return max(counts)
    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def launcher_world_size() -> int:
    """Number of processes the launcher started (torchrun, mpiexec, srun), 1 when none; no communication."""
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 0)) or (_mpi_world() or (0, 0))[1] or 1


def launcher_rank() -> int:
    """This process's global rank (the launcher's statement of it before ``torch.distributed`` exists)."""
    if dist.is_initialized():
        return dist.get_rank()
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    mpi = _mpi_world()
    return mpi[0] if mpi is not None else 0


def _init_distributed(backend: str, timeout_s: float) -> None:
    """Initialise torch.distributed from torchrun env, MPI, or as a 1-process world."""
    timeout = _dt.timedelta(seconds=timeout_s)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
        return
    mpi = _mpi_world()
    if mpi is not None:
        from mpi4py import MPI  # imported lazily: only needed under mpiexec/srun

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        addr = None
        if rank == 0:
            addr = (os.environ.get("MASTER_ADDR") or socket.gethostbyname(socket.gethostname()),
                    int(os.environ.get("MASTER_PORT") or _free_port()))
        host, port = comm.bcast(addr, root=0)
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=rank,
                                world_size=size, timeout=timeout)
        return
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)


def exit_with_launcher() -> bool:
    """Under ``torchrun``: have the kernel send this worker SIGTERM when its launcher dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``), so a launcher killed with ``kill -9`` leaves no workers running on (and writing
    the run directory) behind it.  ``mpiexec`` and ``srun`` end their own tasks.  Returns whether it is armed."""
    import ctypes
    import signal
    import sys

    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:  # the launcher died before the signal was armed: this worker is init's now
        os.kill(os.getpid(), signal.SIGTERM)
    return True


def init(G_data: int | GridShape = 1, G_intra_r: int = 1, G_intra_c: int = 1, G_intra_d: int = 1,
         backend: str | None = None, timeout_s: float | None = None) -> Grid:
    """Create the 4D grid (initialising ``torch.distributed`` if needed) and return it.

    The sizes are ``G_data, G_intra_r, G_intra_c, G_intra_d`` (data, row, column, depth), or one
    :class:`GridShape` in their place: ``init(GridShape.parse("2,2,1,2"))``.

    ``backend=None`` picks NCCL when CUDA is available, else gloo.  ``timeout_s``
    (default ``$AXONN_TIMEOUT`` or 300 s) bounds every collective, so a dead rank
    makes the others fail with an error instead of hanging.  May be called again
    in the same process to build a different grid over the same world (the new
    grid replaces the handle returned by :func:`get_grid`).
    """
    global _GRID
    if isinstance(G_data, GridShape):
        if (G_intra_r, G_intra_c, G_intra_d) != (1, 1, 1):
            raise TypeError(f"axonn.init({G_data!r}, ...): give the grid as one GridShape or as the four sizes "
                            "G_data, G_intra_r, G_intra_c, G_intra_d, not both")
        shape = G_data
    else:
        shape = GridShape(int(G_data), int(G_intra_r), int(G_intra_c), int(G_intra_d))
    sizes = shape.sizes()
    for a, v in sizes.items():
        if v < 1:
            raise ValueError(f"grid axis {a} must be >= 1, got {v}")
    if backend is None:
        backend = dist.get_backend() if dist.is_initialized() else ("nccl" if torch.cuda.is_available() else "gloo")
    timeout_s = default_timeout_s() if timeout_s is None else float(timeout_s)
    # Refuse before any allocation / rendezvous when the world size is already known.
    world = launcher_world_size()
    _check_product(sizes, world)
    if "nccl" in backend:  # bind this rank's GPU before NCCL creates its first communicator
        torch.cuda.set_device(local_device_index(launcher_rank(), torch.cuda.device_count()))
    if not dist.is_initialized():
        exit_with_launcher()
        _init_distributed(backend, timeout_s)
    backend = dist.get_backend()
    world = dist.get_world_size()
    _check_product(sizes, world)
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")
    grid = Grid(sizes=sizes, coords=coords_of(rank, sizes), rank=rank, world_size=world,
                backend=backend, device=device)
    _build_groups(grid, _dt.timedelta(seconds=timeout_s))
    _GRID = grid
    return grid


def _check_product(sizes: dict[str, int], world: int) -> None:
    prod = sizes["data"] * sizes["depth"] * sizes["row"] * sizes["col"]
    if prod != world:
        others = prod // sizes["data"]
        hint = (f"set G_data={world // others}" if world % others == 0
                else "change G_intra_r/G_intra_c/G_intra_d so that their product divides the world size")
        raise ValueError(
            f"grid G_data={sizes['data']} x G_intra_d={sizes['depth']} x G_intra_r={sizes['row']} x "
            f"G_intra_c={sizes['col']} = {prod} != world size {world}; {hint}")


_GRID_ARG = {"data": "G_data", "depth": "G_intra_d", "row": "G_intra_r", "col": "G_intra_c"}


def divisor_hint(n: int, size: int, axis: str) -> str:
    """How to fix "``n`` is not divisible by the ``axis`` size ``size``": the sizes nearest to
    ``size`` that divide ``n``, and where the rest of the parallelism can go (depth splits a
    flattened, zero-padded block and has no divisibility constraint)."""
    divs = {d for i in range(1, int(n ** 0.5) + 1) if n % i == 0 for d in (i, n // i)}
    near = sorted({max((d for d in divs if d < size), default=1), min((d for d in divs if d > size), default=n)})
    others = " or ".join(_GRID_ARG[a] for a in ("row", "col", "depth") if a != axis)
    return (f"; use a {_GRID_ARG[axis]} that divides {n} (nearest: {' or '.join(map(str, near))}) "
            f"and put the remaining factor of tensor parallelism on {others}")


def _build_groups(grid: Grid, timeout: _dt.timedelta) -> None:
    """Create one process group per (combination of axes, fixed other coordinates).

    Every rank calls ``new_group`` for every group in the same order (required
    by torch.distributed); each rank keeps the ones it belongs to.  ``timeout`` is passed to
    every group: ``new_group`` does not inherit the world group's, so without it a collective
    on a sub-group (every row/col/depth one) would wait torch's default (30 min on gloo, 10 on
    NCCL) for a stuck rank instead of ``AXONN_TIMEOUT``.
    """
    sizes = grid.sizes
    for k in range(1, len(AXES) + 1):
        for combo in itertools.combinations(AXES, k):
            n = 1
            for a in combo:
                n *= sizes[a]
            if n == 1:
                continue
            if n == grid.world_size:
                grid._groups[combo] = dist.group.WORLD
                continue
            fixed = [a for a in AXES if a not in combo]
            for fixed_vals in itertools.product(*[range(sizes[a]) for a in fixed]):
                members = []
                for var_vals in itertools.product(*[range(sizes[a]) for a in combo]):
                    c = dict(zip(fixed, fixed_vals)) | dict(zip(combo, var_vals))
                    members.append(grid.rank_of(**c))
                g = dist.new_group(sorted(members), timeout=timeout)
                if grid.rank in members:
                    grid._groups[combo] = g


def get_grid() -> Grid:
    """The grid created by the last :func:`init` call."""
    if _GRID is None:
        raise RuntimeError("axonn grid not initialised: call axonn.init(...) first")
    return _GRID


def batch_slice(global_batch: torch.Tensor, grid: Grid | None = None) -> torch.Tensor:
    """This rank's slice (dim 0) of a global batch.

    The batch is split into ``G_data * G_intra_d`` equal contiguous chunks; the
    chunk index is ``d * G_intra_d + z`` (data-major).  Ranks that differ only in
    row/column index get the same chunk.
    """
    grid = grid or get_grid()
    n = grid.size(("data", "depth"))
    b = global_batch.shape[0]
    if b % n:
        raise ValueError(f"global batch size {b} is not divisible by G_data*G_intra_d = {n}")
    per = b // n
    i = grid.index(("data", "depth"))
    return global_batch[i * per:(i + 1) * per]
