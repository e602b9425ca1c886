"""memorize's command line: one flag per config field, and ``--config FILE.yaml`` under them.

:func:`config_from_argv` builds the :class:`~memorization.experiment.config.ExperimentConfig` of a command
line: the defaults, then the ``--config`` file, then the flags given on the command line.  Options must be
given in full (no ``--siz`` for ``--size``): a sweep appends options to each cell's own, and an abbreviation
there would silently override the cell's setting.
"""
from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any, Sequence

from axonn.plans import FAMILIES
from memorization.experiment.config import (ADAMW_IMPLS, FINE_TUNE_LR, FINE_TUNE_WEIGHT_DECAY, FLAT_KEYS,
                                            MAX_FINE_TUNE_LR, SCRATCH_LR, SCRATCH_WARMUP_STEPS, SCRATCH_WEIGHT_DECAY,
                                            ExperimentConfig, flat, load_config, resolve, with_flat)
from memorization.experiment.validate import EXECUTION_SETTINGS, as_flags
from memorization.training.goldfish import DOC_STARTS
from memorization.data.mixture import PLACEMENTS

DESCRIPTION = ("Does a language model memorize documents it saw n times, and does Goldfish loss stop it? Runs a "
               "standard and a Goldfish arm on the same mixture and seed.")
#: the learning-rate flags' shared explanation of the fine-tuning defaults
FINE_TUNE_NOTE = (f"from scratch lr {SCRATCH_LR:g}, {SCRATCH_WARMUP_STEPS} warmup steps, weight decay "
                  f"{SCRATCH_WEIGHT_DECAY:g}; with --init (fine-tuning) lr {FINE_TUNE_LR:g}, warmup over 3%% of "
                  f"--steps, weight decay {FINE_TUNE_WEIGHT_DECAY:g}: Llama 2's fine-tuning numbers (Touvron et al. "
                  "2023, sec. 3.1; the 3%% warmup is Stanford Alpaca's)")


def _default(flag: str) -> Any:
    section, name = FLAT_KEYS[flag.lstrip("-").replace("-", "_")]
    cls = type(getattr(ExperimentConfig(), section))
    return next(f.default for f in fields(cls) if f.name == name)


