"""The one trainer: a causal-LM training loop over a fixed, pre-ordered stream of rows.

Step ``s`` consumes rows ``[s*B, (s+1)*B)`` of the stream (``B`` = global batch in rows), so
the data order is a pure function of the step and resuming needs only the step counter.
Inside a step, this rank's share of the rows (``runtime.batch_slice``: data x depth ranks
take different slices, row/column ranks the same) is split into micro-batches for gradient
accumulation.  The loss is the mean over every kept label of the *global* batch:

    L = (1 / N_kept) * sum_{rows, t} CE(logits_t, y_t)    (Goldfish-dropped y_t = -100)

N_kept is known on every rank without communication because the Goldfish mask is a
deterministic function of the token ids.  Each rank backpropagates
``loss_sum_local * R / N_kept`` with R = data x depth replicas, so that ``sync_gradients``'
averaging over those replicas yields exactly dL/dθ.

AdamW, linear warmup + cosine decay, global grad-norm clipping, bf16 autocast on CUDA,
held-out validation loss, atomic checkpoints (resume continues the same loss curve), wandb
(offline unless asked to sync), a tqdm bar with loss and tokens/s.

SIGUSR1 (what the Slurm scripts in ``recipes/jobs`` send before the time limit) asks for a
clean stop: the request is OR-ed over all ranks inside the next step, so every rank stops
after the same step, writes the checkpoint and raises :class:`TrainingInterrupted`.  SIGTERM does
the same (what Slurm sends every task at the time limit or on ``scancel``, then SIGKILL after its
``KillWait``, 30 s by default; and what a plain ``kill`` sends): the steps since the last checkpoint are
kept if a step and a save fit in that grace.  SIGINT and SIGKILL still stop at once.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from axonn import optimize_communication
from axonn.intra_layer.fp8 import RECIPES as FP8_RECIPES, enable_fp8

from .attention import unpacked_rows, use_causal_sdpa
from .goldfish import HASHED, IGNORE_INDEX, GoldfishConfig, RowContext, apply_goldfish
from .loss import causal_lm_loss_sum
from memorization.data.mixture import atomic_write_json
from .runtime import Runtime


@dataclass
class TrainConfig:
    batch_size: int = 16  # global batch, rows per optimizer step
    micro_batch: int | None = None  # rows per forward on this rank (None: the whole local share)
    steps: int | None = None  # None: one pass over the stream
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    adamw_impl: str = "fused"  # torch's AdamW kernel: "fused" (ADAMW_IMPLS), "foreach" or "for-loop"
    eval_every: int = 0  # 0: validation only at the end
    eval_rows: int = 64
    track_every: int = 0  # every N steps (and before the first, and after the last) the Trainer's tracker runs
    checkpoint_every: int = 50
    async_checkpoint: bool = False  # write each checkpoint in a background thread while the next step runs
    bf16: bool = True  # autocast to bf16 on CUDA (ignored on CPU)
    compile: bool = False
    fp8: str = ""  # "rowwise" or "tensorwise": Linears but the LM head in FP8 (torchao; axonn.intra_layer.fp8)
    activation_checkpointing: bool = False
    overlap: bool = True  # non-blocking collectives overlapped with compute (axonn.optimize_communication)
    grad_reduce_dtype: str = "fp32"  # gradients summed over depth and data in "fp32" or "bf16" (half the bytes)
    chunk_tokens: int = 4096
    seed: int = 0
    wandb: bool = False  # sync to wandb (default: offline run directory only)
    wandb_project: str = "goldfish-axonn"
    progress: bool = True
    goldfish: GoldfishConfig = field(default_factory=lambda: GoldfishConfig(k=0))


# The settings that define what a run computes: a checkpoint resumes only a run with the same ones (the
# others say how it runs -- micro batch, grid, compile, overlap, checkpointing, validation -- and may change).
#: TrainConfig.adamw_impl -> torch.optim.AdamW's switches.  The same update and state (a checkpoint resumes under
#: any of them) up to float rounding (~1e-8 relative a step); the fused kernel reads each parameter, gradient and
#: moment once and takes the clip as its grad_scale (Runtime.clip_and_step): on SmolLM2-135M's 135 M parameters a
#: CPU step takes 146 ms fused, 768 ms foreach and 761 ms for-loop (docs/benchmarks.md).  torchtitan's
#: ``optimizer.implementation`` has the same three; HF's Trainer uses the fused one (``adamw_torch_fused``).
ADAMW_IMPLS = {"fused": {"fused": True}, "foreach": {"fused": False, "foreach": True},
               "for-loop": {"fused": False, "foreach": False}}

RUN_SETTINGS = ("batch_size", "lr", "min_lr_ratio", "warmup_steps", "weight_decay", "betas", "grad_clip", "goldfish")
# TrainConfig.grad_reduce_dtype -> optimize_communication's grad_reduce_dtype (None: the fp32 parameters' own)
GRAD_REDUCE_DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
# what a stream of token ids may be stored as (each batch is made int64 on the device)
TOKEN_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)
STOP_SIGNAL = signal.SIGUSR1
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)  # each asks fit to checkpoint and stop (module docstring)
EXIT_INTERRUPTED = 75  # EX_TEMPFAIL: the exit status of a CLI whose training stopped on STOP_SIGNALS (resume it)


class NonFiniteTraining(FloatingPointError):
    """A step's loss or gradient norm, or the weights about to be checkpointed, are not finite: training stopped
    at that step, and the checkpoints saved before it (the newest ``LATEST`` names) are left as they were."""

    def __init__(self, step: int, what: str, ckpt_dir: Path, latest: int | None):
        kept = (f"the last good checkpoint (step {latest}) in {ckpt_dir} is kept" if latest is not None
                else "no checkpoint was saved before it")
        super().__init__(f"training diverged: {what} at step {step}; stopped there, {kept}. Lower --lr (or raise "
                         "--warmup-steps, lower --grad-clip) and start again")
        self.step, self.ckpt_dir = step, ckpt_dir


class TrainingInterrupted(Exception):
    """``fit`` stopped early on request; the checkpoint of ``step`` is in ``ckpt_dir`` (resume continues)."""

    def __init__(self, step: int, ckpt_dir: Path):
        super().__init__(f"stopped on request after step {step}; checkpoint in {ckpt_dir}; "
                         "run the same command again with resume to continue")
        self.step, self.ckpt_dir = step, ckpt_dir


def lr_at(step: int, total: int, cfg: TrainConfig) -> float:
    """The learning rate of step ``step`` (0-based) of a ``total``-step run: ``f(step + 1)`` with

        f(t) = lr * t / W                                          for t <= W  (linear warmup)
        f(t) = lr * (m + (1 - m) * (1 + cos(pi * (t - W) / (total - W))) / 2)   for t > W  (cosine)

    (W = ``warmup_steps``, m = ``min_lr_ratio``): the peak comes once, at step W - 1, and the last
    step runs at exactly ``lr * m``.  With W >= total the run ends inside the warmup (no decay).
    """
    t, w = step + 1, cfg.warmup_steps
    if t <= w:
        return cfg.lr * t / w
    progress = min(1.0, (t - w) / (total - w))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _check_numbers(cfg: TrainConfig) -> None:
    """Refuse optimizer and schedule settings that would train wrongly without failing: a clip of 0 zeroes
    every gradient and a negative one flips them, a negative micro-batch runs no forward at all, an infinite
    learning rate or weight decay makes every weight NaN after one step (NaN fails every range check)."""
    bad = [f"{name}={value!r} (must be {need})" for name, value, ok, need in (
        ("batch_size", cfg.batch_size, cfg.batch_size >= 1, ">= 1"),
        ("steps", cfg.steps, cfg.steps is None or cfg.steps >= 0, "None or >= 0; None or 0 = one pass over the stream"),
        ("micro_batch", cfg.micro_batch, cfg.micro_batch is None or cfg.micro_batch >= 1, "None or >= 1"),
        ("lr", cfg.lr, 0 < cfg.lr < math.inf, "finite, > 0"),
        ("min_lr_ratio", cfg.min_lr_ratio, 0 <= cfg.min_lr_ratio <= 1, "in [0, 1]"),
        ("warmup_steps", cfg.warmup_steps, cfg.warmup_steps >= 0, ">= 0"),
        ("weight_decay", cfg.weight_decay, 0 <= cfg.weight_decay < math.inf, "finite, >= 0"),
        ("betas", cfg.betas, len(cfg.betas) == 2 and all(0 <= b < 1 for b in cfg.betas), "two numbers in [0, 1)"),
        ("grad_clip", cfg.grad_clip, cfg.grad_clip > 0, "> 0; math.inf = no clipping"),
        ("adamw_impl", cfg.adamw_impl, cfg.adamw_impl in ADAMW_IMPLS, " or ".join(map(repr, ADAMW_IMPLS))),
        ("eval_every", cfg.eval_every, cfg.eval_every >= 0, ">= 0; 0 = at the end only"),
        ("track_every", cfg.track_every, cfg.track_every >= 0, ">= 0; 0 = no tracking"),
        ("checkpoint_every", cfg.checkpoint_every, cfg.checkpoint_every >= 0, ">= 0; 0 = at the end only"),
        ("chunk_tokens", cfg.chunk_tokens, cfg.chunk_tokens >= 1, ">= 1")) if not ok]
    if bad:
        raise ValueError("TrainConfig: " + "; ".join(bad))


def _token_range(t) -> tuple[int, int] | None:
    """``(min, max)`` of a stream's token ids: a stored view's recorded ``token_range`` (nothing read), a
    tensor's own values; None for an empty one or one without values (fake or meta tensors)."""
    if not isinstance(t, torch.Tensor):  # a view of a prepared token store (memorization.data.token_store)
        lo, hi = t.token_range
        return None if hi < lo else (int(lo), int(hi))
    from torch._guards import detect_fake_mode

    # (a memory trace runs the trainer on fake tensors, which have shapes but no values to read)
    if not t.numel() or detect_fake_mode((t,)) is not None or t.device.type == "meta":
        return None
    return int(t.min()), int(t.max())


