"""Run an untrusted command with limits, in a sandbox it cannot see out of.

Where the machine allows (root, or unprivileged user namespaces), every command runs under
``unshare`` in fresh mount, network and PID namespaces, with :mod:`.sandbox_init` as the
namespaces' PID 1 (see there for the steps).  The command then

- sees only a copy of its working directory (at ``/sandbox``: a tmpfs of ``work_mb``, so all it writes
  there together is bounded and the host's disk untouched; a single sandbox's top-level files are copied
  back when it ends), read-only system directories (the
  compilers, libraries, Python and the MPI install it needs), a private ``/tmp`` and
  ``/dev/shm``, its own ``/proc`` and a generated ``/etc``: no project tree, no home, no
  host files, no host socket (filesystem or abstract), no network (loopback only);
- runs without privileges (an unprivileged uid when the host's root made the sandbox, a
  user namespace's root with every capability dropped otherwise), ``no_new_privs``;
- is capped: address space (per process), processes + threads, file size, no core files,
  a wall-clock timeout and captured output; a timeout or output cap kills the process group
  (SIGTERM, then SIGKILL after a grace period), and whatever the command left behind dies
  with the namespace when it exits.

Its run time (:attr:`SandboxResult.command_s`) is measured by the init, outside the
command's reach.  :func:`isolation` tells what this machine enforces; a machine without
namespaces falls back to fewer of them (or none), and :meth:`Isolation.not_enforced` names
what is then missing.  A command killed by signal ``s`` reports exit status ``128 + s`` in
a PID namespace, ``-s`` otherwise (:attr:`SandboxResult.signal_name` reads both).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

KILL_GRACE_S = 2.0  # SIGTERM -> SIGKILL delay for a run killed on timeout / output cap
INIT = str(Path(__file__).with_name("sandbox_init.py"))
SANDBOX_HOME = "/sandbox"  # where the working directory appears inside a sandbox with its own root
UID_BASE = 200_000  # host root: commands run as UID_BASE + (pid % 100000), a uid no one else uses


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed command; each must be positive (``memory_mb=None``: no limit)."""

    timeout_s: float = 30.0
    memory_mb: int | None = 4096  # RLIMIT_AS per process
    output_bytes: int = 1 << 20  # stdout + stderr captured before the command is killed
    isolate_network: bool = True
    max_processes: int = 256  # RLIMIT_NPROC: processes and threads of the command together
    file_mb: int = 2048  # RLIMIT_FSIZE: largest file the command may write
    tmpfs_mb: int = 512  # size of its private /tmp and /dev/shm (each)
    work_mb: int = 1024  # size of the tmpfs its working directory is (with its own root): all its writes there

    def __post_init__(self) -> None:
        for name in ("timeout_s", "output_bytes", "max_processes", "file_mb", "tmpfs_mb", "work_mb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be positive, got {getattr(self, name)!r}")
        if self.memory_mb is not None and not self.memory_mb > 0:
            raise ValueError(f"sandbox limit memory_mb must be positive or None (no limit), got {self.memory_mb!r}")


