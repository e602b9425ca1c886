"""Corpora and tokenizers: Hugging Face ``datasets``/``tokenizers`` loaders plus an offline default.

The offline default corpus (``builtin:pydocs``) is English technical prose from CPython's reference
manual and standard-library docstrings, about 1.6 MB of text in 2,414 documents, enough to train the
CPU-sized presets.  It ships in the repository (``data/pydocs/``: provenance, licence and how it is
rebuilt are in its README) with its byte-level BPE tokenizer (``builtin:bpe4096``), so every machine
trains on the same bytes: both are checked against :data:`PYDOCS_SHA256` and :data:`TOKENIZER_SHA256`
when they are used, and the corpus is unpacked once into the cache directory (``$GOLDFISH_CACHE``,
default ``data/cache`` beside the repository), where a file with other bytes is replaced.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import re
from pathlib import Path

from .atomic import atomic_write_bytes, atomic_write_text

DEFAULT_CORPUS = "builtin:pydocs"
DEFAULT_TOKENIZER = "builtin:bpe4096"
_REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CORPUS = _REPO_ROOT / "data" / "pydocs" / "pydocs.jsonl.xz"
SHIPPED_TOKENIZER = _REPO_ROOT / "data" / "pydocs" / "tokenizer-bpe4096"
#: sha256 of the default corpus's JSON lines (``pydocs.jsonl.xz`` unpacked) and of its tokenizer's ``tokenizer.json``
PYDOCS_SHA256 = "3f4ce9199b28ccdaa75568fc0e60fab869d0ffd49cafff63864600e18c5531be"
TOKENIZER_SHA256 = "01436c12eb58199846021ed83d5ffa73571c697adb4023c5e956916b3ab2c7dc"


def cache_dir() -> Path:
    """The project's cache directory (``$GOLDFISH_CACHE`` or ``<repo>/data/cache``)."""
    env = os.environ.get("GOLDFISH_CACHE")
    path = Path(env) if env else _REPO_ROOT / "data" / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 20):
            h.update(piece)
    return h.hexdigest()


def _restore_hint(path: Path) -> str:
    shown = path.relative_to(_REPO_ROOT) if path.is_relative_to(_REPO_ROOT) else path
    return f"restore it (`git checkout -- {shown}`)"


def build_default_corpus(force: bool = False) -> Path:
    """The default corpus as JSON lines ``{"id", "text"}`` in the cache, unpacked from the shipped file.

    A cached file is used only when its sha256 is :data:`PYDOCS_SHA256`; any other (an older build from
    the local Python, a damaged copy) is replaced.  A shipped file that does not unpack to those bytes is
    refused: the figures of the README were measured on them."""
    path = cache_dir() / "pydocs.jsonl"
    if not force and path.exists() and sha256_file(path) == PYDOCS_SHA256:
        return path
    try:
        data = lzma.decompress(SHIPPED_CORPUS.read_bytes())
    except (OSError, lzma.LZMAError) as e:
        raise ValueError(f"the shipped default corpus {SHIPPED_CORPUS} cannot be read ({e}): "
                         f"{_restore_hint(SHIPPED_CORPUS)}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != PYDOCS_SHA256:
        raise ValueError(f"the shipped default corpus {SHIPPED_CORPUS} unpacks to sha256 {digest}, "
                         f"not {PYDOCS_SHA256}: "
                         f"{_restore_hint(SHIPPED_CORPUS)}, or after a deliberate rebuild "
                         "(data/pydocs/build.py --write) update PYDOCS_SHA256")
    atomic_write_bytes(path, data)
    return path


def load_documents(spec: str, text_field: str = "text", split: str = "train") -> list[str]:
    """Load documents from ``spec``.

    ``spec`` is ``builtin:pydocs`` (offline default), a local ``.json``/``.jsonl``/``.txt``/
    ``.parquet``/``.csv`` file or a directory of them (loaded through ``datasets``; hidden files are
    ignored), a directory written by ``datasets``' ``save_to_disk``, or a dataset name on the Hugging
    Face hub (needs network).  Text files hold one document per blank-line-separated block.
    Records whose ``text_field`` is missing or blank are dropped; a ``spec`` left with no document is an error.
    """
    texts = load_texts(spec, text_field, split)
    docs = [t for t in texts if isinstance(t, str) and t.strip()]
    if not docs:
        other = next((t for t in texts if t is not None and not isinstance(t, str)), None)
        held = f" (they hold e.g. a {type(other).__name__}: {str(other)[:60]!r})" if other is not None else ""
        raise ValueError(f"corpus {spec} holds no documents: none of its {len(texts)} record(s) has a non-blank "
                         f"string in field {text_field!r}{held}; give it documents (one per record, or "
                         "blank-line-separated blocks of a .txt) or name the field that holds them")
    return docs


def load_texts(spec: str, text_field: str = "text", split: str = "train", field_flag: str = "--text-field") -> list:
    """The ``text_field`` of every record of ``spec`` (see :func:`load_documents`) as stored: a
    record without the field gives ``None``, and nothing is dropped.  A ``spec`` without the field
    is an error that lists its fields and names the CLI flag (``field_flag``) that picks one."""
    if spec == DEFAULT_CORPUS:
        spec = str(build_default_corpus())
    path = Path(spec).expanduser()
    if path.exists():
        ds = _load_local(path, spec, split)
        if isinstance(ds, list):
            return ds
    elif looks_local(spec):
        raise FileNotFoundError(f"file {spec} does not exist")
    else:
        ds = _load_hub(spec, split)
    if text_field not in ds.column_names:
        raise ValueError(f"{spec} has no field {text_field!r} (fields: {ds.column_names}); pass {field_flag}")
    try:
        return list(ds[text_field])
    except UnicodeDecodeError as e:  # datasets' json builder stores the bytes unchecked: they fail only here
        raise _not_utf8(spec, path, e) from None


_TEXT_SUFFIXES = (".txt", ".md")  # documents separated by blank lines
_DATA_KINDS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}  # datasets' builders


