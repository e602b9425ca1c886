"""Single-exposure data mixtures: target documents seen exactly n times inside a background stream.

Layout of the training stream (``N`` rows of ``L`` tokens, consumed in order, ``batch_size``
rows per optimizer step):

* background documents (each ``[bos] doc [eos]``) are concatenated and packed into rows;
* every occurrence of a target is a row of its own that *starts* with the target
  (``[bos] target [eos]``) and is filled up with the continuing background stream, so a
  target is never split across rows and the model sees it from its first token;
* each target appears in exactly ``exposures`` rows, each in a different optimizer step: the
  steps are drawn at random (seeded, weighted by the room left in each step), spaced evenly over the
  run, or spaced with every target's last exposure at the end (``placement``, :func:`exposure_steps`),
  and the row within the step uniformly, so ``n`` exposures are ``n`` separate updates, never one
  update with a doubled gradient.

``doc_ids`` numbers the documents within each row, so Goldfish can keep positions whose
``h``-token context crosses a document boundary.  The manifest (JSON) is the ground truth
for extraction: every target's id, text, token ids (truncated to ``max_target_tokens``; the
text is not), exposure count, and the rows and steps where it was seen; plus held-out
non-members: corpus documents that never enter the stream.  Those share the targets'
distribution only when the targets are drawn from the same corpus.  With user-supplied
targets (``target_texts``) they are background-corpus documents, a different distribution
from the user's; give some targets exposure 0 (e.g. ``exposures=(0, 4)``) so that part of the
user's own documents is held out as same-distribution non-members (``memorization.evaluation.mia`` uses
exposure-0 targets as the non-members when there are any).  ``targets_source`` in the
manifest says which case applies (``"corpus"`` or ``"user"``).
"""
from __future__ import annotations

import json
import random
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch

from .atomic import atomic_write_json
from memorization.training.goldfish import NO_DOC, RowContext

MANIFEST_VERSION = 1
#: Where a target's exposures fall (:func:`exposure_steps`): ``random`` steps; ``spaced`` evenly over the run;
#: ``last``: evenly over the run with every target's last exposure in the run's final steps.
PLACEMENTS = ("random", "spaced", "last")
CONTEXT_TOKENS = 64  # stream tokens kept before each row: Goldfish h up to this decides every label


def check_hash_width(h: int) -> None:
    """Refuse a Goldfish hash width the rows' context cannot serve (``ValueError``, naming the flag)."""
    if h > CONTEXT_TOKENS:
        raise ValueError(f"--goldfish-h {h}: a row carries the {CONTEXT_TOKENS} stream tokens before it "
                         "(memorization.data.mixture.CONTEXT_TOKENS), so a wider hash could not decide the first "
                         f"labels of every row; h must be <= {CONTEXT_TOKENS}: use --goldfish-h <= {CONTEXT_TOKENS}")


MAX_SEQ_LEN = 1 << 20  # tokens a training row may hold (refused before any tokenizing)


@dataclass
class MixtureConfig:
    seq_len: int = 256
    batch_size: int = 16  # rows per optimizer step (global batch)
    exposures: tuple[int, ...] = (16,)  # one count, or several: targets split round-robin
    num_targets: int = 32
    num_nonmembers: int = 32
    val_docs: int = 64
    num_steps: int | None = None  # None: as many whole steps as the background fills
    min_target_tokens: int = 100  # prefix + suffix needed by extraction
    max_target_tokens: int | None = None  # default: seq_len - 1 (room for eos)
    skip_short_targets: bool = False
    skip_overlapping_targets: bool = False  # user targets: skip one sharing a span with an earlier one
    seed: int = 0
    placement: str = "random"  # which steps a target's exposures take: one of PLACEMENTS

    def __post_init__(self) -> None:
        if isinstance(self.exposures, int):
            self.exposures = (self.exposures,)
        self.exposures = tuple(int(e) for e in self.exposures)
        if not self.exposures or min(self.exposures) < 0:
            raise ValueError(f"exposures {self.exposures} invalid: each must be >= 0 (0 = never seen, a control)")
        if self.seq_len < 8:
            raise ValueError(f"seq_len={self.seq_len} too small")
        if self.seq_len > MAX_SEQ_LEN:
            raise ValueError(f"seq_len={self.seq_len:,} exceeds {MAX_SEQ_LEN:,} tokens a row: no model here has such a "
                             "context")
        if self.num_targets < 1:
            raise ValueError("num_targets must be >= 1")
        if self.num_nonmembers < 0 or self.val_docs < 0 or self.batch_size < 1:
            raise ValueError(f"num_nonmembers={self.num_nonmembers} and val_docs={self.val_docs} must be >= 0, "
                             f"batch_size={self.batch_size} >= 1")
        if self.num_steps is not None and self.num_steps < 1:
            raise ValueError(f"num_steps={self.num_steps} must be >= 1 (or None: as many as the background fills)")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} unknown: choose one of {', '.join(PLACEMENTS)}")
        if self.max_target_tokens is None:
            self.max_target_tokens = self.seq_len - 1
        if self.max_target_tokens > self.seq_len - 1:
            raise ValueError(f"max_target_tokens={self.max_target_tokens} must be <= seq_len - 1 = {self.seq_len - 1}")
        if self.min_target_tokens > self.max_target_tokens:
            raise ValueError(
                f"targets need {self.min_target_tokens} tokens (prefix + suffix) but rows hold only "
                f"{self.max_target_tokens}: raise --seq-len or lower --prefix/--suffix"
            )


