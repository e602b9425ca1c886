"""A training checkpoint saved on one grid, extracted on another: the HF checkpoint $MODEL_DIR parallelized on
1,2,2,1 is saved with axonn.checkpoint.save (the trainer's format) into $CKPT/step_0000001; then, on 2,1,1,2,
eval_model.load_on_grid reshards it (tokenizer $MODEL_DIR) and rank 0 writes the generated ids to $OUT_JSON."""
from __future__ import annotations

import json
import os

from axonn.checkpoint import save
from memorization.evaluation.eval_model import load_on_grid
from memorization.evaluation.extraction import ExtractionConfig, extract_on_grid
from memorization.training.models import build_model
from memorization.training.runtime import Runtime

rt = Runtime.create(1, 2, 2, 1)
model = build_model(None, int(os.environ["VOCAB"]), init=os.environ["MODEL_DIR"], runtime=rt)
step = os.path.join(os.environ["CKPT"], "step_0000001")
save(model, None, step, grid=rt.grid)
rt.grid.destroy()
rt = Runtime.create(2, 1, 1, 2)
model, tok = load_on_grid(step, rt, os.environ["MODEL_DIR"], require_tokenizer=True)
res = extract_on_grid(model, json.loads(open(os.environ["DOCS"]).read()), rt.grid,
                      ExtractionConfig(prefix_len=10, suffix_len=12, batch_size=3))
if rt.is_main:
    with open(os.environ["OUT_JSON"], "w") as f:
        json.dump([r["generated_ids"] for r in res["documents"]], f)
