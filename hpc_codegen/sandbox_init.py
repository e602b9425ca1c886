"""Init of a sandbox: PID 1 of the fresh namespaces ``unshare`` makes for one untrusted command.

usage: ``unshare <namespaces> -- python -I sandbox_init.py SPEC_JSON CMD...`` (built by
:func:`hpc_codegen.sandbox.run_sandboxed`; standard library only, nothing of the
project is imported).  In order:

1. brings up loopback in the new network namespace (``spec["loopback"]``);
2. when ``spec["root"]`` names an empty host directory (the mount namespace), builds the
   command's whole filesystem view there and ``chroot``\\ s into it: a tmpfs holding only
   the host paths in ``spec["ro"]`` (bound read-only: the compilers, system libraries,
   Python, the MPI install), at ``/sandbox`` (the working directory) a tmpfs of
   ``spec["work_mb"]`` MiB holding a copy of ``spec["work"]``'s files (the command's writes,
   all of them together, are bounded by its size and never reach the host's disk; the
   regular files of its top level are copied back when the command ends, see 4.), a
   private ``/tmp`` and ``/dev/shm``, the device nodes a program
   needs (plus those in ``spec["devices"]``: a GPU's), this PID namespace's ``/proc``, and an ``/etc`` of files written from
   ``spec["etc"]`` (no host ``passwd``, no host sockets: nothing else of the host exists);
3. makes the FIFO ``spec["marks"]`` through which a program marks the start (``S``) and
   end (``E``) of its timed window (write-only for the command), becomes non-dumpable (the
   command cannot ptrace it), forks, and in the child applies ``spec["rlimits"]`` (address
   space, processes, file size, no core files), drops every privilege --
   ``setuid(spec["uid"])`` when the sandbox was made by the host's root, otherwise the user
   namespace's root gives up every capability for good (bounding set emptied, securebits
   locked, ``no_new_privs``) -- and execs the command;
4. reaps every process until the command exits and timestamps the marks as they arrive; at
   ``E`` (in a PID namespace, unless ``spec["end_at_mark"]`` is false) it kills every other
   process of the run at once, so nothing changes the output after the window closed; then
   copies back to ``spec["work"]`` (through a descriptor opened before the ``chroot``, never
   following a link) the regular files of ``/sandbox``'s top level when ``spec["copy_back"]`` (rank 0's
   alone, one sandbox per process) unless the command filled the tmpfs (``"disk_full"``: nothing),
   writes ``{"command_s": fork to exit, "window_s": S to E or null, "ended": ended at E}`` (JSON,
   ``time.monotonic()``) to the inherited
   ``spec["timing_fd"]`` -- a descriptor the command never holds -- and exits with the
   command's status (``128 + s`` for signal ``s``: a namespace init cannot kill itself by
   signal; 0 when it ended the run at ``E``).  The kernel then kills whatever is left.

A setup failure writes ``error: <why>`` to the timing descriptor instead and exits 125, so
the caller can tell the sandbox's fault from the command's.

One sandbox per process (an MPI launcher starts this init as each rank, possibly on another
node): ``spec["report_dir"]`` then names a host directory (on a filesystem the caller
sees) instead of ``spec["timing_fd"]``; the init opens it before entering its root and
writes its report -- the one above plus ``"rc"`` (the exit status) -- atomically to
``timing.<rank>`` there, its rank read from the first variable of
``spec["rank_env"]`` the launcher set (``0`` if none).  ``spec["env"]``, when given, is
the command's whole environment, plus the launcher's own variables (:data:`LAUNCHER_VARS`
prefixes: PMI, Slurm, the MPI's wire-up) so that the rank can join its job.
"""

import ctypes
import json
import os
import resource
import sys
import time

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 0x20, 0x400, 0x800, 0x1000, 0x4000
MS_RELATIME = 0x200000
# statvfs f_flag bits (ST_*) -> the mount flags a read-only remount must keep (the kernel
# refuses to clear a flag the source mount was locked with inside a user namespace)
_KEEP = ((0x1, MS_RDONLY), (0x2, MS_NOSUID), (0x4, MS_NODEV), (0x8, MS_NOEXEC), (0x400, MS_NOATIME),
         (0x800, MS_NODIRATIME), (0x1000, MS_RELATIME))

PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 4, 24, 28, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# NOROOT, NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE -- each with its lock bit
SECUREBITS_LOCKED = 0x1 | 0x2 | 0x4 | 0x8 | 0x20 | 0x40 | 0x80
DEVICES = ("null", "zero", "full", "random", "urandom")
# variables a launcher sets for a rank to join its job: kept in a per-process sandbox's environment
LAUNCHER_VARS = ("PMI_", "PMIX_", "SLURM_", "HYDRA_", "MPIR_", "MPICH_", "OMPI_", "UCX_", "FI_", "I_MPI_")

libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(ok: bool, what: str) -> None:
    if not ok:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, dst: str, fstype, flags: int, data=None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    _check(libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) == 0, f"mount {src or fstype} on {dst}")


def prctl(option: int, arg: int = 0) -> int:
    return libc.prctl(option, arg, 0, 0, 0)


