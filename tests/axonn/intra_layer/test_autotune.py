"""Matmul layout autotuning (axonn/intra_layer/autotune.py): variants, cache, Linear on/off."""
from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest
import torch

from axonn.intra_layer import autotune as at


@pytest.fixture(autouse=True)
def _restore_switch(monkeypatch):
    monkeypatch.delenv("AXONN_MATMUL_AUTOTUNE", raising=False)  # the default switch reads it
    prev = (at._STATE["enabled"], at._STATE["tuner"])
    yield
    at._STATE["enabled"], at._STATE["tuner"] = prev


def _reference(op, a, b):
    a64, b64 = a.double(), b.double()
    return {"fwd": lambda: a64 @ b64.t(), "dgrad": lambda: a64 @ b64, "wgrad": lambda: a64.t() @ b64}[op]()


@pytest.mark.parametrize("op", sorted(at.VARIANTS))
def test_every_variant_matches_reference(op):
    g = torch.Generator().manual_seed(0)
    m, n, k = 37, 24, 19  # odd sizes: no accidental square/aligned shortcuts
    a, b = at.operands(op, m, n, k, generator=g)
    assert at.op_dims(op, a, b) == (m, n, k)
    ref = _reference(op, a, b)
    assert len(at.VARIANTS[op]) >= 3
    for name, f in at.VARIANTS[op].items():
        out = f(a, b)
        assert out.is_contiguous(), name
        assert out.shape == ref.shape, name
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5, msg=name)


def _small_tuner(path, **kw):
    return at.MatmulTuner(path, warmup=0, reps=1, min_flops=0, **kw)


def test_cache_written_reread_without_retiming(tmp_path):
    path = tmp_path / "c.json"
    t1 = _small_tuner(path)
    choices = {op: t1.tune(op, 32, 16, 8) for op in at.VARIANTS}
    assert t1.n_tuned == 3
    for op in at.VARIANTS:  # same key again: memory hit
        t1.tune(op, 32, 16, 8)
    assert t1.n_tuned == 3
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 3 and all(set(e["us"]) == set(at.VARIANTS[k.split("|")[0]])
                                     for k, e in entries.items())
    t2 = _small_tuner(path)  # a new process / run: reads the file, does not re-time
    t2.time_variants = lambda *a, **k: pytest.fail("second tuner re-timed a cached key")
    assert {op: t2.tune(op, 32, 16, 8) for op in at.VARIANTS} == choices
    assert t2.n_tuned == 0


