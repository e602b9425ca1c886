"""Building models (memorization/models.py, axonn/presets.py): what a researcher fine-tuning real Llama
checkpoints meets.

* a ``--init`` checkpoint with Llama 3.x features (tied embeddings, an explicit ``head_dim``, biases, llama3
  RoPE, bf16, several safetensors files) gives the logits of ``LlamaForCausalLM.from_pretrained``;
* the shape of a checkpoint whose ``head_dim`` is not hidden / heads (Llama-3.1-Minitron-4B-Width) counts its
  parameters as built (the planner's memory and the pre-flight check rest on it);
* the real presets normalise with the published RMSNorm eps.
"""
from __future__ import annotations

import torch

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=128, max_position_embeddings=256)


def test_a_llama3_style_checkpoint_gives_the_logits_of_from_pretrained(tmp_path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    import axonn
    from memorization.models import build_model
    from memorization.runtime import Runtime

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
    config must count them so (it counted 64 x 64 and 64 x 32: 2 layers x 12,288 parameters too few), keep the
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
