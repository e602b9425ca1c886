"""hpc_codegen/outcomes.py: each failed sample's cause is read from what really happened to it -- gcc's first
diagnostic of a real build, the run's status, whether the completion closed the function --, a body counts as
using its execution model only when its code (not a comment) calls the model's API, and the counts per execution
model add up to the samples scored."""
from __future__ import annotations

import pytest

from hpc_codegen import SandboxLimits, load_suite
from hpc_codegen.code_blocks import extract_c_body
from hpc_codegen.outcomes import CAUSES, add_outcomes, failure_cause, first_error, uses_parallel_api
from hpc_codegen.harness import RunConfig, evaluate_c
from hpc_codegen.reference import prepare_reference

# completions of `double array_sum(const double *x, size_t n) {`, one per build-error cause (the text after the
# prompt, as a model writes it)
COMPLETIONS = {
    "pointer misuse": "    double s = 0;\n    for (size_t i = 0; i < n; i++) s += x[i][0];\n    return s;\n}\n",
    "redeclaration": "    double n = 0;\n    return n;\n}\n",
    "writes const input": "    x[0] = 0;\n    return 0;\n}\n",
    "unknown name": "    double s = 0;\n    for (size_t i = 0; i < n; i++) s = max(s, x[i]);\n    return s;\n}\n",
    "C++ in C": "    double s = double(x[0]);\n    (void)n;\n    return s;\n}\n",
    "syntax": "    double s = 0;\n    for (size_t i = 0; i < n; i++) s += ;\n    return s;\n}\n",
    "unclosed": "    double s = 0;\n    for (size_t i = 0; i < n; i++) {\n        s += x[i]; s += x[i]; s +=",
    "wrong output": "    (void)x; (void)n;\n    return 42.0;\n}\n",
}


def test_each_cause_is_read_from_a_real_builds_first_error_or_the_runs_status():
    """Real gcc builds and runs of one problem (reduce_array_sum, serial): the cause of each bad completion is
    the one it was written to have, and the reference passes with no cause."""
    (problem,), _ = load_suite(patterns=["reduce_array_sum_serial"])
    cfg = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=30.0, memory_mb=512))
    ref = prepare_reference(problem, cfg)
    try:
        passed = evaluate_c(problem, problem.reference, cfg, ref)
        assert failure_cause(passed.status, passed.message, True) is None
        for cause, completion in COMPLETIONS.items():
            res = evaluate_c(problem, extract_c_body(completion), cfg, ref)
            closed = cause != "unclosed"
            assert failure_cause(res.status, res.message, closed) == cause, (cause, first_error(res.message))
    finally:
        ref.cleanup()


def test_the_first_error_decides_and_a_link_failure_names_its_missing_symbol():
    """The first ``error:`` line wins over later ones; a link failure (no ``error:`` before the linker) is read
    from its ``undefined reference`` line; the run statuses map one to one."""
    log = ("c.c:3:5: warning: unused\nc.c:4:9: error: 'q' redeclared as different kind of symbol\n"
           "c.c:9:1: error: expected ';' before '}' token\n")
    assert first_error(log).endswith("redeclared as different kind of symbol")
    assert failure_cause("build_error", log, True) == "redeclaration"
    link = "c.c:5: warning: implicit declaration of function 'max'\n/usr/bin/ld: c.o: undefined reference to `max'\n"
    assert failure_cause("build_error", link, True) == "unknown name"
    assert failure_cause("build_error", log, False) == "unclosed"  # an unclosed body's errors follow from it
    gxx = {"candidate.cpp:18:11: error: invalid cast from type ‘double’ to type ‘double*’": "pointer misuse",
           "candidate.cpp:22:25: error: invalid types ‘const double[int]’ for array subscript": "pointer misuse",
           "candidate.cpp:30:16: error: redeclaration of ‘double j’": "redeclaration",
           "candidate.cpp:9:5: error: ‘max’ was not declared in this scope": "unknown name"}  # g++ (Kokkos)
    assert {line: failure_cause("build_error", line, True) for line in gxx} == gxx
    assert [failure_cause(s, "", True) for s in ("timeout", "runtime_error", "wrong_output")] == \
        ["time-out", "crash", "wrong output"]


def test_a_body_uses_its_model_only_when_its_code_calls_the_models_api():
    """A pragma or ``omp_*`` call for OpenMP, an ``MPI_*`` call for MPI, both for MPI+OpenMP, a
    ``Kokkos::parallel_*`` pattern, a thread index for CUDA/HIP; the same words in a comment do not count;
    serial has no API to use."""
    omp = "    double s = 0;\n#pragma omp parallel for reduction(+:s)\n    for (size_t i = 0; i < n; i++) s += x[i];\n"
    mpi = "    int r; MPI_Comm_rank(MPI_COMM_WORLD, &r);\n"
    assert uses_parallel_api(omp, "openmp") and not uses_parallel_api(mpi, "openmp")
    assert uses_parallel_api("    int t = omp_get_num_threads();\n", "openmp")
    assert uses_parallel_api(mpi, "mpi") and not uses_parallel_api("    int MPI_rank = 0;\n", "mpi")
    assert not uses_parallel_api(mpi, "mpi+omp") and uses_parallel_api(mpi + omp, "mpi+omp")
    assert uses_parallel_api("  Kokkos::parallel_reduce(n, KOKKOS_LAMBDA(int i, double &s) {}, r);", "kokkos")
    assert uses_parallel_api("  size_t i = blockIdx.x * blockDim.x + threadIdx.x;", "cuda")
    assert not uses_parallel_api("    // #pragma omp parallel for\n    /* MPI_Allreduce(...) */\n", "mpi+omp")
    assert uses_parallel_api(omp, "serial") is None


def test_counts_per_model_add_up_to_the_samples_and_list_every_cause():
    """``add_outcomes`` annotates every sample and counts each model's samples once; a count for every cause
    (zeros too) and, for a parallel model, how many used its API and passed using it; a completions list of
    another shape is refused."""
    report = {"results": [
        {"name": "a_serial", "model": "serial", "sample_results": [
            {"status": "passed", "message": ""}, {"status": "build_error", "message": "x.c:1: error: expected ')'"}]},
        {"name": "a_omp", "model": "openmp", "sample_results": [
            {"status": "timeout", "message": "killed"}, {"status": "passed", "message": ""},
            {"status": "passed", "message": ""}]},
    ]}
    table = add_outcomes(report, [["}", "x; }"], ["#pragma omp parallel\nfor (;;", "#pragma omp for\n}", "}"]])
    assert report["outcomes"] is table
    assert list(table["serial"]) == ["samples", "uses_api", "passed_with_api", "passed", *CAUSES]
    assert table["serial"]["passed"] == 1 and table["serial"]["syntax"] == 1 and table["serial"]["uses_api"] is None
    assert table["openmp"]["time-out"] == 1 and table["openmp"]["passed"] == 2
    assert table["openmp"]["uses_api"] == 2 and table["openmp"]["passed_with_api"] == 1
    for t in table.values():
        assert t["samples"] == t["passed"] + sum(t[c] for c in CAUSES)
    assert {m: t["samples"] for m, t in table.items()} == {"serial": 2, "openmp": 3}
    assert [s["cause"] for r in report["results"] for s in r["sample_results"]] == [None, "syntax", "time-out",
                                                                                   None, None]
    with pytest.raises(ValueError, match="1 completions for 2 samples"):
        add_outcomes(report, [["}"], ["}", "}", "}"]])
