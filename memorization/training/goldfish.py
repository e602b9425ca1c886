"""Goldfish loss (Hans et al., 2024): drop a pseudo-random 1/k of the labels from the loss.

Hugging Face convention: in a row of token ids ``x[0..T-1]`` the label at position ``t`` is
``x[t]``, predicted from ``x[0..t-1]``.  A dropped label is set to ``-100`` so that any
cross-entropy with ``ignore_index=-100`` (HF's, ours, the vocabulary-parallel one in
``axonn``) averages over the kept labels only.

Strategies
----------
``hash`` (default)
    The decision for the label at position ``t`` is a function of the ``h`` tokens that
    *precede* it, ``x[t-h..t-1]`` -- the context the model sees when predicting ``x[t]``,
    never ``x[t]`` itself.  The window is hashed with an order-dependent chain of a
    well-mixed 32-bit integer finaliser::

        a_0 = seed
        a_{j+1} = mix32(a_j XOR mix32(x[t-h+j] + j * 0x9E3779B9 mod 2^32))
        u_t = a_h / 2^32 in [0, 1)            drop  <=>  u_t < 1/k

    Every intermediate value stays below 2^32 and every product below 2^59, so the int64
    arithmetic never overflows and the result is bit-identical on every device.  Swapping
    two tokens changes the hash; a token id of 0 does not collapse it.  A position with
    fewer than ``h`` preceding tokens inside its own document (a document's first ``h``
    labels; every label of a document of at most ``h`` tokens) is decided by ``doc_start``:

    * ``keep`` (default): never dropped, so a document's opening is supervised at every
      exposure and the drop rate is below ``1/k`` (how far depends on the documents' lengths);
    * ``stream``: hashed like any other position, from the ``h`` tokens before it in the
      stream, across document boundaries, where they exist (kept at the start of a stream and
      at a target's start, which nothing in the stream precedes).  The decision then changes
      with whatever precedes the document, so a repeated document's opening is dropped at
      some exposures and supervised at others;
    * ``static``: dropped at every k-th position of its document (``p % k == k - 1``, ``p``
      counted from the document's first token): a fixed ``1/k`` of the opening, the same at
      every exposure, and documents of at most ``h`` tokens are protected too.
``minhash``
    Like ``hash`` (the same ``doc_start`` rules), but robust to local edits of the text: the window is summarised
    by its smallest token hash, an order-free min-hash, combined with the token just before the label::

        m_t = min_{j < h} mix32(x[t-h+j] XOR seed)
        u_t = mix32(m_t XOR mix32(x[t-1] + 0x9E3779B9 mod 2^32)) / 2^32        drop  <=>  u_t < 1/k

    Substituting a fraction q of a text's tokens changes ``hash``'s decision at a label whenever one of its h
    context tokens changed (probability ``1 - (1 - q)^h``, 0.75 at q = 0.1, h = 13), but ``minhash``'s only when
    ``x[t-1]`` changed or the window's minimum moved (about ``q (1 + 2h / (h + 1))``); shuffling tokens inside
    the window changes ``m_t`` not at all.  So a text seen only as perturbed copies is masked at mostly the
    same labels in every copy, as an exact repeat is under ``hash``.  The previous token in the mix keeps
    neighbouring decisions independent (a window minimum alone persists over ~h consecutive labels, which would
    drop labels in long runs and keep long verbatim runs).
``static``
    Drop the label at every k-th position of the row (``t % k == k - 1``).

The mask is a pure function of the ids: the same h-gram gives the same decision at any
position, in any row, batch, rank, run or device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
_MASK32 = 0xFFFFFFFF
_MIX_MULT = 0x45D9F3B  # < 2^27: x * _MIX_MULT < 2^59 for x < 2^32
_GOLDEN = 0x9E3779B9
STRATEGIES = ("hash", "minhash", "static")
#: the strategies that hash the context before each label (and so use the row context and ``doc_start``)
HASHED = ("hash", "minhash")
#: how the hash strategy decides a label with fewer than h preceding tokens in its document (module docstring)
DOC_STARTS = ("keep", "stream", "static")


@dataclass(frozen=True)
class GoldfishConfig:
    """Goldfish settings. ``k = 0`` means the standard loss (nothing dropped)."""

    k: int = 4
    h: int = 13
    strategy: str = "hash"
    seed: int = 0
    doc_start: str = "keep"  # one of DOC_STARTS
    # the equal-supervised-tokens control: drop as many labels per row as this config would, at positions drawn
    # afresh for every row of the stream (:func:`matched_random_mask`), so no text keeps its mask across exposures
    randomize: bool = False

    def __post_init__(self) -> None:
        validate_goldfish_args(self.k, self.h, self.strategy, allow_zero=True, doc_start=self.doc_start)

    @property
    def enabled(self) -> bool:
        return self.k > 0


def validate_goldfish_args(k: int, h: int, strategy: str, allow_zero: bool = False, doc_start: str = "keep") -> None:
    """Raise ``ValueError`` with a fix-it message for invalid Goldfish settings."""
    if allow_zero and k == 0:
        pass
    elif k < 2:
        raise ValueError(
            f"goldfish k={k} is invalid: k is the drop period (1/k of labels dropped) and must be "
            ">= 2 (use k=0 for the standard loss)"
        )
    if h < 1:
        raise ValueError(f"goldfish h={h} is invalid: the hash context width h must be >= 1")
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown goldfish strategy {strategy!r}: choose one of {STRATEGIES}")
    if doc_start not in DOC_STARTS:
        raise ValueError(f"unknown goldfish doc_start {doc_start!r}: choose one of {DOC_STARTS}")


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A well-mixed bijection on [0, 2^32) (int64 tensors holding uint32 values)."""
    x = ((x >> 16) ^ x) * _MIX_MULT & _MASK32
    x = ((x >> 16) ^ x) * _MIX_MULT & _MASK32
    return (x >> 16) ^ x


