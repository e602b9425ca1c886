"""Held-out perplexity of a causal LM over a set of documents, in sliding windows.

Token-weighted perplexity over a set of held-out documents::

    PPL = exp( sum_d sum_{t in scored(d)} -log p(x_t | context_t) / sum_d |scored(d)| )

Every token of a document except the first (no context; prepend BOS to score it) is scored
exactly once.  A document longer than the context length ``L`` is split into sliding
windows: window ``w`` covers ``x[b_w : b_w + L]`` with ``b_w = w * S`` (stride ``S <= L``) and
scores only the tokens the previous window has not scored, so each scored token after the
first window sees at least ``L - S`` tokens of context (Hugging Face's "perplexity of
fixed-length models" recipe, with every window after the first a full ``L`` tokens).  A document
that fits in one window is scored in one window, and the result then equals the plain ``exp(mean NLL)``.
Windows of all documents are batched together (padding + attention mask, one forward pass per batch).

Defaults: ``L`` = the model's context length capped at 4096 (Llama 3.1 declares 131072),
``S = L // 2`` (``S`` must be below ``L``; ``S = L - 1`` gives the cheapest run, windows
overlapping by one token).  Sources: a ``.jsonl`` file (one ``{"text": ...}`` per line), a ``.txt``
file (one document), a ``.json`` list of strings / ``{"text"}`` objects, or a manifest (its
``nonmembers``: held-out documents of the training distribution; their ``token_ids`` are
used as given).
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memorization.eval_model import MissingTokenizerError, as_id_lists, check_vocab, model_device, model_max_length
from memorization.mia.scoring import pad_batch, sequence_token_logprobs
from memorization.mixture import check_manifest_doc
from memorization.models import model_context


def window_spans(n_tokens: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """Sliding windows over a document of ``n_tokens`` tokens.

    Returns ``(begin, end, first)`` triples: the window is ``x[begin:end]`` and its targets
    ``x[begin+first : end]`` are scored.  The first window is ``x[0:min(L, n)]`` and scores
    tokens ``1..end-1``; each next window scores the next ``S`` tokens (fewer at the end) and
    is the ``L`` tokens ending at its last target, so every scored token sees at least
    ``L - S >= 1`` tokens of context.  Together the windows score tokens ``1 .. n-1``
    exactly once each.  Requires ``1 <= S <= L - 1``.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    if not 1 <= stride <= max_length - 1:
        raise ValueError(
            f"stride must be in [1, max_length - 1 = {max_length - 1}] so that every scored "
            f"token has context, got {stride}")
    if n_tokens < 2:
        return []
    end = min(max_length, n_tokens)
    spans: list[tuple[int, int, int]] = [(0, end, 1)]
    while end < n_tokens:
        prev_end, end = end, min(end + stride, n_tokens)
        begin = max(0, end - max_length)
        spans.append((begin, end, prev_end - begin))
    return spans


