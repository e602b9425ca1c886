"""The trainer: an interrupted run resumes on the same loss curve; Goldfish drops ~1/k of labels; the loss is
normalised by the labels kept; a row's Goldfish context comes from the stream before it."""
import math

import pytest
import torch
import torch.nn.functional as F

from memorization.training.goldfish import IGNORE_INDEX, GoldfishConfig, RowContext, apply_goldfish
from memorization.training.models import build_model
from memorization.training.train import TrainConfig, Trainer, lr_at, read_record


class Interrupt(Exception):
    pass


def _data(n_rows=48, L=32, vocab=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(3, vocab, (8, L), generator=g).repeat(n_rows // 8, 1)  # learnable: rows recur
    return rows, torch.zeros_like(rows, dtype=torch.int32), rows[:8]


def _trainer(tmp, gf=GoldfishConfig(k=0), **kw):
    rows, docs, val = _data()
    cfg = TrainConfig(**{"batch_size": 4, "micro_batch": 2, "lr": 3e-3, "warmup_steps": 3, "checkpoint_every": 4,
                         "progress": False, "goldfish": gf, **kw})
    return Trainer(build_model("tiny", 4096, seed=0), rows, docs, val, cfg, tmp, run_name="t")


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    """The default trainer's uninterrupted 12-step run, trained once for the tests that compare with it (the same
    computation in the same process each time: its curve is what every one of them would get)."""
    return _trainer(tmp_path_factory.mktemp("plain")).fit()


@pytest.mark.parametrize("background", [False, True], ids=["blocking-save", "async-save"])
def test_interrupted_run_resumes_on_the_same_loss_curve(tmp_path, background, plain_run):
    """Also with async_checkpoint: the state is snapshotted when the save starts, although the
    next step changes it while the files are written (the uninterrupted curve is the same with either save)."""
    full = plain_run
    ref = [h["loss"] for h in full["history"]]
    assert len(ref) == 12 and ref[-1] < ref[0]

    def boom(rec):
        if rec["step"] == 7:
            raise Interrupt

    with pytest.raises(Interrupt):
        _trainer(tmp_path / "b", async_checkpoint=background).fit(on_step=boom)
    assert (tmp_path / "b" / "checkpoint" / "LATEST").read_text() == "step_0000004"
    resumed = _trainer(tmp_path / "b", async_checkpoint=background).fit(resume=True)
    got = [h["loss"] for h in resumed["history"]]
    assert got == pytest.approx(ref, rel=1e-6, abs=1e-7)
    assert resumed["val_loss"] == pytest.approx(full["val_loss"], rel=1e-6)


def test_resume_passes_over_a_damaged_newest_checkpoint(tmp_path, plain_run, capsys):
    """Two checkpoints on disk (steps 4 and 8) and 64 bytes flipped in step 8's shard: the resume says so in
    one line and continues from step 4, on the uninterrupted run's loss curve from there."""
    ref = [h["loss"] for h in plain_run["history"]]

    def boom(rec):  # called at step 8 once its checkpoint is written
        if rec["step"] == 8:
            raise Interrupt

    with pytest.raises(Interrupt):
        _trainer(tmp_path / "b").fit(on_step=boom)
    ckpt = tmp_path / "b" / "checkpoint"
    assert (ckpt / "LATEST").read_text() == "step_0000008"
    assert sorted(p.name for p in ckpt.glob("step_*")) == ["step_0000004", "step_0000008"]
    shard = ckpt / "step_0000008" / "rank00000.pt"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 64])
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    resumed = _trainer(tmp_path / "b").fit(resume=True)
    err = capsys.readouterr().err.splitlines()
    fell = [line for line in err if "damaged" in line]
    assert len(fell) == 1 and "step_0000008" in fell[0] and "rank00000.pt" in fell[0], err
    assert fell[0].endswith("resuming from step_0000004, the newest intact one"), err
    assert "t: resumed at step 4 of 12" in "\n".join(err), err
    assert [h["loss"] for h in resumed["history"]] == pytest.approx(ref, rel=1e-6, abs=1e-7)
    assert [h["step"] for h in resumed["history"]] == list(range(1, 13))
    assert resumed["val_loss"] == pytest.approx(plain_run["val_loss"], rel=1e-6)


