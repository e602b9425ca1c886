#!/usr/bin/env bash
# Set up (first time only) and run the main experiment on the small default:
# a tiny Llama trained on the offline corpus with standard and Goldfish loss, then extraction.
# Extra arguments go to recipes/memorize.py (see --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
if [ $# -eq 0 ]; then set -- --out runs/memorize --overwrite; fi
exec python recipes/memorize.py "$@"