def _check_stream(rows, doc_ids, val_rows, vocab: int | None) -> None:
    """Refuse a stream that would fail only mid-run or at the final validation, with an unclear error (on a GPU, a
    device-side assert): document ids not one per token, token ids outside the model's vocabulary.

    ``rows`` may be a tensor or a row view of a token store (``memorization.data.token_store.StoredArray``: ``shape``,
    ``dtype``, ``token_range`` and ``view[a:b]`` -> tensor); a view is checked by the token range recorded when
    the store was written, so no row of it is read here."""
    if tuple(doc_ids.shape) != tuple(rows.shape):
        raise ValueError(f"doc_ids has shape {tuple(doc_ids.shape)}, the rows {tuple(rows.shape)}: give one "
                         "document id per token (Mixture.doc_ids)")
    for name, t in (("rows", rows), ("val_rows", val_rows)):
        if t.dtype not in TOKEN_DTYPES:
            raise ValueError(f"{name} must hold integer token ids in one of {[str(d) for d in TOKEN_DTYPES]}, "
                             f"got {t.dtype}: convert it, e.g. rows.long()")
        span = _token_range(t) if vocab is not None else None
        if span is not None and not (0 <= span[0] and span[1] < vocab):
            raise ValueError(f"{name} hold token ids in [{span[0]}, {span[1]}], outside the model's "
                             f"vocabulary [0, {vocab}): tokenize with the model's tokenizer, or build the model "
                             "with a vocabulary that covers it")


