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
    from memorization.models import model_config

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


