"""recipes/configs/paper/: the paper's experiment matrix as config files that load, validate up to the data
the user supplies, differ only in the model, and say what their README says they do."""
from __future__ import annotations

from dataclasses import replace

import pytest

from memorization.experiment.config import load_config, resolve, to_dict
from tests.support import REPO

PAPER = REPO / "recipes" / "configs" / "paper"
SIZES = ("8b", "70b", "405b")


def _load(size: str):
    return resolve(load_config(PAPER / f"llama3.1-{size}.yaml"))


@pytest.mark.parametrize("size", SIZES)
def test_each_size_fine_tunes_its_llama_checkpoint_with_the_fine_tuning_rule(size):
    from memorization.experiment.config import FINE_TUNE_LR, FINE_TUNE_WEIGHT_DECAY, fine_tune_warmup

    cfg = _load(size)
    assert cfg.model.size == size and cfg.model.init.endswith(f"Llama-3.1-{size.upper()}")
    t = cfg.training
    assert (t.lr, t.weight_decay, t.warmup_steps) == (FINE_TUNE_LR, FINE_TUNE_WEIGHT_DECAY, fine_tune_warmup(t.steps))
    assert (cfg.goldfish.k, cfg.goldfish.h, cfg.goldfish.strategy, cfg.goldfish.arms) == (4, 13, "hash", "both")


def test_the_sizes_differ_only_in_the_model_and_where_they_write():
    from memorization.experiment.config import Model, Output

    def rest(size: str) -> dict:
        return to_dict(replace(_load(size), model=Model(), output=Output()))

    assert rest("70b") == rest("8b") and rest("405b") == rest("8b")
    assert len({_load(s).output.out for s in SIZES}) == 3


def test_the_token_budget_and_exposures_are_the_readmes():
    """262,144 tokens a step, 524M in all; 4 groups of 250 targets seen 0, 1, 4, 16 times: 5,250 target rows,
    2.1% of the stream (recipes/configs/paper/README.md)."""
    from memorization.experiment.data import parse_exposures

    cfg = _load("8b")
    per_step = cfg.training.batch_size * cfg.data.seq_len
    assert per_step == 262_144 and per_step * cfg.training.steps == 524_288_000
    exposures = parse_exposures(cfg.data.exposures)
    per_group = cfg.data.num_targets // len(exposures)
    rows = per_group * sum(exposures)
    assert (exposures, per_group, rows) == ((0, 1, 4, 16), 250, 5_250)
    assert f"{rows / (cfg.training.batch_size * cfg.training.steps):.1%}" == "2.1%"
    readme = (PAPER / "README.md").read_text()
    assert "262,144 tokens per step" in readme and "524M tokens" in readme and "5,250 target rows" in readme


def test_validation_names_the_checkpoint_a_user_must_supply(tmp_path):
    """The shipped paths are placeholders: a machine without them is told which one is missing, before any
    work."""
    from memorization.experiment.config import ConfigError
    from memorization.experiment.validate import validate

    with pytest.raises(ConfigError, match=r"--init /models/Llama-3.1-8B: no Hugging Face checkpoint"):
        validate(_load("8b"))
