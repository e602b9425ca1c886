"""lm-eval on a 4D grid: a model parallelized by axonn, wrapped as an lm-evaluation-harness ``LM``.

:class:`GridLM` is lm-eval's own ``HFLM`` for everything textual -- tokenisation, the context/continuation split,
rolling windows, stop sequences, decoding -- so its requests become exactly the token sequences the single-process
``HFLM`` scores.  Only the model calls are ours, written for a grid:

- **log-likelihoods** (``loglikelihood``, ``loglikelihood_rolling``): :meth:`memorization.lm.LM.loglikelihood`: the
  token requests are split over the grid's data x depth replicas (equal shares, so every depth rank runs the
  same forwards), a replica's row x column ranks score its share together, longest first in batches of
  ``batch_size``.  For a request with context ``c`` and continuation ``x_1..x_m`` (the last ``max_length + 1``
  tokens of ``c + x``), ``log p = Σ_i log p(x_i | c, x_<i)`` and ``is_greedy`` is true iff every ``x_i`` has the
  largest logit.  With a vocabulary-sharded LM head both come from each rank's shard of the logits
  (:func:`axonn.intra_layer.vocab_parallel_logprobs`, :func:`axonn.intra_layer.vocab_parallel_is_max`): no rank
  holds the whole vocabulary.
- **generation** (``generate_until``): requests split over the replicas the same way; greedy decoding with the KV
  cache (:meth:`memorization.lm.LM.generate_until`, ``max_gen_toks`` steps, tokens after an end-of-text
  token dropped) returns the token ids ``HFLM`` decodes and cuts at the stop sequences.  Sampling
  (``do_sample``/``temperature > 0``) is refused: draws from ``transformers``' sampler cannot be reproduced.

Every rank returns every result, so lm-eval's metrics are computed on every rank from the same numbers.
"""
from __future__ import annotations

from typing import Any

import torch
from lm_eval.models.huggingface import HFLM

from memorization.lm import LM

__all__ = ["GridLM"]


class GridLM(HFLM):
    """lm-eval's ``HFLM`` whose model calls are ``lm``'s (module docstring).

    ``lm``: a :class:`memorization.lm.LM` on a grid (every rank holds its shards of the model) with the
    checkpoint's tokenizer.  ``batch_size`` sequences per forward on each replica; ``max_length`` the context (as
    ``HFLM``'s)."""

    def __init__(self, lm: LM, batch_size: int = 8, max_length: int | None = None, max_gen_toks: int = 256) -> None:
        super().__init__(pretrained=lm.model, tokenizer=lm.tokenizer, batch_size=batch_size, max_length=max_length,
                         max_gen_toks=max_gen_toks, backend="causal", logits_cache=False)
        self.grid = lm.grid
        self.lm = lm

    def _loglikelihood_tokens(self, requests: list, disable_tqdm: bool = False, override_bs: int | None = None
                              ) -> list[tuple[float, bool]]:
        results = self.lm.loglikelihood([(ctx, cont) for _, ctx, cont in requests],
                                        batch_size=int(override_bs or self.batch_size), max_length=self.max_length)
        for (key, _, _), r in zip(requests, results):
            if key is not None:  # rolling windows carry no (context, continuation) key
                self.cache_hook.add_partial("loglikelihood", key, r)
        return results

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        for req in requests:
            kw = req.args[1] if len(req.args) > 1 else {}
            if kw.get("do_sample") or float(kw.get("temperature") or 0.0) > 0:
                raise ValueError("lm-eval generation on a grid is greedy only (the task asks for sampling: "
                                 f"{ {k: kw[k] for k in ('do_sample', 'temperature') if k in kw} }); run it in one "
                                 "process, or set the task's generation_kwargs to do_sample: false")
        parent = super()

        def generate(share: list) -> list[str]:
            return parent.generate_until(share, disable_tqdm=True)

        return self.lm.over_replicas(generate, list(requests))

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **kwargs: Any
                        ) -> torch.Tensor:
        """``context`` (left-padded, ``attention_mask`` in ``kwargs``) followed by ``max_length - width`` greedy
        tokens per row; after a row's first end-of-text token, only end-of-text tokens."""
        mask = kwargs.get("attention_mask")
        mask = torch.ones_like(context) if mask is None else mask
        rows = [row[m.bool()].tolist() for row, m in zip(context, mask)]
        n_new = max_length - context.size(1)
        gen = torch.tensor(self.lm.local.generate_until(rows, n_new, batch_size=len(rows)), dtype=context.dtype,
                           device=context.device)
        eot = self.eot_token_id
        ended = (gen == eot).long().cummax(dim=1).values.bool()
        gen = gen.masked_fill(ended, eot)
        return torch.cat([context, gen], dim=1)
