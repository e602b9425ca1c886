"""Loading a Hugging Face model for evaluation, and what every evaluation asks of it: its device, context,
vocabulary and dtype.  Shared by membership inference, downstream evaluation, extraction and the sweep."""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

#: Default cap on the context length used when the model config allows far more than any
#: training sequence in this project (Llama 3.1 declares 131072 positions).
DEFAULT_MAX_LENGTH_CAP = 4096

Docs = Sequence[Sequence[int]] | Sequence[torch.Tensor] | torch.Tensor


class MissingTokenizerError(FileNotFoundError):
    """A checkpoint directory has no tokenizer files and no tokenizer was given."""


def load_tokenizer(path: str | os.PathLike) -> Any:
    """Load the tokenizer saved next to a checkpoint, failing clearly if there is none.

    Raises :class:`MissingTokenizerError` naming the directory and the fix, instead of the
    opaque error (or a hub look-up) that ``AutoTokenizer`` would produce.
    """
    from transformers import AutoTokenizer

    from memorization.data.corpus import TOKENIZER_FILES, has_tokenizer_files

    p = Path(path)
    if p.is_dir() and not has_tokenizer_files(p):
        raise MissingTokenizerError(
            f"checkpoint {str(p)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)} "
            "found). Save it next to the weights with tokenizer.save_pretrained(<checkpoint>), "
            "or pass --tokenizer PATH pointing to a directory that has one."
        )
    try:
        tok = AutoTokenizer.from_pretrained(str(p), trust_remote_code=False)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise MissingTokenizerError(
            f"could not load a tokenizer from {str(p)!r}: {err}. Pass --tokenizer PATH to a "
            "directory saved with tokenizer.save_pretrained()."
        ) from err
    return tok


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None


