"""hpc_codegen/harness.py and reference.py: the verdicts on the suite, through the library and
``eval/hpc_code.py`` -- every reference passes, each failure gets its kind, plausible wrong candidates and
broken variants are rejected, every run is checked against untouched inputs, and the command line refuses bad
flags before it evaluates.

Everything here runs with ``--quick`` inputs; the default suite runs a share of the problems, the slow tests
all of them.  The sandbox and hostile candidates have their own files (test_sandbox.py,
test_hostile_candidates.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest

from hpc_codegen import SandboxLimits, load_suite
from hpc_codegen import evaluate as hpc_evaluate
from hpc_codegen.code_blocks import extract_c_body
from hpc_codegen.harness import RunConfig, evaluate_c
from hpc_codegen.problems import C_MODELS
from hpc_codegen.reference import SetupError, prepare_reference
from hpc_codegen.sandbox import isolation
from tests.support import TESTS, hpc_code_report, load_eval_cli


def quick_subset(problems: list) -> list:
    """Every sixth problem of the suite, each once, its execution model in rotation (serial, OpenMP, MPI,
    MPI+OpenMP): 10 of the 240 C prompts, every C model -- the default suite's share; the slow tests run all
    (Kokkos: test_kokkos.py)."""
    functions = sorted({(p.type, p.function) for p in problems})[::6]
    want = {key: C_MODELS[i % len(C_MODELS)] for i, key in enumerate(functions)}
    return [p for p in problems if want.get((p.type, p.function)) == p.model]


@pytest.mark.parametrize("which", ["subset", pytest.param("all", marks=pytest.mark.slow)])
def test_references_pass_via_cli(which):
    """The public interface: every reference passes and parallel problems report speedups at every worker count
    (an MPI+OpenMP run's n is ranks x 2 threads); the default suite runs :func:`quick_subset` with 2 workers, the
    slow one all 240 C prompts with 1 and 2 (the 60 Kokkos ones: test_kokkos.py)."""
    problems, _ = load_suite(models=list(C_MODELS))
    names = [p.name for p in (quick_subset(problems) if which == "subset" else problems)]
    workers = "2" if which == "subset" else "1,2"
    repeats = "1" if which == "subset" else "3"  # the default suite checks verdicts; timing is the slow run's
    report = hpc_code_report("--use-references", "--quick", "--timeout", "60", "--workers", workers,
                             "--repeats", repeats, "--problems", *names, timeout=1800)
    assert report["problems"] == len(names)
    assert report["pass@1"] == 1.0, [(r["name"], r["message"]) for r in report["results"] if r["status"] != "passed"]
    assert report["build@1"] == 1.0
    assert report["speedup@1"] > 0 and report["speedup_n"] == 2
    assert report["status_counts"]["passed"] == report["problems"]
    assert set(report["by_model"]) == set(C_MODELS)
    n = [int(w) for w in workers.split(",")]
    expected_n = {"serial": {"1"}, "openmp": {str(w) for w in n}, "mpi": {str(w) for w in n},
                  "mpi+omp": {str(2 * w) for w in n}}
    for r in report["results"]:
        assert r["status"] == "passed"
        assert set(r["speedups"]) == expected_n[r["model"]]
        assert all(v > 0 for v in r["speedups"].values()), r


# --------------------------------------------------------- failure kinds

BAD_BODIES = {
    "wrong_output": "    (void)x; (void)n;\n    return 42.0;\n}\n",
    "build_error": "    return x[0] +;\n}\n",
    "timeout": "    volatile double s = 0; for (;;) s += x[0];\n    return s;\n}\n",
    # unbounded allocation: malloc fails under RLIMIT_AS and the write crashes
    "runtime_error": "    for (;;) { char *p = malloc(1 << 24); memset(p, 1, 1 << 24); }\n    return 0;\n}\n",
}


@pytest.mark.parametrize("model", ["serial", pytest.param("omp", marks=pytest.mark.slow),
                                   pytest.param("mpi", marks=pytest.mark.slow)])
def test_each_kind_of_bad_body_gets_its_verdict(model):
    (problem,), _ = load_suite(patterns=[f"reduce_array_sum_{model}"])
    # generous limit except for the timeout case (Open MPI start-up + teardown alone takes ~3 s)
    cfg = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=30.0, memory_mb=512))
    short = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=2.0, memory_mb=512))
    for expected, body in BAD_BODIES.items():
        t0 = time.time()
        res = evaluate_c(problem, body, short if expected == "timeout" else cfg)
        assert res.status == expected, (expected, res.message)
        assert not res.speedups
        if expected == "timeout":
            assert time.time() - t0 < 10  # killed, not waited for
    assert evaluate_c(problem, "    exit(0);\n}\n", cfg).status == "runtime_error"  # no result line
    spam = '    for (;;) puts("spam spam spam");\n}\n'
    res = evaluate_c(problem, spam, cfg)
    assert res.status == "runtime_error" and "output limit" in res.message


# A plausible bug per problem type, as a wrapper around the reference (renamed
# ref_<fn> by a macro): every problem's checker must reject it.
BROKEN_WRAPPERS = {
    "array_sum": "double array_sum(const double *x, size_t n) { return ref_array_sum(x, n - 1); }",
    "prefix_sum": "void prefix_sum(const long long *x, long long *out, size_t n) {\n"
                  "    ref_prefix_sum(x, out, n); out[n - 1] -= x[n - 1]; }",  # last one exclusive
    "jacobi_2d": "void jacobi_2d(const double *in, double *out, size_t n) { ref_jacobi_2d(in, out, n); out[0] = in[0]; }",
    "histogram": "void histogram(const int *x, size_t n, size_t *bins, int nbins) { ref_histogram(x, n - 1, bins, nbins); }",
    "sort_ints": "void sort_ints(int *x, size_t n) { ref_sort_ints(x, n - 1); }",
    "gemv": "void gemv(const double *A, const double *x, double *y, size_t m, size_t n) {\n"
            "    ref_gemv(A, x, y, m, n); y[m / 2] += 1e-6; }",
    "spmv": "void spmv(size_t nrows, const int *rowptr, const int *colidx, const double *values,\n"
            "          const double *x, double *y) { ref_spmv(nrows - 1, rowptr, colidx, values, x, y); y[nrows - 1] = 0; }",
    "find_first": "long find_first(const int *x, size_t n, int target) {\n"  # the last hit, not the first
                  "    long r = -1; for (size_t i = 0; i < n; i++) if (x[i] == target) r = (long)i; return r; }",
    "bfs_levels": "void bfs_levels(int nv, const int *rowptr, const int *adj, int source, int *level) {\n"
                  "    ref_bfs_levels(nv, rowptr, adj, source, level);\n"
                  "    for (int v = 0; v < nv; v++) if (level[v] < 0) level[v] = 0; }",  # unreachable -> 0
    "closest_pair": "double closest_pair(const double *x, const double *y, size_t n) {\n"
                    "    double d = ref_closest_pair(x, y, n); return d * d; }",  # squared distance
    "dft_magnitude": "void dft_magnitude(const double *x, double *mag, size_t n) {\n"
                     "    ref_dft_magnitude(x, mag, n); for (size_t k = 0; k < n; k++) mag[k] *= mag[k]; }",
    "sigmoid": "void sigmoid(const double *x, double *y, size_t n) {\n"  # single precision
               "    ref_sigmoid(x, y, n); for (size_t i = 0; i < n; i++) y[i] = (float)y[i]; }",
}


@pytest.mark.parametrize("models", [("serial",), pytest.param(("serial", "openmp", "mpi"), marks=pytest.mark.slow)])
def test_every_problem_rejects_a_broken_variant(models):
    """Each of the first 12 problems (one per type) rejects its BROKEN_WRAPPERS bug: serial in the default suite,
    serial, OpenMP and MPI in the slow one (hybrids: tests/hpc_wrong_candidates.jsonl)."""
    problems, _ = load_suite()
    problems = [p for p in problems if p.function in BROKEN_WRAPPERS and p.model in models]
    assert len(problems) == len(models) * len(BROKEN_WRAPPERS)
    fn = {p.name: next(f for f in BROKEN_WRAPPERS if f" {f}(" in p.prompt) for p in problems}
    cfg = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=60.0, memory_mb=1024))
    bad = {}
    for p in problems:
        f = fn[p.name]
        renamed = replace(p, prompt=f"#define {f} ref_{f}\n" + p.prompt)
        body = p.reference + f"#undef {f}\n" + BROKEN_WRAPPERS[f] + "\n"
        ref = prepare_reference(p, cfg)  # the trusted programs of the problem itself
        try:
            res = evaluate_c(renamed, body, cfg, ref)
        finally:
            ref.cleanup()
        if res.status != "wrong_output":
            bad[p.name] = (res.status, res.message)
    assert not bad


WRONG_CANDIDATES = TESTS / "hpc_wrong_candidates.jsonl"


@pytest.mark.parametrize("which", ["one per problem", pytest.param("all", marks=pytest.mark.slow)])
def test_plausible_wrong_candidates_are_rejected(which, tmp_path):
    """tests/hpc_wrong_candidates.jsonl: for every problem of the suite but the first of each type (those have
    BROKEN_WRAPPERS, and here only their hybrids' candidates), subtly wrong solutions -- an off-by-one, a wrong
    tie-break or boundary, a race, a result left on rank 1 -- each scored ``wrong_output``.  The default suite
    scores one candidate of every sixth newer problem."""
    from hpc_codegen.completions import load_completions

    rows = [json.loads(x) for x in WRONG_CANDIDATES.read_text().splitlines() if x.strip()]
    problems, _ = load_suite(models=list(C_MODELS))  # Kokkos: test_kokkos.py
    by_name = {p.name: p for p in problems}
    covered = {by_name[r["problem"]].function for r in rows}
    assert covered | set(BROKEN_WRAPPERS) == {p.function for p in problems}
    if which != "all":  # the 48 newer problems, a serial candidate where there is one: its bug shows on every run
        first: dict = {}
        for r in sorted(rows, key=lambda r: by_name[r["problem"]].model != "serial"):
            if by_name[r["problem"]].function not in BROKEN_WRAPPERS:
                first.setdefault(by_name[r["problem"]].function, r)
        rows = list(first.values())[::6]  # every sixth: the slow run has all
        assert len(rows) == 8
    path = tmp_path / "wrong.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    per_problem = load_completions(path)["hpc"]
    # --quick is one run on one input, drawn afresh per invocation: a candidate's bug must show on every input its
    # driver can draw (an off-by-one that equal neighbours hide would pass now and then)
    report = hpc_code_report("--completions", str(path), "--quick", "--timeout", "60", "--k", "1", "--workers", "2",
                             timeout=1800)
    assert sum(r["samples"] for r in report["results"]) == sum(len(v) for v in per_problem.values()) == len(rows)
    wrong = {r["name"]: r["status_counts"] for r in report["results"] if set(r["status_counts"]) != {"wrong_output"}}
    assert not wrong


# writes through its const input: the expected sum must not be computed from the zeroed array
ZEROES_INPUT = "    double *y = (double *)x;\n    for (size_t i = 0; i < n; i++) y[i] = 0.0;\n    return 0.0;\n}\n"
# right in the last run only (stands in for a race that shows up in some runs)
WRONG_FIRST_CALL = ("    static int calls;\n    if (calls++ == 0) return 42.0;\n"
                    "    double s = 0.0;\n    for (size_t i = 0; i < n; i++) s += x[i];\n    return s;\n}\n")


@pytest.mark.parametrize("body", [ZEROES_INPUT, WRONG_FIRST_CALL], ids=["zeroes_input", "wrong_first_call"])
@pytest.mark.parametrize("model", ["serial", "mpi"])
def test_every_run_is_checked_against_untouched_inputs(model, body):
    (problem,), _ = load_suite(patterns=[f"reduce_array_sum_{model}"])
    cfg = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=30.0, memory_mb=512))
    res = evaluate_c(problem, body, cfg)
    assert res.status == "wrong_output", (res.status, res.message)


def test_a_launcher_that_ignores_the_worker_count_is_a_setup_error(tmp_path):
    """A launcher that ignores -n (e.g. another MPI's mpiexec) runs singletons: not a 2-rank pass, and not the
    candidate's fault either -- the trusted null run notices before any candidate runs."""
    fake = tmp_path / "fake-mpiexec"
    fake.write_text('#!/bin/sh\n[ "$1" = "--version" ] && exit 0\nshift 2\nexec "$@"\n')
    fake.chmod(0o755)
    tmp_path.chmod(0o755)  # the sandbox's unprivileged user must reach a launcher outside the system dirs
    (problem,), _ = load_suite(patterns=["reduce_array_sum_mpi"])
    cfg = RunConfig(quick=True, workers=(2,), mpiexec=str(fake),
                    run_limits=SandboxLimits(timeout_s=30.0, memory_mb=512))
    with pytest.raises(SetupError, match="asked for 2 worker"):
        evaluate_c(problem, problem.reference, cfg)


def test_empty_completion_is_a_recorded_failure():
    cfg = RunConfig(quick=True, run_limits=SandboxLimits(timeout_s=30.0, memory_mb=512))
    for name in ("reduce_array_sum_serial", "sort_sort_ints_serial"):  # non-void and void
        (problem,), _ = load_suite(patterns=[name])
        assert evaluate_c(problem, extract_c_body(""), cfg).status == "wrong_output"


def test_missing_tool_is_a_setup_error_not_a_failed_sample(tmp_path, monkeypatch, capsys):
    (problem,), _ = load_suite(patterns=["reduce_array_sum_serial"])
    for isolate in (True, False):
        cfg = RunConfig(quick=True, cc="no-such-cc",
                        build_limits=SandboxLimits(timeout_s=60.0, memory_mb=None, isolate_network=isolate))
        with pytest.raises(FileNotFoundError, match="no-such-cc"):
            evaluate_c(problem, problem.reference, cfg)
    isolation()  # cached now, while `unshare` is still on PATH
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc (the venv's bin/ has none either)
    rc = load_eval_cli("hpc_code").main(["--use-references", "--quick", "--no-progress", "--problems",
                                         "reduce_array_sum_serial"])
    assert rc == 2 and "'gcc' not found" in capsys.readouterr().err


def test_cli_zero_or_negative_limits_are_refused(capsys):
    """Every sandbox limit must be positive and finite: 0 or less is refused, not read as "no limit", and so are an
    infinite time-out and a non-finite temperature."""
    cli = load_eval_cli("hpc_code")
    for flag, v in (("--memory-mb", "0"), ("--memory-mb", "-5"), ("--timeout", "0"), ("--build-timeout", "-1"),
                    ("--output-limit-kb", "0"), ("--timeout", "inf"), ("--build-timeout", "nan"),
                    ("--temperature", "inf")):
        rc = cli.main(["--use-references", "--quick", "--no-progress", "--problems", "reduce_array_sum_serial",
                       flag, v])
        assert rc == 2 and f"out of range: {flag} " in capsys.readouterr().err, (flag, v)


def test_cli_bad_selection_or_k_is_an_error(tmp_path, capsys):
    cli = load_eval_cli("hpc_code")
    for args in (["--problems", "no_such_problem"], ["--problems", "reduce_*", "no_such_*"],
                 ["--suite", str(tmp_path)], ["--problems", "*_serial", "--execution-models", "mpi"],
                 ["--problems", "reduce_array_sum_serial", "--k", "0", "1"],
                 ["--problems", "reduce_array_sum_serial", "--model", str(tmp_path / "no_such_ckpt")]):
        source = [] if "--model" in args else ["--use-references"]
        rc = cli.main([*source, "--quick", "--no-progress", *args])
        err = capsys.readouterr().err
        assert rc == 2 and "error:" in err, (args, err)


# ------------------------------------------------------------ the CLI refuses bad flags before evaluating

def _refuse_work(*args, **kwargs):
    pytest.fail("work started before the input was checked")


@pytest.mark.parametrize("flags", [["--output", "{tmp}/no/such/dir/report.json"], ["--output", "{tmp}"],
                                   ["--save-completions", "{tmp}/missing/c.jsonl"], ["--timeout", "0"],
                                   ["--humaneval-limit", "-1"], ["--repeats", "0"]])
def test_hpc_cli_refuses_bad_flags_before_evaluating(tmp_path, monkeypatch, capsys, flags):
    """Flags that would fail or mislead only later are refused before any evaluation: an unwritable --output
    or --save-completions (the report is written at the very end), a --timeout of 0 (every candidate a
    timeout), a negative --humaneval-limit, --repeats 0."""
    cli = load_eval_cli("hpc_code")
    monkeypatch.setattr(hpc_evaluate, "evaluate_samples", _refuse_work)
    flags = [f.format(tmp=tmp_path) for f in flags]
    rc = cli.main(["--use-references", "--quick", "--no-progress", "--problems", "reduce_array_sum_serial", *flags])
    assert rc == 2 and "error:" in capsys.readouterr().err
