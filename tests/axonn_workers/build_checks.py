"""Sharded model construction on 4 ranks: no rank holds the full model, and nothing changes.

For each grid given on the command line (data,row,col,depth):

1. ``build_model(size, runtime=...)`` (meta parameters, each rank fills its own shards of the
   random init) gathers to exactly the serial ``build_model`` (same CPU generator streams);
2. ``build_model(init=ckpt, runtime=...)`` from a tied, bf16, multi-file HF safetensors checkpoint
   whose vocabulary is extended (4000 -> 4160 rows) gathers to exactly the serial load; rows the
   checkpoint has equal it, ``lm_head`` is the embedding (one parameter: tied), the rest is the random init;
   and each rank reads less than 60% of the checkpoint's rows (only those its shards are cut from);
3. ``export_hf`` into several files (an index) loads in ``from_pretrained`` with the same
   weights, and ``build_model(init=export, runtime=...)`` reproduces the trained model.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import axonn  # noqa: E402
import axonn.checkpoint as ckpt  # noqa: E402
from common import run_main  # noqa: E402

from memorization.training.models import build_model  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402


def shared_tmp() -> Path:
    obj = [tempfile.mkdtemp(prefix="axonn_build_") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(obj, src=0)
    return Path(obj[0])


def write_tied_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """A tied tiny Llama with a 4000-token vocabulary, bf16, in several safetensors files (rank 0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=4000, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(5)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if dist.get_rank() == 0:
        m.save_pretrained(path, max_shard_size="200KB")
        assert (path / "model.safetensors.index.json").exists(), "expected a sharded checkpoint"
    dist.barrier()
    return {n: t.float() for n, t in m.state_dict().items()}


def check_grid(d: int, r: int, c: int, z: int, tmp: Path, hf_sd: dict[str, torch.Tensor]) -> None:
    rt = Runtime(axonn.init(G_data=d, G_intra_r=r, G_intra_c=c, G_intra_d=z))
    tag = f"{d},{r},{c},{z}"

    # 1. random init: sharded == serial, bit for bit
    par = build_model("tiny", 4096, seed=3, runtime=rt)
    assert par._axonn_grid is rt.grid and not axonn.is_meta(par)
    full = axonn.full_state_dict(par)
    ref = build_model("tiny", 4096, seed=3)
    for n, t in ref.state_dict().items():
        assert torch.equal(full[n], t), f"{tag} random init differs in {n}"
    local = sum(p.numel() for p in par.parameters())
    total = sum(p.numel() for p in ref.parameters())
    if r * c * z > 1:
        assert local < total, f"{tag}: rank holds {local} of {total} parameters"

    # 2. a tied bf16 sharded checkpoint, vocabulary extended; each rank reads only its rows
    reads: list[tuple[str, int, int]] = []
    orig_rows = ckpt.SafetensorsCheckpoint.rows

    def counting_rows(self, name, r0, r1):
        reads.append((name, r0, r1))
        return orig_rows(self, name, r0, r1)

    ckpt.SafetensorsCheckpoint.rows = counting_rows
    try:
        par = build_model(None, 4100, init=str(tmp / "tied"), seed=3, runtime=rt)
    finally:
        ckpt.SafetensorsCheckpoint.rows = orig_rows
    full = axonn.full_state_dict(par)
    ref = build_model(None, 4100, init=str(tmp / "tied"), seed=3)
    assert ref.config.vocab_size == 4160 and ref.config.tie_word_embeddings
    assert axonn.is_tied(par) and axonn.is_tied(ref), "the tied checkpoint's head and embedding stay one parameter"
    for n, t in ref.state_dict().items():
        assert torch.equal(full[n], t), f"{tag} checkpoint load differs in {n}"
    emb = hf_sd["model.embed_tokens.weight"]
    assert torch.equal(full["model.embed_tokens.weight"][:4000], emb)
    assert torch.equal(full["lm_head.weight"], full["model.embed_tokens.weight"]), "tied lm_head is not the embedding"
    assert full["lm_head.weight"][4000:].std() > 0.01, "new vocabulary rows not initialised"
    assert torch.equal(full["model.layers.1.mlp.down_proj.weight"], hf_sd["model.layers.1.mlp.down_proj.weight"])
    file_rows = sum(hf_sd[n].shape[0] for n in hf_sd if n != "lm_head.weight")  # the shared tensor is read once
    read_rows = sum(b - a for _, a, b in reads)
    if r * c * z >= 4:
        assert read_rows < 0.6 * file_rows, f"{tag}: rank read {read_rows} of {file_rows} checkpoint rows"

    # 3. export in several files, from_pretrained, and back onto the grid
    with torch.no_grad():
        for p in par.parameters():
            p.add_(0.01)
    ckpt.export_hf(par, tmp / f"export_{tag}", max_shard_bytes=300_000)
    trained = axonn.full_state_dict(par)
    if dist.get_rank() == 0:
        from transformers import AutoModelForCausalLM

        assert (tmp / f"export_{tag}" / "model.safetensors.index.json").exists()
        hf = AutoModelForCausalLM.from_pretrained(tmp / f"export_{tag}", dtype=torch.float32)
        for n, t in hf.state_dict().items():
            assert torch.equal(t, trained[n]), f"{tag} export differs in {n}"
    back = build_model(None, 4160, init=str(tmp / f"export_{tag}"), runtime=rt)
    for n, t in axonn.full_state_dict(back).items():
        assert torch.equal(t, trained[n]), f"{tag} re-load of the export differs in {n}"
    rt.grid.destroy()
    print(f"OK build grid {tag} (rank {dist.get_rank()} read {read_rows} of {file_rows} rows)", flush=True)


def main() -> None:
    world = axonn.init(G_data=int(os.environ["WORLD_SIZE"]))  # the world; each grid below is built over it
    tmp = shared_tmp()
    hf_sd = write_tied_checkpoint(tmp / "tied")
    for g in sys.argv[1:]:
        check_grid(*map(int, g.split(",")), tmp=tmp, hf_sd=hf_sd)
    world.destroy()


if __name__ == "__main__":
    run_main(main)
