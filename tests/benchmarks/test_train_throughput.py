"""benchmarks/train_throughput.py: the FLOPs its MFU counts are the model's it builds, its HF baselines train in
the precision they are named for, and its profile names the attention op."""
import pytest
import torch

from benchmarks.common import flops_per_token


@pytest.mark.parametrize("size", ["tiny", "8b"])
def test_train_throughput_counts_the_flops_of_the_model_it_builds(size):
    """The 6 N of train_throughput's MFU is 6 x the Linear weights (the output head included, the input
    embedding not) of the model both sides train, which has VOCAB tokens whatever the preset's vocabulary
    (tiny: 4096, 8b: 128256)."""
    from accelerate import init_empty_weights
    from transformers import LlamaForCausalLM

    from benchmarks.train_throughput import VOCAB, bench_shape
    from memorization.training.models import model_config

    with init_empty_weights():  # shapes only: the 8b model is never allocated
        model = LlamaForCausalLM(model_config(size, VOCAB))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    shape, seq = bench_shape(size), 128
    assert model.lm_head.weight.shape[0] == shape.vocab
    attention = 12 * shape.layers * shape.hidden * seq
    # flops_per_token's N also holds the RMSNorm weights (2 h per layer + h): < 0.1% of N
    assert flops_per_token(shape, seq) == pytest.approx(6 * linear + attention, rel=1e-3)


@pytest.mark.parametrize("weights, dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_hf_baselines_train_in_the_precision_they_are_named_for(weights, dtype):
    """train_throughput's HF eager baselines: 'bf16' trains a model cast to bf16 (no fp32 master weights),
    'fp32' an fp32 one; one step changes every weight matrix; any other precision is refused."""
    from benchmarks.train_throughput import VOCAB, hf_trainer

    rows = torch.randint(3, VOCAB, (4, 32))
    step, model = hf_trainer("tiny", rows, 2, torch.device("cpu"), weights)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    step()
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters() if p.ndim == 2)
    with pytest.raises(ValueError, match="fp32, bf16"):
        hf_trainer("tiny", rows, 2, torch.device("cpu"), "fp16")


def test_hf_compile_baseline_is_the_bf16_model_compiled():
    """'bf16-compile' is the 'bf16' baseline with its forward under torch.compile (compiled on first call)."""
    from benchmarks.train_throughput import VOCAB, hf_trainer

    _, model = hf_trainer("tiny", torch.randint(3, VOCAB, (4, 32)), 2, torch.device("cpu"), "bf16-compile")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model._compiled_call_impl is not None


def test_profile_reports_the_attention_op_with_its_kv_heads(capsys):
    """print_attention_calls names the SDPA kernel op and its input shapes: here GQA K/V with 2 heads, no mask."""
    from torch.profiler import profile

    from benchmarks.train_throughput import print_attention_calls

    q, kv = torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8)
    with profile(record_shapes=True) as prof:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    print_attention_calls(prof)
    out = capsys.readouterr().out
    assert "attention op aten::_scaled_dot_product" in out and "[1, 2, 16, 8]" in out




def test_layers_override_builds_and_counts_that_many_layers():
    """--layers N: both sides' model has N layers of the preset's shape, and the MFU's FLOPs count N layers."""
    from benchmarks.train_throughput import bench_model, bench_shape

    model = bench_model("tiny", 1)
    assert model.config.num_hidden_layers == len(model.model.layers) == 1
    full, one = bench_shape("tiny"), bench_shape("tiny", 1)
    assert one.layers == 1 < full.layers and (one.hidden, one.ffn, one.vocab) == (full.hidden, full.ffn, full.vocab)


@pytest.mark.parametrize("name, category", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "GEMM"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "GEMM"),
    ("aten::mm", "GEMM"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>", "attention"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "AdamW"),
    ("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "elementwise (Triton)"),
    ("Memcpy HtoD (Pinned -> Device)", "memcpy / memset"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "other"),
])
def test_profile_categories_sort_kernels_into_the_floor_tables_columns(name, category):
    """Kernel and op names go to the floor table's categories: GEMMs, attention, AdamW, Inductor's elementwise."""
    from benchmarks.train_throughput import categorize

    assert categorize(name) == category


def test_fp8_curve_stream_follows_its_rule_nine_tokens_in_ten():
    """benchmarks/fp8_curve.py's synthetic rows: each token is (a prev + b) mod (V - 3) + 3 about 90% of the time
    (a learnable rule: the loss can fall), uniform otherwise, all ids in [3, V)."""
    from benchmarks.fp8_curve import synthetic_rows

    rows = synthetic_rows(64, 128, 1000)
    rule = (rows[:, :-1] * 48271 + 11) % 997 + 3
    frac = float((rows[:, 1:] == rule).float().mean())
    assert 0.88 < frac < 0.92 and int(rows.min()) >= 3 and int(rows.max()) < 1000