@pytest.mark.parametrize("rank", [0, 3])
def test_only_rank_0_of_a_job_writes_the_cache(tmp_path, monkeypatch, rank):
    """Thousands of ranks must not queue on one lock and fsync per key on a shared filesystem:
    a distributed job's rank 0 writes the file, every other rank tunes in memory and reads it."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: rank)
    path = tmp_path / "c.json"
    t = _small_tuner(path)
    choice = t.tune("fwd", 32, 16, 8)
    assert t.n_tuned == 1 and t.tune("fwd", 32, 16, 8) == choice  # remembered either way
    assert path.exists() == (rank == 0)


def test_cache_merged_and_atomic(tmp_path):
    path = tmp_path / "sub" / "c.json"
    a, b = _small_tuner(path), _small_tuner(path)
    a._load(), b._load()  # both read the (missing) file before either writes
    a.tune("fwd", 32, 16, 8)
    b.tune("dgrad", 32, 16, 8)  # must merge, not overwrite a's entry
    keys = set(json.loads(path.read_text())["entries"])
    assert {k.split("|")[0] for k in keys} == {"fwd", "dgrad"}
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # temp files renamed away
    # a corrupt file is ignored (warning) and replaced by a valid one on the next write
    path.write_text("{not json")
    c = _small_tuner(path)
    with pytest.warns(UserWarning, match="unreadable cache"):
        c.tune("wgrad", 32, 16, 8)
    assert len(json.loads(path.read_text())["entries"]) == 1


def _writer(path, i):
    at.merge_into_cache(path, {f"fwd|m={i}|n=1|k=1|float32|cpu:test": {"best": "linear", "us": {}}})


def test_concurrent_writers_never_corrupt(tmp_path):
    path = str(tmp_path / "c.json")
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context()
    procs = [ctx.Process(target=_writer, args=(path, i)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    entries = json.loads(open(path).read())["entries"]
    assert len(entries) == 4  # the lock serialises read-merge-write: no lost entry


def test_default_switch_and_setter():
    at.enable(None)
    assert not at.is_enabled("cpu") and at.is_enabled("cuda")
    with at.set_matmul_autotune(True):
        assert at.is_enabled("cpu")
        with at.set_matmul_autotune(False):
            assert not at.is_enabled("cuda")
        assert at.is_enabled("cpu")
    assert not at.is_enabled("cpu")


def test_disabled_path_is_the_original_call(monkeypatch):
    at.enable(False)
    monkeypatch.setattr(at, "get_tuner", lambda: pytest.fail("tuner used while disabled"))
    x, w = torch.randn(2, 5, 7), torch.randn(3, 7)
    assert torch.equal(at.matmul("fwd", x, w), torch.nn.functional.linear(x, w))
    dy = torch.randn(2, 5, 3)
    assert torch.equal(at.matmul("dgrad", dy, w), dy @ w)


def test_axonn_linear_same_with_tuning_on_and_off(tmp_path):
    import axonn
    from axonn.intra_layer import Linear

    os.environ.pop("WORLD_SIZE", None)
    axonn.init()  # 1x1x1x1 grid in this process
    torch.manual_seed(0)
    layer = Linear(48, 40)
    x0 = torch.randn(3, 16, 48)

    def fwd_bwd():
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_(True)
        y = layer(x)
        (y * torch.linspace(-1, 1, y.shape[-1])).sum().backward()
        return y.detach(), x.grad, layer.weight.grad.clone(), layer.bias.grad.clone()

    at.enable(None)  # default on CPU: off
    off = fwd_bwd()
    tuner = _small_tuner(tmp_path / "c.json")
    with at.set_matmul_autotune(True):
        at.set_tuner(tuner)
        on = fwd_bwd()
        assert tuner.n_tuned == 3  # fwd, dgrad, wgrad each timed once
        on2 = fwd_bwd()
        assert tuner.n_tuned == 3
    for a, b, c in zip(off, on, on2):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        assert torch.equal(b, c)  # same cached choice -> bitwise reproducible
    # every forced variant gives the same layer result as the untuned layer
    for op, variants in at.VARIANTS.items():
        for name in variants:
            forced = _small_tuner(tmp_path / "unused.json", persist=False)
            forced._loaded = True
            forced.choose = lambda o, a, b, op=op, name=name: name if o == op else at.REFERENCE[o]
            with at.set_matmul_autotune(True):
                at.set_tuner(forced)
                got = fwd_bwd()
            for a, b in zip(off, got):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"{op}/{name}")


# ------------------------------------------------------------ caches, dispatch, the benchmark

@pytest.mark.parametrize("content", ['{"entries": []}', '{"entries": null}', '[1, 2]'])
def test_cache_of_the_wrong_shape_is_ignored_with_a_warning(tmp_path, content):
    """Valid JSON that is not a cache (hand-edited, another tool's file at that path) must be ignored with a
    warning and replaced on the next write, never crash the training step."""
    path = tmp_path / "c.json"
    path.write_text(content)
    t = _small_tuner(path)
    with pytest.warns(UserWarning, match="unreadable cache"):
        choice = t.tune("fwd", 32, 16, 8)
    assert choice in at.VARIANTS["fwd"] and t.n_tuned == 1
    entries = json.loads(path.read_text())["entries"]
    assert [e["best"] for e in entries.values()] == [choice]


@pytest.mark.parametrize("best", [["nt_mm"], {}])
def test_cache_entry_with_a_malformed_winner_is_dropped(tmp_path, best):
    """An entry whose winner is not a variant name is dropped (re-timed), not a crash (unhashable list/dict)."""
    path = tmp_path / "c.json"
    key = at.make_key("fwd", 32, 16, 8, torch.float32, "cpu")
    path.write_text(json.dumps({"version": 1, "entries": {key: {"best": best}}}))
    t = _small_tuner(path)
    choice = t.tune("fwd", 32, 16, 8)
    assert choice in at.VARIANTS["fwd"] and t.n_tuned == 1
    entries = json.loads(path.read_text())["entries"]
    assert [e["best"] for e in entries.values()] == [choice]


def test_fake_and_meta_operands_are_not_timed_nor_persisted(tmp_path):
    """Under FakeTensorMode (memorization/training/memory_trace.py) every 'time' is Python dispatch overhead: a winner
    picked from it must not be persisted under the real device's key, where later real runs would use it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    path = tmp_path / "c.json"
    tuner = _small_tuner(path)
    at.enable(True)
    at.set_tuner(tuner)
    with FakeTensorMode():
        y = at.matmul("fwd", torch.randn(4, 16, 32), torch.randn(24, 32))
        dx = at.matmul("dgrad", torch.randn(64, 24), torch.randn(24, 32))
    assert y.shape == (4, 16, 24) and dx.shape == (64, 32)
    y = at.matmul("fwd", torch.empty(64, 32, device="meta"), torch.empty(24, 32, device="meta"))
    assert y.shape == (64, 24) and y.device.type == "meta"
    assert tuner.n_tuned == 0 and not path.exists()
    # real operands of the same shape are still timed (and persisted) afterwards
    at.matmul("fwd", torch.randn(64, 32), torch.randn(24, 32))
    assert tuner.n_tuned == 1 and len(json.loads(path.read_text())["entries"]) == 1


def test_a_dispatch_mode_sees_only_the_layers_product():
    """Timing under FlopCounterMode (or any dispatch-mode tracer) would count every timed call as the step's."""
    from torch.utils.flop_counter import FlopCounterMode

    tuner = at.MatmulTuner(persist=False, warmup=1, reps=3, min_flops=0)
    at.enable(True)
    at.set_tuner(tuner)
    m, n, k = 64, 24, 32
    x, w = torch.randn(m, k), torch.randn(n, k)
    with FlopCounterMode(display=False) as fc:
        y = at.matmul("fwd", x, w)
    assert fc.get_total_flops() == 2 * m * n * k
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w))
    assert tuner.n_tuned == 0