def default_device() -> str:
    """``cuda`` when available, else ``cpu``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _tokenizer_of(model_dir: Path, tokenizer_path: str | os.PathLike | None, required: bool) -> Any:
    """The tokenizer of ``tokenizer_path`` or else of ``model_dir``; without one, :class:`MissingTokenizerError`
    if ``required``, else None (with a warning: token ids only)."""
    try:
        return load_tokenizer(tokenizer_path or model_dir)
    except MissingTokenizerError:
        if required:
            raise
        log.warning("no tokenizer found for %s; continuing with token ids only", model_dir)
        return None


def load_checkpoint(
    path: str | os.PathLike,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = "auto",
    tokenizer_path: str | os.PathLike | None = None,
    require_tokenizer: bool = True,
    flag: str = "--model",
) -> tuple[torch.nn.Module, Any]:
    """Load a Hugging Face causal-LM checkpoint directory (weights + tokenizer) for evaluation.

    Returns ``(model, tokenizer)``; the model is in eval mode on ``device``.  With
    ``require_tokenizer=False`` a missing tokenizer gives ``None`` (and a warning) instead of
    :class:`MissingTokenizerError`.  ``dtype="auto"`` is bfloat16 on CUDA, float32 otherwise.
    """
    from transformers import AutoModelForCausalLM

    from memorization.evaluation.model_files import check_model_dir

    p = check_model_dir(path, flag)  # a missing, damaged or truncated directory: one line naming the file
    device = device or default_device()
    tokenizer = _tokenizer_of(p, tokenizer_path, require_tokenizer)
    model = AutoModelForCausalLM.from_pretrained(str(p), dtype=resolve_dtype(dtype, device),
                                                 trust_remote_code=False)
    model.to(device)
    model.eval()
    return model, tokenizer


def model_device(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def model_max_length(model: torch.nn.Module, cap: int | None = DEFAULT_MAX_LENGTH_CAP) -> int:
    """The default scoring window: the model's context (its trained length for a model trained from
    scratch, :func:`memorization.training.models.model_context`; 2048 if unknown), at most ``cap``."""
    from memorization.training.models import model_context

    n = model_context(model) or 2048
    return min(n, cap) if cap else n


def as_id_lists(docs: Docs) -> list[list[int]]:
    if isinstance(docs, torch.Tensor):
        if docs.dim() != 2:
            raise ValueError("a tensor of documents must be 2-D (n_docs, length)")
        return docs.tolist()
    return [d.tolist() if isinstance(d, torch.Tensor) else list(d) for d in docs]


def check_vocab(model: torch.nn.Module, docs: Sequence[Sequence[int]], what: str,
                 names: Sequence[str] | None = None) -> None:
    """Raise ``ValueError`` if a token id is outside ``model``'s vocabulary (which would be an
    opaque ``IndexError`` in the embedding on CPU, a device-side assert on CUDA).  The error
    names the document by ``names[i]`` when given (e.g. its manifest id), else by its index."""
    vocab = vocab_size(model)
    for i, d in enumerate(docs):
        if vocab and d and (min(d) < 0 or max(d) >= vocab):
            bad = max(d) if max(d) >= vocab else min(d)
            doc = f"document {i}" if names is None else f"document {names[i]!r}"
            raise ValueError(f"{what}: {doc} has token id {bad}, outside the model's vocabulary "
                             f"(0..{vocab - 1}): were its token_ids made with another tokenizer?")


def vocab_size(model_or_config) -> int | None:
    """Rows of the model's input embedding (``config.vocab_size`` as a fallback, or given a config), None if
    unknown."""
    try:
        return int(model_or_config.get_input_embeddings().num_embeddings)
    except (AttributeError, NotImplementedError, TypeError):
        n = getattr(getattr(model_or_config, "config", model_or_config), "vocab_size", None)
        return int(n) if n else None


def grid_runtime(grid: str):
    """The :class:`memorization.training.runtime.Runtime` of ``grid`` (``"D,R,C,Z"``: the launcher's processes as a
    data, row, column, depth grid); ``ValueError`` naming ``--grid`` for a bad one."""
    from axonn.grid_shape import GridShape
    from memorization.training.runtime import Runtime

    try:
        return Runtime.create(*GridShape.parse(grid))
    except ValueError as e:
        raise ValueError(f"--grid {grid}: {e}") from None


def axonn_checkpoint(path: str | os.PathLike) -> Path | None:
    """The axonn training checkpoint ``path`` names (a ``step_*`` directory with ``COMPLETE``, or a checkpoint
    root whose ``LATEST`` names one), None if it is no such thing."""
    from axonn.checkpoint import latest

    p = Path(path).expanduser()
    if (p / "COMPLETE").exists():
        return p
    return latest(p) if (p / "LATEST").exists() else None


def model_config_of(path: str | os.PathLike):
    """The HF config of a HF model directory or of an axonn training checkpoint (its ``meta.json``'s ``hf_config``,
    built as its ``model_type``'s config class: ``AutoConfig.for_model``)."""
    from transformers import AutoConfig

    step = axonn_checkpoint(path)
    if step is None:
        return AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    from axonn.checkpoint import read_meta

    meta = read_meta(step)
    if "hf_config" not in meta:
        raise ValueError(f"{step}: this checkpoint predates meta.json's hf_config; convert it with "
                         "`python -m axonn.convert ... --config <model dir>` and evaluate the result")
    cfg = dict(meta["hf_config"])
    return AutoConfig.for_model(cfg.pop("model_type"), **cfg)


def checkpoint_tokenizer_dir(step: Path) -> Path | None:
    """Where a trainer's checkpoint ``<run>/<arm>/checkpoint/step_*`` finds its tokenizer: the arm's exported
    ``model`` directory, if it holds one."""
    from memorization.data.corpus import has_tokenizer_files

    for d in (step.parent.parent / "model", step.parent / "model"):
        if d.is_dir() and has_tokenizer_files(d):
            return d
    return None


def load_on_grid(path: str | os.PathLike, rt, tokenizer_path: str | os.PathLike | None = None,
                 flag: str = "--model", require_tokenizer: bool = False) -> tuple[torch.nn.Module, Any]:
    """``(model, tokenizer)`` of ``path`` parallelized on ``rt``'s grid as in training, in eval mode: a HF
    directory (each rank reading only its own shards of the safetensors files,
    :func:`memorization.training.models.build_model`) or an axonn training checkpoint saved on any grid (resharded onto
    this one, each rank reading only the pieces it needs, :func:`axonn.checkpoint.load`; its tokenizer is
    ``tokenizer_path`` or the arm's exported model's).  The tokenizer is None if there is none and
    ``require_tokenizer`` is False."""
    from memorization.evaluation.model_files import check_model_dir
    from memorization.training.models import build_model

    step = axonn_checkpoint(path)
    if step is not None:
        from axonn.checkpoint import load

        tok_dir = tokenizer_path or checkpoint_tokenizer_dir(step)
        if tok_dir is None:
            raise MissingTokenizerError(f"{flag} {path} is a training checkpoint without a tokenizer beside it: "
                                        "pass --tokenizer (the run's tokenizer directory)")
        tok = load_tokenizer(tok_dir)
        model = build_model(None, len(tok), runtime=rt, config=model_config_of(step))
        load(model, None, step, grid=rt.grid)
        return model.eval(), tok
    p = check_model_dir(path, flag)
    tok = _tokenizer_of(p, tokenizer_path, require_tokenizer)
    return build_model(None, len(tok) if tok is not None else 0, init=str(p), runtime=rt).eval(), tok


def add_plan_arguments(parser, what: str) -> None:
    """The evaluation CLIs' ``--plan``, ``--gpus`` and ``--machine`` (one group); ``what`` says what the plan's
    memory per GPU counts for that command (e.g. "weights, KV cache of --batch-size sequences ...")."""
    plan = parser.add_argument_group("planning (prints the grid to run on and exits; reads the model's config only)")
    plan.add_argument("--plan", action="store_true",
                      help=f"print the memory per GPU of every grid of --gpus GPUs on --machine ({what}), the smallest "
                           "model-parallel group that fits, and the srun command for the best grid (most data "
                           "replicas)")
    plan.add_argument("--gpus", type=int, default=None, help="GPUs to plan for (--plan)")
    plan.add_argument("--machine", default="h100-node",
                      help="machine profile for --plan: frontier, alps, perlmutter, perlmutter-40, h100-node, or a "
                           "profile YAML")


#: flags of the evaluation CLIs that the command ``--plan`` prints leaves out (the plan's own, and what --grid refuses)
PLAN_FLAGS = ("--plan",)
PLAN_VALUE_FLAGS = ("--gpus", "--machine", "--grid", "--device", "--device-map")


def without_plan_flags(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--plan``, ``--gpus N``, ``--machine M``, ``--grid G``, ``--device D`` and ``--device-map
    D`` (``--flag value`` or ``--flag=value``): the arguments of the run that ``--plan`` plans."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in PLAN_FLAGS or ("=" in a and a.split("=", 1)[0] in PLAN_VALUE_FLAGS):
            continue
        elif a in PLAN_VALUE_FLAGS:
            skip = True
        else:
            out.append(a)
    return out


def print_inference_plan(script: str, argv: Sequence[str], model: str | os.PathLike, gpus: int | None,
                         machine: str, *, batch: int, generate: bool, dtype: str, context: int | None = None,
                         cap_context: bool = False, reference: str | os.PathLike | None = None) -> int:
    """``--plan`` of the evaluation CLIs: print :func:`axonn.planner.plan_inference`'s grids for ``gpus`` GPUs of
    ``machine`` and the ``srun`` command that runs ``script`` (with ``argv``, less the plan's flags) on the best.

    The shape comes from ``model``'s config alone (:func:`model_config_of`: a HF directory or an axonn training
    checkpoint; no weight is read), and ``reference``'s (MIA's reference model, held on the same grid) likewise.
    ``context``: tokens per sequence; None is the model's scoring window (:func:`model_max_length`, lowered to
    the reference's as MIA lowers it); ``cap_context`` lowers a given one to the model's context (extraction's
    ``--max-doc-tokens``).  Returns the exit status: 0 printed; 1 no grid of ``gpus`` fits (the message names the
    smallest model-parallel group that does); 2 bad input (``--gpus`` missing or below 1, an unknown machine, an
    unreadable config), each one ``error:`` line on stderr, the GPUs and machine checked before any file is read.
    """
    import shlex
    import sys

    from axonn.planner import PlanError, format_inference_plan, load_machine, plan_inference
    from axonn.presets import ModelShape
    from memorization.training.models import model_context

    def fail(message: str, status: int = 2) -> int:
        print(f"error: {message}", file=sys.stderr)
        return status

    if gpus is None:
        return fail("--plan needs --gpus N: the number of GPUs to plan for")
    if gpus < 1:
        return fail(f"--gpus {gpus}: give the number of GPUs to plan for, at least 1")
    try:
        prof = load_machine(machine)
    except PlanError as e:
        return fail(f"--machine: {e}")
    shapes: list[ModelShape] = []
    configs = []
    for flag, path in (("--model", model), ("--reference-model", reference)):
        if path is None:
            continue
        if not Path(path).expanduser().exists():
            return fail(f"{flag} {path} does not exist")
        try:
            config = model_config_of(path)
            shapes.append(ModelShape.from_hf_config(config, name=str(path)))
        except (OSError, ValueError, AttributeError) as e:
            return fail(f"{flag} {path}: no model config to plan for ({' '.join(str(e).split())})")
        configs.append(config)
    if context is None:
        context = min(model_max_length(c) for c in configs)
    elif cap_context and model_context(configs[0]):
        context = min(context, model_context(configs[0]))
    try:
        plan = plan_inference(shapes[0], gpus, prof, batch, context, generate, dtype,
                              reference=shapes[1] if len(shapes) > 1 else None)
    except PlanError as e:
        return fail(str(e), 1 if e.kind in ("memory", "divide") else 2)
    print(format_inference_plan(plan))
    cmd = shlex.join(["srun", "-n", str(gpus), "python", script, *without_plan_flags(argv), "--grid", str(plan.grid)])
    print(f"\nrun it on the best grid (one process per GPU; torchrun or mpiexec work as well):\n  {cmd}")
    return 0
