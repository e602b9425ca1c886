"""Adaptive extraction: attacks stronger than one greedy continuation.

For a document split into prefix ``p`` and true suffix ``s = (s_1, ..., s_S)``
(:mod:`memorization.evaluation.extraction`), with ``log p(y | p) = sum_i log p_theta(y_i | p, y_<i)``:

* **Beam search** of width ``B``: beams start as ``{()}`` with score 0; at each of ``S`` steps every beam ``y`` is
  extended by every token ``v`` with score ``log p(y) + log p_theta(v | p, y)``, and the ``B`` best of all
  extensions are kept (ties broken by the lower flat index ``beam * V + v``).  The attack succeeds when ``s`` is
  among the ``B`` final beams (``beam_match``; the verifier is assumed to recognise the true suffix among ``B``
  guesses, Hans et al. 2024's beam-search attack); ``beam_top1`` is the stricter "the best beam is ``s``".  With
  ``B >= V^(S-1)`` nothing is pruned before the last step and the ``B`` beams are the ``B`` most likely sequences
  of length ``S`` (exhaustive search).
* **Hint-counting teacher forcing**: greedy decoding that is given the true token each time it errs.  At step
  ``i`` the model sees ``p, s_<i`` (its own earlier tokens where they were right, the hints where they were
  wrong: both are ``s_<i``), predicts ``g_i = argmax_v p_theta(v | p, s_<i)``, and a hint is counted when
  ``g_i != s_i``.  Hence ``hints = sum_i 1[g_i != s_i]`` from one teacher-forced forward of ``p + s``, and
  ``longest_run`` = the longest run of consecutive ``i`` with ``g_i = s_i`` (the longest verbatim stretch the
  model produces between hints).  ``hints = 0`` is greedy exact match; few hints mean the text is nearly
  extractable by an attacker who can correct it rarely.

Both are batched with a KV cache (beam search) or one forward per batch (hints), left-padded with position ids
like :meth:`memorization.lm.LM.generate_until`, and run on an axonn grid as that does: every rank of a
replica computes the same full-vocabulary logits (the LM head gathers them) and so picks the same beams.
"""
from __future__ import annotations

import torch

from memorization.lm import cache_keyword, left_pad, logits_to_keep


def _reorder(cache, index: torch.Tensor):
    """``cache`` with its batch rows replaced by rows ``index`` (a transformers cache or a legacy tuple)."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(index)
        return cache
    return tuple(tuple(t.index_select(0, index) for t in layer) for layer in cache)


@torch.no_grad()
def beam_continue(model: torch.nn.Module, prefixes: list[list[int]], n_new: int, beam: int, batch_size: int = 32,
                  pad_id: int = 0) -> list[list[tuple[list[int], float]]]:
    """The ``beam`` best continuations of ``n_new`` tokens of every prefix by beam search (module docstring):
    ``[prefix] -> [(ids, log-prob)]``, best first, only beams of finite log-prob (fewer than ``beam`` when the
    vocabulary cannot fill them, e.g. ``beam > V`` after one step).

    Batched with a KV cache: ``batch_size`` prefixes per batch are prefilled once (last position's logits only),
    the cache is repeated ``beam`` times per prefix, and each step runs one forward of ``batch x beam`` new
    tokens and reorders the cache rows to the surviving beams' sources."""
    if beam < 1 or n_new < 1:
        raise ValueError(f"beam and n_new must be >= 1, got {beam} and {n_new}")
    device = next(model.parameters()).device
    cache_kw = cache_keyword(model)
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
    out: list[list[tuple[list[int], float]]] = [[] for _ in prefixes]
    was_training = model.training
    model.eval()
    for lo in range(0, len(order), batch_size):
        idx = order[lo:lo + batch_size]
        n = len(idx)
        ids, mask, pos = left_pad([prefixes[i] for i in idx], pad_id, device)
        res = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **logits_to_keep(model, 1))
        past = _reorder(getattr(res, cache_kw), torch.arange(n, device=device).repeat_interleave(beam))
        logp = res.logits[:, -1].float().log_softmax(-1).repeat_interleave(beam, 0)  # (n * beam, V)
        V = logp.size(-1)
        mask = mask.repeat_interleave(beam, 0)
        last = pos[:, -1:].repeat_interleave(beam, 0)
        score = torch.full((n, beam), float("-inf"), device=device)
        score[:, 0] = 0.0  # one live beam (the empty continuation); the copies start dead
        tokens = torch.zeros((n, beam, 0), dtype=torch.long, device=device)
        for step in range(n_new):
            cand = (score.unsqueeze(-1) + logp.view(n, beam, V)).view(n, beam * V)
            top, flat = _stable_topk(cand, beam)  # dead beams (-inf) sort last and stay dead
            src, tok = flat // V, flat % V
            tokens = torch.cat([tokens.gather(1, src.unsqueeze(-1).expand(-1, -1, tokens.size(-1))),
                                tok.unsqueeze(-1)], dim=-1)
            score = top
            if step == n_new - 1:
                break
            rows = (torch.arange(n, device=device).unsqueeze(1) * beam + src).view(-1)
            past = _reorder(past, rows)
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            last = last + 1
            res = model(input_ids=tok.view(-1, 1), attention_mask=mask, position_ids=last, use_cache=True,
                        **{cache_kw: past})
            past = getattr(res, cache_kw)
            logp = res.logits[:, -1].float().log_softmax(-1)
        toks, scores = tokens.cpu().tolist(), score.cpu().tolist()
        for r, i in enumerate(idx):
            out[i] = [(t, s) for t, s in zip(toks[r], scores[r]) if s != float("-inf")]
    model.train(was_training)
    return out


