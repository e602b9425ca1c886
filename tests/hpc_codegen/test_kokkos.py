"""The Kokkos execution model (hpc_codegen/kokkos.py, toolchain.py, ``data/hpc_code/problems/*_kokkos.yaml``):
finding an install and its backend, references that pass, wrong candidates that fail, translations into Kokkos,
and a machine without Kokkos listing those problems as not run rather than failed.

Compiling against Kokkos costs seconds per file, so the default suite scores one problem (its reference and a
wrong candidate, one build of each); the slow tests score all 60 references, all wrong candidates and all 60
serial -> Kokkos translations.
"""
from __future__ import annotations

import json

import pytest

from hpc_codegen import load_suite
from hpc_codegen.kokkos import INSTALL_HINT, backends, find_kokkos
from hpc_codegen.translation import translation_problems
from tests.support import TESTS, hpc_code_report

WRONG = TESTS / "hpc_wrong_candidates_kokkos.jsonl"
needs_kokkos = pytest.mark.skipif(find_kokkos() is None, reason=INSTALL_HINT)


def _config_header(path, *macros: str):
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"#define KOKKOS_ENABLE_{m}" for m in macros] + ["/* #undef KOKKOS_ENABLE_CUDA */"]
    (path / "KokkosCore_config.h").write_text("\n".join(lines) + "\n")
    (path / "Kokkos_Core.hpp").write_text("\n")


def test_backend_is_read_from_the_config_header_and_decides_the_worker_counts(tmp_path, monkeypatch):
    """A Serial-only build (Debian's) is not threaded: its problems run with one worker; an OpenMP build runs with
    --workers.  An install is found under KOKKOS_ROOT (include/ + lib/libkokkoscore.so), and a prefix without the
    library is no install."""
    from hpc_codegen.toolchain import RunConfig

    serial, omp = tmp_path / "serial", tmp_path / "omp"
    for root, macros in ((serial, ("SERIAL",)), (omp, ("SERIAL", "OPENMP"))):
        _config_header(root / "include", *macros)
        (root / "lib").mkdir()
        (root / "lib" / "libkokkoscore.so").write_bytes(b"")
    assert backends(serial / "include" / "KokkosCore_config.h") == ("Serial",)
    assert backends(omp / "include" / "KokkosCore_config.h") == ("Serial", "OpenMP")
    (problem,), _ = load_suite(patterns=["reduce_array_sum_kokkos"])
    cfg = RunConfig(workers=(1, 2, 4))
    monkeypatch.setenv("KOKKOS_ROOT", str(serial))
    assert not find_kokkos().threaded and cfg.worker_counts(problem) == (1,)
    monkeypatch.setenv("KOKKOS_ROOT", str(omp))
    assert find_kokkos().threaded and cfg.worker_counts(problem) == (1, 2, 4)
    assert f"-Wl,-rpath,{omp / 'lib'}" in find_kokkos().link_flags()
    monkeypatch.setenv("KOKKOS_ROOT", str(tmp_path / "nowhere"))
    assert find_kokkos() is None


def test_without_kokkos_its_problems_are_listed_as_not_run(tmp_path):
    """A machine without Kokkos (KOKKOS_ROOT pointing at an empty prefix) scores the C problems and lists the
    Kokkos ones as not run with the install hint -- not as failures; asking for Kokkos alone is a setup error."""
    import os

    from tests.forked import run_python
    from tests.support import REPO

    env = {**os.environ, "KOKKOS_ROOT": str(tmp_path)}
    cmd = [str(REPO / "eval" / "hpc_code.py"), "--use-references", "--quick", "--workers", "1", "--no-progress",
           "--json"]
    out = run_python([*cmd, "--problems", "reduce_array_sum_serial", "reduce_array_sum_kokkos"], env=env,
                     timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["problems"] == 1 and report["pass@1"] == 1.0 and report["status_counts"]["build_error"] == 0
    assert report["not_run"] == [{"model": "kokkos", "reason": INSTALL_HINT, "problems": ["reduce_array_sum_kokkos"]}]
    alone = run_python([*cmd, "--execution-models", "kokkos"], env=env, timeout=300, cwd=REPO)
    assert alone.returncode == 2 and "libtrilinos-kokkos-dev" in alone.stderr


def test_every_kokkos_prompt_shares_its_problems_driver_and_exports_a_c_symbol():
    """60 Kokkos prompts, one per problem, on the driver of the problem's C prompts; the function is extern "C"
    (the runner finds it by name) and the prompt says Kokkos is initialised and the arrays are on the host."""
    problems, errors = load_suite()
    assert not errors
    kokkos = [p for p in problems if p.model == "kokkos"]
    assert len(kokkos) == 60
    serial = {p.function: p for p in problems if p.model == "serial"}
    for p in kokkos:
        assert p.driver_path == serial[p.function].driver_path and p.type == serial[p.function].type
        assert "#include <Kokkos_Core.hpp>" in p.prompt and f'extern "C" ' in p.prompt.rsplit("*/", 1)[1]
        assert "already been initialized" in p.prompt and "DefaultHostExecutionSpace" in p.prompt
        assert "Kokkos::" in p.reference and "#pragma omp" not in p.reference and "omp_" not in p.reference


def _wrong_rows() -> list[dict]:
    return [json.loads(x) for x in WRONG.read_text().splitlines() if x.strip()]


@needs_kokkos
@pytest.mark.parametrize("which", ["one problem", pytest.param("all", marks=pytest.mark.slow)])
def test_kokkos_references_pass_and_wrong_candidates_fail(which, tmp_path):
    """Scored side by side as two samples of a problem: the reference passes, the plausible wrong candidate
    (tests/hpc_wrong_candidates_kokkos.jsonl: a missed element, a race, a wrong tie-break...) is wrong_output.
    The default suite: the parallel_scan problem; the slow one: all 60 (every wrong candidate)."""
    problems, _ = load_suite(models=["kokkos"])
    by_name = {p.name: p for p in problems}
    rows = _wrong_rows()
    assert {r["problem"] for r in rows} == set(by_name)
    if which != "all":
        rows = [r for r in rows if r["problem"] == "scan_prefix_sum_kokkos"][:1]
    names = sorted({r["problem"] for r in rows})
    lines = [{"problem": n, "completion": by_name[n].reference} for n in names] + rows
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    report = hpc_code_report("--completions", str(path), "--quick", "--timeout", "60", "--workers", "1", "--k", "1",
                             timeout=7200)
    wrong_per = {n: sum(r["problem"] == n for r in rows) for n in names}
    bad = {r["name"]: r["status_counts"] for r in report["results"]
           if r["status_counts"] != {"passed": 1, "wrong_output": wrong_per[r["name"]]}}
    assert report["problems"] == len(names) and not bad
    assert all(v is not None and v > 0 for r in report["results"] for v in r["speedups"].values())


@needs_kokkos
@pytest.mark.slow
def test_every_translation_into_kokkos_passes_with_the_targets_reference():
    """The 60 serial -> Kokkos tasks: the serial source (C that is also C++) and the Kokkos prompt in one C++ file,
    scored as the Kokkos problem -- its reference passes."""
    problems, _ = load_suite()
    tasks = [t for t in translation_problems(problems) if t.model == "kokkos"]
    assert len(tasks) == 60 and all(t.source_model == "serial" for t in tasks)
    report = hpc_code_report("--use-references", "--quick", "--tasks", "translate", "--execution-models", "kokkos",
                             "--workers", "1", timeout=7200)
    assert report["problems"] == 60 and report["pass@1"] == 1.0