def hash_context(input_ids: torch.Tensor, h: int, seed: int = 0) -> torch.Tensor:
    """Hash of the ``h`` tokens preceding each position, as uint32 values in an int64 tensor.

    Output shape ``(..., T)``; entry ``t`` hashes ``input_ids[..., t-h:t]``.  Entries with
    ``t < h`` (incomplete window) are 0 and must be treated as "keep" by the caller.
    """
    ids = input_ids.long() & _MASK32
    T = ids.shape[-1]
    out = torch.zeros_like(ids)
    if T <= h:
        return out
    # windows[..., i, j] = ids[..., i + j] for i in [0, T-h]; the window ending at t-1 is i = t-h.
    windows = ids[..., : T - 1].unfold(-1, h, 1)  # (..., T-h, h): contexts of positions h..T-1
    acc = torch.full(windows.shape[:-1], seed & _MASK32, dtype=torch.long, device=ids.device)
    for j in range(h):  # loop over the window width, vectorized over all positions
        tok = _mix32((windows[..., j] + j * _GOLDEN) & _MASK32)
        acc = _mix32(acc ^ tok)
    out[..., h:] = acc
    return out


def minhash_context(input_ids: torch.Tensor, h: int, seed: int = 0) -> torch.Tensor:
    """The ``minhash`` strategy's value of each position (module docstring), uint32 in an int64 tensor: entry
    ``t`` from ``input_ids[..., t-h:t]``; entries with ``t < h`` are 0, as in :func:`hash_context`."""
    ids = input_ids.long() & _MASK32
    T = ids.shape[-1]
    out = torch.zeros_like(ids)
    if T <= h:
        return out
    per_token = _mix32(ids[..., : T - 1] ^ (seed & _MASK32))
    m = per_token.unfold(-1, h, 1).min(-1).values  # (..., T-h): windows ending at t-1 for t = h..T-1
    prev = _mix32((ids[..., h - 1 : T - 1] + _GOLDEN) & _MASK32)
    out[..., h:] = _mix32(m ^ prev)
    return out


