"""recipes/memorize.py on a multi-process 4D grid (gloo) follows the single-process run.

The ranks are forks of the preloaded test server with torchrun's environment (tests/forked.py: no 7 s import per
rank); torchrun itself starts them in the test of a corpus too small for the run and in the slow tests, mpiexec in
the slow mpiexec test."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, WORKERS

sys.path.insert(0, str(REPO / "recipes"))
import memorize  # noqa: E402

SMALL = ["--num-targets", "4", "--num-nonmembers", "2", "--exposures", "2", "--steps", "12", "--prefix", "10",
         "--suffix", "10", "--seq-len", "64", "--no-progress", "--arms", "standard", "--batch-size", "4"]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    out = tmp_path_factory.mktemp("serial")
    return memorize.main(SMALL + ["--out", str(out), "--overwrite"])["arms"]["standard"]


def _launch(launcher: list[str] | int, grid: str, out: Path, extra: tuple[str, ...] = (),
            log: list | None = None) -> dict:
    """The standard arm's results of memorize.py on ``grid``, started by ``launcher`` (a command line such as
    torchrun's, or a number of ranks: forks of the preloaded test server with torchrun's environment,
    tests/forked.py); its output is appended to ``log`` if given."""
    args = [*SMALL, "--grid", grid, "--out", str(out), *extra]
    env = {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "AXONN_TIMEOUT": "240"}
    if isinstance(launcher, int):
        sys.path.insert(0, str(WORKERS))
        import launcher as forked_ranks

        codes, text = forked_ranks.launch(str(REPO / "recipes" / "memorize.py"), launcher, args, timeout=600,
                                          extra_env=env)
        assert codes == [0] * launcher, text[-6000:]
    else:
        r = subprocess.run(launcher + [str(REPO / "recipes" / "memorize.py"), *args], env={**os.environ, **env},
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        text = r.stderr
    if log is not None:
        log.append(text)
    return json.loads((out / "results.json").read_text())["arms"]["standard"]


def _same_run(a: dict, b: dict) -> None:
    """The parallel run follows the serial one: the loss curve and held-out loss to fp32 summation-order
    rounding (1e-5), the extraction rates within one target's worth (greedy decoding of two computations: a
    near-tie in the logits may take the other branch under another CPU's rounding)."""
    assert b["loss_curve"] == pytest.approx(a["loss_curve"], rel=1e-5)
    assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-5)
    one_target = 1 / len(a["exact_by_target"])
    assert abs(b["exact_match"] - a["exact_match"]) <= one_target + 1e-12
    assert abs(b["token_match"] - a["token_match"]) <= one_target + 1e-12


def _torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n)]


def test_row_and_depth_grid_follows_serial(serial, tmp_path):
    """With activation checkpointing (each rank keeps half of every layer input, row = 2, and regathers it)."""
    _same_run(serial, _launch(4, "1,2,1,2", tmp_path / "r", ("--activation-checkpointing",)))


@pytest.mark.slow
def test_full_grid_of_eight_ranks_follows_serial(serial, tmp_path):
    """Every axis at once, with torch.compile (the model code between axonn's collectives compiled, the
    collectives eager; the default suite compiles parallel models in tests/axonn/test_parallelize.py)."""
    _same_run(serial, _launch(_torchrun(8), "1,2,2,2", tmp_path / "r", ("--compile",)))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="mpiexec not installed")
def test_mpiexec_launch_follows_serial(serial, tmp_path):
    _same_run(serial, _launch(["mpiexec", "-n", "4", sys.executable], "2,1,2,1", tmp_path / "r"))


def test_stop_request_on_one_rank_stops_every_rank_after_the_same_step(tmp_path):
    sys.path.insert(0, str(WORKERS))
    import launcher

    codes, out = launcher.launch("stop_request.py", 2, [str(tmp_path)], timeout=240,
                                 extra_env={"WANDB_MODE": "disabled"})
    assert codes == [0, 0], out
    for r in (0, 1):
        assert f"rank {r}: stopped after step 8, LATEST step_0000008" in out, out
        assert f"rank {r}: resumed curve matches" in out, out


