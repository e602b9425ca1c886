"""Extraction: does greedy decoding from a document's prefix reproduce its suffix?

For each document with token ids ``x``: prefix ``p = x[:P]`` (or, the Goldfish protocol,
``x[:L - S]`` with ``L = min(|x|, max_tokens)``: the document cut to its first ``max_tokens``
= 2,048 tokens, minus its last ``S``), true suffix ``s = x[|p| : |p| + S]``, and the model's
greedy continuation ``g`` of ``S`` tokens.  Prefix + suffix must fit the model's context
(:func:`memorization.training.models.model_context`).  Metrics (Carlini et al. 2023; Hans et al. 2024):

* exact match  ``1[g == s]``  (all ``S`` tokens),
* token match  ``mean_i 1[g_i == s_i]``,
* Rouge-L F1   between the decoded texts (``rouge-score``'s LCS, but on case- and
  punctuation-preserving Unicode tokens, see :func:`rouge_l`; on token ids when no tokenizer).
* prefix match ``max{i : g_1..i == s_1..i} / S``: how far the continuation is verbatim before its first
  error (Carlini et al. 2023's extractable length, as a fraction of the suffix).
* edit similarity ``1 - lev(g, s) / S``, ``lev`` the Levenshtein distance over tokens (insertions,
  deletions, substitutions; :func:`token_edit_distance`): approximate memorization (Ippolito et al.
  2022), which a continuation shifted by one token or with one substitution keeps while exact and
  token match lose it; ``near_verbatim`` counts documents with edit similarity >= 0.9.

Sampled extraction (``samples`` = n > 0; Hayes et al. 2024's (n, p)-discoverable extraction): besides the
greedy continuation, n continuations sampled at ``temperature`` among the ``top_k`` most likely tokens; a
document's ``sampled_matches`` counts those equal to ``s``, and a summary's ``sampled_any`` is the share of
documents with at least one, ``sampled_rate`` the mean per-sample rate ``p̂`` (so a document is extracted
within n' samples with probability ``1 - (1 - p̂)^n'``).  Each document's draws depend on ``seed`` and its
id alone (:func:`sample_continue`).

Adaptive extraction (``beam`` = B > 0, ``hints``; :mod:`memorization.evaluation.adaptive`): whether the suffix is among
the B beams of a beam search (``beam_match``; ``beam_top1``: the best beam), and the number of hints a greedy
decoder needs when given the true token at each error (``hints``; ``longest_run``: the longest verbatim run
between hints); a summary gives the shares and means.

Generation is :class:`memorization.lm.LM`'s (:meth:`~memorization.lm.LM.generate_until`): prefixes sorted by
length, left-padded and decoded together with a KV cache; this module keeps the protocol and the metrics.
"""
from __future__ import annotations

import math
import re
import warnings
import zlib
from collections import defaultdict
from dataclasses import dataclass, replace
import torch

from .eval_model import vocab_size
from memorization.lm import LM, Sampling, as_lm, row_seed


@dataclass(frozen=True)
class ExtractionConfig:
    prefix_len: int = 50
    suffix_len: int = 50
    all_but_suffix: bool = False  # prefix = the document minus its last S tokens
    batch_size: int = 32
    skip_short: bool = False
    max_tokens: int = 2048  # all-but-suffix: cut the document to its first max_tokens tokens (Goldfish: 2,048)
    samples: int = 0  # sampled continuations per document besides the greedy one (0: greedy only)
    temperature: float = 1.0  # of the sampled continuations
    top_k: int = 40  # sample among the k most likely tokens (0: all)
    seed: int = 0  # of the sampled continuations (each document's draws depend on it and the document's id only)
    beam: int = 0  # beam-search width of the adaptive attack (0: none; memorization.evaluation.adaptive)
    hints: bool = False  # hint-counting teacher forcing (memorization.evaluation.adaptive)

    def __post_init__(self) -> None:
        if self.suffix_len < 1 or (not self.all_but_suffix and self.prefix_len < 1):
            raise ValueError("prefix and suffix lengths must be >= 1")
        if self.samples < 0 or not self.temperature > 0 or self.top_k < 0:
            raise ValueError(f"samples must be >= 0, temperature > 0 and top_k >= 0, got {self.samples}, "
                             f"{self.temperature}, {self.top_k}")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.beam < 0:
            raise ValueError(f"beam width must be >= 0 (0: no beam search), got {self.beam}")
        if self.all_but_suffix and self.max_tokens <= self.suffix_len:
            raise ValueError(f"max_tokens ({self.max_tokens}) must exceed the suffix length ({self.suffix_len})")


