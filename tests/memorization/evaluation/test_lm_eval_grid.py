"""lm-eval on a 4D grid (memorization/evaluation/lm_eval_grid.py): the parallel model as an lm-eval ``LM`` gives the
single-process ``HFLM``'s answers."""
from __future__ import annotations

import json
import sys

import pytest

from tests.support import WORKERS

sys.path.insert(0, str(WORKERS))

GRIDS = ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2")


@pytest.fixture(scope="module")
def grid_answers(grid_checkpoint, tmp_path_factory):
    """Every request type and the goldfish_mc task on the four grids (4 gloo ranks, fp32), and the texts."""
    pytest.importorskip("lm_eval")
    import launcher
    from transformers import AutoTokenizer

    root, _, docs, _ = grid_checkpoint
    tok = AutoTokenizer.from_pretrained(str(root / "model"))
    texts = [tok.decode(d["token_ids"][1:]) for d in docs]
    out = tmp_path_factory.mktemp("lm_eval_grid")
    codes, log = launcher.launch("lm_eval_grids.py", 4, timeout=400, extra_env={
        "MODEL_DIR": str(root / "model"), "TEXTS": json.dumps(texts), "OUT_DIR": str(out)})
    assert codes == [0, 0, 0, 0], log[-3000:]
    return out, texts


@pytest.mark.slow  # (~55 s on 2 cores, most of it the four grids' setup; extraction on the same grids stays default)
def test_every_request_type_on_four_grids_equals_hflm_in_one_process(grid_checkpoint, grid_answers):
    """Log-likelihoods (with truncation to the context and an empty context), rolling log-likelihoods (several
    windows per text) and greedy generations cut at stop sequences: to 1e-5, the same greedy flags and texts."""
    from lm_eval.models.huggingface import HFLM
    from lm_eval_grids import MAX_LENGTH, answers, assert_same_answers, requests_for

    from memorization.evaluation.eval_model import load_checkpoint

    root, _, _, _ = grid_checkpoint
    out, texts = grid_answers
    model, tok = load_checkpoint(root / "model", device="cpu", dtype="float32", require_tokenizer=True)
    reqs = requests_for(texts)
    want = answers(HFLM(pretrained=model, tokenizer=tok, batch_size=3, max_length=MAX_LENGTH, backend="causal"),
                   reqs)
    assert any(len(tok(a[0] + a[1]).input_ids) > MAX_LENGTH for a in (r.args for r in reqs["loglikelihood"]))
    assert len(set(want["generate_until"])) > 1
    assert sum(g for _, g in want["own_greedy"]) >= len(want["own_greedy"]) // 2 > 0  # greedy flags of both kinds
    for grid in GRIDS:
        assert_same_answers(json.loads((out / f"{grid}.json").read_text()), want, grid)


@pytest.mark.slow  # (shares the four grids' setup above)
def test_a_task_on_four_grids_scores_as_in_one_process(grid_checkpoint, grid_answers):
    """The shipped goldfish_mc task (12 questions x 4 choices) through run_downstream(grid=...) on two of the grids
    (every request type is compared on all four above): acc, acc_norm and their stderrs equal the single-process
    run's."""
    from lm_eval_grids import TASK_GRIDS

    from memorization.evaluation.downstream import run_downstream

    root, _, _, _ = grid_checkpoint
    out, _ = grid_answers
    want = run_downstream(root / "model", tasks=["goldfish_mc"], include_defaults=False, limit=12, batch_size=4,
                          device="cpu", dtype="float32")["lm_eval"]
    for grid in TASK_GRIDS:
        got = json.loads((out / grid / "downstream.json").read_text())
        assert got["grid"] == grid and not got["lm_eval"]["errors"]
        assert got["lm_eval"]["n_samples"] == want["n_samples"] == {"goldfish_mc": 12}
        assert got["lm_eval"]["results"]["goldfish_mc"] == pytest.approx(want["results"]["goldfish_mc"], rel=1e-6)