@dataclass
class Mixture:
    input_ids: torch.Tensor  # (N, L) int64, training rows in order
    doc_ids: torch.Tensor  # (N, L) int32, document index within each row
    val_ids: torch.Tensor  # (M, L) int64, held-out background rows
    val_doc_ids: torch.Tensor
    targets: list[dict]
    nonmembers: list[dict]
    config: MixtureConfig
    meta: dict = field(default_factory=dict)
    # per row: the CONTEXT_TOKENS stream tokens before its background part (Goldfish hashes a row's
    # first labels from them; memorization.training.goldfish.RowContext)
    row_context: RowContext | None = None

    @property
    def num_steps(self) -> int:
        return len(self.input_ids) // self.config.batch_size

    def manifest(self) -> dict:
        return {
            "version": MANIFEST_VERSION,
            "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.config).items()},
            "num_rows": int(len(self.input_ids)),
            "num_steps": self.num_steps,
            **self.meta,
            "targets": self.targets,
            "nonmembers": self.nonmembers,
        }

    def save_manifest(self, path: str | Path) -> None:
        atomic_write_json(Path(path), self.manifest())


def load_manifest(path: str | Path) -> dict[str, Any]:
    """Read and validate a target/nonmember manifest (``{"version": 1, "targets": [...],
    "nonmembers": [...]}``; targets carry ``exposures``), as :meth:`Mixture.save_manifest` writes it and
    extraction, MIA and perplexity read it (``ValueError`` naming the file and the document)."""
    if not Path(path).exists():
        raise FileNotFoundError(f"manifest {path} does not exist")
    with open(path, encoding="utf-8") as fh:
        try:
            manifest = json.load(fh)
        except json.JSONDecodeError as err:
            raise ValueError(f"manifest {path} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"manifest {path}: expected a JSON object")
    if manifest.get("version", 1) != 1:
        raise ValueError(f"manifest {path}: unsupported version {manifest.get('version')!r}")
    for key in ("targets", "nonmembers"):
        if key not in manifest or not isinstance(manifest[key], list):
            raise ValueError(f"manifest {path}: missing list {key!r}")
        for i, doc in enumerate(manifest[key]):
            check_manifest_doc(doc, f"manifest {path}: {key}[{i}]")
    for i, doc in enumerate(manifest["targets"]):
        if "exposures" not in doc:
            raise ValueError(f"manifest {path}: targets[{i}] has no 'exposures'")
        e = doc["exposures"]
        if not (is_int(e) or (isinstance(e, float) and e.is_integer())) or e < 0:
            raise ValueError(f"manifest {path}: targets[{i}] has exposures {e!r}; it must be a "
                             "non-negative integer (0 for a held-out control, N >= 1 for a member)")
    return manifest


def is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def check_manifest_doc(doc: Any, where: str) -> None:
    """Raise ``ValueError`` unless ``doc`` is a manifest document: an object with ``token_ids``
    (a list of integers) and/or ``text`` (a string)."""
    if not isinstance(doc, dict):
        raise ValueError(f"{where} is a {type(doc).__name__}, not an object: write each document "
                         'as {"id": ..., "text": "...", "token_ids": [...]}')
    if "token_ids" not in doc and "text" not in doc:
        raise ValueError(f"{where} has neither token_ids nor text")
    ids = doc.get("token_ids")
    if "token_ids" in doc and not (isinstance(ids, list) and all(is_int(t) for t in ids)):
        raise ValueError(f"{where} ({doc.get('id', '?')}): token_ids must be a list of integers, "
                         f"got {str(ids)[:60]}")
    if "text" in doc and "token_ids" not in doc and not isinstance(doc["text"], str):
        raise ValueError(f"{where} ({doc.get('id', '?')}): text must be a string, got "
                         f"{type(doc['text']).__name__}")


def tokenize_with_bos(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text with a leading BOS (added here if the tokenizer does not)."""
    ids = tokenizer(list(texts), add_special_tokens=True)["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is not None:
        ids = [x if x[:1] == [bos] else [bos] + x for x in ids]
    return ids


OVERLAP_NGRAM = 32


def _ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Polynomial hashes (mod 2^64) of every ``n``-token window of ``tokens``; vectorized over positions."""
    if len(tokens) < n:
        return np.zeros(0, np.uint64)
    t = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(len(tokens) - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):  # loop over the window width, not over tokens
            h = h * np.uint64(1_000_003) + t[j : len(t) - n + 1 + j]
    return h


def _overlapping(protected: list[list[int]], docs: list[list[int]], n: int) -> set[int]:
    """Indices of ``docs`` that share at least one ``n``-token span with any ``protected`` document."""
    if not protected or not docs:
        return set()
    bad = np.unique(np.concatenate([_ngram_hashes(np.asarray(x), n) for x in protected]))
    lengths = np.array([len(d) for d in docs])
    flat = np.fromiter((t for d in docs for t in d), np.int64, count=int(lengths.sum()))
    hashes = _ngram_hashes(flat, n)
    owner = np.repeat(np.arange(len(docs)), lengths)[: len(hashes)]
    # a window that starts in one document and ends in the next is not a real span of either
    ends = np.repeat(np.cumsum(lengths), lengths)[: len(hashes)]
    inside = np.arange(len(hashes)) + n <= ends
    return set(owner[np.isin(hashes, bad) & inside].tolist())


def _without_copies(protected: list[list[int]], idxs: list[int], docs: list[list[int]]) -> list[int]:
    """``idxs`` (indices into ``docs``) without those sharing an :data:`OVERLAP_NGRAM`-token span with a
    ``protected`` document, order kept."""
    copies = _overlapping(protected, [docs[i] for i in idxs], OVERLAP_NGRAM)
    return [i for j, i in enumerate(idxs) if j not in copies]


def _keep_disjoint(docs: Iterable[list[int]], n: int) -> Iterator[int | None]:
    """Walk ``docs`` in order, keeping each document that shares no ``n``-token span with one kept
    before it; yield, per document, ``None`` when it is kept, else the position (in ``docs``) of the
    first kept document it shares a span with."""
    holder: dict[int, int] = {}  # span hash -> the kept document that holds it first
    for j, x in enumerate(docs):
        spans = _ngram_hashes(np.asarray(x), n).tolist()
        first = next((holder[h] for h in spans if h in holder), None)
        if first is None:
            for h in spans:
                holder.setdefault(h, j)
        yield first


def _disjoint(candidates: list[int], docs: list[list[int]], count: int, n: int) -> list[int]:
    """The first ``count`` of ``candidates`` (indices into ``docs``), skipping any that shares an ``n``-token
    span with one picked before it."""
    picked: list[int] = []
    for i, first in zip(candidates, _keep_disjoint((docs[i] for i in candidates), n)):
        if first is None:
            picked.append(i)
            if len(picked) == count:
                break
    return picked


def _copies_of_earlier(docs: list[list[int]], skip: set[int], max_tokens: int) -> dict[int, int]:
    """``{j: i}`` for each document ``j`` (not in ``skip``) whose first ``max_tokens`` tokens share an
    :data:`OVERLAP_NGRAM`-token span with an earlier kept document ``i``; such a ``j`` is not kept."""
    pos = [j for j in range(len(docs)) if j not in skip]
    firsts = _keep_disjoint((docs[j][:max_tokens] for j in pos), OVERLAP_NGRAM)
    return {j: pos[f] for j, f in zip(pos, firsts) if f is not None}


def _place_exposures(exposures: list[int], n_steps: int, batch: int, rng: random.Random,
                     placement: str = "random") -> list[int]:
    """Row slots in stream order (``-1``: background, ``j``: target ``j``); target ``j`` fills
    ``exposures[j]`` rows, all in different steps (a step is ``batch`` consecutive rows), chosen by
    :func:`exposure_steps`; the row within each step is uniform."""
    if max(exposures) > n_steps:
        raise ValueError(
            f"a target seen {max(exposures)} times needs {max(exposures)} different optimizer steps, but the "
            f"stream has {n_steps}: raise --steps or lower --exposures"
        )
    gen = np.random.default_rng(rng.getrandbits(64))
    steps_of = exposure_steps(exposures, n_steps, batch, gen, placement)
    if steps_of is None:
        raise ValueError(
            f"cannot put every target's exposures {sorted(set(exposures))} in different steps of {batch} rows "
            f"({n_steps} steps): raise --steps or --batch-size, or lower --exposures or the number of targets"
        )
    in_step: list[list[int]] = [[] for _ in range(n_steps)]
    for j, steps in enumerate(steps_of):
        for st in steps.tolist():
            in_step[st].append(j)
    slots: list[int] = []
    for js in in_step:
        row = js + [-1] * (batch - len(js))
        slots += [row[i] for i in gen.permutation(batch).tolist()]
    return slots


def exposure_steps(exposures: list[int], n_steps: int, batch: int, gen: np.random.Generator,
                   placement: str = "random") -> list[np.ndarray] | None:
    """The steps of each target's exposures (target ``j``: ``exposures[j]`` different steps), at most ``batch``
    exposures in a step; None when they do not fit.

    * ``random``: targets are placed most-exposed first; each draws its steps without replacement with
      probability proportional to the rows still free in each step.  Should that draw leave a target too few
      steps, the placement is redrawn always taking the emptiest steps (random tie-break), which succeeds
      whenever any placement exists (a Gale-Ryser greedy).
    * ``spaced``: target ``j`` with ``n`` exposures wants steps ``floor((i + u_j) N / n)``, ``i < n``, with a
      random phase ``u_j`` in [0, 1): evenly over the run's ``N`` steps.
    * ``last``: target ``j`` wants steps ``floor(i N / n) - 1``, ``i = 1..n``: evenly over the run and the last
      exposure at the final step, for every target.  The last exposures are placed first (targets in random
      order), so they fill the run's final ``ceil(T / batch)`` steps: the steps since a target's last exposure
      no longer depend on how often it was seen, only the number of exposures does.

    In ``spaced`` and ``last`` a wanted step that is full (or already holds the target) gives way to the nearest
    free one, the earlier first.
    """
    if placement == "random":
        return _random_steps(exposures, n_steps, batch, gen)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r} unknown: choose one of {', '.join(PLACEMENTS)}")
    wants: list[np.ndarray] = []
    for n in exposures:
        i = np.arange(n)
        if placement == "spaced":
            wants.append(np.floor((i + gen.random()) * n_steps / n).astype(np.int64) if n else i)
        else:
            wants.append(np.floor((i + 1) * n_steps / n).astype(np.int64) - 1 if n else i)
    order = gen.permutation(len(exposures)).tolist()
    if placement == "spaced":  # the most exposed first: they have the least room to give way
        queue = [(j, w) for j in sorted(order, key=lambda j: -exposures[j]) for w in wants[j].tolist()]
    else:  # every target's last exposure before any other exposure
        queue = [(j, int(wants[j][-1])) for j in order if exposures[j]]
        queue += [(j, w) for j in sorted(order, key=lambda j: -exposures[j]) for w in wants[j][:-1].tolist()]
    free = np.full(n_steps, batch)
    taken: list[set[int]] = [set() for _ in exposures]
    for j, want in queue:
        for d in range(n_steps):
            s = next((s for s in (want - d, want + d) if 0 <= s < n_steps and free[s] and s not in taken[j]), None)
            if s is not None:
                break
        else:
            return None
        free[s] -= 1
        taken[j].add(s)
    return [np.array(sorted(t), np.int64) for t in taken]


def _random_steps(exposures: list[int], n_steps: int, batch: int, gen: np.random.Generator
                  ) -> list[np.ndarray] | None:
    """:func:`exposure_steps`' ``random`` placement."""
    order = sorted(gen.permutation(len(exposures)).tolist(), key=lambda j: -exposures[j])

    def draw(emptiest_first: bool) -> list[np.ndarray] | None:
        free = np.full(n_steps, batch)
        steps_of: list[np.ndarray] = [np.zeros(0, np.int64)] * len(exposures)
        for j in order:
            n = exposures[j]
            if n == 0:
                continue
            open_ = np.flatnonzero(free)
            if len(open_) < n:
                return None
            if emptiest_first:
                pick = open_[np.lexsort((gen.random(len(open_)), -free[open_]))[:n]]
            else:
                pick = gen.choice(open_, n, replace=False, p=free[open_] / free[open_].sum())
            free[pick] -= 1
            steps_of[j] = pick
        return steps_of

    steps_of = draw(False)
    return steps_of if steps_of is not None else draw(True)


def _pack(stream: np.ndarray, seg: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(stream) // L
    return stream[: n * L].reshape(n, L), seg[: n * L].reshape(n, L)


def build_mixture(
    docs: Sequence[str],
    tokenizer,
    cfg: MixtureConfig,
    target_texts: Sequence[str] | None = None,
    meta: dict | None = None,
    token_ids: Sequence[Sequence[int]] | None = None,
) -> Mixture:
    """Build the training stream, validation rows, targets and non-members (deterministic in ``cfg.seed``).

    ``docs`` is the corpus; targets are drawn from it (held out of the background) unless
    ``target_texts`` (the user's documents) are given.  Non-members are always corpus documents
    held out of the background, so with ``target_texts`` they do not share the targets'
    distribution: a ``UserWarning`` says so when no target has exposure 0 (exposure-0 targets are
    the same-distribution non-members then).  Raises ``ValueError`` when a target is too short
    (unless ``skip_short_targets``), when a user target shares an :data:`OVERLAP_NGRAM`-token span
    with an earlier one (unless ``skip_overlapping_targets``), when the target set is empty, or
    when the corpus cannot fill the stream.

    ``token_ids``, if given, are the documents already tokenized (``token_ids[i]`` is
    :func:`tokenize_with_bos` of ``docs[i]``, e.g. by ``datasets.map`` in
    :func:`memorization.data.token_store.prepare_store`): the mixture is then the one built from the text.
    """
    rng = random.Random(cfg.seed)
    eos = tokenizer.eos_token_id
    order = list(range(len(docs)))
    rng.shuffle(order)
    if token_ids is None:
        doc_ids = tokenize_with_bos(tokenizer, [docs[i] for i in order])
    else:
        if len(token_ids) != len(docs):
            raise ValueError(f"token_ids holds {len(token_ids)} documents, docs {len(docs)}: give one per document")
        doc_ids = [[int(t) for t in token_ids[i]] for i in order]
    long_enough = [i for i, ids in enumerate(doc_ids) if len(ids) >= cfg.min_target_tokens]

    skipped: list[str] = []
    if target_texts is not None:
        if len(target_texts) == 0:
            raise ValueError("the target set is empty: --targets must hold at least one document")
        t_ids = tokenize_with_bos(tokenizer, target_texts)
        short = [j for j, x in enumerate(t_ids) if len(x) < cfg.min_target_tokens]
        if short and not cfg.skip_short_targets:
            j = short[0]
            raise ValueError(
                f"{len(short)} target(s) are shorter than prefix + suffix = {cfg.min_target_tokens} tokens "
                f"(e.g. target #{j} has {len(t_ids[j])}); use longer documents, lower --prefix/--suffix, "
                "or pass --skip-short-targets to skip and count them"
            )
        skipped = [f"user-{j:05d}" for j in short]
        copies = _copies_of_earlier(t_ids, set(short), cfg.max_target_tokens)
        if copies and not cfg.skip_overlapping_targets:
            j, first = next(iter(copies.items()))
            raise ValueError(
                f"{len(copies)} target(s) share a {OVERLAP_NGRAM}-token span with an earlier target (e.g. target "
                f"#{j} with #{first}): training on one would add exposures of the other. Remove the duplicates "
                "from --targets, or pass --skip-overlapping-targets to skip (and count) the later ones"
            )
        skipped_copies = [f"user-{j:05d}" for j in copies]
        dropped = set(short) | copies.keys()
        targets = [(f"user-{j:05d}", target_texts[j], x) for j, x in enumerate(t_ids) if j not in dropped]
        if not targets:
            raise ValueError("every target was too short; nothing to measure")
        targets_source = "user"
        if not any(cfg.exposures[j % len(cfg.exposures)] == 0 for j in range(len(targets))):
            warnings.warn(
                "the non-members are held-out documents of the background corpus, not of your "
                "--targets documents: a membership-inference attack against them measures the shift "
                "between the two distributions as well as membership. Use --exposures 0,N to hold out "
                "part of your own documents (exposure 0, never trained on) as same-distribution "
                "non-members", UserWarning, stacklevel=2)
        held = set()
        # a non-member sharing a span with a target would be a (partly) seen document
        pool = _without_copies([x for _, _, x in targets], long_enough, doc_ids)
        if len(pool) < cfg.num_nonmembers:
            raise ValueError(
                f"corpus has only {len(pool)} documents of >= {cfg.min_target_tokens} tokens that share no "
                f"{OVERLAP_NGRAM}-token span with the targets; {cfg.num_nonmembers} needed as non-members: "
                "use a larger --corpus or lower --num-nonmembers"
            )
        nonmember_idx = pool[: cfg.num_nonmembers]
    else:
        need = cfg.num_targets + cfg.num_nonmembers
        # targets share no span with each other (a copy would add to another's exposures, or expose a
        # held-out exposure-0 target), nor with the non-members
        t_idx = _disjoint(long_enough, doc_ids, cfg.num_targets, OVERLAP_NGRAM)
        chosen = set(t_idx)
        rest_le = [i for i in long_enough if i not in chosen]
        nonmember_idx = _without_copies([doc_ids[i] for i in t_idx], rest_le, doc_ids)[: cfg.num_nonmembers]
        if len(t_idx) + len(nonmember_idx) < need:
            raise ValueError(
                f"corpus has only {len(t_idx) + len(nonmember_idx)} usable documents of >= {cfg.min_target_tokens} "
                f"tokens (no target sharing a {OVERLAP_NGRAM}-token span with another target or a non-member); "
                f"{need} needed for {cfg.num_targets} targets + {cfg.num_nonmembers} non-members"
            )
        targets = [(f"doc-{order[i]:06d}", docs[order[i]], doc_ids[i]) for i in t_idx]
        held = set(t_idx)
        targets_source = "corpus"
        skipped_copies = []
    held |= set(nonmember_idx)
    rest = [i for i in range(len(docs)) if i not in held]
    # near-duplicates: a document sharing any OVERLAP_NGRAM-token span with a target or non-member
    # would leak it into training (or the held-out loss); drop such documents
    protected = [x for _, _, x in targets] + [doc_ids[i] for i in nonmember_idx]
    kept = _without_copies(protected, rest, doc_ids)
    n_near_duplicates, rest = len(rest) - len(kept), kept
    val_idx, bg_idx = rest[: cfg.val_docs], rest[cfg.val_docs :]

    def stream_of(idxs: list[int]) -> tuple[np.ndarray, np.ndarray]:
        toks, seg = [], []
        for n, i in enumerate(idxs):
            toks.append(doc_ids[i] + [eos])
            seg.append(np.full(len(doc_ids[i]) + 1, n, dtype=np.int32))
        if not toks:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        return np.fromiter((t for x in toks for t in x), np.int64), np.concatenate(seg)

    bg, bg_seg = stream_of(bg_idx)
    val, val_seg = stream_of(val_idx)
    val_rows, val_seg_rows = _pack(val, val_seg, cfg.seq_len)

    L = cfg.seq_len
    exposures = [cfg.exposures[j % len(cfg.exposures)] for j in range(len(targets))]
    t_tok = [np.asarray(x[: cfg.max_target_tokens] + [eos], np.int64) for _, _, x in targets]
    filler_needed = sum(n * (L - len(t)) for n, t in zip(exposures, t_tok))
    n_target_rows = sum(exposures)
    B = cfg.batch_size
    n_rows = ((max(len(bg) - filler_needed, 0) // L + n_target_rows) // B) * B  # whole steps only
    if cfg.num_steps is not None:
        if cfg.num_steps * B < n_target_rows:
            raise ValueError(
                f"{cfg.num_steps} steps of {B} rows hold {cfg.num_steps * B} rows, fewer than the {n_target_rows} "
                f"target rows ({len(targets)} targets x exposures {list(cfg.exposures)}): raise --steps, or lower "
                "--exposures or the number of targets"
            )
        if cfg.num_steps * B > n_rows:
            raise ValueError(
                f"corpus too small for {cfg.num_steps} steps: its {len(bg)} background tokens fill "
                f"{n_rows // B} steps of {B} rows x {L} tokens with these targets; lower --steps or use a "
                "larger --corpus"
            )
        n_rows = cfg.num_steps * B
    n_bg_rows = n_rows - n_target_rows
    if n_rows == 0 or n_bg_rows < 0:
        raise ValueError(
            f"corpus too small: {len(bg)} background tokens cannot fill {n_target_rows} target rows "
            f"into whole steps of {B} rows of {L} tokens; use a larger --corpus or fewer targets/exposures"
        )
    bg_needed = n_bg_rows * L + filler_needed
    if len(bg) < bg_needed:
        raise ValueError(
            f"corpus too small: {n_rows // B} steps of {B} rows x {L} tokens need {bg_needed} background "
            f"tokens ({filler_needed} to fill up the {n_target_rows} target rows + {n_bg_rows} background "
            f"rows x {L}), but the background has only {len(bg)}; use a larger --corpus, fewer "
            "targets/exposures, or fewer --steps"
        )
    slots = _place_exposures(exposures, n_rows // B, B, rng, cfg.placement)
    rows = np.empty((n_rows, L), np.int64)
    segs = np.empty((n_rows, L), np.int32)
    C = CONTEXT_TOKENS
    ctx_ids = np.zeros((n_rows, C), np.int64)
    ctx_segs = np.full((n_rows, C), NO_DOC, np.int32)
    starts = np.zeros(n_rows, np.int64)
    seen_rows: list[list[int]] = [[] for _ in targets]
    pos = 0
    for r, j in enumerate(slots):  # one iteration per row (not per token)
        start = 0 if j < 0 else min(len(t_tok[j]), L)  # where the row's background part begins
        starts[r] = start
        if pos < len(bg):  # the stream before it, its documents numbered as in the row (first: 0, or 1 after a target)
            lo = max(pos - C, 0)
            ctx_ids[r, C - (pos - lo):] = bg[lo:pos]
            ctx_segs[r, C - (pos - lo):] = (0 if j < 0 else 1) + bg_seg[lo:pos] - bg_seg[pos]
        if j < 0:
            rows[r] = bg[pos : pos + L]
            segs[r] = bg_seg[pos : pos + L] - bg_seg[pos]
            pos += L
        else:
            t = t_tok[j]
            fill = L - len(t)
            rows[r, : len(t)] = t
            rows[r, len(t) :] = bg[pos : pos + fill]
            segs[r, : len(t)] = 0
            segs[r, len(t) :] = 1 + bg_seg[pos : pos + fill] - bg_seg[pos]
            pos += fill
            seen_rows[j].append(r)

    target_records = [
        {
            "id": tid,
            "text": text,
            "token_ids": [int(t) for t in t_tok[j][:-1]],
            "exposures": exposures[j],
            "rows": seen_rows[j],
            "steps": sorted(r // B for r in seen_rows[j]),
        }
        for j, (tid, text, _) in enumerate(targets)
    ]
    nonmember_records = [
        {"id": f"doc-{order[i]:06d}", "text": docs[order[i]], "token_ids": doc_ids[i][: cfg.max_target_tokens]}
        for i in nonmember_idx
    ]
    meta = dict(meta or {})
    meta.update(background_tokens_used=int(pos), skipped_short_targets=skipped,
                skipped_overlapping_targets=skipped_copies,
                documents_dropped_as_near_duplicates=n_near_duplicates, targets_source=targets_source)
    return Mixture(
        input_ids=torch.from_numpy(rows),
        doc_ids=torch.from_numpy(segs),
        val_ids=torch.from_numpy(val_rows),
        val_doc_ids=torch.from_numpy(val_seg_rows),
        targets=target_records,
        nonmembers=nonmember_records,
        config=cfg,
        meta=meta,
        row_context=RowContext(torch.from_numpy(ctx_ids), torch.from_numpy(ctx_segs), torch.from_numpy(starts)),
    )