def split_document(ids: list[int], cfg: ExtractionConfig) -> tuple[list[int], list[int]] | None:
    """``(prefix, suffix)`` of a document, or None when it is shorter than prefix + suffix.

    All-but-suffix mode first cuts the document to its first ``cfg.max_tokens`` tokens, so the
    suffix is tokens ``[L - S, L)`` with ``L = min(len(ids), max_tokens)``: the part of a long
    document that was trained on, at positions the model knows.
    """
    S = cfg.suffix_len
    if cfg.all_but_suffix:
        ids = ids[: cfg.max_tokens]
        return (ids[:-S], ids[-S:]) if len(ids) > S else None
    P = cfg.prefix_len
    return (ids[:P], ids[P : P + S]) if len(ids) >= P + S else None


class RougeTokenizer:
    """Tokens for Rouge-L: runs of Unicode word characters and single punctuation characters,
    case kept (``x = x + 1`` -> ``x``, ``=``, ``x``, ``+``, ``1``)."""

    pattern = re.compile(r"\w+|[^\w\s]")

    def tokenize(self, text: str) -> list[str]:
        return self.pattern.findall(text)


def rouge_l(preds: list[str], refs: list[str]) -> list[float]:
    r"""Rouge-L F1 of each prediction against its reference.

    Tokenised with :class:`RougeTokenizer`, not rouge-score's default, which lowercases and
    turns every character outside ``[a-z0-9]`` into a space: code differing only in ``+`` vs
    ``-`` would score 1.0 and non-Latin text (Japanese, accented words) 0.  Here case and
    punctuation count, and ``\w`` is Unicode-aware.  A space-less CJK run is a single token, so
    partial matches of such text score coarsely.  No stemming.  Two texts without a single
    token (empty, whitespace only: a suffix of newlines or of special tokens) are identical
    under this tokenization and score 1.0 (``rouge-score`` gives 0 when either side is empty).
    """
    from rouge_score import rouge_scorer

    tok = RougeTokenizer()
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False, tokenizer=tok)
    return [1.0 if not tok.tokenize(p) and not tok.tokenize(r) else float(scorer.score(r, p)["rougeL"].fmeasure)
            for p, r in zip(preds, refs)]


