"""benchmarks/common.py: the model FLOPs per token that every benchmark's MFU divides by."""
import pytest

from benchmarks.common import flops_per_token


def test_1b_flops_per_token_is_the_documented_7_31_gflop():
    """6 N (N = 1.035 B matmul parameters: all but the input embedding) + 12 L h s at 2048 tokens
    (benchmarks/results/throughput_notes.md)."""
    from benchmarks.train_throughput import bench_shape

    shape = bench_shape("1b")
    n = shape.num_params() - shape.vocab * shape.hidden
    assert n == pytest.approx(1.035e9, rel=1e-3)
    assert flops_per_token(shape, 2048) == 6 * n + 12 * 22 * 2048 * 2048
    assert flops_per_token(shape, 2048) / 1e9 == pytest.approx(7.31, abs=0.01)
