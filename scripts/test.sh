#!/usr/bin/env bash
# Set up (first time only) and run the default test suite (~9 minutes on 2 cores).
#   bash scripts/test.sh                           default suite
#   bash scripts/test.sh --slow                    only the slow tests (minutes each)
#   bash scripts/test.sh tests/axonn/test_grid.py  one file, directory or FILE::TEST
# Other arguments go to pytest.  The layout of tests/ (one directory per package): tests/README.md.
# Two pytest workers (pytest-xdist), each file's tests on one of them in order (--dist loadfile): most tests use one
# core, so on 2 cores the suite takes about half the time of one worker; GOLDFISH_TEST_WORKERS=0 runs one process.
# Each worker's torch computes on one thread (OMP_NUM_THREADS=1): two workers of two OpenMP threads each on 2 cores
# spin against each other, measured 2.1x slower for the same two tests side by side.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH" WANDB_MODE=disabled HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = "--slow" ]; then shift; set -- -m slow "$@"; fi
workers="${GOLDFISH_TEST_WORKERS:-2}"
if [ "$workers" != 0 ]; then export OMP_NUM_THREADS=1; set -- -n "$workers" --dist loadfile "$@"; fi
exec python -m pytest -q "$@"
