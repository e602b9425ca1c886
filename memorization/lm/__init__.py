"""One model interface for every evaluation: :class:`LM`, a causal LM in one process or on an axonn grid.

In the manner of lm-evaluation-harness's ``lm_eval.api.model.LM`` (three request types, and ``rank``/``world_size``
for splitting requests), but on token ids, which is what extraction, membership inference, perplexity and code
generation hold:

- :meth:`LM.load`: a HF model directory or an axonn training checkpoint (saved on any grid), in one process or
  parallelized on a ``"D,R,C,Z"`` grid as in training (:mod:`memorization.evaluation.eval_model` reads the files).
- :meth:`LM.token_logprobs`: ``log p(x_t | x_<t)`` of every token of a batch of sequences (one forward;
  :mod:`memorization.lm.logprobs`), and Min-K%++'s standardised log-probs.
- :meth:`LM.loglikelihood`: ``(Σ_i log p(x_i | c, x_<i), every x_i is the argmax)`` of a continuation ``x`` of a
  context ``c``.
- :meth:`LM.loglikelihood_rolling`: ``(Σ_t log p(x_t | window), scored tokens)`` of a whole document in sliding
  windows (:func:`memorization.lm.logprobs.window_spans`: every token but the first scored once).
- :meth:`LM.generate_until`: continuations decoded with a KV cache, greedy or seeded sampling
  (:mod:`memorization.lm.decoding`), each row ending where ``until`` says.

On a grid the request methods are collective: every rank passes the same requests, they are split over the grid's
data x depth replicas (:func:`memorization.training.runtime.map_over_replicas`: equal shares, so every depth rank runs
the same forwards), each replica's row x column ranks run the sharded model on its share together, and every rank
returns every result, in the requests' order -- the results of one process.  A caller that splits work itself
(e.g. extraction, whose per-document records hold several requests) calls :meth:`LM.over_replicas` and, inside
it, the requests of :attr:`LM.local`, the same model with nothing split.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .batching import left_pad, pad_batch
from .decoding import Sampling, cache_keyword, cache_nbytes, decode, logits_to_keep, row_seed, sampler
from .logprobs import continuation_scores, token_stats, vocab_sharded_head, window_spans

__all__ = ["LM", "Sampling", "as_lm", "cache_keyword", "cache_nbytes", "left_pad", "logits_to_keep", "pad_batch",
           "row_seed", "token_stats", "until_tokens", "vocab_sharded_head", "window_spans"]

#: ``until(tokens generated so far) -> None`` (go on) or the number of those tokens the row keeps (it is done)
Until = Callable[[list[int]], "int | None"]


class LM:
    """A causal LM for evaluation: ``model`` (a HF causal LM, or one parallelized on ``grid`` with every rank
    holding its shards), its ``tokenizer`` (or None: token ids only) and ``grid`` (None: one process).
    ``runtime``: the :class:`memorization.training.runtime.Runtime` that made ``grid``, when :meth:`load` made it."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any | None = None, grid=None, *,
                 device: torch.device | str | None = None, runtime=None, split: bool = True) -> None:
        self.model, self.tokenizer, self.grid, self.runtime = model, tokenizer, grid, runtime
        self._device = torch.device(device) if device is not None else None
        self._split = split

    @classmethod
    def load(cls, path: str | os.PathLike, *, grid=None, device: str | torch.device | None = None,
             dtype: str | torch.dtype | None = "auto", tokenizer_path: str | os.PathLike | None = None,
             require_tokenizer: bool = True, flag: str = "--model") -> LM:
        """The model of ``path``: a HF directory (checked first, a damaged one is one line naming the file) in
        one process on ``device`` in ``dtype`` (:func:`memorization.evaluation.eval_model.load_checkpoint`); or with
        ``grid`` (``"D,R,C,Z"`` under torchrun/mpiexec/srun, or a :class:`memorization.training.runtime.Runtime`) a HF
        directory or an axonn training checkpoint parallelized on it, each rank reading its own shards
        (:func:`memorization.evaluation.eval_model.load_on_grid`).  The tokenizer is ``tokenizer_path``'s or the
        model's; a missing one is :class:`memorization.evaluation.eval_model.MissingTokenizerError` if
        ``require_tokenizer``, else None.  ``flag`` names ``path`` in errors."""
        from memorization.evaluation.eval_model import grid_runtime, load_checkpoint, load_on_grid

        if grid is None:
            model, tok = load_checkpoint(path, device=device, dtype=dtype, tokenizer_path=tokenizer_path,
                                         require_tokenizer=require_tokenizer, flag=flag)
            return cls(model, tok)
        rt = grid_runtime(grid) if isinstance(grid, str) else grid
        model, tok = load_on_grid(path, rt, tokenizer_path, flag, require_tokenizer)
        return cls(model, tok, rt.grid, runtime=rt)

    # ---- where it runs -------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank on the grid (0 in one process)."""
        return 0 if self.grid is None else self.grid.rank

    @property
    def world_size(self) -> int:
        """Processes of the grid (1 in one process)."""
        return 1 if self.grid is None else self.grid.world_size

    @property
    def replicas(self) -> int:
        """Model replicas the requests are split over: the grid's data x depth size (1 in one process)."""
        return 1 if self.grid is None else self.grid.size(("data", "depth"))

    @property
    def device(self) -> torch.device:
        from memorization.evaluation.eval_model import model_device

        return self._device or model_device(self.model)

    @property
    def context(self) -> int | None:
        """The model's context (:func:`memorization.training.models.model_context`), None if unknown."""
        from memorization.training.models import model_context

        return model_context(self.model)

    @property
    def max_length(self) -> int:
        """The default scoring window (:func:`memorization.evaluation.eval_model.model_max_length`)."""
        from memorization.evaluation.eval_model import model_max_length

        return model_max_length(self.model)

    @property
    def vocab_size(self) -> int | None:
        from memorization.evaluation.eval_model import vocab_size

        return vocab_size(self.model)

    @property
    def local(self) -> LM:
        """The same model whose requests run on what they are given, unsplit (for a caller inside
        :meth:`over_replicas`); stopping decisions still agree over the grid."""
        return LM(self.model, self.tokenizer, self.grid, device=self._device, runtime=self.runtime, split=False)

    def over_replicas(self, fn: Callable[[list], list], items: list) -> list:
        """``fn(items)``, on a grid computed by its replicas together, each on its share, every rank returning
        every result (:func:`memorization.training.runtime.map_over_replicas`); ``fn`` returns one result per item."""
        if self.grid is None or not self._split:
            return fn(items)
        from memorization.training.runtime import map_over_replicas

        return map_over_replicas(fn, items, self.grid)

    # ---- requests --------------------------------------------------------------------------------------------
    def token_logprobs(self, seqs: Sequence[Sequence[int]], *, standardise: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``(logp, z, valid)`` of one forward of ``seqs`` right-padded (:func:`memorization.lm.logprobs.token_stats`):
        ``logp[b, t-1] = log p(x_t | x_<t)``, Min-K%++'s ``z`` with ``standardise`` (else None), ``valid`` where
        ``x_t`` and ``x_{t-1}`` are real tokens.  Runs on this rank's batch (on a grid its replica's ranks pass
        the same ``seqs``)."""
        ids, mask = pad_batch(seqs, self.device)
        return token_stats(self.model, ids, mask, standardise)

    def loglikelihood(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]], *, batch_size: int = 8,
                      max_length: int | None = None) -> list[tuple[float, bool]]:
        """Per ``(context, continuation)`` request, ``(Σ_i log p(x_i | c, x_<i), every x_i is the argmax)`` over
        the continuation's tokens ``x``, the model seeing the last ``max_length + 1`` tokens of ``c + x`` (default
        :attr:`max_length`); longest first in batches of ``batch_size``."""
        L = int(max_length or self.max_length)

        def score(share: list) -> list[tuple[float, bool]]:
            seqs = [(list(ctx) + list(cont))[-(L + 1):] for ctx, cont in share]
            lens = [len(cont) for _, cont in share]
            order = sorted(range(len(share)), key=lambda i: -len(seqs[i]))
            out: list[tuple[float, bool]] = [(0.0, False)] * len(share)
            for s in range(0, len(order), batch_size):
                idx = order[s:s + batch_size]
                for i, r in zip(idx, continuation_scores(self.model, [seqs[i] for i in idx], [lens[i] for i in idx])):
                    out[i] = r
            return out

        return self.over_replicas(score, list(requests))

    def loglikelihood_rolling(self, docs: Sequence[Sequence[int]], *, max_length: int | None = None,
                              stride: int | None = None, batch_size: int = 8, progress: bool = False
                              ) -> list[tuple[float, int]]:
        """Per document, ``(Σ_t log p(x_t | its window), scored tokens)`` over the sliding windows of
        :func:`memorization.lm.logprobs.window_spans` (length ``max_length``, default :attr:`max_length`; stride
        default ``max_length // 2``): every token but the first scored once, a document of fewer than 2 tokens
        ``(0.0, 0)``.  The windows of all documents are batched together, longest first; a window's sum is taken in
        float32, the document's over its windows in float64, in window order."""
        L = int(max_length if max_length is not None else self.max_length)
        S = int(stride if stride is not None else max(1, L // 2))
        windows = [(d, list(x[b:e]), first) for d, x in enumerate(docs) for b, e, first in window_spans(len(x), L, S)]
        dev = self.device

        def window_logp(share: list[tuple[int, list[int], int]]) -> list[tuple[float, int]]:
            from tqdm.auto import tqdm

            order = sorted(range(len(share)), key=lambda i: -len(share[i][1]))
            out: list[tuple[float, int]] = [(0.0, 0)] * len(share)
            starts = range(0, len(order), batch_size)
            for s in tqdm(starts, desc="perplexity", unit="batch", disable=not progress or len(starts) <= 1):
                idx = order[s : s + batch_size]
                batch = [share[i] for i in idx]
                logp, _, valid = self.token_logprobs([w[1] for w in batch])
                first = torch.tensor([w[2] for w in batch], device=dev)
                col = torch.arange(logp.size(1), device=dev)[None, :]  # logp[:, c] scores window position c + 1
                scored = valid & (col >= (first[:, None] - 1))
                sums = (logp * scored).sum(dim=1).double().tolist()
                for i, v, c in zip(idx, sums, scored.sum(dim=1).tolist()):
                    out[i] = (v, c)
            return out

        per_window = self.over_replicas(window_logp, windows) if windows else []
        totals, counts = [0.0] * len(docs), [0] * len(docs)
        for (d, _, _), (v, c) in zip(windows, per_window):
            totals[d] += v
            counts[d] += c
        return list(zip(totals, counts))

    def generate_until(self, prefixes: Sequence[Sequence[int]], max_new_tokens: int, *, until: Until | None = None,
                       sampling: Sampling | None = None, seeds: Sequence[int] | None = None, batch_size: int = 32,
                       pad_id: int = 0, progress: bool = False, desc: str = "generate",
                       on_cache: Callable[[Any], None] | None = None) -> list[list[int]]:
        """Up to ``max_new_tokens`` tokens after each prefix, batched with a KV cache
        (:func:`memorization.lm.decoding.decode`): greedy, or with ``sampling`` seeded per prefix by ``seeds``
        (:func:`memorization.lm.decoding.row_seed`).  ``until`` is asked about each row's tokens before every
        further step and after the last, until it returns how many of them the row keeps; in one process a row done
        leaves its batch (the others decode on without it) and equal prefixes of a batch share one prefill; on a
        grid a batch stops when every row of every replica's batch is.  A row never done keeps all its tokens."""
        if sampling is not None and (seeds is None or len(seeds) != len(prefixes)):
            raise ValueError("sampling needs one seed per prefix")
        grid = self.grid
        alone = grid is None or grid.world_size == 1  # else every replica runs the same forwards, whole batches

        def generate(share: list[tuple[int, Sequence[int]]]) -> list[list[int]]:
            ends: dict[int, int] = {}  # row of the share -> tokens it keeps

            def stop(generated: torch.Tensor, rows: list[int]) -> bool | list[bool]:
                for r, k in enumerate(rows):
                    if k not in ends:
                        keep = until(generated[r].tolist())
                        if keep is not None:
                            ends[k] = keep
                if alone:  # the rows done leave the batch
                    return [k in ends for k in rows]
                going = torch.tensor([float(any(k not in ends for k in rows))])
                import torch.distributed as dist

                dist.all_reduce(going, op=dist.ReduceOp.MAX)
                return not bool(going.item())

            pick = None if sampling is None else sampler(sampling, [seeds[i] for i, _ in share])
            out = decode(self.model, [p for _, p in share], max_new_tokens, batch_size, pad_id,
                         progress=progress and self.rank == 0, on_cache=on_cache, pick=pick,
                         stop=None if until is None else stop, desc=desc, share_prefixes=alone)
            if until is not None:  # the last token is asked about after the loop
                for k, toks in enumerate(out):
                    if k not in ends:
                        keep = until(toks)
                        ends[k] = len(toks) if keep is None else keep
            return [toks[:ends.get(k, len(toks))] for k, toks in enumerate(out)]

        return self.over_replicas(generate, list(enumerate(prefixes)))


def until_tokens(stops: Sequence[Sequence[int]], eos_id: int | None = None) -> Until:
    """An ``until`` for :meth:`LM.generate_until` that ends a row at the first of the token sequences ``stops``
    (kept tokens: those before it) or at ``eos_id`` (kept: those before it)."""
    stops = [list(s) for s in stops if len(s)]

    def until(tokens: list[int]) -> int | None:
        ends = [i for s in stops for i in range(len(tokens) - len(s) + 1) if tokens[i:i + len(s)] == s]
        if eos_id is not None and eos_id in tokens:
            ends.append(tokens.index(eos_id))
        return min(ends) if ends else None

    return until


def as_lm(model: torch.nn.Module | LM, tokenizer: Any | None = None, grid=None,
          device: torch.device | str | None = None) -> LM:
    """``model`` if it is an :class:`LM`, else an :class:`LM` of it (``tokenizer``, ``grid``, ``device``)."""
    return model if isinstance(model, LM) else LM(model, tokenizer, grid, device=device)
