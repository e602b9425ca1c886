"""Pre-flight: every check of an experiment that can be made before it starts, without loading weights or
allocating a device -- what a job generator runs on a login node before a job waits in the queue.

:func:`preflight` returns one :class:`Check` per aspect (config, init, tokenizer, corpus, grid), each ``ok``,
``failed`` (the reason and the fix) or ``not checked`` (it needs data this machine cannot see, e.g. an
``--init`` checkpoint only the compute nodes mount; the note says so).  It never raises for a bad config:
a refusal is a failed check.  The device's memory is not checked here (the job generator prices it for the
machine's GPUs; ``memorize.py`` checks the device it gets at start).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from memorization.experiment.config import MAX_FINE_TUNE_LR, ConfigError, ExperimentConfig, flat, resolve

OK, FAILED, NOT_CHECKED = "ok", "failed", "not checked"
#: the placeholder a job generator or sweep replaces with each job's model size (in ``--init``)
SIZE_PLACEHOLDER = "{size}"


@dataclass(frozen=True)
class Check:
    """One pre-flight check: ``name`` (what was checked), ``status`` (:data:`OK`, :data:`FAILED` or
    :data:`NOT_CHECKED`) and ``detail`` (what was found; for a failure the reason and the fix)."""

    name: str
    status: str
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def line(self) -> str:
        """``[ok] corpus: ...`` -- one line of a report."""
        return f"[{self.status}] {self.name}: {self.detail}"


def _message(e: BaseException) -> str:
    text = str(e.code if isinstance(e, SystemExit) else e)
    return text[len("error: "):] if text.startswith("error: ") else text


def init_visible(cfg: ExperimentConfig) -> bool:
    """Whether this machine sees ``cfg``'s ``--init`` checkpoint (True without one)."""
    return cfg.model.init is None or Path(cfg.model.init).expanduser().exists()


def preflight(cfg: ExperimentConfig, shape=None) -> list[Check]:
    """Check the run ``cfg`` (resolved here) as far as this machine can: the config (every refusal of
    :func:`~memorization.experiment.validate.validate`, with its grid), no ``{size}`` left in a path, the
    ``--init`` checkpoint, the tokenizer (it fits the checkpoint's vocabulary), the corpus (it fills the
    steps with the targets: without ``--store`` the run's token store is prepared into the cache, where the
    run finds it, so the 'corpus too small' refusal comes now) and the grid (it divides ``shape``, default the
    run's model: :func:`~memorization.experiment.grid_advice.run_shape`).

    Checks after a failed one that they depend on are reported as not checked.  Loads the tokenizer and
    tokenizes the corpus (once: the cache keeps it); never model weights.
    """
    from memorization.experiment.validate import validate

    cfg = resolve(cfg)
    checks: list[Check] = []
    left = [f"--{k.replace('_', '-')} {v}" for k, v in flat(cfg).items()
            if isinstance(v, str) and SIZE_PLACEHOLDER in v]
    if left:
        checks.append(Check("config", FAILED, f"{', '.join(left)}: {SIZE_PLACEHOLDER} has no size to fill here "
                            "(only a job generator or sweep maps it, in --init, to each job's size): give the "
                            "path itself"))
        return checks
    visible = init_visible(cfg)
    out = Path(cfg.output.out)
    checked = cfg
    if cfg.output.resume and not (out.exists() and any(out.iterdir())):
        checked = replace(cfg, output=replace(cfg.output, resume=False))  # nothing to resume yet: no note
    if not visible:  # validated without it; its fine-tuning lr limit still holds
        checked = replace(checked, model=replace(checked.model, init=None))
    try:
        validate(checked)
        t = cfg.training
        if not visible and t.lr > MAX_FINE_TUNE_LR and not t.allow_high_lr:
            raise ConfigError(f"error: --lr {t.lr:g} with --init is above {MAX_FINE_TUNE_LR:g}: pass "
                              "--allow-high-lr if you mean it")
    except SystemExit as e:
        checks.append(Check("config", FAILED, _message(e)))
        return checks
    checks.append(Check("config", OK, "every setting is valid" + (f"; --resume compares with the run in {out}"
                                                                  if checked.output.resume else "")))
    init = cfg.model.init
    if init and not visible:
        checks.append(Check("init", NOT_CHECKED, f"--init {init} is not visible here: its shape and vocabulary "
                            "are checked when the job starts (check on a node that mounts it)"))
    elif init:
        from axonn.presets import ModelShape
        from memorization.training.models import model_config

        got = ModelShape.from_hf_config(model_config(None, 0, init=init))
        checks.append(Check("init", OK, f"--init {init}: a {got.family} model of {got.layers} layers, hidden "
                            f"{got.hidden}, {got.vocab:,}-row vocabulary"))
    tokenizer = None
    from memorization.data.corpus import DEFAULT_TOKENIZER

    if init and not visible and cfg.data.tokenizer == DEFAULT_TOKENIZER:
        checks.append(Check("tokenizer", NOT_CHECKED, f"the run uses --init {init}'s own tokenizer, not visible "
                            "here"))
    else:
        from memorization.experiment.data import load_run_tokenizer

        try:
            tokenizer = load_run_tokenizer(cfg)
        except SystemExit as e:
            checks.append(Check("tokenizer", FAILED, _message(e)))
        else:
            fits = f", fits --init {init}'s vocabulary" if init and visible else ""
            checks.append(Check("tokenizer", OK, f"{len(tokenizer):,} tokens{fits}"))
    checks.append(_check_corpus(cfg, tokenizer))
    checks.append(_check_grid(cfg, tokenizer, shape, visible))
    return checks


