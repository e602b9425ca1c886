"""hpc_codegen/generate.py: completions sampled from a model, in one process or on a grid."""
from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pytest

from hpc_codegen import STATUSES, load_suite
from tests.support import WORKERS, load_eval_cli


#: SmolLM2-Instruct's chat template (ChatML with a default system turn), as its tokenizer ships it
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
          "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@functools.lru_cache(maxsize=1)
def _bpe_json() -> str:
    """A byte-level BPE tokenizer (400 ids, with ChatML's special tokens) trained on the prompts, as JSON (trained
    once per test process)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    problems, _ = load_suite()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([p.prompt + p.reference for p in problems], trainer)
    return tok.to_str()


def _tiny_checkpoint(path: Path, chat_template: str | None = None, context: int = 2048) -> None:
    """A random 1-layer Llama with :func:`_bpe_json`'s tokenizer (and ``chat_template`` if given), trained for
    ``context`` positions."""
    from tokenizers import Tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer.from_str(_bpe_json())
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(path)
    cfg = LlamaConfig(vocab_size=fast.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=context,
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
    greedy = tmp_path / "greedy.jsonl"
    rc = cli.main(["--model", str(ckpt), "--problems", "reduce_array_sum_serial", "--samples", "3", "--temperature",
                   "0", "--k", "1", "--max-new-tokens", "12", "--quick", "--no-progress", "--output", str(out),
                   "--save-completions", str(greedy)])
    assert rc == 0 and json.loads(out.read_text())["samples_per_problem"] == 1
    assert len(greedy.read_text().splitlines()) == 1
    # the sampled file with other settings is not mixed into: refused with the reason
    rc = cli.main(["--model", str(ckpt), "--problems", "reduce_array_sum_serial", "--samples", "3", "--temperature",
                   "0", "--k", "1", "--max-new-tokens", "12", "--quick", "--no-progress",
                   "--save-completions", str(comp)])
    assert rc == 2


def test_a_stopped_generation_resumes_from_its_saved_completions_to_the_same_report(tmp_path, capsys):
    """--save-completions appends each batch of problems as it is sampled; a run stopped after the first batch
    (the file cut there, with a half-written last line) and run again with the same file samples only the other
    problems, and its completions and verdicts equal an uninterrupted run's. The saved file scores as
    --completions to the same verdicts."""
    ckpt = tmp_path / "ckpt"
    _tiny_checkpoint(ckpt)
    cli = load_eval_cli("hpc_code")
    problems = ["reduce_array_sum_serial", "scan_prefix_sum_serial", "dense_la_gemv_serial"]
    args = ["--model", str(ckpt), "--problems", *problems, "--samples", "2", "--k", "1", "--max-new-tokens", "10",
            "--batch-size", "2", "--quick", "--no-progress"]
    full, cut = tmp_path / "full.jsonl", tmp_path / "cut.jsonl"
    assert cli.main([*args, "--output", str(tmp_path / "full.json"), "--save-completions", str(full)]) == 0
    rows = full.read_text().splitlines()
    assert [json.loads(r)["sample"] for r in rows] == [0, 1] * 3  # one problem per batch of 2 rows
    cut.write_text("\n".join(rows[:2]) + "\n" + rows[2][:20])  # stopped while writing the second batch
    capsys.readouterr()
    assert cli.main([*args, "--output", str(tmp_path / "resumed.json"), "--save-completions", str(cut)]) == 0
    assert "1 of 3 hpc problems' completions read from" in capsys.readouterr().err

    def comp(path):
        return sorted((r["problem"], r["sample"], r["completion"]) for r in map(json.loads, path.read_text()
                      .splitlines()[-6:]))

    assert comp(cut) == comp(full)
    verdicts = {name: [(r["name"], r["status_counts"]) for r in json.loads((tmp_path / name).read_text())["results"]]
                for name in ("full.json", "resumed.json")}
    assert verdicts["full.json"] == verdicts["resumed.json"]
    assert cli.main(["--completions", str(full), "--quick", "--no-progress", "--k", "1",
                     "--output", str(tmp_path / "scored.json")]) == 0
    scored = [(r["name"], r["status_counts"]) for r in json.loads((tmp_path / "scored.json").read_text())["results"]]
    assert scored == verdicts["full.json"]


def test_samples_depend_on_seed_prompt_and_number_only_not_on_the_batch_or_the_grid(grid_checkpoint, tmp_path):
    """``--model`` sampling (temperature 0.9, top-p 0.9, rows stopping at different steps) on 4 gloo ranks and grids
    1,2,2,1 / 1,1,2,2 / 2,2,1,1 / 1,2,1,2 (fp32) gives the completions one process gives with another batch size;
    another seed gives others."""
    sys.path.insert(0, str(WORKERS))
    import launcher
    from hpc_generate_grids import SAMPLING, done_after_three_spaces
    from transformers import AutoTokenizer

    from hpc_codegen.generate import HFSampler

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


def _cpu_problems(names: tuple[str, ...] = ("reduce_array_sum_*", "dense_la_gemv_*")):
    problems, _ = load_suite(None, list(names), ["serial", "openmp", "mpi", "mpi+omp", "kokkos"])
    return problems


def test_an_instruct_model_is_given_its_chat_template_with_the_prompt_whole_at_the_end(tmp_path):
    """With a chat template (SmolLM2's ChatML) the ids the model is given equal ``apply_chat_template`` of the
    user's instruction and the assistant reply prefilled with a code fence and the prompt less its trailing
    newline (transformers' ``continue_final_message``: an independent rendering), the template's special tokens
    are single ids (three turns: system, user, assistant), and the text ends with the prompt verbatim up to that
    newline; C, C++ (Kokkos) and Python prompts each get their own fence."""
    pytest.importorskip("tokenizers")
    from hpc_codegen.generate import HFSampler, instruction

    _tiny_checkpoint(tmp_path / "chat", CHATML)
    sampler = HFSampler(tmp_path / "chat")
    assert sampler.chat
    tok = sampler.tok
    start = tok.convert_tokens_to_ids("<|im_start|>")
    problems = _cpu_problems()
    prompts = [p.prompt for p in problems] + ["def f(x):\n    \"\"\"Twice x.\"\"\"\n"]
    langs = [p.language for p in problems] + ["python"]
    assert {"c", "cpp"} <= set(langs)
    for prompt, lang, ids in zip(prompts, langs, sampler.input_ids(prompts, langs)):
        head = prompt.rstrip()  # the model writes the trailing newline itself
        assert head != prompt
        messages = [{"role": "user", "content": instruction(lang)},
                    {"role": "assistant", "content": f"```{lang}\n{head}"}]
        text = tok.apply_chat_template(messages, continue_final_message=True, tokenize=False)
        assert ids == tok(text, add_special_tokens=False).input_ids
        assert ids.count(start) == 3
        assert tok.decode(ids).endswith(f"<|im_start|>assistant\n```{lang}\n{head}")


def test_a_model_without_a_chat_template_completes_the_raw_prompt_and_chat_cannot_be_forced(tmp_path):
    """No chat template: the ids are the prompt's own less its trailing newline, ``chat=False`` on an instruct model
    gives the same, and asking for chat without a template is refused with the reason."""
    pytest.importorskip("tokenizers")
    from hpc_codegen.generate import HFSampler

    _tiny_checkpoint(tmp_path / "base")
    _tiny_checkpoint(tmp_path / "chat", CHATML)
    prompts = [p.prompt for p in _cpu_problems(("reduce_array_sum_*",))]
    base = HFSampler(tmp_path / "base")
    assert not base.chat
    want = [base.tok(p.rstrip()).input_ids for p in prompts]
    assert base.input_ids(prompts, ["c"] * len(prompts)) == want
    assert HFSampler(tmp_path / "chat", chat=False).input_ids(prompts, ["c"] * len(prompts)) == want
    with pytest.raises(ValueError, match="has no chat template"):
        HFSampler(tmp_path / "base", chat=True)


def test_a_prompt_that_does_not_fit_the_context_is_refused_before_any_generation(tmp_path, monkeypatch, capsys):
    """A model trained for 1024 positions: ``--max-new-tokens`` that leaves the chat input no room is one error line
    naming the problem and the largest value that fits, exit 2, and nothing is generated; that value is accepted.
    Trained for 128 positions, the input alone does not fit: refused with the reason."""
    pytest.importorskip("tokenizers")
    from memorization.lm import LM

    _tiny_checkpoint(tmp_path / "chat", CHATML, context=1024)
    _tiny_checkpoint(tmp_path / "short", CHATML, context=128)
    calls = []
    real = LM.generate_until
    monkeypatch.setattr(LM, "generate_until", lambda self, *a, **kw: calls.append(1) or real(self, *a, **kw))
    cli = load_eval_cli("hpc_code")
    args = ["--model", str(tmp_path / "chat"), "--problems", "reduce_array_sum_serial", "--quick", "--no-progress",
            "--samples", "1", "--k", "1"]
    assert cli.main([*args, "--max-new-tokens", "1000"]) == 2
    err = capsys.readouterr().err
    assert "reduce_array_sum_serial is " in err and "exceeds the model's context of 1024" in err and not calls
    room = int(err.rsplit("at most ", 1)[1].split()[0])
    assert 0 < room < 1000
    short = ["--model", str(tmp_path / "short"), *args[2:], "--max-new-tokens", "1"]
    assert cli.main(short) == 2 and "the model's whole context of 128 or more" in capsys.readouterr().err
    assert not calls
    assert cli.main([*args, "--max-new-tokens", str(room), "--no-progress"]) == 0 and calls


def test_the_stop_test_ends_a_row_at_the_token_the_full_scan_first_finds_the_function_closed():
    """:func:`stop_test` with ``c_body_closed`` (asked only after a token holding "}") stops at the same token as
    asking ``c_body_closed`` of the whole decoded text at every step: on references followed by more code, and on
    bodies whose braces hide in comments, strings and character literals (split across tokens); an end-of-text
    token is dropped."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from hpc_codegen.code_blocks import c_body_closed
    from hpc_codegen.generate import stop_test

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_bpe_json()), eos_token="<eos>")
    eos = tok.eos_token_id
    refs = [p.reference for p in _cpu_problems(("reduce_*", "scan_prefix_sum_*"))][:8]
    tricky = ["  /* } */ int a = '}'; // }\n  if (x) { s = \"}\\\"}\"; }\n  return;\n}\nint g() { return 1; }\n",
              "  char c = '\\'';  /* {{ */ x++;\n}  \n}\n", "  { { } } /* unterminated } } }"]
    texts = [r + "\nint main(void) { return 0; }\n" for r in refs] + tricky
    fast, full = stop_test(tok, c_body_closed, eos), stop_test(tok, lambda t: c_body_closed(t), eos)
    stops = []
    for text in texts:
        ids = tok(text).input_ids
        first = [next((L for L in range(1, len(ids) + 1) if f(ids[:L]) is not None), None) for f in (fast, full)]
        assert first[0] == first[1], text
        stops.append(first[0])
    assert all(s is not None for s in stops[:-1]) and stops[-1] is None  # the last never closes
    assert c_body_closed(tok.decode(tok(tricky[0]).input_ids[:stops[-3]])) and "int g" not in tok.decode(
        tok(tricky[0]).input_ids[:stops[-3]])
    assert fast(tok("  x = 1;").input_ids + [eos]) == len(tok("  x = 1;").input_ids)


