"""The experiment's data: its tokenizer, target documents and mixture settings, and the check that a resumed
run still has the data it started with.  Every failure is a SystemExit saying what to do."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from memorization.experiment.components import mixture_config, parse_exposures  # noqa: F401 (re-exported)
from memorization.experiment.config import ExperimentConfig


def read_targets(path: str, text_field: str, flag: str = "--targets",
                 field_flag: str = "--targets-text-field") -> list[str]:
    """Documents from a directory of .txt files, a .json/.jsonl file, or a blank-line-separated .txt.

    Nothing is dropped: an empty document stays (a target too short to measure, refused or counted
    by the mixture), so target ``user-{j}`` is record (or sorted file) ``j``; a record without a text
    in ``text_field`` is refused, naming the record.  Errors name the CLI's ``flag`` (the path) and
    ``field_flag`` (the field).
    """
    from memorization.data.corpus import load_texts, read_text_file, visible_files

    p = Path(path).expanduser()
    if not p.exists():
        raise SystemExit(f"{flag} {path} does not exist")
    try:
        if p.is_dir():
            files = visible_files(p, "*.txt")
            if not files:
                raise SystemExit(f"{flag} {path}: the directory holds no .txt files (a .json/.jsonl file of "
                                 "documents is passed as the file itself)")
            return [read_text_file(f).strip() for f in files]
        texts = load_texts(str(p), text_field=text_field, field_flag=field_flag)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {flag} {path}: {e}") from None
    bad = [j for j, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise SystemExit(f"error: {flag} {path}: {len(bad)} record(s) have no text in field {text_field!r} "
                         f"(e.g. record #{bad[0]}: {texts[bad[0]]!r}); give every record one, or pass "
                         f"{field_flag} to name the field that holds it")
    return texts


def targets_text_field(cfg: ExperimentConfig) -> str:
    """The field ``--targets`` records hold their text in: ``--targets-text-field``, else ``--text-field``."""
    return cfg.data.targets_text_field or cfg.data.text_field


def tokenizer_spec(cfg: ExperimentConfig) -> str:
    """Where the run's tokenizer comes from: ``--tokenizer``, or with ``--init`` and no ``--tokenizer`` the
    checkpoint's directory."""
    from memorization.data.corpus import DEFAULT_TOKENIZER

    init = cfg.model.init
    return init if init and cfg.data.tokenizer == DEFAULT_TOKENIZER else cfg.data.tokenizer


def verified_store(path: str | Path, rt, flag: str) -> None:
    """Check every array of the token store ``path`` against its recorded crc32s
    (:func:`memorization.data.token_store.verify_store`) on rank 0 (every rank of ``rt`` when None: one process);
    a damaged store is the same one-line SystemExit on every rank (:class:`axonn.cli.SameOnEveryRank`)."""
    from memorization.data.token_store import StoreError, verify_store

    error = None
    if rt is None or rt.is_main:
        try:
            if not verify_store(path):
                print(f"note: token store {path} was prepared before stores recorded checksums: read unverified",
                      file=sys.stderr)
        except (StoreError, ValueError) as e:
            error = f"error: {flag}: {e}"
    if rt is not None:
        error = rt.from_main(error)
    if error:
        from axonn.cli import SameOnEveryRank

        raise SameOnEveryRank(error)


def open_run_store(cfg: ExperimentConfig, tokenizer, targets: list[str] | None, rt=None):
    """The mixture of the token store ``--store``, memory-mapped (:func:`memorization.data.token_store.open_store`),
    after checking its arrays against their recorded crc32s (:func:`verified_store`) and that it was prepared
    from this run's corpus, tokenizer, targets and mixture settings; a SystemExit with the ``data/prepare.py``
    command that makes the right store otherwise."""
    from memorization.data.token_store import StoreError, open_store

    try:
        mixture = open_store(cfg.data.store, corpus=cfg.data.corpus, tokenizer=tokenizer,
                             config=mixture_config(cfg), target_texts=targets, text_field=cfg.data.text_field,
                             tokenizer_spec=tokenizer_spec(cfg), targets_path=cfg.data.targets)
    except (StoreError, ValueError) as e:
        raise SystemExit(f"error: --store: {e}") from None
    verified_store(cfg.data.store, rt, "--store")  # (nothing read yet: the views map their files lazily)
    return mixture


def ensure_run_store(cfg: ExperimentConfig, tokenizer, targets: list[str] | None) -> tuple[Path, bool]:
    """The cache's token store of the run's corpus, tokenizer, targets and mixture settings, prepared now if the
    cache lacks it (:func:`memorization.data.token_store.ensure_cached_store`): ``(path, prepared)``."""
    from memorization.data.token_store import ensure_cached_store

    d = cfg.data
    return ensure_cached_store(d.corpus, tokenizer_spec(cfg), mixture_config(cfg), tokenizer, targets=targets,
                               targets_path=d.targets, text_field=d.text_field)


