"""memorization/hpc_code/generate.py: completions sampled from a model, in one process or on a grid."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from memorization.hpc_code import STATUSES, load_suite
from tests.support import WORKERS, load_eval_cli


def _tiny_checkpoint(path: Path) -> None:
    """A random 1-layer Llama with a byte-level BPE tokenizer trained on the prompts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    problems, _ = load_suite()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([p.prompt + p.reference for p in problems], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=2048,
                      eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)


def test_model_generation_end_to_end(tmp_path):
    pytest.importorskip("tokenizers")
    ckpt = tmp_path / "ckpt"
    _tiny_checkpoint(ckpt)
    cli = load_eval_cli("hpc_code")
    out = tmp_path / "report.json"
    comp = tmp_path / "completions.jsonl"
    rc = cli.main(["--model", str(ckpt), "--problems", "reduce_array_sum_serial", "--samples", "3",
                   "--k", "1", "2", "--max-new-tokens", "12", "--batch-size", "3", "--quick",
                   "--no-progress", "--output", str(out), "--save-completions", str(comp)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["problems"] == 1 and report["samples_per_problem"] == 3
    (r,) = report["results"]
    assert r["samples"] == 3 and set(r["status_counts"]) <= set(STATUSES)
    assert 0.0 <= report["pass@2"] <= 1.0 and report["build@1"] is not None
    lines = [json.loads(x) for x in comp.read_text().splitlines()]
    assert len(lines) == 3 and all(x["body"].endswith("}\n") for x in lines)
    # greedy decoding gives one completion per problem (n copies would be n identical samples)
    rc = cli.main(["--model", str(ckpt), "--problems", "reduce_array_sum_serial", "--samples", "3", "--temperature",
                   "0", "--k", "1", "--max-new-tokens", "12", "--quick", "--no-progress", "--output", str(out),
                   "--save-completions", str(comp)])
    assert rc == 0 and json.loads(out.read_text())["samples_per_problem"] == 1
    assert len(comp.read_text().splitlines()) == 1


def test_samples_depend_on_seed_prompt_and_number_only_not_on_the_batch_or_the_grid(grid_checkpoint, tmp_path):
    """``--model`` sampling (temperature 0.9, top-p 0.9, rows stopping at different steps) on 4 gloo ranks and grids
    1,2,2,1 / 1,1,2,2 / 2,2,1,1 / 1,2,1,2 (fp32) gives the completions one process gives with another batch size;
    another seed gives others."""
    sys.path.insert(0, str(WORKERS))
    import launcher
    from hpc_generate_grids import SAMPLING, done_after_three_spaces
    from transformers import AutoTokenizer

    from memorization.hpc_code.generate import HFSampler

    root, _, docs, _ = grid_checkpoint
    tok = AutoTokenizer.from_pretrained(str(root / "model"))
    prompts = [tok.decode(d["token_ids"][1:12]) for d in docs[:3]]
    one = HFSampler(root / "model", seed=7).sample(prompts, 3, batch_size=4, is_done=done_after_three_spaces,
                                                  progress=False, **SAMPLING)
    assert len({c for cs in one for c in cs}) == 9  # every sample its own
    assert any(c.count(" ") == 3 for cs in one for c in cs) and any(c.count(" ") < 3 for cs in one for c in cs)
    other = HFSampler(root / "model", seed=8).sample(prompts, 3, batch_size=4, is_done=done_after_three_spaces,
                                                    progress=False, **SAMPLING)
    assert other != one
    codes, log = launcher.launch("hpc_generate_grids.py", 4, timeout=300, extra_env={
        "MODEL_DIR": str(root / "model"), "PROMPTS": json.dumps(prompts), "OUT_DIR": str(tmp_path)})
    assert codes == [0, 0, 0, 0], log[-3000:]
    for grid in ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"):
        assert json.loads((tmp_path / f"{grid}.json").read_text()) == one, grid


def test_grid_generation_needs_a_model(capsys):
    assert load_eval_cli("hpc_code").main(["--use-references", "--quick", "--grid", "1,2,1,1"]) == 2
    assert "--grid runs generation on a grid: it needs --model" in capsys.readouterr().err