@torch.no_grad()
def perplexity(
    model: torch.nn.Module,
    docs: Sequence[Sequence[int]] | Sequence[torch.Tensor] | torch.Tensor,
    *,
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    progress: bool = True,
    grid=None,
) -> dict[str, Any]:
    """Token-weighted sliding-window perplexity of ``model`` on token-id documents.

    With ``grid`` (an axonn grid ``model`` is parallelized on) the windows are split over its data x depth
    replicas (:func:`memorization.runtime.map_over_replicas`: equal shares, so every depth rank runs the same
    forwards) and every rank returns the whole result.

    Args:
        model: causal LM returning ``.logits``, already on ``device``.
        docs: token-id lists, one per document (include BOS yourself if it should be used).
        max_length: window length ``L`` (default: model context length, capped at 4096).
        stride: window stride ``S`` (default ``L // 2``), ``1 <= S <= L - 1``.
        batch_size: windows per forward pass.
        device: default: the model's device.

    Returns:
        ``{"perplexity": exp(nll), "nll": mean NLL per scored token (nats), "n_tokens",
        "n_docs", "n_windows", "max_length", "stride", "doc_nll": per-document mean NLL}``.
    """
    for name, v in (("max_length", max_length), ("stride", stride), ("batch_size", batch_size)):
        if v is not None and int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    from tqdm.auto import tqdm

    check_context(max_length, model_context(model))
    dev = torch.device(device) if device is not None else model_device(model)
    max_length = int(max_length if max_length is not None else model_max_length(model))
    stride = int(stride if stride is not None else max(1, max_length // 2))
    ids = as_id_lists(docs)
    check_vocab(model, ids, "perplexity")
    windows: list[tuple[int, list[int], int]] = []  # (doc index, window ids, first scored)
    for d, x in enumerate(ids):
        for b, e, first in window_spans(len(x), max_length, stride):
            windows.append((d, x[b:e], first))
    if not windows:
        raise ValueError("no document has 2 or more tokens: nothing to score")

    def window_nll(share: list[tuple[int, list[int], int]]) -> list[tuple[float, int]]:
        """(summed NLL, scored tokens) of each window, longest windows batched first."""
        order = sorted(range(len(share)), key=lambda i: -len(share[i][1]))
        out: list[tuple[float, int]] = [(0.0, 0)] * len(share)
        starts = range(0, len(order), batch_size)
        for s in tqdm(starts, desc="perplexity", unit="batch", disable=not progress or len(starts) <= 1):
            idx = order[s : s + batch_size]
            batch = [share[i] for i in idx]
            input_ids, attn = pad_batch([w[1] for w in batch], dev)
            logp, valid = sequence_token_logprobs(model, input_ids, attn)
            first = torch.tensor([w[2] for w in batch], device=dev)
            # logp[:, c] scores target position c + 1 of the window
            col = torch.arange(logp.size(1), device=dev)[None, :]
            scored = valid & (col >= (first[:, None] - 1))
            sums = (-(logp * scored).sum(dim=1).double()).tolist()
            for i, v, c in zip(idx, sums, scored.sum(dim=1).tolist()):
                out[i] = (v, c)
        return out

    if grid is None:
        per_window = window_nll(windows)
    else:
        from memorization.runtime import map_over_replicas

        per_window = map_over_replicas(window_nll, windows, grid)
    doc_sum = np.zeros(len(ids), dtype=np.float64)
    doc_cnt = np.zeros(len(ids), dtype=np.int64)
    doc_idx = np.array([w[0] for w in windows])
    np.add.at(doc_sum, doc_idx, np.array([v for v, _ in per_window], dtype=np.float64))
    np.add.at(doc_cnt, doc_idx, np.array([c for _, c in per_window], dtype=np.int64))
    n_tok = int(doc_cnt.sum())
    nll = float(doc_sum.sum() / n_tok)
    with np.errstate(invalid="ignore", divide="ignore"):
        doc_nll = np.where(doc_cnt > 0, doc_sum / np.maximum(doc_cnt, 1), np.nan)
    return {
        "perplexity": math.exp(nll),
        "nll": nll,
        "n_tokens": n_tok,
        "n_docs": int((doc_cnt > 0).sum()),
        "n_windows": len(windows),
        "max_length": max_length,
        "stride": stride,
        "doc_nll": doc_nll,
    }


def check_context(max_length: int | None, ctx: int | None) -> None:
    """A window longer than the model's context would score positions it was never trained on."""
    if max_length is not None and ctx and int(max_length) > ctx:
        raise ValueError(f"max_length {max_length} exceeds the model's context ({ctx} tokens: "
                         "max_position_embeddings, or the trained length of a model trained from scratch)")



def existing_source(source: str | os.PathLike) -> Path:
    p = Path(source)
    if not p.is_file():
        raise FileNotFoundError(f"perplexity source {str(p)!r} does not exist")
    return p


def load_perplexity_docs(
    source: str | os.PathLike, *, text_key: str = "text"
) -> tuple[list[str], list[list[int]] | None]:
    """Read held-out documents for :func:`perplexity`.

    ``source`` is a manifest (a JSON object with ``nonmembers``), a ``.json`` list of strings or
    ``{text_key: ...}`` objects, a ``.jsonl`` file with one ``{text_key: ...}`` per line, or a
    ``.txt`` file (one document).  Returns ``(texts, token_ids)``; ``token_ids`` is only
    given for a manifest whose nonmembers all carry them.
    """
    p = existing_source(source)
    if p.suffix == ".jsonl":
        texts = []
        with open(p, encoding="utf-8") as fh:
            for ln, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"{p}:{ln}: expected a JSON object with a {text_key!r} field, "
                                     f"got {type(row).__name__}")
                if text_key not in row:
                    raise ValueError(f"{p}:{ln}: no {text_key!r} field (use --text-key)")
                if not isinstance(row[text_key], str):
                    raise ValueError(f"{p}:{ln}: {text_key!r} is a {type(row[text_key]).__name__}, "
                                     "not a string")
                texts.append(row[text_key])
        return texts, None
    if p.suffix == ".json":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "nonmembers" in data:
            docs = data["nonmembers"]
            if not isinstance(docs, list) or not docs:
                raise ValueError(f"manifest {p} has no nonmembers")
            for i, d in enumerate(docs):
                check_manifest_doc(d, f"manifest {p}: nonmembers[{i}]")
            texts = [d.get("text", "") for d in docs]
            ids = [list(map(int, d["token_ids"])) for d in docs] \
                if all("token_ids" in d for d in docs) else None
            if ids is None:  # texts are tokenised: one without text would be silently dropped
                for i, d in enumerate(docs):
                    if "text" not in d:
                        raise ValueError(
                            f"manifest {p}: nonmembers[{i}] has token_ids but no text, and others have "
                            "no token_ids, so the texts are used: give every nonmember its text")
            return texts, ids
        if isinstance(data, list):
            texts = []
            for i, d in enumerate(data):
                t = d.get(text_key) if isinstance(d, dict) else d
                if not isinstance(t, str):
                    raise ValueError(f"{p}: item {i} is not a string or an object with a string "
                                     f"{text_key!r} field (use --text-key)")
                texts.append(t)
            return texts, None
        raise ValueError(f"{p}: expected a manifest (with 'nonmembers') or a list of texts")
    return [p.read_text(encoding="utf-8")], None


def evaluate_perplexity(
    model: torch.nn.Module,
    tokenizer: Any | None,
    source: str | os.PathLike,
    *,
    text_key: str = "text",
    max_length: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
    device: str | torch.device | None = None,
    add_bos: bool = True,
    grid=None,
) -> dict[str, Any]:
    """:func:`perplexity` on the documents of ``source`` (see :func:`load_perplexity_docs`), on ``grid`` if given.

    Texts are tokenised without special tokens; with ``add_bos`` the tokenizer's BOS is
    prepended to every document that does not start with it, so the first real token is
    scored too.
    """
    texts, ids = load_perplexity_docs(source, text_key=text_key)
    if ids is None:
        if tokenizer is None:
            raise MissingTokenizerError(
                f"perplexity on {source}: texts need a tokenizer and the checkpoint has none; "
                "pass --tokenizer PATH")
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    bos = getattr(tokenizer, "bos_token_id", None) if add_bos else None
    if bos is not None:
        ids = [d if d and d[0] == bos else [bos, *d] for d in ids]
    out = perplexity(model, ids, max_length=max_length, stride=stride, batch_size=batch_size,
                     device=device, grid=grid)
    out["source"] = str(source)
    return out

