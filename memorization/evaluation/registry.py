"""The evaluations of a trained model, by name: each name's config (a dataclass) and the one library function that
runs it.  Every caller goes through :func:`evaluate`: the sweep (:func:`memorization.launch.sweep.evaluate_arm`), the
evaluation jobs (:mod:`memorization.launch.eval_jobs`: each step runs ``python -m memorization.evaluation NAME --config
STEP.yaml``, :func:`main`) and the command-line shells of the repository's ``eval`` directory (their flags parsed
into the config's fields).

- ``extract``: :class:`memorization.evaluation.extraction_eval.ExtractionEvalConfig` ->
  :func:`memorization.evaluation.extraction_eval.run_extraction`;
- ``mia``: :class:`MiaConfig` -> :func:`memorization.evaluation.mia.run_mia`;
- ``downstream`` (held-out perplexity and/or lm-eval tasks): :class:`DownstreamConfig` ->
  :func:`memorization.evaluation.downstream.run_downstream`;
- ``hpc-code``: :class:`hpc_codegen.evaluate.HpcCodeConfig` ->
  :func:`hpc_codegen.evaluate.evaluate_hpc_code`.

A config's fields are its function's parameters, by name (:func:`memorization.evaluation.mia.run_mia`'s ``model_path``,
``manifest_path``, ``out_dir``, ...), so a setting has one name from the CLI flag to the function.  A config file
(:func:`dump_config`, :func:`load_config`) is a YAML mapping of those fields, taken as is.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memorization.evaluation.extraction_eval import ExtractionEvalConfig
from hpc_codegen.evaluate import HpcCodeConfig
from memorization.evaluation.lm_eval_bridge import DEFAULT_TASK_DIR

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MiaConfig:
    """Membership inference on a manifest's members and nonmembers (:func:`memorization.evaluation.mia.run_mia`)."""

    model_path: str | os.PathLike
    manifest_path: str | os.PathLike
    reference_model_path: str | os.PathLike | None = None
    out_dir: str | os.PathLike | None = None
    batch_size: int = 8
    device: str | None = None
    dtype: str | None = "auto"
    k: float = 0.2
    max_length: int | None = None
    add_bos: bool = True
    fpr_target: float = 0.01
    tokenizer_path: str | os.PathLike | None = None
    grid: str | None = None


@dataclass(frozen=True)
class DownstreamConfig:
    """Held-out perplexity and/or lm-eval tasks (:func:`memorization.evaluation.downstream.run_downstream`)."""

    model_path: str | os.PathLike
    perplexity_source: str | os.PathLike | None = None
    tasks: tuple[str, ...] | None = None
    include_path: Path | tuple[Path, ...] | None = DEFAULT_TASK_DIR
    include_defaults: bool | None = None
    limit: int | float | None = None
    num_fewshot: int | None = None
    out_dir: str | os.PathLike | None = None
    batch_size: int = 8
    device: str | None = None
    dtype: str | None = "auto"
    max_length: int | None = None
    stride: int | None = None
    text_key: str = "text"
    add_bos: bool = True
    tokenizer_path: str | os.PathLike | None = None
    grid: str | None = None


Note = Callable[[str], None]


