"""Loading the HPC-code problem suite.

A suite directory holds ``problems/*.yaml`` (one problem per file), the shared
per-type drivers in ``drivers/`` and the generic mains in ``harness/``.
A problem file has the keys::

    name, type, model (serial|openmp|mpi|mpi+omp|kokkos|cuda), description, driver (path relative
    to the suite), size, quick_size, prompt (C code ending in the function's
    opening brace), reference (the body that completes the prompt)

and a CUDA problem also ``gpu`` (its buffers and launch configuration, see :mod:`.gpu`).  Each CUDA problem
also yields a HIP problem (``<name>`` with ``_hip`` for ``_cuda``), derived from it by :func:`.gpu.hipify`:
the CUDA file is the one source of both.

A file that does not parse or is missing keys becomes a :class:`TaskError`
(reported per problem) instead of aborting the evaluation.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

import yaml

from hpc_codegen.gpu import GPU_MODELS, hipify

C_MODELS = ("serial", "openmp", "mpi", "mpi+omp")  # C, built with gcc / mpicc
MODELS = (*C_MODELS, "kokkos", *GPU_MODELS)
FILE_MODELS = (*C_MODELS, "kokkos", "cuda")  # models a problem file may name (HIP is derived from CUDA)
MPI_MODELS = ("mpi", "mpi+omp")  # built with mpicc, launched by mpiexec
CXX_MODELS = ("kokkos",)  # C++ with an extern "C" function, built with g++ against a library (hpc_codegen.kokkos)
REQUIRED_KEYS = ("name", "type", "model", "driver", "size", "quick_size", "prompt", "reference")


@dataclass(frozen=True)
class Problem:
    """One problem: a (problem type, execution model) pair."""

    name: str
    type: str
    model: str
    description: str
    prompt: str
    reference: str
    driver_path: Path
    harness_dir: Path
    size: int
    quick_size: int
    path: Path
    source_model: str | None = None  # a translation task's source execution model (hpc_codegen.translation)
    gpu: dict | None = None  # GPU models: buffers and launch configuration of the trusted adapter (.gpu)

    @property
    def task(self) -> str:
        """``write`` (from the description) or ``translate`` (from a working solution in another model)."""
        return "write" if self.source_model is None else "translate"

    @property
    def parallel(self) -> bool:
        return self.model != "serial"

    @property
    def uses_mpi(self) -> bool:
        return self.model in MPI_MODELS

    @property
    def on_gpu(self) -> bool:
        """Whether the candidate is CUDA or HIP code (``candidate.cu``, nvcc / hipcc) run on a GPU."""
        return self.model in GPU_MODELS

    @property
    def cxx(self) -> bool:
        """Whether the candidate is C++ (``candidate.cpp``, g++) rather than C."""
        return self.model in CXX_MODELS

    @property
    def language(self) -> str:
        """The candidate's language as a markdown fence tag: ``c``, ``cpp`` (Kokkos) or ``cuda`` (CUDA and HIP)."""
        return "cuda" if self.on_gpu else "cpp" if self.cxx else "c"

    @property
    def function(self) -> str:
        """Name of the function the prompt asks for (the signature that ends the prompt)."""
        m = re.search(r"(\w+)\s*\([^()]*\)\s*\{\s*$", self.prompt)
        if m is None:
            raise ValueError(f"{self.name}: the prompt does not end with a function signature and '{{'")
        return m.group(1)


@dataclass(frozen=True)
class TaskError:
    """A problem file that could not be loaded, with the reason."""

    path: Path
    error: str

    @property
    def name(self) -> str:
        return self.path.stem


def default_suite_dir() -> Path:
    """``data/hpc_code`` of the repository this package lives in."""
    return Path(__file__).resolve().parents[1] / "data" / "hpc_code"


