"""Every model family with a parallel plan (axonn/plans.py) is built, initialised, loaded, fine-tuned, exported
and evaluated by the experiment layer as Llama is.

* shapes: each preset's ``ModelShape.hf_config`` is its family's config and model (the parameter count the
  planner uses), and ``ModelShape.from_hf_config`` reads it back; ``get_preset(size, family)`` (``--family``)
  builds any shape as any family;
* init: ``build_model`` from a preset as each family draws what HF's ``_init_weights`` draws, kind by kind
  (normal weights, unit norm weights, zero biases);
* ``--init``: a HF checkpoint of each family (biases, GPT-NeoX's fused qkv, OLMo 2 / Qwen3 q/k norms, a tied one,
  GPT-NeoX's head as ``embed_out`` and as ``lm_head``) gives ``from_pretrained``'s tensors and logits;
* fine-tuning: ``memorize --init`` of a family on a 4-rank gloo grid (1,2,2,1) follows the 1-rank run, its HF
  export loads in ``from_pretrained`` (the family's class) with the logits of its training checkpoint, loaded for
  evaluation (``load_on_grid``) on another grid; ``--family X --size tiny`` trains from scratch on 2 ranks as on 1;
* evaluation: a family's HF directory scores the same held-out perplexity in one process and on four grids;
* refusals: a model_type without a plan (``--init``, HF export), a ``--family`` that is not the checkpoint's, a
  state dict that is not its plan's.

The default suite runs GPT-NeoX's fine-tuning (the family furthest from Llama); the other families', the
from-scratch runs and the evaluations on grids are slow tests.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import axonn

from axonn.plans import FAMILIES, get_plan, state_problems
from axonn.presets import ModelShape, get_preset
from tests.support import REPO, WORKERS

sys.path.insert(0, str(REPO / "recipes"))
import memorize  # noqa: E402

OTHER_FAMILIES = [f for f in FAMILIES if f != "llama"]
BASE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=256, tie_word_embeddings=False)


def family_config(model_type: str, vocab_size: int, **extra):
    """A tiny HF config of ``model_type`` whose heads, KV heads, hidden, FFN and vocabulary split over row and column
    2, with what sets the family apart from Llama on (Qwen3's head_dim other than hidden / heads)."""
    import transformers as tf

    kw = {**BASE, "vocab_size": vocab_size, **extra}
    kv = dict(num_key_value_heads=2)
    return {
        "mistral": lambda: tf.MistralConfig(**kw, **kv, sliding_window=32),
        "qwen2": lambda: tf.Qwen2Config(**kw, **kv),
        "qwen3": lambda: tf.Qwen3Config(**kw, **kv, head_dim=32),
        "olmo2": lambda: tf.Olmo2Config(**kw, **kv, pad_token_id=None),
        "gpt_neox": lambda: tf.GPTNeoXConfig(**{**kw, "intermediate_size": 256}, rotary_pct=0.25),
    }[model_type]()


def save_family_checkpoint(model_type: str, path: Path, tied: bool = False) -> Path:
    """A random HF checkpoint of ``model_type`` (safetensors, every norm and bias moved off its init so a dropped one
    shows) with the project's offline tokenizer beside it, as a user's ``--init`` directory.  Its embedding has a
    row for every token of the tokenizer as ``AutoTokenizer`` loads it from there (transformers 5 loads it as the
    family's class: Qwen's adds ``<|endoftext|>``), padded to a multiple of 64, so no run pads it further."""
    from transformers import AutoModelForCausalLM

    from memorization.data.corpus import load_tokenizer
    from memorization.evaluation.eval_model import load_tokenizer as tokenizer_of_dir
    from memorization.training.models import padded_vocab

    family_config(model_type, 64).save_pretrained(path)  # the tokenizer class AutoTokenizer picks follows it
    load_tokenizer().save_pretrained(path)
    vocab = padded_vocab(len(tokenizer_of_dir(path)))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_config(model_type, vocab, tie_word_embeddings=tied))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(path)
    return path


def _logits(model, vocab: int) -> torch.Tensor:
    x = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model.eval()(input_ids=x).logits


# ----------------------------------------------------------------------------------------------- shapes and init


@pytest.mark.parametrize("size", ["tiny", "mistral-7b", "qwen2-7b", "qwen3-8b", "olmo2-13b", "pythia-6.9b"])
def test_every_familys_preset_is_its_config_and_model(size: str) -> None:
    """``hf_config`` builds the family's config class, whose model (on meta) has the shape's parameter count;
    ``from_hf_config`` gives the shape back (tests/memorization/training/test_models.py checks the other Llama
    presets)."""
    import accelerate
    from transformers import AutoModelForCausalLM

    shape = get_preset(size)
    config = shape.hf_config()
    plan = get_plan(shape.family)
    assert config.model_type == shape.family and type(config).__name__ == plan.hf_class.replace("ForCausalLM", "Config")
    with accelerate.init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == plan.hf_class
    assert sum(p.numel() for p in model.parameters()) == shape.num_params()
    assert ModelShape.from_hf_config(config, name=size) == shape


