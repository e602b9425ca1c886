"""The one place where an experiment's sections become its components' configs: the mixture's
(:class:`~memorization.data.mixture.MixtureConfig`), each arm's trainer's
(:class:`~memorization.training.train.TrainConfig`) and Goldfish setting
(:class:`~memorization.training.goldfish.GoldfishConfig`), and the extraction's
(:class:`~memorization.evaluation.extraction.ExtractionConfig`).  Each component keeps its own config (its defaults
serve callers without an experiment); a run builds them here, from its resolved :class:`ExperimentConfig` only."""
from __future__ import annotations

from memorization.experiment.config import ConfigError, ExperimentConfig, fine_tune_warmup


def parse_exposures(s: str) -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``; a ConfigError for anything else or a negative count."""
    try:
        vals = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise ConfigError(f"--exposures {s!r}: give an integer or a comma list of integers") from None
    if any(v < 0 for v in vals):
        raise ConfigError(f"--exposures {s!r}: counts must be >= 0")
    return vals


def mixture_config(cfg: ExperimentConfig):
    """The run's :class:`MixtureConfig`; its checks (e.g. prefix + suffix vs --seq-len) as a ConfigError."""
    from memorization.data.mixture import MixtureConfig

    d, x = cfg.data, cfg.extraction
    need = x.suffix + (1 if x.prefix_mode == "all-but-suffix" else x.prefix)
    try:
        return MixtureConfig(seq_len=d.seq_len, batch_size=cfg.training.batch_size,
                             exposures=parse_exposures(d.exposures), num_targets=d.num_targets,
                             num_nonmembers=d.num_nonmembers, num_steps=cfg.training.steps or None,
                             min_target_tokens=need, skip_short_targets=d.skip_short_targets,
                             skip_overlapping_targets=d.skip_overlapping_targets, seed=cfg.training.seed,
                             placement=d.placement)
    except ValueError as e:
        raise ConfigError(f"error: {e}") from None


def warmup_steps(cfg: ExperimentConfig, num_steps: int) -> int:
    """The run's warmup: ``training.warmup_steps``, or (fine-tuning with ``steps`` 0) 3% of the ``num_steps``
    the corpus filled."""
    w = cfg.training.warmup_steps
    return fine_tune_warmup(num_steps) if w is None else w


def arm_goldfish(arm: str, cfg: ExperimentConfig):
    """The :class:`~memorization.training.goldfish.GoldfishConfig` an arm trains with: none for the standard arm, the
    run's for the Goldfish arm, and the run's, randomized, for the equal-supervised-tokens control."""
    from memorization.training.goldfish import GoldfishConfig

    g = cfg.goldfish
    if arm == "standard":
        return GoldfishConfig(k=0)
    return GoldfishConfig(k=g.k, h=g.h, strategy=g.strategy, seed=0, doc_start=g.doc_start,
                          randomize=arm == "equal-tokens")


def train_config(arm: str, cfg: ExperimentConfig, num_steps: int):
    """The :class:`~memorization.training.train.TrainConfig` of ``arm``: the run's training section, its overlap and
    gradient dtype, its tracking interval and progress setting, the arm's Goldfish setting
    (:func:`arm_goldfish`) and its warmup for the ``num_steps`` the corpus filled (:func:`warmup_steps`)."""
    from memorization.training.train import TrainConfig

    t = cfg.training
    return TrainConfig(batch_size=t.batch_size, micro_batch=t.micro_batch, steps=t.steps or None, lr=t.lr,
                       warmup_steps=warmup_steps(cfg, num_steps), weight_decay=t.weight_decay,
                       grad_clip=t.grad_clip, adamw_impl=t.adamw_impl, eval_every=t.eval_every,
                       track_every=cfg.extraction.track_every,
                       checkpoint_every=t.checkpoint_every, compile=t.compile, async_checkpoint=t.async_checkpoint,
                       activation_checkpointing=t.activation_checkpointing, overlap=cfg.execution.overlap,
                       grad_reduce_dtype=cfg.execution.grad_reduce_dtype, seed=t.seed, wandb=cfg.output.wandb,
                       progress=not cfg.output.no_progress, goldfish=arm_goldfish(arm, cfg))


def extraction_config(cfg: ExperimentConfig):
    """The :class:`~memorization.evaluation.extraction.ExtractionConfig` of the run's extraction (``--prefix``,
    ``--suffix``, ``--prefix-mode``, ``--extract-batch``, ``--samples``, ``--temperature``, ``--top-k``; seeded by
    ``--seed``)."""
    from memorization.evaluation.extraction import ExtractionConfig

    x = cfg.extraction
    return ExtractionConfig(prefix_len=x.prefix, suffix_len=x.suffix, all_but_suffix=x.prefix_mode == "all-but-suffix",
                            batch_size=x.batch, samples=x.samples, temperature=x.temperature, top_k=x.top_k,
                            seed=cfg.training.seed, beam=x.beam, hints=x.hints)


def length_config(cfg: ExperimentConfig, prefix: int | None, suffix: int):
    """The greedy extraction of one more ``--extract-lengths`` pair (``prefix`` None: all but the suffix); targets
    too short for it are skipped and counted."""
    from memorization.evaluation.extraction import ExtractionConfig

    return ExtractionConfig(prefix_len=prefix or 1, suffix_len=suffix, all_but_suffix=prefix is None,
                            batch_size=cfg.extraction.batch, skip_short=True)