@dataclass
class SandboxResult:
    returncode: int | None  # None when killed by the sandbox (timeout/output cap)
    stdout: str
    stderr: str
    timed_out: bool
    output_exceeded: bool
    wall_s: float  # measured by the caller: sandbox set-up included
    command_s: float | None = None  # the command alone, fork to exit, measured by the sandbox's init
    window_s: float | None = None  # from the command's start mark to its end mark (see sandbox_init), if both came
    disk_full: bool = False  # the command filled its working directory's tmpfs (SandboxLimits.work_mb)

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


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (a fault of the machine, never of the command)."""


@dataclass(frozen=True)
class Isolation:
    """What the sandbox enforces on this machine (see the module docstring)."""

    how: str  # "namespaces", "user namespaces", or what is left of them
    filesystem: bool  # own root: work dir + read-only system dirs only, private /tmp
    network: bool  # own network namespace: loopback only, no host socket
    pids: bool  # own PID namespace: nothing outlives the run, no host process visible
    processes_capped: bool  # RLIMIT_NPROC binds the command
    unprivileged: bool  # no capability, no uid 0 of the host
    flags: tuple[str, ...] = ()  # the unshare flags

    def not_enforced(self) -> list[str]:
        missing = {
            "filesystem": "filesystem isolation (the command can read and write what this user can)",
            "network": "network isolation (the command can open sockets of the host and the network)",
            "pids": "a PID namespace (a process the command leaves behind can outlive the run)",
            "processes_capped": "a process limit (a fork bomb is stopped only by the timeout)",
            "unprivileged": "dropping privileges (the command runs as this user)",
        }
        return [text for name, text in missing.items() if not getattr(self, name)]

    def to_dict(self) -> dict:
        return {"how": self.how, "not_enforced": self.not_enforced()}


def _levels(as_root: bool) -> list[tuple[str, tuple[str, ...], bool, bool, bool]]:
    """(name, unshare flags, own root, network, pids), strongest first."""
    user = () if as_root else ("--user", "--map-root-user")
    base = (*user, "--fork", "--kill-child")
    name = "namespaces" if as_root else "user namespaces"
    return [
        (name, (*base, "--mount", "--net", "--pid"), True, True, True),
        (f"{name}: PID + network", (*base, "--pid", "--mount-proc", "--net"), False, True, True),
        (f"{name}: network", (*user, "--net"), False, True, False),
        ("none", (), False, False, False),
    ]


def _run_in(iso: Isolation, cmd: list[str], cwd: str | os.PathLike, limits: SandboxLimits,
            env: dict[str, str] | None, ro: tuple[str, ...] = (), end_at_mark: bool = True,
            devices: tuple[str, ...] = ()) -> SandboxResult:
    """One run of ``cmd`` under the isolation ``iso`` (see :func:`run_sandboxed`)."""
    as_root = os.geteuid() == 0 and "--user" not in iso.flags
    uid = UID_BASE + os.getpid() % 100_000 if as_root else None
    flags = list(iso.flags)
    if not limits.isolate_network and "--net" in flags:
        flags.remove("--net")
    root = tempfile.mkdtemp(prefix="sandbox_root_") if iso.filesystem else None
    if uid is not None:
        os.chown(cwd, uid, uid)
    home = SANDBOX_HOME if root else str(cwd)
    marks_dir = None if root else tempfile.mkdtemp(prefix="sandbox_marks_")
    marks = "/run/hpc_marks" if root else os.path.join(marks_dir, "hpc_marks")
    env = {**(env or {}), "HOME": home, "TMPDIR": "/tmp" if root else home, "HPC_MARKS": marks}
    rlimits = {"RLIMIT_CORE": [0, 0], "RLIMIT_FSIZE": [limits.file_mb << 20] * 2}
    if limits.memory_mb is not None:
        rlimits["RLIMIT_AS"] = [limits.memory_mb << 20] * 2
    if iso.processes_capped:
        rlimits["RLIMIT_NPROC"] = [limits.max_processes] * 2
    read, write = os.pipe()
    spec = {
        "loopback": "--net" in flags, "root": root, "marks": marks, "work": str(Path(cwd).resolve()),
        "ro": sorted({*system_paths(), *ro}), "etc": _etc(0 if uid is None else uid), "tmpfs_mb": limits.tmpfs_mb,
        "work_mb": limits.work_mb, "copy_back": True,
        "uid": uid, "rlimits": rlimits, "timing_fd": write, "end_at_mark": end_at_mark,
        "devices": sorted(devices),
    }
    wrapper = ["unshare", *flags, "--"] if flags else []
    argv = [*wrapper, sys.executable, "-I", INIT, json.dumps(spec), *cmd]
    start = time.monotonic()
    deadline = start + limits.timeout_s
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, pass_fds=(write,))
    finally:
        os.close(write)
    try:
        out, err, timed_out, exceeded, returncode = _collect(proc, deadline, limits.output_bytes)
        wall_s = time.monotonic() - start  # not counting the grace period
        os.set_blocking(read, False)
        try:
            report = os.read(read, 4096).decode()
        except BlockingIOError:
            report = ""
    finally:
        os.close(read)
        if root:
            os.rmdir(root)
        if marks_dir:
            shutil.rmtree(marks_dir, ignore_errors=True)
    if report.startswith("error:"):
        raise SandboxError(f"sandbox set-up failed ({iso.how}): {report[6:].strip()}")
    timing = json.loads(report) if report and returncode is not None else {}
    return SandboxResult(returncode, out, err, timed_out, exceeded, wall_s, timing.get("command_s"),
                         timing.get("window_s"), bool(timing.get("disk_full")))


def _collect(proc: subprocess.Popen, deadline: float, cap: int,
             done: Callable[[], bool] | None = None) -> tuple[str, str, bool, bool, int | None]:
    """Read the command's output until it exits, the deadline passes or ``cap`` bytes came -- or ``done()``
    holds (checked between reads): the command is then ended as on a timeout, but not counted as one."""
    try:
        return _collect_until_done(proc, deadline, cap, done)
    except BaseException:  # the harness itself is ending (Ctrl-C, SIGTERM): leave no run behind
        _kill_group(proc, KILL_GRACE_S)
        proc.wait()
        raise


def _collect_until_done(proc: subprocess.Popen, deadline: float, cap: int,
                        done: Callable[[], bool] | None) -> tuple[str, str, bool, bool, int | None]:
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    total, timed_out, exceeded, finished = 0, False, False, False
    with selectors.DefaultSelector() as sel:
        for f in bufs:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            if done is not None and done():
                finished = True
                break
            for key, _ in sel.select(timeout=min(remaining, 0.5 if done is None else 0.05)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fileobj] += chunk
                total += len(chunk)
            if total > cap:
                exceeded = True
                break
    returncode = None
    if finished:
        returncode = proc.poll()
    elif not (timed_out or exceeded):
        try:
            returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            timed_out = True
    # also reaps stragglers the command left behind; a killed run gets a grace period
    _kill_group(proc, KILL_GRACE_S if returncode is None else 0.0)
    if returncode is None:
        proc.wait()
    for f in bufs:
        f.close()
    out, err = (bytes(b[:cap]).decode("utf-8", "replace") for b in bufs.values())
    return out, err, timed_out, exceeded, returncode


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


def _etc(uid: int) -> dict[str, str]:
    """The sandbox's /etc: a user for the command, and localhost (MPI launchers resolve the host name)."""
    host = socket.gethostname()
    return {
        "passwd": f"sandbox:x:{uid}:{uid}:sandbox:{SANDBOX_HOME}:/bin/sh\n",
        "group": f"sandbox:x:{uid}:\n",
        "hosts": f"127.0.0.1 localhost {host}\n::1 localhost\n",
    }


