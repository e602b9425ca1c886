"""The MIA run end to end: choose a manifest's members and nonmembers, score them, report and write the outputs.

:func:`run_mia` is what ``python eval/mia.py`` calls; :func:`select_nonmembers` says which documents it compares.
"""
from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..eval_model import MissingTokenizerError, check_vocab, default_device, grid_runtime
from memorization.lm import LM
from memorization.data.mixture import is_int, load_manifest
from .report import mia_report, plot_roc, report_markdown
from .scoring import check_max_length, mia_scores

log = logging.getLogger(__name__)


def _tokenize_docs(docs: list[dict[str, Any]], tokenizer: Any | None, what: str) -> list[list[int]]:
    out = []
    for i, d in enumerate(docs):
        if "token_ids" in d:
            out.append([int(t) for t in d["token_ids"]])
            continue
        if tokenizer is None:
            raise MissingTokenizerError(
                f"{what}[{i}] ({d.get('id', '?')}) has no token_ids and no tokenizer is "
                "available to tokenize its text; pass --tokenizer PATH")
        out.append(tokenizer(d["text"], add_special_tokens=False)["input_ids"])
    return out



#: ``nonmember_source`` values of :func:`run_mia`'s report, and what they mean.
NONMEMBER_SOURCES: dict[str, str] = {
    "exposure0_targets": "the targets with exposures = 0 (never trained on, drawn like the members)",
    "exposure0_targets+heldout_corpus": "the targets with exposures = 0 plus the manifest's held-out "
                                        "corpus documents (targets and both kinds of nonmembers "
                                        "are drawn from the same corpus)",
    "heldout_corpus": "the manifest's held-out corpus documents (the targets are drawn from the "
                      "same corpus)",
    "background_corpus": "held-out documents of the background corpus, NOT the user's target "
                         "documents",
    "manifest_nonmembers": "the manifest's nonmembers (their origin is not recorded)",
}

USER_TARGETS_WARNING = (
    "the targets are user-supplied but none has exposure 0, so the nonmembers are documents of "
    "the background corpus, not of the user's documents: the AUC measures the shift between the "
    "two distributions as well as membership. Rebuild the run with --exposures 0,N so that part "
    "of the user's own documents is held out (exposure 0) and used as the nonmembers."
)


def _targets_source(manifest: dict[str, Any]) -> str:
    """``"user"``, ``"corpus"`` or ``"unknown"``: where the manifest's targets come from
    (``targets_source``, recorded by :mod:`memorization.data.mixture`; older manifests: the ids)."""
    if manifest.get("targets_source") in ("user", "corpus"):
        return manifest["targets_source"]
    ids = [str(t.get("id", "")) for t in manifest["targets"]]
    if ids and all(i.startswith("user-") for i in ids):
        return "user"
    if ids and all(i.startswith("doc-") for i in ids):
        return "corpus"
    return "unknown"


def select_nonmembers(manifest: dict[str, Any]) -> tuple[list[dict], list[dict], str, list[str]]:
    """``(members, nonmembers, nonmember_source, warnings)`` for a manifest.

    Members are the targets with ``exposures >= 1``.  Nonmembers are the targets with
    ``exposures == 0`` when there are any -- pooled with the manifest's ``nonmembers`` only
    when the targets were drawn from the corpus those come from -- else the manifest's
    ``nonmembers``, with a warning when the targets are user-supplied (the nonmembers are then
    background-corpus documents, a different distribution).  ``nonmember_source`` is a key of
    :data:`NONMEMBER_SOURCES`.
    """
    targets, held_out = manifest["targets"], manifest["nonmembers"]
    members = [t for t in targets if int(t["exposures"]) >= 1]
    controls = [t for t in targets if int(t["exposures"]) == 0]
    if not members:
        raise ValueError("the manifest has no targets with exposures >= 1")
    source = _targets_source(manifest)
    warns: list[str] = []
    if controls:
        if source == "corpus" and held_out:
            return members, controls + held_out, "exposure0_targets+heldout_corpus", warns
        return members, controls, "exposure0_targets", warns
    if not held_out:
        raise ValueError("the manifest has no nonmembers and no exposure-0 targets to compare "
                         "against")
    if source == "user":
        warns.append(USER_TARGETS_WARNING)
        return members, held_out, "background_corpus", warns
    return members, held_out, ("heldout_corpus" if source == "corpus" else "manifest_nonmembers"), warns