def build_parser(description: str = DESCRIPTION) -> argparse.ArgumentParser:
    """memorize's parser; its defaults are the config's (``None``: resolved from --plan or --init)."""
    from axonn.cli import HelpFormatter

    p = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter, allow_abbrev=False)

    def add(group, flag: str, **kw) -> None:
        if kw.get("action") != "store_true":
            kw.setdefault("default", _default(flag))
        group.add_argument(flag, **kw)

    p.add_argument("--config", metavar="FILE.yaml", default=None, help="experiment config: a YAML file of the "
                   "sections model, data, goldfish, training, execution, extraction and output, each with the "
                   "fields to set (a field is its flag's name under its section: --goldfish-k is goldfish.k, "
                   "--lr training.lr, --extract-batch extraction.batch); flags given on the command line override "
                   "it; a run's <out>/config.yaml is its resolved config and runs it again")
    g = p.add_argument_group("model")
    add(g, "--size", help="model-shape preset (axonn/presets.yaml): nano, tiny, mini, small, 160m, 1b, 8b, 70b, 405b "
        "(Llama shapes), mistral-7b, qwen2-7b, qwen3-8b, olmo2-13b, pythia-6.9b (their families' shapes)")
    add(g, "--init", help="local Hugging Face checkpoint (safetensors) to fine-tune: a Llama, Mistral, Qwen2, Qwen3, "
        "OLMo 2 or GPT-NeoX (Pythia) model (overrides --size and --family; the paper's fine-tuning setting; changes "
        "the --lr, --warmup-steps and --weight-decay defaults); each rank reads only the rows of it that its shards "
        "need, so no process holds the full model")
    add(g, "--family", choices=FAMILIES, help="train --size's shape from scratch as this model family's "
        "transformers model (default: the preset's own family, llama for the CPU sizes): its layers, widths, heads "
        "and vocabulary with the family's own blocks (Qwen2's q/k/v biases, Qwen3's and OLMo 2's q/k norms, "
        "OLMo 2's post-norms, GPT-NeoX's fused qkv, LayerNorms, biases and parallel residual: it has no "
        "grouped-query attention, so its KV heads are the heads); e.g. --family qwen3 --size tiny on a CPU")
    g = p.add_argument_group("data")
    add(g, "--corpus", help="background corpus: builtin:pydocs (offline), a local .txt/.json/.jsonl/.parquet file or "
        "directory (a dataset repository's snapshot too: its train split), or a Hugging Face dataset name (needs "
        "network)")
    add(g, "--text-field", help="field holding the text in a json/parquet --corpus (and in --targets, unless "
        "--targets-text-field names another)")
    add(g, "--tokenizer", help="Hugging Face tokenizer name or path (default: builtin:bpe4096, a byte-level BPE "
        "trained locally on the offline corpus; with --init, the checkpoint's own tokenizer)")
    add(g, "--targets", help="your own target documents: a directory of .txt files (one document each), a "
        ".jsonl/.json file, or a .txt file with blank-line-separated documents (default: --num-targets documents "
        "held out of the corpus)")
    add(g, "--store", help="a token store prepared for this run by data/prepare.py (--config FILE.yaml prepares "
        "the one a config names): every rank memory-maps it and reads only the rows of its own steps, nothing is "
        "tokenized at start; refused, with the command that prepares the right one, if it was prepared from "
        "another corpus, tokenizer, targets or mixture setting (default: the store of this run's data in the cache, "
        "$GOLDFISH_CACHE/stores/, prepared by rank 0 on first use)")
    add(g, "--targets-text-field", help="field holding the text in a .json/.jsonl --targets file (default: "
        "--text-field)")
    add(g, "--num-targets", type=int, help="targets drawn from the corpus when --targets is unset")
    add(g, "--num-nonmembers", type=int, help="held-out documents recorded as non-members")
    add(g, "--exposures", help="times each target appears in the stream; a comma list (e.g. 1,4,16) splits the "
        "targets into groups; 0 = never seen (a control)")
    add(g, "--skip-short-targets", action="store_true", help="skip (and count) targets shorter than prefix + suffix "
        "instead of refusing")
    add(g, "--skip-overlapping-targets", action="store_true", help="skip (and count) a --targets document that "
        "shares a 32-token span with an earlier one (a copy would add to the other's exposures) instead of refusing")
    add(g, "--seq-len", type=int, help="tokens per training row (default 128; 2048 with --plan)")
    add(g, "--placement", choices=PLACEMENTS,
        help="which steps a target's exposures take: random (seeded); spaced evenly over the run; last: spaced "
        "with every target's last exposure in the run's final steps, so the steps since the last exposure do not "
        "depend on the exposure count (the report shows extraction against them)")
    add(g, "--canaries", type=int, help="random secrets (Carlini et al. 2019's canaries: --canary-digits random digits "
        "after a carrier sentence naming a random account) written over background tokens of the training rows, "
        "the same rows in every arm; after training each arm reports their exposure log2|R| - log2 rank, exact by "
        "enumerating all 10^digits secrets (memorization.evaluation.exposure), by exposure count (0: off)")
    add(g, "--canary-exposures", help="times each canary is written into the stream: a comma list, the canaries "
        "dealt round-robin over it (0 = never seen: the control, exposure ~ 1 bit expected)")
    add(g, "--canary-digits", type=int, help="digits of a canary's secret (the space has 10^digits candidates; "
        "exposure is at most digits x log2 10 bits): exact enumeration up to 5 digits, a skew-normal fit of "
        "sampled candidates' log-perplexities above")
    add(g, "--perturb-fraction", type=float, help="near-duplicate exposure: every copy of a target in the stream is "
        "perturbed at this fraction of its tokens, a different perturbation per copy (memorization.data.perturb); "
        "extraction and MIA still score the original, never seen verbatim (0: exact copies)")
    add(g, "--perturb-kind", choices=["substitute", "shuffle"], help="substitute: that fraction of the tokens "
        "replaced by random ones; shuffle: spans of 4 tokens covering that fraction reordered at random")
    g = p.add_argument_group("goldfish")
    add(g, "--goldfish-k", type=int, help="drop 1/k of the labels in the Goldfish arm (k >= 2); 0 runs only the "
        "standard arm")
    add(g, "--goldfish-h", type=int, help="hash context width: the decision for a label depends on the h tokens "
        "before it (1..64: a row carries the 64 stream tokens before it)")
    add(g, "--goldfish-strategy", choices=["hash", "minhash", "static"],
        help="hash: pseudo-random from the preceding h-gram; minhash: from the h-gram's smallest token hash and the "
        "previous token, so a copy with a few tokens substituted or shuffled is masked mostly alike (for "
        "--perturb-fraction); static: every k-th position")
    add(g, "--goldfish-doc-start", choices=DOC_STARTS,
        help="a label with fewer than h tokens of its document before it (a document's first h labels, all of a "
        "document of at most h tokens): keep: never dropped (the drop rate falls below 1/k); stream: hashed from "
        "the h stream tokens before it, across document boundaries, "
        "where they exist (a repeated document's opening is then masked differently at each exposure); static: "
        "every k-th position of the document dropped, the same at each exposure")
    add(g, "--arms", help="which arms to train: both (standard and goldfish), all (both and equal-tokens), or a "
        "comma list of standard, goldfish, equal-tokens; equal-tokens is the standard loss on as many labels per "
        "row as Goldfish keeps, the dropped ones drawn afresh in every row (the control for the supervised tokens "
        "Goldfish loses)")
    g = p.add_argument_group("training")
    add(g, "--batch-size", type=int, help="global batch in rows per optimizer step (default 4; 1024 with --plan)")
    add(g, "--micro-batch", type=int, help="rows per forward per rank (gradient accumulation over the rest); "
        "default: the whole local share")
    add(g, "--steps", type=int, help="optimizer steps; the background stream is cut to fill exactly these (0: as "
        "many as the corpus fills)")
    add(g, "--lr", type=float, help=f"peak learning rate (AdamW; linear warmup, then cosine decay to 10%% of it). "
        f"Default: {FINE_TUNE_NOTE}")
    add(g, "--warmup-steps", type=int, help=f"linear warmup steps before cosine decay (default {SCRATCH_WARMUP_STEPS}; "
        "with --init 3%% of --steps, at least 1)")
    add(g, "--weight-decay", type=float, help=f"AdamW weight decay on matrices (default {SCRATCH_WEIGHT_DECAY:g}; "
        f"with --init {FINE_TUNE_WEIGHT_DECAY:g})")
    add(g, "--allow-high-lr", action="store_true", help=f"with --init, accept an --lr above {MAX_FINE_TUNE_LR:g}: "
        "such a rate is for training from scratch and overwrites much of what a pretrained checkpoint knows, so "
        "it is refused unless you acknowledge it here (e.g. to reproduce a setting that used one)")
    add(g, "--grad-clip", type=float, help="clip the global gradient norm to this (> 0; inf: no clipping)")
    add(g, "--adamw-impl", choices=ADAMW_IMPLS,
        help="torch's AdamW kernel (default fused: one pass over each parameter's state, the clip folded in; "
        "about 5x faster a step than for-loop on a CPU). All three give the same update up to float rounding "
        "(~1e-8 relative), and a checkpoint resumes under any of them")
    add(g, "--eval-every", type=int, help="validation every N steps (0: at the end)")
    add(g, "--checkpoint-every", type=int, help="checkpoint every N steps and at the end (0: at the end only)")
    add(g, "--async-checkpoint", action="store_true", help="snapshot each checkpoint to host memory and write it "
        "while the next step trains (needs host memory for this rank's share of the weights and optimizer state)")
    add(g, "--compile", action="store_true", help="torch.compile the forward/loss")
    add(g, "--activation-checkpointing", action=argparse.BooleanOptionalAction,
        help="recompute layer activations in backward (less memory, ~30%% more compute; default off, on with --plan)")
    add(g, "--seed", type=int, help="seed of the mixture and the initial weights")
    g = p.add_argument_group("parallelism and planning")
    add(g, "--overlap", action=argparse.BooleanOptionalAction,
        help="overlap the tensor-parallel collectives with compute (depth all-gathers prefetched a layer ahead, "
        "reduce-scatters and dX all-reduces left in flight); same numbers either way")
    add(g, "--grad-reduce-dtype", choices=["fp32", "bf16"],
        help="dtype gradients are summed in over depth and data: bf16 halves those bytes (the planner charges it "
        "too) at bf16 rounding; gradients are accumulated and kept in fp32")
    add(g, "--grid", help="4D grid data,row,column,depth; product = world size")
    add(g, "--plan", action="store_true", help="print the planner's best grids for --gpus/--machine and exit")
    add(g, "--gpus", type=int, help="GPU count for --plan")
    add(g, "--machine", help="machine profile for --plan (frontier, alps, perlmutter, h100-node, or a profile YAML)")
    g = p.add_argument_group("extraction")
    add(g, "--prefix", type=int, help="prefix tokens P given to the model")
    add(g, "--suffix", type=int, help="suffix tokens S that must be reproduced")
    add(g, "--prefix-mode", choices=["fixed", "all-but-suffix"],
        help="fixed: the first P tokens; all-but-suffix: the whole document minus its last S tokens")
    add(g, "--extract-batch", type=int, help="documents decoded together")
    add(g, "--extract-lengths", metavar="P:S,...", help="more prefix:suffix token pairs to extract with after "
        "training, besides --prefix/--suffix (e.g. 32:32,100:50,all:50; all = all but the suffix): Carlini et al.'s "
        "context sweep in one run; a target too short for a pair is skipped and counted")
    add(g, "--samples", type=int, help="sampled continuations per target besides the greedy one (0: greedy only): "
        "the report adds the share of targets extracted by any of them and the per-sample rate ((n, p)-"
        "discoverable extraction); seeded by --seed and the target, the same on any grid or batch")
    add(g, "--temperature", type=float, help="temperature of the --samples continuations")
    add(g, "--top-k", type=int, help="the --samples continuations draw among the k most likely tokens (0: all)")
    add(g, "--track-every", type=int, help="memorization during training: every N steps (and before the first and "
        "after the last) extraction on the tracked targets and their loss, on all their labels and apart on the "
        "labels Goldfish keeps and drops; logged (wandb, <out>/<arm>/arm_result.json) and plotted (0: off)")
    add(g, "--track-targets", type=int, help="how many targets --track-every follows (a seeded sample; 0: all)")
    add(g, "--beam", type=int, help="beam-search extraction of this width besides greedy (0: off): a target counts "
        "as extracted when its suffix is one of the beams (memorization.evaluation.adaptive; batched with a KV cache)")
    add(g, "--hints", action="store_true", help="hint-counting teacher forcing: greedy decoding given the true token "
        "each time it errs; the report gives the hints per suffix and the longest verbatim run between them")
    add(g, "--mia", action="store_true", help="membership inference on every arm: loss, zlib, min-k%%, Min-K%%++ "
        "scores of the targets (members) against the exposure-0 targets and held-out documents; AUC and TPR at 1%% "
        "FPR by exposure count (memorization.evaluation.mia)")
    g = p.add_argument_group("output")
    add(g, "--out", help="output directory")
    add(g, "--resume", action="store_true", help="continue the interrupted run in --out (after a crash, or after "
        "SIGUSR1 made it checkpoint and exit with status 75); the run's settings must be the same, except how it "
        f"executes (the checkpoint is resharded onto a new --grid): {as_flags(EXECUTION_SETTINGS)}")
    add(g, "--overwrite", action="store_true", help="delete a previous run in --out and start afresh")
    add(g, "--wandb", action="store_true", help="sync to Weights & Biases (default: offline logs in --out)")
    add(g, "--export-dtype", choices=["float32", "bfloat16"],
        help="dtype of each arm's exported Hugging Face model (<out>/<arm>/model): the fp32 master weights as "
        "trained, or bf16 at half the size (a 70b is 280 vs 140 GB)")
    add(g, "--no-progress", action="store_true", help="no progress bars")
    add(g, "--force-lock", action="store_true", help="take over --out although its lock names a live-looking run on "
        "another host (a run writes <out>/.run.lock while it lives; a dead run's lock on this host, or one without "
        "a heartbeat for 2 minutes, is taken over without it): only when you know that run is dead")
    return p


