"""Checkpoint checks on 4 ranks (meant to be launched with ``mpiexec -n 4``).

1. grid A=(data 1,row 2,col 1,depth 2): train 3 steps, save, train 2 more (losses L).
2. same grid, fresh model with other weights: load -> 2 steps give exactly L (bit-exact resume),
   reading only the shard files of the ranks that own this rank's shards.
3. grid B=(data 2,row 1,col 2,depth 1): load A's checkpoint -> same full state dict, 2 steps ~ L;
   saved on B in the background while those steps run, the data replicas split the writing, and it
   loads back as the state at the save (also without index.json).
4. a checkpoint from a different model is refused; ``to_hf`` of A offline equals the saved state;
   export_hf loads in from_pretrained with equal logits; the same for a model with tied embeddings, resumed
   across grids (check_tied).
5. every other model family of ``axonn.plans`` on grid (1,2,2,1): parallel loss, logits and gradients equal
   the serial model's, and its export_hf loads back as the serial model (family_checks.py; in this launch
   so that the default suite starts no other 4-rank job for it).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import axonn  # noqa: E402
import axonn.checkpoint as ckpt  # noqa: E402
from common import assert_close, batch, run_main, tiny_llama, train_step  # noqa: E402
from family_checks import check_families  # noqa: E402


def step(model, opt, s: int) -> float:
    return train_step(model, opt, *batch(s))


def make(seed: int, **kw):
    m = axonn.parallelize(tiny_llama(seed, attention_bias=True, **kw))
    return m, torch.optim.AdamW(m.parameters(), lr=3e-3)


def check_tied(base: Path) -> None:
    """A model whose LM head is its embedding (tie_word_embeddings): trained on grid A (row 2, depth 2), saved,
    resumed on grid B (data 2, col 2) with the same full state and loss curve; ``to_hf`` and ``export_hf`` write
    the shared tensor once under the embedding's name, and ``from_pretrained`` gives a tied model with the
    parallel model's logits."""
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    axonn.init(G_intra_r=2, G_intra_d=2)
    model, opt = make(0, tie_word_embeddings=True)
    assert axonn.is_tied(model)
    for s in range(3):
        step(model, opt, s)
    path = base / "tied"
    ckpt.save(model, opt, path, extra_state={"step": 3})
    saved = axonn.full_state_dict(model)
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    cont = [step(model, opt, s) for s in range(3, 5)]
    axonn.init(G_data=2, G_intra_c=2)
    model2, opt2 = make(9, tie_word_embeddings=True)
    ckpt.load(model2, opt2, path)
    sd2 = axonn.full_state_dict(model2)
    assert all(torch.equal(sd2[n], t) for n, t in saved.items()), "tied reshard changed the state"
    resumed = [step(model2, opt2, s) for s in range(3, 5)]
    for a, b in zip(resumed, cont):
        assert abs(a - b) <= 1e-5 * abs(b), f"tied resharded run {resumed} vs {cont}"
    ckpt.export_hf(model2, base / "tied_hf")
    x, _ = batch(9)
    with torch.no_grad():
        b = model2(input_ids=x).logits
    if dist.get_rank() == 0:
        ckpt.to_hf(path, base / "tied_offline")
        for d in ("tied_hf", "tied_offline"):
            files = load_file(base / d / "model.safetensors")
            assert "lm_head.weight" not in files and "model.embed_tokens.weight" in files, sorted(files)
            assert json.loads((base / d / "config.json").read_text())["tie_word_embeddings"] is True
        hf = LlamaForCausalLM.from_pretrained(base / "tied_hf").float()
        assert hf.lm_head.weight is hf.model.embed_tokens.weight
        with torch.no_grad():
            assert_close(b, hf(input_ids=x).logits, "exported tied model logits")
        print("OK tied", flush=True)
    dist.barrier()