def test_resume_refuses_a_checkpoint_of_a_different_run(tmp_path):
    def stop(rec):  # a checkpoint of the 12-step run (step 4) is all the refusal needs
        if rec["step"] == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        _trainer(tmp_path / "a").fit(on_step=stop)
    assert (tmp_path / "a" / "checkpoint" / "LATEST").read_text() == "step_0000004"
    rows, docs, val = _data(n_rows=64)
    cfg = TrainConfig(batch_size=4, checkpoint_every=4, progress=False)
    t = Trainer(build_model("tiny", 4096, seed=0), rows, docs, val, cfg, tmp_path / "a")
    with pytest.raises(ValueError, match="12-step run"):
        t.fit(resume=True)


@pytest.mark.parametrize("change", ["lr", "goldfish", "stream"])
def test_resume_refuses_other_settings_or_data_before_loading_anything(tmp_path, change):
    _trainer(tmp_path / "a", steps=4).fit()
    kw = {"lr": {"lr": 1e-3}, "goldfish": {"gf": GoldfishConfig(k=4, h=3)}, "stream": {}}[change]
    t = _trainer(tmp_path / "a", steps=4, **kw)
    if change == "stream":
        t.rows = t.rows.flip(0)  # the same shape, other rows
    before = [p.detach().clone() for p in t.model.parameters()]
    with pytest.raises(ValueError, match={"lr": "lr was 0.003, now 0.001", "goldfish": "goldfish was",
                                          "stream": "training stream was different data"}[change]):
        t.fit(resume=True)
    assert t.step == 0 and all(torch.equal(a, p) for a, p in zip(before, t.model.parameters()))
    # how it runs may change: another micro batch and checkpoint interval resume fine
    assert _trainer(tmp_path / "a", steps=4, micro_batch=4, checkpoint_every=2).try_resume()


def test_wandb_run_is_resumed_not_restarted(tmp_path, monkeypatch):
    """An interrupted training logs on into the same wandb run (the id travels in the checkpoint)."""
    import importlib.machinery
    import sys
    import types

    inits = []

    class Run:
        def __init__(self, **kw):
            self.id, self.summary = kw.get("id") or f"run{len(inits)}", {}
            inits.append(kw)

        def log(self, *a, **kw):
            pass

        def finish(self):
            pass

    fake = types.ModuleType("wandb")  # a module with a spec: transformers may ask importlib whether wandb exists
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    fake.init = lambda **kw: Run(**kw)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.setenv("WANDB_MODE", "offline")

    def boom(rec):
        if rec["step"] == 5:
            raise Interrupt

    with pytest.raises(Interrupt):  # 6 steps: the checkpoint at step 4 is resumed once
        _trainer(tmp_path, steps=6).fit(on_step=boom)
    _trainer(tmp_path, steps=6).fit(resume=True)
    assert "id" not in inits[0] and inits[1]["id"] == "run0" and inits[1]["resume"] == "allow"
    assert inits[1]["mode"] == "offline"


def test_final_step_is_validated_once(tmp_path):
    t = _trainer(tmp_path, eval_every=3, steps=6)
    calls = []
    validate = t.validate
    t.validate = lambda: calls.append(t.step) or validate()
    res = t.fit()
    assert calls == [3, 6] and res["val_loss"] == res["history"][-1]["val_loss"]


def test_bad_warmup_and_validation_sizes_are_caught_up_front(tmp_path):
    with pytest.warns(UserWarning, match="warmup_steps 3 >= the run's 2 steps"):
        _trainer(tmp_path, steps=2)
    with pytest.raises(ValueError, match="validation needs at least one held-out row"):
        _trainer(tmp_path, eval_rows=0)


@pytest.mark.parametrize("setting,match", [
    ({"grad_clip": 0.0}, r"grad_clip=0.0 \(must be > 0; math.inf = no clipping\)"),
    ({"grad_clip": -1.0}, "grad_clip=-1.0"),
    ({"micro_batch": -2}, r"micro_batch=-2 \(must be None or >= 1\)"),
    ({"betas": (0.9, 1.0)}, r"betas=\(0.9, 1.0\) \(must be two numbers in \[0, 1\)\)"),
    ({"min_lr_ratio": 1.5, "weight_decay": -1.0}, r"min_lr_ratio=1.5 .*; weight_decay=-1.0"),
])
def test_settings_that_would_train_wrongly_are_refused(tmp_path, setting, match):
    """A clip of 0 would zero every gradient, a negative one flip them, a negative micro-batch skip every forward:
    none of these fails by itself, so the trainer refuses them before any work."""
    with pytest.raises(ValueError, match=match):
        _trainer(tmp_path, **setting)
    assert not any(tmp_path.iterdir())