def _stable_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` largest values per row and their indices, ties broken by the lower index (deterministic on every
    device and rank, unlike ``topk``'s)."""
    vals, order = torch.sort(x, dim=-1, descending=True, stable=True)
    return vals[:, :k], order[:, :k]


@torch.no_grad()
def teacher_forced_argmax(model: torch.nn.Module, prefixes: list[list[int]], suffixes: list[list[int]],
                          batch_size: int = 32, pad_id: int = 0) -> list[list[bool]]:
    """Per document, ``[g_i == s_i for i in 1..S]`` with ``g_i = argmax_v p_theta(v | p, s_<i)``: one teacher-forced
    forward of ``prefix + suffix`` per batch (left-padded), logits of the last ``S + 1`` positions only."""
    device = next(model.parameters()).device
    out: list[list[bool]] = [[] for _ in prefixes]
    order = sorted(range(len(prefixes)), key=lambda i: (len(suffixes[i]), len(prefixes[i])))
    was_training = model.training
    model.eval()
    lo = 0
    while lo < len(order):  # batches of one suffix length (extraction's suffixes all have length S)
        S = len(suffixes[order[lo]])
        idx = [i for i in order[lo:lo + batch_size] if len(suffixes[i]) == S]
        lo += len(idx)
        if S == 0:
            continue
        ids, mask, pos = left_pad([list(prefixes[i]) + list(suffixes[i]) for i in idx], pad_id, device)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                       **logits_to_keep(model, S + 1)).logits
        pred = logits[:, -(S + 1):-1].argmax(-1)
        right = (pred == ids[:, -S:]).cpu().tolist()
        for r, i in enumerate(idx):
            out[i] = [bool(x) for x in right[r]]
    model.train(was_training)
    return out


def hint_stats(correct: list[bool]) -> dict:
    """``{"hints": #errors, "longest_run": longest run of consecutive correct tokens}`` of one document's
    teacher-forced argmax hits (:func:`teacher_forced_argmax`)."""
    best = run = 0
    for c in correct:
        run = run + 1 if c else 0
        best = max(best, run)
    return {"hints": sum(not c for c in correct), "longest_run": best}


def hint_counts(model: torch.nn.Module, prefixes: list[list[int]], suffixes: list[list[int]], batch_size: int = 32,
                pad_id: int = 0) -> list[dict]:
    """Hint-counting teacher forcing (module docstring): per document ``{"hints", "longest_run"}``."""
    return [hint_stats(c) for c in teacher_forced_argmax(model, prefixes, suffixes, batch_size, pad_id)]