@pytest.mark.slow
def test_every_cpu_prompt_fits_smollm2_whole_in_its_chat_template_with_1024_new_tokens(smollm2):
    """The real SmolLM2-135M-Instruct tokenizer: all 300 CPU prompts (5 execution models x 60) as chat inputs equal
    transformers' ``continue_final_message`` rendering, hold each prompt's tokens whole, and with 1,024 new
    tokens fit the model's 8,192 positions."""
    import json

    from transformers import AutoTokenizer

    from hpc_codegen.generate import chat_input, instruction

    tok = AutoTokenizer.from_pretrained(smollm2)
    context = json.loads((Path(smollm2) / "config.json").read_text())["max_position_embeddings"]
    problems, _ = load_suite(None, None, ["serial", "openmp", "mpi", "mpi+omp", "kokkos"])
    assert len(problems) == 300
    lengths = []
    for p in problems:
        text = chat_input(tok, p.prompt, p.language)
        want = tok.apply_chat_template([{"role": "user", "content": instruction(p.language)},
                                        {"role": "assistant", "content": f"```{p.language}\n{p.prompt}"}],
                                       continue_final_message=True, tokenize=False)
        assert text == want and text.endswith(p.prompt)
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(ids) == text
        head = tok(chat_input(tok, p.prompt.rstrip(), p.language), add_special_tokens=False).input_ids
        assert tok.decode(head[-1:]).strip()  # what the sampler gives ends on code, not a lone newline token
        lengths.append(len(ids))
    assert max(lengths) + 1024 <= context


def test_a_completion_is_the_text_after_the_whole_prompt_whose_trailing_whitespace_the_model_wrote():
    """The model continues the prompt less its trailing whitespace (a lone newline token is a boundary a tokenizer
    that merges newline and indentation never shows it: SmolLM2-135M then writes ``#define`` lines, see
    docs/hpc_code.md); the completion returned starts after the whole prompt, so prompt + completion is the
    model's text; a continuation that does not begin with that whitespace is kept whole."""
    from hpc_codegen.generate import after_prompt

    prompt = "double f(const double *x, size_t n) {\n"
    tail = prompt[len(prompt.rstrip()):]
    model_text = "\n    return x[0];\n}\n"
    got = after_prompt(model_text, tail)
    assert prompt + got == prompt.rstrip() + model_text and got == "    return x[0];\n}\n"
    assert after_prompt(" return x[0]; }", tail) == " return x[0]; }"
    assert after_prompt("\n}", "") == "\n}"