def prepare(model_or_config, docs: list[dict], cfg: ExtractionConfig):
    """What :func:`extract` checks and splits before it decodes: ``(cfg, context, kept docs, (prefix, suffix)
    splits, skipped ids)``, every refusal a ``ValueError`` (see :func:`extract`).  It needs only the model's
    config, so a CLI can call it before it loads the weights (a 70B takes minutes to load)."""
    if not docs:
        raise ValueError("no documents to extract from")
    from memorization.training.models import model_context

    ctx = model_context(model_or_config)
    if ctx:
        if cfg.all_but_suffix and cfg.max_tokens > ctx:
            if ctx <= cfg.suffix_len:
                raise ValueError(f"suffix ({cfg.suffix_len} tokens) does not fit the model's context "
                                 f"({ctx} tokens) with a prefix")
            warnings.warn(f"max_tokens {cfg.max_tokens} exceeds the model's context ({ctx} tokens); documents "
                          f"are cut to {ctx} tokens", stacklevel=3)
            cfg = replace(cfg, max_tokens=ctx)
        elif not cfg.all_but_suffix and cfg.prefix_len + cfg.suffix_len > ctx:
            raise ValueError(f"prefix + suffix = {cfg.prefix_len + cfg.suffix_len} tokens exceeds the model's "
                             f"context ({ctx} tokens): lower --prefix/--suffix")
    splits, kept, skipped = [], [], []
    for d in docs:
        sp = split_document(list(d["token_ids"]), cfg)
        if sp is None:
            if not cfg.skip_short:
                need = cfg.suffix_len + (1 if cfg.all_but_suffix else cfg.prefix_len)
                raise ValueError(
                    f"document {d.get('id')!r} has {len(d['token_ids'])} tokens, fewer than prefix + suffix = "
                    f"{need}: lower --prefix/--suffix or pass --skip-short to skip and count such documents"
                )
            skipped.append(d.get("id"))
            continue
        splits.append(sp)
        kept.append(d)
    if not kept:
        raise ValueError("every document is shorter than prefix + suffix; nothing to extract")
    vocab = vocab_size(model_or_config)
    for d, (p, s) in zip(kept, splits) if vocab else ():
        lo, hi = min(min(p), min(s)), max(max(p), max(s))
        if lo < 0 or hi >= vocab:
            raise ValueError(f"document {d.get('id')!r} has token id {hi if hi >= vocab else lo}, outside the "
                             f"model's vocabulary (0..{vocab - 1}): were its token_ids made with another tokenizer?")
    return cfg, ctx, kept, splits, skipped


def sample_continue(model: torch.nn.Module | LM, prefixes: list[list[int]], keys: list[int], n_new: int,
                    samples: int, temperature: float = 1.0, top_k: int = 40, seed: int = 0, batch_size: int = 32,
                    pad_id: int = 0) -> list[list[list[int]]]:
    """``samples`` sampled continuations of ``n_new`` tokens per prefix (``[prefix][sample] -> ids``), batched
    with a KV cache (:meth:`memorization.lm.LM.generate_until`): each token drawn from ``softmax(logits /
    temperature)`` restricted to the ``top_k`` most likely tokens, by the Gumbel-max trick with noise from a
    generator seeded by ``(seed, keys[i], sample)`` alone (:func:`memorization.lm.row_seed`), so a prefix's draws
    do not depend on the batch it shares, its position in the call or the grid (every rank of a replica draws the
    same).  Runs on what it is given (on a grid: this replica's share)."""
    rows = [(i, j) for i in range(len(prefixes)) for j in range(samples)]
    flat = as_lm(model).local.generate_until(
        [prefixes[i] for i, _ in rows], n_new, sampling=Sampling(temperature, top_k=top_k),
        seeds=[row_seed(seed, keys[i], j) for i, j in rows], batch_size=batch_size, pad_id=pad_id)
    return [flat[i * samples:(i + 1) * samples] for i in range(len(prefixes))]


def extract(model: torch.nn.Module | LM, docs: list[dict], cfg: ExtractionConfig = ExtractionConfig(), tokenizer=None,
            progress: bool = False) -> dict:
    """Run extraction on ``docs`` (dicts with ``id``, ``token_ids`` and optionally ``exposures``).

    Returns ``{"overall": {...}, "by_exposure": {n: {...}}, "documents": [...], "skipped": [...]}``.
    ``overall`` summarizes the trained documents only (:func:`trained`): exposure-0 controls are
    never counted as members; they appear in ``by_exposure["0"]``.
    Documents shorter than prefix + suffix raise ``ValueError`` unless ``cfg.skip_short``.
    Prefix + suffix must fit the model's context (:func:`memorization.training.models.model_context`:
    ``max_position_embeddings``, or the trained length of a model trained from scratch):
    a fixed P + S beyond it raises ``ValueError``; in all-but-suffix mode ``cfg.max_tokens`` is
    lowered to it (with a warning).  The result's ``config`` is the configuration used.  ``model`` may be an
    :class:`memorization.lm.LM` on a grid: then as :func:`extract_on_grid`.
    """
    lm = as_lm(model, tokenizer)
    cfg, ctx, kept, splits, skipped = prepare(lm.model, docs, cfg)

    def decode(share: list[tuple[dict, tuple]]) -> list[dict]:
        return extraction_records(lm.local, [d for d, _ in share], [sp for _, sp in share], cfg, tokenizer, progress)

    records = lm.over_replicas(decode, list(zip(kept, splits)))
    return extraction_result(records, cfg, ctx, skipped)