def looks_local(spec: str) -> bool:
    """Whether ``spec`` names a local path (never a hub dataset): ``/``, ``.`` or ``~`` first, a data
    file's extension, or a parent directory that exists here (``data/mine`` beside a ``data/``)."""
    if spec.startswith(("/", ".", "~")) or spec.endswith((*_TEXT_SUFFIXES, *_DATA_KINDS)):
        return True
    parent = Path(spec).parent
    return parent != Path(".") and parent.is_dir()


def read_text_file(path: Path) -> str:
    """A UTF-8 text file (a leading byte-order mark dropped); ``ValueError`` naming it if it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e}): re-encode it, e.g. `iconv -f latin1 -t utf-8`") from None


def _first_not_utf8(files: list[Path]) -> Path | None:
    """The first of the text-format data files (.json(l), .csv) that is not UTF-8, read in 1 MiB pieces."""
    import codecs

    for f in files:
        if f.suffix.lower() not in (".json", ".jsonl", ".csv"):
            continue
        decoder = codecs.getincrementaldecoder("utf-8")()
        try:
            with open(f, "rb") as fh:
                while piece := fh.read(1 << 20):
                    decoder.decode(piece)
            decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            return f
    return None


def _not_utf8(spec: str, path: Path, err: UnicodeDecodeError) -> ValueError:
    """The error for a local corpus whose text is not UTF-8, naming its first such file."""
    bad = _first_not_utf8(visible_files(path)) if path.is_dir() else None
    where = f"corpus {spec}: {bad.relative_to(path)}" if bad else f"corpus {spec}"
    return ValueError(f"{where} is not UTF-8 text ({err}): re-encode it, e.g. `iconv -f latin1 -t utf-8`")


def _is_blank(path: Path) -> bool:
    """Whether a file holds nothing but whitespace (a data file without a single record)."""
    size = path.stat().st_size
    return size == 0 or (size <= 4096 and not path.read_bytes().strip())


def visible_files(root: Path, pattern: str = "*") -> list[Path]:
    """The files under ``root`` matching ``pattern``, sorted, without hidden ones (a path part starting
    with ``.``: ``.DS_Store``, ``.git/``, macOS ``._x`` resource forks)."""
    return sorted(p for p in root.rglob(pattern)
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_dict.json").exists()
                              or ((path / "state.json").exists() and (path / "dataset_info.json").exists()))


def _pick_split(ds, spec: str, split: str, how: str):
    """``split`` of a ``DatasetDict`` (or its only split, whatever its name); a ``Dataset`` as is."""
    from datasets import DatasetDict

    if not isinstance(ds, DatasetDict):
        return ds
    if split in ds:
        return ds[split]
    if len(ds) == 1:
        return next(iter(ds.values()))
    raise ValueError(f"corpus {spec} holds the splits {sorted(ds)}, none named {split!r}: {how}")


def _load_saved(path: Path, spec: str, split: str):
    """A directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (``split``, or its only one)."""
    from datasets import load_from_disk

    return _pick_split(load_from_disk(str(path)), spec, split,
                       "save the one to use on its own (`dataset_dict[name].save_to_disk(dir)`)")


_DOC_SUFFIXES = {".md", ""}  # README.md, LICENSE, CITATION: a dataset's documentation, not its data


def _load_local(path: Path, spec: str, split: str):
    """The documents of a local ``.txt``/``.md`` corpus (a list), else its ``datasets.Dataset``.

    A directory of data files (``.json(l)``/``.parquet``/``.csv``, one kind) is read the way
    ``datasets.load_dataset(dir)`` reads a dataset repository: files named for a split
    (``data/train-00000-of-00002.parquet``, ``test.jsonl``) form that split, and its documentation
    (``README.md``, ``LICENSE``) is not data.  ``split`` is taken, or the only split there is.
    """
    if _is_saved_dataset(path):
        return _load_saved(path, spec, split)
    files = visible_files(path) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"corpus directory {spec} holds no files")
    exts = {p.suffix.lower() for p in files}
    if exts <= set(_TEXT_SUFFIXES):
        docs = []
        for f in files:
            docs += [d.strip() for d in re.split(r"\n\s*\n", read_text_file(f)) if d.strip()]
        return docs
    if path.is_dir() and exts & set(_DATA_KINDS):
        exts -= _DOC_SUFFIXES
    builders = {_DATA_KINDS.get(e) for e in exts}
    if len(builders) != 1 or None in builders:
        raise ValueError(
            f"corpus {spec}: cannot mix or read file types {sorted(exts)}; use .txt, .json(l), .parquet or .csv"
        )
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    builder = builders.pop()
    try:
        if not path.is_dir():
            return load_dataset(builder, data_files=[str(path)], split="train")
        ds = load_dataset(str(path))
    except (StopIteration, ValueError, DatasetGenerationError) as e:
        # an empty data file fails in the builder's own words (StopIteration, "corresponds to no data", a cast
        # to no columns, "Parquet file size is 0 bytes"): name it instead
        empty = [f for f in files if f.suffix.lower() in _DATA_KINDS and _is_blank(f)]
        if empty and not path.is_dir():
            raise ValueError(f"corpus {spec} is empty (no records): give it documents") from None
        if empty:
            names = ", ".join(str(f.relative_to(path)) for f in empty[:5]) + (", ..." if len(empty) > 5 else "")
            raise ValueError(f"corpus {spec}: {len(empty)} of its files {'is' if len(empty) == 1 else 'are'} empty "
                             f"(no records): {names}; give them documents or remove them") from None
        cause = (e.__cause__ or e) if isinstance(e, DatasetGenerationError) else e
        if isinstance(cause, UnicodeDecodeError):
            raise _not_utf8(spec, path, cause) from None
        if isinstance(e, StopIteration) or "corresponds to no data" in str(e):  # `[]`, `{}` lines
            raise ValueError(f"corpus {spec} holds no records: give it documents") from None
        hint = ("; every file of a directory must hold the same fields: give them all the same ones, e.g. keep "
                "just the text with `jq -c '{text}'`" if "column names don't match" in str(cause) else "")
        raise ValueError(f"corpus {spec}: cannot read it as {builder}: {cause}{hint}") from None
    return _pick_split(ds, spec, split, "the files of a split are named for it (train-*.parquet, test.jsonl, ...)")


def _load_hub(spec: str, split: str):
    """A dataset of the Hugging Face hub; a clear error when it is neither there nor a local path."""
    from datasets import load_dataset

    try:
        return load_dataset(spec, split=split)
    except (ConnectionError, FileNotFoundError) as e:
        raise FileNotFoundError(f"corpus {spec} is no local file or directory, and the Hugging Face hub could not "
                                f"provide a dataset of that name ({e}): check the path, or the name and the "
                                "network") from None


def corpus_fingerprint(docs: list[str]) -> str:
    h = hashlib.sha256()
    for d in docs:
        h.update(d.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def has_tokenizer_files(d: Path) -> bool:
    """Whether the directory ``d`` holds any of the files a Hugging Face tokenizer is saved as."""
    return any((d / f).exists() for f in TOKENIZER_FILES)


def default_tokenizer_dir() -> Path:
    """The shipped default tokenizer's directory, after checking its ``tokenizer.json`` against
    :data:`TOKENIZER_SHA256`."""
    path = SHIPPED_TOKENIZER / "tokenizer.json"
    digest = sha256_file(path) if path.exists() else "missing"
    if digest != TOKENIZER_SHA256:
        raise ValueError(f"the shipped default tokenizer {path} has sha256 {digest}, not {TOKENIZER_SHA256}: "
                         f"{_restore_hint(path)}, or after a deliberate rebuild (data/pydocs/build.py --write) "
                         "update TOKENIZER_SHA256")
    return SHIPPED_TOKENIZER


def tokenizer_sha256(tokenizer) -> str:
    """The sha256 of a tokenizer's ``tokenizer.json`` where it was loaded from a directory holding one
    (the shipped default's is :data:`TOKENIZER_SHA256`), else of its fast tokenizer serialised to JSON."""
    path = Path(str(getattr(tokenizer, "name_or_path", "") or "")) / "tokenizer.json"
    if path.is_file():
        return sha256_file(path)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} is not a fast tokenizer: it has no tokenizer.json")
    return hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()


