"""axonn/checkpoint: sharded checkpoints resume bit-exactly, reshard onto another grid, refuse a mismatch or
damage, and export to Hugging Face.

Runs under ``mpiexec -n 4`` (so this also covers the MPI launch path of ``axonn.init``).
"""
from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.forked import run_python
from tests.support import REPO, WORKERS

_spec = importlib.util.spec_from_file_location("axonn_launcher", WORKERS / "launcher.py")
launcher = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(launcher)

HAVE_MPIEXEC = bool(shutil.which("mpiexec") or (Path(sys.executable).parent / "mpiexec").exists())


@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAVE_MPIEXEC, reason="mpiexec not installed")
def test_checkpoint_resume_reshard_export_under_mpiexec() -> None:
    rc, out = launcher.launch_mpi("ckpt_checks.py", 4, timeout=280)
    assert rc == 0, out
    assert "OK checkpoint" in out, out
    assert "OK tied" in out, out  # a tied head resumed across grids, exported once
    assert "OK families" in out, out  # Mistral, Qwen2, Qwen3, OLMo 2, GPT-NeoX on 1,2,2,1 and their HF export


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_checkpoint_under_torchrun_env() -> None:
    """Same checks with the torchrun-style environment launcher (no MPI)."""
    codes, out = launcher.launch("ckpt_checks.py", 4, timeout=190)
    assert codes == [0] * 4, out
    assert "OK checkpoint" in out, out


