"""One writer per run directory: a second run on a live run's --out is refused naming the holder; a dead run's
lock is taken over; another host's is refused unless forced or stale; the lock goes when the run ends."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memorization.training.run_lock import LOCK_FILE, Holder, RunLock, RunLocked
from tests.forked import run_python
from tests.support import REPO

SMALL = ["--steps", "4", "--exposures", "2", "--num-targets", "2", "--num-nonmembers", "2", "--prefix", "10",
         "--suffix", "10", "--seq-len", "64", "--no-progress", "--arms", "standard"]


def _plant(out: Path, **fields) -> Path:
    """A lock file as another run would have left it."""
    holder = {**Holder.me().__dict__, "token": "other", **fields}
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_FILE).write_text(json.dumps(holder))
    return out / LOCK_FILE


def test_a_live_holder_on_this_host_is_refused_and_named(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        from memorization.training.run_lock import process_start

        _plant(tmp_path, pid=sleeper.pid, pid_start=process_start(sleeper.pid), command="memorize.py --out x")
        with pytest.raises(RunLocked, match=rf"is being written by another run: PID {sleeper.pid} on host .*"
                                            r"command: memorize\.py --out x\): stop it, or wait for it to end$"):
            RunLock(tmp_path).acquire()
    finally:
        sleeper.kill()
        sleeper.wait()
    lock = RunLock(tmp_path).acquire()  # the holder died: its lock is stale on this host, taken over
    assert "no longer running" in lock.took_over
    assert json.loads((tmp_path / LOCK_FILE).read_text())["token"] == lock.me.token
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path):
    _plant(tmp_path, pid=os.getpid(), pid_start="1")  # this PID, but another process's start time
    with RunLock(tmp_path) as lock:
        assert "no longer running" in lock.took_over


def test_another_hosts_lock_is_refused_unless_forced_or_its_heartbeat_is_stale(tmp_path):
    path = _plant(tmp_path, host="node-0042", pid=1, job=None)
    with pytest.raises(RunLocked, match=r"PID 1 on host node-0042.*pass --force-lock"):
        RunLock(tmp_path).acquire()
    with RunLock(tmp_path, force=True) as lock:
        assert lock.took_over.startswith("--force-lock: PID 1 on host node-0042")
    path = _plant(tmp_path, host="node-0042", pid=1, job=None)
    old = time.time() - 600
    os.utime(path, (old, old))
    with RunLock(tmp_path, heartbeat_s=30) as lock:  # no heartbeat for 10 minutes: stale
        assert "no heartbeat for 600 s" in lock.took_over


def test_the_holder_keeps_its_heartbeat_fresh(tmp_path):
    with RunLock(tmp_path, heartbeat_s=0.1) as lock:
        old = time.time() - 100
        os.utime(lock.path, (old, old))
        time.sleep(0.5)
        assert time.time() - lock.path.stat().st_mtime < 5


def test_a_requeued_job_waits_for_its_old_run_on_another_host(tmp_path, monkeypatch):
    """Same Slurm job, other host, fresh heartbeat: the old tasks of a requeued job are still ending. The new run
    waits (here the old run's lock goes stale meanwhile) instead of failing at once."""
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    _plant(tmp_path, host="node-0001", pid=1, job="777")
    t0 = time.time()
    with RunLock(tmp_path, heartbeat_s=0.2, stale_after_s=1.0) as lock:
        assert "no heartbeat" in lock.took_over and time.time() - t0 >= 0.8


def test_a_second_memorize_on_a_live_runs_out_is_refused_before_any_work(tmp_path):
    """A second `memorize.py --resume` on the same --out as a live run is refused at once, naming the first run,
    instead of resuming from the first run's live checkpoints."""
    env = {**os.environ, "WANDB_MODE": "disabled", "GOLDFISH_CACHE": str(tmp_path / "cache")}
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, str(REPO / "recipes" / "memorize.py"), *SMALL, "--steps", "400",
                              "--out", str(out)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (out / LOCK_FILE).exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (out / LOCK_FILE).exists(), "the first run never took its lock"
        second = run_python([str(REPO / "recipes" / "memorize.py"), *SMALL, "--steps", "400", "--out", str(out),
                             "--resume"], env=env, timeout=120)
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1].startswith(
            f"error: --out {out} is being written by another run: PID {first.pid} on host ")
    finally:
        first.terminate()
        first.wait(timeout=60)
