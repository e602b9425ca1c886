#!/usr/bin/env bash
# Idempotent setup: a virtual environment in .venv with the pinned CPU PyTorch (only when no torch
# is importable there) and this project, editable, with the test and eval extras, every dependency at
# the exact version of constraints.txt (the environment the README's figures were measured with).
# A second run installs nothing: it checks a stamp keyed on pyproject.toml and constraints.txt.
# Best effort, never fatal: Kokkos for the HPC-code suite's Kokkos problems (Debian's libtrilinos-kokkos-dev)
# where apt-get runs as root and it is missing (GOLDFISH_NO_APT=1 skips it); without it those tests skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="${VENV:-.venv}"
PY_SYS="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    "$PY_SYS" -c 'import sys; assert sys.version_info >= (3, 10), "Python >= 3.10 is required"'
    "$PY_SYS" -m venv "$VENV"
fi
PY="$VENV/bin/python"
if [ ! -f /usr/include/trilinos/Kokkos_Core.hpp ] && [ -z "${KOKKOS_ROOT:-}" ] && [ -z "${GOLDFISH_NO_APT:-}" ] \
        && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Kokkos (libtrilinos-kokkos-dev) for the HPC-code suite, best effort"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtrilinos-kokkos-dev; } \
        >/dev/null 2>&1 || echo "[setup] no Kokkos (apt-get failed): its HPC-code tests will skip" >&2
fi
PIP=("$PY" -m pip install --disable-pip-version-check -q)
[ -d /opt/wheels ] && PIP+=(--find-links /opt/wheels)
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[setup] installing PyTorch 2.13.0 (CPU build) into $VENV"
    "${PIP[@]}" torch==2.13.0 2>&1 | grep -v "is ignored: it is neither" || true
    "$PY" -c "import torch" || { echo "[setup] PyTorch install failed" >&2; exit 1; }
fi
stamp="$VENV/.goldfish-installed-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "[setup] installing the project and its dependencies into $VENV"
    "${PIP[@]}" -c constraints.txt -e ".[test,eval,fp8]" 2>&1 | grep -v "is ignored: it is neither" || true
    "$PY" -c "import torch, transformers, datasets, axonn, memorization" \
        || { echo "[setup] project install failed (see pip's output above)" >&2; exit 1; }
    rm -f "$VENV"/.goldfish-installed-*
    touch "$stamp"
fi
