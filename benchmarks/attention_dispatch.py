#!/usr/bin/env python
"""Which attention kernel our compiled training step dispatches on this machine, and with what arguments.

    python benchmarks/attention_dispatch.py                        # GPU: the 1b's shape, 2 of its layers, 1 x 2048
    python benchmarks/attention_dispatch.py --size tiny --seq 64   # CPU smoke run

One step of :class:`memorization.training.train.Trainer` (bf16 autocast on CUDA) with its forward compiled by
:func:`memorization.training.attention.sdpa_recording_backend` (AOTAutograd's aten graph, run eagerly): every attention
op of the graph is printed -- the aten op PyTorch chose (flash, cuDNN, efficient, math), ``is_causal``, whether a mask
tensor is passed, the heads of Q and of K/V -- then the same for HF's own ``sdpa`` for contrast. The last line
says ``attention dispatch OK`` when ours calls a causal kernel without a mask on grouped K/V (what
``tests/memorization/training/test_attention.py`` checks on CPU), else ``attention dispatch BAD`` and why.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from benchmarks.common import device  # noqa: E402
from memorization.training.attention import compiled_step_attention, dispatch_problems  # noqa: E402
from memorization.training.goldfish import GoldfishConfig  # noqa: E402
from memorization.training.models import build_model, model_config  # noqa: E402
from memorization.training.train import TrainConfig, Trainer  # noqa: E402

VOCAB = 32000


def dispatched(size: str, layers: int | None, batch: int, seq: int, attn: str | None, dev: torch.device):
    """``(calls, config)`` of one compiled training step of our trainer; ``attn`` overrides its attention."""
    config = model_config(size, VOCAB)
    if layers:
        config.num_hidden_layers = layers
    rows = torch.randint(3, VOCAB, (2 * batch, seq))
    cfg = TrainConfig(batch_size=batch, warmup_steps=0, checkpoint_every=0, progress=False,
                      goldfish=GoldfishConfig(k=4, h=13))
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(build_model(size, VOCAB, seed=0, config=config), rows, torch.zeros_like(rows, dtype=torch.int32),
                    rows[:batch], cfg, tmp)
        if attn is not None:
            t.model.set_attn_implementation(attn)
        return compiled_step_attention(t), t.model.config


def main() -> None:
    import transformers

    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="1b", help="model preset")
    p.add_argument("--layers", type=int, default=2, help="layers to build (0: the preset's); the ops repeat per layer")
    p.add_argument("--batch", type=int, default=1, help="sequences per step")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    a = p.parse_args()
    dev = device()
    print(f"device {dev}{' ' + torch.cuda.get_device_name() if dev.type == 'cuda' else ''}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, {a.size} with {a.layers or 'all'} layers, {a.batch} x {a.seq}")
    for name, attn in (("HF sdpa (contrast)", "sdpa"), ("ours", None)):
        calls, config = dispatched(a.size, a.layers or None, a.batch, a.seq, attn, dev)
        print(f"{name}: attn_implementation {config._attn_implementation}, heads {config.num_attention_heads}, "
              f"kv heads {config.num_key_value_heads}")
        for c in dict.fromkeys(calls):  # distinct, in order
            print(f"  attention op {c.op}: is_causal={c.is_causal} mask={c.has_mask} q_heads={c.q_heads} "
                  f"kv_heads={c.kv_heads} enable_gqa={c.enable_gqa}")
    problems = dispatch_problems(calls, config)
    print(f"attention dispatch {'BAD: ' + '; '.join(problems) if problems else 'OK'}")


if __name__ == "__main__":
    main()
