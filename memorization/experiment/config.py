"""The experiment's configuration: one dataclass tree, loaded from YAML or a dict, resolved and written back.

Every field is also a flag of ``recipes/memorize.py`` (its ``flag`` metadata); a field's *flat name* is
that flag's argparse destination (``--goldfish-k`` -> ``goldfish_k``), the key it has in a run's
``run_config.json`` and ``results.json`` ``settings``.  A YAML file holds the sections below, each a
mapping of its fields (only the fields to change):

    model: {size: mini}
    training: {steps: 900, lr: 1.0e-3}
    goldfish: {k: 4, h: 13}

Fields left ``None`` are *resolved* by :func:`resolve` (:func:`load_config` and the CLI resolve for you):
the row length, batch and activation checkpointing from ``execution.plan``, and the optimizer numbers from
``model.init``:

* training from scratch (no ``init``): peak lr 3e-3, 10 warmup steps, weight decay 0 -- the numbers the
  default experiment was measured with (README);
* fine-tuning a pretrained checkpoint (``init``): peak lr 2e-5, warmup over 3% of the steps, weight
  decay 0.1, with the trainer's cosine decay to 10% of the peak.  These are common Llama fine-tuning
  practice: Llama 2's supervised fine-tuning used a cosine schedule from 2e-5 with weight decay 0.1
  (Touvron et al., 2023, arXiv:2307.09288, section 3.1; 0.1 is also its pretraining weight decay),
  and Stanford Alpaca's recipe fine-tunes LLaMA at 2e-5, cosine, warmup ratio 0.03.  A learning rate
  above :data:`MAX_FINE_TUNE_LR` with ``init`` is refused by validation unless
  ``training.allow_high_lr`` is set: a rate for training from scratch would wreck the pretrained weights.
"""
from __future__ import annotations

import difflib
import math
import types
import typing
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from axonn.cli import SameOnEveryRank

#: From-scratch optimizer defaults (the default experiment's).
SCRATCH_LR, SCRATCH_WARMUP_STEPS, SCRATCH_WEIGHT_DECAY = 3e-3, 10, 0.0
#: Fine-tuning defaults with ``model.init`` (sources in the module docstring).
FINE_TUNE_LR, FINE_TUNE_WARMUP_FRACTION, FINE_TUNE_WEIGHT_DECAY = 2e-5, 0.03, 0.1
#: A peak learning rate above this with ``model.init`` needs ``training.allow_high_lr``: 50x the
#: fine-tuning default, a third of the from-scratch one.
MAX_FINE_TUNE_LR = 1e-3
#: Training.adamw_impl: torch AdamW kernels (memorization.training.train.ADAMW_IMPLS maps them to its switches).
ADAMW_IMPLS = ("fused", "foreach", "for-loop")


#: the arms a run can train, in the order it trains them: the standard loss, the Goldfish loss, and the
#: equal-supervised-tokens control (the standard loss on as many labels per row as Goldfish keeps, the dropped
#: ones drawn afresh in every row: :func:`memorization.training.goldfish.matched_random_mask`)
ARMS: tuple[str, ...] = ("standard", "goldfish", "equal-tokens")
#: ``--arms`` shorthands
ARM_SETS: dict[str, tuple[str, ...]] = {"both": ("standard", "goldfish"), "all": ARMS}


def parse_arms(spec: str, goldfish_k: int) -> list[str]:
    """The arms ``--arms spec`` trains, in :data:`ARMS` order: a shorthand of :data:`ARM_SETS` or a comma list of
    arm names; without the arms that need a Goldfish mask when ``goldfish_k`` is 0 (an arm named explicitly
    that needs one is refused).  A :class:`ConfigError` names what is wrong."""
    names = ARM_SETS.get(spec) or tuple(a.strip() for a in str(spec).split(","))
    bad = [a for a in names if a not in ARMS]
    if bad or not names:
        raise ConfigError(f"error: --arms {spec!r}: {'unknown arm ' + ', '.join(map(repr, bad)) if bad else 'empty'};"
                          f" give {', '.join(ARM_SETS)} or a comma list of {', '.join(ARMS)}")
    masked = [a for a in names if a != "standard"]
    if goldfish_k == 0 and masked and spec not in ARM_SETS:
        raise ConfigError(f"error: --arms {spec}: the {' and '.join(masked)} arm(s) need --goldfish-k >= 2")
    return [a for a in ARMS if a in names and (goldfish_k or a == "standard")]