def _goldfish_labels(ids: torch.Tensor, docs: torch.Tensor, gf: GoldfishConfig,
                     context: RowContext | None = None, row_index: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    return apply_goldfish(ids.clone(), ids, gf, docs, context, row_index)


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, rows: torch.Tensor, runtime: Runtime, micro_batch: int, device: torch.device,
                  autocast=nullcontext, chunk_tokens: int = 4096) -> float:
    """Token-weighted mean next-token loss over every row of ``rows`` (no Goldfish), split over data x depth ranks.

    The rows are padded to a multiple of data x depth with copies whose labels are all ignored, so that every rank
    runs the same forwards (depth ranks run them together) and any grid measures the same rows."""
    model.eval()
    pad = -len(rows) % runtime.replicas
    labels = torch.cat([rows.long(), rows.new_full((pad, rows.shape[1]), IGNORE_INDEX, dtype=torch.long)])
    rows = torch.cat([rows, rows[torch.arange(pad, device=rows.device) % len(rows)]])
    local, local_labels = runtime.batch_slice(rows), runtime.batch_slice(labels)
    tot = torch.zeros(2, dtype=torch.float64, device=device)
    for i in range(0, len(local), micro_batch):
        ids = local[i : i + micro_batch].to(device).long()  # (an int32 stream: cross-entropy needs int64 labels)
        with autocast():
            s, n = causal_lm_loss_sum(model, ids, local_labels[i : i + micro_batch].to(device),
                                      chunk_tokens=chunk_tokens)
        tot += torch.stack([s.double(), n.double()])
    runtime.all_reduce_batch(tot)
    model.train()
    return float(tot[0] / tot[1].clamp(min=1))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay on the matrices (Linear and embedding weights), none on norms and
    biases.  A parameter is a matrix by its *full* shape (``axonn.parallelize.spec_of``): on a
    tensor-parallel grid every weight is a flat 1-D shard, and ``p.ndim`` would leave none."""
    from axonn.parallelize import spec_of

    named = list(model.named_parameters())
    decay = [p for _, p in named if len(spec_of(p).full_shape) >= 2]
    no_decay = [p for _, p in named if len(spec_of(p).full_shape) < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Trainer:
    """Trains ``model`` on ``rows`` (N, L) with per-token document ids ``doc_ids`` (N, L) (for Goldfish);
    ``row_context`` (the mixture's) lets Goldfish hash each row's first labels from the stream
    tokens before it (:class:`~memorization.training.goldfish.RowContext`).

    ``rows``, ``doc_ids`` and the context's arrays may be tensors or the on-demand views of a prepared
    token store (:func:`memorization.data.token_store.open_store`): each step reads only its own ``B`` rows, and
    construction reads none (the token range is the store's recorded one)."""

    def __init__(self, model: torch.nn.Module, rows: torch.Tensor, doc_ids: torch.Tensor, val_rows: torch.Tensor,
                 cfg: TrainConfig, out_dir: str | Path, runtime: Runtime | None = None, run_name: str = "run",
                 row_context: RowContext | None = None, tracker: Callable[..., dict] | None = None):
        self.cfg = cfg
        self.tracker = tracker  # tracker(model, device, autocast) -> metrics, every cfg.track_every steps
        self.rt = runtime or Runtime.create()
        self.out = Path(out_dir)
        self.rows, self.doc_ids, self.val_rows = rows, doc_ids, val_rows
        self.row_context = row_context
        if row_context is not None and len(row_context.start) != len(rows):
            raise ValueError(f"row_context has {len(row_context.start)} rows, the stream {len(rows)}: pass the "
                             "mixture's own (Mixture.row_context)")
        _check_stream(rows, doc_ids, val_rows[: cfg.eval_rows], getattr(getattr(model, "config", None),
                                                                          "vocab_size", None))
        gf = cfg.goldfish
        if row_context is not None and gf.enabled and gf.strategy in HASHED and gf.h > row_context.ids.shape[-1]:
            raise ValueError(f"goldfish h={gf.h} needs the {gf.h} stream tokens before each row, but the row "
                             f"context holds only {row_context.ids.shape[-1]}: use h <= "
                             f"{row_context.ids.shape[-1]}, or build the mixture with a longer context")
        self.run_name = run_name
        if cfg.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
            raise ValueError(f"grad_reduce_dtype must be one of {sorted(GRAD_REDUCE_DTYPES)}, "
                             f"got {cfg.grad_reduce_dtype!r}")
        if cfg.fp8 and cfg.fp8 not in FP8_RECIPES:
            raise ValueError(f"fp8 must be one of {', '.join(FP8_RECIPES)} (or empty: off), got {cfg.fp8!r}")
        _check_numbers(cfg)
        B = cfg.batch_size
        available = len(rows) // B
        if available == 0:
            raise ValueError(f"the stream holds {len(rows)} rows, fewer than one batch of {B}")
        self.total_steps = cfg.steps or available
        if self.total_steps > available:
            raise ValueError(f"corpus too small: {self.total_steps} steps requested, the stream holds {available}")
        if cfg.warmup_steps >= self.total_steps and self.rt.is_main:
            warnings.warn(f"warmup_steps {cfg.warmup_steps} >= the run's {self.total_steps} steps: the learning "
                          f"rate ends at {lr_at(self.total_steps - 1, self.total_steps, cfg) / cfg.lr:.2f} of its "
                          "peak and never decays; lower --warmup-steps", stacklevel=2)
        self.local_rows = self.rt.local_batch_rows(B)
        self.micro = cfg.micro_batch or self.local_rows
        if self.local_rows % self.micro:
            raise ValueError(f"micro batch {self.micro} does not divide this rank's {self.local_rows} rows per step")
        held_out = min(cfg.eval_rows, len(val_rows))
        if held_out < 1:
            raise ValueError(f"validation needs at least one held-out row; it has {held_out} (eval_rows="
                             f"{cfg.eval_rows}, {len(val_rows)} held-out rows): raise eval_rows or hold out more rows")
        self.device = self.rt.device
        use_causal_sdpa(model)  # flash attention also under torch.compile (memorization/training/attention.py)
        if getattr(model, "_axonn_grid", None) is None:  # a full model: shard it here
            model = self.rt.parallelize(model.to(self.device))
        elif model._axonn_grid is not self.rt.grid:
            raise ValueError("the model is parallelized on another grid than this trainer's runtime: build it with "
                             "build_model(..., runtime=<the same Runtime>)")
        self.model = model
        if cfg.fp8:
            enable_fp8(self.model, cfg.fp8)
        if cfg.activation_checkpointing:
            self.rt.enable_activation_checkpointing(self.model)
        self.model.train()
        self.forward = torch.compile(causal_lm_loss_sum) if cfg.compile else causal_lm_loss_sum
        self.opt = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas,
                                     **ADAMW_IMPLS[cfg.adamw_impl])
        self.step = 0
        self.history: list[dict] = []
        self.tracking: list[dict] = []  # {"step": s, **tracker(...)}: before step 1, every track_every, at the end
        self.wandb_id: str | None = None  # the wandb run this training logs to; kept in the checkpoint
        self._seconds_before = 0.0  # training time of the sessions before a resume (kept in the checkpoint)
        self._fit_start: float | None = None
        self.stop_requested = False  # set by request_stop (SIGUSR1 or SIGTERM during fit); see train_step
        self._finish_save: Callable[[], None] | None = None  # a background checkpoint not yet published
        self._checkpointed_step: int | None = None  # the step of the checkpoint saved or resumed from last
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if (
            cfg.bf16 and self.device.type == "cuda") else nullcontext

    # ---- checkpoints -------------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoint"

    def save_checkpoint(self) -> None:
        """Checkpoint this step (collective).  With ``async_checkpoint`` the state is snapshotted to
        host memory and written while training goes on; :meth:`finish_checkpoint` publishes it."""
        self.finish_checkpoint()  # one save in flight at a time
        self._check_finite_weights()
        extra = {"step": self.step, "history": self.history, "tracking": self.tracking,
                 "config": _jsonable(asdict(self.cfg)),
                 "total_steps": self.total_steps, "run": self.run_identity(), "wandb_id": self.wandb_id,
                 "train_seconds": self.train_seconds()}
        self._finish_save = self.rt.save_checkpoint(self.model, self.opt, self.ckpt_dir, extra,
                                                    background=self.cfg.async_checkpoint)
        self._checkpointed_step = self.step

    def _check_finite_weights(self) -> None:
        """Raise :class:`NonFiniteTraining` if some rank holds a non-finite weight (collective: every rank
        raises).  One pass over the parameters, on the device, before a checkpoint: a checkpoint is only
        ever of weights that are all finite."""
        flags = [torch.isfinite(p.detach()).all() for p in self.model.parameters()]
        bad = bool(flags) and not bool(torch.stack(flags).all())
        if bool(self.rt.any_rank(bad)):
            raise NonFiniteTraining(self.step, "a weight is not finite after the update", self.ckpt_dir,
                                    self._checkpointed_step)

    def finish_checkpoint(self) -> None:
        """Wait for a background checkpoint and make it the one ``LATEST`` names (collective; a no-op
        when none is being written)."""
        finish, self._finish_save = self._finish_save, None
        if finish is not None:
            finish()

    def run_identity(self) -> dict:
        """What this run computes: :data:`RUN_SETTINGS` and :attr:`stream_fingerprint`."""
        cfg = _jsonable(asdict(self.cfg))
        return {"settings": {k: cfg[k] for k in RUN_SETTINGS}, "stream": self.stream_fingerprint}

    @functools.cached_property
    def stream_fingerprint(self) -> str:
        """The stream's shape and a SHA-256 of up to 1024 evenly spaced rows with their document ids
        (computed once, at the first checkpoint or resume: the stream does not change during a run)."""
        n = len(self.rows)
        idx = torch.linspace(0, n - 1, min(n, 1024)).round().long().unique()
        h = hashlib.sha256(repr((tuple(self.rows.shape), str(self.rows.dtype))).encode())
        for t in (self.rows, self.doc_ids):
            h.update(t[idx].detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
        return h.hexdigest()[:16]

    def try_resume(self) -> bool:
        """Load the latest intact checkpoint in ``ckpt_dir``, if any (a damaged newest one is passed over:
        :meth:`Runtime.resume_point`), after checking it is of this run: the same step count,
        :data:`RUN_SETTINGS` and stream (read before any state is loaded)."""
        path = self.rt.resume_point(self.ckpt_dir)
        if path is None:
            return False
        extra = self.rt.checkpoint_extra(self.ckpt_dir, path)
        problems = []
        if extra.get("total_steps") != self.total_steps:
            problems.append(f"it is for a {extra.get('total_steps')}-step run, this run has {self.total_steps} steps")
        saved, now = extra.get("run"), self.run_identity()
        if saved is not None:  # (checkpoints written before it was recorded are checked by step count only)
            if isinstance(saved["settings"].get("goldfish"), dict):  # fields added since: at their defaults
                saved["settings"]["goldfish"] = {**asdict(GoldfishConfig(k=0)), **saved["settings"]["goldfish"]}
            problems += [f"{k} was {v!r}, now {now['settings'].get(k)!r}" for k, v in saved["settings"].items()
                         if now["settings"].get(k) != v]
            if saved["stream"] != now["stream"]:
                problems.append("its training stream was different data (another corpus, mixture or seed)")
        if problems:
            raise ValueError(f"checkpoint in {self.ckpt_dir} is of a different run: " + "; ".join(problems)
                             + ". Use a fresh output directory, or the same settings and data (how the run "
                             "executes -- grid, micro batch, compile, overlap, checkpointing -- may change)")
        extra = self.rt.load_checkpoint(self.model, self.opt, self.ckpt_dir, path)
        self.step, self.history, self.tracking = extra["step"], extra["history"], extra.get("tracking", [])
        self.wandb_id = extra.get("wandb_id")
        self._seconds_before = float(extra.get("train_seconds", 0.0))
        self._checkpointed_step = self.step
        return True

    def train_seconds(self) -> float:
        """Seconds ``fit`` has trained this run: this session's, plus those of the sessions its checkpoint
        continues (a resumed run's time is the whole run's, not only the part after the resume)."""
        now = 0.0 if self._fit_start is None else time.perf_counter() - self._fit_start
        return self._seconds_before + now

    # ---- the loop ----------------------------------------------------------------------------
    def train_step(self) -> dict:
        """One optimizer step, enqueued without waiting for the device.

        The record's ``loss``, ``grad_norm`` and ``goldfish_drop_frac`` are 0-dim device tensors;
        :func:`read_record` turns them into floats (one device-to-host copy).  Nothing here syncs:
        the rows travel through pinned memory (a pageable host-to-device copy would wait for
        the stream), the clip scale stays on the device, and ``fit`` reads step ``s`` only
        after step ``s + 1`` is enqueued, so the GPU never idles while the host catches up.
        """
        cfg, B = self.cfg, self.cfg.batch_size
        s = self.step
        ids = _to_device(self.rows[s * B : (s + 1) * B], self.device).long()  # int64 labels for the cross-entropy
        docs = _to_device(self.doc_ids[s * B : (s + 1) * B], self.device)
        ctx = None
        if self.row_context is not None and cfg.goldfish.enabled:
            c = self.row_context.rows(slice(s * B, (s + 1) * B))
            ctx = RowContext(*(_to_device(t, self.device) for t in (c.ids, c.doc_ids, c.start)))
        rows = torch.arange(s * B, (s + 1) * B, device=self.device) if cfg.goldfish.randomize else None
        labels, drop_frac = _goldfish_labels(ids, docs, cfg.goldfish, ctx, rows)  # whole global batch: no comms
        n_kept = (labels[:, 1:] != IGNORE_INDEX).sum().clamp(min=1)
        ids_l, labels_l = self.rt.batch_slice(ids), self.rt.batch_slice(labels)
        lr = lr_at(s, self.total_steps, cfg)
        for g in self.opt.param_groups:
            g["lr"] = lr
        loss_sum = torch.zeros((), device=self.device)
        scale = self.rt.replicas / n_kept
        on = cfg.overlap
        # unpacked_rows: our rows never restart their positions, so the attention mask is plainly causal
        with optimize_communication(overlap_all_reduce=on, overlap_reduce_scatter=on, overlap_all_gather=on,
                                    grad_reduce_dtype=GRAD_REDUCE_DTYPES[cfg.grad_reduce_dtype]), unpacked_rows():
            for i in range(0, self.local_rows, self.micro):
                with self.autocast():
                    ls, _ = self.forward(self.model, ids_l[i : i + self.micro], labels_l[i : i + self.micro],
                                         chunk_tokens=cfg.chunk_tokens)
                (ls * scale).backward()
                loss_sum += ls.detach()
            self.rt.sync_gradients(self.model)
        grad_norm = self.rt.clip_and_step(self.opt, self.model.parameters(), cfg.grad_clip)
        self.opt.zero_grad(set_to_none=True)
        self.rt.all_reduce_batch(loss_sum)
        stop = self.rt.any_rank(self.stop_requested)  # read with the record: every rank sees the same value
        self.step += 1
        return {"step": self.step, "loss": loss_sum / n_kept, "lr": lr, "grad_norm": grad_norm,
                "goldfish_drop_frac": drop_frac, "stop_requested": stop}

    def request_stop(self, signum: int | None = None, frame=None) -> None:
        """Ask ``fit`` to checkpoint and stop (a signal handler; also callable directly).

        The next step all-reduces the request; ``fit`` reads it one step later, so every rank
        checkpoints and stops at most two steps after the request.
        """
        if not self.stop_requested and signum is not None:
            print(f"[rank {self.rt.grid.rank}] {signal.Signals(signum).name}: checkpointing within two steps, "
                  "then stopping", file=sys.stderr, flush=True)
        self.stop_requested = True

    @contextmanager
    def _stop_on_signal(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, self.request_stop) for s in STOP_SIGNALS}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def fit(self, resume: bool = False, on_step: Callable[[dict], None] | None = None) -> dict:
        cfg = self.cfg
        self._fit_start = time.perf_counter()
        if resume and self.try_resume() and self.rt.is_main:
            print(f"{self.run_name}: resumed at step {self.step} of {self.total_steps} from {self.ckpt_dir}",
                  file=sys.stderr)
        run = self._wandb_init()
        bar = None
        if cfg.progress and self.rt.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.total_steps, initial=self.step, desc=self.run_name, unit="step", dynamic_ncols=True)
        pending: dict | None = None  # the last step's record, read one step late (see train_step)
        tracking = bool(cfg.track_every) and self.tracker is not None
        if tracking and self.step == 0 and not self.tracking:
            self._track(run)  # the model before training: what it extracts without having seen the targets
        with self._stop_on_signal():
            while self.step < self.total_steps:
                t_start = time.perf_counter()
                rec = self.train_step()
                rec["_t_start"] = t_start
                self.finish_checkpoint()  # a background save had the previous step to write; this one is enqueued
                stopping = False
                if pending is not None:
                    # step s took from its enqueue to step s+1's: on a GPU the loop is paced by the
                    # read of step s-1, so this is the device's step period; on a CPU, the step itself
                    stopping = self._log(pending, run, bar, t_end=t_start)
                    if on_step is not None:
                        on_step(pending)
                pending = rec
                last = self.step == self.total_steps
                evaluate = bool(cfg.eval_every) and self.step % cfg.eval_every == 0
                save = bool(cfg.checkpoint_every) and self.step % cfg.checkpoint_every == 0 and not last
                track = tracking and (self.step % cfg.track_every == 0 or last)
                if stopping or evaluate or save or last or track:  # these wait for the device anyway
                    stopping |= self._log(rec, run, bar, val_loss=self.validate if evaluate else None)
                    pending = None
                    if track:
                        self._track(run)
                    stopping &= not last  # the final step finishes the run normally
                    if save or stopping:
                        self.save_checkpoint()
                    if on_step is not None:
                        on_step(rec)
                    if stopping:
                        self._interrupt(run, bar)
        if bar is not None:
            bar.close()
        last = self.history[-1] if self.history else {}
        # the final step's scheduled validation (eval_every) already measured this model
        val_loss = last["val_loss"] if last.get("step") == self.step and "val_loss" in last else self.validate()
        if self._checkpointed_step != self.step:  # a finished run resumed: its checkpoint is this state
            self.save_checkpoint()  # (saving it again would rewrite, in place, the checkpoint LATEST names)
        self.finish_checkpoint()
        if run is not None:
            run.summary["val_loss"] = val_loss
            run.finish()
        result = {"val_loss": val_loss, "steps": self.step, "final_train_loss": self.history[-1]["loss"],
                  "train_seconds": self.train_seconds(), "history": self.history, "tracking": self.tracking}
        if self.rt.is_main:
            atomic_write_json(self.out / "train_result.json", result)
        return result

    def _interrupt(self, run, bar) -> None:
        """End ``fit`` after a stop request (the checkpoint of this step is written)."""
        self.finish_checkpoint()
        if bar is not None:
            bar.close()
        if run is not None:
            run.finish()
        raise TrainingInterrupted(self.step, self.ckpt_dir)

    def _log(self, rec: dict, run, bar, t_end: float | None = None,
             val_loss: Callable[[], float] | None = None) -> bool:
        """Read ``rec`` from the device, time it, and hand it to the history, wandb and the bar.

        The step's time runs from its enqueue (``rec["_t_start"]``) to ``t_end``, or to the end of
        the read (which waits for the step) when ``t_end`` is None; ``val_loss``, if given, runs after
        the timing.  Returns whether some rank had asked to stop when this step ran (the same
        answer on every rank).
        """
        rec.update(read_record(rec))
        for key in ("loss", "grad_norm"):  # the same values on every rank (all-reduced): every rank stops here
            if isinstance(rec.get(key), float) and not math.isfinite(rec[key]):
                self.finish_checkpoint()  # a save in flight is of an earlier, finite step
                raise NonFiniteTraining(rec["step"], f"the {key.replace('_', ' ')} is {rec[key]}", self.ckpt_dir,
                                        self._checkpointed_step)
        seconds = (t_end if t_end is not None else time.perf_counter()) - rec.pop("_t_start")
        rec["tokens_per_s"] = self.cfg.batch_size * self.rows.shape[1] / max(seconds, 1e-9)
        stop = bool(rec.pop("stop_requested", False))
        if val_loss is not None:
            rec["val_loss"] = val_loss()
        self.history.append(rec)
        if run is not None:
            run.log(rec, step=rec["step"])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")
        return stop

    def _track(self, run) -> None:
        """Run the tracker on this step's model (every rank: it may run collectives) and record it."""
        rec = {"step": self.step, **self.tracker(self.model, self.device, self.autocast)}
        self.tracking.append(rec)
        if run is not None:
            run.log({f"track/{k}": v for k, v in rec.items() if k != "step" and v is not None}, step=self.step)

    def validate(self) -> float:
        return evaluate_loss(self.model, self.val_rows[: self.cfg.eval_rows], self.rt, self.micro, self.device,
                             self.autocast, self.cfg.chunk_tokens)

    def _wandb_init(self):
        if not self.rt.is_main or os.environ.get("WANDB_MODE") == "disabled":
            return None
        import wandb

        mode = "online" if self.cfg.wandb else os.environ.get("WANDB_MODE", "offline")
        self.out.mkdir(parents=True, exist_ok=True)
        # a resumed training logs on into the run its checkpoint names (offline: the same run id, which
        # `wandb sync` joins); a new one gets a new run
        resume = {"id": self.wandb_id, "resume": "allow"} if self.wandb_id else {}
        run = wandb.init(project=self.cfg.wandb_project, name=self.run_name, dir=str(self.out), mode=mode,
                         config=_jsonable(asdict(self.cfg)), reinit="finish_previous", **resume)
        self.wandb_id = run.id
        return run


def read_record(rec: dict) -> dict:
    """``rec`` with its 0-dim tensors as floats, read from the device in one copy."""
    keys = [k for k, v in rec.items() if isinstance(v, torch.Tensor)]
    if not keys:
        return dict(rec)
    values = torch.stack([rec[k].detach().float().reshape(()) for k in keys]).tolist()
    return {**rec, **dict(zip(keys, values))}


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a host tensor to ``device``; to CUDA through pinned memory, so the copy does not wait for the stream."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))
