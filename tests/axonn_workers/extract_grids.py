"""Extraction on four grids of the launcher's 4 ranks (or those of $GRIDS), in one job: each grid's model built from the HF
checkpoint $MODEL_DIR (each rank reading its own shards), the documents of $DOCS split over its replicas;
rank 0 writes every grid's generated token ids to $OUT_JSON."""
from __future__ import annotations

import json
import os

from memorization.evaluation.extraction import ExtractionConfig, extract_on_grid
from memorization.training.models import build_model
from memorization.training.runtime import Runtime

GRIDS = ((1, 2, 2, 1), (1, 1, 2, 2), (2, 2, 1, 1), (1, 2, 1, 2))  # data, row, column, depth ($GRIDS: "D,R,C,Z ...")
if os.environ.get("GRIDS"):
    GRIDS = tuple(tuple(map(int, g.split(","))) for g in os.environ["GRIDS"].split())
docs = json.loads(open(os.environ["DOCS"]).read())
cfg = ExtractionConfig(prefix_len=int(os.environ.get("EXTRACT_PREFIX", 10)),
                       suffix_len=int(os.environ.get("EXTRACT_SUFFIX", 12)), batch_size=3,
                       beam=int(os.environ.get("BEAM", "0")), hints=bool(int(os.environ.get("HINTS", "0"))))
out = {}
for g in GRIDS:
    rt = Runtime.create(*g)
    model = build_model(None, int(os.environ["VOCAB"]), init=os.environ["MODEL_DIR"], runtime=rt).eval()
    res = extract_on_grid(model, docs, rt.grid, cfg)
    out[",".join(map(str, g))] = [r["generated_ids"] for r in res["documents"]]
    if cfg.beam or cfg.hints:  # the adaptive attacks' per-document results (memorization.evaluation.adaptive)
        out["adaptive " + ",".join(map(str, g))] = [[r.get("beam_rank"), r.get("hints"), r.get("longest_run")]
                                                    for r in res["documents"]]
    rt.grid.destroy()
if int(os.environ["RANK"]) == 0:
    with open(os.environ["OUT_JSON"], "w") as f:
        json.dump(out, f)