def test_goldfish_drops_about_one_in_k_and_changes_training(tmp_path, plain_run):
    res_gf = _trainer(tmp_path / "g", gf=GoldfishConfig(k=4, h=3)).fit()
    res_st = plain_run
    drop = sum(h["goldfish_drop_frac"] for h in res_gf["history"]) / 12
    assert 0.2 < drop < 0.3
    assert all(h["goldfish_drop_frac"] == 0 for h in res_st["history"])
    assert res_gf["history"][0]["loss"] != res_st["history"][0]["loss"]


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    a = _trainer(tmp_path / "a", steps=3, warmup_steps=1).fit()["history"]
    rows, docs, val = _data()
    cfg = TrainConfig(batch_size=4, micro_batch=4, lr=3e-3, warmup_steps=1, checkpoint_every=0, progress=False,
                      steps=3)
    b = Trainer(build_model("tiny", 4096, seed=0), rows, docs, val, cfg, tmp_path / "b").fit()["history"]
    assert [h["loss"] for h in a] == pytest.approx([h["loss"] for h in b], rel=1e-5)


def test_schedule_warmup_then_cosine():
    """The peak comes once (the last warmup step), the cosine is at its middle halfway through the
    decay, and the final step (99 of 100) runs at exactly lr * min_lr_ratio."""
    cfg = TrainConfig(lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, 100, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert max(lrs) == pytest.approx(1.0) and sum(x == pytest.approx(1.0) for x in lrs) == 1
    assert lrs[10] < 1.0 and lrs[54] == pytest.approx(0.55)
    assert lrs[99] == pytest.approx(0.1) and all(a > b for a, b in zip(lrs[9:], lrs[10:]))
    no_warmup = TrainConfig(lr=1.0, warmup_steps=0, min_lr_ratio=0.0)
    assert lr_at(0, 4, no_warmup) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_at(3, 4, no_warmup) == pytest.approx(0.0)


def test_too_many_steps_refused(tmp_path):
    rows, docs, val = _data()
    with pytest.raises(ValueError, match="corpus too small"):
        Trainer(build_model("tiny", 4096), rows, docs, val, TrainConfig(batch_size=4, steps=100), tmp_path)


def test_train_step_leaves_its_values_on_the_device_and_fit_reads_them(tmp_path):
    t = _trainer(tmp_path / "a", gf=GoldfishConfig(k=4, h=3), steps=2, warmup_steps=1)
    rec = t.train_step()
    assert all(isinstance(rec[k], torch.Tensor) and rec[k].dim() == 0 for k in ("loss", "grad_norm",
                                                                                  "goldfish_drop_frac"))
    host = read_record(rec)
    assert host["loss"] == pytest.approx(float(rec["loss"])) and isinstance(host["grad_norm"], float)
    assert host["step"] == 1 and host["lr"] == rec["lr"]
    res = _trainer(tmp_path / "b", gf=GoldfishConfig(k=4, h=3), steps=3, warmup_steps=1).fit()
    assert [h["step"] for h in res["history"]] == [1, 2, 3]  # read one step late, logged in order, none lost
    assert all(isinstance(h[k], float) for h in res["history"] for k in ("loss", "grad_norm", "tokens_per_s"))
    assert res["history"][0]["loss"] == pytest.approx(host["loss"], rel=1e-6)


def test_tokens_per_s_has_no_spikes_at_checkpoints_and_evals(tmp_path):
    """Each step is timed from its enqueue, not between two reads (which come back to back at a checkpoint or an
    eval): timed that way, every eval step's tokens/s would spike.  Another process's load on a shared machine
    spikes some step at random, not all four eval steps."""
    hist = _trainer(tmp_path, eval_every=3).fit()["history"]
    evals = [h["step"] for h in hist if "val_loss" in h]
    assert evals == [3, 6, 9, 12]
    tps = {h["step"]: h["tokens_per_s"] for h in hist[1:]}
    median = sorted(tps.values())[len(tps) // 2]
    assert not all(tps[s] > 5 * median for s in evals), (tps, median)


@pytest.mark.parametrize("signal_after, signame", [(5, "SIGUSR1"), (6, "SIGUSR1"), (5, "SIGTERM")])
def test_stop_signal_checkpoints_then_stops_and_resume_continues_the_curve(tmp_path, signal_after, signame,
                                                                          plain_run):
    """SIGUSR1 (Slurm's warning before the limit) and SIGTERM (Slurm at the limit, scancel, kill) each make the
    run checkpoint and stop within two steps; the resume continues the uninterrupted loss curve exactly."""
    import os
    import signal

    from memorization.training.train import TrainingInterrupted

    ref = [h["loss"] for h in plain_run["history"]]
    sig = getattr(signal, signame)

    def send_signal(rec):
        if rec["step"] == signal_after:
            os.kill(os.getpid(), sig)

    before = signal.getsignal(sig)
    t = _trainer(tmp_path / "b")
    saved = []
    save = t.save_checkpoint
    t.save_checkpoint = lambda: (saved.append(t.step), save())
    with pytest.raises(TrainingInterrupted) as e:
        t.fit(on_step=send_signal)
    assert signal.getsignal(sig) is before  # handler restored
    # on_step(5) runs once step 6 is enqueued, so step 7 carries the request; it is read once step 8 is
    # enqueued. on_step(6) runs once step 7 is enqueued, so step 8 carries it, read at step 8 itself.
    # Either way the run stops after step 8, which is also a periodic checkpoint: written once.
    assert e.value.step == 8 and saved == [4, 8]
    assert (tmp_path / "b" / "checkpoint" / "LATEST").read_text() == "step_0000008"
    resumed = _trainer(tmp_path / "b").fit(resume=True)
    assert [h["loss"] for h in resumed["history"]] == pytest.approx(ref, rel=1e-6, abs=1e-7)
    assert [h["step"] for h in resumed["history"]] == list(range(1, 13))


def test_activation_checkpointing_keeps_the_loss_curve(tmp_path, plain_run):
    """Recomputing each layer in backward changes memory, not the math."""
    ref = [h["loss"] for h in plain_run["history"]]
    t = _trainer(tmp_path / "b", activation_checkpointing=True)
    assert all(layer.gradient_checkpointing for layer in t.model.model.layers)
    got = [h["loss"] for h in t.fit()["history"]]
    assert got == pytest.approx(ref, rel=1e-5)


def test_grad_reduce_dtype_reaches_the_collectives_and_bad_values_are_refused(tmp_path):
    """TrainConfig.grad_reduce_dtype is in force during each step's backward and sync (and only
    then); an unknown dtype is refused before any work."""
    from axonn.intra_layer.overlap import CONFIG

    t = _trainer(tmp_path / "a", grad_reduce_dtype="bf16")
    seen = []
    t.model.lm_head.register_full_backward_hook(lambda *_: seen.append(CONFIG.grad_reduce_dtype))
    t.train_step()
    assert seen == [torch.bfloat16] * 2 and CONFIG.grad_reduce_dtype is None  # two micro-steps
    with pytest.raises(ValueError, match="grad_reduce_dtype must be one of"):
        _trainer(tmp_path / "b", grad_reduce_dtype="fp8")


@pytest.mark.parametrize("max_norm", [0.05, 1e6], ids=["clipping", "not-clipping"])
def test_fused_adamw_takes_the_clip_as_its_grad_scale(max_norm):
    """Runtime.clip_and_step with a fused AdamW (the trainer's on CUDA; torch has it on CPU too) divides the
    gradients inside the optimizer's kernel: the same parameters and norms as clipping first, step by step, with
    gradients whose norm changes 100x between steps (Adam is invariant to one constant scale, not to these)."""
    import axonn
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(64, 32)), torch.nn.Parameter(torch.randn(32))]
    ours = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    opt_ref = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, fused=True)
    opt = torch.optim.AdamW(ours, lr=1e-2, weight_decay=0.1, fused=True)
    for scale in (1.0, 100.0, 0.01, 10.0):
        grads = [torch.randn_like(p) * scale for p in ref]
        for p, q, g in zip(ref, ours, grads):
            p.grad, q.grad = g.clone(), g.clone()
        norm_ref = axonn.clip_grad_norm_(ref, max_norm, grid=rt.grid)
        opt_ref.step()
        norm = rt.clip_and_step(opt, ours, max_norm)
        torch.testing.assert_close(norm, norm_ref, rtol=0, atol=0)
        for p, q in zip(ref, ours):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
    assert not hasattr(opt, "grad_scale")  # nothing left for the next step or a GradScaler