def loopback_up() -> None:
    import fcntl
    import socket
    import struct
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS UP|LOOPBACK|RUNNING
        s.close()
    except OSError:
        pass


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _bind(root: str, src: str, read_only: bool) -> None:
    """Bind host ``src`` at the same path under ``root`` (symlinks are recreated, not followed)."""
    dst = _inside(root, src)
    if os.path.islink(src):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.lexists(dst):
            os.symlink(os.readlink(src), dst)
        return
    if not os.path.exists(src):
        return
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    if read_only:
        st = os.statvfs(src).f_flag
        keep = sum(ms for st_bit, ms in _KEEP if st & st_bit)
        mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def build_root(spec: dict) -> None:
    root = spec["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m")
    size = f"size={spec['tmpfs_mb']}m"
    for d in ("tmp", "dev/shm"):  # first: a read-only path below them is bound into them
        os.makedirs(_inside(root, d))
        mount("tmpfs", _inside(root, d), "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,{size}")
    for path in sorted(spec["ro"]):
        _bind(root, path, read_only=True)
    work = _inside(root, "sandbox")
    os.makedirs(work)
    mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=755,size={spec['work_mb']}m")
    _copy_tree(spec["work"], work)
    if spec["uid"] is not None:  # (the host's root made the sandbox: the command runs as spec["uid"])
        for dirpath, dirnames, filenames in os.walk(work):
            for name in (dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)):
                os.lchown(name, spec["uid"], spec["uid"])
    for name in DEVICES:
        dst = _inside(root, f"dev/{name}")
        open(dst, "w").close()
        mount(f"/dev/{name}", dst, None, MS_BIND)
    for path in spec.get("devices", ()):  # a GPU's nodes (/dev/nvidia0, /dev/dri/renderD128, ...): only these
        if not path.startswith("/dev/") or not os.path.exists(path) or os.path.islink(path):
            continue
        dst = _inside(root, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "w").close()
        mount(path, dst, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, _inside(root, f"dev/{name}"))
    os.makedirs(_inside(root, "proc"))
    mount("proc", _inside(root, "proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(_inside(root, "etc"), exist_ok=True)
    for name, text in spec["etc"].items():
        with open(_inside(root, f"etc/{name}"), "w") as f:
            f.write(text)
    os.makedirs(_inside(root, "run"))
    if spec["marks"]:
        spec["marks"] = _inside(root, spec["marks"])


def _copy_tree(src: str, dst: str) -> None:
    """Copy ``src``'s directories and regular files into ``dst`` (links and special files are left out)."""
    import shutil

    for entry in os.scandir(src):
        target = os.path.join(dst, entry.name)
        if entry.is_dir(follow_symlinks=False):
            os.makedirs(target, exist_ok=True)
            _copy_tree(entry.path, target)
        elif entry.is_file(follow_symlinks=False):
            shutil.copy2(entry.path, target, follow_symlinks=False)


def copy_back(work_fd: int) -> None:
    """Copy the regular files of ``/sandbox``'s top level (the root's: run after ``chroot``) into the host
    directory ``work_fd``: bounded by the tmpfs's size, links neither read nor written through."""
    for entry in os.scandir("/sandbox"):
        if not entry.is_file(follow_symlinks=False):
            continue
        src = os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            mode = os.fstat(src).st_mode & 0o755
            try:
                os.unlink(entry.name, dir_fd=work_fd)
            except FileNotFoundError:
                pass
            dst = os.open(entry.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=work_fd)
            try:
                while chunk := os.read(src, 1 << 20):
                    os.write(dst, chunk)
            finally:
                os.close(dst)
        finally:
            os.close(src)


def enter_root(root: str) -> None:
    """Freeze the new root (read-only from here on) and make it the filesystem's root."""
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=755")
    os.chroot(root)
    os.chdir("/sandbox")


def drop_privileges(uid) -> None:
    """Give up every privilege for good, before exec (see the module docstring)."""
    if uid is not None:  # made by the host's root: become an unprivileged user (caps go with uid 0)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    else:  # root of a user namespace: keep uid 0 there, lose every capability
        _check(prctl(PR_SET_SECUREBITS, SECUREBITS_LOCKED) == 0, "securebits")
        cap = 0
        while prctl(PR_CAPBSET_DROP, cap) == 0:
            cap += 1
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty (two words each)
        _check(libc.capset(header, data) == 0, "capset")
    _check(prctl(PR_SET_NO_NEW_PRIVS, 1) == 0, "no_new_privs")


def open_marks(path: str, uid) -> tuple[int, int]:
    """Make the FIFO the command marks its timed window through (write-only for it); (read end, spare writer)."""
    os.mkfifo(path, 0o600)
    if uid is not None:
        os.chown(path, uid, uid)
    os.chmod(path, 0o200)  # the command may write marks, never read (steal) them
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK), os.open(path, os.O_WRONLY | os.O_NONBLOCK)


def supervise(pid: int, marks: int | None, wakeup: int, start: float, end_at_mark: bool) -> tuple[int, dict]:
    """Reap until the command exits; timestamp its marks; at the end mark (in a PID namespace) end every
    process of the run at once, so that nothing changes its output afterwards.  (status, report)."""
    import select
    seen: dict[str, float] = {}
    status = None
    ended = False
    while status is None:
        ready, _, _ = select.select([f for f in (marks, wakeup) if f is not None], [], [], 1.0)
        now = time.monotonic()
        if marks in ready:
            for ch in os.read(marks, 4096).decode("latin-1"):
                seen.setdefault(ch, now)
            if end_at_mark and "S" in seen and "E" in seen and not ended and os.getpid() == 1:
                os.kill(-1, 9)  # SIGKILL to every process of this PID namespace but its init
                ended = True
        if wakeup in ready:
            os.read(wakeup, 4096)
        while True:
            try:
                p, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:  # nothing left to reap (the command was reaped before)
                break
            if p == 0:
                break
            if p == pid:
                status, end = st, time.monotonic()
    if marks is not None:  # marks written after the last select returned (the command exited right after them)
        try:
            for ch in os.read(marks, 4096).decode("latin-1"):
                seen.setdefault(ch, end)
        except BlockingIOError:
            pass
    rc = os.waitstatus_to_exitcode(status)
    window = seen["E"] - seen["S"] if "S" in seen and "E" in seen and seen["E"] >= seen["S"] else None
    if ended:
        rc = 0  # ended by the sandbox at its end mark: the run itself completed
    return (rc if rc >= 0 else 128 - rc), {"command_s": end - start, "window_s": window, "ended": ended}


class _ReportFile:
    """A per-process sandbox's report: ``timing.<rank>`` in a host directory opened before the root is entered,
    written whole (a temporary name, then renamed) so that a reader never sees half of it."""

    def __init__(self, spec: dict) -> None:
        rank = next((os.environ[v] for v in spec.get("rank_env", ()) if os.environ.get(v, "").isdigit()), "0")
        self.name = f"timing.{rank}"
        self.dir = os.open(spec["report_dir"], os.O_RDONLY | os.O_DIRECTORY)

    def write(self, data: bytes) -> None:
        fd = os.open(self.name + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, dir_fd=self.dir)
        os.write(fd, data)
        os.close(fd)
        os.rename(self.name + ".tmp", self.name, src_dir_fd=self.dir, dst_dir_fd=self.dir)


def _command_env(spec: dict) -> dict:
    """The command's environment: the inherited one, or ``spec["env"]`` plus the launcher's variables."""
    if spec.get("env") is None:
        return dict(os.environ)
    return {**{k: v for k, v in os.environ.items() if k.startswith(LAUNCHER_VARS)}, **spec["env"]}


def main() -> None:
    import signal
    spec = json.loads(sys.argv[1])
    cmd = sys.argv[2:]
    report = spec.get("timing_fd")
    sink = None
    try:
        if spec.get("report_dir"):
            sink = _ReportFile(spec)
    except OSError as exc:
        print(f"sandbox: cannot open the report directory: {exc}", file=sys.stderr)
        os._exit(125)

    def send(data: bytes) -> None:
        if sink is not None:
            sink.write(data)
        else:
            os.write(report, data)

    try:
        if spec["loopback"]:
            loopback_up()
        work_fd = None
        if spec["root"]:
            build_root(spec)
            if spec.get("copy_back") and (sink is None or sink.name == "timing.0"):  # (one rank copies back)
                work_fd = os.open(spec["work"], os.O_RDONLY | os.O_DIRECTORY)
        marks = open_marks(spec["marks"], spec["uid"]) if spec["marks"] else (None, None)
        if spec["root"]:
            enter_root(spec["root"])
        prctl(PR_SET_DUMPABLE, 0)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
    except OSError as exc:
        send(f"error: {exc}".encode())
        os._exit(125)
    env = _command_env(spec)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (report, sink and sink.dir, wake_r, wake_w, work_fd, *marks):
                if fd is not None:
                    os.close(fd)
            for name, (soft, hard) in spec["rlimits"].items():
                resource.setrlimit(getattr(resource, name), (soft, hard))
            drop_privileges(spec["uid"])
            os.execvpe(cmd[0], cmd, env)
        except OSError as exc:
            print(f"sandbox: cannot run {cmd[0]}: {exc}", file=sys.stderr)
        os._exit(127)
    rc, timing = supervise(pid, marks[0], wake_r, start, spec["end_at_mark"])
    if spec["root"]:
        st = os.statvfs("/sandbox")
        timing["disk_full"] = st.f_bavail * st.f_frsize < (1 << 20)  # (under 1 MiB left: the command filled it)
    if work_fd is not None and not timing.get("disk_full"):  # a command that filled its disk leaves nothing
        try:
            copy_back(work_fd)
        except OSError as exc:  # (the host directory full or gone: the run's verdict stands, its files do not)
            print(f"sandbox: cannot copy the work directory back: {exc}", file=sys.stderr)
    if sink is not None:
        timing["rc"] = rc
    send(json.dumps(timing).encode())
    os._exit(rc)


if __name__ == "__main__":
    main()
