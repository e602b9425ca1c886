"""lm-eval on four grids of the launcher's 4 ranks, in one job: the requests of :func:`requests_for` (log-likelihood,
rolling log-likelihood, greedy generation) through :class:`memorization.evaluation.lm_eval_grid.GridLM` on the HF
checkpoint $MODEL_DIR, and the shipped goldfish_mc task through run_downstream on :data:`TASK_GRIDS`; rank 0 writes each
grid's results to $OUT_DIR/<grid>.json and downstream.json under $OUT_DIR/<grid>/.  $GRIDS (space-separated)
replaces both lists: every request type and the task on each of those grids."""
from __future__ import annotations

import json
import os

MAX_LENGTH = 32  # shorter than the longer requests: truncation and several rolling windows are exercised
GEN = {"until": ["."], "max_gen_toks": 6, "do_sample": False}
TASK_GRIDS = ("1,2,2,1", "2,2,1,1")  # a whole task through run_downstream: row x column, and data replicas


def requests_for(texts: list[str]) -> dict[str, list]:
    """lm-eval ``Instance``s of each request type from ``texts`` (long and short ones, an empty context)."""
    from lm_eval.api.instance import Instance

    def inst(kind: str, args: tuple, i: int) -> Instance:
        return Instance(request_type=kind, doc={}, arguments=args, idx=i)

    words = [t.split() for t in texts]
    ll = [inst("loglikelihood", (" ".join(w[:k]), " " + " ".join(w[k:k + m])), i)
          for i, (w, k, m) in enumerate((w, k, m) for w in words for k, m in ((3, 2), (25, 6)))]
    ll.append(inst("loglikelihood", ("", texts[0][:40]), len(ll)))
    rolling = [inst("loglikelihood_rolling", (t,), i) for i, t in enumerate(texts)]
    gen = [inst("generate_until", (" ".join(w[:n]), dict(GEN)), i) for i, (w, n) in
           enumerate((w, n) for w in words for n in (4, 11))]
    return {"loglikelihood": ll, "loglikelihood_rolling": rolling, "generate_until": gen}


def answers(lm, reqs: dict[str, list]) -> dict[str, list]:
    """The answers to ``reqs``, and ``own_greedy``: the log-likelihood of each generation after its context (its
    tokens are the greedy ones, so ``is_greedy`` should hold)."""
    from lm_eval.api.instance import Instance

    gen = lm.generate_until(reqs["generate_until"], disable_tqdm=True)
    own = [Instance(request_type="loglikelihood", doc={}, arguments=(r.args[0], g), idx=i)
           for i, (r, g) in enumerate(zip(reqs["generate_until"], gen)) if g.strip()]
    return {"loglikelihood": [list(r) for r in lm.loglikelihood(reqs["loglikelihood"], disable_tqdm=True)],
            "loglikelihood_rolling": lm.loglikelihood_rolling(reqs["loglikelihood_rolling"], disable_tqdm=True),
            "generate_until": gen,
            "own_greedy": [list(r) for r in lm.loglikelihood(own, disable_tqdm=True)]}


def assert_same_answers(got: dict, want: dict, what: str, rel: float = 1e-5, abs_: float = 1e-5) -> None:
    """``got`` (a grid's :func:`answers`, read back from JSON) equals ``want`` (one process's): log-likelihoods to
    ``rel``/``abs_`` with the same greedy flags, rolling log-likelihoods to ``rel``, the same generations."""
    import pytest

    for kind in ("loglikelihood", "own_greedy"):
        for (lp, greedy), (lp0, greedy0) in zip(got[kind], want[kind], strict=True):
            assert lp == pytest.approx(lp0, rel=rel, abs=abs_) and greedy == greedy0, (what, kind)
    assert got["loglikelihood_rolling"] == pytest.approx(want["loglikelihood_rolling"], rel=rel), what
    assert got["generate_until"] == want["generate_until"], what


if __name__ == "__main__":
    from memorization.evaluation.downstream import run_downstream
    from memorization.evaluation.eval_model import grid_runtime
    from memorization.lm import LM
    from memorization.evaluation.lm_eval_grid import GridLM

    texts = json.loads(os.environ["TEXTS"])
    out = os.environ["OUT_DIR"]
    grids = os.environ.get("GRIDS", "").split() or ["1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2"]
    for g in grids:
        rt = grid_runtime(g)
        got = answers(GridLM(LM.load(os.environ["MODEL_DIR"], grid=rt), batch_size=3, max_length=MAX_LENGTH),
                      requests_for(texts))
        if rt.is_main:
            with open(os.path.join(out, f"{g}.json"), "w") as f:
                json.dump(got, f)
        if g in (grids if "GRIDS" in os.environ else TASK_GRIDS):
            run_downstream(os.environ["MODEL_DIR"], tasks=["goldfish_mc"], include_defaults=False, limit=12,
                           batch_size=4, out_dir=os.path.join(out, g), grid=g)