def extraction_records(model: torch.nn.Module | LM, kept: list[dict], splits: list[tuple[list[int], list[int]]],
                       cfg: ExtractionConfig, tokenizer=None, progress: bool = False) -> list[dict]:
    """One record per document of ``kept`` (with its ``(prefix, suffix)`` of ``splits``): the greedy
    continuation and every per-document metric (module docstring).  Runs on what it is given (on a grid: this
    replica's share, :func:`extract_on_grid`)."""
    if not kept:
        return []
    lm = as_lm(model).local
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    gens = lm.generate_until([p for p, _ in splits], cfg.suffix_len, batch_size=cfg.batch_size, pad_id=pad,
                             progress=progress, desc="extract")
    sfx = torch.tensor([s for _, s in splits])
    gen = torch.tensor(gens)
    match = gen == sfx
    exact = match.all(1).float()
    token = match.float().mean(1)
    if tokenizer is not None:
        preds = tokenizer.batch_decode(gens, skip_special_tokens=True)
        refs = tokenizer.batch_decode(sfx.tolist(), skip_special_tokens=True)
    else:
        preds = [" ".join(map(str, g)) for g in gens]
        refs = [" ".join(map(str, s)) for s in sfx.tolist()]
    rl = rouge_l(preds, refs)
    prefix = prefix_match(gen, sfx)
    edit = 1.0 - token_edit_distance(gen, sfx).double() / max(1, sfx.shape[1])
    records = [{"id": d.get("id"), "exposures": d.get("exposures"), "exact_match": bool(exact[j]),
                "token_match": float(token[j]), "rouge_l": rl[j], "prefix_match": float(prefix[j]),
                "edit_similarity": float(edit[j]), "suffix": refs[j], "generated": preds[j],
                "generated_ids": gens[j]} for j, d in enumerate(kept)]
    if cfg.samples:  # (n, p)-discoverable extraction: how many of n sampled continuations reproduce the suffix
        keys = [zlib.crc32(str(d.get("id", j)).encode()) for j, d in enumerate(kept)]
        drawn = sample_continue(lm, [p for p, _ in splits], keys, cfg.suffix_len, cfg.samples, cfg.temperature,
                                cfg.top_k, cfg.seed, cfg.batch_size, pad)
        for r, (_, suffix), conts in zip(records, splits, drawn):
            r["sampled_matches"] = sum(c == list(suffix) for c in conts)
            r["samples"] = cfg.samples
    if cfg.beam or cfg.hints:
        adaptive_records(lm.model, records, splits, cfg, pad)
    return records


def adaptive_records(model: torch.nn.Module, records: list[dict], splits: list[tuple[list[int], list[int]]],
                     cfg: ExtractionConfig, pad_id: int = 0) -> None:
    """Add the adaptive attacks' per-document fields to ``records`` (:mod:`memorization.evaluation.adaptive`): with
    ``cfg.beam`` = B, ``beam_match`` (the suffix is one of the B beams), ``beam_top1`` (it is the best one) and
    ``beam_rank`` (its 1-based place among them, None if absent); with ``cfg.hints``, ``hints`` and
    ``longest_run``."""
    from .adaptive import beam_continue, hint_counts

    prefixes, suffixes = [p for p, _ in splits], [list(s) for _, s in splits]
    if cfg.beam:
        beams = beam_continue(model, prefixes, cfg.suffix_len, cfg.beam, cfg.batch_size, pad_id)
        for r, s, bs in zip(records, suffixes, beams):
            rank = next((j + 1 for j, (t, _) in enumerate(bs) if t == s), None)
            r.update(beam_match=rank is not None, beam_top1=rank == 1, beam_rank=rank, beam=cfg.beam)
    if cfg.hints:
        for r, h in zip(records, hint_counts(model, prefixes, suffixes, cfg.batch_size, pad_id)):
            r.update(h)


