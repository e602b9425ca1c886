"""Membership inference on four grids of the launcher's 4 ranks, in one job: run_mia(grid=...) on the HF
checkpoint $MODEL_DIR (also as its own reference model) and the manifest $MANIFEST; rank 0 writes each grid's
mia_scores.jsonl under $OUT_DIR/<grid>/."""
from __future__ import annotations

import os

from memorization.mia import run_mia

for g in ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"):
    run_mia(os.environ["MODEL_DIR"], os.environ["MANIFEST"], os.environ["MODEL_DIR"], batch_size=2,
            out_dir=os.path.join(os.environ["OUT_DIR"], g), grid=g)