def test_a_llama_preset_config_is_what_it_was() -> None:
    """The default family's config is unchanged (the README's run is the same run): LlamaConfig with the token ids
    LlamaConfig gives, untied."""
    from transformers import LlamaConfig

    config = get_preset("tiny").hf_config(vocab_size=4096)
    want = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, rope_theta=10000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=False)
    assert config.to_dict() == want.to_dict()


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_a_preset_as_another_family(family: str) -> None:
    """``get_preset("tiny", family)``: the tiny shape's layers, widths and vocabulary as the family's model (GPT-NeoX:
    its KV heads are its heads), the family's own blocks, no padding row; an unknown family is refused."""
    import accelerate

    from memorization.training.models import causal_lm_class

    tiny, shape = get_preset("tiny"), get_preset("tiny", family)
    assert (shape.family, shape.name, shape.layers, shape.hidden, shape.heads, shape.ffn, shape.vocab) == \
        (family, f"tiny ({family})", tiny.layers, tiny.hidden, tiny.heads, tiny.ffn, tiny.vocab)
    assert shape.kv_heads == (tiny.heads if family == "gpt_neox" else tiny.kv_heads)
    config = shape.hf_config()
    assert config.pad_token_id is None and config.model_type == family
    with accelerate.init_empty_weights():
        model = causal_lm_class(config)(config)
    assert sum(p.numel() for p in model.parameters()) == shape.num_params()
    with pytest.raises(ValueError, match="no parallel plan for model_type 'gpt2'"):
        get_preset("tiny", "gpt2")
    if family == "gpt_neox":
        with pytest.raises(ValueError, match="GPT-NeoX has no grouped-query attention"):
            replace(shape, kv_heads=2).hf_config()


@pytest.mark.parametrize("family", FAMILIES)
def test_random_init_draws_what_hf_init_draws(family: str) -> None:
    """Parameter by parameter, the kind of HF's ``_init_weights`` (a model built by ``from_config``): constant ones,
    constant zeros, or N(0, initializer_range²) (mean and std within 3e-3 over the tensor)."""
    from transformers import AutoModelForCausalLM

    from memorization.training.models import build_model

    ours = build_model("nano", 4096, seed=0, family=family)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(ours.config)
    std = ours.config.initializer_range
    theirs = dict(hf.named_parameters())
    assert set(theirs) == {n for n, _ in ours.named_parameters()}
    for name, p in ours.named_parameters():
        ref = theirs[name].detach()
        for value in (0.0, 1.0):
            if torch.all(ref == value):
                assert torch.all(p == value), name
                break
        else:
            assert abs(float(p.detach().std()) - std) < 3e-3 and abs(float(p.detach().mean())) < 3e-3, name
            assert abs(float(ref.std()) - std) < 3e-3, name


# ------------------------------------------------------------------------------------------------- --init loading


