"""Finding a Kokkos installation to build the suite's Kokkos problems against, and what its backend can run.

A Kokkos install is a header directory with ``Kokkos_Core.hpp`` and ``KokkosCore_config.h`` plus its core library:
either a plain Kokkos install under a prefix (``PREFIX/include``, ``PREFIX/lib{,64}/libkokkoscore.so``; the
``KOKKOS_ROOT`` environment variable or :func:`find_kokkos`'s ``prefix``), or Debian's Trilinos build
(``apt-get install libtrilinos-kokkos-dev``: ``/usr/include/trilinos``, ``libtrilinos_kokkoscore.so``).

The host backend decides how many workers a run can use: Debian's Trilinos 13.2 Kokkos is built with the
``Serial`` backend only (``KOKKOS_ENABLE_SERIAL``, no ``KOKKOS_ENABLE_OPENMP``/``THREADS``), so every
``parallel_for`` runs on one core and Kokkos problems run with one worker there; a build with the OpenMP or
Threads backend runs with ``--workers`` threads.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

DEBIAN_INCLUDE = Path("/usr/include/trilinos")
DEBIAN_LIBDIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib/aarch64-linux-gnu"), Path("/usr/lib"))
INSTALL_HINT = ("Kokkos is not installed: `apt-get install libtrilinos-kokkos-dev` (Debian/Ubuntu), or set "
                "KOKKOS_ROOT to a Kokkos install prefix (include/Kokkos_Core.hpp, lib/libkokkoscore.so)")
THREADED_BACKENDS = ("OpenMP", "Threads")  # host backends that run a parallel_for on several cores


@dataclass(frozen=True)
class KokkosInstall:
    """Where Kokkos' headers and core library are, and the host backends it was built with."""

    include: Path
    libdir: Path
    lib: str  # the core library's -l name: kokkoscore or trilinos_kokkoscore
    backends: tuple[str, ...]  # of Serial, OpenMP, Threads (host backends enabled in KokkosCore_config.h)

    @property
    def threaded(self) -> bool:
        """Whether a host backend runs parallel work on several threads (else one worker is all a run gets)."""
        return any(b in self.backends for b in THREADED_BACKENDS)

    def compile_flags(self) -> list[str]:
        return [f"-I{self.include}"]

    def link_flags(self) -> list[str]:
        """Link the core library, with a run path unless the dynamic linker already searches its directory."""
        flags = [f"-L{self.libdir}", f"-l{self.lib}"]
        if self.libdir not in DEBIAN_LIBDIRS:
            flags.append(f"-Wl,-rpath,{self.libdir}")
        return flags

    def prefixes(self) -> tuple[str, ...]:
        """Directories a sandbox must show read-only for a build or a run to find these files (none under /usr)."""
        return tuple(sorted({str(p) for p in (self.include, self.libdir) if not str(p).startswith("/usr/")}))


def backends(config_header: Path) -> tuple[str, ...]:
    """The host backends a ``KokkosCore_config.h`` enables (``#define KOKKOS_ENABLE_SERIAL`` and the like)."""
    text = config_header.read_text(errors="replace")
    names = {"SERIAL": "Serial", "OPENMP": "OpenMP", "THREADS": "Threads"}
    return tuple(name for macro, name in names.items()
                 if re.search(rf"^\s*#\s*define\s+KOKKOS_ENABLE_{macro}\b", text, re.MULTILINE))


def _install_at(include: Path, libdirs: tuple[Path, ...], libs: tuple[str, ...]) -> KokkosInstall | None:
    if not (include / "Kokkos_Core.hpp").is_file() or not (include / "KokkosCore_config.h").is_file():
        return None
    for libdir in libdirs:
        for lib in libs:
            if (libdir / f"lib{lib}.so").exists():
                return KokkosInstall(include, libdir, lib, backends(include / "KokkosCore_config.h"))
    return None


def find_kokkos(prefix: str | None = None) -> KokkosInstall | None:
    """The Kokkos install under ``prefix`` (else ``$KOKKOS_ROOT``, else Debian's Trilinos one), or None."""
    return _find(prefix or os.environ.get("KOKKOS_ROOT") or None)


@lru_cache(maxsize=8)
def _find(root: str | None) -> KokkosInstall | None:
    if root:
        r = Path(root)
        return _install_at(r / "include", (r / "lib", r / "lib64"), ("kokkoscore", "trilinos_kokkoscore"))
    return _install_at(DEBIAN_INCLUDE, DEBIAN_LIBDIRS, ("trilinos_kokkoscore", "kokkoscore"))


def require_kokkos(prefix: str | None = None) -> KokkosInstall:
    """:func:`find_kokkos`, or ``FileNotFoundError`` saying how to install it (a setup fault, not a candidate's)."""
    found = find_kokkos(prefix)
    if found is None:
        raise FileNotFoundError(INSTALL_HINT + (f" (nothing usable under {prefix or os.environ['KOKKOS_ROOT']})"
                                                if prefix or os.environ.get("KOKKOS_ROOT") else ""))
    return found