def _fields(config: Any) -> dict[str, Any]:
    """A config's fields by name (not copied)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _extract(config: ExtractionEvalConfig, note: Note) -> dict | None:
    from memorization.evaluation.extraction_eval import run_extraction

    return run_extraction(config)


def _mia(config: MiaConfig, note: Note) -> dict:
    from memorization.evaluation.mia import run_mia

    return run_mia(**_fields(config))


def _downstream(config: DownstreamConfig, note: Note) -> dict:
    from memorization.evaluation.downstream import run_downstream

    kwargs = _fields(config)
    kwargs["tasks"] = list(config.tasks) if config.tasks is not None else None
    return run_downstream(**kwargs)


def _hpc_code(config: HpcCodeConfig, note: Note) -> dict | None:
    from hpc_codegen.evaluate import evaluate_hpc_code

    return evaluate_hpc_code(config, note=note)


def _extract_text(report: dict) -> str:
    from memorization.evaluation.extraction import markdown_table

    return markdown_table(report, title=f"Extraction: {report['model']}")


def _downstream_errors(report: dict) -> dict[str, str]:
    """The parts of a downstream report that failed: lm-eval tasks by name, and ``perplexity``."""
    errors = dict((report.get("lm_eval") or {}).get("errors") or {})
    if report.get("perplexity_error"):
        errors["perplexity"] = report["perplexity_error"]
    return errors


def downstream_status(report: dict) -> int:
    """0: every part ran; 1: some part failed and the rest ran; 2: nothing could run (docs/eval.md)."""
    if not _downstream_errors(report):
        return 0
    ran = "perplexity" in report or bool((report.get("lm_eval") or {}).get("results"))
    return 1 if ran else 2


def _markdown(report: dict) -> str:
    return report["markdown"]


@dataclass(frozen=True)
class Evaluation:
    """One evaluation: its ``name``, its ``config`` class and ``function(config, note) -> report`` (None on a grid's
    ranks other than 0 where the function reports on rank 0 alone; ``note`` takes its notes and warnings);
    ``text(report)``: the report for a reader (None: the function prints its own); ``status(report)``: the exit
    status of a finished run."""

    name: str
    config: type
    function: Callable[[Any, Note], dict | None]
    summary: str
    text: Callable[[dict], str] | None = None
    status: Callable[[dict], int] = lambda report: 0


EVALUATIONS: dict[str, Evaluation] = {e.name: e for e in (
    Evaluation("extract", ExtractionEvalConfig, _extract, "greedy (and sampled, beam, hint) extraction of documents",
               text=_extract_text),
    Evaluation("mia", MiaConfig, _mia, "membership inference: loss, zlib, Min-K%, Min-K%++ and reference scores",
               text=_markdown),
    Evaluation("downstream", DownstreamConfig, _downstream, "held-out perplexity and/or lm-evaluation-harness tasks",
               text=_markdown, status=downstream_status),
    Evaluation("hpc-code", HpcCodeConfig, _hpc_code, "pass@k, build@k and speedup@k of generated HPC code"),
)}


def evaluation(name: str) -> Evaluation:
    """The evaluation ``name``; ``ValueError`` naming the others for an unknown one."""
    if name not in EVALUATIONS:
        raise ValueError(f"unknown evaluation {name!r}: choose from {', '.join(EVALUATIONS)}")
    return EVALUATIONS[name]


def evaluate(name: str, config: Any, note: Note | None = None) -> dict | None:
    """Run the evaluation ``name`` with ``config`` (an instance of its config class); ``ValueError`` for an unknown
    name, ``TypeError`` for another evaluation's config.  ``note`` receives the notes and warnings of an evaluation
    that has them (default: warnings logged by this module)."""
    ev = evaluation(name)
    if not isinstance(config, ev.config):
        raise TypeError(f"evaluation {name!r} takes a {ev.config.__name__}, got a {type(config).__name__}")
    return ev.function(config, note or log.warning)


# --------------------------------------------------------------------------- config files


def config_to_mapping(config: Any) -> dict[str, Any]:
    """``config``'s fields as plain YAML values (paths as strings, tuples as lists): what :func:`load_config`
    reads back into the same config."""
    def plain(v: Any) -> Any:
        if isinstance(v, os.PathLike):
            return os.fspath(v)
        if isinstance(v, (tuple, list)):
            return [plain(x) for x in v]
        return v

    return {k: plain(v) for k, v in _fields(config).items()}


def _coerce(hint: Any, value: Any) -> Any:
    """A YAML value as the field's type ``hint`` wants it: a path for a ``Path``, a tuple (of its element type) for
    a tuple; other values as they are."""
    if value is None:
        return None
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        if option is Path and isinstance(value, str):
            return Path(value)
        if typing.get_origin(option) is tuple and isinstance(value, list):
            element = (typing.get_args(option) or (Any,))[0]
            return tuple(_coerce(element, x) for x in value)
    return value


def config_from_mapping(name: str, values: Mapping[str, Any]) -> Any:
    """The config of evaluation ``name`` with the fields ``values`` gives (the others at their defaults);
    ``ValueError`` naming an unknown field (and the closest one) or a required field left out."""
    import difflib

    ev = evaluation(name)
    fields = {f.name: f for f in dataclasses.fields(ev.config)}
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            raise ValueError(f"{name}: unknown setting {key!r}" + (f"; did you mean {close[0]}?" if close else
                                                                   f"; the settings are {', '.join(fields)}"))
    missing = [n for n, f in fields.items() if n not in values and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"{name}: give {', '.join(missing)}")
    hints = typing.get_type_hints(ev.config)
    return ev.config(**{k: _coerce(hints[k], v) for k, v in values.items()})


def dump_config(name: str, config: Any) -> str:
    """The YAML text of ``config`` for evaluation ``name``: the fields it sets, those that differ from the config
    class's defaults (the others are the defaults of whoever reads it); :func:`load_config` reads it back equal."""
    import yaml

    ev = evaluation(name)
    if not isinstance(config, ev.config):
        raise TypeError(f"evaluation {name!r} takes a {ev.config.__name__}")
    values = config_to_mapping(config)
    for f in dataclasses.fields(config):
        default = (f.default if f.default is not dataclasses.MISSING else
                   f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if default is not dataclasses.MISSING and getattr(config, f.name) == default:
            del values[f.name]
    return yaml.safe_dump(values, sort_keys=False)


def load_config(name: str, path: str | os.PathLike) -> Any:
    """The config of evaluation ``name`` in the YAML file ``path``; ``ValueError`` for a file that is not a
    mapping of the config's fields."""
    import yaml

    try:
        values = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(values, dict):
        raise ValueError(f"--config {path}: give a mapping of the {name} settings (field: value per line)")
    return config_from_mapping(name, values)


# --------------------------------------------------------------------------- command line


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """``python -m memorization.evaluation NAME --config FILE.yaml``: run one evaluation with the config in the
    file (its fields by name; :func:`dump_config` writes one), print its report on rank 0; exit status 2 for a
    refused setting or input, else the evaluation's own (downstream: 1 when some part failed)."""
    import argparse

    from axonn.cli import HelpFormatter, launched_rank

    names = "\n".join(f"  {e.name}: {e.summary} ({e.config.__name__})" for e in EVALUATIONS.values())
    ap = argparse.ArgumentParser(prog="python -m memorization.evaluation", formatter_class=HelpFormatter,
                                 description="Run one evaluation of a trained model with its config file.",
                                 epilog=f"evaluations:\n{names}")
    ap.add_argument("name", choices=list(EVALUATIONS), help="the evaluation")
    ap.add_argument("--config", required=True, metavar="FILE.yaml",
                    help="the evaluation's settings: a YAML mapping of its config's fields (e.g. model_path, "
                         "manifest_path, out_dir, grid for mia)")
    args = ap.parse_args(argv)
    from memorization.evaluation.eval_model import MissingTokenizerError
    from memorization.evaluation.lm_eval_bridge import LMEvalNotInstalledError

    try:
        config = load_config(args.name, args.config)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = evaluate(args.name, config, note=_stderr)
    except (MissingTokenizerError, LMEvalNotInstalledError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if report is None or launched_rank() != 0:  # rank 0 reports
        return 0
    ev = EVALUATIONS[args.name]
    if ev.text is not None:
        print(ev.text(report))
    return ev.status(report)

