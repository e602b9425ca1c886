"""Launch an N-rank CPU/gloo job the way torchrun does (env vars), or under mpiexec, with a hard timeout.

:func:`launch` starts each rank as a fork of a server that imported torch, transformers and the library once
(tests/forked.py: milliseconds instead of ~7 s of CPU per rank); ``fresh=True`` starts plain interpreters.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
from tests.forked import Forked, server_env  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update({**server_env(), "AXONN_TIMEOUT": "60"})
    env.update(extra or {})
    return env


def launch(script: str, nproc: int, args: list[str] | None = None, timeout: float = 300,
           extra_env: dict | None = None, fresh: bool = False) -> tuple[list[int], str]:
    """Run ``script`` on ``nproc`` ranks (torchrun-style env). Returns (return codes, combined output).

    Ranks are forks of a server that imported the common modules (``fresh=True``: new interpreters)."""
    port = free_port()
    procs = []
    logs = []
    path = str(Path(script) if Path(script).is_absolute() else HERE / script)
    for r in range(nproc):
        env = _env({"RANK": str(r), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(r),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **(extra_env or {})})
        log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"axonn_{os.getpid()}_{port}_{r}.log", "w+")
        logs.append(log)
        if fresh:
            procs.append(subprocess.Popen([sys.executable, path, *(args or [])], env=env,
                                          stdout=log, stderr=subprocess.STDOUT))
        else:
            procs.append(Forked([path, *(args or [])], env, log.name, log.name))
    deadline = time.time() + timeout
    codes = _wait_all(procs, deadline)
    out = ""
    for r, log in enumerate(logs):
        log.seek(0)
        out += f"----- rank {r} (rc={codes[r]}) -----\n" + log.read()[-6000:]
        log.close()
        os.unlink(log.name)
    return codes, out


def _wait_all(procs: list[subprocess.Popen], deadline: float) -> list[int]:
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.2)
    codes = []
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
            codes.append(-9)
        else:
            codes.append(p.returncode)
    return codes


def launch_mpi(script: str, nproc: int, args: list[str] | None = None, timeout: float = 300) -> tuple[int, str]:
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    cmd = [mpiexec, "-n", str(nproc), sys.executable, str(HERE / script), *(args or [])]
    try:
        res = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)
        return res.returncode, (res.stdout + res.stderr)[-20000:]
    except subprocess.TimeoutExpired as e:
        return -9, f"TIMEOUT\n{e.stdout}\n{e.stderr}"