class ConfigError(SameOnEveryRank):
    """A configuration refused before any work: its ``code`` is the message (``error: ...``), so a CLI that
    lets it propagate prints it and exits with status 1 (from rank 0 only, under ``axonn.cli.run_main``)."""


def _opt(flag: str, default: Any = None, *, aliases: tuple[str, ...] = ()) -> Any:
    return field(default=default, metadata={"flag": flag, "aliases": aliases})


@dataclass(frozen=True)
class Model:
    """The model trained: a ``size`` preset (axonn/presets.yaml) from seeded random weights, built as ``family``
    (a HF model_type with a parallel plan, axonn/plans.py; None: the preset's own, Llama for the CPU sizes), or
    the local Hugging Face checkpoint ``init`` of any such family to fine-tune (its config then overrides
    ``size`` and says the family)."""

    size: str = _opt("--size", "tiny")
    init: str | None = _opt("--init", aliases=("checkpoint", "pretrained"))
    family: str | None = _opt("--family", aliases=("model_type", "architecture"))


@dataclass(frozen=True)
class Data:
    """The mixture: background ``corpus``, the targets (``targets`` or ``num_targets`` held out of the
    corpus), each seen ``exposures`` times (a comma list splits them into groups) at steps chosen by
    ``placement`` (memorization.data.mixture.PLACEMENTS), rows of ``seq_len``; ``canaries`` random secrets of
    ``canary_digits`` digits in carrier sentences, written into background rows ``canary_exposures`` times
    (a comma list, the canaries dealt round-robin over it; memorization.data.canary); with ``perturb_fraction`` > 0
    every copy of a target is a near-duplicate, that fraction of it perturbed by ``perturb_kind``
    (memorization.data.perturb)."""

    corpus: str = _opt("--corpus", "builtin:pydocs")
    text_field: str = _opt("--text-field", "text")
    tokenizer: str = _opt("--tokenizer", "builtin:bpe4096")
    targets: str | None = _opt("--targets")
    targets_text_field: str | None = _opt("--targets-text-field")
    num_targets: int = _opt("--num-targets", 32)
    num_nonmembers: int = _opt("--num-nonmembers", 32)
    exposures: str = _opt("--exposures", "64")
    skip_short_targets: bool = _opt("--skip-short-targets", False)
    skip_overlapping_targets: bool = _opt("--skip-overlapping-targets", False)
    seq_len: int | None = _opt("--seq-len", aliases=("sequence_length", "seq"))
    store: str | None = _opt("--store", aliases=("token_store",))
    placement: str = _opt("--placement", "random")
    canaries: int = _opt("--canaries", 0)
    canary_exposures: str = _opt("--canary-exposures", "0,1,4,16,64")
    canary_digits: int = _opt("--canary-digits", 4)
    perturb_fraction: float = _opt("--perturb-fraction", 0.0)
    perturb_kind: str = _opt("--perturb-kind", "substitute")


@dataclass(frozen=True)
class Goldfish:
    """The Goldfish arm's loss: drop 1/``k`` of the labels, decided by a hash of the ``h`` tokens before each
    (``strategy`` hash) or every k-th position (static); a document's first ``h`` labels as ``doc_start`` says
    (memorization.training.goldfish.DOC_STARTS); ``k`` 0 trains the standard arm only.  ``arms``: which of :data:`ARMS`
    (:func:`parse_arms`)."""

    k: int = _opt("--goldfish-k", 4)
    h: int = _opt("--goldfish-h", 13)
    strategy: str = _opt("--goldfish-strategy", "hash")
    doc_start: str = _opt("--goldfish-doc-start", "keep")
    arms: str = _opt("--arms", "both")


