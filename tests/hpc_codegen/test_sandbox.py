"""The sandbox (hpc_codegen/sandbox.py, sandbox_init.py) as a hostile command meets it.

Each property is tried, not assumed: a command reads the project tree, a file beside its
work directory and the host's /etc/passwd, writes into system directories and the host's
/tmp, connects to a host Unix socket (by path and abstract), to a host TCP port, remounts,
forks without end, leaves daemons behind, and steals or forges its timing marks.  Run under
every isolation this machine offers (the host's root dropping to an unprivileged uid, and a
user namespace); skipped where the machine has no namespaces (docs/hpc_code.md says what is
then enforced).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from pathlib import Path

import pytest

from hpc_codegen import sandbox
from hpc_codegen.sandbox import SandboxLimits, run_sandboxed
from hpc_codegen.toolchain import candidate_env, mpiexec_flags, tool
from tests.support import REPO


def _full_modes() -> list:
    modes = []
    for user_ns in (None, True):
        iso = sandbox.isolation(True, user_ns)
        if iso.filesystem and iso.network and iso.pids and iso not in [m.values[0] for m in modes]:
            modes.append(pytest.param(iso, id=iso.how.replace(" ", "-")))
    return modes


MODES = _full_modes()
needs_namespaces = pytest.mark.skipif(not MODES, reason="needs mount/network/PID namespaces (root or user ns)")


def _run(iso, cmd, cwd, **limits):
    return run_sandboxed(cmd, cwd, SandboxLimits(**{"timeout_s": 30.0, **limits}), candidate_env(1), iso=iso)


def test_limits_that_are_zero_or_negative_are_refused():
    for bad in ({"memory_mb": 0}, {"memory_mb": -1}, {"timeout_s": 0}, {"max_processes": 0}, {"file_mb": -5},
                {"output_bytes": 0}, {"tmpfs_mb": 0}):
        with pytest.raises(ValueError, match="must be positive"):
            SandboxLimits(**bad)
    assert SandboxLimits(memory_mb=None).memory_mb is None  # "no limit" is said explicitly


PROBE = r'''
import json, os, socket, sys
repo, secret, sock_path, abstract, port, host_tmp = sys.argv[1:7]
r = {}
def attempt(name, fn):
    try:
        fn()
        r[name] = "succeeded"
    except Exception as exc:
        r[name] = type(exc).__name__
def unix(addr):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(2)
    s.connect(addr)
    s.close()
attempt("write_work", lambda: open("in_work.txt", "w").write("x"))
attempt("read_repo", lambda: open(os.path.join(repo, "README.md")).read())
attempt("write_driver", lambda: open(os.path.join(repo, "data/hpc_code/drivers/reduce.c"), "a").write(""))
attempt("read_secret", lambda: open(secret).read())
attempt("write_usr", lambda: open("/usr/hpc_sandbox_probe", "w").write("x"))
attempt("write_etc", lambda: open("/etc/passwd", "a").write("x"))
attempt("unix_socket", lambda: unix(sock_path))
attempt("abstract_socket", lambda: unix("\0" + abstract))
attempt("tcp_host", lambda: socket.create_connection(("127.0.0.1", int(port)), timeout=2).close())
attempt("read_marks", lambda: open(os.environ["HPC_MARKS"]).read(1))
attempt("write_tmp", lambda: open(host_tmp, "w").write("x"))
r["passwd"] = open("/etc/passwd").read()
r["remount_rc"] = os.system("mount -o remount,rw /usr 2>/dev/null")
r["cap_eff"] = next(l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff"))
r["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
print(json.dumps(r))
'''


@needs_namespaces
@pytest.mark.parametrize("iso", MODES)
def test_a_hostile_command_sees_and_reaches_nothing_of_the_host(tmp_path, iso):
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("the host's secret")
    token = secrets.token_hex(6)
    unix_srv = socket.socket(socket.AF_UNIX)
    unix_srv.bind(str(outside / "host.sock"))
    abstract_srv = socket.socket(socket.AF_UNIX)
    abstract_srv.bind(f"\0hpc-sandbox-test-{token}")
    tcp_srv = socket.create_server(("127.0.0.1", 0))
    for s in (unix_srv, abstract_srv):
        s.listen()
    host_tmp = Path(f"/tmp/hpc-sandbox-test-{token}")
    try:
        res = _run(iso, [sys.executable, "-I", "-c", PROBE, str(REPO), str(outside / "secret.txt"),
                         str(outside / "host.sock"), f"hpc-sandbox-test-{token}", str(tcp_srv.getsockname()[1]),
                         str(host_tmp)], work)
        assert res.returncode == 0, res.stderr
        r = json.loads(res.stdout)
        assert r["write_work"] == "succeeded" and (work / "in_work.txt").read_text() == "x"  # the probe works
        for attack in ("read_repo", "write_driver", "read_secret", "write_usr", "write_etc", "unix_socket",
                       "abstract_socket", "tcp_host", "read_marks"):
            assert r[attack] != "succeeded", (attack, r)
        assert r["write_tmp"] == "succeeded" and not host_tmp.exists()  # a private /tmp, not the host's
        host_passwd = Path("/etc/passwd").read_text().splitlines()[0]
        assert host_passwd not in r["passwd"] and r["passwd"].startswith("sandbox:")
        assert r["remount_rc"] != 0 and int(r["cap_eff"], 16) == 0
        assert r["processes"] <= 4  # its own PID namespace: init, the probe, the shell of os.system at most
    finally:
        for s in (unix_srv, abstract_srv, tcp_srv):
            s.close()
        host_tmp.unlink(missing_ok=True)


DISK_FILLER = ("import os\nwritten = 0\ntry:\n    for i in range(8):\n        with open(f'fill{i}.bin', 'wb') as f:\n"
               "            for _ in range(40):\n                f.write(bytes(1 << 20))\n                written += 1 << 20\n"
               "except OSError as e:\n    print('stopped', e.errno, written >> 20, flush=True)\n"
               "print('wrote', written >> 20, flush=True)\n")


@needs_namespaces
@pytest.mark.parametrize("iso", MODES)
def test_a_command_that_fills_its_disk_is_bounded_and_leaves_the_host_untouched(tmp_path, iso):
    """A command writing eight 40 MiB files (each under the per-file cap) into a 64 MiB working directory: it
    runs out of space there at about 64 MiB, the run is marked disk_full (a 'disk limit exceeded' verdict), and
    nothing it wrote reaches the host's directory; a command within the bound gets its files back."""
    from hpc_codegen.harness import classify_run

    work = tmp_path / "work"
    work.mkdir()
    res = _run(iso, [sys.executable, "-I", "-c", DISK_FILLER], work, work_mb=64)
    assert "stopped 28" in res.stdout, (res.stdout, res.stderr)  # ENOSPC
    assert int(res.stdout.split("wrote ")[1]) <= 64
    assert res.disk_full and classify_run(res) == ("runtime_error", "disk limit exceeded (filled its working "
                                                                    "directory: --disk-mb)")
    assert not list(work.glob("fill*"))
    ok = _run(iso, [sys.executable, "-I", "-c", "open('out.txt', 'w').write('x' * 1000)"], work, work_mb=64)
    assert ok.returncode == 0 and not ok.disk_full and (work / "out.txt").read_text() == "x" * 1000


