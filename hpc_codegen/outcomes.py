"""What happened to each scored sample: why it failed (one cause, from its status, its build's first diagnostic
and whether the completion closed the function), and whether its code calls its execution model's parallel API at
all (a serial body passes an OpenMP or MPI problem, at a speedup near 1: ParEval counts it, a reader should know).

The causes, in the order they are tested:

- ``unclosed``: a build error of a completion that never closed the function (it ran to the token cap, often
  repeating a line, or the model ended its code block early); the extractor appended a ``}``.
- ``pointer misuse``: the first error subscripts or dereferences a scalar, or converts a scalar to a pointer
  (``C[i][j]`` on a flat ``double *``, ``*x`` on a ``double``).
- ``redeclaration``: redeclares a parameter or defines one of its names twice.
- ``writes const input``: assigns through a ``const`` parameter.
- ``unknown name``: uses a variable or calls a function that does not exist (``max``/``min`` in C, a helper
  the model never wrote): an undeclared identifier or an undefined reference at link time.
- ``C++ in C``: a C++ functional cast (``double(x[0])``, ``size_t(i)``) in a C build.
- ``syntax``: any other ``expected ...`` diagnostic.
- ``other build error``; then the run statuses ``wrong output``, ``crash`` (a signal or a non-zero exit),
  ``time-out``.

The first compiler error decides (later ones usually follow from it): the first one in the part of the log a
sample's message keeps (its tail, :func:`.toolchain.tail_text`).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

from hpc_codegen.code_blocks import c_body_closed, extract_c_body

CAUSES = ("unclosed", "pointer misuse", "redeclaration", "writes const input", "unknown name", "C++ in C",
          "syntax", "other build error", "wrong output", "crash", "time-out")

_BUILD = (  # (cause, pattern of the first error line), tested in order
    ("pointer misuse", re.compile(r"subscripted value is neither|invalid type argument of|"
                                  r"cannot convert to a pointer type|incompatible type|invalid operands|"
                                  r"invalid types .* for array subscript|invalid cast from type|"
                                  r"invalid conversion from")),  # gcc's C wording, then g++'s
    ("redeclaration", re.compile(r"redeclared as different kind|redefinition of|conflicting types|"
                                 r"shadows a parameter|redeclaration of|conflicting declaration")),
    ("writes const input", re.compile(r"read-only|assignment of read-only|discards .const. qualifier")),
    ("unknown name", re.compile(r"undeclared|undefined reference|was not declared|implicit declaration|"
                                r"has no member named|is not a member of")),
    ("C++ in C", re.compile(r"candidate\.c:.*expected expression before .(?:size_t|double|float|int|long|unsigned|"
                            r"char|bool).$")),
    ("syntax", re.compile(r"expected ")),
)


def first_error(message: str) -> str:
    """The first compiler or linker error line of a build log (``undefined reference`` for a link failure),
    else the log's last line."""
    lines = message.splitlines()
    for line in lines:
        if "error:" in line or "undefined reference" in line:
            return line.strip()
    return lines[-1].strip() if lines else ""


def failure_cause(status: str, message: str, closed: bool) -> str | None:
    """The cause (one of :data:`CAUSES`) of a sample that ended with ``status`` and ``message``; ``closed``:
    whether its completion closed the function.  None for a passed sample."""
    if status == "passed":
        return None
    if status == "wrong_output":
        return "wrong output"
    if status == "timeout":
        return "time-out"
    if status == "runtime_error":
        return "crash"
    if not closed:
        return "unclosed"
    line = first_error(message)
    for cause, pattern in _BUILD:
        if pattern.search(line):
            return cause
    return "other build error"


# a call of the execution model's parallel API (comments are not code: stripped first)
_API = {"openmp": (re.compile(r"#\s*pragma\s+omp\b|\bomp_\w+\s*\("),),
        "mpi": (re.compile(r"\bMPI_[A-Z]\w*\s*\("),),
        "kokkos": (re.compile(r"\bKokkos::parallel_(?:for|reduce|scan)\b"),),
        "cuda": (re.compile(r"\b(?:threadIdx|blockIdx)\b"),)}
_API["mpi+omp"] = _API["mpi"] + _API["openmp"]
_API["hip"] = _API["cuda"]
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def uses_parallel_api(body: str, model: str) -> bool | None:
    """Whether ``body`` calls ``model``'s parallel API: an OpenMP pragma or ``omp_*`` call, an ``MPI_*`` call
    (MPI+OpenMP: both), a ``Kokkos::parallel_*`` pattern, a CUDA/HIP thread index; None for serial (and for a
    model without a known API)."""
    pats = _API.get(model)
    if pats is None:
        return None
    code = _COMMENT.sub(" ", body)
    return all(p.search(code) for p in pats)


def add_outcomes(report: dict, completions: Sequence[Sequence[str]]) -> dict[str, dict[str, int | None]]:
    """Set ``cause`` and ``uses_api`` on every sample of ``report["results"]`` (``completions[i][j]``: the raw
    completion of sample j of result i) and return, and store as ``report["outcomes"]``, per execution model:
    ``samples``, ``uses_api`` and ``passed_with_api`` (None for serial), ``passed`` and the count of each cause
    (every cause listed, zeros included, in :data:`CAUSES` order)."""
    results = report["results"]
    if len(completions) != len(results):
        raise ValueError(f"{len(completions)} problems' completions for {len(results)} results")
    counts: dict[str, Counter] = {}
    for res, raws in zip(results, completions):
        samples = res["sample_results"]
        if len(raws) != len(samples):
            raise ValueError(f"{res['name']}: {len(raws)} completions for {len(samples)} samples")
        n = counts.setdefault(res["model"], Counter())
        for s, raw in zip(samples, raws):
            s["cause"] = failure_cause(s["status"], s["message"], c_body_closed(raw))
            s["uses_api"] = uses_parallel_api(extract_c_body(raw), res["model"])
            n["samples"] += 1
            n[s["cause"] or "passed"] += 1
            n["uses_api"] += bool(s["uses_api"])
            n["passed_with_api"] += bool(s["uses_api"]) and s["cause"] is None
    table = {}
    for m, n in counts.items():
        api = {k: None if _API.get(m) is None else n[k] for k in ("uses_api", "passed_with_api")}
        table[m] = {"samples": n["samples"], **api, "passed": n["passed"], **{c: n[c] for c in CAUSES}}
    report["outcomes"] = table
    return table
