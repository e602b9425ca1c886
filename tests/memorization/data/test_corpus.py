"""memorization.data.corpus: local corpora are read offline; a missing local file is a clear error."""
import json

import pytest

from memorization.data.corpus import load_documents
from tests.support import REPO


@pytest.mark.parametrize("name", ["docs.csv", "docs.md", "docs.jsonl", "docs.parquet"])
def test_missing_local_corpus_file_is_a_clear_error(name):
    # a relative name of a local file type never goes to the hub (no network here)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(f"no-such-dir-xyz/{name}")


def test_text_files_hold_one_document_per_block(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nline two\n\n\nsecond doc\n")
    assert load_documents(str(tmp_path / "a.txt")) == ["first doc\nline two", "second doc"]


def _docs(n: int = 6) -> list[str]:
    return [f"document {i} " + "text " * 20 for i in range(n)]


def test_a_directory_written_by_save_to_disk_is_a_corpus(tmp_path):
    from datasets import Dataset, DatasetDict

    ds = Dataset.from_dict({"text": _docs(), "n": list(range(6))})
    ds.save_to_disk(str(tmp_path / "one"))
    assert load_documents(str(tmp_path / "one")) == _docs()
    DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "splits"))
    assert load_documents(str(tmp_path / "splits")) == _docs()
    assert load_documents(str(tmp_path / "splits"), split="test") == _docs(2)
    with pytest.raises(ValueError, match=r"splits \['train', 'test'\]|splits \['test', 'train'\]"):
        load_documents(str(tmp_path / "splits"), split="validation")


def test_hidden_files_in_a_corpus_directory_are_ignored(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in _docs()) + "\n")
    (tmp_path / ".DS_Store").write_bytes(b"\0\1")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    assert load_documents(str(tmp_path)) == _docs()


def test_a_missing_local_path_never_goes_to_the_hub(tmp_path, monkeypatch):
    import datasets

    def no_hub(*a, **k):
        raise AssertionError("went to the hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with pytest.raises(FileNotFoundError, match="does not exist"):  # data/ is here: a local path, misspelt
        load_documents("data/my-corpus")


def test_a_name_the_hub_cannot_provide_says_so(monkeypatch):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'my-corpus' on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="no local file or directory.*check the path"):
        load_documents("my-corpus")


