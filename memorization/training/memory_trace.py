"""What one rank of a training step really allocates, measured on a CPU without allocating it.

:func:`trace_train_step` runs the real trainer (:class:`memorization.training.train.Trainer`, the one
``recipes/memorize.py`` runs) for global rank 0 of a ``(D, R, C, Z)`` grid under
``FakeTensorMode`` and a fake process group (``torch.testing._internal.distributed.fake_pg``):
every tensor op produces its true shape and dtype, nothing is computed, no memory is taken,
and collectives return at once.  A dispatch mode counts the bytes of every tensor storage from
its creation until it is freed, so the peak is the peak of live tensor bytes on the rank
during one optimizer step (after a first step has created the optimizer state), which is what
:func:`axonn.planner.memory_per_gpu` predicts.  What it does not see: the CUDA caching
allocator's rounding and fragmentation, cuBLAS/NCCL workspaces and the CUDA context (the
planner's profiles keep a reserve for those).

The GPU recipe is reproduced on the CPU: bf16 autocast (CPU autocast casts the ops a Llama uses
exactly as CUDA autocast does), fused AdamW.  Two Hugging Face checks read tensor values, which
fake tensors do not have, and would take a path the real run does not (a materialised causal
mask instead of SDPA's ``is_causal``); the trace answers them as the real run does: no packed
sequences (the trainer passes no ``position_ids``) and an empty cache.

Must run in a process without ``torch.distributed`` initialised (it sets up a fake world and
tears it down); ``benchmarks/memory_validation.py`` is the command-line front end.
:func:`measure_cuda_step` runs the same step for real on one GPU and reads the CUDA caching
allocator's peak, which checks the trace itself (``memory_validation.py --cuda``).
"""
from __future__ import annotations

import os
import tempfile
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from axonn.grid_shape import GridShape


