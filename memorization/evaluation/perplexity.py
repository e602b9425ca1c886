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

from memorization.evaluation.eval_model import MissingTokenizerError, as_id_lists, check_vocab
from memorization.lm import LM, as_lm, window_spans
from memorization.data.mixture import check_manifest_doc
from memorization.training.models import model_context


@torch.no_grad()
def perplexity(
    model: torch.nn.Module | LM,
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

    The windows' log-likelihoods are :meth:`memorization.lm.LM.loglikelihood_rolling`'s.  With ``grid`` (an axonn
    grid ``model`` is parallelized on; or ``model`` an :class:`~memorization.lm.LM` on a grid) the windows are
    split over its data x depth replicas and every rank returns the whole result.

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
    lm = as_lm(model, grid=grid, device=device)
    check_context(max_length, model_context(lm.model))
    max_length = int(max_length if max_length is not None else lm.max_length)
    stride = int(stride if stride is not None else max(1, max_length // 2))
    ids = as_id_lists(docs)
    check_vocab(lm.model, ids, "perplexity")
    n_windows = sum(len(window_spans(len(x), max_length, stride)) for x in ids)
    if not n_windows:
        raise ValueError("no document has 2 or more tokens: nothing to score")
    per_doc = lm.loglikelihood_rolling(ids, max_length=max_length, stride=stride, batch_size=batch_size,
                                       progress=progress)
    doc_sum = -np.array([v for v, _ in per_doc], dtype=np.float64)
    doc_cnt = np.array([c for _, c in per_doc], dtype=np.int64)
    n_tok = int(doc_cnt.sum())
    nll = float(doc_sum.sum() / n_tok)
    with np.errstate(invalid="ignore", divide="ignore"):
        doc_nll = np.where(doc_cnt > 0, doc_sum / np.maximum(doc_cnt, 1), np.nan)
    return {
        "perplexity": math.exp(nll),
        "nll": nll,
        "n_tokens": n_tok,
        "n_docs": int((doc_cnt > 0).sum()),
        "n_windows": n_windows,
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
    model: torch.nn.Module | LM,
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

