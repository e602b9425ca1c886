"""Making a written checkpoint appear, and which checkpoints of a root are kept.

A checkpoint is written into a staging directory ``.<name>.tmp`` (:func:`staging_dir`) and published by one
rename, or one atomic exchange with a previous version (:func:`publish`), so its name always denotes a complete
directory.  A checkpoint root ``root/step_XXXXXXX`` holds a trainer's checkpoints; ``root/LATEST`` names the
newest complete one (:func:`write_latest`, read by :func:`latest`) and :func:`retain` keeps the newest few.
Directories are deleted by renaming them aside and removing them in a thread (:func:`discard`).
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

def fsync_write(path: Path, write) -> None:
    """Create ``path``, let ``write(f)`` fill it, and fsync it before returning."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def fsync_path(path: Path) -> None:
    """fsync a directory or a file, through a read-only descriptor."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(path: Path, rank: int) -> Path:
    """``.<name>.tmp`` beside ``path``, emptied and created by rank 0 (the others only learn its name)."""
    tmp = path.parent / f".{path.name}.tmp"
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    return tmp


def publish(tmp: Path, path: Path) -> None:
    """Make the finished staging directory ``tmp`` appear as ``path`` (rank 0), then delete what
    was there before (in the background).

    An existing ``path`` is swapped with ``tmp`` in one step (:func:`exchange`), so ``path`` names
    a complete directory at every instant.  Where the filesystem cannot swap, the old one is moved
    aside to ``.trash-<name>-*`` and ``tmp`` renamed in: a crash between those two renames leaves
    ``path`` missing, and :func:`latest` then names the moved-aside directory to rename back.
    """
    fsync_path(tmp)
    if not path.exists():
        old = None
        os.rename(tmp, path)
    elif exchange(tmp, path):
        old = tmp  # the staging name now holds the previous directory
    else:
        old = move_aside(path)
        os.rename(tmp, path)
    fsync_path(path.parent)
    if old is not None:
        discard(old)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # <fcntl.h>, <linux/fs.h>


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``, ext4/xfs/btrfs/tmpfs).
    False where the C library or the filesystem has no such call (other systems, some parallel
    filesystems): the caller falls back to two renames."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, f"swapping {a} and {b}: {os.strerror(err)}")


TRASH_PREFIX = ".trash-"


def move_aside(path: Path) -> Path:
    """Rename ``path`` to a hidden ``.trash-*`` sibling (no ``step_*`` glob sees it); returns the new path."""
    trash = path.parent / f"{TRASH_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
    os.rename(path, trash)
    return trash


def discard(path: Path) -> threading.Thread:
    """Delete the directory ``path`` without waiting for it: rename it to a hidden ``.trash-*``
    sibling (one metadata operation), then remove that in a daemon thread, together with any
    ``.trash-*`` left there by a process that exited before its deletion finished.

    Removing a job-scale checkpoint (terabytes in thousands of files) can take long on a parallel
    filesystem; rank 0 doing it while the other ranks wait in a barrier would run
    past the collectives' timeout.  Returns the thread (tests join it).
    """
    path = Path(path)
    if not path.name.startswith(TRASH_PREFIX):
        move_aside(path)

    def remove() -> None:
        for p in sorted(path.parent.glob(TRASH_PREFIX + "*")):
            shutil.rmtree(p, ignore_errors=True)

    t = threading.Thread(target=remove, name=f"discard {path.name}", daemon=True)
    t.start()
    return t


def latest(root: str | os.PathLike) -> Path | None:
    """The checkpoint a checkpoint root's ``LATEST`` file names (a trainer writes it after each
    complete save), or None when the root has none yet."""
    f = Path(root) / "LATEST"
    if not f.exists():
        return None
    name = f.read_text().strip()
    path = Path(root) / name
    if not name or not path.is_dir():
        aside = [p for p in Path(root).glob(f"{TRASH_PREFIX}{name}-*") if (p / "COMPLETE").exists()] if name else []
        if aside:  # a replacement that stopped between its two renames (publish without exchange)
            raise FileNotFoundError(f"{f} names {name!r}, which was being replaced when the run stopped: its "
                                    f"previous version is {aside[-1]}; rename that back to {path} and resume")
        raise FileNotFoundError(f"{f} names {name!r}, which is not a directory of {root}: write the name of an "
                                f"existing step_* checkpoint into it, or delete it to start afresh")
    return path


LATEST = "LATEST"


def step_of(path: Path) -> int | None:
    """The step number of a trainer checkpoint directory ``step_<digits>``, else None."""
    digits = path.name.removeprefix("step_")
    return int(digits) if digits.isdigit() and path.is_dir() else None


def write_latest(root: str | os.PathLike, name: str) -> None:
    """Point ``root/LATEST`` at the checkpoint ``root/name`` (rank 0, after it is published): the new content
    is written to a temporary file, fsynced and renamed over ``LATEST``, so a reader sees the old name or the
    new one, never a partial file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=f".{LATEST}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(name.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / LATEST)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def retain(root: str | os.PathLike, name: str, keep: int = 2) -> None:
    """Keep ``root/name`` and the ``keep - 1`` newest other ``step_*`` checkpoints (by step number:
    ``step_10000000`` is newer than ``step_9999999``); :func:`discard` the older ones and every staging directory
    ``.step_*.tmp`` (rank 0, once ``LATEST`` names ``name``).

    One save is in flight at a time, so at that point no staging directory is being written: each one left is a
    save that crashed or failed before it was published, and would otherwise hold its share of a checkpoint's
    disk space for good.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1 (the checkpoint LATEST names), got {keep}")
    root = Path(root)
    others = sorted((step, p) for p in root.glob("step_*") if p.name != name and (step := step_of(p)) is not None)
    for _, old in others[:max(0, len(others) - (keep - 1))]:
        discard(old)  # renamed now, deleted in the background: the ranks waiting in a barrier are not kept waiting
    for stale in root.glob(".step_*.tmp"):
        discard(stale)