@pytest.mark.parametrize("impl", ["for-loop", pytest.param("foreach", marks=pytest.mark.slow)])
def test_every_adamw_impl_trains_the_fused_curve_and_resumes_its_checkpoints(tmp_path, impl, plain_run):
    """adamw_impl reaches torch's AdamW; for-loop and foreach follow the default fused AdamW's loss curve (the
    fused one clipped through grad_scale, the clip active at every step) to float rounding; and a run checkpointed
    under either resumes under the fused one on the uninterrupted fused curve (the optimizer state is the same)."""
    curves = []
    for name in (impl, "fused"):
        t = _trainer(tmp_path / name, steps=8, grad_clip=0.05, checkpoint_every=0, adamw_impl=name)
        group = t.opt.param_groups[0]
        assert (bool(group["fused"]), bool(group["foreach"])) == (name == "fused", name == "foreach")
        hist = t.fit()["history"]
        assert all(h["grad_norm"] > 0.05 for h in hist)  # clipped every step
        curves.append([h["loss"] for h in hist])
    assert curves[0] == pytest.approx(curves[1], rel=1e-5)

    def boom(rec):
        if rec["step"] == 7:
            raise Interrupt

    with pytest.raises(Interrupt):
        _trainer(tmp_path / "r", adamw_impl=impl).fit(on_step=boom)
    resumed = _trainer(tmp_path / "r").fit(resume=True)
    assert [h["loss"] for h in resumed["history"]] == pytest.approx([h["loss"] for h in plain_run["history"]],
                                                                    rel=1e-5)
    with pytest.raises(ValueError, match=r"adamw_impl='adam' \(must be 'fused' or 'foreach' or 'for-loop'\)"):
        _trainer(tmp_path / "bad", adamw_impl="adam")