def test_default_switch_honours_the_environment_variable(monkeypatch):
    """``None`` restores *the default*, which AXONN_MATMUL_AUTOTUNE overrides (also when set after import)."""
    monkeypatch.setenv("AXONN_MATMUL_AUTOTUNE", "0")
    at.enable(None)
    assert not at.is_enabled("cuda")
    with at.set_matmul_autotune(True):
        assert at.is_enabled("cuda")
    with at.set_matmul_autotune(None):
        assert not at.is_enabled("cuda")
    monkeypatch.setenv("AXONN_MATMUL_AUTOTUNE", "1")
    assert at.is_enabled("cpu")
    with at.set_matmul_autotune(False):
        assert not at.is_enabled("cpu")
    monkeypatch.delenv("AXONN_MATMUL_AUTOTUNE")
    assert at.is_enabled("cuda") and not at.is_enabled("cpu")


def test_winner_of_another_torch_build_is_not_reused(tmp_path, monkeypatch):
    """cuBLAS/MKL kernels and heuristics change with the torch build; the default cache lives in ~/.cache and
    outlives upgrades, so a winner timed under one build must be re-timed under another."""
    path = tmp_path / "c.json"
    with monkeypatch.context() as mp:
        mp.setattr(torch, "__version__", "2.0.0+old")
        old = _small_tuner(path)
        old.tune("fwd", 32, 16, 8)
        assert old.n_tuned == 1
    new = _small_tuner(path)
    new.tune("fwd", 32, 16, 8)
    assert new.n_tuned == 1  # re-timed, not the old build's winner
    again = _small_tuner(path)
    again.tune("fwd", 32, 16, 8)
    assert again.n_tuned == 0  # the same build reuses its own entry
    assert len(json.loads(path.read_text())["entries"]) == 2


class _Grid:
    """Just enough of axonn.grid.Grid for Linear's constructor: rank 0 of a data x row x col x depth grid."""

    def __init__(self, gr: int, gc: int):
        self._sizes = {"data": 1, "row": gr, "col": gc, "depth": 1}
        self.sizes = tuple(self._sizes.values())

    def size(self, axes) -> int:
        return self._sizes[axes]

    def index(self, axes) -> int:
        return 0


def _layer_blocks(preset: str, tp: tuple[int, int]) -> set[tuple[int, int]]:
    """(local_out, local_in) of every Linear of a Llama block + lm_head, as axonn.parallelize builds them."""
    from axonn.intra_layer import Linear
    from axonn.presets import get_preset

    s = get_preset(preset)
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    layers = {"q": (h, q, False), "k": (h, kv, False), "v": (h, kv, False), "o": (q, h, True),
              "gate": (h, s.ffn, False), "up": (h, s.ffn, False), "down": (s.ffn, h, True),
              "lm_head": (h, s.vocab, False)}
    blocks = set()
    for in_f, out_f, transpose in layers.values():
        lin = Linear(in_f, out_f, bias=False, transpose=transpose, grid=_Grid(*tp), init=False)
        blocks.add((lin.local_out, lin.local_in))
    return blocks


@pytest.mark.parametrize("tp", [(2, 1), (1, 2), (2, 4)])
def test_benchmark_times_the_local_shapes_of_the_parallel_layers(tp):
    """``--tp Gr,Gc`` must time the (out, in) block each rank's Linear really holds: o_proj and down_proj are
    transposed Linears (out over col, in over row) in axonn.parallelize."""
    from benchmarks.matmul_autotune import linear_shapes

    assert {(n, k) for _, n, k in linear_shapes("tiny", True, tp)} == _layer_blocks("tiny", tp)


def test_benchmark_write_cache_pretunes_every_layer(tmp_path, monkeypatch):
    """``--tp 2,1 --write-cache`` pre-tunes every product of every Linear of a 2x1 row x col grid: a run then
    re-times nothing (the documented way to make the layer choices reproducible)."""
    import benchmarks.matmul_autotune as bench

    path = tmp_path / "c.json"
    monkeypatch.setenv("AXONN_AUTOTUNE_CACHE", str(path))
    assert bench.main(["--presets", "tiny", "--m", "64", "--tp", "2,1", "--lm-head", "--reps", "1",
                       "--warmup", "0", "--write-cache"]) == 0
    tuner = at.MatmulTuner(path, min_flops=0)
    tuner.time_variants = lambda *a, **k: pytest.fail("a layer's product was not pre-tuned")
    for n, k in _layer_blocks("tiny", (2, 1)):
        for op in at.VARIANTS:
            tuner.choose(op, *at.operands(op, 64, n, k))
    assert tuner.n_tuned == 0


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