def main() -> None:
    axonn.init(G_intra_r=2, G_intra_d=2)
    base = None
    if dist.get_rank() == 0:
        base = tempfile.mkdtemp(prefix="axonn_ckpt_")
    obj = [base]
    dist.broadcast_object_list(obj, src=0)
    base = Path(obj[0])
    path = base / "ckA"

    model, opt = make(0)
    for s in range(3):
        step(model, opt, s)
    ckpt.save(model, opt, path, extra_state={"step": 3})
    saved_sd = axonn.full_state_dict(model)
    ckpt.save(model, opt, path, extra_state={"step": 3})  # overwrite an existing checkpoint atomically
    assert (path / "COMPLETE").exists() and not (base / ".ckA.tmp").exists()
    cont = [step(model, opt, s) for s in range(3, 5)]

    model2, opt2 = make(123)
    opened: list[str] = []
    real_load = torch.load
    # (extra.pt is unpickled from the bytes its checksum was checked on: not a path)
    torch.load = lambda f, *a, **k: (opened.append(Path(f).name if isinstance(f, (str, os.PathLike)) else "bytes"),
                                     real_load(f, *a, **k))[1]
    try:
        extra = ckpt.load(model2, opt2, path)
    finally:
        torch.load = real_load
    assert extra == {"step": 3}, extra
    # same grid: only the owners of this rank's shards are read. Rank 3 (depth 1, row 1) owns its
    # weights; rank 1 (depth 0, row 1) its row's biases and embedding rows; rank 0 the norms
    shard_files = sorted(n for n in opened if n.startswith("rank"))
    if dist.get_rank() == 3:
        assert shard_files == ["rank00000.pt", "rank00001.pt", "rank00003.pt"], shard_files
    resumed = [step(model2, opt2, s) for s in range(3, 5)]
    assert resumed == cont, f"resume not bit-exact: {resumed} vs {cont}"

    axonn.init(G_data=2, G_intra_c=2)
    model3, opt3 = make(7)
    ckpt.load(model3, opt3, path)
    sd3 = axonn.full_state_dict(model3)
    for n, t in saved_sd.items():
        assert torch.equal(sd3[n], t), f"reshard changed {n}"
    # on grid B the two data replicas of each column rank split its shards: all four ranks write,
    # each distinct shard once.  Written in the background while model3 trains on: the snapshot is
    # of the state at the save, and the checkpoint appears only when every rank has finished
    pending = ckpt.save(model3, opt3, base / "ckB", extra_state={"step": 3}, background=True)
    reshard = [step(model3, opt3, s) for s in range(3, 5)]
    assert not (base / "ckB").exists()
    pending.finish()
    written = sorted(p.name for p in (base / "ckB").glob("rank*.pt"))
    assert written == [f"rank{r:05d}.pt" for r in range(4)], written
    index = ckpt.read_index(base / "ckB")
    stored = [(n, s) for part in index.values() for n, s in part.items()]
    assert len(set(stored)) == len(stored), "a shard is stored twice"
    assert {n for n, _ in stored} == set(dict(model3.named_parameters())), "a parameter is not stored"
    assert len(json.loads((base / "ckB" / "index.json").read_text())["specs"]) < len(stored)  # specs stored once
    model4, opt4 = make(5)
    ckpt.load(model4, opt4, base / "ckB")
    sd4 = axonn.full_state_dict(model4)
    assert all(torch.equal(sd4[n], t) for n, t in saved_sd.items()), "grid B round trip changed the state"
    dist.barrier()
    if dist.get_rank() == 0:  # a v1 checkpoint, from before index.json: each file's own table is read
        (base / "ckB" / "index.json").unlink()
        (base / "ckB" / "checksums.json").unlink()  # (v1 predates checksums too)
        meta = json.loads((base / "ckB" / "meta.json").read_text())
        del meta["checksums"]
        (base / "ckB" / "meta.json").write_text(json.dumps({**meta, "format": "axonn-sharded-v1"}))
    dist.barrier()
    model5, opt5 = make(6)
    ckpt.load(model5, opt5, base / "ckB")
    sd5 = axonn.full_state_dict(model5)
    assert all(torch.equal(sd5[n], t) for n, t in saved_sd.items()), "loading without index.json failed"
    for a, b in zip(reshard, cont):
        assert abs(a - b) <= 1e-5 * abs(b), f"resharded run {reshard} vs {cont}"

    other, other_opt = make(0, intermediate_size=192)
    try:
        ckpt.load(other, other_opt, path)
    except ValueError as e:
        assert "does not match the model" in str(e) and "intermediate_size" in str(e), e
    else:
        raise AssertionError("loading a different model's checkpoint was not refused")

    if dist.get_rank() == 0:  # offline, one process: checkpoint A (row and depth pieces) -> a HF directory
        from safetensors.torch import load_file

        ckpt.to_hf(path, base / "hfA", max_shard_bytes=40_000)
        got = {}
        for f in sorted((base / "hfA").glob("*.safetensors")):
            got.update(load_file(f))
        assert len(list((base / "hfA").glob("*.safetensors"))) > 1 and set(got) == set(saved_sd)
        for n, t in saved_sd.items():
            assert torch.equal(got[n], t), f"to_hf changed {n}"
    hf_dir = base / "hf"
    ckpt.export_hf(model3, hf_dir)
    if dist.get_rank() == 0:
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(hf_dir).float()
        x, _ = batch(9)
        with torch.no_grad():
            a = hf(input_ids=x).logits
    with torch.no_grad():
        x, _ = batch(9)
        b = model3(input_ids=x).logits
    if dist.get_rank() == 0:
        assert_close(b, a, "exported model logits")
        print("OK checkpoint", flush=True)
    dist.barrier()
    check_tied(base)
    axonn.init(G_intra_r=2, G_intra_c=2)
    t0 = time.time()
    check_families(export_dir=base / "families")
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"OK families ({time.time() - t0:.1f} s)", flush=True)
    if dist.get_rank() == 0:
        import shutil
        shutil.rmtree(base)


if __name__ == "__main__":
    run_main(main)
