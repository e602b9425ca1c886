"""Corpora and tokenizers: Hugging Face ``datasets``/``tokenizers`` loaders plus an offline default.

The offline default corpus is English technical prose that ships with every CPython: the
reference-manual topics of ``pydoc_data`` and the docstrings of the standard library (read
with ``ast``, nothing imported).  About 1.6 MB of text, ~3,500 documents, enough to train the
CPU-sized presets.  It is built once into the cache directory (``$GOLDFISH_CACHE``, default
``data/cache`` beside the repository) together with a byte-level BPE tokenizer trained on it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterable

from .atomic import atomic_write_text

DEFAULT_CORPUS = "builtin:pydocs"
DEFAULT_TOKENIZER = "builtin:bpe4096"
_REPO_ROOT = Path(__file__).resolve().parents[1]
_SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}


def cache_dir() -> Path:
    """The project's cache directory (``$GOLDFISH_CACHE`` or ``<repo>/data/cache``)."""
    env = os.environ.get("GOLDFISH_CACHE")
    path = Path(env) if env else _REPO_ROOT / "data" / "cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _split_paragraph_chunks(text: str, max_chars: int = 1600) -> list[str]:
    """Split a long text at blank lines into chunks of at most ~max_chars."""
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    chunks, cur = [], ""
    for p in paras:
        if cur and len(cur) + len(p) + 2 > max_chars:
            chunks.append(cur)
            cur = ""
        cur = f"{cur}\n\n{p}" if cur else p
    if cur:
        chunks.append(cur)
    return chunks


def _pydoc_documents() -> Iterable[str]:
    import pydoc_data.topics as topics

    for name in sorted(topics.topics):
        yield from _split_paragraph_chunks(topics.topics[name])
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if _SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 200:
                    yield from _split_paragraph_chunks(doc)


def build_default_corpus(force: bool = False) -> Path:
    """Build (once) the offline default corpus as JSON lines ``{"id", "text"}``; return its path."""
    path = cache_dir() / "pydocs.jsonl"
    if path.exists() and not force:
        return path
    seen: set[str] = set()
    lines = []
    for text in _pydoc_documents():
        key = " ".join(text.split())
        if len(key) < 200 or key in seen:  # exact de-duplication: no target leaks via a copy
            continue
        seen.add(key)
        lines.append(json.dumps({"id": f"pydocs-{len(lines):05d}", "text": text}))
    atomic_write_text(path, "\n".join(lines) + "\n")
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


def load_tokenizer(spec: str = DEFAULT_TOKENIZER):
    """A Hugging Face tokenizer by name or local path; ``builtin:bpe4096`` is trained offline.

    The returned tokenizer always has ``bos``, ``eos`` and ``pad`` tokens.
    """
    from transformers import AutoTokenizer

    if spec == DEFAULT_TOKENIZER:
        tok = AutoTokenizer.from_pretrained(str(build_default_tokenizer()))
    else:
        if spec.startswith(("/", ".", "~")) and not Path(spec).expanduser().exists():
            raise FileNotFoundError(f"tokenizer path {spec} does not exist")
        d = Path(spec).expanduser()
        if d.is_dir() and not has_tokenizer_files(d):  # transformers 4.x: AttributeError
            raise FileNotFoundError(f"{spec} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
        tok = AutoTokenizer.from_pretrained(spec)
    if tok.eos_token is None:
        raise ValueError(f"tokenizer {spec} has no EOS token; documents cannot be separated")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build_default_tokenizer(vocab_size: int = 4096, force: bool = False) -> Path:
    """Train (once) a byte-level BPE tokenizer on the default corpus; return its directory."""
    out = cache_dir() / f"tokenizer-bpe{vocab_size}"
    if (out / "tokenizer.json").exists() and not force:
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    docs = load_documents(DEFAULT_CORPUS)
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
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    fast.save_pretrained(str(tmp))
    # transformers 5 records its own class (TokenizersBackend), which 4.x cannot load; the generic fast class
    # loads the same tokenizer.json on both, so a cache (and a run's copy of it) moves between versions
    cfg = tmp / "tokenizer_config.json"
    atomic_write_text(cfg, json.dumps({**json.loads(cfg.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"},
                                      indent=2) + "\n")
    if force:  # os.replace cannot replace a directory that holds files: the old one goes first
        shutil.rmtree(out, ignore_errors=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished first: identical content
        shutil.rmtree(tmp, ignore_errors=True)
    return out