def test_incomplete_checkpoint_refused(tmp_path) -> None:
    import axonn.checkpoint as ckpt
    import torch

    (tmp_path / "meta.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no COMPLETE marker"):
        ckpt.load(torch.nn.Linear(2, 2), None, tmp_path, grid=object())


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_save_streams_instead_of_copying_the_state() -> None:
    """A save hands torch.save the live tensors (moved to the host one storage at a time on a GPU):
    it adds a small fraction of the state to the peak host memory, not a copy of all of it."""
    import subprocess

    out = subprocess.run([sys.executable, str(WORKERS / "save_memory.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    growth = float(out.stdout.split("growth")[-1])
    assert growth < 0.2, f"a save grew the peak resident set by {growth:.2f}x the state it wrote"


def test_convert_cli_turns_a_trainer_checkpoint_into_a_hf_model(tmp_path) -> None:
    """``python -m axonn.convert ROOT OUT``: the newest checkpoint under a trainer's root (LATEST) becomes
    a directory that from_pretrained loads with the trained weights; bad input says what is wrong."""

    import torch
    from transformers import LlamaForCausalLM

    import axonn
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    model, opt, x = _stepped_tiny(rt)
    rt.save_checkpoint(model, opt, tmp_path / "ckpt", {"step": 1})
    run = ["-m", "axonn.convert", str(tmp_path / "ckpt"), str(tmp_path / "hf")]
    out = run_python(run, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    sd = hf.state_dict()
    assert all(torch.equal(sd[n], t) for n, t in axonn.full_state_dict(model).items())  # a copy: bitwise
    with torch.no_grad():  # HF's modules vs axonn's: fp32 rounding, not necessarily the same bits on every CPU
        torch.testing.assert_close(hf(input_ids=x).logits, model(input_ids=x).logits, rtol=1e-5, atol=1e-5)
    bad = run_python(["-m", "axonn.convert", str(tmp_path / "nothing"), str(tmp_path / "o")], cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "not a complete axonn checkpoint" in bad.stderr
    # a LATEST that names a checkpoint which is gone: the trainer's resume and the converter say so
    (tmp_path / "ckpt" / "LATEST").write_text("step_0000009")
    with pytest.raises(FileNotFoundError, match="names 'step_0000009', which is not a directory"):
        rt.load_checkpoint(model, opt, tmp_path / "ckpt")
    gone = run_python(run, cwd=REPO, timeout=60)
    assert gone.returncode == 2 and "which is not a directory" in gone.stderr


def test_background_save_is_a_snapshot_published_by_finish(tmp_path, monkeypatch) -> None:
    """save(background=True) copies the state before it returns: training may change it at once.
    The checkpoint appears only at finish(); a failed write raises there and leaves the previous
    checkpoint in place."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from memorization.training.models import build_model

    axonn.init()
    model, opt, x = _stepped_tiny()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    want_m = {n: opt.state[p]["exp_avg"].clone() for n, p in model.named_parameters()}
    pending = ckpt.save(model, opt, tmp_path / "ck", {"step": 1}, background=True)
    with torch.no_grad():  # the next step, while the files are written
        for p in model.parameters():
            p.add_(1.0)
            opt.state[p]["exp_avg"].mul_(3.0)
    assert not (tmp_path / "ck").exists()
    pending.finish()
    assert pending.done() and (tmp_path / "ck" / "COMPLETE").exists()
    fresh = build_model("tiny", 512, seed=4)
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    fresh(input_ids=x, labels=x).loss.backward()
    fresh_opt.step()
    assert ckpt.load(fresh, fresh_opt, tmp_path / "ck") == {"step": 1}
    for n, p in fresh.named_parameters():
        assert torch.equal(p, want[n]), n
        assert torch.equal(fresh_opt.state[p]["exp_avg"], want_m[n]), n

    def broken(path, write):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckpt.saving, "fsync_write", broken)
    pending = ckpt.save(model, opt, tmp_path / "ck", {"step": 2}, background=True)
    with pytest.raises(RuntimeError, match="No space left on device.*previous checkpoint there, if any, is untouched"):
        pending.finish()
    monkeypatch.undo()
    assert ckpt.load(fresh, fresh_opt, tmp_path / "ck") == {"step": 1}


def test_background_save_without_host_memory_for_the_snapshot_saves_blocking(tmp_path, monkeypatch) -> None:
    """A snapshot that does not fit in this rank's share of the node's available memory is not
    attempted: the save is written before save() returns, with a warning saying why."""
    import psutil
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from axonn.grid import ranks_per_node
    from memorization.training.models import build_model

    axonn.init()
    model = build_model("tiny", 512, seed=3)
    opt = torch.optim.AdamW(model.parameters())
    need = ckpt.state_bytes(model, opt)
    assert need == sum(p.numel() * 4 for p in model.parameters())  # no AdamW state before a step

    class Mem:
        available = need  # 0.8 x this < need
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem)
    with pytest.warns(UserWarning, match="does not fit in its share of host memory.*saving blocking"):
        assert ckpt.save(model, opt, tmp_path / "ck", {"step": 1}, background=True) is None
    assert (tmp_path / "ck" / "COMPLETE").exists()
    Mem.available = 2 * need
    pending = ckpt.save(model, opt, tmp_path / "ck2", {"step": 1}, background=True)
    assert pending is not None
    pending.finish()
    from axonn.grid import LOCAL_SIZE_VARS

    for var in LOCAL_SIZE_VARS:  # (an in-process MPI init earlier in the session may have set one)
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4(x2)")  # the node's memory is shared by 4 ranks
    assert ranks_per_node() == 4
    with pytest.warns(UserWarning, match="saving blocking"):
        assert ckpt.save(model, opt, tmp_path / "ck3", {"step": 1}, background=True) is None
    assert ranks_per_node({"LOCAL_WORLD_SIZE": "8", "SLURM_NTASKS_PER_NODE": "4"}) == 8


def test_discard_renames_at_once_and_deletes_in_the_background(tmp_path, monkeypatch) -> None:
    """Rank 0 must not delete a job-scale checkpoint while the other ranks wait in a barrier: the
    directory leaves its name at once (one rename) and is removed by a thread, with any trash an
    earlier process left behind."""
    import shutil
    import threading

    import axonn.checkpoint as ckpt

    for name in ("step_0000010", "step_0000020"):
        (tmp_path / name / "sub").mkdir(parents=True)
        (tmp_path / name / "sub" / "shard.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / ".trash-step_0000000-deadbeef").mkdir()  # left by a process that exited mid-delete
    gate = threading.Event()
    real_rmtree = shutil.rmtree
    monkeypatch.setattr(shutil, "rmtree", lambda p, **kw: (gate.wait(10), real_rmtree(p, **kw)))
    t = ckpt.discard(tmp_path / "step_0000010")
    assert not (tmp_path / "step_0000010").exists()  # gone from its name before any deletion ran
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_0000020"]
    assert t.is_alive()  # the deletion is still waiting: discard did not
    gate.set()
    t.join(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_0000020"]


def _common():
    """The workers' shared helpers (``tests/axonn_workers/common.py``), in this process."""
    spec = importlib.util.spec_from_file_location("axonn_common", WORKERS / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    return common


def _tiny_llama(**kw):
    """The workers' tiny Llama, in this process."""
    return _common().tiny_llama(0, **kw)


def _stepped_tiny(rt=None):
    """``(model, optimizer, tokens)``: the tiny preset (seed 3) after one AdamW step on the random ``tokens``
    (2 x 16), so weights and optimizer state are both non-trivial.  On ``rt``'s grid, or plain without one."""
    import torch

    from memorization.training.models import build_model

    model = build_model("tiny", 512, seed=3, runtime=rt)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randint(0, 512, (2, 16))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    return model, opt, x


def test_export_config_dtype_is_the_dtype_written(tmp_path) -> None:
    """A model whose config says bfloat16 (built from a bf16 Hub config) but trains fp32 weights:
    the export, as stored or converted, must load in from_pretrained in the dtype it holds, with
    the trained model's logits -- not rounded to the config's bf16."""
    import torch
    from transformers import AutoModelForCausalLM

    import axonn
    import axonn.checkpoint as ckpt

    axonn.init()
    model = axonn.parallelize(_tiny_llama(dtype="bfloat16"))
    assert model.config.dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    ckpt.save(model, None, tmp_path / "ck")
    ckpt.export_hf(model, tmp_path / "live")
    ckpt.to_hf(tmp_path / "ck", tmp_path / "offline")
    ckpt.export_hf(model, tmp_path / "half", dtype=torch.float16)
    assert model.config.dtype == torch.bfloat16  # the live model's config is not changed
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        want = model(input_ids=x).logits
        for name, dtype in (("live", torch.float32), ("offline", torch.float32), ("half", torch.float16)):
            hf = AutoModelForCausalLM.from_pretrained(tmp_path / name, attn_implementation="eager")
            assert hf.dtype == dtype, (name, hf.dtype)
            if dtype == torch.float32:  # the weights are a copy (bitwise); the logits come from HF's modules
                sd = hf.state_dict()
                assert all(torch.equal(sd[n], t) for n, t in axonn.full_state_dict(model).items()), name
                torch.testing.assert_close(hf(input_ids=x).logits, want, rtol=1e-5, atol=1e-5, msg=name)


def test_trainer_save_removes_staging_dirs_of_crashed_saves(tmp_path) -> None:
    """A save that crashed (or failed to write) leaves its ``.step_*.tmp`` staging directory; one of a
    step that is never saved again (a stop request's off-schedule step) must not stay for good: the
    next published save removes it, and keeps the checkpoint LATEST names and the one before."""
    import torch

    import axonn
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    model = build_model("tiny", 512, seed=3, runtime=rt)
    opt = torch.optim.AdamW(model.parameters())
    root = tmp_path / "ckpt"
    rt.save_checkpoint(model, opt, root, {"step": 4})
    stale = root / ".step_0000006.tmp"  # the stop request's save at step 6 died half-way
    stale.mkdir()
    (stale / "rank00000.pt").write_bytes(b"x" * 1000)
    rt.save_checkpoint(model, opt, root, {"step": 8}, background=True)()
    assert (root / "LATEST").read_text() == "step_0000008"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_0000004", "step_0000008"]
    assert not list(root.glob(".step_*")), sorted(p.name for p in root.iterdir())
    # past ten million steps the names grow a digit: the one kept is the newest by number, not by name
    (root / "step_notes").mkdir()  # not a trainer's checkpoint: never touched
    for step in (9_999_999, 10_000_000, 10_000_001):
        rt.save_checkpoint(model, opt, root, {"step": step})
    assert sorted(p.name for p in root.glob("step_*")) == ["step_10000000", "step_10000001", "step_notes"]


@pytest.mark.parametrize("damage", ["meta.json", "index.json"])
def test_damaged_checkpoint_json_is_a_clear_error(tmp_path, damage) -> None:
    """A truncated meta.json or index.json in a checkpoint marked COMPLETE (a disk or copy gone wrong)
    says which file is damaged and how to go on, for a resume and for the converter alike."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from axonn.convert import main as convert
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    model = build_model("tiny", 512, seed=3, runtime=rt)
    opt = torch.optim.AdamW(model.parameters())
    rt.save_checkpoint(model, opt, tmp_path / "ckpt", {"step": 1})
    f = tmp_path / "ckpt" / "step_0000001" / damage
    f.write_text(f.read_text()[:20])
    with pytest.raises(ValueError, match=f"{damage} is not valid JSON.*damaged.*LATEST"):
        rt.load_checkpoint(model, opt, tmp_path / "ckpt")
    assert convert([str(tmp_path / "ckpt"), str(tmp_path / "hf")]) == 2
    f.unlink()
    if damage == "meta.json":
        with pytest.raises(FileNotFoundError, match="meta.json is missing.*damaged"):
            ckpt.read_meta(f.parent)
    else:  # without index.json (format v1, before checksums too) the rank files are read: a truncated one is named
        (f.parent / "checksums.json").unlink()
        meta = json.loads((f.parent / "meta.json").read_text())
        del meta["checksums"]
        (f.parent / "meta.json").write_text(json.dumps({**meta, "format": "axonn-sharded-v1"}))
        shard = f.parent / "rank00000.pt"
        shard.write_bytes(shard.read_bytes()[:1000])
        with pytest.raises(RuntimeError, match="rank00000.pt cannot be read.*damaged.*LATEST"):
            ckpt.load(model, opt, f.parent)


def test_refused_optimizer_leaves_the_model_untouched(tmp_path) -> None:
    """A checkpoint whose optimizer state does not fit the optimizer given (another class, other
    groups, none saved) is refused before anything is loaded: the model keeps its own weights."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from memorization.training.models import build_model

    axonn.init()
    saved = build_model("tiny", 512, seed=3)
    ckpt.save(saved, torch.optim.AdamW(saved.parameters()), tmp_path / "adamw")
    ckpt.save(saved, None, tmp_path / "bare")
    model = build_model("tiny", 512, seed=4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    two_groups = [{"params": list(model.parameters())[:1]}, {"params": list(model.parameters())[1:]}]
    for opt, path, why in ((torch.optim.SGD(model.parameters(), lr=0.1), "adamw", "optimizer is AdamW, got SGD"),
                           (torch.optim.AdamW(two_groups), "adamw", "2 param groups, checkpoint 1"),
                           (torch.optim.AdamW(model.parameters()), "bare", "no optimizer state")):
        with pytest.raises(ValueError, match=why):
            ckpt.load(model, opt, tmp_path / path)
        for n, p in model.named_parameters():
            assert torch.equal(p, before[n]), f"a refused load changed {n}"
    ckpt.load(model, None, tmp_path / "adamw")  # the weights alone still load
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), saved.parameters()))


def test_resuming_a_finished_run_does_not_rewrite_its_checkpoint(tmp_path, monkeypatch) -> None:
    """``fit(resume=True)`` of a run that already finished (a sweep re-running a cell, a requeue after
    the last save) has the state of the checkpoint LATEST names: it must not write that whole
    checkpoint again in place (at scale terabytes, and a crash between the two renames of a
    replacement would leave LATEST naming no directory)."""
    import torch

    import memorization.training.runtime as runtime
    from memorization.training.models import build_model
    from memorization.training.train import TrainConfig, Trainer

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(3, 512, (8, 16), generator=g).repeat(2, 1)
    cfg = TrainConfig(batch_size=4, steps=3, warmup_steps=1, checkpoint_every=2, eval_rows=4, progress=False)

    def trainer() -> Trainer:
        return Trainer(build_model("tiny", 512, seed=0), rows, torch.zeros_like(rows), rows[:4], cfg, tmp_path)

    monkeypatch.setenv("WANDB_MODE", "disabled")
    done = trainer().fit()
    assert (tmp_path / "checkpoint" / "LATEST").read_text() == "step_0000003"
    saves = []
    real_save = runtime.ack.save
    monkeypatch.setattr(runtime.ack, "save", lambda *a, **k: (saves.append(a[2]), real_save(*a, **k))[1])
    again = trainer().fit(resume=True)
    assert saves == [] and again["val_loss"] == done["val_loss"] and again["steps"] == 3
    assert (tmp_path / "checkpoint" / "step_0000003" / "COMPLETE").exists()


def _step_dir(root, name: str, marker: str):
    d = root / name
    d.mkdir(parents=True)
    (d / "COMPLETE").write_text("ok\n")
    (d / "which").write_text(marker)
    return d


def test_replacing_a_checkpoint_swaps_it_in_one_step(tmp_path, monkeypatch) -> None:
    """Publishing over an existing step directory (a requeue that saves a step again) must never
    leave the name empty: on Linux the two directories are exchanged in one call, no rename runs,
    and the previous version is deleted afterwards."""
    import os
    import sys

    import axonn.checkpoint as ckpt

    if not sys.platform.startswith("linux"):
        pytest.skip("renameat2 is Linux's")
    _step_dir(tmp_path, "step_0000003", "old")
    tmp = _step_dir(tmp_path, ".step_0000003.tmp", "new")
    if not ckpt.publishing.exchange(tmp, tmp_path / "step_0000003"):
        pytest.skip("this filesystem cannot exchange directories")
    ckpt.publishing.exchange(tmp, tmp_path / "step_0000003")  # put them back as they were
    renames = []
    monkeypatch.setattr(os, "rename", lambda a, b: (renames.append((a, b)), (_ for _ in ()).throw(
        OSError("a crash between two renames"))))
    threads = []
    monkeypatch.setattr(ckpt.publishing, "discard", lambda p: threads.append(p))
    ckpt.publishing.publish(tmp, tmp_path / "step_0000003")
    assert renames == []  # nothing went through a moment without step_0000003
    assert (tmp_path / "step_0000003" / "which").read_text() == "new"
    assert threads == [tmp] and (tmp / "which").read_text() == "old"  # the old version, handed to discard


def test_a_replacement_cut_between_its_renames_names_the_copy_to_restore(tmp_path, monkeypatch) -> None:
    """Where the filesystem cannot exchange (two renames), a run stopped between them leaves LATEST
    naming no directory; latest() must say where the complete previous version is, not only that it
    is missing (and then start-afresh advice would lose it)."""
    import os

    import axonn.checkpoint as ckpt

    _step_dir(tmp_path, "step_0000003", "old")
    (tmp_path / "LATEST").write_text("step_0000003")
    tmp = _step_dir(tmp_path, ".step_0000003.tmp", "new")
    monkeypatch.setattr(ckpt.publishing, "exchange", lambda a, b: False)
    real_rename = os.rename
    monkeypatch.setattr(os, "rename", lambda a, b: real_rename(a, b) if ".trash-" in str(b) else (
        _ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        ckpt.publishing.publish(tmp, tmp_path / "step_0000003")
    monkeypatch.setattr(os, "rename", real_rename)
    with pytest.raises(FileNotFoundError, match=r"was being replaced.*\.trash-step_0000003-.*rename that back"):
        ckpt.latest(tmp_path)
    (tmp_path / "LATEST").write_text("step_0000009")
    with pytest.raises(FileNotFoundError, match="delete it to start afresh"):  # no copy of that one anywhere
        ckpt.latest(tmp_path)
    # without a swap the two renames still publish
    ckpt.publishing.publish(tmp, tmp_path / "step_0000004")
    assert (tmp_path / "step_0000004" / "which").read_text() == "new"


def test_flipped_bytes_in_a_shard_are_refused_naming_step_and_file(tmp_path, monkeypatch) -> None:
    """64 flipped bytes in rank00000.pt are refused, not loaded: the save records each file's size and block
    crc32s; a load, a convert and a verify refuse the file, naming the step, the file and the block whose crc32
    differs, before the model is touched.  Small blocks here, so the file has several and its writes cross
    them."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from axonn.convert import main as convert
    from memorization.training.models import build_model

    monkeypatch.setattr(ckpt.checksums, "CHECKSUM_BLOCK", 256 * 1024)
    monkeypatch.setattr(ckpt.checksums, "_INLINE_BYTES", 4096)  # large writes hashed by the pool while they are written
    axonn.init()
    saved = build_model("tiny", 512, seed=3)
    opt = torch.optim.AdamW(saved.parameters())
    ckpt.save(saved, opt, tmp_path / "ck", {"step": 7})
    sums = ckpt.read_checksums(tmp_path / "ck")
    shard = tmp_path / "ck" / "rank00000.pt"
    assert sums["step"] == 7 and sums["files"]["rank00000.pt"]["bytes"] == shard.stat().st_size
    blocks = len(sums["files"]["rank00000.pt"]["crc32"])
    assert blocks == -(-shard.stat().st_size // ckpt.checksums.CHECKSUM_BLOCK) > 3
    assert ckpt.verify(tmp_path / "ck") is True
    model = build_model("tiny", 512, seed=4)
    ckpt.load(model, torch.optim.AdamW(model.parameters()), tmp_path / "ck")  # intact: loads
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), saved.parameters()))

    fresh = build_model("tiny", 512, seed=4)
    before = {n: p.detach().clone() for n, p in fresh.named_parameters()}
    _common().flip_bytes(shard, 64, at=0.5)
    block = int(shard.stat().st_size * 0.5) // ckpt.checksums.CHECKSUM_BLOCK + 1
    why = rf"checkpoint of step 7: \S*rank00000.pt: the crc32 of its bytes \d+\.\.\d+ \(block {block} of {blocks}\) " \
          r"is [0-9a-f]{8}, [0-9a-f]{8} when it was saved: the checkpoint is damaged"
    with pytest.raises(ckpt.DamagedCheckpoint, match=why) as e:
        ckpt.load(fresh, torch.optim.AdamW(fresh.parameters()), tmp_path / "ck")
    assert "\n" not in str(e.value)
    assert all(torch.equal(p, before[n]) for n, p in fresh.named_parameters()), "a refused load changed the model"
    with pytest.raises(ckpt.DamagedCheckpoint, match=why):
        ckpt.verify(tmp_path / "ck")
    assert convert([str(tmp_path / "ck"), str(tmp_path / "hf")]) == 2 and not (tmp_path / "hf").exists()
    # truncated (a copy cut short), and checksums.json itself gone from a checkpoint saved with checksums
    shard.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(ckpt.DamagedCheckpoint, match=r"step 7: \S*rank00000.pt is 5000 bytes, \d+ when it was saved"):
        ckpt.verify(tmp_path / "ck")
    (tmp_path / "ck" / "checksums.json").unlink()
    with pytest.raises(FileNotFoundError, match="checksums.json is missing from a checkpoint saved with checksums"):
        ckpt.load(fresh, None, tmp_path / "ck")


def test_checkpoint_saved_without_checksums_still_loads(tmp_path, capsys) -> None:
    """A checkpoint from before checksums (no checksums.json, nothing in meta.json: what
    ``checksums=False`` writes) loads as before; a resume says in one line that it is unverified."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    saved, opt, _ = _stepped_tiny(rt)
    ckpt.save(saved, opt, tmp_path / "root" / "step_0000002", {"step": 2}, checksums=False)
    (tmp_path / "root" / "LATEST").write_text("step_0000002")
    old = tmp_path / "root" / "step_0000002"
    assert not (old / "checksums.json").exists() and "checksums" not in ckpt.read_meta(old)
    assert ckpt.read_checksums(old) is None and ckpt.verify(old) is False
    model = build_model("tiny", 512, seed=4, runtime=rt)
    opt2 = torch.optim.AdamW(model.parameters())
    assert rt.load_checkpoint(model, opt2, tmp_path / "root")["step"] == 2
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), saved.parameters()))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"resume: {old} was saved before checkpoints recorded checksums: loading it unverified"], err


def test_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, capsys) -> None:
    """The trainer keeps two checkpoints: when the one LATEST names is damaged the resume takes the
    other, saying so in one line; when neither is intact it is an error naming both."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime

    rt = Runtime(axonn.init())
    model = build_model("tiny", 512, seed=3, runtime=rt)
    root = tmp_path / "ckpt"
    at4 = _common().save_steps_4_and_8(rt, model, torch.optim.AdamW(model.parameters()), root)
    assert rt.resume_point(root) == root / "step_0000008" and capsys.readouterr().err == ""
    _common().flip_bytes(root / "step_0000008" / "rank00000.pt")
    fresh = build_model("tiny", 512, seed=5, runtime=rt)
    extra = rt.load_checkpoint(fresh, torch.optim.AdamW(fresh.parameters()), root)
    assert extra["step"] == 4
    assert all(torch.equal(p, at4[n]) for n, p in fresh.named_parameters())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"resume: checkpoint step_0000008 in {root} is damaged (checkpoint "
                                               f"of step 8: {root / 'step_0000008' / 'rank00000.pt'}: the crc32"), err
    assert err[0].endswith("; resuming from step_0000004, the newest intact one"), err
    _common().flip_bytes(root / "step_0000004" / "extra.pt", 8)
    with pytest.raises(ckpt.DamagedCheckpoint, match=rf"no intact checkpoint in {root} to resume from \(step_0000008: "
                                                     r".*rank00000.pt.*; step_0000004: .*extra.pt: the crc32"):
        rt.resume_point(root)


@pytest.mark.timeout(120)
def test_every_rank_falls_back_when_one_finds_its_shard_damaged() -> None:
    """2 ranks (data 2: each writes a shard file, and verifies its own): a damaged rank00001.pt is found
    by rank 1 alone, yet both ranks resume from the older checkpoint, with the same state; with both
    checkpoints damaged both refuse (tests/axonn_workers/damaged_resume.py)."""
    codes, out = launcher.launch("damaged_resume.py", 2, timeout=110)
    assert codes == [0, 0], out
    for r in (0, 1):
        assert f"rank {r}: fell back to step 4 with its state" in out, out
        assert f"rank {r}: refused, no intact checkpoint" in out, out
    assert out.count("resuming from step_0000004") == 1, out  # said once, by rank 0


@pytest.mark.parametrize("victim", ["extra.pt", "rank00000.pt"])
def test_checkpoint_pickle_that_runs_code_is_refused_and_not_run(tmp_path, victim) -> None:
    """A checkpoint file replaced by a pickle whose unpickling runs code (here: creates a marker file), its crc32
    recomputed in checksums.json as an attacker would, is refused by every load (the extra state alone, and a
    whole load) with an error naming the file; the payload never runs."""
    import torch

    import axonn
    import axonn.checkpoint as ckpt
    from memorization.training.models import build_model
    from memorization.training.runtime import Runtime
    from tests.support import rewrite_checksum, write_malicious_torch_file

    rt = Runtime(axonn.init())
    model = build_model("tiny", 512, seed=3, runtime=rt)
    root = tmp_path / "ckpt"
    rt.save_checkpoint(model, torch.optim.AdamW(model.parameters()), root,
                       {"step": 4, "history": [{"step": 1, "loss": 2.5}], "wandb_id": None})
    step = root / "step_0000004"
    assert rt.checkpoint_extra(root)["history"] == [{"step": 1, "loss": 2.5}]  # plain extra state loads
    marker = tmp_path / "PWNED"
    write_malicious_torch_file(step / victim, marker, wrap=lambda p: {"step": 4, "x": p})
    rewrite_checksum(step, victim)
    assert ckpt.verify(step)  # the checksums match: only the refusal to unpickle code protects the load
    loads = [lambda: rt.load_checkpoint(model, torch.optim.AdamW(model.parameters()), root)]
    if victim == "extra.pt":
        loads.append(lambda: ckpt.read_extra(step))
    for load in loads:
        with pytest.raises(ckpt.UnsafeCheckpoint, match=rf"{victim} holds something other than tensors and plain "
                                                        r"data and is refused: loading it could run code"):
            load()
    assert not marker.exists()
