"""Sampled code-generation completions on four grids of the launcher's 4 ranks, in one job: HFSampler(grid=...)
on the HF checkpoint $MODEL_DIR samples the prompts $PROMPTS with :data:`SAMPLING`; rank 0 writes each grid's
completions to $OUT_DIR/<grid>.json."""
from __future__ import annotations

import json
import os

SAMPLING = {"temperature": 0.9, "top_p": 0.9, "max_new_tokens": 12}


def done_after_three_spaces(text: str) -> bool:
    """A stand-in for "the function is complete" that rows reach at different steps."""
    return text.count(" ") >= 3


if __name__ == "__main__":
    from hpc_codegen.generate import HFSampler

    prompts = json.loads(os.environ["PROMPTS"])
    for g in ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"):
        sampler = HFSampler(os.environ["MODEL_DIR"], seed=7, grid=g)
        got = sampler.sample(prompts, 3, batch_size=2, is_done=done_after_three_spaces, progress=False, **SAMPLING)
        if sampler.grid.rank == 0:
            with open(os.path.join(os.environ["OUT_DIR"], f"{g}.json"), "w") as f:
                json.dump(got, f)