def explicit_values(argv: Sequence[str]) -> dict[str, Any]:
    """The flags ``argv`` gives, by flat name (``{"steps": 12}``), without ``--config``; argparse's errors as
    usual (a SystemExit with its message on stderr)."""
    parser = build_parser()
    parser.parse_args(list(argv))  # --help, errors and type checks with the real defaults
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(list(argv)))
    given.pop("config", None)
    return given


def config_from_argv(argv: Sequence[str], base: ExperimentConfig | None = None,
                     resolved: bool = True) -> ExperimentConfig:
    """The config of a memorize command line: ``base`` (default: the defaults), then the ``--config`` file, then
    the flags given; resolved (its ``None`` defaults filled) unless ``resolved`` is false -- for a config that
    other fields still go over (a job's ``--init``).  Not validated
    (:func:`~memorization.experiment.validate.validate`)."""
    ns = build_parser().parse_args(list(argv))
    cfg = base or ExperimentConfig()
    if ns.config:
        cfg = load_config(ns.config, base=cfg)
    cfg = with_flat(cfg, explicit_values(argv))
    return resolve(cfg) if resolved else cfg


def to_argv(values: dict[str, Any]) -> list[str]:
    """Flags that give ``values`` (by flat name) on memorize's command line (:func:`explicit_values` inverted)."""
    actions = {a.dest: a for a in build_parser()._actions}
    out: list[str] = []
    for key, value in values.items():
        a = actions[key]
        flag = a.option_strings[0]
        if isinstance(a, argparse.BooleanOptionalAction):
            out.append(flag if value else "--no-" + flag[2:])
        elif isinstance(a, argparse._StoreTrueAction):
            out += [flag] if value else []
        elif value is not None:
            out += [flag, str(value)]
    return out


def settings_flags(cfg: ExperimentConfig, always: Sequence[str] = (), skip: Sequence[str] = ()) -> list[str]:
    """``cfg`` as memorize flags, for a reader: the settings ``always`` and every other one that differs from
    memorize's resolved default, but those of ``skip`` (flat names) and unset ones."""
    default = flat(resolve(ExperimentConfig()))
    return to_argv({k: v for k, v in flat(cfg).items()
                    if k not in skip and v is not None and (k in always or v != default.get(k))})