@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_init_checkpoint_of_each_family_is_from_pretrained(family: str, tmp_path) -> None:
    """``build_model(init=...)`` without a runtime holds every tensor of ``from_pretrained`` and gives its logits;
    Qwen2's checkpoint is tied (its head is its embedding, one parameter, as in Qwen2-0.5B); GPT-NeoX's stores its head as
    its releases and ``save_pretrained`` do, ``embed_out.weight``, and a second time as the model names it,
    ``lm_head.weight``."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from memorization.training.models import build_model

    path = save_family_checkpoint(family, tmp_path / family, tied=family == "qwen2")
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    vocab = ref.config.vocab_size
    dirs = [path]
    if family == "gpt_neox":
        tensors = load_file(path / "model.safetensors")
        tensors["lm_head.weight"] = tensors.pop("embed_out.weight")
        old = tmp_path / "model-names"
        ref.config.save_pretrained(old)
        save_file(tensors, str(old / "model.safetensors"), metadata={"format": "pt"})
        dirs.append(old)
    for d in dirs:
        ours = build_model(None, vocab, init=str(d))
        assert type(ours) is type(ref) and ours.config.tie_word_embeddings == (family == "qwen2")
        assert axonn.is_tied(ours) == axonn.is_tied(ref) == (family == "qwen2")  # a tied model stays tied
        got = dict(ours.named_parameters())
        want = dict(ref.named_parameters())  # a tied model lists the shared weight once
        assert set(got) == set(want), set(got) ^ set(want)
        for n, t in want.items():
            assert torch.equal(got[n], t), (d, n)
        torch.testing.assert_close(_logits(ours, vocab), _logits(ref, vocab), rtol=1e-5, atol=1e-5)


def test_init_of_a_model_without_a_plan_or_of_another_family_is_refused_before_its_weights(tmp_path) -> None:
    from transformers import GPT2Config

    from memorization.training.models import build_model, model_config

    GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ValueError, match=r"'gpt2' model, which has no parallel plan: supported are llama "
                                         r"\(LlamaForCausalLM\), .*gpt_neox \(GPTNeoXForCausalLM\)"):
        build_model(None, 64, init=str(tmp_path / "gpt2"))  # (there are no weights to read)
    family_config("qwen3", 64).save_pretrained(tmp_path / "qwen3")
    assert model_config(None, 64, init=str(tmp_path / "qwen3")).model_type == "qwen3"
    with pytest.raises(ValueError, match="--family olmo2 but --init .* is a qwen3 model: leave --family unset"):
        model_config(None, 64, init=str(tmp_path / "qwen3"), family="olmo2")


# ---------------------------------------------------------------------------------------------------- HF export


@pytest.mark.parametrize("family", FAMILIES)
def test_every_familys_state_dict_is_its_plans(family: str) -> None:
    """``axonn.plans.state_problems``: a model of the family has none; a tensor of another shape, one missing and
    one the plan does not know are each named."""
    from memorization.training.models import build_model

    model = build_model("nano", 4096, family=family)
    shapes = {n: tuple(t.shape) for n, t in model.state_dict().items()}
    plan = get_plan(family)
    assert state_problems(plan, model.config, shapes) == []
    name = next(n for n in shapes if n.endswith(plan.linears()[0].path + ".weight"))
    bad = {**shapes, name: (3, 3), "extra.weight": (1,)}
    del bad[f"{plan.head}.weight"]
    problems = state_problems(plan, model.config, bad)
    assert f"{name}: shape [3, 3], the plan and config say {list(shapes[name])}" in problems
    assert "extra.weight: not a tensor of " + plan.hf_class + " in its plan" in problems
    assert f"{plan.head}.weight: missing" in problems


def test_export_refuses_a_model_without_a_plan_or_not_its_plans_shape(tmp_path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    import axonn.checkpoint as ckpt
    from memorization.training.models import build_model

    with pytest.raises(ValueError, match="HF export writes the models of the families with a parallel plan: no "
                                         "parallel plan for model_type 'gpt2'"):
        ckpt.export_hf(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)), tmp_path / "a")
    model = build_model("nano", 4096, family="qwen3")
    model.config.num_hidden_layers = 2  # the config says more than the model has
    with pytest.raises(ValueError, match=r"is not the Qwen3ForCausalLM its config describes(.|\n)*"
                                         r"model.layers.1.self_attn.q_proj.weight: missing"):
        ckpt.export_hf(model, tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ------------------------------------------------------------------------------------------ fine-tuning on a grid

RUN = ["--num-targets", "2", "--num-nonmembers", "2", "--exposures", "2", "--steps", "4", "--prefix", "8",
       "--suffix", "8", "--seq-len", "32", "--no-progress", "--arms", "standard", "--batch-size", "4",
       "--extract-batch", "4", "--lr", "1e-3", "--warmup-steps", "1"]


def _launch(ranks: int, grid: str, out: Path, args: list[str]) -> dict:
    """The standard arm's results of memorize.py on ``grid`` under torchrun with gloo."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "AXONN_TIMEOUT": "240"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
           str(REPO / "recipes" / "memorize.py"), *RUN, *args, "--grid", grid, "--out", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((out / "results.json").read_text())["arms"]["standard"]


def _serial(out: Path, args: list[str]) -> dict:
    return memorize.main(RUN + args + ["--out", str(out)])["arms"]["standard"]


def _export_is_the_trained_model(run: Path, family: str) -> None:
    """The run's HF export loads in ``from_pretrained`` as the family's class with the logits of its training
    checkpoint, loaded for evaluation (``load_on_grid``, resharded onto this process's 1-rank grid)."""
    from transformers import AutoModelForCausalLM

    import axonn
    from memorization.evaluation.eval_model import load_on_grid
    from memorization.training.runtime import Runtime

    hf = AutoModelForCausalLM.from_pretrained(run / "standard" / "model", dtype=torch.float32)
    assert type(hf).__name__ == get_plan(family).hf_class
    trained, tok = load_on_grid(run / "standard" / "checkpoint", Runtime(axonn.init()))
    assert tok is not None and type(trained) is type(hf)
    vocab = hf.config.vocab_size
    torch.testing.assert_close(_logits(trained, vocab), _logits(hf, vocab), rtol=1e-5, atol=1e-5)