def extraction_result(records: list[dict], cfg: ExtractionConfig, ctx: int | None, skipped: list) -> dict:
    """:func:`extract`'s result of ``records``: overall (trained documents), by exposure, the documents."""
    groups = defaultdict(list)
    for r in records:
        groups[r["exposures"]].append(r)
    return {
        "config": {**cfg.__dict__, "model_context": ctx},
        "overall": summarize(trained(records)),
        "by_exposure": {str(k): summarize(v) for k, v in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0]))},
        "documents": records,
        "skipped": skipped,
    }


def extract_on_grid(model: torch.nn.Module, docs: list[dict], grid, cfg: ExtractionConfig = ExtractionConfig(),
                    tokenizer=None, progress: bool = False) -> dict:
    """:func:`extract` for a model parallelized on the axonn ``grid``: the documents are split over its data x
    depth replicas (replica ``r`` takes every ``replicas``-th document from ``r``), each replica's row x column
    ranks decode its share together (their KV cache holds their own heads), and every rank returns the whole
    result, records in the documents' order -- the same records as one process decoding them all.

    Every replica decodes the same number of documents (the last ones repeat one of theirs, dropped after):
    the depth axis all-gathers each layer's weights in every forward, so its ranks must run the same
    forwards."""
    return extract(LM(model, tokenizer, grid), docs, cfg, tokenizer, progress)


