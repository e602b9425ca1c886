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