@lru_cache(maxsize=1)
def system_paths() -> tuple[str, ...]:
    """Host paths a sandbox with its own root binds read-only: system dirs, ``/sys`` (MPI reads the
    topology there), this Python and its venv."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache", "/etc/ld.so.conf",
             "/etc/ld.so.conf.d", "/etc/alternatives", "/sys", sys.base_prefix, sys.prefix]
    return tuple(p for p in paths if os.path.lexists(p))


@lru_cache(maxsize=None)
def isolation(network: bool = True, user_namespace: bool | None = None) -> Isolation:
    """The strongest isolation that works here, found by running ``true`` under each (cached).

    ``user_namespace`` forces (True) or forbids (False) a user namespace; by default the
    host's root does without one (it drops to an unprivileged uid instead) and any other
    user needs one.
    """
    as_root = os.geteuid() == 0 if user_namespace is None else not user_namespace
    for how, flags, fs, net, pids in _levels(as_root):
        if flags and not network:
            flags = tuple(f for f in flags if f != "--net")
        capped = as_root or ("--user" in flags and os.geteuid() != 0)  # uid 0 of the host is never capped
        iso = Isolation(how, fs, net and network, pids, processes_capped=capped,
                        unprivileged=as_root or "--user" in flags, flags=flags)
        if not flags:
            return iso
        with tempfile.TemporaryDirectory(prefix="sandbox_probe_") as d:
            try:
                res = _run_in(iso, ["true"], d, SandboxLimits(timeout_s=30.0, memory_mb=None),
                              {"PATH": "/usr/bin:/bin"})
            except (OSError, SandboxError):
                continue
            if res.returncode == 0 and res.command_s is not None:
                return iso
    raise AssertionError("unreachable: the last level needs nothing")


@lru_cache(maxsize=1)
def scratch_dir() -> str | None:
    """Where programs' working directories go: ``/dev/shm`` when it is a writable tmpfs with 4 GiB free (their
    output files then cost no disk writes, which would add noise to run times), else the default temp dir."""
    try:
        st = os.statvfs("/dev/shm")
        if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize >= 4 << 30:
            return "/dev/shm"
    except OSError:
        pass
    return None


def network_isolation_available() -> bool:
    """Whether commands run without network (their own network namespace)."""
    return isolation().network


def run_sandboxed(
    cmd: list[str],
    cwd: str | os.PathLike,
    limits: SandboxLimits,
    env: dict[str, str] | None = None,
    ro: tuple[str, ...] = (),
    end_at_mark: bool = True,
    iso: Isolation | None = None,
    devices: tuple[str, ...] = (),
) -> SandboxResult:
    """Run ``cmd`` in ``cwd`` under ``limits``; never raises for the command's own failures.

    ``env`` is the whole environment (``HOME``, ``TMPDIR`` and ``HPC_MARKS`` are set here);
    ``ro`` names extra host paths the command may read (e.g. a compiler outside ``/usr``).
    With a sandbox root, ``cwd`` appears as ``/sandbox`` and paths in ``cmd`` must be
    relative to it or among the read-only paths.  The command may mark a timed window by
    writing ``S`` and ``E`` to the FIFO ``$HPC_MARKS`` (:attr:`SandboxResult.window_s`); at
    ``E`` the run is ended unless ``end_at_mark`` is false.  ``iso`` picks an isolation
    other than this machine's strongest (:func:`isolation`).  ``devices`` are host device nodes
    (``/dev/...``, e.g. a GPU's: :func:`.gpu.device_nodes`) shown to the command besides null, zero,
    full, random and urandom.  Raises :class:`SandboxError` only when the sandbox could not be set up.
    """
    bad = [d for d in devices if not d.startswith("/dev/") or ".." in d]
    if bad:
        raise ValueError(f"devices must be paths under /dev, got {bad}")
    return _run_in(iso or isolation(limits.isolate_network), cmd, cwd, limits, env, ro, end_at_mark, devices)


def run_per_process(
    launcher: list[str],
    cmd: list[str],
    cwd: str | os.PathLike,
    limits: SandboxLimits,
    env: dict[str, str] | None = None,
    ro: tuple[str, ...] = (),
    rank_env: tuple[str, ...] = (),
    network: bool = False,
    iso: Isolation | None = None,
) -> SandboxResult:
    """Run ``launcher + [sandbox init] + cmd``: the launcher (``srun ...``, ``mpiexec -n R ...``) starts every
    process of the run, each in a sandbox of its own on its node -- its own root, PID namespace and limits
    (``RLIMIT_AS`` per process), as :func:`run_sandboxed` -- while the launcher itself runs unsandboxed here.

    ``cwd`` and its parent directory, and every path in ``cmd`` and ``ro``, must be at the same place on every
    node that runs a process (a shared filesystem).  Each process's init writes its report to a directory
    beside ``cwd`` (:mod:`.sandbox_init`); its rank is the first of ``rank_env`` the launcher sets.  Rank 0
    alone marks the window: the result's times and, once its sandbox ended the run at ``E``, its status
    (0) are rank 0's; the launcher is then ended (SIGTERM, SIGKILL :data:`KILL_GRACE_S` later) without
    waiting for the other ranks, whose output counts for nothing.  Otherwise the status is the
    launcher's (or rank 0's when the launcher says 0).  ``network`` keeps each process's own network
    namespace (loopback only): only for a run whose processes do not talk to each other.  ``env`` is the
    command's whole environment, plus the launcher's variables for joining its job.  The timeout and the
    output cap end the launcher's process group as for :func:`run_sandboxed`; the launcher ends the
    processes it started (``srun`` its job step on every node).
    """
    iso = iso or isolation(limits.isolate_network)
    as_root = os.geteuid() == 0 and "--user" not in iso.flags
    uid = UID_BASE + os.getpid() % 100_000 if as_root else None
    flags = [f for f in iso.flags if network or f != "--net"]
    parent = str(Path(cwd).resolve().parent)
    root = tempfile.mkdtemp(prefix=".sandbox_root_", dir=parent) if iso.filesystem else None
    reports = Path(tempfile.mkdtemp(prefix=".sandbox_report_", dir=parent))
    if uid is not None:
        os.chown(cwd, uid, uid)
    home = SANDBOX_HOME if root else str(Path(cwd).resolve())
    marks_dir = None if root else tempfile.mkdtemp(prefix=".sandbox_marks_", dir=parent)
    marks = "/run/hpc_marks" if root else os.path.join(marks_dir, "hpc_marks")
    rlimits = {"RLIMIT_CORE": [0, 0], "RLIMIT_FSIZE": [limits.file_mb << 20] * 2}
    if limits.memory_mb is not None:
        rlimits["RLIMIT_AS"] = [limits.memory_mb << 20] * 2
    if iso.processes_capped:
        rlimits["RLIMIT_NPROC"] = [limits.max_processes] * 2
    spec = {
        "loopback": "--net" in flags, "root": root, "marks": marks, "work": str(Path(cwd).resolve()),
        "ro": sorted({*system_paths(), *ro}), "etc": _etc(0 if uid is None else uid), "tmpfs_mb": limits.tmpfs_mb,
        "work_mb": limits.work_mb, "copy_back": True,  # (rank 0's files: sandbox_init)
        "uid": uid, "rlimits": rlimits, "timing_fd": None, "end_at_mark": True, "report_dir": str(reports),
        "rank_env": list(rank_env),
        "env": {**(env or {}), "HOME": home, "TMPDIR": "/tmp" if root else home, "HPC_MARKS": marks},
    }
    unshare = [shutil.which("unshare") or "unshare", *flags, "--"] if flags else []
    argv = [*launcher, *unshare, sys.executable, "-I", INIT, json.dumps(spec), *cmd]
    rank0 = reports / "timing.0"
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
        out, err, timed_out, exceeded, returncode = _collect(proc, start + limits.timeout_s, limits.output_bytes,
                                                             done=rank0.exists)
        wall_s = time.monotonic() - start
        report = rank0.read_text() if rank0.exists() else ""
    finally:
        if root:
            os.rmdir(root)
        shutil.rmtree(reports, ignore_errors=True)
        if marks_dir:
            shutil.rmtree(marks_dir, ignore_errors=True)
    if report.startswith("error:"):
        raise SandboxError(f"sandbox set-up failed ({iso.how}, one per process): {report[6:].strip()}")
    timing = json.loads(report) if report else {}
    if not (timed_out or exceeded):
        if timing.get("ended"):
            returncode = 0
        elif returncode is None or (returncode == 0 and timing):
            returncode = timing.get("rc", returncode)
    return SandboxResult(returncode, out, err, timed_out, exceeded, wall_s, timing.get("command_s"),
                         timing.get("window_s"), bool(timing.get("disk_full")))


def memory_limited(cmd: list[str], memory_mb: int | None) -> list[str]:
    """``cmd`` wrapped so that it runs with ``RLIMIT_AS = memory_mb`` (unchanged if None): per MPI rank,
    so that the limit binds the candidate processes and not the launcher (Open MPI's runtime needs more)."""
    if memory_mb is None:
        return cmd
    code = ("import os, resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]),) * 2)\n"
            "os.execvp(sys.argv[2], sys.argv[2:])\n")
    return [sys.executable, "-I", "-c", code, str(memory_mb << 20), *cmd]
