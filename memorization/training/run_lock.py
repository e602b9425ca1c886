"""One writer per run directory: a lock file that a second run on the same ``--out`` is refused by.

``<out>/.run.lock`` is created with ``O_CREAT | O_EXCL`` (atomic on local filesystems and on NFSv3+/Lustre) and
holds its holder as JSON: host, PID, the PID's start time (``/proc/<pid>/stat``, so a reused PID is not taken
for the holder), Slurm job id, the command and a random token.  While the run lives a daemon thread touches the
file every ``heartbeat_s`` seconds: its modification time is the holder's heartbeat, which another host can
read.  The holder removes it when it ends (normally, by an error, by SIGUSR1's exit 75); a killed run leaves
it behind, and the next run decides:

* holder on this host and its process gone (or the PID now belongs to another process): stale, taken over;
* holder on this host and alive: refused (the message names it: wait for it, or stop it);
* holder on another host, heartbeat older than ``stale_after_s`` (default 4 heartbeats): stale, taken over;
* holder on another host, heartbeat fresh: refused unless ``force`` (``--force-lock``), which this host
  cannot check; a run of the same Slurm job (a requeue whose old tasks have not exited yet) waits up to
  ``stale_after_s`` for the old run to end or go stale instead of failing at once.

Taking over replaces the file by rename and reads it back: of two runs taking over at once, one wins.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from axonn.cli import SameOnEveryRank

LOCK_FILE = ".run.lock"


class RunLocked(SameOnEveryRank):
    """Another run writes this run directory; the message names it and what to do."""


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), None where
    there is no such process or no ``/proc``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # fields after the command name: state is field 3, start 22


def process_alive(pid: int, start: str | None) -> bool:
    """Whether ``pid`` runs on this host and, where ``start`` is known, is the same process (not a reused PID)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return start is None or process_start(pid) in (None, start)


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    pid_start: str | None
    started: float
    job: str | None
    command: str
    token: str

    @classmethod
    def me(cls) -> "Holder":
        return cls(host=socket.gethostname(), pid=os.getpid(), pid_start=process_start(os.getpid()),
                   started=time.time(), job=os.environ.get("SLURM_JOB_ID"), command=" ".join(sys.argv)[:500],
                   token=secrets.token_hex(8))

    def describe(self, heartbeat_age: float) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        job = f", Slurm job {self.job}" if self.job else ""
        return (f"PID {self.pid} on host {self.host}{job}, started {when}, last heartbeat {heartbeat_age:.0f} s ago "
                f"(command: {self.command})")


class RunLock:
    """The lock of run directory ``out`` (module docstring); a context manager, or :meth:`acquire` /
    :meth:`release`.  :meth:`acquire` raises :class:`RunLocked` when another live run holds it."""

    def __init__(self, out: str | Path, *, heartbeat_s: float = 30.0, stale_after_s: float | None = None,
                 force: bool = False) -> None:
        self.path = Path(out) / LOCK_FILE
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = 4 * heartbeat_s if stale_after_s is None else stale_after_s
        self.force = force
        self.me = Holder.me()
        self.took_over: str | None = None  # what was taken over, for the caller to report
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Raise :class:`RunLocked` if a live run holds the lock now (as :meth:`acquire` would), without taking
        it: for a refusal before any work, the lock itself being taken only when the run writes."""
        if not self.path.exists():
            return
        holder, age = self._read()
        if self._stale(holder, age) is None and not (self.force and holder is not None):
            if holder is not None and holder.job and holder.job == self.me.job and holder.host != self.me.host:
                return  # the same Slurm job's old run: acquire() waits for it
            raise RunLocked(self._refusal(holder, age))

    # ---- acquiring ----------------------------------------------------------------------------------------
    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        waited_until = None
        while True:
            if self._create():
                break
            holder, age = self._read()
            why = self._stale(holder, age)
            if why is None and holder is not None and self.force:
                why = "--force-lock"
            if why is not None:
                self.took_over = why if holder is None else f"{why}: {holder.describe(age)}"
                if self._take_over():
                    break
                continue  # another run took it over first: decide again against that one
            same_job = holder is not None and holder.job and holder.job == self.me.job
            if same_job and holder.host != self.me.host:  # a requeue whose old tasks are still ending
                waited_until = waited_until or time.time() + self.stale_after_s + self.heartbeat_s
                if time.time() < waited_until:
                    time.sleep(min(5.0, self.heartbeat_s))
                    continue
            raise RunLocked(self._refusal(holder, age))
        self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self.me), f)
        return True

    def _read(self) -> tuple[Holder | None, float]:
        """The holder (None if the file is unreadable: being written, or damaged) and its heartbeat's age."""
        age = 0.0
        try:
            age = time.time() - self.path.stat().st_mtime
            return Holder(**json.loads(self.path.read_text())), age
        except FileNotFoundError:
            return None, 0.0
        except (OSError, ValueError, TypeError):
            return None, age

    def _stale(self, holder: Holder | None, age: float) -> str | None:
        """Why the lock may be taken over, or None."""
        if holder is None:
            if not self.path.exists():
                return "released meanwhile"
            return "an unreadable lock file" if age > self.stale_after_s else None
        if holder.host == self.me.host:
            if not process_alive(holder.pid, holder.pid_start):
                return "a stale lock of a run that is no longer running"
            return None
        if age > self.stale_after_s:
            return f"a stale lock (no heartbeat for {age:.0f} s, more than {self.stale_after_s:.0f} s)"
        return None

    def _take_over(self) -> bool:
        tmp = self.path.with_name(f"{LOCK_FILE}.{self.me.token}")
        tmp.write_text(json.dumps(asdict(self.me)))
        os.replace(tmp, self.path)
        time.sleep(0.05)  # a rival that replaced it at the same moment: the last rename wins, both read it back
        holder, _ = self._read()
        return holder is not None and holder.token == self.me.token

    def _refusal(self, holder: Holder | None, age: float) -> str:
        out = self.path.parent
        if holder is None:
            return (f"error: --out {out} is locked by {self.path} (unreadable, {age:.0f} s old): another run is "
                    f"starting there; wait for it, or delete {self.path} if no run uses {out}")
        fix = ("stop it, or wait for it to end" if holder.host == self.me.host else
               "stop it, or wait for it to end; if it is dead (this host cannot check), pass --force-lock")
        return f"error: --out {out} is being written by another run: {holder.describe(age)}: {fix}"

    # ---- holding and releasing ----------------------------------------------------------------------------
    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        """Stop the heartbeat and remove the lock file if this run still holds it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        holder, _ = self._read()
        if holder is not None and holder.token == self.me.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