def corpus_sha256(corpus: str) -> str | None:
    """The sha256 of a corpus's bytes: the default corpus's :data:`PYDOCS_SHA256` (checked by
    :func:`build_default_corpus`), a local corpus file's, ``None`` for a directory or hub dataset (whose
    documents ``corpus_fingerprint`` covers)."""
    if corpus == DEFAULT_CORPUS:
        build_default_corpus()
        return PYDOCS_SHA256
    path = Path(corpus).expanduser()
    return sha256_file(path) if path.is_file() else None


def data_checksums(corpus: str, tokenizer) -> dict:
    """What a manifest records of the data a run was built from: :func:`corpus_sha256` and
    :func:`tokenizer_sha256`."""
    return {"corpus_sha256": corpus_sha256(corpus), "tokenizer_sha256": tokenizer_sha256(tokenizer)}


def load_tokenizer(spec: str = DEFAULT_TOKENIZER):
    """A Hugging Face tokenizer by name or local path; ``builtin:bpe4096`` is trained offline.

    The returned tokenizer always has ``bos``, ``eos`` and ``pad`` tokens.
    """
    from transformers import AutoTokenizer

    if spec == DEFAULT_TOKENIZER:
        tok = AutoTokenizer.from_pretrained(str(default_tokenizer_dir()), trust_remote_code=False)
    else:
        if spec.startswith(("/", ".", "~")) and not Path(spec).expanduser().exists():
            raise FileNotFoundError(f"tokenizer path {spec} does not exist")
        d = Path(spec).expanduser()
        if d.is_dir() and not has_tokenizer_files(d):  # transformers 4.x: AttributeError
            raise FileNotFoundError(f"{spec} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
        tok = AutoTokenizer.from_pretrained(spec, trust_remote_code=False)
    if tok.eos_token is None:
        raise ValueError(f"tokenizer {spec} has no EOS token; documents cannot be separated")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def train_bpe_tokenizer(docs: list[str], vocab_size: int, out: Path) -> Path:
    """Train a byte-level BPE tokenizer of ``vocab_size`` tokens on ``docs`` and save it to the directory
    ``out`` (``<s>`` first in every encoding, ``</s>`` and ``<pad>`` special): how the shipped default
    tokenizer was made (``data/pydocs/build.py``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    # transformers 5 records its own class (TokenizersBackend), which 4.x cannot load; the generic fast class
    # loads the same tokenizer.json on both, so the tokenizer (and a run's copy of it) moves between versions
    cfg = out / "tokenizer_config.json"
    atomic_write_text(cfg, json.dumps({**json.loads(cfg.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"},
                                      indent=2) + "\n")
    return out
