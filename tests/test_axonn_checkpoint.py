"""Sharded checkpoints: bit-exact resume, reshard onto another grid, mismatch refusal, HF export.

Runs under ``mpiexec -n 4`` (so this also covers the MPI launch path of ``axonn.init``).
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent / "axonn_workers"
_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)

HAVE_MPIEXEC = bool(shutil.which("mpiexec") or (Path(sys.executable).parent / "mpiexec").exists())


@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_MPIEXEC, reason="mpiexec not installed")
def test_checkpoint_resume_reshard_export_under_mpiexec() -> None:
    rc, out = launcher.launch_mpi("ckpt_checks.py", 4, timeout=280)
    assert rc == 0, out
    assert "OK checkpoint" in out, out


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_checkpoint_under_torchrun_env() -> None:
    """Same checks with the torchrun-style environment launcher (no MPI)."""
    codes, out = launcher.launch("ckpt_checks.py", 4, timeout=190)
    assert codes == [0] * 4, out
    assert "OK checkpoint" in out, out


def test_incomplete_checkpoint_refused(tmp_path) -> None:
    import axonn.checkpoint as ckpt
    import torch

    (tmp_path / "meta.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no COMPLETE marker"):
        ckpt.load(torch.nn.Linear(2, 2), None, tmp_path, grid=object())


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_save_streams_instead_of_copying_the_state() -> None:
    """A save hands torch.save the live tensors (moved to the host one storage at a time on a GPU):
    it adds a small fraction of the state to the peak host memory, not a copy of all of it."""
    import subprocess

    out = subprocess.run([sys.executable, str(WORKERS / "save_memory.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    growth = float(out.stdout.split("growth")[-1])
    assert growth < 0.2, f"a save grew the peak resident set by {growth:.2f}x the state it wrote"
