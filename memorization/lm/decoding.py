"""Batched decoding with a KV cache: the loop, its token choice (argmax or seeded sampling) and the cache's names.

:func:`decode` sorts the prefixes by length, left-pads each batch (:func:`memorization.lm.batching.left_pad`),
runs one forward of the prefixes keeping only the last position's logits, then one forward of one new token per
row per step, the KV cache carrying the rest (a :class:`~memorization.lm.kv_cache.GrowingCache`: written in place,
not copied at every step).  The next token is ``pick(logits, rows)``: the argmax by default, or
:func:`sampler`'s seeded Gumbel-max draw.

Sampling (:class:`Sampling`): the next token is ``argmax(logits / T + g)`` over the tokens kept by the top-k
filter (the ``k`` most likely; 0: all) and then the nucleus (the most likely tokens whose probabilities sum to
``top_p``, as ``transformers``' top-p warper keeps them), where ``g`` is Gumbel noise ``-log(-log u)`` from a
generator seeded by the row's seed alone and advanced once per step.  So a row's draws do not depend on the batch
it shares, its place in the call or the grid (every rank of a replica draws the same).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .batching import left_pad

#: ``pick(last logits (batch, V), rows) -> next tokens (batch, 1)``; ``rows`` are the batch's rows' places in
#: the call's prefixes
Pick = Callable[[torch.Tensor, list[int]], torch.Tensor]


def logits_to_keep(model: torch.nn.Module, n: int) -> dict:
    """Keyword making an HF causal LM compute logits for its last ``n`` positions only (``logits_to_keep``;
    ``num_logits_to_keep`` in older transformers), or ``{}`` when its ``forward`` takes neither."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return next(({k: n} for k in ("logits_to_keep", "num_logits_to_keep") if k in params), {})


def cache_keyword(model: torch.nn.Module) -> str:
    """The name of the KV cache, as ``forward``'s keyword and its output's field: ``cache`` in
    transformers >= 5.2x, ``past_key_values`` before (still accepted there, with a deprecation warning)."""
    try:
        return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    except (TypeError, ValueError):
        return "past_key_values"