def test_unreadable_files_are_named_and_a_bom_is_not_text(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl: cannot read it as json: .*row 1"):
        load_documents(str(bad))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin.txt is not UTF-8 text.*re-encode"):
        load_documents(str(latin))
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufefffirst doc\r\n\r\nsecond doc\r\n".encode("utf-8"))  # as Windows Notepad saves it
    assert load_documents(str(bom)) == ["first doc", "second doc"]


def test_a_dataset_repository_snapshot_is_a_corpus(tmp_path):
    """A dataset repository copied to a machine without network (`huggingface-cli download --repo-type
    dataset`): its README.md and LICENSE are documentation, not data, and files named for a split
    form that split, as ``datasets.load_dataset(dir)`` reads it."""
    from datasets import Dataset

    snap = tmp_path / "snapshot"
    (snap / "data").mkdir(parents=True)
    Dataset.from_dict({"text": _docs()}).to_parquet(str(snap / "data" / "train-00000-of-00001.parquet"))
    Dataset.from_dict({"text": _docs(2)}).to_parquet(str(snap / "data" / "test-00000-of-00001.parquet"))
    (snap / "README.md").write_text("---\nlicense: mit\n---\n# A corpus\n\nSome words about it.\n")
    (snap / "LICENSE").write_text("MIT License\n")
    (snap / ".gitattributes").write_text("*.parquet filter=lfs diff=lfs merge=lfs -text\n")
    assert load_documents(str(snap)) == _docs()
    assert load_documents(str(snap), split="test") == _docs(2)
    with pytest.raises(ValueError, match=r"none named 'validation'.*named for it"):
        load_documents(str(snap), split="validation")
    plain = tmp_path / "plain"  # file names that name no split: one split, all of them
    plain.mkdir()
    for i, part in enumerate((_docs()[:3], _docs()[3:])):
        (plain / f"part{i}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
    (plain / "README.md").write_text("# notes\n")
    assert load_documents(str(plain)) == _docs()
    (plain / "extra.txt").write_text("a text file among json files\n")
    with pytest.raises(ValueError, match=r"cannot mix or read file types \['.jsonl', '.txt'\]"):
        load_documents(str(plain))


def test_a_directory_without_tokenizer_files_is_a_clear_error(tmp_path):
    """A model directory saved without its tokenizer: the error says so (transformers 4.x would raise an
    AttributeError from deep inside its slow-tokenizer conversion)."""
    from memorization.data.corpus import load_tokenizer

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(FileNotFoundError, match=r"holds no tokenizer \(none of tokenizer.json"):
        load_tokenizer(str(tmp_path))


def test_the_built_in_tokenizer_is_saved_in_a_form_every_supported_transformers_loads(tmp_path):
    """transformers 5 saves its own tokenizer class name, which 4.x cannot load; a tokenizer made by
    ``train_bpe_tokenizer`` (the shipped default's recipe) names the generic fast class instead, and loads
    as the same tokenizer."""
    from transformers import AutoTokenizer

    from memorization.data.corpus import load_documents, train_bpe_tokenizer

    out = train_bpe_tokenizer(load_documents("builtin:pydocs")[:300], 512, tmp_path / "tok")
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    tok, text = AutoTokenizer.from_pretrained(str(out)), "Return the value of x.\n\n  def f(x): return x"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.decode(ids[1:]) == text
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<s>", "</s>", "<pad>")


def _shipped(tmp_path, monkeypatch, data: bytes):
    """Point the default corpus at a shipped file holding ``data`` (xz) and the cache at ``tmp_path/cache``."""
    import lzma

    import memorization.data.corpus as corpus

    shipped = tmp_path / "pydocs.jsonl.xz"
    shipped.write_bytes(lzma.compress(data))
    monkeypatch.setattr(corpus, "SHIPPED_CORPUS", shipped)
    monkeypatch.setenv("GOLDFISH_CACHE", str(tmp_path / "cache"))
    return corpus


def test_the_default_corpus_is_the_shipped_bytes_and_a_cache_with_other_bytes_is_replaced(tmp_path, monkeypatch):
    """The cache holds exactly the bytes whose sha256 is PYDOCS_SHA256 (what the README's figures were
    measured on), whatever Python builds it; a cached file with other bytes (an older build from the local
    Python's docs, a damaged copy) is replaced by the shipped one, not used."""
    import lzma

    from memorization.data.corpus import PYDOCS_SHA256, SHIPPED_CORPUS, sha256_file

    corpus = _shipped(tmp_path, monkeypatch, lzma.decompress(SHIPPED_CORPUS.read_bytes()))
    stale = tmp_path / "cache" / "pydocs.jsonl"
    stale.parent.mkdir()
    stale.write_text('{"id": "pydocs-00000", "text": "built from another Python"}\n')
    assert corpus.build_default_corpus() == stale and sha256_file(stale) == PYDOCS_SHA256
    assert len(load_documents("builtin:pydocs")) == 2414


def test_a_shipped_corpus_with_other_bytes_is_refused_naming_the_file_and_the_fix(tmp_path, monkeypatch):
    corpus = _shipped(tmp_path, monkeypatch, b'{"id": "x", "text": "edited"}\n')
    with pytest.raises(ValueError, match=r"pydocs\.jsonl\.xz unpacks to sha256 [0-9a-f]{64}, not .*git checkout"):
        corpus.build_default_corpus()
    corpus.SHIPPED_CORPUS.write_bytes(b"not xz")
    with pytest.raises(ValueError, match=r"cannot be read .*git checkout"):
        corpus.build_default_corpus()


def test_a_shipped_tokenizer_with_other_bytes_is_refused(tmp_path, monkeypatch):
    import shutil

    import memorization.data.corpus as corpus

    copy = tmp_path / "tok"
    shutil.copytree(corpus.SHIPPED_TOKENIZER, copy)
    monkeypatch.setattr(corpus, "SHIPPED_TOKENIZER", copy)
    assert corpus.load_tokenizer().bos_token == "<s>"
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text().replace('"Ġthe"', '"Ġteh"', 1))
    with pytest.raises(ValueError, match=r"tokenizer\.json has sha256 [0-9a-f]{64}, not .*TOKENIZER_SHA256"):
        corpus.load_tokenizer()


def _pinned(package: str) -> str | None:
    """The version of ``package`` that constraints.txt (the environment of the README's figures) pins."""
    text = (REPO / "constraints.txt").read_text()
    return next((line.split("==")[1].strip() for line in text.splitlines()
                 if line.lower().startswith(f"{package.lower()}==")), None)


def test_the_shipped_tokenizer_is_what_its_recipe_trains_on_the_shipped_corpus(tmp_path):
    """The shipped tokenizer.json is reproducible from its source: ``train_bpe_tokenizer`` on the shipped
    corpus gives the same bytes, with the pinned ``tokenizers`` (another version may order merges differently,
    which is why the tokenizer ships instead of being trained on each machine)."""
    import tokenizers

    from memorization.data.corpus import TOKENIZER_SHA256, sha256_file, train_bpe_tokenizer

    if tokenizers.__version__ != _pinned("tokenizers"):
        pytest.skip(f"tokenizers {tokenizers.__version__} is not the pinned {_pinned('tokenizers')}")
    out = train_bpe_tokenizer(load_documents("builtin:pydocs"), 4096, tmp_path / "tok")
    assert sha256_file(out / "tokenizer.json") == TOKENIZER_SHA256


def test_data_checksums_name_the_bytes_a_run_was_built_from(tmp_path):
    """The default corpus and tokenizer are recorded by their pinned checksums, a local corpus file by its
    own bytes' sha256, a directory by none (its documents' fingerprint covers it)."""
    import hashlib

    from memorization.data.corpus import PYDOCS_SHA256, TOKENIZER_SHA256, data_checksums, load_tokenizer

    tok = load_tokenizer()
    assert data_checksums("builtin:pydocs", tok) == {"corpus_sha256": PYDOCS_SHA256,
                                                     "tokenizer_sha256": TOKENIZER_SHA256}
    f = tmp_path / "c.txt"
    f.write_text("a document\n\nanother one\n")
    assert data_checksums(str(f), tok)["corpus_sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert data_checksums(str(tmp_path), tok)["corpus_sha256"] is None


# ------------------------------------------------ empty, document-less and non-UTF-8 corpora are refused

@pytest.mark.parametrize("name,content", [("empty.jsonl", b""), ("blank.jsonl", b"\n\n"), ("empty.json", b""),
                                          ("empty.csv", b""), ("empty.parquet", b""), ("empty.txt", b"\n"),
                                          ("list.json", b"[]"), ("records.jsonl", b"{}\n{}\n")])
def test_an_empty_corpus_file_is_refused_in_plain_words(tmp_path, name, content) -> None:
    from memorization.data.corpus import load_documents

    (tmp_path / name).write_bytes(content)
    with pytest.raises(ValueError, match=r"is empty \(no records\)|holds no (documents|records)"):
        load_documents(str(tmp_path / name))


def test_an_empty_file_among_good_ones_is_named(tmp_path) -> None:
    from memorization.data.corpus import load_documents

    (tmp_path / "a.jsonl").write_text("\n\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "a document"}) + "\n")
    with pytest.raises(ValueError, match=r"1 of its files is empty \(no records\): a\.jsonl"):
        load_documents(str(tmp_path))


def test_files_of_a_directory_with_other_fields_are_refused_with_the_fix(tmp_path) -> None:
    """datasets reads a directory's files with the first file's columns: a second file with an extra field
    fails a cast whose message says what, not how to fix it."""
    from memorization.data.corpus import load_documents

    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "first doc"}) + "\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "second doc", "id": 7}) + "\n")
    with pytest.raises(ValueError, match=r"column names don't match; every file of a directory must hold the same"):
        load_documents(str(tmp_path))


def test_a_corpus_without_a_single_document_says_what_its_records_hold(tmp_path) -> None:
    """``{"text": [...]}`` (a dict of lists) is one record whose text is a list: no document at all."""
    from memorization.data.corpus import load_documents

    (tmp_path / "docs.json").write_text(json.dumps({"text": ["first doc", "second doc"]}))
    with pytest.raises(ValueError, match=r"holds no documents.*field 'text'.*a list"):
        load_documents(str(tmp_path / "docs.json"))
    (tmp_path / "blank.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ("", "  ", None)) + "\n")
    with pytest.raises(ValueError, match=r"none of its 3 record\(s\)"):
        load_documents(str(tmp_path / "blank.jsonl"))


def test_a_corpus_that_is_not_utf8_names_the_file_and_the_fix(tmp_path) -> None:
    from memorization.data.corpus import load_documents

    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps({"text": "café au lait"}, ensure_ascii=False).encode("latin-1") + b"\n")
    with pytest.raises(ValueError, match=r"latin\.jsonl is not UTF-8 text.*iconv"):
        load_documents(str(latin))
    d = tmp_path / "dir"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps({"text": "fine"}) + "\n")
    (d / "b.jsonl").write_bytes(b'{"text": "ok"}\n' + '{"text": "caf\u00e9"}\n'.encode("cp1252"))
    with pytest.raises(ValueError, match=r"dir: b\.jsonl is not UTF-8 text.*iconv"):
        load_documents(str(d))
    csv = tmp_path / "latin.csv"
    csv.write_bytes("text\ncafé au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.csv is not UTF-8 text.*iconv"):
        load_documents(str(csv))
