"""Every refusal of a bad experiment config, before any download, allocation or training.

Messages name the memorize flag of the field at fault (``--lr``; the YAML key is the flag's name under its
section: ``training.lr``).  All raise :class:`~memorization.experiment.config.ConfigError` (a SystemExit).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from axonn.grid_shape import GridShape
from memorization.experiment.config import (ADAMW_IMPLS, MAX_FINE_TUNE_LR, ConfigError, ExperimentConfig, flat,
                                            parse_arms, parse_lengths, settings)
from memorization.experiment.data import mixture_config, parse_exposures

# How a run executes, not what it computes: a --resume may change them (e.g. a requeued job on another
# number of GPUs: the checkpoint is resharded onto the new grid).  Gradients summed in bf16 round
# differently, micro-batching sums in another order: the loss curve goes on to that rounding.
EXECUTION_SETTINGS = ("grid", "micro_batch", "overlap", "grad_reduce_dtype", "compile", "activation_checkpointing",
                      "checkpoint_every", "async_checkpoint", "extract_batch")


def as_flags(names) -> str:
    """``("grid", "micro_batch")`` -> ``"--grid, --micro-batch"``."""
    return ", ".join("--" + k.replace("_", "-") for k in names)


def config_grid(cfg: ExperimentConfig) -> GridShape:
    """``cfg``'s ``--grid`` (:meth:`GridShape.parse`); a ConfigError naming the flag when it is not a grid."""
    try:
        return GridShape.parse(cfg.execution.grid)
    except ValueError as e:
        raise ConfigError(f"error: --grid: {e}") from None


def check_grid_divides(cfg: ExperimentConfig, shape) -> None:
    """Refuse (:class:`ConfigError`) a ``--grid`` that cannot shard the model ``shape``: its row and column sizes
    must divide the heads, KV heads, hidden, ffn and vocabulary sizes (:func:`axonn.planner.divisibility_problem`)."""
    from axonn.planner import divisibility_problem

    why = divisibility_problem(shape, config_grid(cfg))
    if why:
        raise ConfigError(f"error: --grid {cfg.execution.grid}: {why}: choose a grid whose row and column sizes "
                          "divide the model's heads, hidden and ffn sizes (or let the planner choose: --plan --gpus N)")


def note(message: str) -> None:
    """A note on stderr, once per run: from the first rank only (checks run before the grid exists, on every rank)."""
    from axonn.grid import launcher_rank

    if launcher_rank() == 0:
        print(f"note: {message}", file=sys.stderr)


