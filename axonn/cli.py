"""One ``--help`` style for every command of the project (the recipes, ``eval/``, the planner,
the converter and the benchmarks)."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description's and epilog's line breaks, and ends each flag's help with
    ``(default: X)`` where that says something: not where the help already names its default,
    not on a switch that is off unless given, not for a default of ``None``."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if "default" in text.lower() or d is None or d is False or d is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


INTERRUPTED = 130  # a shell's status for a command stopped by Ctrl-C (128 + SIGINT)


class SameOnEveryRank(SystemExit):
    """A refusal every rank of a job reaches alike (it depends only on the command line and on files every rank
    reads): :func:`run_main` prints it from rank 0 alone, the other ranks exit with the same status silently.
    Its ``code`` is the message (``error: ...``), so uncaught it prints and exits with status 1."""


def disk_full(e: BaseException) -> OSError | None:
    """The "no space left on device" error in ``e``'s chain (its cause and context: torch.save reports a full disk
    as a RuntimeError about the stream's position, with the OSError only in the chain), or None."""
    import errno

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return e
        e = e.__cause__ or e.__context__
    return None


def writable_dir_problem(path, flag: str) -> str | None:
    """Why a command cannot create or write the directory ``path`` (named by ``flag`` in the message): it is a
    file, its nearest existing ancestor is a file or a dangling link, or that ancestor is not writable
    (permissions, a read-only filesystem); None when it can."""
    from pathlib import Path

    path = Path(path).expanduser()
    probe = path
    while not probe.exists() and probe != probe.parent:
        if probe.is_symlink():
            return f"{flag} {path}: {probe} is a link to nothing; remove it or choose another {flag}"
        probe = probe.parent
    if not probe.is_dir():
        return f"{flag} {path}: {probe} is a file, not a directory; choose another {flag}"
    if not os.access(probe, os.W_OK | os.X_OK):
        try:
            read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        why = "is on a read-only filesystem" if read_only else "is not writable by this user"
        return f"{flag} {path}: {probe} {why}; choose a writable {flag}"
    return None


def launched_rank() -> int:
    """This process's rank as its launcher set it (torchrun/Slurm/MPI variables; 0 when run alone)."""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def run_main(main: Callable[[], object], resume_hint: str) -> None:
    """Run a command's ``main``; Ctrl-C ends it with one line saying how to continue (``resume_hint``)
    and exit status 130, instead of a traceback from every rank; a :class:`SameOnEveryRank` refusal is
    printed by rank 0 only."""
    try:
        main()
    except SameOnEveryRank:
        if launched_rank() != 0:
            raise SystemExit(1) from None
        raise
    except (OSError, RuntimeError) as e:
        full = disk_full(e)
        if full is None:
            raise
        where = f" ({full.filename})" if getattr(full, "filename", None) else ""
        raise SystemExit(f"error: no space left on the device{where}: free space there or write elsewhere "
                         f"({resume_hint})") from None
    except KeyboardInterrupt:
        print(f"\ninterrupted: {resume_hint}", file=sys.stderr)
        sys.exit(INTERRUPTED)