@dataclass(frozen=True)
class Training:
    """The optimizer and its schedule (AdamW, linear warmup then cosine decay to 10% of ``lr``).  ``lr``,
    ``warmup_steps`` and ``weight_decay`` left ``None`` resolve to the from-scratch or the fine-tuning
    defaults (module docstring); ``warmup_steps`` stays ``None`` when fine-tuning with ``steps`` 0 and is
    then 3% of the steps the corpus fills."""

    batch_size: int | None = _opt("--batch-size", aliases=("global_batch",))
    micro_batch: int | None = _opt("--micro-batch")
    steps: int = _opt("--steps", 1000)
    lr: float | None = _opt("--lr", aliases=("learning_rate", "peak_lr"))
    warmup_steps: int | None = _opt("--warmup-steps", aliases=("warmup",))
    weight_decay: float | None = _opt("--weight-decay")
    allow_high_lr: bool = _opt("--allow-high-lr", False)
    grad_clip: float = _opt("--grad-clip", 1.0)
    adamw_impl: str = _opt("--adamw-impl", "fused")
    eval_every: int = _opt("--eval-every", 0)
    checkpoint_every: int = _opt("--checkpoint-every", 50)
    async_checkpoint: bool = _opt("--async-checkpoint", False)
    compile: bool = _opt("--compile", False)
    activation_checkpointing: bool | None = _opt("--activation-checkpointing")
    seed: int = _opt("--seed", 0)


@dataclass(frozen=True)
class Execution:
    """How the run executes: the 4D ``grid`` (data,row,column,depth), collective overlap and the dtype
    gradients are reduced in; ``plan`` prints the planner's grids for ``gpus`` on ``machine`` instead."""

    overlap: bool = _opt("--overlap", True)
    grad_reduce_dtype: str = _opt("--grad-reduce-dtype", "fp32")
    grid: str = _opt("--grid", "1,1,1,1")
    plan: bool = _opt("--plan", False)
    gpus: int | None = _opt("--gpus")
    machine: str = _opt("--machine", "h100-node")


@dataclass(frozen=True)
class Extraction:
    """Extraction after training: the model is given ``prefix`` tokens (or all but the suffix) and must
    reproduce the next ``suffix`` greedily; ``batch`` documents are decoded together.  Besides: ``samples``
    sampled continuations per target (``temperature``, ``top_k``); more prefix:suffix pairs (``lengths``,
    :func:`parse_lengths`); and every ``track_every`` training steps extraction and loss of ``track_targets``
    targets (memorization.training.tracking; 0: all).  Adaptive attacks: a ``beam`` search of that width and ``hints``
    counting (memorization.evaluation.adaptive); ``mia``: membership inference scores of the targets
    (memorization.evaluation.mia)."""

    prefix: int = _opt("--prefix", 50)
    suffix: int = _opt("--suffix", 50)
    prefix_mode: str = _opt("--prefix-mode", "fixed")
    batch: int = _opt("--extract-batch", 32)
    lengths: str = _opt("--extract-lengths", "")
    samples: int = _opt("--samples", 0)
    temperature: float = _opt("--temperature", 1.0)
    top_k: int = _opt("--top-k", 40)
    track_every: int = _opt("--track-every", 0)
    track_targets: int = _opt("--track-targets", 0)
    beam: int = _opt("--beam", 0)
    hints: bool = _opt("--hints", False)
    mia: bool = _opt("--mia", False)


@dataclass(frozen=True)
class Output:
    """Where the run goes (``out``), whether it continues (``resume``) or replaces (``overwrite``) a run
    there, logging and the exported models' dtype."""

    out: str = _opt("--out", "runs/memorize", aliases=("output_dir", "dir"))
    resume: bool = _opt("--resume", False)
    overwrite: bool = _opt("--overwrite", False)
    wandb: bool = _opt("--wandb", False)
    export_dtype: str = _opt("--export-dtype", "float32")
    no_progress: bool = _opt("--no-progress", False)
    force_lock: bool = _opt("--force-lock", False)


@dataclass(frozen=True)
class ExperimentConfig:
    """One memorization experiment: a mixture, a standard and a Goldfish arm trained on it, extraction."""

    model: Model = field(default_factory=Model)
    data: Data = field(default_factory=Data)
    goldfish: Goldfish = field(default_factory=Goldfish)
    training: Training = field(default_factory=Training)
    execution: Execution = field(default_factory=Execution)
    extraction: Extraction = field(default_factory=Extraction)
    output: Output = field(default_factory=Output)


