"""Arithmetic of the benchmark scripts (benchmarks/): what their MFU counts, on the models they build."""
import re
import runpy
import sys

import pytest
import torch

from benchmarks.common import flops_per_token
from tests.support import REPO


def test_1b_flops_per_token_is_the_documented_7_31_gflop():
    """6 N (N = 1.035 B matmul parameters: all but the input embedding) + 12 L h s at 2048 tokens
    (benchmarks/results/throughput_notes.md)."""
    from benchmarks.train_throughput import bench_shape

    shape = bench_shape("1b")
    n = shape.num_params() - shape.vocab * shape.hidden
    assert n == pytest.approx(1.035e9, rel=1e-3)
    assert flops_per_token(shape, 2048) == 6 * n + 12 * 22 * 2048 * 2048
    assert flops_per_token(shape, 2048) / 1e9 == pytest.approx(7.31, abs=0.01)


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


def test_matmul_timing_on_cuda_is_event_timed_per_call(monkeypatch):
    """On CUDA a timing sample of the matmul autotuner (benchmarks/matmul_autotune.py) is the CUDA-event time of
    CUDA_CALLS_PER_SAMPLE back-to-back calls (after one untimed call), in seconds per call: not the wall clock of
    one synchronised call, which adds launch + sync latency to kernels of a few microseconds.  Faked CUDA here."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from axonn.intra_layer import autotune as at

    events = []

    class FakeEvent:
        def __init__(self, enable_timing=False):
            assert enable_timing
            events.append(self)

        def record(self):
            self.calls_before = len(calls)

        def synchronize(self):
            pass

        def elapsed_time(self, end):  # milliseconds, as torch.cuda.Event's: 2 ms per call
            return 2.0 * (end.calls_before - self.calls_before)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", lambda d: nullcontext())
    calls = []
    a = SimpleNamespace(device=torch.device("cuda", 0))
    s = at._seconds_per_call(lambda x, y: calls.append(1), a, None)
    assert len(calls) == at.CUDA_CALLS_PER_SAMPLE + 1 and len(events) == 2
    assert events[0].calls_before == 1  # the warm call is launched before the start event
    assert s == pytest.approx(2e-3)


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


def test_attention_backends_times_each_backend_on_the_presets_gqa_shape(monkeypatch, capsys):
    """The GPU runbook's attention benchmark on CPU: the math and flash-for-CPU backends each print a line;
    K and V keep the preset's KV heads (GQA) unless --repeat-kv."""
    for extra, kv in (([], 2), (["--repeat-kv", "--layout", "bthd"], 4)):
        monkeypatch.setattr(sys, "argv", ["attention_backends.py", "--size", "tiny", "--batch", "1", "--seq", "32",
                                          "--backends", "math,flash", "--steps", "1", *extra])
        runpy.run_path(str(REPO / "benchmarks" / "attention_backends.py"),
                       run_name="__main__")
        out = capsys.readouterr().out
        assert f"4 heads, {kv} kv heads" in out
        assert re.search(r"math\s*:\s*\d+\.\d\d ms", out) and re.search(r"flash\s*:\s*\d+\.\d\d ms", out)


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


def test_clip_step_runs_both_arms_and_prints_the_ratio(monkeypatch, capsys):
    """The benchmark the GPU runbook runs: both arms on the tiny preset's shapes, and its ratio line."""
    monkeypatch.setattr(sys, "argv", ["clip_step.py", "--size", "tiny", "--layers", "1", "--steps", "1",
                                      "--rounds", "1"])
    runpy.run_path(str(REPO / "benchmarks" / "clip_step.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "clip pass + fused AdamW" in out and "clip inside fused AdamW" in out
    assert re.search(r"speedup clip inside / clip pass = \d+\.\d\dx", out)