@pytest.mark.slow  # bf16 gradient reduction on every axis: tests/axonn_workers/grid_checks.py in the default suite
def test_bf16_gradient_reduction_follows_serial_to_bf16_rounding(serial, tmp_path):
    """--grad-reduce-dtype bf16 on a depth grid (the depth reduce-scatters and the norms' all-reduce
    travel in bf16; tests/axonn_workers/grid_checks.py checks the bytes) follows the serial run to
    bf16 rounding: measured 1.6e-5 at most on this loss curve, checked at 1e-3."""
    run = _launch(_torchrun(2), "1,1,1,2", tmp_path / "r", ("--grad-reduce-dtype", "bf16"))
    assert run["loss_curve"] == pytest.approx(serial["loss_curve"], rel=1e-3)
    assert run["val_loss"] == pytest.approx(serial["val_loss"], rel=1e-3)


def test_run_stopped_on_one_grid_resumes_on_another(serial, tmp_path, monkeypatch):
    """A requeued job on a different allocation: stopped (SIGUSR1's path) in one process, resumed on
    2 ranks, depth 2, with background checkpoints; the checkpoint is resharded and the loss curve
    goes on as if never stopped."""
    from memorization.training.train import Trainer

    step = Trainer.train_step

    def stopping_step(self):
        if self.step == 4:
            self.request_stop()
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", stopping_step)
    out = tmp_path / "r"
    with pytest.raises(SystemExit) as e:
        memorize.main(SMALL + ["--out", str(out)])
    assert e.value.code == 75
    monkeypatch.setattr(Trainer, "train_step", step)
    stopped_at = int((out / "standard" / "checkpoint" / "LATEST").read_text().split("_")[1])
    assert 4 < stopped_at < 12
    with pytest.raises(SystemExit, match="differ.*lr"):  # what the run computes may not change
        memorize.main(SMALL + ["--out", str(out), "--resume", "--lr", "1e-4"])
    log = []
    _same_run(serial, _launch(2, "1,1,1,2", out, ("--resume", "--async-checkpoint"), log))
    assert "--resume with other execution settings (was, now): {'grid': ('1,1,1,1', '1,1,1,2'), " \
           "'async_checkpoint': (False, True)}" in log[0], log[0]
    assert f"standard: resumed at step {stopped_at} of 12" in log[0], log[0]


def test_a_corpus_that_cannot_fill_the_steps_ends_every_rank_with_rank_0s_reason(tmp_path):
    """Rank 0 alone prepares the cached token store; when the corpus cannot fill the steps, every rank exits
    at once (no rank waits for a store that will never come) with rank 0's message, printed once, and nothing
    is written."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "AXONN_TIMEOUT": "60",
           "GOLDFISH_CACHE": str(tmp_path / "cache")}
    cmd = _torchrun(2) + [str(REPO / "recipes" / "memorize.py"), *SMALL, "--steps", "100000", "--grid", "2,1,1,1",
                          "--out", str(tmp_path / "run")]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert r.stderr.count("too small for 100000 steps") == 1, r.stderr[-3000:]
    assert "Timeout" not in r.stderr and not (tmp_path / "run").exists()


def test_a_grid_that_does_not_divide_the_heads_is_one_line_from_rank_0_before_any_data_work(tmp_path):
    """Row 3 cannot split the tiny model's 4 heads: refused before the store is prepared or --out is written,
    printed once (rank 0), not once per rank."""
    sys.path.insert(0, str(WORKERS))
    import launcher

    env = {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "AXONN_TIMEOUT": "60",
           "GOLDFISH_CACHE": str(tmp_path / "cache")}
    codes, out = launcher.launch(str(REPO / "recipes" / "memorize.py"), 3,
                                 [*SMALL, "--grid", "1,3,1,1", "--out", str(tmp_path / "run")], timeout=300,
                                 extra_env=env)
    assert all(c != 0 for c in codes), out
    assert out.count("error: --grid 1,3,1,1: row=3 does not divide heads=4") == 1, out[-3000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()