def load_problem(path: Path, suite_dir: Path) -> Problem:
    """Parse and validate one problem file; raises ``ValueError`` with a clear message."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot parse {path.name}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ValueError(f"{path.name}: top level must be a mapping, got {type(doc).__name__}")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise ValueError(f"{path.name}: missing keys {missing}")
    if doc["model"] not in FILE_MODELS:
        raise ValueError(f"{path.name}: model must be one of {FILE_MODELS}, got {doc['model']!r}"
                         + (" (HIP problems are derived from the CUDA ones)" if doc["model"] == "hip" else ""))
    gpu = doc.get("gpu")
    if doc["model"] == "cuda" and not (isinstance(gpu, dict) and isinstance(gpu.get("buffers", {}), dict)):
        raise ValueError(f"{path.name}: a cuda problem needs a `gpu` mapping (buffers, grid, block, result)")
    for key in ("prompt", "reference"):
        if not isinstance(doc[key], str) or not doc[key].strip():
            raise ValueError(f"{path.name}: {key} must be a non-empty string")
    if not doc["prompt"].rstrip().endswith("{"):
        raise ValueError(f"{path.name}: prompt must end with the function's opening brace")
    try:
        size, quick = int(doc["size"]), int(doc["quick_size"])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path.name}: size/quick_size must be integers") from exc
    driver = (suite_dir / doc["driver"]).resolve()
    if not driver.is_file():
        raise ValueError(f"{path.name}: driver {doc['driver']} not found in {suite_dir}")
    harness = suite_dir / "harness"
    if not (harness / "hpc_harness.h").is_file():
        raise ValueError(f"{path.name}: harness directory {harness} is missing hpc_harness.h")
    return Problem(
        name=str(doc["name"]),
        type=str(doc["type"]),
        model=doc["model"],
        description=str(doc.get("description", "")),
        prompt=doc["prompt"],
        reference=doc["reference"],
        driver_path=driver,
        harness_dir=harness.resolve(),
        size=size,
        quick_size=quick,
        path=path,
        gpu=gpu if doc["model"] == "cuda" else None,
    )


def hip_problem(cuda: Problem) -> Problem:
    """The HIP problem of a CUDA one: prompt and reference through :func:`.gpu.hipify`, all else the same."""
    name = cuda.name[:-len("_cuda")] + "_hip" if cuda.name.endswith("_cuda") else cuda.name + "_hip"
    return replace(cuda, name=name, model="hip", prompt=hipify(cuda.prompt), reference=hipify(cuda.reference),
                   description=hipify(cuda.description))


def load_suite(
    suite_dir: Path | str | None = None,
    patterns: list[str] | None = None,
    models: list[str] | None = None,
) -> tuple[list[Problem], list[TaskError]]:
    """Load every ``problems/*.yaml`` (sorted by name).

    ``patterns`` are shell globs matched against the problem file stem (e.g.
    ``"sort_*"``; a CUDA file also by its HIP problem's name); ``models`` keeps only those execution models.
    Returns the loaded problems and one :class:`TaskError` per file that failed to load.
    """
    suite = Path(suite_dir) if suite_dir is not None else default_suite_dir()
    files = sorted((suite / "problems").glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"no problems/*.yaml under {suite}")
    def wanted(name: str) -> bool:
        return not patterns or any(fnmatch.fnmatch(name, p) for p in patterns)

    def hip_name(stem: str) -> str:
        return stem[:-len("_cuda")] + "_hip" if stem.endswith("_cuda") else ""

    files = [f for f in files if wanted(f.stem) or (hip_name(f.stem) and wanted(hip_name(f.stem)))]
    problems, errors = [], []
    for f in files:
        try:
            p = load_problem(f, suite)
        except ValueError as exc:
            errors.append(TaskError(f, str(exc)))
            continue
        derived = [p, hip_problem(p)] if p.model == "cuda" else [p]
        problems += [q for q in derived if (models is None or q.model in models) and wanted(q.name)]
    return sorted(problems, key=lambda q: q.name), errors
