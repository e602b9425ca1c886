"""Translation (portability) tasks: given a working solution in one execution model, write it in another.

Made from the suite itself: for each problem with both models of a pair in :data:`PAIRS`, the task's prompt
is the *source* problem's prompt and reference solution -- its function renamed ``<name>_<source model>`` so
that both live in one translation unit, and real code, so the model reads it as code -- followed by an
instruction and the *target* problem's prompt; everything else (driver, reference, sizes) is the target's, so
a translation is built, run, checked and timed exactly like the target problem, and its metrics compare with
writing the target from its description alone.  Into Kokkos the whole file is C++: the serial sources are
written to compile as C and C++ alike (``malloc``'s result cast).  ``Problem.source_model`` names the source.
"""
from __future__ import annotations

import re
from dataclasses import replace

from hpc_codegen.problems import Problem

PAIRS = (("serial", "openmp"), ("serial", "mpi"), ("openmp", "mpi"), ("mpi", "mpi+omp"), ("serial", "kokkos"))
SHORT = {"serial": "serial", "openmp": "omp", "mpi": "mpi", "mpi+omp": "mpi_omp", "kokkos": "kokkos", "cuda": "cuda",
         "hip": "hip"}
LABEL = {"serial": "serial C", "openmp": "OpenMP", "mpi": "MPI", "mpi+omp": "MPI+OpenMP", "kokkos": "Kokkos",
         "cuda": "CUDA", "hip": "HIP"}


def translation_prompt(source: Problem, target: Problem) -> str:
    """The source's code (function renamed) and the instruction, then the target's prompt."""
    fn = source.function
    renamed = f"{fn}_{SHORT[source.model]}"
    code = re.sub(rf"\b{re.escape(fn)}\b", renamed, source.prompt + source.reference)
    return (f"/* A working {LABEL[source.model]} implementation, `{renamed}`: */\n{code.rstrip()}\n\n"
            f"/* Translate `{renamed}` above to {LABEL[target.model]}: write `{fn}` below with the same result. */\n"
            f"{target.prompt}")


def translation_problems(problems: list[Problem]) -> list[Problem]:
    """One translation task per (problem, pair of :data:`PAIRS`) whose both models are in ``problems``."""
    by = {(p.type, p.function, p.model): p for p in problems if p.source_model is None}
    tasks = []
    for (ptype, fn, model), target in sorted(by.items()):
        for src_model, dst_model in PAIRS:
            source = by.get((ptype, fn, src_model))
            if dst_model != model or source is None:
                continue
            name = f"{source.name}_to_{SHORT[dst_model]}"
            tasks.append(replace(target, name=name, prompt=translation_prompt(source, target),
                                 description=f"translate {source.name} to {LABEL[dst_model]}",
                                 source_model=src_model))
    return tasks