def _fine_tune_follows_serial(family: str, tmp_path: Path) -> None:
    ckpt = save_family_checkpoint(family, tmp_path / "init")
    args = ["--init", str(ckpt)]
    serial = _serial(tmp_path / "serial", args)
    parallel = _launch(4, "1,2,2,1", tmp_path / "par", args)
    assert parallel["loss_curve"] == pytest.approx(serial["loss_curve"], rel=1e-5)
    assert parallel["val_loss"] == pytest.approx(serial["val_loss"], rel=1e-5)
    assert serial["loss_curve"][-1] < serial["loss_curve"][0]
    _export_is_the_trained_model(tmp_path / "par", family)


@pytest.mark.slow
@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_fine_tune_on_a_4_rank_grid_follows_serial_and_exports(family: str, tmp_path) -> None:
    _fine_tune_follows_serial(family, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_family_from_scratch_trains_on_2_ranks_as_on_1(family: str, tmp_path) -> None:
    """``--family X --size tiny``: the same initial weights on every grid, so the 2-rank run (row 2) follows the
    1-rank run; the export is the family's model with the tiny shape."""
    args = ["--family", family, "--size", "tiny"]
    serial = _serial(tmp_path / "serial", args)
    parallel = _launch(2, "1,2,1,1", tmp_path / "par", args)
    assert parallel["loss_curve"] == pytest.approx(serial["loss_curve"], rel=1e-5)
    assert serial["loss_curve"][-1] < serial["loss_curve"][0]
    config = json.loads((tmp_path / "par" / "standard" / "model" / "config.json").read_text())
    assert config["model_type"] == family and config["num_hidden_layers"] == get_preset("tiny").layers
    assert f"size `tiny` as `{family}`" in (tmp_path / "par" / "results.md").read_text()
    _export_is_the_trained_model(tmp_path / "par", family)


@pytest.mark.slow
@pytest.mark.parametrize("family", OTHER_FAMILIES)
def test_held_out_perplexity_on_four_grids_is_one_processs(family: str, tmp_path) -> None:
    """The evaluations' two ways in for a HF directory of each family: one process (``from_pretrained``) and a grid
    (``load_on_grid``: each rank building its shards from the safetensors) give the same sliding-window
    perplexity (tests/axonn_workers/perplexity_grids.py: 1,2,2,1 / 1,1,2,2 / 2,2,1,1 / 1,2,1,2 on 4 gloo ranks)."""
    sys.path.insert(0, str(WORKERS))
    import launcher

    from memorization.data.corpus import DEFAULT_CORPUS, load_documents, load_tokenizer
    from memorization.evaluation.downstream import run_downstream

    model = save_family_checkpoint(family, tmp_path / "model")
    tok = load_tokenizer()
    texts = [tok.decode(tok(t)["input_ids"][:40]) for t in load_documents(DEFAULT_CORPUS)[:5]]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts))
    run_downstream(model, perplexity_source=tmp_path / "docs.jsonl", batch_size=2, max_length=24, stride=8,
                   out_dir=tmp_path / "one")
    codes, log = launcher.launch("perplexity_grids.py", 4, timeout=300, extra_env={
        "MODEL_DIR": str(model), "DOCS_JSONL": str(tmp_path / "docs.jsonl"), "OUT_DIR": str(tmp_path)})
    assert codes == [0, 0, 0, 0], log[-3000:]
    want = json.loads((tmp_path / "one" / "downstream.json").read_text())["perplexity"]
    assert want["n_windows"] > len(texts)
    for grid in ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"):
        got = json.loads((tmp_path / grid / "downstream.json").read_text())["perplexity"]
        assert (got["n_tokens"], got["n_windows"]) == (want["n_tokens"], want["n_windows"]), grid
        assert got["nll"] == pytest.approx(want["nll"], rel=1e-5), grid


# ------------------------------------------------------------------------------------- command lines that take it


def test_memorize_help_planner_and_job_generator_take_the_family(capsys, tmp_path) -> None:
    from axonn.planner.__main__ import main as planner_main
    from memorization.launch import jobs
    from memorization.experiment.cli import build_parser

    text = build_parser().format_help()
    assert "--family {" + ",".join(FAMILIES) + "}" in text and "--family qwen3 --size tiny" in " ".join(text.split())
    assert planner_main(["--size", "tiny", "--family", "gpt_neox", "--gpus", "4", "--machine", "h100-node"]) == 0
    shape = get_preset("tiny", "gpt_neox")
    assert f"tiny (gpt_neox): {shape.num_params() / 1e9:.3g}B params" in capsys.readouterr().out
    spec = jobs.job_spec(machine="alps", size="8b", family="qwen3", gpus=16, out_dir=str(tmp_path),
                        run_root=str(tmp_path))
    job = jobs.make_job(spec)
    assert job.shape.family == "qwen3" and job.spec.name.startswith("mem-qwen3-8b-alps")
    assert job.config.model.family == "qwen3" and "--family qwen3" in job.text
