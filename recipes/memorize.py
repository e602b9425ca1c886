#!/usr/bin/env python
"""Does a Llama model memorize documents it saw n times, and does Goldfish loss stop it?

Builds one mixture (targets seen exactly ``--exposures`` times inside a background stream),
trains the same initial model on it twice -- standard loss and Goldfish loss -- then runs
extraction (prefix -> greedy suffix) on both, and writes ``results.json``, ``results.md``
and ``results.png`` to ``--out``.

    python recipes/memorize.py                       # tiny model, offline corpus, CPU, minutes
    python recipes/memorize.py --size 8b --grid 8,2,2,2 --init /path/to/hf-llama   # on GPUs
    torchrun --nproc_per_node 8 recipes/memorize.py --size tiny --grid 1,2,2,2
    python recipes/memorize.py --size 405b --gpus 4096 --machine frontier --plan

SIGUSR1 (sent by the Slurm scripts of recipes/jobs before the time limit) makes every rank
checkpoint after the same step and exit with status 75 (EX_TEMPFAIL); the same command with
--resume continues the loss curve exactly.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # runnable from a checkout without installation
    sys.path.insert(0, str(_REPO))

from axonn.cli import HelpFormatter, run_main  # noqa: E402

ARMS = ("standard", "goldfish")


def build_parser() -> argparse.ArgumentParser:
    """memorize's command line. Options must be given in full (no ``--siz`` for ``--size``): a sweep appends
    options to each cell's own, and an abbreviation there would silently override the cell's setting."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Runs a standard and a Goldfish arm on the same mixture and seed.",
        formatter_class=HelpFormatter, allow_abbrev=False,
    )
    g = p.add_argument_group("model")
    g.add_argument("--size", default="tiny", help="model-shape preset (axonn/presets.yaml): tiny, mini, small, "
                   "160m, 1b, 8b, 70b, 405b")
    g.add_argument("--init", default=None, help="local Hugging Face Llama checkpoint (safetensors) to fine-tune "
                   "(overrides --size; the paper's fine-tuning setting); each rank reads only the rows of it that "
                   "its shards need, so no process holds the full model")
    g = p.add_argument_group("data")
    g.add_argument("--corpus", default="builtin:pydocs", help="background corpus: builtin:pydocs (offline), a local "
                   ".txt/.json/.jsonl/.parquet file or directory (a dataset repository's snapshot too: its train "
                   "split), or a Hugging Face dataset name (needs network)")
    g.add_argument("--text-field", default="text", help="field holding the text in a json/parquet --corpus (and in "
                   "--targets, unless --targets-text-field names another)")
    g.add_argument("--tokenizer", default="builtin:bpe4096", help="Hugging Face tokenizer name or path (default: "
                   "builtin:bpe4096, a byte-level BPE trained locally on the offline corpus; with --init, the "
                   "checkpoint's own tokenizer)")
    g.add_argument("--targets", default=None, help="your own target documents: a directory of .txt files (one "
                   "document each), a .jsonl/.json file, or a .txt file with blank-line-separated documents "
                   "(default: --num-targets documents held out of the corpus)")
    g.add_argument("--targets-text-field", default=None, help="field holding the text in a .json/.jsonl --targets "
                   "file (default: --text-field)")
    g.add_argument("--num-targets", type=int, default=32, help="targets drawn from the corpus when --targets is unset")
    g.add_argument("--num-nonmembers", type=int, default=32, help="held-out documents recorded as non-members")
    g.add_argument("--exposures", default="64", help="times each target appears in the stream; a comma list "
                   "(e.g. 1,4,16) splits the targets into groups; 0 = never seen (a control)")
    g.add_argument("--skip-short-targets", action="store_true", help="skip (and count) targets shorter than "
                   "prefix + suffix instead of refusing")
    g.add_argument("--skip-overlapping-targets", action="store_true", help="skip (and count) a --targets document "
                   "that shares a 32-token span with an earlier one (a copy would add to the other's exposures) "
                   "instead of refusing")
    g.add_argument("--seq-len", type=int, default=None, help="tokens per training row (default 128; 2048 with --plan)")
    g = p.add_argument_group("goldfish")
    g.add_argument("--goldfish-k", type=int, default=4, help="drop 1/k of the labels in the Goldfish arm "
                   "(k >= 2); 0 runs only the standard arm")
    g.add_argument("--goldfish-h", type=int, default=13, help="hash context width: the decision for a label "
                   "depends on the h tokens before it (1..64: a row carries the 64 stream tokens before it)")
    g.add_argument("--goldfish-strategy", default="hash", choices=["hash", "static"],
                   help="hash: pseudo-random from the preceding h-gram; static: every k-th position")
    g.add_argument("--arms", default="both", choices=["both", *ARMS], help="which arms to train")
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, default=None, help="global batch in rows per optimizer step "
                   "(default 4; 1024 with --plan)")
    g.add_argument("--micro-batch", type=int, default=None, help="rows per forward per rank (gradient "
                   "accumulation over the rest); default: the whole local share")
    g.add_argument("--steps", type=int, default=1000, help="optimizer steps; the background stream is cut to fill "
                   "exactly these (0: as many as the corpus fills)")
    g.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    g.add_argument("--warmup-steps", type=int, default=10, help="linear warmup steps before cosine decay")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay on matrices")
    g.add_argument("--grad-clip", type=float, default=1.0,
                   help="clip the global gradient norm to this (> 0; inf: no clipping)")
    g.add_argument("--eval-every", type=int, default=0, help="validation every N steps (0: at the end)")
    g.add_argument("--checkpoint-every", type=int, default=50,
                   help="checkpoint every N steps and at the end (0: at the end only)")
    g.add_argument("--async-checkpoint", action="store_true",
                   help="snapshot each checkpoint to host memory and write it while the next step trains "
                        "(needs host memory for this rank's share of the weights and optimizer state)")
    g.add_argument("--compile", action="store_true", help="torch.compile the forward/loss")
    g.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                   help="recompute layer activations in backward (less memory, ~30%% more compute; "
                        "default off, on with --plan)")
    g.add_argument("--seed", type=int, default=0, help="seed of the mixture and the initial weights")
    g = p.add_argument_group("parallelism and planning")
    g.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="overlap the tensor-parallel collectives with compute (depth all-gathers prefetched a "
                        "layer ahead, reduce-scatters and dX all-reduces left in flight); same numbers either way")
    g.add_argument("--grad-reduce-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="dtype gradients are summed in over depth and data: bf16 halves those bytes (the "
                        "planner charges it too) at bf16 rounding; gradients are accumulated and kept in fp32")
    g.add_argument("--grid", default="1,1,1,1", help="4D grid data,row,column,depth; product = world size")
    g.add_argument("--plan", action="store_true", help="print the planner's best grids for --gpus/--machine and exit")
    g.add_argument("--gpus", type=int, default=None, help="GPU count for --plan")
    g.add_argument("--machine", default="h100-node", help="machine profile for --plan (frontier, alps, "
                   "perlmutter, h100-node, or a profile YAML)")
    g = p.add_argument_group("extraction")
    g.add_argument("--prefix", type=int, default=50, help="prefix tokens P given to the model")
    g.add_argument("--suffix", type=int, default=50, help="suffix tokens S that must be reproduced")
    g.add_argument("--prefix-mode", default="fixed", choices=["fixed", "all-but-suffix"],
                   help="fixed: the first P tokens; all-but-suffix: the whole document minus its last S tokens")
    g.add_argument("--extract-batch", type=int, default=32, help="documents decoded together")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="runs/memorize", help="output directory")
    g.add_argument("--resume", action="store_true", help="continue the interrupted run in --out "
                   "(after a crash, or after SIGUSR1 made it checkpoint and exit with status 75); the run's "
                   "settings must be the same, except how it executes (the checkpoint is resharded onto a new "
                   f"--grid): {_as_flags(EXECUTION_SETTINGS)}")
    g.add_argument("--overwrite", action="store_true", help="delete a previous run in --out and start afresh")
    g.add_argument("--wandb", action="store_true", help="sync to Weights & Biases (default: offline logs in --out)")
    g.add_argument("--export-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of each arm's exported Hugging Face model (<out>/<arm>/model): the fp32 master "
                        "weights as trained, or bf16 at half the size (a 70b is 280 vs 140 GB)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.seq_len is None:
        args.seq_len = 2048 if args.plan else 128
    if args.batch_size is None:
        args.batch_size = 1024 if args.plan else 4
    if args.activation_checkpointing is None:
        args.activation_checkpointing = bool(args.plan)
    return args


def _parse_exposures(s: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise SystemExit(f"--exposures {s!r}: give an integer or a comma list of integers") from None
    if any(v < 0 for v in vals):
        raise SystemExit(f"--exposures {s!r}: counts must be >= 0")
    return vals


def _parse_grid(s: str) -> tuple[int, int, int, int]:
    from axonn.grid import parse_grid

    try:
        return parse_grid(s)
    except ValueError as e:
        raise SystemExit(f"error: --grid: {e}") from None


def _note(message: str) -> None:
    """A note on stderr, once per run: from the first rank only (checks run before the grid exists, on every rank)."""
    from axonn.grid import launcher_rank

    if launcher_rank() == 0:
        print(f"note: {message}", file=sys.stderr)


def read_targets(path: str, text_field: str, flag: str = "--targets",
                 field_flag: str = "--targets-text-field") -> list[str]:
    """Documents from a directory of .txt files, a .json/.jsonl file, or a blank-line-separated .txt.

    Nothing is dropped: an empty document stays (a target too short to measure, refused or counted
    by the mixture), so target ``user-{j}`` is record (or sorted file) ``j``; a record without a text
    in ``text_field`` is refused, naming the record.  Errors name the CLI's ``flag`` (the path) and
    ``field_flag`` (the field).
    """
    from memorization.corpus import load_texts, read_text_file, visible_files

    p = Path(path).expanduser()
    if not p.exists():
        raise SystemExit(f"{flag} {path} does not exist")
    try:
        if p.is_dir():
            files = visible_files(p, "*.txt")
            if not files:
                raise SystemExit(f"{flag} {path}: the directory holds no .txt files (a .json/.jsonl file of "
                                 "documents is passed as the file itself)")
            return [read_text_file(f).strip() for f in files]
        texts = load_texts(str(p), text_field=text_field, field_flag=field_flag)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {flag} {path}: {e}") from None
    bad = [j for j, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise SystemExit(f"error: {flag} {path}: {len(bad)} record(s) have no text in field {text_field!r} "
                         f"(e.g. record #{bad[0]}: {texts[bad[0]]!r}); give every record one, or pass "
                         f"{field_flag} to name the field that holds it")
    return texts


def targets_text_field(args: argparse.Namespace) -> str:
    """The field ``--targets`` records hold their text in: ``--targets-text-field``, else ``--text-field``."""
    return args.targets_text_field or args.text_field


# How a run executes, not what it computes: a --resume may change them (e.g. a requeued job on another
# number of GPUs: the checkpoint is resharded onto the new grid).  Gradients summed in bf16 round
# differently, micro-batching sums in another order: the loss curve goes on to that rounding.
EXECUTION_SETTINGS = ("grid", "micro_batch", "overlap", "grad_reduce_dtype", "compile", "activation_checkpointing",
                      "checkpoint_every", "async_checkpoint", "extract_batch")


def _as_flags(names) -> str:
    return ", ".join("--" + k.replace("_", "-") for k in names)


def settings_of(args: argparse.Namespace) -> dict:
    skip = {"resume", "overwrite", "no_progress", "plan", "gpus", "machine", "wandb", "export_dtype"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def arms_to_train(args: argparse.Namespace) -> list[str]:
    """The arms a run trains, in order: ``--arms`` (both by default), without Goldfish when ``--goldfish-k 0``."""
    return [a for a in ARMS if args.arms in ("both", a) and not (a == "goldfish" and args.goldfish_k == 0)]


def validate(args: argparse.Namespace) -> None:
    """Every bad input is refused here, before any download, allocation or training."""
    from axonn.presets import get_preset
    from memorization.goldfish import validate_goldfish_args

    try:
        get_preset(args.size)
        validate_goldfish_args(args.goldfish_k, args.goldfish_h, args.goldfish_strategy, allow_zero=True)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.goldfish_k == 0 and args.arms == "goldfish":
        raise SystemExit("error: --arms goldfish needs --goldfish-k >= 2")
    from memorization.mixture import check_hash_width

    if args.goldfish_k and args.goldfish_strategy == "hash":
        try:
            check_hash_width(args.goldfish_h)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    _parse_exposures(args.exposures)
    _parse_grid(args.grid)
    if args.init:
        from axonn.checkpoint import SafetensorsCheckpoint
        from memorization.models import model_config

        try:
            model_config(None, 0, init=args.init)  # a Llama config.json is there
            SafetensorsCheckpoint(args.init).close()  # and safetensors weights beside it
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: {e}") from None
    if args.targets and not Path(args.targets).expanduser().exists():
        raise SystemExit(f"error: --targets {args.targets} does not exist")
    from memorization.corpus import DEFAULT_CORPUS, looks_local

    if args.corpus != DEFAULT_CORPUS and looks_local(args.corpus) and not Path(args.corpus).expanduser().exists():
        raise SystemExit(f"error: --corpus {args.corpus} does not exist")
    if args.prefix < 1 or args.suffix < 1:
        raise SystemExit("error: --prefix and --suffix must be >= 1")
    _check_training_numbers(args)
    if args.resume and args.overwrite:
        raise SystemExit("error: --resume and --overwrite contradict each other")
    out = Path(args.out)
    cfg_file = out / "run_config.json"
    if args.plan:  # prints a plan and exits: --out is never touched, so an existing run there is no conflict
        return
    if out.exists() and any(out.iterdir()):
        if args.overwrite:
            pass
        elif not args.resume:
            raise SystemExit(
                f"error: --out {out} already holds a run: pass --resume to continue it, --overwrite to replace it, "
                "or choose another --out"
            )
        elif cfg_file.exists():
            old = json.loads(cfg_file.read_text())
            new = json.loads(json.dumps(settings_of(args)))
            diff = {k: (old.get(k), new[k]) for k in new if old.get(k) != new[k] and k != "out"}
            changed = {k: diff.pop(k) for k in EXECUTION_SETTINGS if k in diff}
            if diff:
                raise SystemExit(f"error: --resume with settings that differ from the run in {out}: {diff} "
                                 f"(only how it runs may change: {_as_flags(EXECUTION_SETTINGS)})")
            if changed:
                _note(f"--resume with other execution settings (was, now): {changed}")
    elif args.resume:
        _note(f"--resume: no run in {out} yet, starting a new one")


def mixture_config(args: argparse.Namespace):
    """The run's :class:`MixtureConfig`; its checks (e.g. prefix + suffix vs --seq-len) as a SystemExit."""
    from memorization.mixture import MixtureConfig

    need = args.suffix + (1 if args.prefix_mode == "all-but-suffix" else args.prefix)
    try:
        return MixtureConfig(seq_len=args.seq_len, batch_size=args.batch_size,
                             exposures=_parse_exposures(args.exposures), num_targets=args.num_targets,
                             num_nonmembers=args.num_nonmembers, num_steps=args.steps or None,
                             min_target_tokens=need, skip_short_targets=args.skip_short_targets,
                             skip_overlapping_targets=args.skip_overlapping_targets, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _check_training_numbers(args: argparse.Namespace) -> None:
    """Batch, micro-batch, steps and optimizer numbers that the trainer would refuse only after the data is built."""
    bad = [f"{flag} {value} (must be {need})" for flag, value, ok, need in (
        ("--batch-size", args.batch_size, args.batch_size >= 1, ">= 1"),
        ("--steps", args.steps, args.steps >= 0, ">= 0; 0 = as many as the corpus fills"),
        ("--lr", args.lr, args.lr > 0, "> 0"),
        ("--warmup-steps", args.warmup_steps, args.warmup_steps >= 0, ">= 0"),
        ("--weight-decay", args.weight_decay, args.weight_decay >= 0, ">= 0"),
        ("--grad-clip", args.grad_clip, args.grad_clip > 0, "> 0; inf = no clipping"),
        ("--eval-every", args.eval_every, args.eval_every >= 0, ">= 0; 0 = at the end only"),
        ("--checkpoint-every", args.checkpoint_every, args.checkpoint_every >= 0, ">= 0; 0 = at the end only"))
        if not ok]
    if bad:
        raise SystemExit(f"error: {'; '.join(bad)}")
    if args.plan:  # the planner picks the micro-batch and grid itself
        return
    from memorization.runtime import rows_per_rank

    mixture_config(args)
    d, _, _, z = _parse_grid(args.grid)
    try:
        local = rows_per_rank(args.batch_size, d * z)
    except ValueError as e:
        raise SystemExit(f"error: {e} (--grid {args.grid})") from None
    if args.micro_batch is not None and (args.micro_batch < 1 or local % args.micro_batch):
        raise SystemExit(f"error: --micro-batch {args.micro_batch} does not divide the {local} rows per step of "
                         f"each rank (--batch-size {args.batch_size} over data x depth = {d * z}): give a divisor "
                         f"of {local}")


def run_shape(args: argparse.Namespace, tokenizer=None):
    """The shape of the model this run trains: the ``--init`` checkpoint's; else the ``--size`` preset's layers
    with the vocabulary of the run's ``tokenizer`` (loaded when not given), padded as ``build_model`` pads it:
    the built-in tokenizer's 4,096 rows, not Llama 3.1's 128,256 (an 8b is then 7.0 B parameters, not 8.03 B)."""
    from dataclasses import replace

    from axonn.presets import ModelShape, get_preset
    from memorization.models import model_config, padded_vocab

    if args.init:
        return ModelShape.from_llama_config(model_config(None, 0, init=args.init), name=Path(args.init).name)
    preset = get_preset(args.size)
    vocab = padded_vocab(len(tokenizer if tokenizer is not None else load_run_tokenizer(args)))
    return preset if vocab == preset.vocab else replace(preset, name=f"{preset.name} (vocabulary {vocab})",
                                                       vocab=vocab)


def plan(args: argparse.Namespace) -> None:
    from axonn.planner import PlanError, format_plan, plan as make_plan

    if not args.gpus:
        raise SystemExit("error: --plan needs --gpus N")
    shape = run_shape(args)
    if not args.init and shape.name != args.size:
        print(f"note: without --init this run trains --size {args.size} with its tokenizer's {shape.vocab:,}-row "
              "vocabulary, planned below; pass --init <checkpoint> to plan the model you fine-tune", file=sys.stderr)
    try:
        result = make_plan(shape, seq=args.seq_len, global_batch=args.batch_size, gpus=args.gpus,
                           machine=args.machine, micro_batch=args.micro_batch,
                           activation_checkpointing=args.activation_checkpointing,
                           grad_reduce_dtype=args.grad_reduce_dtype)
    except PlanError as e:
        raise SystemExit(f"error: {e}") from None
    print(format_plan(result))
    print(f"\nrun the best grid (one process per GPU, under srun/torchrun/mpiexec):\n  {run_command(args, result.best)}")
    if Path(args.machine).suffix not in (".yaml", ".yml") and args.machine in JOB_MACHINES:
        print(f"or write a Slurm job for it:\n  python recipes/jobs/generate.py --machine {args.machine} "
              f"--size {args.size} --gpus {args.gpus} --seq {args.seq_len} --global-batch {args.batch_size}"
              f"{'' if args.activation_checkpointing else ' --no-activation-checkpointing'}"
              f" --grad-reduce-dtype {args.grad_reduce_dtype}")


JOB_MACHINES = ("frontier", "alps", "perlmutter")  # recipes/jobs/generate.py's targets


def run_command(args: argparse.Namespace, best) -> str:
    """The memorize.py command line that trains with the planned grid and micro-batch."""
    cmd = ["python recipes/memorize.py", f"--size {args.size}"]
    if args.init:
        cmd.append(f"--init {shlex.quote(args.init)}")
    cmd += [f"--grid {','.join(map(str, best.grid))}", f"--micro-batch {best.micro_batch}",
            f"--seq-len {args.seq_len}", f"--batch-size {args.batch_size}",
            "--activation-checkpointing" if args.activation_checkpointing else "--no-activation-checkpointing",
            f"--grad-reduce-dtype {args.grad_reduce_dtype}"]
    return " ".join(cmd)


def load_run_tokenizer(args: argparse.Namespace):
    """The run's tokenizer (with ``--init`` and no ``--tokenizer``, the checkpoint's own), checked against
    the ``--init`` checkpoint's vocabulary; every failure a SystemExit saying what to do."""
    from memorization.corpus import DEFAULT_TOKENIZER, load_tokenizer
    from memorization.models import check_same_vocab, check_tokenizer_fits

    spec = args.init if args.init and args.tokenizer == DEFAULT_TOKENIZER else args.tokenizer
    try:
        tokenizer = load_tokenizer(spec)
    except (OSError, ValueError) as e:
        fix = (" (the checkpoint's own: save its tokenizer into that directory, or pass --tokenizer)"
               if spec == args.init else "")
        raise SystemExit(f"error: cannot load the tokenizer {spec}{fix}: {e}") from None
    if args.init:
        try:
            check_tokenizer_fits(tokenizer, args.init)
            if spec != args.init and any((Path(args.init) / f).exists() for f in ("tokenizer.json", "tokenizer.model")):
                check_same_vocab(tokenizer, load_tokenizer(args.init), args.init)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    return tokenizer


# What memorize writes into --out: all that --overwrite deletes (anything else there is left alone).
RUN_ENTRIES = ("run_config.json", "manifest.json", "results.json", "results.md", "results.png", ".results.md.tmp",
               *ARMS)


def remove_run(out: Path) -> None:
    """Delete the run in ``out`` (its :data:`RUN_ENTRIES`), never other files the directory holds."""
    for name in RUN_ENTRIES:
        entry = out / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif entry.exists() or entry.is_symlink():
            entry.unlink()


def data_identity(manifest: dict) -> dict:
    """What a manifest says about the data a run trains and scores on: each target's and non-member's
    id, text and tokens, and the corpus fingerprint (absent from manifests written before it was recorded)."""
    def docs(key: str) -> list:
        return [[d.get("id"), d.get("text"), d.get("token_ids")] for d in manifest.get(key, [])]

    return {"targets": docs("targets"), "nonmembers": docs("nonmembers"),
            "corpus_fingerprint": manifest.get("corpus_fingerprint")}


def check_same_data(out: Path, mixture) -> None:
    """Refuse to continue the run in ``out`` if its saved manifest holds other targets, non-members or
    corpus than ``mixture``: its finished arms were trained and scored on that other data."""
    saved = out / "manifest.json"
    if not saved.exists():
        return
    old, new = data_identity(json.loads(saved.read_text())), data_identity(json.loads(json.dumps(mixture.manifest())))
    if old["corpus_fingerprint"] is None:
        new["corpus_fingerprint"] = None
    changed = [k for k in old if old[k] != new[k]]
    if changed:
        raise SystemExit(f"error: --resume: the {' and '.join(changed)} of the run in {out} changed since it "
                         "started (the --corpus, --targets or --tokenizer files were edited): restore them, or "
                         "start afresh with --overwrite or another --out")


def make_runtime(args: argparse.Namespace):
    from memorization.runtime import Runtime

    try:
        return Runtime.create(*_parse_grid(args.grid))
    except ValueError as e:
        raise SystemExit(f"error: --grid {args.grid}: {e}") from None


def run_arm(arm: str, args, rt, mixture, tokenizer, out: Path) -> dict:
    """Train one arm from the shared initial weights, export it, and run extraction on it."""
    import torch

    from memorization.extraction import ExtractionConfig, extract, trained
    from memorization.goldfish import GoldfishConfig
    from memorization.mixture import atomic_write_json
    from memorization.models import build_model
    from memorization.train import TrainConfig, Trainer

    arm_dir = out / arm
    done = arm_dir / "arm_result.json"
    if done.exists():
        return json.loads(done.read_text())
    gf = GoldfishConfig(k=args.goldfish_k, h=args.goldfish_h, strategy=args.goldfish_strategy, seed=0) \
        if arm == "goldfish" else GoldfishConfig(k=0)
    model = build_model(args.size, len(tokenizer), init=args.init, seed=args.seed, max_seq=args.seq_len,
                        runtime=rt)  # each rank builds and fills only its own shards
    cfg = TrainConfig(batch_size=args.batch_size, micro_batch=args.micro_batch, steps=args.steps or None, lr=args.lr,
                      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
                      eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, compile=args.compile,
                      async_checkpoint=args.async_checkpoint,
                      activation_checkpointing=args.activation_checkpointing, overlap=args.overlap,
                      grad_reduce_dtype=args.grad_reduce_dtype,
                      seed=args.seed, wandb=args.wandb,
                      progress=not args.no_progress, goldfish=gf)
    trainer = Trainer(model, mixture.input_ids, mixture.doc_ids, mixture.val_ids, cfg, arm_dir, rt, run_name=arm,
                      row_context=mixture.row_context)
    train = trainer.fit(resume=args.resume)
    model = trainer.model
    rt.export_hf(model, arm_dir / "model", tokenizer, dtype=getattr(torch, args.export_dtype))
    ecfg = ExtractionConfig(prefix_len=args.prefix, suffix_len=args.suffix,
                            all_but_suffix=args.prefix_mode == "all-but-suffix", batch_size=args.extract_batch)
    on_gpu = rt.device.type == "cuda"
    with torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else torch.autocast("cpu", enabled=False):
        ext = extract(model, mixture.targets, ecfg, tokenizer, progress=not args.no_progress and rt.is_main)
    drop = [h["goldfish_drop_frac"] for h in train["history"]]
    result = {
        **ext["overall"],
        "val_loss": train["val_loss"],
        "final_train_loss": train["final_train_loss"],
        "steps": train["steps"],
        "train_seconds": train["train_seconds"],  # of the whole run, also when it was resumed
        "goldfish": {"k": gf.k, "h": gf.h, "strategy": gf.strategy},
        "goldfish_drop_frac": sum(drop) / len(drop),
        "by_exposure": ext["by_exposure"],
        # for the paired test: the trained targets, as in the overall rates (not the exposure-0 controls)
        "exact_by_target": {d["id"]: d["exact_match"] for d in trained(ext["documents"])},
        "loss_curve": [h["loss"] for h in train["history"]],
    }
    if rt.is_main:
        atomic_write_json(arm_dir / "extraction.json", ext)
        atomic_write_json(done, result)
    return result


def write_report(out: Path, results: dict) -> None:
    from memorization.mixture import atomic_write_json
    from memorization.report import plot_arms, results_markdown

    atomic_write_json(out / "results.json", results)
    md = results_markdown(results)
    tmp = out / ".results.md.tmp"
    tmp.write_text(md)
    tmp.replace(out / "results.md")
    plot_arms(results, out / "results.png")


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    validate(args)
    if args.plan:
        plan(args)
        return None
    from memorization.corpus import corpus_fingerprint, load_documents
    from memorization.mixture import build_mixture
    from memorization.models import check_size_runs_here

    tokenizer = load_run_tokenizer(args)
    rt = make_runtime(args)
    local_rows = rt.local_batch_rows(args.batch_size)
    micro = args.micro_batch or local_rows
    check_size_runs_here(run_shape(args, tokenizer), rt.device, _parse_grid(args.grid), seq=args.seq_len,
                         micro_batch=micro, activation_checkpointing=args.activation_checkpointing,
                         micro_steps=max(1, local_rows // micro), grad_reduce_dtype=args.grad_reduce_dtype)
    try:
        docs = load_documents(args.corpus, text_field=args.text_field)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: --corpus: {e}") from None
    targets = read_targets(args.targets, targets_text_field(args)) if args.targets else None
    try:
        mixture = build_mixture(docs, tokenizer, mixture_config(args), target_texts=targets,
                                meta={"corpus": args.corpus, "tokenizer": args.tokenizer,
                                      "corpus_fingerprint": corpus_fingerprint(docs)})
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    out = Path(args.out)
    if args.overwrite:  # only now: a run refused above leaves the old one in place
        if rt.is_main and out.exists():
            remove_run(out)
        rt.barrier()  # no rank writes into an arm directory that rank 0 is still deleting
    else:
        check_same_data(out, mixture)
    out.mkdir(parents=True, exist_ok=True)
    if rt.is_main:
        from memorization.mixture import atomic_write_json

        atomic_write_json(out / "run_config.json", settings_of(args))
        mixture.save_manifest(out / "manifest.json")
    arms = arms_to_train(args)
    results = {"settings": settings_of(args), "num_steps": mixture.num_steps,
               "num_targets": len(mixture.targets), "skipped_targets": mixture.meta["skipped_short_targets"],
               "skipped_overlapping_targets": mixture.meta["skipped_overlapping_targets"],
               "arms": {}}
    from memorization.train import EXIT_INTERRUPTED, TrainingInterrupted

    try:
        for arm in arms:
            results["arms"][arm] = run_arm(arm, args, rt, mixture, tokenizer, out)
    except TrainingInterrupted as e:
        if rt.is_main:
            print(f"interrupted: {e} (--resume)", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    by_target = [results["arms"].get(a, {}).get("exact_by_target") for a in ARMS]
    if all(by_target):  # both arms, scored on the same targets (arm results of older runs lack it)
        from memorization.stats import paired_exact_test

        results["paired_exact_match"] = paired_exact_test(*by_target)
    if rt.is_main:
        write_report(out, results)
        print((out / "results.md").read_text())
    return results


if __name__ == "__main__":
    run_main(main, "the last checkpoint of each arm is kept; the same command with --resume continues from it")
