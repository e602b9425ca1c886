"""Build the Llama model of an experiment: from a size preset (config only) or a local HF checkpoint."""
from __future__ import annotations

from pathlib import Path

import torch

from axonn.presets import ModelShape, get_preset

BYTES_PER_PARAM_TRAINING = 16  # fp32 weights + grads + Adam m, v


def padded_vocab(n: int, multiple: int = 64) -> int:
    """Round a tokenizer's size up so the vocabulary splits evenly over tensor-parallel axes."""
    return -(-n // multiple) * multiple


def check_size_runs_here(shape: ModelShape, device: torch.device, grid: tuple[int, int, int, int] = (1, 1, 1, 1),
                         seq: int = 2048, micro_batch: int = 1, activation_checkpointing: bool = False,
                         free_bytes: int | None = None, micro_steps: int = 2) -> None:
    """Refuse, before any allocation, a run this machine cannot hold (with what to do instead).

    On a GPU the need is the planner's peak memory of one rank of ``grid`` (D, R, C, Z) for this
    sequence length, micro-batch, micro-steps per optimizer step and checkpointing
    (:func:`axonn.planner.memory_per_gpu`, checked against traces of this trainer), against the free memory of the device (``free_bytes``
    overrides the query, for tests).
    """
    if device.type == "cpu":
        if not shape.cpu_ok:
            from axonn.presets import preset_names

            need = shape.num_params() * BYTES_PER_PARAM_TRAINING / (grid[1] * grid[2] * grid[3])
            cpu_sizes = [n for n in preset_names() if get_preset(n).cpu_ok]
            raise SystemExit(
                f"size {shape.name!r} ({shape.num_params() / 1e9:.2f}B parameters, ~{need / 2**30:.0f} GiB of "
                f"training state per rank) cannot be trained on this CPU-only machine: use --size "
                f"{'/'.join(cpu_sizes)} here, or run on GPUs (`--plan --gpus N --machine NAME` shows a grid that fits)"
            )
        return
    from axonn.planner import Grid, memory_per_gpu

    mem = memory_per_gpu(shape, Grid(*grid), seq, micro_batch, activation_checkpointing, micro_steps=micro_steps)
    free = torch.cuda.mem_get_info(device)[0] if free_bytes is None else free_bytes
    if mem.total <= 0.95 * free:
        return
    g = 2**30
    fixes = []
    if not activation_checkpointing and memory_per_gpu(shape, Grid(*grid), seq, micro_batch, True,
                                                         micro_steps=micro_steps).total <= 0.95 * free:
        fixes.append("add --activation-checkpointing")
    if micro_batch > 1:
        fixes.append("lower --micro-batch")
    fixes.append("shard over more GPUs (`--plan --gpus N --machine NAME` picks a grid)")
    raise SystemExit(
        f"size {shape.name!r} on grid D,R,C,Z={','.join(map(str, grid))} at {micro_batch} x {seq} tokens per "
        f"micro-step needs ~{mem.total / g:.1f} GiB per GPU (training state {mem.states / g:.1f}, activations "
        f"{mem.activations / g:.1f}, logits {mem.logits / g:.1f}, buffers {mem.buffers / g:.1f}) but "
        f"{free / g:.1f} GiB is free: " + "; or ".join(fixes))


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
