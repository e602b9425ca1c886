#!/usr/bin/env bash
# Set up (first time only) and run the main experiment on the small default:
# a tiny Llama trained on the offline corpus with standard and Goldfish loss, then extraction.
# Extra arguments go to recipes/memorize.py (see --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# The same CPU arithmetic on every x86-64 machine (the README's figures): ATen's AVX2 kernels and MKL's
# AVX2 code path whatever the processor supports, and 2 threads (a reduction's order depends on the
# thread count). Training at this learning rate is chaotic, so one rounding difference shows in the
# figures. Set any of these yourself to override it.
if [ "$(uname -m)" = x86_64 ]; then
    export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}" MKL_CBWR="${MKL_CBWR:-AVX2}"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
if [ $# -eq 0 ]; then set -- --out runs/memorize --overwrite; fi
exec python recipes/memorize.py "$@"
