"""On 2 ranks (data 2): a shard that only rank 1 verifies is damaged; both ranks must fall back together.

The trainer's runtime saves steps 4 and 8; rank00001.pt of step 8 is damaged (rank 1 reads it whole to
verify it, rank 0 never opens it).  Both ranks' resume must take step 4, with step 4's state; with
rank00000.pt of step 4 damaged too (found by rank 0 alone), both must refuse to resume.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
import axonn.checkpoint as ckpt  # noqa: E402
from common import flip_bytes, run_main, save_steps_4_and_8  # noqa: E402
from memorization.training.models import build_model  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402


def main() -> None:
    rt = Runtime.create(data=2)
    root = Path(rt.from_main(tempfile.mkdtemp(prefix="axonn_damaged_") if rt.is_main else None)) / "ckpt"
    model = build_model("tiny", 512, seed=3, runtime=rt)
    opt = torch.optim.AdamW(model.parameters())
    at4 = save_steps_4_and_8(rt, model, opt, root)
    assert sorted(p.name for p in (root / "step_0000008").glob("rank*.pt")) == ["rank00000.pt", "rank00001.pt"]
    if rt.is_main:
        flip_bytes(root / "step_0000008" / "rank00001.pt")
    rt.barrier()
    fresh = build_model("tiny", 512, seed=5, runtime=rt)
    extra = rt.load_checkpoint(fresh, torch.optim.AdamW(fresh.parameters()), root)
    assert extra["step"] == 4, extra["step"]
    assert all(torch.equal(p, at4[n]) for n, p in fresh.named_parameters())
    print(f"rank {rt.grid.rank}: fell back to step 4 with its state", flush=True)
    rt.barrier()
    if rt.is_main:
        flip_bytes(root / "step_0000004" / "rank00000.pt")
    rt.barrier()
    try:
        rt.resume_point(root)
    except ckpt.DamagedCheckpoint as e:
        assert "no intact checkpoint" in str(e), e
        print(f"rank {rt.grid.rank}: refused, no intact checkpoint", flush=True)
    else:
        raise AssertionError("resumed from a damaged checkpoint")
    rt.barrier()
    if rt.is_main:
        import shutil

        shutil.rmtree(root.parent)


if __name__ == "__main__":
    run_main(main)