@needs_namespaces
@pytest.mark.parametrize("iso", MODES)
def test_mountinfo_shows_no_host_path_of_the_work_directory(tmp_path, iso):
    """/proc/self/mountinfo inside the sandbox names no host path of the working directory (it was the source of
    the /sandbox bind)."""
    work = tmp_path / "work_dir_on_the_host"
    work.mkdir()
    res = _run(iso, ["cat", "/proc/self/mountinfo"], work)
    assert res.returncode == 0 and " /sandbox " in res.stdout, res.stderr
    assert str(tmp_path) not in res.stdout and "work_dir_on_the_host" not in res.stdout


def test_a_disk_limit_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match=r"sandbox limit work_mb must be positive, got 0"):
        SandboxLimits(work_mb=0)


FORK_BOMB = ("import os, time\nn = 0\ntry:\n    while n < 10000:\n        if os.fork() == 0:\n"
             "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\n"
             "print(n, flush=True)\n")


@needs_namespaces
@pytest.mark.parametrize("iso", MODES)
def test_a_fork_bomb_stops_at_the_process_cap_and_dies_with_the_run(tmp_path, iso):
    if not iso.processes_capped:
        pytest.skip(f"{iso.how}: RLIMIT_NPROC does not bind uid 0 of the host")
    t0 = time.monotonic()
    res = _run(iso, [sys.executable, "-I", "-c", FORK_BOMB], tmp_path, max_processes=40)
    assert res.returncode == 0 and 5 <= int(res.stdout) < 40, (res.stdout, res.stderr)
    assert time.monotonic() - t0 < 15  # its sleeping children died with the namespace, not at the timeout
    assert os.fork() or os._exit(0)  # the host can still fork


