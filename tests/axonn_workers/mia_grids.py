"""Membership inference on grids of the launcher's ranks, in one job: run_mia(grid=...) on the HF checkpoint
$MODEL_DIR (also as its own reference model) and the manifest $MANIFEST, on the grids $GRIDS (space-separated;
default: four grids of 4 ranks); rank 0 writes each grid's mia_scores.jsonl under $OUT_DIR/<grid>/."""
from __future__ import annotations

import os

from memorization.evaluation.mia import run_mia

for g in os.environ.get("GRIDS", "1,2,2,1 1,1,2,2 2,2,1,1 1,2,1,2").split():
    run_mia(os.environ["MODEL_DIR"], os.environ["MANIFEST"], os.environ["MODEL_DIR"], batch_size=2,
            out_dir=os.path.join(os.environ["OUT_DIR"], g), grid=g)