def _check_corpus(cfg: ExperimentConfig, tokenizer) -> Check:
    if tokenizer is None:
        return Check("corpus", NOT_CHECKED, "needs the tokenizer (above) to count the corpus's tokens")
    from memorization.experiment.data import open_run_store, read_targets, targets_text_field

    d, t = cfg.data, cfg.training
    if d.store:  # the prepared store the job will memory-map: of this corpus, tokenizer, targets and settings
        try:
            targets = read_targets(d.targets, targets_text_field(cfg)) if d.targets else None
            mixture = open_run_store(cfg, tokenizer, targets)
        except (SystemExit, ValueError, OSError) as e:
            return Check("corpus", FAILED, _message(e))
        return Check("corpus", OK, f"--store {d.store} holds {mixture.num_steps} steps of {t.batch_size} rows x "
                     f"{d.seq_len} tokens of --corpus {d.corpus} with {len(mixture.targets)} targets (exposures "
                     f"{d.exposures})")
    try:  # the store the run will read from the cache, prepared now if it is not there: the run reuses it
        from memorization.experiment.data import ensure_run_store
        from memorization.data.token_store import open_store

        targets = read_targets(d.targets, targets_text_field(cfg)) if d.targets else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run itself says it (non-members of another distribution)
            path, _ = ensure_run_store(cfg, tokenizer, targets)
        mixture = open_store(path)
    except (SystemExit, ValueError, OSError) as e:
        return Check("corpus", FAILED, f"--corpus {d.corpus}: {_message(e)}")
    return Check("corpus", OK, f"--corpus {d.corpus} fills {mixture.num_steps} steps of {t.batch_size} rows x "
                 f"{d.seq_len} tokens with {len(mixture.targets)} targets (exposures {d.exposures}); its token "
                 f"store is in the cache, {path}")


def _check_grid(cfg: ExperimentConfig, tokenizer, shape, visible: bool) -> Check:
    from memorization.experiment.validate import check_grid_divides

    grid = cfg.execution.grid
    if shape is None:
        if not visible or (tokenizer is None and not cfg.model.init):
            return Check("grid", NOT_CHECKED, f"--grid {grid}: needs the model's shape (the --init checkpoint "
                         "or the tokenizer)")
        from memorization.experiment.grid_advice import run_shape

        shape = run_shape(cfg, tokenizer)
    try:
        check_grid_divides(cfg, shape)
    except ConfigError as e:
        return Check("grid", FAILED, _message(e))
    return Check("grid", OK, f"--grid {grid} divides {shape.name} and the batch")
