"""memorization/evaluation/extraction_eval.py: the extraction evaluation as a library call, eval/extract.py as its
shell."""
from __future__ import annotations

import dataclasses

import pytest

from memorization.evaluation import extraction_eval as xe
from tests.support import load_eval_cli


def test_every_flag_of_the_cli_is_a_field_of_the_config_and_reaches_it():
    """Each option of ``eval/extract.py`` (but the CLI's own --json, --no-progress and --plan's) is the config field
    of the same name, and a value given on the command line is the config's."""
    cli = load_eval_cli("extract")
    args = cli.parse_args(["--model", "m", "--manifest", "x.json", "--prefix", "7", "--top-k", "3", "--grid",
                           "1,2,1,1", "--no-progress"])
    plan = {"plan", "gpus", "machine"}
    assert set(vars(args)) - {"json", "no_progress"} - plan == {f.name for f in dataclasses.fields(xe.ExtractionEvalConfig)
                                                                } - {"progress"}
    cfg = cli.config_of(args)
    assert (cfg.model, cfg.manifest, cfg.prefix, cfg.top_k, cfg.grid, cfg.progress) == ("m", "x.json", 7, 3, "1,2,1,1",
                                                                                        False)


@pytest.mark.parametrize("changes, match", [
    ({"prefix": 0}, "--prefix and --suffix must be >= 1"),
    ({"batch_size": 0}, "--batch-size must be >= 1"),
    ({"prefix_mode": "all-but-suffix", "max_doc_tokens": 50}, "must exceed --suffix 50"),
    ({"documents": "d.txt"}, "exactly one of --manifest and --documents"),
])
def test_a_refused_setting_is_an_error_before_the_tokenizer_loads(tmp_path, monkeypatch, changes, match):
    """A setting out of range is one :class:`ExtractionEvalError` line, raised before any file but the model's
    config.json is read."""
    import transformers

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "m.json").write_text("{}")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: pytest.fail("loaded the tokenizer before checking settings"))
    cfg = xe.ExtractionEvalConfig(model=str(tmp_path), manifest=str(tmp_path / "m.json"))
    with pytest.raises(xe.ExtractionEvalError, match=match):
        xe.run_extraction(dataclasses.replace(cfg, **changes))