def cache_nbytes(cache: Any) -> int:
    """Bytes of the keys and values a transformers KV cache holds, every layer: ``DynamicCache.layers[i]``'s
    ``keys`` and ``values`` (transformers 5), its ``key_cache``/``value_cache`` lists (4.x), or a legacy tuple of
    ``(key, value)`` pairs."""
    if hasattr(cache, "layers"):
        tensors = [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    elif hasattr(cache, "key_cache"):
        tensors = [*cache.key_cache, *cache.value_cache]
    else:
        tensors = [t for pair in cache for t in pair]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def argmax_pick(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """Greedy decoding's choice: the most likely token of each row."""
    return logits.argmax(-1, keepdim=True)


@dataclass(frozen=True)
class Sampling:
    """Seeded sampling (module docstring): ``temperature`` > 0, ``top_k`` (0: no top-k filter), ``top_p`` (1: no
    nucleus); ``noise_on_cpu`` draws the uniform noise on the CPU (else on the logits' device: another stream of
    numbers on a GPU, the same on a CPU)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    noise_on_cpu: bool = False

    def __post_init__(self) -> None:
        if not self.temperature > 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"sampling needs temperature > 0, top_k >= 0 and 0 < top_p <= 1, got "
                             f"{self.temperature}, {self.top_k}, {self.top_p}")


def row_seed(seed: int, key: int, sample: int) -> int:
    """The generator seed of sample ``sample`` of the prefix whose key is ``key`` (e.g. the crc32 of its id)."""
    return hash((seed, key, sample)) & (2**63 - 1)


def nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """``scores`` (``(rows, V)`` logits / T) with every token outside the top-p nucleus set to -inf: a token is kept
    when the probability of the tokens more likely than it is below ``top_p`` (the most likely one always)."""
    if top_p >= 1.0:
        return scores
    probs, order = scores.softmax(-1).sort(dim=-1, descending=True)
    before = probs.cumsum(-1) - probs
    drop = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, before > top_p)
    return scores.masked_fill(drop, float("-inf"))


def sampler(sampling: Sampling, seeds: Sequence[int]) -> Pick:
    """The :data:`Pick` of ``sampling`` for a call whose row ``r`` has generator seed ``seeds[r]`` (module
    docstring); each row's generator is made at its first draw and advanced once per step."""
    gens: dict[int, torch.Generator] = {}

    def draw(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
        scores = logits.float() / sampling.temperature
        if 0 < sampling.top_k < scores.size(-1):
            kth = scores.topk(sampling.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        scores = nucleus(scores, sampling.top_p)
        where = torch.device("cpu") if sampling.noise_on_cpu else scores.device
        noise = torch.empty_like(scores)
        for r, k in enumerate(rows):
            if k not in gens:
                gens[k] = torch.Generator(device=where).manual_seed(seeds[k])
            noise[r] = torch.rand(scores.size(-1), generator=gens[k], device=where).to(scores.device)
        gumbel = -torch.log(-torch.log(noise.clamp(min=1e-20)))
        return (scores + gumbel).argmax(-1, keepdim=True)

    return draw


def select_rows(cache: Any, index: torch.Tensor) -> Any:
    """The KV cache of the batch rows ``index`` (in that order; a row may repeat): a transformers ``Cache`` is
    changed in place (``reorder_cache``), a legacy tuple of ``(key, value)`` pairs is rebuilt."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    return tuple(tuple(t.index_select(0, index.to(t.device)) for t in layer) for layer in cache)


def growing_cache(model: torch.nn.Module, keyword: str, room: int) -> dict:
    """``{keyword: cache}``: a :class:`~memorization.lm.kv_cache.GrowingCache` for ``model``'s prefill with room for
    ``room`` decoded tokens, or ``{}`` (the model makes its own cache) where transformers' layered ``DynamicCache``
    or a config is missing."""
    config = getattr(model, "config", None)
    if keyword not in ("past_key_values", "cache") or config is None:  # (``cache``: transformers 5's name)
        return {}
    try:
        from .kv_cache import GrowingCache

        return {keyword: GrowingCache(config, room)}
    except (ImportError, TypeError, AttributeError, KeyError):
        return {}


#: ``stop(generated (rows, t), rows) ->`` True (the batch is done), False (go on) or one flag per row (drop the rows
#: flagged: they are done)
Stop = Callable[[torch.Tensor, list[int]], "bool | Sequence[bool]"]


@torch.no_grad()
def decode(model: torch.nn.Module, prefixes: Sequence[Sequence[int]], n_new: int, batch_size: int = 32,
           pad_id: int = 0, progress: bool = False, on_cache: Callable[[Any], None] | None = None,
           pick: Pick | None = None, stop: Stop | None = None, desc: str = "generate",
           share_prefixes: bool = False) -> list[list[int]]:
    """Continuations of ``n_new`` tokens of every prefix, batched with a KV cache (module docstring).

    The prefill forward keeps only the last position's logits: all of them would be
    batch x prefix x vocab (32 x 2,048 x 128,256 in bf16 = 16.8 GB).  ``on_cache`` is called with each batch's
    KV cache after its last decoding step, when it holds the longest prefix and ``n_new - 1`` generated
    positions per sequence (:func:`cache_nbytes` measures it).  ``pick(logits, rows)`` chooses the next tokens
    (default :func:`argmax_pick`).  ``stop(generated, rows)`` (:data:`Stop`), called with the ``(rows, t)`` tokens
    the batch's rows still decoding have generated before each further step, ends the batch early when it returns
    True (its continuations are then ``t`` tokens long) or, returning one flag per row, drops the rows flagged
    (their continuations end there; the others go on in a smaller batch, their cache rows selected).
    ``share_prefixes``: equal prefixes of a batch (samples of one prompt) are run through the prefill once and
    their cache rows copied (a cache with ``reorder_cache`` or a legacy tuple)."""
    device = next(model.parameters()).device
    keep_last, cache = logits_to_keep(model, 1), cache_keyword(model)
    choose = pick or argmax_pick
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
    out: list[list[int]] = [[] for _ in prefixes]
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc=desc, unit="batch")
    was_training = model.training
    model.eval()
    for idx in batches:
        ids, mask, pos = left_pad([prefixes[i] for i in idx], pad_id, device)
        grow = growing_cache(model, cache, n_new)  # the prefill's cache, with room for the n_new tokens to come
        first: dict[tuple[int, ...], int] = {}  # prefix -> its row in the prefill
        inverse = [first.setdefault(tuple(prefixes[i]), len(first)) if share_prefixes else r
                   for r, i in enumerate(idx)]
        if len(first) and len(first) < len(idx):
            uniq = torch.tensor([inverse.index(u) for u in range(len(first))], device=device)
            res = model(input_ids=ids[uniq], attention_mask=mask[uniq], position_ids=pos[uniq], use_cache=True,
                        **keep_last, **grow)
            expand = torch.tensor(inverse, device=device)
            past, logits = select_rows(getattr(res, cache), expand), res.logits[:, -1].index_select(0, expand)
        else:
            res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep_last, **grow)
            past, logits = getattr(res, cache), res.logits[:, -1]
        live = list(range(len(idx)))  # the batch's rows still decoding
        gen: list[list[int]] = [[] for _ in idx]
        nxt = choose(logits, idx)
        last = pos[:, -1:]
        for _ in range(n_new):
            for r, t in zip(live, nxt[:, 0].tolist()):
                gen[r].append(t)
            if len(gen[live[0]]) == n_new:
                break
            if stop is not None:  # one decoding step per new token, the live rows at once
                verdict = stop(torch.tensor([gen[r] for r in live]), [idx[r] for r in live])
                if isinstance(verdict, bool):
                    if verdict:
                        break
                elif any(verdict):
                    keep = [k for k, done in enumerate(verdict) if not done]
                    if not keep:
                        break
                    sel = torch.tensor(keep, device=device)
                    past, mask, last, nxt = select_rows(past, sel), mask[sel], last[sel], nxt[sel]
                    live = [live[k] for k in keep]
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            last = last + 1
            res = model(input_ids=nxt, attention_mask=mask, position_ids=last, use_cache=True, **{cache: past})
            past = getattr(res, cache)
            nxt = choose(res.logits[:, -1], [idx[r] for r in live])
        if on_cache is not None:
            on_cache(past)
        for r, i in enumerate(idx):
            out[i] = gen[r]
    model.train(was_training)
    return out