V = 512


@pytest.fixture(autouse=True)
def _no_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")


def _rows(n_rows: int = 16, L: int = 32) -> torch.Tensor:
    return torch.randint(3, V, (n_rows, L), generator=torch.Generator().manual_seed(0))


def _small_trainer(tmp, rows=None, docs=None, val=None, row_context=None, **kw) -> Trainer:
    rows = _rows() if rows is None else rows
    docs = torch.zeros(rows.shape, dtype=torch.int32) if docs is None else docs
    cfg = TrainConfig(**{"batch_size": 4, "steps": 2, "warmup_steps": 1, "checkpoint_every": 0, "progress": False,
                         "lr": 1e-2, **kw})
    return Trainer(build_model("tiny", V, seed=0), rows, docs, rows[:4] if val is None else val, cfg, tmp,
                   row_context=row_context)


def test_an_int32_stream_trains_and_validates_like_int64(tmp_path):
    """A pre-tokenized stream kept in int32 (half the host memory) trains and validates as the int64 one does,
    the final validation included (F.cross_entropy wants int64 targets)."""
    rows = _rows()
    ref = _small_trainer(tmp_path / "a", rows=rows).fit()
    got = _small_trainer(tmp_path / "b", rows=rows.int()).fit()
    assert [h["loss"] for h in got["history"]] == pytest.approx([h["loss"] for h in ref["history"]], rel=1e-6)
    assert got["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-6)
    assert (tmp_path / "b" / "train_result.json").exists()


@pytest.mark.parametrize("case,match", [
    ("doc_ids_shape", r"doc_ids has shape \(5, 32\), the rows \(16, 32\)"),
    ("rows_out_of_vocab", r"rows hold token ids in \[3, 1023\], outside the model's vocabulary \[0, 512\)"),
    ("val_out_of_vocab", r"val_rows hold token ids in \[-1, "),
    ("float_rows", r"rows must hold integer token ids .* got torch.float32"),
    ("negative_steps", r"steps=-1 \(must be None or >= 0"),
])
def test_bad_streams_and_step_counts_are_refused_before_any_work(tmp_path, case, match):
    """The constructor refuses, with a clear error, what would otherwise fail later: doc_ids of another shape (at
    the first checkpoint or Goldfish step), out-of-vocabulary ids (at the first step, on a GPU a device-side
    assert; in the held-out rows only at the validation after the whole run), steps=-1 (after writing a step-0
    checkpoint)."""
    rows = _rows()
    kw = {"doc_ids_shape": {"docs": torch.zeros((5, 32), dtype=torch.int32)},
          "rows_out_of_vocab": {"rows": torch.cat([rows[:-1], torch.full((1, 32), 2 * V - 1)])},
          "val_out_of_vocab": {"val": torch.cat([rows[:3], torch.full((1, 32), -1)])},
          "float_rows": {"rows": rows.float()},
          "negative_steps": {"steps": -1}}[case]
    with pytest.raises(ValueError, match=match):
        _small_trainer(tmp_path, **kw)
    assert not any(tmp_path.iterdir())


def test_goldfish_wider_than_the_row_context_is_refused_up_front(tmp_path):
    """h > the context's C tokens is refused before training starts (before wandb and the resume), not inside
    the first training step."""
    rows = _rows()
    ctx = RowContext(torch.zeros((len(rows), 4), dtype=torch.long), torch.zeros((len(rows), 4), dtype=torch.int32),
                     torch.zeros(len(rows), dtype=torch.long))
    with pytest.raises(ValueError, match="goldfish h=13 needs the 13 stream tokens .* holds only 4"):
        _small_trainer(tmp_path, row_context=ctx, goldfish=GoldfishConfig(k=4, h=13))
    assert not any(tmp_path.iterdir())


def test_goldfish_accumulation_weights_every_kept_label_of_the_global_batch_equally(tmp_path):
    """(Coverage, no fix.) With k = 2 the rows keep different numbers of labels; one row per micro-batch must still
    give the mean over the global batch's kept labels (not a mean of per-micro-batch means): the first step's loss
    and grad norm equal a plain HF forward's, and the curve equals the one-forward step's."""
    rows, gf = _rows(), GoldfishConfig(k=2, h=2)
    docs = torch.zeros(rows.shape, dtype=torch.int32)
    labels, _ = apply_goldfish(rows[:4].clone(), rows[:4], gf, docs[:4])
    kept = (labels[:, 1:] != IGNORE_INDEX).sum(1)
    assert len(set(kept.tolist())) > 1  # uneven micro-batches
    model = build_model("tiny", V, seed=0)
    logits = model(input_ids=rows[:4]).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
    curves = [_small_trainer(tmp_path / str(m), micro_batch=m, goldfish=gf).fit()["history"] for m in (1, 4)]
    assert curves[0][0]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert curves[0][0]["grad_norm"] == pytest.approx(norm.item(), rel=1e-4)
    assert [h["loss"] for h in curves[0]] == pytest.approx([h["loss"] for h in curves[1]], rel=1e-5)


def test_the_stream_check_reads_no_values_of_fake_tensors():
    """memory_trace builds the trainer under FakeTensorMode (shapes, no values): the range check must stand aside
    there, and still refuse what the shapes and dtypes alone show."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memorization.training.train import _check_stream

    with FakeTensorMode(allow_non_fake_inputs=True):
        rows = torch.randint(3, V, (8, 16))
        _check_stream(rows, torch.zeros((8, 16), dtype=torch.int32), rows[:2], V)  # no DataDependentOutputException
        with pytest.raises(ValueError, match="doc_ids has shape"):
            _check_stream(rows, torch.zeros((8,), dtype=torch.int32), rows[:2], V)


class _TwoReplicas:
    """Rank ``rank`` of a data grid of 2 replicas, simulated in one process over the real 1-rank runtime ``rt``:
    its batch slice is its half, and its all-reduce adds ``other`` (the other rank's local sums), keeping its own."""

    def __init__(self, rt, rank: int, other: torch.Tensor | None = None):
        self.rt, self.rank, self.other, self.local = rt, rank, other, None

    def __getattr__(self, name):
        return getattr(self.rt, name)

    replicas = 2

    def local_batch_rows(self, batch: int) -> int:
        return batch // 2

    def batch_slice(self, t: torch.Tensor) -> torch.Tensor:
        assert len(t) % 2 == 0, "axonn.batch_slice refuses an uneven split"
        return t.chunk(2)[self.rank]

    def all_reduce_batch(self, t: torch.Tensor) -> None:
        self.local = t.clone()
        if self.other is not None:
            t += self.other


@pytest.mark.parametrize("n_val", [1, 3])
def test_validation_measures_the_same_rows_on_any_grid(tmp_path, n_val):
    """val_loss is the same on any grid (also on a resume onto another grid): the held-out rows are padded with
    ignored copies to a multiple of data x depth, not cut to one (19 rows, the built-in corpus at --seq-len 512,
    would be 18 on 2 replicas and 16 on 4), so 2 replicas give the serial val_loss over all n_val rows, each
    scoring only its real rows."""
    rows = _rows()
    from memorization.training.runtime import Runtime

    serial = _small_trainer(tmp_path / "s", val=rows[:n_val], eval_rows=n_val)
    ref = serial.validate()
    rt = Runtime.create()
    r1 = _TwoReplicas(rt, 1)
    t = Trainer(build_model("tiny", V, seed=0), rows, torch.zeros(rows.shape, dtype=torch.int32), rows[:n_val],
                TrainConfig(batch_size=4, steps=2, warmup_steps=1, checkpoint_every=0, progress=False, eval_rows=n_val),
                tmp_path / "g", runtime=r1)
    t.validate()  # rank 1's share
    t.rt = _TwoReplicas(rt, 0, other=r1.local)
    # other batch splits: per-row GEMMs and the sum over ~100 token losses in another order (fp32, ≤ 100·2^-24)
    assert t.validate() == pytest.approx(ref, rel=1e-5)
    assert r1.local[1] == (n_val // 2) * (rows.shape[1] - 1)  # rank 1 scored its real rows only, not the padding


# ------------------------------------------------------------ a resumed run reports the whole run's time

def test_a_resumed_training_reports_the_time_of_the_whole_run(tmp_path):
    """results.md's "train time" of an arm resumed at step 23 of 48 is the whole run's, not the part after the
    resume: the trainer keeps the time trained so far in its checkpoint and adds to it."""
    import time

    import torch

    from memorization.training.goldfish import GoldfishConfig
    from memorization.training.models import build_model
    from memorization.training.train import TrainConfig, Trainer

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 4096, (8, 32), generator=g).repeat(3, 1)
    docs, val = torch.zeros_like(rows, dtype=torch.int32), rows[:8]

    def trainer():
        cfg = TrainConfig(batch_size=4, micro_batch=2, lr=3e-3, warmup_steps=2, checkpoint_every=4, progress=False,
                          goldfish=GoldfishConfig(k=0))
        return Trainer(build_model("tiny", 4096, seed=0), rows, docs, val, cfg, tmp_path, run_name="t")

    class Interrupt(Exception):
        pass

    def slow_then_stop(rec):  # steps 1-3 are logged before the step-4 checkpoint: >= 0.9 s in it
        time.sleep(0.3)
        if rec["step"] == 5:
            raise Interrupt

    with pytest.raises(Interrupt):
        trainer().fit(on_step=slow_then_stop)
    resumed = trainer().fit(resume=True)
    assert resumed["steps"] == 6
    assert resumed["train_seconds"] >= 0.9


def test_tracking_runs_on_schedule_changes_no_step_and_resumes_with_the_run(tmp_path, plain_run):
    """With track_every 5 over 12 steps the tracker runs before step 1 and after steps 5, 10 and 12; the loss curve
    is the untracked one; an interrupted run resumed from its checkpoint has the same tracking records."""

    def tracker(model, device, autocast):
        return {"weight_sum": float(sum(p.detach().double().sum() for p in model.parameters()))}

    def tracked(tmp):
        rows, docs, val = _data()
        cfg = TrainConfig(batch_size=4, micro_batch=2, lr=3e-3, warmup_steps=3, checkpoint_every=4, progress=False,
                          track_every=5)
        return Trainer(build_model("tiny", 4096, seed=0), rows, docs, val, cfg, tmp, run_name="t", tracker=tracker)

    full = tracked(tmp_path / "a").fit()
    assert [r["step"] for r in full["tracking"]] == [0, 5, 10, 12]
    assert [h["loss"] for h in full["history"]] == [h["loss"] for h in plain_run["history"]]

    def boom(rec):
        if rec["step"] == 7:
            raise Interrupt

    with pytest.raises(Interrupt):
        tracked(tmp_path / "b").fit(on_step=boom)
    resumed = tracked(tmp_path / "b").fit(resume=True)
    assert [r["step"] for r in resumed["tracking"]] == [0, 5, 10, 12]
    for got, want in zip(resumed["tracking"], full["tracking"]):
        assert got["weight_sum"] == pytest.approx(want["weight_sum"], rel=1e-6)


@pytest.mark.slow  # FP8 GEMMs are emulated on CPU: ~7 s of CPU a run
@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise"])
def test_fp8_training_follows_the_high_precision_loss_curve(tmp_path, recipe, plain_run):
    """``fp8``: the block Linears in FP8 (torchao's recipe; the head in fp32 here) train the tiny model on the same
    loss curve as fp32 within 2% a step over 12 steps, and the curve is not fp32's own (FP8 really ran)."""
    pytest.importorskip("torchao.float8", reason="FP8 needs torchao (pip install 'torchao>=0.18')")
    ref = [h["loss"] for h in plain_run["history"]]
    got = [h["loss"] for h in _trainer(tmp_path, checkpoint_every=0, fp8=recipe).fit()["history"]]
    assert len(got) == len(ref) == 12 and ref[-1] < 0.8 * ref[0]
    rel = [abs(a - b) / b for a, b in zip(got, ref)]
    assert max(rel) < 0.02, rel
    assert max(rel) > 1e-6, rel


def test_unknown_fp8_recipe_refused_before_work(tmp_path):
    with pytest.raises(ValueError, match="fp8 must be one of rowwise, tensorwise"):
        _trainer(tmp_path, fp8="e4m3")
    assert not (tmp_path / "checkpoint").exists()


@pytest.mark.parametrize("field", ["lr", "weight_decay"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_optimizer_settings_are_refused(tmp_path, field, value):
    """An infinite (or NaN) learning rate or weight decay makes every weight NaN after one step: refused when the
    trainer is built, naming the setting and its range."""
    with pytest.raises(ValueError, match=rf"TrainConfig: {field}={value!r} \(must be finite"):
        _trainer(tmp_path, **{field: value})


def test_a_non_finite_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tmp_path):
    """The loss of step 5 made NaN (checkpoints every 2 steps): fit raises NonFiniteTraining naming step 5 (the
    loss is read one step late; the run stops there all the same), LATEST stays at step 4, whose weights are
    finite, and no train_result.json is written."""
    from memorization.training.train import NonFiniteTraining

    tr = _trainer(tmp_path, checkpoint_every=2)
    forward = tr.forward

    def poisoned(*a, **k):
        ls, n = forward(*a, **k)
        return (ls * math.nan if tr.step == 4 else ls), n

    tr.forward = poisoned
    with pytest.raises(NonFiniteTraining, match=r"training diverged: the loss is nan at step 5; stopped there, the "
                                                r"last good checkpoint \(step 4\) in .* is kept"):
        tr.fit()
    ckpt = tmp_path / "checkpoint"
    assert (ckpt / "LATEST").read_text() == "step_0000004"
    assert not (tmp_path / "train_result.json").exists()
    fresh = _trainer(tmp_path / "fresh", checkpoint_every=2)
    tr.rt.load_checkpoint(fresh.model, fresh.opt, ckpt)
    assert all(torch.isfinite(p).all() for p in fresh.model.parameters())


def test_a_checkpoint_of_non_finite_weights_is_refused(tmp_path):
    """A NaN weight (a step whose loss was still finite, but whose update was not) is never checkpointed: the save
    raises NonFiniteTraining and writes nothing."""
    from memorization.training.train import NonFiniteTraining

    tr = _trainer(tmp_path)
    with torch.no_grad():
        next(tr.model.parameters()).view(-1)[0] = math.inf
    with pytest.raises(NonFiniteTraining, match=r"a weight is not finite after the update at step 0; stopped there, "
                                                r"no checkpoint was saved before it"):
        tr.save_checkpoint()
    assert not (tmp_path / "checkpoint").exists()


def test_results_files_are_valid_json_even_with_non_finite_numbers(tmp_path):
    """atomic_write_json writes NaN and infinities as null: the file parses as strict JSON."""
    import json

    from memorization.data.atomic import atomic_write_json

    atomic_write_json(tmp_path / "r.json", {"loss": math.nan, "h": [{"x": math.inf}, -math.inf, 1.5], "s": "nan"})

    def strict(c):
        raise ValueError(c)

    assert json.loads((tmp_path / "r.json").read_text(), parse_constant=strict) == {
        "loss": None, "h": [{"x": None}, None, 1.5], "s": "nan"}