SECTIONS: tuple[str, ...] = tuple(f.name for f in fields(ExperimentConfig))


def parse_lengths(spec: str) -> list[tuple[int | None, int]]:
    """``--extract-lengths`` as ``(prefix, suffix)`` pairs: ``"32:32,all:50"`` -> ``[(32, 32), (None, 50)]``
    (``all``/None: all but the suffix); ``""`` -> ``[]``.  A :class:`ConfigError` says what is wrong."""
    pairs: list[tuple[int | None, int]] = []
    for item in filter(None, (x.strip() for x in str(spec).split(","))):
        p, sep, sfx = item.partition(":")
        try:
            pair = (None if p == "all" else int(p), int(sfx))
        except ValueError:
            pair = None
        if not sep or pair is None or pair[1] < 1 or (pair[0] is not None and pair[0] < 1):
            raise ConfigError(f"error: --extract-lengths {spec!r}: {item!r} is not PREFIX:SUFFIX (tokens >= 1, the "
                              "prefix may be 'all': all but the suffix), e.g. 32:32,100:50,all:50")
        pairs.append(pair)
    return pairs


def flag_of(section: str, name: str) -> str:
    """The memorize flag of field ``section.name`` (``training``, ``lr`` -> ``--lr``)."""
    return _field(section, name).metadata["flag"]


def flat_name(flag: str) -> str:
    """A flag's argparse destination, the field's key in ``run_config.json``: ``--goldfish-k`` -> ``goldfish_k``."""
    return flag.lstrip("-").replace("-", "_")


def _section_type(section: str) -> type:
    return typing.get_type_hints(ExperimentConfig)[section]


def _field(section: str, name: str):
    return next(f for f in fields(_section_type(section)) if f.name == name)


#: flat name -> (section, field), in flag order
FLAT_KEYS: dict[str, tuple[str, str]] = {
    flat_name(f.metadata["flag"]): (s, f.name) for s in SECTIONS for f in fields(_section_type(s))}


def with_flat(cfg: ExperimentConfig, values: dict[str, Any]) -> ExperimentConfig:
    """``cfg`` with the fields named by their flat names (``{"goldfish_k": 8}``) replaced."""
    by_section: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, name = FLAT_KEYS[key]
        by_section.setdefault(section, {})[name] = value
    return replace(cfg, **{s: replace(getattr(cfg, s), **v) for s, v in by_section.items()})


def flat(cfg: ExperimentConfig) -> dict[str, Any]:
    """Every field by its flat name (the flags' destinations), in flag order."""
    return {key: getattr(getattr(cfg, s), n) for key, (s, n) in FLAT_KEYS.items()}


#: fields that say how a run is driven or reported, not what it computes: left out of :func:`settings`
NOT_SETTINGS = ("resume", "overwrite", "no_progress", "plan", "gpus", "machine", "wandb", "export_dtype",
                "allow_high_lr", "force_lock")


def settings(cfg: ExperimentConfig) -> dict[str, Any]:
    """What a run computes and how it executes, by flat name: ``run_config.json``, which ``--resume``
    compares against, and ``results.json``'s ``settings``."""
    return {k: v for k, v in flat(cfg).items() if k not in NOT_SETTINGS}


# --------------------------------------------------------------------------- resolving defaults


def fine_tune_warmup(steps: int) -> int:
    """Warmup steps of a fine-tuning run of ``steps`` optimizer steps: 3% of them, at least 1."""
    return max(1, math.ceil(FINE_TUNE_WARMUP_FRACTION * steps))


