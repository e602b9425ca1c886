"""Parallel == serial for every model family of ``axonn.plans`` on the grids given (data,row,col,depth).

Per family and grid: a tiny random HF model (every parameter perturbed, so norms and biases are not
their 1/0 init), parallelized; the loss, the full-vocabulary logits and every gathered parameter
gradient (after ``sync_gradients``) equal the serial model's within 1e-5 relative (run as a script: also
with activation checkpointing, and over AdamW steps with every overlap on, for the families with code paths
of their own), and
``full_state_dict`` returns the serial weights bit for bit; with ``export_dir``, ``axonn.checkpoint.export_hf``
writes a directory that ``from_pretrained`` loads as the serial model.  Importable: :func:`check_families`.
"""
from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import axonn  # noqa: E402
from common import assert_close, assert_matches_serial, batch, mean_over_batch_ranks, run_main  # noqa: E402

BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
            max_position_embeddings=64, tie_word_embeddings=False, pad_token_id=138)


def family_config(model_type: str):
    """A tiny config of each family, with what sets it apart from Llama switched on."""
    import transformers as tf

    kv = dict(num_key_value_heads=2)
    cfg = {
        "mistral": lambda: tf.MistralConfig(**BASE, **kv, sliding_window=6),  # shorter than the batch's 16
        "qwen2": lambda: tf.Qwen2Config(**BASE, **kv),                        # q/k/v biases
        "qwen3": lambda: tf.Qwen3Config(**BASE, **kv, head_dim=32),          # per-head q/k norms, head_dim != h/heads
        "olmo2": lambda: tf.Olmo2Config(**BASE, **kv),                        # full-width q/k norms, post-norms
        "gpt_neox": lambda: tf.GPTNeoXConfig(**{**BASE, "intermediate_size": 256}, rotary_pct=0.25,
                                             use_parallel_residual=True),
    }[model_type]()
    cfg._attn_implementation = "eager"
    return cfg


def tiny_model(model_type: str, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(model_type)).float()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model


def check_family(model_type: str, export_dir: Path | None = None) -> None:
    ref = tiny_model(model_type)
    par = axonn.parallelize(copy.deepcopy(ref))
    x, y = batch(0)
    out_ref = ref(input_ids=x, labels=y)
    out_ref.loss.backward()
    out = par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y))
    out.loss.backward()
    axonn.sync_gradients(par)
    assert_matches_serial(par, ref, x, out.loss, out_ref, model_type)
    if export_dir is not None:
        import axonn.checkpoint as ckpt

        ckpt.export_hf(par, export_dir / model_type)
        if dist.get_rank() == 0:
            from transformers import AutoModelForCausalLM

            back = AutoModelForCausalLM.from_pretrained(export_dir / model_type)
            assert type(back) is type(ref), type(back)
            got = back.state_dict()
            for n, t in ref.state_dict().items():
                assert torch.equal(got[n], t), f"{model_type} exported {n}"


def check_family_checkpointing(model_type: str) -> None:
    """With activation checkpointing (layer inputs sharded over row x column) the gradients are the serial ones."""
    ref = tiny_model(model_type)
    ref.train()
    x, y = batch(0)
    ref(input_ids=x, labels=y).loss.backward()
    par = axonn.parallelize(copy.deepcopy(ref))
    for p in par.parameters():
        p.grad = None
    axonn.enable_activation_checkpointing(par)
    par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y)).loss.backward()
    axonn.sync_gradients(par)
    grads = axonn.full_grad_dict(par)
    for n, p in ref.named_parameters():
        assert_close(grads[n], p.grad, f"{model_type} checkpointed grad {n}")


def check_family_training(model_type: str, steps: int = 4) -> None:
    """AdamW steps with every communication overlap on follow the serial loss curve."""
    def train(model, parallel: bool) -> list[float]:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for s in range(steps):
            x, y = batch(s % 2)
            if parallel:
                x, y = axonn.batch_slice(x), axonn.batch_slice(y)
            loss = model(input_ids=x, labels=y).loss
            loss.backward()
            if parallel:
                axonn.sync_gradients(model)
            losses.append(float(mean_over_batch_ranks(loss)) if parallel else float(loss))
            opt.step()
            opt.zero_grad(set_to_none=True)
        return losses

    ref = tiny_model(model_type)
    serial = train(copy.deepcopy(ref), parallel=False)
    with axonn.optimize_communication(overlap_all_reduce=True, overlap_reduce_scatter=True, overlap_all_gather=True):
        par = train(axonn.parallelize(copy.deepcopy(ref)), parallel=True)
    for i, (a, b) in enumerate(zip(par, serial)):
        assert abs(a - b) <= 1e-4 * abs(b), f"{model_type} step {i}: parallel loss {a} vs serial {b}"


def check_families(families: tuple[str, ...] | None = None, export_dir: Path | None = None) -> None:
    """:func:`check_family` for ``families`` (default: every family of ``axonn.plans`` but Llama, which
    grid_checks.py covers)."""
    from axonn.plans import FAMILIES

    for model_type in families or tuple(f for f in FAMILIES if f != "llama"):
        check_family(model_type, export_dir)


def main() -> None:
    for spec in sys.argv[1:]:
        d, r, c, z = (int(v) for v in spec.split(","))
        grid = axonn.init(G_data=d, G_intra_r=r, G_intra_c=c, G_intra_d=z)
        t0 = time.time()
        check_families()
        for model_type in ("qwen3", "olmo2", "gpt_neox"):  # the families with code paths of their own
            check_family_checkpointing(model_type)
            check_family_training(model_type)
        dist.barrier()
        if grid.rank == 0:
            print(f"OK families grid data={d} row={r} col={c} depth={z} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    run_main(main)