def prefix_match(gen: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per row, the length of the longest common prefix of ``gen`` and ``ref`` ``(N, S)`` as a fraction of ``S``."""
    if ref.shape[1] == 0:
        return torch.ones(ref.shape[0], dtype=torch.float64)
    return (gen == ref).long().cumprod(1).sum(1).double() / ref.shape[1]


def token_edit_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Levenshtein distance between each row of ``a`` ``(N, S)`` and of ``b`` ``(N, T)`` (unit costs), all rows
    at once: the dynamic programme ``D[i][j] = min(D[i-1][j] + 1, D[i][j-1] + 1, D[i-1][j-1] + [a_i != b_j])``
    one row ``i`` at a time, vectorised over documents; the ``j`` recursion is a running minimum
    ``D[i][j] = min_k<=j (E[k] + j - k)`` of the row ``E`` without insertions, computed with ``cummin``."""
    n, S, T = a.shape[0], a.shape[1], b.shape[1]
    j = torch.arange(T + 1, dtype=torch.long)
    prev = j.expand(n, T + 1).clone()  # D[0][j] = j
    for i in range(1, S + 1):
        sub_cost = (a[:, i - 1 : i] != b).long()  # (n, T)
        e = torch.empty_like(prev)
        e[:, 0] = i
        e[:, 1:] = torch.minimum(prev[:, 1:] + 1, prev[:, :-1] + sub_cost)  # deletion, substitution / match
        prev = torch.cummin(e - j, dim=1).values + j  # insertions: D[i][j] = min_k (E[k] + (j - k))
    return prev[:, T]


def trained(records: list[dict]) -> list[dict]:
    """The records that count as members: all but the exposure-0 controls (never trained on).
    A record whose ``exposures`` is unknown (None, e.g. ``eval/extract.py --documents``) counts."""
    return [r for r in records if r.get("exposures") is None or int(r["exposures"]) != 0]


def summarize(records: list[dict]) -> dict:
    """Per-document means of ``records``: exact match ``k/n`` with its 95% Wilson interval, token
    match ``1/n sum_d m_d``, Rouge-L ``1/n sum_d r_d``, and where the records have them prefix match, edit
    similarity and the near-verbatim rate (edit similarity >= :data:`NEAR_VERBATIM`); every metric is None
    when ``n = 0``."""
    from .stats import rate_ci

    n = len(records)
    approx = n > 0 and all("edit_similarity" in r for r in records)
    if n == 0:
        return {"n": 0, "exact_match": None, "exact_match_ci95": None, "token_match": None, "rouge_l": None}
    k = sum(bool(r["exact_match"]) for r in records)
    out = {
        "n": n,
        "exact_match": k / n,
        "exact_match_ci95": list(rate_ci(k, n)),
        "token_match": sum(r["token_match"] for r in records) / n,
        "rouge_l": sum(r["rouge_l"] for r in records) / n,
    }
    if all("sampled_matches" in r for r in records):  # sampled extraction: any of n, and the per-sample rate
        out["sampled_any"] = sum(r["sampled_matches"] > 0 for r in records) / n
        out["sampled_rate"] = sum(r["sampled_matches"] / r["samples"] for r in records) / n
    if all("beam_match" in r for r in records):  # beam search: the suffix among the B beams, or the best one
        out["beam_match"] = sum(bool(r["beam_match"]) for r in records) / n
        out["beam_match_ci95"] = list(rate_ci(sum(bool(r["beam_match"]) for r in records), n))
        out["beam_top1"] = sum(bool(r["beam_top1"]) for r in records) / n
    if all("hints" in r for r in records):  # hint-counting teacher forcing
        hints = sorted(r["hints"] for r in records)
        out["hints_mean"] = sum(hints) / n
        out["hints_median"] = float(hints[n // 2] if n % 2 else (hints[n // 2 - 1] + hints[n // 2]) / 2)
        out["hints_le1"] = sum(h <= 1 for h in hints) / n
        out["longest_run_mean"] = sum(r["longest_run"] for r in records) / n
    if approx:
        out["prefix_match"] = sum(r["prefix_match"] for r in records) / n
        out["edit_similarity"] = sum(r["edit_similarity"] for r in records) / n
        out["near_verbatim"] = sum(r["edit_similarity"] >= NEAR_VERBATIM for r in records) / n
    return out


#: edit similarity from which a continuation counts as near-verbatim (``near_verbatim``): at most one token in
#: ten inserted, deleted or substituted
NEAR_VERBATIM = 0.9


def fmt_metric(x: object, digits: int = 3) -> str:
    """A table cell: a float to ``digits`` decimals, ``–`` for a metric that is not defined (None: no
    document; NaN), anything else as ``str``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def exact_with_ci(summary: dict) -> str:
    """``0.969 (0.84–0.99)``: the exact-match rate and its 95% Wilson interval (summaries written
    before the interval was recorded show the rate alone; ``–`` when no document was summarized)."""
    if summary["exact_match"] is None:
        return "–"
    ci = summary.get("exact_match_ci95")
    rate = f"{summary['exact_match']:.3f}"
    return rate if ci is None else f"{rate} ({ci[0]:.2f}–{ci[1]:.2f})"


def metric_cells(summary: dict) -> str:
    """A summary's ``exact match (95% CI) | token match | Rouge-L`` table cells."""
    return f"{exact_with_ci(summary)} | {fmt_metric(summary['token_match'])} | {fmt_metric(summary['rouge_l'])}"


def markdown_table(result: dict, title: str = "Extraction") -> str:
    lines = [f"### {title}", "", "| exposures | n | exact match (95% CI) | token match | Rouge-L |",
             "|---|---|---|---|---|"]
    groups = result["by_exposure"]
    for k, v in groups.items():
        if list(groups) == ["None"]:  # documents of unknown exposure (eval/extract.py --documents): "all" says it
            break
        lines.append(f"| {'unknown' if k == 'None' else k} | {v['n']} | {metric_cells(v)} |")
    o = result["overall"]
    label = "**all but exposure 0**" if "0" in result["by_exposure"] else "**all**"
    lines.append(f"| {label} | {o['n']} | {metric_cells(o)} |")
    if result["skipped"]:
        lines.append(f"\n{len(result['skipped'])} document(s) skipped as shorter than prefix + suffix.")
    return "\n".join(lines) + "\n"
