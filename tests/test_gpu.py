"""CUDA-only properties (skipped without a GPU; CI has none, the lent GPU machine runs them)."""
import pytest
import torch

from memorization.training.goldfish import GoldfishConfig
from memorization.training.models import build_model
from memorization.training.train import TrainConfig, Trainer, read_record

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _trainer(tmp, compile=False):
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 4096, (8, 64), generator=g).repeat(4, 1)
    cfg = TrainConfig(batch_size=4, micro_batch=2, lr=3e-3, warmup_steps=2, checkpoint_every=0, progress=False,
                      compile=compile, goldfish=GoldfishConfig(k=4, h=3))
    return Trainer(build_model("tiny", 4096, seed=0), rows, torch.zeros_like(rows, dtype=torch.int32), rows[:4],
                   cfg, tmp, run_name="gpu")


@pytest.mark.parametrize("compile", [False, True])
def test_train_step_never_waits_for_the_device(tmp_path, compile, monkeypatch):
    if not compile:
        # eager only: HF reads the position ids to detect packed rows (``bool(tensor.all())``), one sync per
        # forward that is transformers' own; the trainer's rows are never packed, so answer as it would
        import transformers.masking_utils as mu

        monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)
    t = _trainer(tmp_path, compile)
    t.train_step()  # first step: compilation, allocator, fused-optimizer state
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host<->device sync in the step raises
    try:
        recs = [t.train_step() for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    losses = [read_record(r)["loss"] for r in recs]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_traced_memory_matches_the_cuda_allocator(tmp_path):
    """The fake-tensor trace the planner's memory model is checked against sees what the GPU allocates."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "rows.json"
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "benchmarks/memory_validation.py", "--cuda", "--size", "1b", "--seq", "1024",
                          "--micro-batch", "2", "--no-activation-checkpointing", "--json", str(out)], cwd=root,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    (row,) = json.loads(out.read_text())
    assert 0.9 < row["traced_bytes"] / row["cuda_peak_bytes"] < 1.1, row
    assert 0.9 < row["predicted_bytes"] / row["cuda_peak_bytes"] < 1.1, row


def test_compiled_step_runs_flash_attention(tmp_path):
    """With only the flash backend allowed, compiling the step fails if SDPA gets a materialised mask."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    t = _trainer(tmp_path, compile=True)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        rec = read_record(t.train_step())  # the first step compiles: SDPA's kernel is chosen here
    assert t.model.config._attn_implementation == "causal_sdpa" and rec["loss"] > 0


def test_sharded_build_lands_on_the_gpu_and_trains(tmp_path):
    """build_model(runtime=...) allocates and fills on the GPU (CUDA generator, checkpoint rows moved there),
    is deterministic, has HF's init statistics, and a CUDA export round-trips through CheckpointInit."""
    import axonn
    from axonn.checkpoint import export_hf
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    a = build_model("tiny", 4096, seed=0, runtime=rt)
    b = build_model("tiny", 4096, seed=0, runtime=rt)
    assert all(p.is_cuda for p in a.parameters()) and all(t.is_cuda for t in a.buffers())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    w = a.model.layers[0].mlp.up_proj.weight
    assert abs(float(w.std()) - 0.02) < 1e-3
    export_hf(a, tmp_path / "hf")
    c = build_model(None, 4096, init=str(tmp_path / "hf"), runtime=rt)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters()))
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 4096, (8, 64), generator=g)
    cfg = TrainConfig(batch_size=4, checkpoint_every=0, progress=False)
    t = Trainer(c, rows, torch.zeros_like(rows, dtype=torch.int32), rows[:4], cfg, tmp_path / "run", rt)
    assert torch.isfinite(torch.tensor(read_record(t.train_step())["loss"]))


def test_checkpoint_of_cuda_state_is_written_from_the_gpu_and_resumes(tmp_path):
    """``ckpt.save`` hands torch.save the live CUDA tensors (copied to the host one at a time); the files
    load memory-mapped on the CPU and a resumed trainer has the same weights and AdamW state."""
    t = _trainer(tmp_path)
    for _ in range(2):
        t.train_step()
    t.step = 2
    t.save_checkpoint()
    r = _trainer(tmp_path)
    assert r.try_resume() and r.step == 2
    for (n, p), q in zip(t.model.named_parameters(), r.model.parameters()):
        assert q.is_cuda and torch.equal(p, q), n
        for k, v in t.opt.state[p].items():
            assert torch.equal(v.cpu(), r.opt.state[q][k].cpu()), (n, k)
    files = sorted((tmp_path / "checkpoint").glob("step_*/rank*.pt"))
    assert files and torch.load(files[0], map_location="cpu", weights_only=True, mmap=True)["params"]


def test_compiled_step_dispatches_a_causal_kernel_on_grouped_kv(tmp_path):
    """On CUDA with bf16 autocast, the compiled step's aten graph calls flash or cuDNN attention with
    is_causal=True, no mask and K/V at the model's kv_heads (the op the H200 profile showed masked and repeated)."""
    from memorization.training.attention import sdpa_recording_backend
    from memorization.training.loss import causal_lm_loss_sum

    t = _trainer(tmp_path)
    backend, calls = sdpa_recording_backend()
    torch._dynamo.reset()
    t.forward = torch.compile(causal_lm_loss_sum, backend=backend)
    t.train_step()
    c = t.model.config
    assert len(calls) == c.num_hidden_layers, calls  # one forward graph, compiled once for both micro batches
    for call in calls:
        assert ("flash" in call.op or "cudnn" in call.op) and call.is_causal and not call.has_mask, call
        assert (call.q_heads, call.kv_heads) == (c.num_attention_heads, c.num_key_value_heads), call


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
                    reason="FP8 GEMMs need compute capability >= 8.9 (H100/H200, L40, RTX 4090)")
@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_linear_matches_torchao_on_cuda(recipe):
    """The FP8 Linear's forward, input and weight gradients in bf16 equal torchao's Float8Linear's on the GPU."""
    pytest.importorskip("torchao.float8", reason="FP8 needs torchao")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from axonn.intra_layer import Linear
    from axonn.intra_layer.fp8 import Float8Matmuls
    from tests.support import fake_grid

    ref = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False)).cuda()
    grid = fake_grid()
    grid.device = torch.device("cuda")
    ours = Linear(256, 128, bias=False, expert_mode=True, grid=grid, device="cuda", init=False)
    ours.load_full(ref[0].weight.detach())
    ours.fp8 = Float8Matmuls(recipe)
    convert_to_float8_training(ref, config=Float8LinearConfig.from_recipe_name(recipe))
    x = torch.randn(4, 64, 256, device="cuda")
    dy = torch.randn(4, 64, 128, device="cuda", dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ya, yb = ours(xa), ref(xb)
    ya.backward(dy)
    yb.backward(dy)
    assert ya.dtype == yb.dtype == torch.bfloat16
    torch.testing.assert_close(ya, yb)
    torch.testing.assert_close(xa.grad, xb.grad)
    torch.testing.assert_close(ours.weight.grad.view(128, 256), ref[0].weight.grad)