def goldfish_mask(
    input_ids: torch.Tensor,
    k: int = 4,
    h: int = 13,
    strategy: str = "hash",
    seed: int = 0,
    document_ids: torch.Tensor | None = None,
    doc_start: str = "keep",
) -> torch.Tensor:
    """Bool tensor shaped like ``input_ids``: True where the label at that position is dropped.

    ``document_ids`` (same shape, optional) marks packed documents; a position whose ``h``
    preceding tokens are not all inside its own document is decided by ``doc_start`` (module
    docstring; ``stream`` hashes across the boundaries of documents, not across those of
    :data:`MOVED_DOC` and :data:`NO_DOC`, which no stream token precedes).  Documents must be
    contiguous runs within a row.
    """
    validate_goldfish_args(k, h, strategy, doc_start=doc_start)
    T = input_ids.shape[-1]
    if strategy == "static":
        pos = torch.arange(T, device=input_ids.device)
        return (pos % k == k - 1).expand_as(input_ids).clone()
    hashed = (minhash_context if strategy == "minhash" else hash_context)(input_ids, h, seed)
    # drop <=> u < 1/k with u = hash / 2^32  <=>  hash < 2^32 / k  <=>  hash < ceil(2^32 / k)  (exact integer
    # test; ``hash * k`` would overflow int64 for k >= 2^31)
    drop = hashed < -(-(1 << 32) // k)
    if doc_start == "stream" and document_ids is not None:  # only the stream's own edges bound a window
        document_ids = torch.where((document_ids == MOVED_DOC) | (document_ids == NO_DOC), document_ids, 0)
    valid = torch.zeros_like(drop)
    valid[..., h:] = True
    if document_ids is not None:
        same_doc = torch.zeros_like(drop)
        same_doc[..., h:] = document_ids[..., h:] == document_ids[..., :-h]
        valid &= same_doc
    if doc_start != "static":
        return drop & valid
    return torch.where(valid, drop, position_in_document(input_ids, document_ids) % k == k - 1)


def position_in_document(input_ids: torch.Tensor, document_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Each position's offset from the first position of its document in the row (contiguous runs of equal
    ``document_ids``; the row position without them)."""
    pos = torch.arange(input_ids.shape[-1], device=input_ids.device).expand_as(input_ids)
    if document_ids is None:
        return pos.clone()
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[..., 1:] = document_ids[..., 1:] != document_ids[..., :-1]
    return pos - torch.where(starts, pos, 0).cummax(-1).values


# Document ids that no packed row uses: the positions of a row moved behind its background
# (``goldfish_mask_in_stream``) and the padding before the first token of a stream.
MOVED_DOC = -(2**30)
NO_DOC = MOVED_DOC - 1


@dataclass(frozen=True)
class RowContext:
    """Where each packed row sits in its background stream, so that Goldfish decides a label from
    the ``h`` tokens that precede it *in the stream*, also at a row's start.

    Rows are ``(N, L)``; a row's background tokens start at ``start[r]`` (0 for a row of
    background only; after the target document otherwise) and continue the stream whose ``C``
    tokens before that point are ``ids[r]``, with document ids ``doc_ids[r]`` numbered like the
    row's (the document the row's background starts in has the id of ``doc_ids[r, start[r]]`` in
    the row; earlier documents have smaller ids; :data:`NO_DOC` pads the stream's beginning).
    Without it, the first ``h`` labels of every row's background would never be dropped: the
    reference implementation's pitfall (at L = 128, h = 13, a drop rate of 21% for k = 4).
    """

    ids: torch.Tensor  # (N, C) int64
    doc_ids: torch.Tensor  # (N, C) int32
    start: torch.Tensor  # (N,) int64

    def rows(self, sl: slice) -> "RowContext":
        return RowContext(self.ids[sl], self.doc_ids[sl], self.start[sl])


def goldfish_mask_in_stream(
    input_ids: torch.Tensor,
    document_ids: torch.Tensor,
    ctx: RowContext,
    k: int = 4,
    h: int = 13,
    seed: int = 0,
    doc_start: str = "keep",
    strategy: str = "hash",
) -> torch.Tensor:
    """:func:`goldfish_mask` (a :data:`HASHED` strategy) of packed rows, each continuing its background stream.

    Each row is rotated so that its background comes first, preceded by its ``C`` stream tokens:
    ``V = [ctx | row[start:] | row[:start]]`` (the part before ``start``, the target document, is
    moved behind and given its own document id); ``V`` is hashed like any packed row and the
    decisions are rotated back.  A background label's decision is then the one it gets in the
    stream, wherever the row boundaries fall (for ``h <= C``); the moved part's decisions are
    unchanged, as it starts a document.  Vectorised: two gathers and a scatter per batch.
    """
    B, L = input_ids.shape
    C = ctx.ids.shape[-1]
    if h > C:  # the first h - C background labels of a row would be kept whatever the stream holds
        raise ValueError(
            f"goldfish h={h} needs the {h} stream tokens before each row, but the row context holds only {C} "
            f"(memorization.data.mixture.CONTEXT_TOKENS): use h <= {C}, or build the mixture with a longer context"
        )
    if document_ids is None:
        raise ValueError("goldfish_mask_in_stream needs the rows' document_ids")
    j = torch.arange(L, device=input_ids.device)
    src = (ctx.start[:, None] + j) % L  # V[:, C + j] = row[:, src[:, j]]
    moved = j >= (L - ctx.start)[:, None]
    v_ids = torch.cat([ctx.ids, input_ids.gather(1, src)], 1)
    v_docs = torch.cat([ctx.doc_ids.to(document_ids.dtype),
                        document_ids.gather(1, src).masked_fill(moved, MOVED_DOC)], 1)
    drop_v = goldfish_mask(v_ids, k, h, strategy, seed, v_docs, doc_start)[:, C:]
    return torch.empty_like(drop_v).scatter_(1, src, drop_v)


def matched_random_mask(mask: torch.Tensor, valid: torch.Tensor, row_index: torch.Tensor, seed: int = 0
                        ) -> torch.Tensor:
    """A mask dropping as many of each row's ``valid`` labels as ``mask`` does, at positions drawn uniformly
    among them, independently for every row: the positions with the smallest keys
    ``mix32(mix32(seed XOR row) XOR t)``, ``row`` the row's index in the stream (``row_index``, ``(B,)``), ``t``
    the position.  Device-independent and the same on every rank, like the Goldfish mask; but a text seen
    again in another row gets another mask (the equal-supervised-tokens control of the Goldfish arm)."""
    B, T = mask.shape
    n_drop = (mask & valid).sum(-1, keepdim=True)
    row = _mix32((row_index.long().to(mask.device) ^ seed) & _MASK32)[:, None]
    keys = _mix32(_mix32(row ^ torch.arange(T, device=mask.device)) & _MASK32)
    keys = keys.masked_fill(~valid, 1 << 33)  # invalid positions sort last
    ranks = keys.argsort(dim=-1, stable=True).argsort(dim=-1)
    return (ranks < n_drop) & valid


def apply_goldfish(
    labels: torch.Tensor,
    input_ids: torch.Tensor,
    cfg: GoldfishConfig,
    document_ids: torch.Tensor | None = None,
    context: RowContext | None = None,
    row_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(labels with dropped positions set to -100, fraction of valid labels dropped)``.

    With ``context`` (and the hash strategy), each row's background is hashed as part of its
    stream (:func:`goldfish_mask_in_stream`); ``document_ids`` is then required.  With
    ``cfg.randomize``, the dropped labels are moved to random positions of their row
    (:func:`matched_random_mask`; ``row_index``, the rows' indices in the stream, is then required).

    Labels that are already ``-100`` (padding, prompts) stay ignored and are not counted, nor is
    each row's label 0, which no token predicts (the causal loss uses ``labels[:, 1:]``).  The
    fraction is a 0-dim tensor on the labels' device (no host sync in the training step).
    """
    if not cfg.enabled:
        return labels, torch.zeros((), device=labels.device)
    if context is not None and cfg.strategy in HASHED:  # static drops are row positions by definition
        mask = goldfish_mask_in_stream(input_ids, document_ids, context, cfg.k, cfg.h, cfg.seed, cfg.doc_start,
                                       cfg.strategy)
    else:
        mask = goldfish_mask(input_ids, cfg.k, cfg.h, cfg.strategy, cfg.seed, document_ids, cfg.doc_start)
    valid = labels != IGNORE_INDEX
    if cfg.randomize:
        if row_index is None:
            raise ValueError("a randomized (equal-supervised-tokens) mask needs the rows' row_index in the stream")
        predicted = valid.clone()
        predicted[..., 0] = False  # label 0 is predicted by no token: neither counted nor drawn
        mask = matched_random_mask(mask, predicted, row_index, cfg.seed)
    dropped = mask & valid
    frac = dropped[..., 1:].sum() / valid[..., 1:].sum().clamp(min=1)
    return labels.masked_fill(dropped, IGNORE_INDEX), frac