def _pids_with(token: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and token in (d / "cmdline").read_bytes().decode(errors="replace"):
                out.append(int(d.name))
        except OSError:
            pass
    return out


@needs_namespaces
def test_sandbox_leaves_no_process_behind(tmp_path):
    """A daemon that left the process group with setsid() ends with the run, like every other process of it."""
    token = f"{secrets.randbelow(10**6) + 10**6}.5"  # a sleep duration nothing else uses
    script = f"setsid sh -c 'exec sleep {token}' >/dev/null 2>&1 </dev/null & sleep 0.3; echo started"
    try:
        res = _run(None, ["sh", "-c", script], tmp_path, timeout_s=10.0)
        assert res.returncode == 0 and res.stdout == "started\n"
        deadline = time.monotonic() + 2.0
        while _pids_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _pids_with(token), "the setsid() child outlived the sandboxed run"
    finally:
        for pid in _pids_with(token):
            os.kill(pid, 9)


@needs_namespaces
def test_background_child_holding_the_pipe_does_not_make_a_finished_run_a_timeout(tmp_path):
    t0 = time.monotonic()
    res = _run(None, ["sh", "-c", "sleep 20 & echo done"], tmp_path, timeout_s=4.0)
    assert (res.timed_out, res.returncode, res.stdout) == (False, 0, "done\n")
    assert time.monotonic() - t0 < 3.0
    crashed = _run(None, ["sh", "-c", "kill -SEGV $$"], tmp_path, timeout_s=4.0)
    assert crashed.signal_name == "SIGSEGV"


@needs_namespaces
def test_the_window_is_timed_outside_and_the_run_ends_at_its_end_mark(tmp_path):
    script = 'printf S > "$HPC_MARKS"; sleep 0.3; printf E > "$HPC_MARKS"; sleep 5; echo after-the-end'
    t0 = time.monotonic()
    res = _run(None, ["sh", "-c", script], tmp_path)
    assert res.returncode == 0 and "after-the-end" not in res.stdout
    assert 0.29 < res.window_s < 0.6 and time.monotonic() - t0 < 3
    res = run_sandboxed(["sh", "-c", script], tmp_path, SandboxLimits(timeout_s=30.0), candidate_env(1),
                        end_at_mark=False)
    assert "after-the-end" in res.stdout and 0.29 < res.window_s < 0.6
    unmarked = _run(None, ["sh", "-c", "sleep 0.1"], tmp_path)
    assert unmarked.window_s is None and unmarked.command_s >= 0.1


def test_killed_run_gets_sigterm_before_sigkill(tmp_path):
    """Launchers clean up on SIGTERM (MPICH's mpiexec leaves /tmp/hydra_hwloc_xmlfile_* when SIGKILLed)."""
    script = 'trap "echo cleaned > marker; exit 0" TERM; while :; do sleep 0.1; done'
    res = _run(None, ["sh", "-c", script], tmp_path, timeout_s=1.0)
    assert res.timed_out and (tmp_path / "marker").read_text() == "cleaned\n"


MPI_HELLO = r'''#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    double x, sum;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    x = rank;
    MPI_Allreduce(&x, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d: sum %g\n", rank, size, sum);
    MPI_Finalize();
    return 0;
}
'''


def test_mpi_in_the_sandbox_runs_clean(tmp_path):
    """MPI ranks see each other (shared memory, /proc, /sys topology): no transport errors, no warnings."""
    try:
        mpicc, launcher = tool("mpicc"), tool("mpiexec")
    except FileNotFoundError:
        pytest.skip("no MPI")
    (tmp_path / "hello.c").write_text(MPI_HELLO)
    built = _run(None, [mpicc, "hello.c", "-o", "hello"], tmp_path, memory_mb=None)
    assert built.returncode == 0, built.stderr
    res = _run(None, [launcher, *mpiexec_flags(launcher), "-n", "2", "./hello"], tmp_path)
    assert res.returncode == 0 and "rank 1 of 2: sum 1" in res.stdout
    assert "ERROR" not in res.stdout + res.stderr and not res.stderr, res.stdout + res.stderr


def test_marks_written_just_before_the_command_exits_are_not_lost(monkeypatch, tmp_path):
    """The init's loop can reap the command after a select() that saw nothing (a timeout, or another child's
    wake-up) while its last marks still sit in the FIFO: they are read after the reap, so the window is there."""
    import os
    import select
    import time

    from hpc_codegen import sandbox_init

    fifo = tmp_path / "marks"
    os.mkfifo(fifo)
    marks = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    spare = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    wake_r, wake_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the command: both marks, then exit at once
        os.write(spare, b"SE")
        os._exit(0)
    time.sleep(0.3)  # it has exited; its marks wait in the FIFO
    monkeypatch.setattr(select, "select", lambda r, w, x, t=None: ([], [], []))  # the select that saw nothing
    rc, timing = sandbox_init.supervise(pid, marks, wake_r, time.monotonic(), end_at_mark=False)
    for fd in (marks, spare, wake_r, wake_w):
        os.close(fd)
    assert rc == 0 and timing["window_s"] == 0.0


@needs_namespaces
def test_a_terminated_harness_leaves_no_run_and_no_directory_behind(tmp_path) -> None:
    """SIGTERM to ``eval/hpc_code.py`` while a candidate that never ends runs (a job's time limit, ``kill``):
    the harness exits 143, the sandboxed run dies with it, and its work directory is removed."""
    import signal
    import subprocess

    completions = tmp_path / "c.jsonl"
    completions.write_text(json.dumps({"problem": "reduce_array_sum_serial", "completion": "    for (;;) {}\n}\n"})
                           + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(REPO / "eval" / "hpc_code.py"), "--completions", str(completions),
                             "--work-dir", str(work), "--quick", "--timeout", "300", "--no-progress"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def runs() -> dict[int, str]:  # processes whose command line names the work directory
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(work) in cmd and int(pid) != proc.pid:
                found[int(pid)] = cmd
        return found

    first_seen: dict[int, float] = {}  # the candidate's run: a process loading candidate.so that stays
    deadline = time.monotonic() + 120
    while not any(time.monotonic() - t > 2.0 for t in first_seen.values()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        running = {pid for pid, cmd in runs().items() if "candidate.so" in cmd}
        first_seen = {pid: first_seen.get(pid, time.monotonic()) for pid in running}
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert runs() == {} and list(work.iterdir()) == []