def cached_run_store(cfg: ExperimentConfig, tokenizer, targets: list[str] | None, rt):
    """The run's mixture from the cache's token store of its corpus, tokenizer, targets and mixture settings
    (:func:`memorization.data.token_store.cached_store_path`), prepared there by rank 0 on first use: so a run
    without ``--store`` trains from the same memory-mapped store as one with it, and a second run of the
    same data tokenizes nothing.  A failure of the preparation (the corpus too small, unreadable, ...) is
    a SystemExit on every rank with rank 0's message (:class:`axonn.cli.SameOnEveryRank`: printed once)."""
    from memorization.data.token_store import StoreError, open_store

    mcfg = mixture_config(cfg)
    error = path = None
    if rt.is_main:
        try:
            path, prepared = ensure_run_store(cfg, tokenizer, targets)
            if prepared and not cfg.output.no_progress:
                print(f"prepared the token store {path} (once; later runs of this data read it)", file=sys.stderr)
        except (StoreError, ValueError, FileNotFoundError) as e:
            error = f"error: --corpus {cfg.data.corpus}: {e}"
        except OSError as e:
            error = f"error: cannot prepare the token store in the cache ({e}): set GOLDFISH_CACHE to a writable " \
                    "directory, or prepare a store with data/prepare.py and pass --store"
    error, path = rt.from_main((error, None if path is None else str(path)))
    if error:  # every rank has rank 0's message now: printed once (axonn.cli.run_main)
        from axonn.cli import SameOnEveryRank

        raise SameOnEveryRank(error)
    try:
        mixture = open_store(path, corpus=cfg.data.corpus, tokenizer=tokenizer, config=mcfg, target_texts=targets,
                             text_field=cfg.data.text_field, tokenizer_spec=tokenizer_spec(cfg),
                             targets_path=cfg.data.targets)
    except (StoreError, ValueError) as e:
        raise SystemExit(f"error: the cached token store {path}: {e}") from None
    verified_store(path, rt, "the cached token store")
    return mixture


def load_run_tokenizer(cfg: ExperimentConfig):
    """The run's tokenizer (:func:`tokenizer_spec`), checked against the ``--init`` checkpoint's vocabulary;
    every failure a SystemExit saying what to do."""
    from memorization.data.corpus import load_tokenizer
    from memorization.training.models import check_same_vocab, check_tokenizer_fits

    init = cfg.model.init
    spec = tokenizer_spec(cfg)
    try:
        tokenizer = load_tokenizer(spec)
    except (OSError, ValueError) as e:
        fix = (" (the checkpoint's own: save its tokenizer into that directory, or pass --tokenizer)"
               if spec == init else "")
        raise SystemExit(f"error: cannot load the tokenizer {spec}{fix}: {e}") from None
    if init:
        try:
            check_tokenizer_fits(tokenizer, init)
            if spec != init and any((Path(init) / f).exists() for f in ("tokenizer.json", "tokenizer.model")):
                check_same_vocab(tokenizer, load_tokenizer(init), init)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    return tokenizer


def data_identity(manifest: dict) -> dict:
    """What a manifest says about the data a run trains and scores on: each target's and non-member's
    id, text and tokens, and the corpus fingerprint (absent from manifests written before it was recorded)."""
    def docs(key: str) -> list:
        return [[d.get("id"), d.get("text"), d.get("token_ids")] for d in manifest.get(key, [])]

    return {"targets": docs("targets"), "nonmembers": docs("nonmembers"),
            "corpus_fingerprint": manifest.get("corpus_fingerprint")}


def check_same_data(out: Path, mixture) -> None:
    """Refuse to continue the run in ``out`` if its saved manifest holds other targets, non-members or
    corpus than ``mixture``: its finished arms were trained and scored on that other data."""
    saved = out / "manifest.json"
    if not saved.exists():
        return
    old, new = data_identity(json.loads(saved.read_text())), data_identity(json.loads(json.dumps(mixture.manifest())))
    if old["corpus_fingerprint"] is None:
        new["corpus_fingerprint"] = None
    changed = [k for k in old if old[k] != new[k]]
    if changed:
        raise SystemExit(f"error: --resume: the {' and '.join(changed)} of the run in {out} changed since it "
                         "started (the --corpus, --targets or --tokenizer files were edited): restore them, or "
                         "start afresh with --overwrite or another --out")
