"""Held-out perplexity on four grids of the launcher's 4 ranks (or those of $GRIDS), in one job: run_downstream(grid=...) on the HF
checkpoint $MODEL_DIR and the documents $DOCS_JSONL; rank 0 writes each grid's downstream.json under
$OUT_DIR/<grid>/."""
from __future__ import annotations

import os

from memorization.evaluation.downstream import run_downstream

for g in os.environ.get("GRIDS", "1,2,2,1 1,1,2,2 2,2,1,1 1,2,1,2").split():
    run_downstream(os.environ["MODEL_DIR"], perplexity_source=os.environ["DOCS_JSONL"], batch_size=2,
                   max_length=24, stride=8, out_dir=os.path.join(os.environ["OUT_DIR"], g), grid=g)
