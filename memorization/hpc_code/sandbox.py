"""Run an untrusted command with limits.

Each call runs in its own session/process group (so a timeout kills the whole
tree, MPI ranks included: SIGTERM, then SIGKILL after a short grace period), with ``RLIMIT_AS`` (address space, per process),
no core files, a wall-clock timeout and a cap on captured output.  When
``unshare -n`` works (root or user namespaces), the command also runs in a
fresh network namespace whose only interface is loopback (brought up for
MPI launchers), i.e. no network.  Otherwise network access is *not* blocked (reported by
:func:`network_isolation_available`).

When ``unshare -p`` works too, the command runs in its own PID namespace (with its own
``/proc``, which MPI's shared-memory transports read by pid) under a small init
(:data:`_INIT`) that ends the run when the command exits: every process the command left
behind -- a background child still holding the output pipes, a daemon that escaped the
process group with ``setsid()`` -- is then killed by the kernel, so nothing outlives the run
(without it such a child survives, and one that holds stdout turns a finished run into a
timeout).  A command killed by signal ``s`` then reports exit status ``128 + s``
(:attr:`SandboxResult.signal_name` reads both forms).
"""

from __future__ import annotations

import os
import resource
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from functools import lru_cache


KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL delay for a run killed on timeout / output cap


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed command."""

    timeout_s: float = 30.0
    memory_mb: int = 4096  # RLIMIT_AS per process; <= 0 disables
    output_bytes: int = 1 << 20  # stdout + stderr captured before the command is killed
    isolate_network: bool = True


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed by the sandbox (timeout/output cap)
    stdout: str
    stderr: str
    timed_out: bool
    output_exceeded: bool
    wall_s: float

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that ended the process, if any (negative returncode or 128+sig)."""
        rc = self.returncode
        if rc is None:
            return None
        sig = -rc if rc < 0 else rc - 128 if 128 < rc < 160 else None
        try:
            return signal.Signals(sig).name if sig else None
        except ValueError:
            return None


@lru_cache(maxsize=None)
def _unshare_works(*flags: str) -> bool:
    """Whether ``unshare <flags> true`` succeeds here (root or user namespaces)."""
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def network_isolation_available() -> bool:
    """Whether ``unshare -n`` can create a network namespace here."""
    return _unshare_works("-n")


# Brings up loopback in a fresh network namespace (MPI launchers such as Open MPI talk to
# their daemons over it; nothing else is reachable).
_LOOPBACK_UP = (
    "def loopback_up():\n"
    "    import fcntl, socket, struct\n"
    "    try:\n"
    "        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "        fcntl.ioctl(s, 0x8914, struct.pack('16sH14x', b'lo', 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS UP\n"
    "        s.close()\n"
    "    except OSError:\n"
    "        pass\n"
)

# Runs first inside the new network namespace: bring up loopback, then exec the real
# command, keeping the pid and process group.
_LO_UP = _LOOPBACK_UP + (
    "import os, sys\n"
    "loopback_up()\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


# Init of a fresh PID namespace (see the module docstring): optionally brings up loopback,
# runs the command as its child, reaps orphans, and exits with the command's status once the
# command itself has exited (exit status 128 + s when a signal s killed it: the init of a PID
# namespace cannot kill itself with a signal); the kernel then kills whatever is left in the
# namespace.  It ignores SIGTERM (as a namespace init does by default), which still reaches the
# command through the process group.
_INIT = _LOOPBACK_UP + (
    "import os, sys\n"
    "if sys.argv[1] == '1':\n"
    "    loopback_up()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    try:\n"
    "        os.execvp(sys.argv[2], sys.argv[2:])\n"
    "    except OSError as e:\n"
    "        print(f'sandbox: cannot run {sys.argv[2]}: {e}', file=sys.stderr)\n"
    "    os._exit(127)\n"
    "while True:\n"
    "    try:\n"
    "        p, status = os.wait()\n"
    "    except ChildProcessError:\n"
    "        os._exit(127)\n"
    "    except InterruptedError:\n"
    "        continue\n"
    "    if p == pid:\n"
    "        rc = os.waitstatus_to_exitcode(status)\n"
    "        os._exit(rc if rc >= 0 else 128 - rc)\n"
)


_PID_NAMESPACE = ("-p", "-f", "--kill-child", "--mount-proc")  # unshare flags: own PID namespace and /proc


def pid_namespace_available() -> bool:
    """Whether ``unshare -p -f --mount-proc`` can create a PID namespace (and its /proc) here."""
    return _unshare_works(*_PID_NAMESPACE)


# Sets RLIMIT_AS, then execs the command: used per MPI rank so the limit binds the
# candidate processes and not the launcher (Open MPI's runtime needs more).
_LIMIT_EXEC = (
    "import os, resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def memory_limited(cmd: list[str], memory_mb: int) -> list[str]:
    """``cmd`` wrapped so that it runs with ``RLIMIT_AS = memory_mb`` (unchanged if <= 0)."""
    if memory_mb <= 0:
        return cmd
    return [sys.executable, "-I", "-c", _LIMIT_EXEC, str(memory_mb << 20), *cmd]


def _preexec(memory_mb: int):
    def apply() -> None:
        if memory_mb > 0:
            limit = memory_mb << 20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _kill_group(proc: subprocess.Popen, grace_s: float = 0.0) -> None:
    """SIGKILL the process group; with ``grace_s`` > 0, SIGTERM it first and wait up to that long.

    The grace period lets a launcher clean up: MPICH's mpiexec removes its
    ``/tmp/hydra_hwloc_xmlfile_*`` on SIGTERM, but leaves it behind when SIGKILLed.
    """
    try:
        if grace_s > 0:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(
    cmd: list[str],
    cwd: str | os.PathLike,
    limits: SandboxLimits,
    env: dict[str, str] | None = None,
) -> SandboxResult:
    """Run ``cmd`` in ``cwd`` under ``limits``; never raises for the command's own failures."""
    isolate = limits.isolate_network and network_isolation_available()
    if pid_namespace_available():
        net = ["-n"] if isolate else []
        cmd = ["unshare", *_PID_NAMESPACE, *net, "--", sys.executable, "-I", "-c", _INIT, "1" if isolate else "0",
               *cmd]
    elif isolate:
        cmd = ["unshare", "-n", "--", sys.executable, "-I", "-c", _LO_UP, *cmd]
    start = time.monotonic()
    deadline = start + limits.timeout_s
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # own process group: killpg reaches every descendant
        preexec_fn=_preexec(limits.memory_mb),
    )
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    total, timed_out, exceeded = 0, False, False
    with selectors.DefaultSelector() as sel:
        for f in bufs:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fileobj] += chunk
                total += len(chunk)
            if total > limits.output_bytes:
                exceeded = True
                break
    returncode = None
    if not (timed_out or exceeded):
        try:
            returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            timed_out = True
    wall_s = time.monotonic() - start  # not counting the grace period below
    # also reaps stragglers the command left behind; a killed run gets a grace period
    _kill_group(proc, KILL_GRACE_S if returncode is None else 0.0)
    if returncode is None:
        proc.wait()
    for f in bufs:
        f.close()
    out, err = (bytes(b[: limits.output_bytes]).decode("utf-8", "replace") for b in bufs.values())
    return SandboxResult(returncode, out, err, timed_out, exceeded, wall_s)