def run_mia(
    model_path: str | os.PathLike,
    manifest_path: str | os.PathLike,
    reference_model_path: str | os.PathLike | None = None,
    *,
    out_dir: str | os.PathLike | None = None,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str | None = "auto",
    k: float = 0.2,
    max_length: int | None = None,
    add_bos: bool = True,
    fpr_target: float = 0.01,
    tokenizer_path: str | os.PathLike | None = None,
    grid: str | None = None,
) -> dict[str, Any]:
    """Score the members and nonmembers of a manifest and report how separable they are.

    With ``grid`` (``"D,R,C,Z"``, under torchrun/mpiexec/srun) the models are parallelized on that grid as in
    training, each rank reading only its own shards, and the documents are split over its data x depth
    replicas (:meth:`memorization.lm.LM.over_replicas`): every rank returns the report, rank 0 alone
    writes ``out_dir``.

    Members are the targets with ``exposures >= 1``; nonmembers are chosen by
    :func:`select_nonmembers` (the exposure-0 targets when there are any).  The manifest's
    ``token_ids`` are scored as given (``add_bos`` prepends the tokenizer's BOS when a document
    does not start with it; ``max_length`` truncates), and every score covers exactly that
    span: zlib compresses the decoded scored tokens (the manifest's ``text``, the whole
    document, is not used; without a tokenizer zlib is skipped), and a reference model scores
    the same ids, or the decoded span re-tokenised if its vocabulary differs.

    With ``out_dir``: writes ``mia.json`` (the report), ``mia.md`` (a markdown table),
    ``mia_scores.jsonl`` (per-document scores; ``split`` is the document's role, ``target``
    = member or ``nonmember``, and ``from`` the manifest list it comes from) and
    ``mia_roc.png``.

    Returns the report of :func:`mia_report` plus ``model``, ``manifest``,
    ``reference_model``, ``k``, ``n_targets`` (in the manifest), ``n_members``,
    ``n_nonmembers`` (compared), ``nonmember_source``, ``nonmember_description``,
    ``targets_source``, ``warnings`` and ``markdown``.
    """
    # what can be checked without the models is checked before they load
    if not 0.0 < k <= 1.0:
        raise ValueError(f"k must be a fraction in (0, 1]: 0.2 is 20%, got {k}")
    if not 0.0 < fpr_target < 1.0:
        raise ValueError(f"fpr_target must be a fraction in (0, 1): 0.01 is 1%, got {fpr_target}")
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    check_max_length(max_length, None)
    if max_length is not None and (Path(model_path) / "config.json").is_file():
        from transformers import AutoConfig

        from memorization.training.models import model_context

        check_max_length(max_length, model_context(AutoConfig.from_pretrained(str(model_path), trust_remote_code=False)))
    device = device or default_device()
    manifest = load_manifest(manifest_path)
    try:
        members, nonmembers, nonmember_source, warns = select_nonmembers(manifest)
    except ValueError as err:
        raise ValueError(f"manifest {manifest_path}: {err}") from None
    for w in warns:
        log.warning("%s", w)
    rt = grid_runtime(grid) if grid else None
    if rt is not None:
        from memorization.training.runtime import check_replicas

        check_replicas(len(members) + len(nonmembers), rt.grid, "documents")  # before any weight loads
    lm = LM.load(model_path, grid=rt, device=device, dtype=dtype, tokenizer_path=tokenizer_path,
                 require_tokenizer=False)
    model, tok = lm.model, lm.tokenizer
    if rt is not None:
        device = None  # each rank's own device
    docs = members + nonmembers
    ids = _tokenize_docs(docs, tok, "documents")
    # name a bad document by its manifest id: mia_scores only knows its place in members + nonmembers
    check_vocab(model, ids, f"manifest {manifest_path}",
                 names=[str(d.get("id", i)) for i, d in enumerate(docs)])

    ref_model, ref_tok = None, None
    if reference_model_path is not None:
        ref = LM.load(reference_model_path, grid=rt, device=device, dtype=dtype, require_tokenizer=False,
                      flag="--reference-model")
        ref_model, ref_tok = ref.model, ref.tokenizer
        if rt is None and ref_tok is not None and tok is None:
            log.warning("the target checkpoint has no tokenizer: assuming the reference model "
                        "shares its vocabulary and scoring the same token ids")

    def score(share: list[list[int]]) -> dict[str, np.ndarray]:
        return mia_scores(model, tok, share, batch_size=batch_size, device=device, reference_model=ref_model,
                          reference_tokenizer=ref_tok, k=k, max_length=max_length, add_bos=add_bos)

    if rt is None:
        scores = score(ids)
    else:
        def rows(share: list[list[int]]) -> list[dict[str, Any]]:
            s = score(share)
            return [{n: v[i] for n, v in s.items()} for i in range(len(share))]

        per_doc = lm.over_replicas(rows, ids)
        scores = {n: np.array([r[n] for r in per_doc]) for n in per_doc[0]}
    n_m = len(members)
    member = {n: v[:n_m] for n, v in scores.items()}
    nonmember = {n: v[n_m:] for n, v in scores.items()}
    exposures = [int(t["exposures"]) for t in members]
    report = mia_report(member, nonmember, member_exposures=exposures, fpr_target=fpr_target)
    report.update({
        "model": str(model_path),
        "manifest": str(manifest_path),
        "reference_model": None if reference_model_path is None else str(reference_model_path),
        "k": k,
        "n_targets": len(manifest["targets"]),
        "n_members": n_m,
        "n_nonmembers": len(nonmembers),
        "targets_source": _targets_source(manifest),
        "nonmember_source": nonmember_source,
        "nonmember_description": NONMEMBER_SOURCES[nonmember_source],
        "warnings": warns,
    })
    report["markdown"] = report_markdown(report)
    if rt is not None:
        report["grid"] = grid

    if out_dir is not None and (rt is None or rt.is_main):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "mia.json", "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2)
        (out / "mia.md").write_text(report["markdown"], encoding="utf-8")
        with open(out / "mia_scores.jsonl", "w", encoding="utf-8") as fh:
            from_targets = {id(t) for t in manifest["targets"]}
            for i, d in enumerate(docs):
                is_target = id(d) in from_targets
                row: dict[str, Any] = {
                    "id": d.get("id", str(i)),
                    "split": "target" if i < n_m else "nonmember",
                    "from": "targets" if is_target else "nonmembers",
                    "exposures": int(d["exposures"]) if is_target else None,
                }
                for n, v in scores.items():
                    x = v[i].item()
                    row[n] = None if isinstance(x, float) and math.isnan(x) else x
                fh.write(json.dumps(row) + "\n")
        plot_roc(member, nonmember, out / "mia_roc.png")
    return report
