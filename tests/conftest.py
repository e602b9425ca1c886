import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    from memorization.corpus import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def corpus():
    from memorization.corpus import DEFAULT_CORPUS, load_documents

    return load_documents(DEFAULT_CORPUS)
