"""memorization/training/models.py: building a model, serial or without any process holding all of it (meta parameters,
per-shard init and loading), from a preset or a Hugging Face checkpoint; exporting and checkpointing it.

The 4-rank checks (tests/axonn_workers/build_checks.py) show that the sharded build equals the
serial one bit for bit, from the random init and from a HF checkpoint, and that each rank reads only
the checkpoint rows its shards are cut from.  The serial tests here cover the pieces and the errors,
and what a researcher fine-tuning real Llama checkpoints meets:

* a ``--init`` checkpoint with Llama 3.x features (tied embeddings, an explicit ``head_dim``, biases, llama3
  RoPE, bf16, several safetensors files) gives the logits of ``LlamaForCausalLM.from_pretrained``;
* the shape of a checkpoint whose ``head_dim`` is not hidden / heads (Llama-3.1-Minitron-4B-Width) counts its
  parameters as built (the planner's memory and the pre-flight check rest on it);
* the real presets normalise with the published RMSNorm eps.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.support import REPO, WORKERS

_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256)


@pytest.mark.timeout(400)
def test_sharded_build_equals_serial_on_4_ranks() -> None:
    grids = ["1,2,1,2", "1,1,2,2", "2,2,1,1"]
    codes, out = launcher.launch("build_checks.py", 4, grids, timeout=380)
    assert codes == [0] * 4, f"return codes {codes}\n{out}"
    for g in grids:
        assert f"OK build grid {g}" in out, out


def test_random_init_is_hf_llama_init_and_independent_of_chunking(monkeypatch) -> None:
    import memorization.training.models as mm

    model = mm.build_model("tiny", 4096, seed=1)
    sd = model.state_dict()
    w = sd["model.layers.0.mlp.down_proj.weight"]
    assert abs(float(w.std()) - model.config.initializer_range) < 1e-3 and abs(float(w.mean())) < 1e-3
    assert torch.equal(sd["model.norm.weight"], torch.ones(256))
    assert not torch.equal(w, mm.build_model("tiny", 4096, seed=2).state_dict()["model.layers.0.mlp.down_proj.weight"])
    # rows drawn piecewise equal rows drawn at once (a rank's slice never depends on its neighbours')
    shape = (300, 70)
    monkeypatch.setattr(mm, "INIT_CHUNK_ELEMENTS", 700)  # 10 rows per chunk
    whole = mm.normal_rows(0, "w", shape, 0, 300, 0.02)
    parts = torch.cat([mm.normal_rows(0, "w", shape, a, b, 0.02) for a, b in [(0, 7), (7, 131), (131, 300)]])
    assert torch.equal(whole, parts)


def test_init_checkpoint_errors_say_what_is_wrong(tmp_path) -> None:
    from transformers import LlamaConfig

    from memorization.training.models import build_model

    with pytest.raises(FileNotFoundError, match="no Hugging Face checkpoint"):
        build_model(None, 100, init=str(tmp_path / "nowhere"))
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    cfg.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"found pytorch_model.bin: convert it"):
        build_model(None, 100, init=str(tmp_path))
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(128, 32)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"checkpoint shape \[128, 32\], model \[128, 64\](.|\n)*not in the"):
        build_model(None, 100, init=str(tmp_path))


def test_a_llama3_style_checkpoint_gives_the_logits_of_from_pretrained(tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    import axonn
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    cfg = LlamaConfig(**TINY, head_dim=32, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                      rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 16})
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():  # norms and biases away from their init, so a dropped one shows
        for n, p in m.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(torch.randn_like(p) * 0.1)
    m.to(torch.bfloat16).save_pretrained(tmp_path, max_shard_size="50KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ref = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    x = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    for runtime in (None, Runtime(axonn.init())):  # a plain model, and the trainer's on grid 1,1,1,1
        ours = build_model(None, 128, init=str(tmp_path), runtime=runtime).eval()
        with torch.no_grad():
            torch.testing.assert_close(ours(x).logits, ref(x).logits, rtol=1e-5, atol=1e-5)


def test_the_shape_of_a_checkpoint_with_its_own_head_dim_counts_what_is_built() -> None:
    """hidden 64 over 4 heads of 32 (not 16): q and o are 64 x 128, k and v 64 x 64; the shape read from the
    config must count them so (not 64 x 64 and 64 x 32: 2 layers x 12,288 parameters too few), keep the
    head width through ``hf_config`` and leave ordinary configs (and the presets) as they were."""
    from accelerate import init_empty_weights
    from transformers import LlamaConfig, LlamaForCausalLM

    from axonn.presets import ModelShape

    cfg = LlamaConfig(**TINY, head_dim=32)
    with init_empty_weights():
        built = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    shape = ModelShape.from_hf_config(cfg)
    assert shape.head_dim == 32 and shape.num_params() == built
    again = shape.hf_config()
    assert again.head_dim == 32
    with init_empty_weights():
        assert sum(p.numel() for p in LlamaForCausalLM(again).parameters()) == built
    plain = ModelShape.from_hf_config(LlamaConfig(**TINY))
    assert plain.explicit_head_dim is None and plain.head_dim == 16


def test_real_model_presets_use_the_published_rms_norm_eps() -> None:
    """TinyLlama-1.1B and Llama 3.1 normalise with eps 1e-5 (their config.json), not LlamaConfig's 1e-6; the
    CPU presets keep 1e-6 (the README's figures); a checkpoint's eps survives the round trip through its shape."""
    from transformers import LlamaConfig

    from axonn.presets import ModelShape, get_preset

    for size in ("1b", "8b", "70b", "405b"):
        assert get_preset(size).hf_config().rms_norm_eps == 1e-5, size
    assert get_preset("tiny").hf_config().rms_norm_eps == 1e-6
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, rms_norm_eps=3e-5)
    assert ModelShape.from_hf_config(cfg).hf_config().rms_norm_eps == 3e-5


def test_export_refuses_a_directory_that_is_not_a_model(tmp_path) -> None:
    import axonn.checkpoint as ckpt

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a model directory"):
        ckpt.export_hf(torch.nn.Linear(2, 2), tmp_path, grid=object())
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_export_in_bf16_and_in_several_files_loads_in_from_pretrained(tmp_path) -> None:
    import axonn
    import axonn.checkpoint as ckpt
    from transformers import AutoModelForCausalLM

    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    model = build_model("tiny", 4096, seed=0, runtime=rt)
    ckpt.export_hf(model, tmp_path / "bf16", dtype=torch.bfloat16, max_shard_bytes=2**20)
    files = sorted(p.name for p in (tmp_path / "bf16").glob("*.safetensors"))
    assert len(files) > 1 and (tmp_path / "bf16" / "model.safetensors.index.json").exists()
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype="auto")  # 4.x defaults to float32
    assert hf.dtype == torch.bfloat16
    for n, p in model.named_parameters():
        assert torch.equal(hf.state_dict()[n], p.detach().to(torch.bfloat16)), n
    ckpt.export_hf(model, tmp_path / "bf16")  # a second export replaces the first, atomically
    assert sorted(p.name for p in (tmp_path / "bf16").glob("*.safetensors")) == ["model.safetensors"]
    assert not list(tmp_path.glob(".bf16*"))


def test_a_model_trained_from_scratch_is_evaluated_within_its_trained_length(tmp_path) -> None:
    """The exported config.json of a preset model trained at 128 tokens says so; MIA and perplexity
    windows stop there (its max_position_embeddings, 1024, is the architecture's, not trained); a
    fine-tune of it at 256 records 256, and a checkpoint without the record (pretrained) gets none."""
    import axonn
    import axonn.checkpoint as ckpt
    from transformers import AutoModelForCausalLM, LlamaConfig

    from memorization.evaluation.mia import model_max_length
    from memorization.training.models import TRAINED_CONTEXT, build_model, model_config, model_context
    from memorization.training.runtime import Runtime

    model = build_model("tiny", 4096, seed=0, max_seq=128, runtime=Runtime(axonn.init()))
    ckpt.export_hf(model, tmp_path / "m")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert hf.config.max_position_embeddings == 1024 and getattr(hf.config, TRAINED_CONTEXT) == 128
    assert model_context(hf) == 128 and model_max_length(hf) == 128
    assert getattr(model_config(None, 4096, init=str(tmp_path / "m"), max_seq=256), TRAINED_CONTEXT) == 256
    assert getattr(model_config(None, 4096, init=str(tmp_path / "m"), max_seq=64), TRAINED_CONTEXT) == 128
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=4096).save_pretrained(tmp_path / "p")
    pretrained = model_config(None, 100, init=str(tmp_path / "p"), max_seq=256)
    assert getattr(pretrained, TRAINED_CONTEXT, None) is None and model_context(pretrained) == 4096


def test_checkpoint_layout_at_scale_splits_writes_and_opens_few_files() -> None:
    """``benchmarks/reshard_reads.py`` on shapes alone (64 ranks saving, 16 loading): every rank writes
    about 1/G_data of its tensor coordinate's shards, each distinct shard exactly once; a resume
    opens a few files per data replica and maps exactly its own bytes; a reshard opens far fewer
    files than the job has."""
    spec = importlib.util.spec_from_file_location("reshard_reads", REPO / "benchmarks" / "reshard_reads.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from axonn.checkpoint import build_index
    from memorization.training.models import model_config

    config = model_config("tiny", 1024)
    from axonn.grid_shape import GridShape

    src, dst = GridShape.parse("4,2,2,4").sizes(), GridShape.parse("2,1,4,2").sizes()  # 64 ranks -> 16 ranks
    parts = bench.owned_by_slice0(config, src)
    index, slice0_only = build_index(parts, src), build_index(parts, {**src, "data": 1})
    assert len(index) == 64 and sorted(slice0_only) == [f"rank{r:05d}.pt" for r in range(16)]
    from collections import Counter

    stored = Counter((n, s) for part in index.values() for n, s in part.items())
    assert stored == Counter((n, s) for part in slice0_only.values() for n, s in part.items())  # each shard once
    assert max(stored.values()) == 1
    assert max(bench.written(index)) < 0.4 * max(bench.written(slice0_only))  # 4 replicas share the writing
    same = bench.reads(config, index, src, 16)
    assert all(m == o for _, m, o in same) and max(f for f, _, _ in same) <= 3 * 4
    other = bench.reads(config, index, dst, 16)
    assert max(f for f, _, _ in other) <= 40 and sum(m for _, m, _ in other) < 3 * sum(o for _, _, o in other)


def test_writers_balance_each_coordinates_shards_over_its_data_replicas() -> None:
    """Longest-processing-time order: no data replica writes more than an even share plus one shard."""
    import random

    from axonn.checkpoint import writers
    from axonn.sharding import ShardSpec

    rng = random.Random(0)
    for trial in range(50):
        owned = {f"p{i}": ShardSpec.replicated((rng.choice([1, 7, 64, 4096]), rng.randint(1, 300)))
                 for i in range(rng.randint(1, 40))}
        d = rng.randint(1, 8)
        w = writers(owned, d)
        assert set(w) == set(owned) and set(w.values()) <= set(range(d))
        load = [sum(owned[n].local_numel for n in w if w[n] == i) for i in range(d)]
        biggest = max(s.local_numel for s in owned.values())
        assert max(load) <= sum(load) / d + biggest, (trial, load)
        assert w == writers(dict(reversed(list(owned.items()))), d)  # the same on every rank


@pytest.mark.parametrize("size,params", [("1b", 1_100_048_384), ("8b", 8_030_261_248), ("70b", 70_553_706_496),
                                         ("405b", 405_853_388_800)])
def test_presets_are_the_published_models(size, params) -> None:
    """The 1b preset is TinyLlama-1.1B and 8b/70b/405b are Llama 3.1: the published parameter counts,
    and for Llama 3.1 its RoPE (theta 500000, llama3 scaling from 8k to 128k), which a config built
    from the preset carries and a shape read back from that config keeps."""
    from dataclasses import replace

    from axonn.presets import ModelShape, get_preset

    shape = get_preset(size)
    assert shape.num_params() == params
    config = shape.hf_config()
    back = ModelShape.from_hf_config(config, name=size)
    assert back == replace(shape, name=size)
    if size == "1b":
        assert shape.rope_theta == 10000.0 and shape.rope_scaling is None
        return
    assert config.max_position_embeddings == 131072
    rope = getattr(config, "rope_parameters", None) or {**config.rope_scaling, "rope_theta": config.rope_theta}
    assert rope == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


def test_llama3_rope_scaling_reaches_the_model() -> None:
    """A small model with a preset's llama3 RoPE scaling runs and differs from plain RoPE (the
    scaling lowers the long-wavelength frequencies)."""
    from dataclasses import replace

    from transformers import LlamaForCausalLM

    from axonn.presets import get_preset

    small = replace(get_preset("tiny"), rope_theta=500000.0)
    x = torch.arange(3, 67).unsqueeze(0)
    logits = []
    for shape in (small, replace(small, rope_scaling=get_preset("8b").rope_scaling)):
        torch.manual_seed(0)
        logits.append(LlamaForCausalLM(shape.hf_config(attn_implementation="eager")).eval()(x).logits)
    assert not torch.allclose(logits[0], logits[1])