def validate(cfg: ExperimentConfig) -> None:
    """Refuse ``cfg`` (resolved: :func:`~memorization.experiment.config.resolve`) if anything in it is bad,
    before any download, allocation or training; notes (a --resume with nothing to resume) on stderr."""
    from axonn.presets import get_preset
    from memorization.training.goldfish import validate_goldfish_args
    from memorization.data.mixture import check_hash_width

    m, d, g, t, x, o = cfg.model, cfg.data, cfg.goldfish, cfg.training, cfg.extraction, cfg.output
    try:
        get_preset(m.size, m.family)  # an unknown size or family, named with the valid ones
        validate_goldfish_args(g.k, g.h, g.strategy, allow_zero=True, doc_start=g.doc_start)
    except ValueError as e:
        raise ConfigError(f"error: {e}") from None
    for flag, value, choices in (("--goldfish-strategy", g.strategy, ("hash", "minhash", "static")),
                                 ("--prefix-mode", x.prefix_mode, ("fixed", "all-but-suffix")),
                                 ("--perturb-kind", d.perturb_kind, ("substitute", "shuffle")),
                                 ("--grad-reduce-dtype", cfg.execution.grad_reduce_dtype, ("fp32", "bf16")),
                                 ("--export-dtype", o.export_dtype, ("float32", "bfloat16"))):
        if value not in choices:
            raise ConfigError(f"error: {flag} {value!r}: choose from {', '.join(choices)}")
    parse_arms(g.arms, g.k)
    if g.k and g.strategy in ("hash", "minhash"):
        try:
            check_hash_width(g.h)
        except ValueError as e:
            raise ConfigError(f"error: {e}") from None
    parse_exposures(d.exposures)
    config_grid(cfg)
    if m.init:
        from axonn.checkpoint import SafetensorsCheckpoint
        from memorization.training.models import model_config

        try:
            model_config(None, 0, init=m.init, family=m.family)  # a config.json of a family with a plan is there
            SafetensorsCheckpoint(m.init).close()  # and safetensors weights beside it
        except (OSError, ValueError) as e:
            raise ConfigError(f"error: {e}") from None
    if d.targets and not Path(d.targets).expanduser().exists():
        raise ConfigError(f"error: --targets {d.targets} does not exist")
    from memorization.data.corpus import DEFAULT_CORPUS, looks_local

    if d.corpus != DEFAULT_CORPUS and looks_local(d.corpus) and not Path(d.corpus).expanduser().exists():
        raise ConfigError(f"error: --corpus {d.corpus} does not exist")
    from memorization.data.token_store import STORE_FILE

    if d.store and not (Path(d.store).expanduser() / STORE_FILE).exists():
        what = f"holds no finished token store (no {STORE_FILE})" if Path(d.store).expanduser().exists() \
            else "does not exist"
        raise ConfigError(f"error: --store {d.store} {what}: prepare it with `python data/prepare.py --config "
                          f"<this run's config.yaml> --out {d.store}` (or run without --store)")
    if x.prefix < 1 or x.suffix < 1:
        raise ConfigError("error: --prefix and --suffix must be >= 1")
    for p, sfx in parse_lengths(x.lengths):  # a target too short for a pair is skipped and counted, not refused
        if (1 if p is None else p) + sfx > d.seq_len:
            raise ConfigError(f"error: --extract-lengths {p or 'all'}:{sfx} needs {(p or 1) + sfx} tokens, more than "
                              f"a training row holds (--seq-len {d.seq_len}): no target is that long")
    bad = [f"{flag} {value} (must be {need})" for flag, value, ok, need in (
        ("--samples", x.samples, x.samples >= 0, ">= 0; 0 = greedy only"),
        ("--temperature", x.temperature, 0 < x.temperature < math.inf, "finite, > 0"),
        ("--top-k", x.top_k, x.top_k >= 0, ">= 0; 0 = the whole vocabulary"),
        ("--track-every", x.track_every, x.track_every >= 0, ">= 0; 0 = no tracking"),
        ("--track-targets", x.track_targets, x.track_targets >= 0, ">= 0; 0 = every target"),
        ("--beam", x.beam, x.beam >= 0, ">= 0; 0 = no beam search"),
        ("--canaries", d.canaries, d.canaries >= 0, ">= 0; 0 = none"),
        ("--canary-digits", d.canary_digits, 1 <= d.canary_digits <= 12, "in 1..12"),
        ("--perturb-fraction", d.perturb_fraction, 0 <= d.perturb_fraction <= 1, "in [0, 1]")) if not ok]
    if bad:
        raise ConfigError(f"error: {'; '.join(bad)}")
    if d.canaries:
        from memorization.data.canary import parse_canary_exposures

        try:
            parse_canary_exposures(d.canary_exposures)
        except ValueError as e:
            raise ConfigError(f"error: {e}") from None
    _check_training_numbers(cfg)
    if o.resume and o.overwrite:
        raise ConfigError("error: --resume and --overwrite contradict each other")
    if cfg.execution.plan:  # prints a plan and exits: --out is never touched, so an existing run there is no conflict
        return
    _check_out(cfg)


