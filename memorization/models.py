"""Build the Llama model of an experiment: from a size preset (config only) or a local HF checkpoint."""
from __future__ import annotations

from pathlib import Path

import torch

from axonn.presets import ModelShape, get_preset

BYTES_PER_PARAM_TRAINING = 16  # fp32 weights + grads + Adam m, v


def padded_vocab(n: int, multiple: int = 64) -> int:
    """Round a tokenizer's size up so the vocabulary splits evenly over tensor-parallel axes."""
    return -(-n // multiple) * multiple


def check_size_runs_here(shape: ModelShape, device: torch.device, ranks: int = 1) -> None:
    """Refuse, before any allocation, a preset this machine cannot train (with what to do instead)."""
    need = shape.num_params() * BYTES_PER_PARAM_TRAINING / ranks
    if device.type == "cpu":
        if not shape.cpu_ok:
            from axonn.presets import preset_names

            cpu_sizes = [n for n in preset_names() if get_preset(n).cpu_ok]
            raise SystemExit(
                f"size {shape.name!r} ({shape.num_params() / 1e9:.2f}B parameters, ~{need / 2**30:.0f} GiB of "
                f"training state per rank) cannot be trained on this CPU-only machine: use --size "
                f"{'/'.join(cpu_sizes)} here, or run on GPUs (`--plan --gpus N --machine NAME` shows a grid that fits)"
            )
        return
    free, _total = torch.cuda.mem_get_info(device)
    if need > free:
        raise SystemExit(
            f"size {shape.name!r} needs ~{need / 2**30:.0f} GiB of training state per GPU on this grid but "
            f"{free / 2**30:.0f} GiB is free: shard it over more GPUs (`--plan --gpus N --machine NAME` picks a grid)"
        )


def build_model(
    size: str | None,
    vocab_size: int,
    init: str | None = None,
    seed: int = 0,
    max_seq: int | None = None,
) -> torch.nn.Module:
    """A ``LlamaForCausalLM``: randomly initialised from preset ``size`` (seeded), or loaded from ``init``."""
    from transformers import AutoModelForCausalLM

    if init is not None:
        path = Path(init)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"--init {init}: no Hugging Face checkpoint (config.json) there")
        model = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa", dtype=torch.float32)
        if model.config.model_type != "llama":
            raise ValueError(f"--init {init} is a {model.config.model_type!r} model; only Llama is supported")
        if model.get_input_embeddings().num_embeddings < vocab_size:
            model.resize_token_embeddings(padded_vocab(vocab_size))
        return model
    from transformers import LlamaForCausalLM

    shape = get_preset(size)
    overrides = {"attn_implementation": "sdpa"}
    if max_seq is not None:
        overrides["max_position_embeddings"] = max(max_seq, shape.max_seq)
    config = shape.llama_config(vocab_size=padded_vocab(vocab_size), **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model
