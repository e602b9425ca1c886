"""Scale-out launchers of the HPC-code evaluation (``--launcher mpiexec|srun``, docs/hpc_code.md "Running at scale").

``mpiexec`` runs with this machine's MPICH; ``srun`` is rehearsed with the shim in tests/slurm_shims (an MPI
step's tasks started by MPICH's ``mpiexec``, each with its ``SLURM_PROCID``) and ``SLURM_JOB_ID`` set here.
Each run is then one sandbox per process: a reference still passes with the verdict of the local launcher, a
deadlocking, forking or memory-hungry candidate is still scored (timeout / runtime_error) and leaves no
process behind, and combinations that cannot work are refused before anything is built.  The default suite
runs one MPI problem under the srun shim and the refusals; the rest is slow.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from hpc_codegen import SandboxLimits, load_suite
from hpc_codegen import evaluate as hpc_evaluate
from hpc_codegen.harness import RunConfig, evaluate_c
from hpc_codegen.reference import prepare_reference
from hpc_codegen.toolchain import launcher_refusal, sandbox_report
from tests.forked import run_python
from tests.support import REPO, SHIMS, load_eval_cli

LIMITS = SandboxLimits(timeout_s=30.0, memory_mb=512, max_processes=64)


@pytest.fixture
def slurm(monkeypatch):
    """A simulated Slurm allocation: the srun shim first on PATH (then this Python's bin, whose mpiexec the shim
    starts MPI steps with, as on a cluster where the MPI module is loaded), SLURM_JOB_ID set."""
    venv_bin = Path(sys.executable).parent
    monkeypatch.setenv("PATH", f"{SHIMS}{os.pathsep}{venv_bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    monkeypatch.delenv("SLURM_NNODES", raising=False)


def _cfg(launcher: str, limits: SandboxLimits = LIMITS, **kw) -> RunConfig:
    return RunConfig(quick=True, workers=(2,), launcher=launcher, run_limits=limits, **kw)


def _left_behind(marker: Path) -> list[str]:
    """Processes whose command line names ``marker`` (a run's private directory)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and str(marker).encode() in (d / "cmdline").read_bytes():
                found.append(d.name)
        except OSError:
            pass
    return found


def test_an_mpi_reference_passes_under_srun_one_sandbox_per_rank(slurm):
    (problem,), _ = load_suite(patterns=["reduce_array_sum_mpi"])
    res = evaluate_c(problem, problem.reference, _cfg("srun"))
    assert res.status == "passed", res.message
    assert set(res.speedups) == {2} and res.speedups[2] > 0


@pytest.mark.parametrize("launcher", ["mpiexec", "srun"])
@pytest.mark.slow
def test_references_give_the_local_verdicts_under_each_launcher(slurm, launcher, tmp_path):
    names = ["reduce_array_sum_serial", "reduce_array_sum_omp", "reduce_array_sum_mpi", "reduce_array_sum_mpi_omp",
             "sort_sort_ints_mpi", "scan_prefix_sum_mpi_omp"]
    for name in names:
        (problem,), _ = load_suite(patterns=[name])
        wrong = "    return 0;\n}\n" if name.startswith("reduce") else "\n}\n"  # a wrong answer / no output
        for body in (problem.reference, wrong):
            want = evaluate_c(problem, body, _cfg("local"))
            got = evaluate_c(problem, body, _cfg(launcher, work_dir=str(tmp_path)))
            assert (got.status, set(got.speedups)) == (want.status, set(want.speedups)), (name, got.message)
        assert want.status == "wrong_output"
    assert list(tmp_path.iterdir()) == []  # every run's directory removed


DEADLOCK = ("    int r; MPI_Comm_rank(MPI_COMM_WORLD, &r);\n    double v = 0;\n"
            "    if (r == 0) MPI_Recv(&v, 1, MPI_DOUBLE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);\n"
            "    (void)x; (void)n; return v;\n}\n")
FORK_BOMB = "    for (;;) fork();\n    (void)x; (void)n; return 0.0;\n}\n"
MEMORY_HOG = "    for (;;) { char *p = malloc(1 << 24); memset(p, 1, 1 << 24); }\n    return 0;\n}\n"
ESCAPE = ("    int open(const char *, int, ...);\n"  # O_WRONLY | O_CREAT: outside its directory, on the host
          '    open("/etc/escaped_by_candidate", 0101, 0644);\n    open("../escaped_by_candidate", 0101, 0644);\n'
          "    double s = 0;\n    for (size_t i = 0; i < n; i++) s += x[i];\n    return s;\n}\n")


@pytest.mark.parametrize("launcher", ["mpiexec", "srun"])
@pytest.mark.slow
def test_hostile_mpi_candidates_are_scored_and_contained(slurm, launcher):
    (problem,), _ = load_suite(patterns=["reduce_array_sum_mpi"])
    ref = prepare_reference(problem, _cfg(launcher))
    short = _cfg(launcher, SandboxLimits(timeout_s=3.0, memory_mb=512, max_processes=64))
    try:
        for body, cfg, want in ((DEADLOCK, short, "timeout"), (FORK_BOMB, short, "timeout"),
                                (MEMORY_HOG, _cfg(launcher), "runtime_error")):
            t0 = time.time()
            res = evaluate_c(problem, body, cfg, ref)
            assert res.status == want, (want, res.message)
            assert time.time() - t0 < 20  # killed, not waited for
            assert _left_behind(ref.dir) == []
        res = evaluate_c(problem, ESCAPE, _cfg(launcher), ref)
        assert res.status == "passed", res.message  # its own root: the writes went nowhere
        assert not Path("/etc/escaped_by_candidate").exists()
        assert not list(Path(_cfg(launcher).scratch() or "/tmp").glob("escaped_by_candidate"))
    finally:
        ref.cleanup()


@pytest.mark.slow
def test_an_openmp_fork_bomb_is_contained_in_its_srun_step(slurm):
    (problem,), _ = load_suite(patterns=["reduce_array_sum_omp"])
    short = _cfg("srun", SandboxLimits(timeout_s=3.0, memory_mb=512, max_processes=64))
    ref = prepare_reference(problem, short)
    try:
        assert evaluate_c(problem, FORK_BOMB, short, ref).status == "timeout"
        assert _left_behind(ref.dir) == []
    finally:
        ref.cleanup()


@pytest.mark.slow
def test_cli_under_srun_reports_the_per_process_sandbox(slurm, tmp_path):
    out = run_python([str(REPO / "eval" / "hpc_code.py"), "--use-references", "--quick",
                          "--problems", "reduce_array_sum_*", "--execution-models", "serial", "openmp", "mpi",
                          "mpi+omp", "--workers", "2", "--launcher", "srun",
                          "--work-dir", str(tmp_path), "--json", "--no-progress"],
                         timeout=600, cwd=REPO)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["status_counts"]["passed"] == 4
    assert report["launcher"]["name"] == "srun"
    assert any("network isolation of MPI runs" in s for s in report["sandbox"]["not_enforced"])
    assert "network isolation of MPI runs" in out.stderr  # warned


# ------------------------------------------------------------------ refused before anything is built

def _refuse_work(*args, **kwargs):
    pytest.fail("work started before the launcher was checked")


@pytest.mark.parametrize("flags,env,message", [
    (["--launcher", "srun"], {}, "no SLURM_JOB_ID"),
    (["--launcher", "srun", "--nodes", "2"], {"SLURM_JOB_ID": "1"}, "pass --work-dir"),
    (["--launcher", "srun", "--work-dir", "/tmp"], {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2"}, "node-local"),
    (["--launcher", "mpiexec", "--launcher-args=-hosts a,b"], {}, "pass --work-dir"),
    (["--launcher-args=-hosts a,b"], {}, "--launcher-args is for"),
    (["--launcher", "mpiexec", "--nodes", "2"], {}, "--nodes is for --launcher srun"),
    (["--launcher", "srun", "--work-dir", "/no/such/dir"], {"SLURM_JOB_ID": "1"}, "not a directory"),
])
def test_launch_combinations_that_cannot_work_are_refused_first(monkeypatch, capsys, flags, env, message):
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cli = load_eval_cli("hpc_code")
    monkeypatch.setattr(hpc_evaluate, "evaluate_samples", _refuse_work)
    monkeypatch.setattr(hpc_evaluate, "require_tools", _refuse_work)
    rc = cli.main(["--use-references", "--quick", "--no-progress", "--problems", "reduce_array_sum_mpi", *flags])
    assert rc == 2 and message in capsys.readouterr().err


def test_the_local_launcher_changes_nothing():
    base = {"how": "namespaces", "not_enforced": []}
    assert sandbox_report(base, RunConfig()) is base
    assert launcher_refusal(RunConfig(), environ={}) is None
    per = sandbox_report(base, RunConfig(launcher="mpiexec"))
    assert per["launcher"] == "mpiexec" and len(per["not_enforced"]) == 1
