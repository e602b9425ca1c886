#!/usr/bin/env python
"""Rebuild the shipped default corpus (``builtin:pydocs``) and its tokenizer from their sources.

The corpus is English technical prose from CPython: the reference-manual topics of
``pydoc_data.topics`` and the docstrings of the standard library (read with ``ast``, nothing
imported), split at blank lines into chunks of at most ~1,600 characters, exactly de-duplicated,
chunks under 200 characters dropped.  What a Python installation holds depends on its version and
on how it was built and patched, so the corpus is built once and shipped (``pydocs.jsonl.xz``);
every run checks the shipped bytes against ``memorization.data.corpus.PYDOCS_SHA256``.  The shipped
file was built from CPython 3.11.7 (pyenv build).  The tokenizer (``tokenizer-bpe4096/``) is a
byte-level BPE of 4,096 tokens trained on it with the pinned ``tokenizers`` (``constraints.txt``).

    python data/pydocs/build.py --check     # does this Python rebuild the shipped bytes? (exit 1 if not)
    python data/pydocs/build.py --write     # replace the shipped corpus and tokenizer (then update
                                            # the checksums in memorization/data/corpus.py and the README figures)
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import lzma
import re
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Iterable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # runnable from a checkout without installation

from axonn.cli import HelpFormatter  # noqa: E402
from memorization.data.corpus import PYDOCS_SHA256, SHIPPED_CORPUS, SHIPPED_TOKENIZER, train_bpe_tokenizer  # noqa: E402

SKIP_DIRS = {"site-packages", "test", "tests", "idlelib", "lib2to3", "tkinter", "turtledemo", "ensurepip"}


def paragraph_chunks(text: str, max_chars: int = 1600) -> list[str]:
    """``text`` split at blank lines into chunks of at most ~``max_chars`` (a longer paragraph stays whole)."""
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


def python_documents() -> Iterable[str]:
    """The topics of ``pydoc_data`` (sorted by name), then the docstrings of >= 200 characters of every
    module, class and function of the standard library (files sorted by path)."""
    import pydoc_data.topics as topics

    for name in sorted(topics.topics):
        yield from paragraph_chunks(topics.topics[name])
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if SKIP_DIRS.intersection(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 200:
                    yield from paragraph_chunks(doc)


def corpus_bytes() -> bytes:
    """The corpus as JSON lines ``{"id", "text"}``, built from this Python installation."""
    seen: set[str] = set()
    lines = []
    for text in python_documents():
        key = " ".join(text.split())
        if len(key) < 200 or key in seen:  # exact de-duplication: no target leaks via a copy
            continue
        seen.add(key)
        lines.append(json.dumps({"id": f"pydocs-{len(lines):05d}", "text": text}))
    return ("\n".join(lines) + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=HelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare this Python's corpus with the shipped one")
    mode.add_argument("--write", action="store_true", help="replace the shipped corpus and retrain its tokenizer")
    args = p.parse_args(argv)
    data = corpus_bytes()
    digest, n_docs = hashlib.sha256(data).hexdigest(), data.count(b"\n")
    print(f"Python {sys.version.split()[0]}: {n_docs} documents, "
          f"{len(data):,} bytes, sha256 {digest}")
    if args.check:
        same = digest == PYDOCS_SHA256
        print("identical to the shipped corpus" if same else f"differs from the shipped corpus ({PYDOCS_SHA256})")
        return 0 if same else 1
    SHIPPED_CORPUS.write_bytes(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    docs = [json.loads(line)["text"] for line in data.decode("utf-8").splitlines()]
    with tempfile.TemporaryDirectory() as tmp:
        train_bpe_tokenizer(docs, 4096, Path(tmp))
        for f in Path(tmp).iterdir():
            (SHIPPED_TOKENIZER / f.name).write_bytes(f.read_bytes())
    tok_digest = hashlib.sha256((SHIPPED_TOKENIZER / "tokenizer.json").read_bytes()).hexdigest()
    print(f"wrote {SHIPPED_CORPUS} and {SHIPPED_TOKENIZER}; set PYDOCS_SHA256 = {digest!r} and "
          f"TOKENIZER_SHA256 = {tok_digest!r} in memorization/data/corpus.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
