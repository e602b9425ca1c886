"""benchmarks/generation_speed.py: our sampler against transformers' generate on the same inputs."""
import importlib.util

import pytest

from tests.support import REPO


def _benchmark():
    spec = importlib.util.spec_from_file_location("generation_speed", REPO / "benchmarks" / "generation_speed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random 1-layer Llama with the shipped tokenizer, trained for 2,048 positions (the prompts fit)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memorization.data.corpus import load_tokenizer

    path = tmp_path_factory.mktemp("genspeed")
    tok = load_tokenizer()
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 num_key_value_heads=2, vocab_size=len(tok), max_position_embeddings=2048)
                     ).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_greedy_rows_are_the_same_tokens_both_ways_and_the_ratio_is_printed(tiny_model, capsys):
    """Greedy decoding, both rounds: our decoder and transformers' generate give every row the same tokens (the
    same work is timed), the fixed round exactly max-new-tokens per row; the table and the ratio are printed."""
    res = _benchmark().main(["--model", str(tiny_model), "--prompts", "3", "--max-new-tokens", "6",
                             "--batch-size", "2", "--temperature", "0", "--problems", "reduce_*"])
    for name in ("fixed", "stop"):
        assert res[name]["ours"]["rows"] == res[name]["transformers"]["rows"]
    assert all(len(r) == 6 for r in res["fixed"]["ours"]["rows"]) and len(res["fixed"]["ours"]["rows"]) == 3
    out = capsys.readouterr().out
    assert "fixed  ours / transformers tokens/s: " in out and "stop   ours / transformers tokens/s: " in out


def test_sampled_rounds_count_samples_per_prompt_for_both(tiny_model):
    """Sampling (T=0.2, top-p 0.95, 3 samples of 2 prompts): both sides decode 6 rows of max-new-tokens."""
    res = _benchmark().main(["--model", str(tiny_model), "--prompts", "2", "--samples", "3", "--max-new-tokens", "4",
                             "--batch-size", "6", "--rounds", "fixed", "--problems", "reduce_*"])
    for who in ("ours", "transformers"):
        assert [len(r) for r in res["fixed"][who]["rows"]] == [4] * 6
