"""benchmarks/train_grid.py: every grid trains the same model (the last losses agree), and bad settings are refused
before any rank starts."""
import sys

import pytest

from benchmarks import train_grid


@pytest.mark.parametrize("argv, match", [
    (["--grids", "1,1,1,1;2,1,1"], "--grids"),
    (["--steps", "0"], "must be >= 1"),
    (["--init", "/nonexistent/model"], "no Hugging Face checkpoint"),
])
def test_bad_settings_are_refused_before_any_rank_starts(monkeypatch, capsys, argv, match):
    """A malformed grid, no timed steps or a missing checkpoint: argparse's error, exit 2, no torchrun launched."""
    monkeypatch.setattr(sys, "argv", ["train_grid.py", *argv])
    monkeypatch.setattr(train_grid, "torchrun_result", lambda *a, **k: pytest.fail("a grid was launched"))
    with pytest.raises(SystemExit) as exc:
        train_grid.main()
    assert exc.value.code == 2 and match in capsys.readouterr().err


@pytest.mark.slow  # two torchrun launches (~40 s)
def test_one_rank_and_two_data_ranks_end_on_the_same_loss(monkeypatch, capsys):
    """The grids compared train the same model on the same rows: the table's last losses agree to float rounding."""
    monkeypatch.setattr(sys, "argv", ["train_grid.py", "--size", "tiny", "--grids", "1,1,1,1;2,1,1,1", "--steps", "1",
                                      "--seq", "32", "--batch", "2"])
    train_grid.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1,1,1,1") or
            line.startswith("| 2,1,1,1")]
    losses = [float(r.split("|")[6]) for r in rows]
    assert len(losses) == 2 and losses[1] == pytest.approx(losses[0], rel=1e-5)