def _check_training_numbers(cfg: ExperimentConfig) -> None:
    """Batch, micro-batch, steps and optimizer numbers that the trainer would refuse only after the data is built,
    and a from-scratch learning rate for a pretrained checkpoint."""
    t = cfg.training
    bad = [f"{flag} {value} (must be {need})" for flag, value, ok, need in (
        ("--batch-size", t.batch_size, t.batch_size >= 1, ">= 1"),
        ("--steps", t.steps, t.steps >= 0, ">= 0; 0 = as many as the corpus fills"),
        ("--lr", t.lr, 0 < t.lr < math.inf, "finite, > 0"),
        ("--warmup-steps", t.warmup_steps, t.warmup_steps is None or t.warmup_steps >= 0, ">= 0"),
        ("--weight-decay", t.weight_decay, 0 <= t.weight_decay < math.inf, "finite, >= 0"),
        ("--grad-clip", t.grad_clip, t.grad_clip > 0, "> 0; inf = no clipping"),
        ("--adamw-impl", t.adamw_impl, t.adamw_impl in ADAMW_IMPLS, " or ".join(ADAMW_IMPLS)),
        ("--eval-every", t.eval_every, t.eval_every >= 0, ">= 0; 0 = at the end only"),
        ("--checkpoint-every", t.checkpoint_every, t.checkpoint_every >= 0, ">= 0; 0 = at the end only"))
        if not ok]
    if bad:
        raise ConfigError(f"error: {'; '.join(bad)}")
    if cfg.model.init and t.lr > MAX_FINE_TUNE_LR and not t.allow_high_lr:
        raise ConfigError(f"error: --lr {t.lr:g} with --init: a learning rate above {MAX_FINE_TUNE_LR:g} is one for "
                          "training from scratch and would overwrite much of what the pretrained checkpoint knows "
                          "(the fine-tuning default is 2e-5); pass --allow-high-lr (training.allow_high_lr: true) "
                          "if you mean it")
    if cfg.execution.plan:  # the planner picks the micro-batch and grid itself
        return
    from memorization.training.runtime import rows_per_rank

    mixture_config(cfg)
    grid = config_grid(cfg)
    d, z = grid.data, grid.depth
    try:
        local = rows_per_rank(t.batch_size, d * z)
    except ValueError as e:
        raise ConfigError(f"error: {e} (--grid {cfg.execution.grid})") from None
    if t.micro_batch is not None and (t.micro_batch < 1 or local % t.micro_batch):
        raise ConfigError(f"error: --micro-batch {t.micro_batch} does not divide the {local} rows per step of "
                          f"each rank (--batch-size {t.batch_size} over data x depth = {d * z}): give a divisor "
                          f"of {local}")


def check_writable_dir(path: Path, flag: str) -> None:
    """Refuse (:class:`ConfigError`) a directory a run cannot create or write (:func:`axonn.cli.writable_dir_problem`)."""
    from axonn.cli import writable_dir_problem

    why = writable_dir_problem(path, flag)
    if why:
        raise ConfigError(f"error: {why}")


def _check_out(cfg: ExperimentConfig) -> None:
    """An existing run in --out: refused without --resume/--overwrite; with --resume, its settings must match
    (except how it executes)."""
    from memorization.training.run_lock import LOCK_FILE, RunLock

    o = cfg.output
    out = Path(o.out)
    check_writable_dir(out, "--out")
    RunLock(out, force=o.force_lock).check()  # another run writing there: refused before anything else
    cfg_file = out / "run_config.json"
    if out.exists() and any(f.name != LOCK_FILE for f in out.iterdir()):
        if o.overwrite:
            pass
        elif not o.resume:
            raise ConfigError(
                f"error: --out {out} already holds a run: pass --resume to continue it, --overwrite to replace it, "
                "or choose another --out"
            )
        elif cfg_file.exists():
            old = json.loads(cfg_file.read_text())
            new = json.loads(json.dumps(settings(cfg)))
            was = {**flat(ExperimentConfig()), **old}  # a setting added since the run was written: its default
            diff = {k: (was.get(k), new[k]) for k in new if was.get(k) != new[k] and k != "out"}
            changed = {k: diff.pop(k) for k in EXECUTION_SETTINGS if k in diff}
            if diff:
                raise ConfigError(f"error: --resume with settings that differ from the run in {out}: {diff} "
                                  f"(only how it runs may change: {as_flags(EXECUTION_SETTINGS)})")
            if changed:
                note(f"--resume with other execution settings (was, now): {changed}")
    elif o.resume:
        note(f"--resume: no run in {out} yet, starting a new one")