class PeakMemory(TorchDispatchMode):
    """Live bytes of tensor storages (``existing`` ones plus every op output while active) and their peak.

    At each new peak (coarsened to 0.5% steps) the live storages are summarised by
    ``(producing op, dtype, shape)``; :attr:`at_peak` is that summary, largest first.
    """

    def __init__(self, existing: list[torch.Tensor] = ()):
        super().__init__()
        self._live_storages = WeakIdKeyDictionary()
        self.live = self.peak = 0
        self._op = "existing"
        self._snapshot_at = 0
        self._snapshot: dict[tuple, list[int]] = {}
        for t in existing:
            self._track(t)
        self.base = self.live

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st in self._live_storages:
            return
        n = st.nbytes()
        self._live_storages[st] = (n, (self._op, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        weakref.finalize(st, self._free, n)
        self.live += n
        if self.live > self.peak:
            self.peak = self.live
            if self.live > self._snapshot_at * 1.005:
                self._snapshot_at = self.live
                snap: dict[tuple, list[int]] = {}
                for n_i, key in list(self._live_storages.values()):
                    c = snap.setdefault(key, [0, 0])
                    c[0] += 1
                    c[1] += n_i
                self._snapshot = snap

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._op = func.overloadpacket.__name__
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out

    @property
    def at_peak(self) -> list[tuple[str, str, tuple, int, int]]:
        """``(op, dtype, shape, count, bytes)`` of the storages live at the peak, largest first."""
        rows = [(op, dt, shape, c, b) for (op, dt, shape), (c, b) in self._snapshot.items()]
        return sorted(rows, key=lambda r: -r[4])


@dataclass
class TracedMemory:
    """One rank's memory in one training step (bytes)."""

    peak: int  # live tensor bytes at the step's peak
    params: int  # fp32 parameters (this rank's shards)
    optimizer: int  # AdamW moments
    at_peak: list[tuple[str, str, tuple, int, int]] = field(repr=False, default_factory=list)

    def table(self, top: int = 12) -> str:
        g = 2**30
        lines = [f"peak {self.peak / g:.3f} GiB: parameters {self.params / g:.3f}, AdamW state "
                 f"{self.optimizer / g:.3f}, the rest live at the peak:"]
        for op, dt, shape, c, b in self.at_peak[:top]:
            if op != "existing":
                lines.append(f"  {b / g:8.3f} GiB  {c:4d} x {dt:8s} {str(shape):24s} from {op}")
        return "\n".join(lines)


@contextmanager
def _as_in_a_real_run():
    """Answer HF's two value-reading mask checks as the trainer's real (non-fake) run does."""
    import transformers.masking_utils as mu

    saved = mu.find_packed_sequence_indices, mu._ignore_causal_mask_sdpa
    ignore = saved[1]

    def ignore_causal_mask(padding_mask, q_length, kv_length, q_offset, kv_offset, *a, **k):
        return ignore(padding_mask, q_length, kv_length, 0 if isinstance(q_offset, torch.Tensor) else q_offset,
                      kv_offset, *a, **k)

    mu.find_packed_sequence_indices = lambda position_ids: None
    mu._ignore_causal_mask_sdpa = ignore_causal_mask
    try:
        yield
    finally:
        mu.find_packed_sequence_indices, mu._ignore_causal_mask_sdpa = saved


def _trainer(size: str, seq: int, micro_batch: int, activation_checkpointing: bool, chunk_tokens: int, batch: int,
             tmp: str, runtime, model_factory, grad_reduce_dtype: str = "fp32"):
    from axonn.presets import get_preset

    from .goldfish import GoldfishConfig
    from .train import TrainConfig, Trainer

    shape = get_preset(size)
    config = shape.hf_config(attn_implementation="sdpa", max_position_embeddings=max(seq, shape.max_seq))
    rows = torch.randint(3, shape.vocab, (2 * batch, seq))
    cfg = TrainConfig(batch_size=batch, micro_batch=micro_batch, checkpoint_every=0, progress=False,
                      activation_checkpointing=activation_checkpointing, chunk_tokens=chunk_tokens,
                      grad_reduce_dtype=grad_reduce_dtype, goldfish=GoldfishConfig(k=4),
                      eval_rows=batch)  # held-out rows the trainer asks for (the trace runs no validation)
    return Trainer(model_factory(config), rows, torch.zeros_like(rows, dtype=torch.int32), rows[:batch], cfg, tmp,
                   runtime=runtime)


def measure_cuda_step(size: str, seq: int = 2048, micro_batch: int = 1, micro_steps: int = 2,
                      activation_checkpointing: bool = True, chunk_tokens: int = 4096) -> int:
    """Peak bytes the CUDA caching allocator hands out during one real step (grid 1x1x1x1, after a warm-up step).

    The same step :func:`trace_train_step` traces, on the current GPU, so the two can be compared.
    """
    import torch.distributed as dist
    from .models import causal_lm_class
    from .runtime import Runtime

    if not torch.cuda.is_available():
        raise RuntimeError("measure_cuda_step needs a CUDA GPU; trace_train_step measures the same step on a CPU")
    created = not dist.is_initialized()
    rt = Runtime.create()
    try:
        if rt.grid.world_size != 1:
            raise RuntimeError("measure_cuda_step runs one process (grid 1x1x1x1)")
        os.environ.setdefault("WANDB_MODE", "disabled")
        with tempfile.TemporaryDirectory() as tmp:
            t = _trainer(size, seq, micro_batch, activation_checkpointing, chunk_tokens, micro_batch * micro_steps,
                         tmp, rt, lambda config: causal_lm_class(config)(config))
            t.train_step()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            t.train_step()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            del t
        torch.cuda.empty_cache()
        return peak
    finally:
        if created:  # leave no world behind: trace_train_step builds its own
            dist.destroy_process_group()


def trace_train_step(size: str, grid: GridShape = GridShape(1, 1, 1, 1), seq: int = 2048,
                     micro_batch: int = 1, micro_steps: int = 2, activation_checkpointing: bool = True,
                     chunk_tokens: int = 4096, grad_reduce_dtype: str = "fp32") -> TracedMemory:
    """Peak memory of rank 0 of ``grid`` (data, row, column, depth) in one step of the trainer.

    The global batch is ``micro_batch · D · Z · micro_steps`` sequences of ``seq`` tokens, so each
    rank runs ``micro_steps`` forward/backward passes of ``micro_batch`` sequences (with 2 or
    more, the gradients of the first are live during the second, as in any accumulating run).
    ``grad_reduce_dtype``: the trainer's gradient wire dtype (``"fp32"`` or ``"bf16"``).
    """
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import axonn

    from .models import causal_lm_class
    from .runtime import Runtime

    if dist.is_initialized():
        raise RuntimeError("trace_train_step needs a process without torch.distributed initialised "
                           "(it builds a fake world): run it in a fresh process, e.g. benchmarks/memory_validation.py")
    D, R, C, Z = grid
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=D * R * C * Z)
    os.environ.setdefault("WANDB_MODE", "disabled")

    def cpu_model(config):
        model = causal_lm_class(config)(config)
        model.to = lambda *a, **k: model  # already on the CPU; fake parameters cannot be swapped in place
        return model

    try:
        with FakeTensorMode(allow_non_fake_inputs=True), _as_in_a_real_run(), tempfile.TemporaryDirectory() as tmp:
            rt = Runtime(axonn.init(D, R, C, Z))
            t = _trainer(size, seq, micro_batch, activation_checkpointing, chunk_tokens,
                         micro_batch * D * Z * micro_steps, tmp, rt, cpu_model, grad_reduce_dtype)
            t.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # the CUDA recipe's dtypes
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in t.opt.param_groups]
            t.opt = torch.optim.AdamW(groups, lr=t.cfg.lr, betas=t.cfg.betas, fused=True)  # as on CUDA
            t.train_step()  # creates the optimizer state
            params = list(t.model.parameters())
            states = [v for s in t.opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
            nbytes = lambda ts: sum(x.untyped_storage().nbytes() for x in ts)  # noqa: E731
            tracker = PeakMemory(params + states)
            with tracker:
                t.train_step()
            return TracedMemory(peak=tracker.peak, params=nbytes(params), optimizer=nbytes(states),
                                at_peak=tracker.at_peak)
    finally:
        dist.destroy_process_group()


@contextmanager
def _padded_batch():
    """HF's mask checks answered as for a padded batch (the eval CLIs pad theirs): the mask is materialised."""
    import transformers.masking_utils as mu

    saved = mu.find_packed_sequence_indices, mu._ignore_causal_mask_sdpa
    mu.find_packed_sequence_indices = lambda position_ids: None
    mu._ignore_causal_mask_sdpa = lambda *a, **k: False
    try:
        yield
    finally:
        mu.find_packed_sequence_indices, mu._ignore_causal_mask_sdpa = saved


def trace_inference(shape, grid: GridShape = GridShape(1, 1, 1, 1), batch: int = 1, context: int = 2048,
                    generate: bool = True) -> TracedMemory:
    """Peak live tensor bytes of rank 0 of ``grid`` while it evaluates ``batch`` padded sequences of ``context``
    tokens as the eval CLIs do on a grid, which :func:`axonn.planner.inference_memory_per_gpu` predicts.

    ``generate``: ``eval/extract.py --grid`` on GPUs (bf16 autocast over fp32 weights): the prefill with a KV
    cache, keeping the last position's logits, then one decoding step beside the full cache, for two batches
    in one autocast region (the second finds autocast's weight casts of the first cached, as every later batch
    of a run does).  Otherwise MIA's
    scoring in fp32 (``memorization.evaluation.mia``'s log-probabilities and Min-K%++ statistics of every position).
    ``shape``: a :class:`axonn.presets.ModelShape` or a preset name.  Runs under fake tensors and a fake
    process group like :func:`trace_train_step` (a process without ``torch.distributed`` initialised); the
    result's ``optimizer`` is 0."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import axonn
    from axonn.presets import get_preset

    from memorization.lm import cache_keyword, token_stats
    from .models import causal_lm_class

    if dist.is_initialized():
        raise RuntimeError("trace_inference needs a process without torch.distributed initialised")
    shape = get_preset(shape) if isinstance(shape, str) else shape
    D, R, C, Z = grid
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=D * R * C * Z)
    config = shape.hf_config(attn_implementation="sdpa", max_position_embeddings=max(context + 1, shape.max_seq))
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), _padded_batch(), torch.no_grad():
            model = causal_lm_class(config)(config)
            model.to = lambda *a, **k: model  # already on the CPU; fake parameters cannot be swapped in place
            model = axonn.parallelize(model, axonn.init(D, R, C, Z)).eval()
            params = list(model.parameters())
            ids = torch.randint(3, shape.vocab, (batch, context))
            mask = torch.ones(batch, context, dtype=torch.long)
            tracker = PeakMemory(params)
            if generate:
                key = cache_keyword(model)
                longer = torch.ones(batch, context + 1, dtype=ids.dtype)
                with torch.autocast("cpu", dtype=torch.bfloat16), tracker:
                    for _ in range(2):  # the second batch finds autocast's casts of the first (HF's modules) cached
                        res = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1,
                                    position_ids=torch.arange(context).expand_as(ids))
                        res = model(input_ids=ids[:, :1], attention_mask=longer, use_cache=True,
                                    position_ids=torch.full((batch, 1), context), **{key: getattr(res, key)})
                        del res
            else:
                with tracker:
                    token_stats(model, ids, mask, standardise=True)
            return TracedMemory(peak=tracker.peak, params=sum(p.untyped_storage().nbytes() for p in params),
                                optimizer=0, at_peak=tracker.at_peak)
    finally:
        dist.destroy_process_group()