def resolve(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with its ``None`` defaults filled (module docstring); resolving twice changes nothing."""
    plan, t = cfg.execution.plan, cfg.training
    fine_tune = cfg.model.init is not None
    data = replace(cfg.data, seq_len=(2048 if plan else 128) if cfg.data.seq_len is None else cfg.data.seq_len)
    warmup = t.warmup_steps
    if warmup is None:
        warmup = (fine_tune_warmup(t.steps) if t.steps > 0 else None) if fine_tune else SCRATCH_WARMUP_STEPS
    training = replace(
        t,
        batch_size=(1024 if plan else 4) if t.batch_size is None else t.batch_size,
        activation_checkpointing=plan if t.activation_checkpointing is None else t.activation_checkpointing,
        lr=(FINE_TUNE_LR if fine_tune else SCRATCH_LR) if t.lr is None else t.lr,
        warmup_steps=warmup,
        weight_decay=(FINE_TUNE_WEIGHT_DECAY if fine_tune else SCRATCH_WEIGHT_DECAY)
        if t.weight_decay is None else t.weight_decay)
    return replace(cfg, data=data, training=training)


# --------------------------------------------------------------------------- YAML and dicts


def _candidates() -> dict[str, str]:
    """Spellings a mistyped key is compared with (dotted key, flat name, aliases) -> the dotted key."""
    out: dict[str, str] = {}
    for s in SECTIONS:
        for f in fields(_section_type(s)):
            key = f"{s}.{f.name}"
            for spelling in (f.name, flat_name(f.metadata["flag"]), *f.metadata["aliases"]):
                out.setdefault(f"{s}.{spelling}", key)
    return out


def _unknown(key: str, source: str) -> ConfigError:
    cands = _candidates()
    if "." not in key:
        close = difflib.get_close_matches(key, SECTIONS, n=1, cutoff=0.0)
    else:
        close = [cands[c] for c in difflib.get_close_matches(key, list(cands), n=1, cutoff=0.0)]
    hint = f"; did you mean {close[0]}?" if close else ""
    return ConfigError(f"error: unknown key {key} in {source}{hint}")


def _check_type(key: str, value: Any, hint: Any, source: str) -> Any:
    """``value`` as field ``key``'s type (int for float, lists for the comma fields), or a ConfigError."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in args:
            return None
    elif key in ("data.exposures", "execution.grid") and isinstance(value, (int, list)):
        items = value if isinstance(value, list) else [value]
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return ",".join(str(x) for x in items)
    else:
        for t in args:
            if t is bool and isinstance(value, bool):
                return value
            if t is int and isinstance(value, int) and not isinstance(value, bool):
                return value
            if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            if t is str and isinstance(value, str):
                return value
    want = " or ".join("null" if t is type(None) else t.__name__ for t in args)
    raise ConfigError(f"error: {key} in {source}: {value!r} is not a {want}")


def config_from_dict(data: dict, source: str = "the config", base: ExperimentConfig | None = None
                     ) -> ExperimentConfig:
    """``base`` (default: all defaults) with the fields ``data`` gives ({section: {field: value}}); an unknown
    section or field, or a value of the wrong type, is a :class:`ConfigError` naming the closest valid key.
    Not resolved (:func:`resolve`)."""
    cfg = base or ExperimentConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"error: {source}: expected a mapping of sections ({', '.join(SECTIONS)}), got "
                          f"{type(data).__name__}")
    changes: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise _unknown(str(section), source)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"error: {section} in {source}: expected a mapping of its fields, got {values!r}")
        hints = typing.get_type_hints(_section_type(section))
        for name, value in values.items():
            key = f"{section}.{name}"
            if name not in hints:
                raise _unknown(key, source)
            changes.setdefault(section, {})[name] = _check_type(key, value, hints[name], source)
    return replace(cfg, **{s: replace(getattr(cfg, s), **v) for s, v in changes.items()})


def load_config(path: str | Path, base: ExperimentConfig | None = None) -> ExperimentConfig:
    """The config a YAML file gives (on top of ``base``), not resolved; errors are :class:`ConfigError`."""
    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"error: --config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"error: --config {path}: not valid YAML: {e}") from None
    return config_from_dict(data or {}, source=str(path), base=base)


def to_dict(cfg: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """``{section: {field: value}}`` of every field (what :func:`config_from_dict` reads back)."""
    return {s: {f.name: getattr(getattr(cfg, s), f.name) for f in fields(_section_type(s))} for s in SECTIONS}


def dump_config(cfg: ExperimentConfig) -> str:
    """``cfg`` as YAML that :func:`load_config` reads back to the same config."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)

