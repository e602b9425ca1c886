"""memorization.corpus: local corpora are read offline; a missing local file is a clear error."""
import pytest

from memorization.corpus import load_documents


@pytest.mark.parametrize("name", ["docs.csv", "docs.md", "docs.jsonl", "docs.parquet"])
def test_missing_local_corpus_file_is_a_clear_error(name):
    # a relative name of a local file type never goes to the hub (no network here)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_documents(f"no-such-dir-xyz/{name}")


def test_text_files_hold_one_document_per_block(tmp_path):
    (tmp_path / "a.txt").write_text("first doc\nline two\n\n\nsecond doc\n")
    assert load_documents(str(tmp_path / "a.txt")) == ["first doc\nline two", "second doc"]
