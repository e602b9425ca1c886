"""``--plan``: the planner's best grids for the experiment's model, as a memorize command and a Slurm job."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from memorization.experiment.config import ExperimentConfig

JOB_MACHINES = ("frontier", "alps", "perlmutter")  # recipes/jobs/generate.py's targets


def run_shape(cfg: ExperimentConfig, tokenizer=None):
    """The shape of the model this run trains: the ``--init`` checkpoint's; else the ``--size`` preset's layers
    as ``--family`` with the vocabulary of the run's ``tokenizer`` (loaded when not given), padded as
    ``build_model`` pads it: the built-in tokenizer's 4,096 rows, not Llama 3.1's 128,256 (an 8b is then 7.0 B
    parameters, not 8.03 B)."""
    from dataclasses import replace

    from axonn.presets import ModelShape, get_preset
    from memorization.experiment.data import load_run_tokenizer
    from memorization.training.models import model_config, padded_vocab

    if cfg.model.init:
        return ModelShape.from_hf_config(model_config(None, 0, init=cfg.model.init), name=Path(cfg.model.init).name)
    preset = get_preset(cfg.model.size, cfg.model.family)
    vocab = padded_vocab(len(tokenizer if tokenizer is not None else load_run_tokenizer(cfg)))
    return preset if vocab == preset.vocab else replace(preset, name=f"{preset.name} (vocabulary {vocab})",
                                                       vocab=vocab)


def print_plan(cfg: ExperimentConfig) -> None:
    """Print the planner's fitting grids for ``execution.gpus`` on ``execution.machine``, the command that runs
    the best one and, for the job machines, the job generator's command."""
    from axonn.planner import PlanError, format_plan, plan as make_plan

    ex, t = cfg.execution, cfg.training
    if ex.gpus is None:
        raise SystemExit("error: --plan needs --gpus N")
    if ex.gpus < 1:
        raise SystemExit(f"error: --gpus {ex.gpus}: give the number of GPUs to plan for, at least 1")
    from axonn.presets import get_preset

    shape = run_shape(cfg)
    if not cfg.model.init and shape.vocab != get_preset(cfg.model.size).vocab:
        print(f"note: without --init this run trains --size {cfg.model.size} with its tokenizer's {shape.vocab:,}-row "
              "vocabulary, planned below; pass --init <checkpoint> to plan the model you fine-tune", file=sys.stderr)
    try:
        result = make_plan(shape, seq=cfg.data.seq_len, global_batch=t.batch_size, gpus=ex.gpus,
                           machine=ex.machine, micro_batch=t.micro_batch,
                           activation_checkpointing=t.activation_checkpointing,
                           grad_reduce_dtype=ex.grad_reduce_dtype)
    except PlanError as e:
        raise SystemExit(f"error: {e}") from None
    print(format_plan(result))
    print(f"\nrun the best grid (one process per GPU, under srun/torchrun/mpiexec):\n  {run_command(cfg, result.best)}")
    if Path(ex.machine).suffix not in (".yaml", ".yml") and ex.machine in JOB_MACHINES:
        print(f"or write a Slurm job for it:\n  python recipes/jobs/generate.py --machine {ex.machine} "
              f"--size {cfg.model.size}{_family_flag(cfg)} --gpus {ex.gpus} --seq {cfg.data.seq_len} "
              f"--global-batch {t.batch_size}"
              f"{'' if t.activation_checkpointing else ' --no-activation-checkpointing'}"
              f" --grad-reduce-dtype {ex.grad_reduce_dtype}")


def run_command(cfg: ExperimentConfig, best) -> str:
    """The memorize.py command line that trains with the planned grid and micro-batch."""
    t = cfg.training
    cmd = ["python recipes/memorize.py", f"--size {cfg.model.size}{_family_flag(cfg)}"]
    if cfg.model.init:
        cmd.append(f"--init {shlex.quote(cfg.model.init)}")
    cmd += [f"--grid {best.grid}", f"--micro-batch {best.micro_batch}",
            f"--seq-len {cfg.data.seq_len}", f"--batch-size {t.batch_size}",
            "--activation-checkpointing" if t.activation_checkpointing else "--no-activation-checkpointing",
            f"--grad-reduce-dtype {cfg.execution.grad_reduce_dtype}"]
    return " ".join(cmd)


def _family_flag(cfg: ExperimentConfig) -> str:
    """`` --family X`` when the run names a family, else nothing."""
    return f" --family {cfg.model.family}" if cfg.model.family else ""
