"""The inference planner (:mod:`axonn.planner.inference`) and the eval CLIs' ``--plan``.

The weights and KV cache of the memory model are compared with what real ranks hold on 4 gloo ranks; the
ranking with what a grid of GPUs can do; the CLIs with their contract (a grid printed, nothing loaded)."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from axonn.planner import (GridShape, PlanError, format_inference_plan, inference_memory_per_gpu, load_profile,
                           plan_inference, smallest_inference_gpus)
from axonn.presets import ModelShape, get_preset
from tests.forked import run_python
from tests.support import REPO, WORKERS

GRIDS = ("1,2,2,1", "1,1,2,2", "2,2,1,1", "1,2,1,2", "4,1,1,1")


@pytest.fixture(scope="module")
def odd_checkpoint(tmp_path_factory):
    """A tiny Llama whose gate/up/down blocks on 1,1,2,2 have an odd element count (ffn 9 x hidden/2 15): the
    depth shards are zero-padded there."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("odd") / "model"
    LlamaForCausalLM(LlamaConfig(hidden_size=30, intermediate_size=9, num_hidden_layers=2, num_attention_heads=3,
                                 num_key_value_heads=3, vocab_size=512, max_position_embeddings=64,
                                 tie_word_embeddings=False)).save_pretrained(path)
    return path


def _shape(model_dir) -> ModelShape:
    from memorization.evaluation.eval_model import model_config_of

    return ModelShape.from_hf_config(model_config_of(model_dir), name=str(model_dir))


def test_weights_and_kv_cache_are_what_ranks_hold_on_four_grids(grid_checkpoint, odd_checkpoint, tmp_path):
    """On 4 gloo ranks, for 1,2,2,1 / 1,1,2,2 / 2,2,1,1 / 1,2,1,2 / 4,1,1,1 (HF's modules) and a depth-padded
    1,1,2,2: every rank's parameter bytes after loading as the eval CLIs load (fp32) equal ``weights``, and the
    KV cache the extractor's decoder holds after a batch equals ``kv_cache``, in fp32 and under bf16 autocast
    (fp32 keys, bf16 values), exactly."""
    sys.path.insert(0, str(WORKERS))
    import launcher

    root = grid_checkpoint[0]
    grids = [f"tiny:{g}" for g in GRIDS] + ["odd:1,1,2,2"]
    codes, log = launcher.launch("inference_memory.py", 4, timeout=240, extra_env={
        "MODELS": f"tiny={root / 'model'},odd={odd_checkpoint}", "GRIDS": ";".join(grids), "OUT_DIR": str(tmp_path)})
    assert codes == [0, 0, 0, 0], log[-3000:]
    shapes = {"tiny": _shape(root / "model"), "odd": _shape(odd_checkpoint)}
    per_rank = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for item in grids:
        name, grid = item.split(":")
        g = GridShape.parse(grid)
        shape = shapes[name]
        for r, got in enumerate(per_rank):
            m = got[name][grid]
            assert m["vocab"] == shape.vocab  # the planner reads the shape the loader builds
            b, ctx = m["batch"], m["cached_positions"]
            for dtype in ("fp32", "bf16"):
                mem = inference_memory_per_gpu(shape, g, b, ctx, generate=True, dtype=dtype)
                assert m["params"] == mem.weights, (item, r, dtype)
                assert m["kv"][dtype] == [mem.kv_cache], (item, r, dtype)
    odd = shapes["odd"]
    even_split = 4 * (odd.num_params() - (2 * odd.layers + 1) * odd.hidden) / 4 + 4 * (2 * odd.layers + 1) * odd.hidden
    assert per_rank[0]["odd"]["1,1,2,2"]["params"] > even_split  # the depth padding is there, and counted
    # data, column and depth replicate or split the sequences, never the cached heads: the same cache for row 2
    assert len({json.dumps(per_rank[0]["tiny"][g]["kv"]) for g in ("1,2,2,1", "2,2,1,1", "1,2,1,2")}) == 1


TRACE = """
import json
from axonn.planner import GridShape, inference_memory_per_gpu
from axonn.presets import get_preset
from memorization.training.memory_trace import trace_inference
rows = []
for size, grid, b, s, gen in (("tiny", (1, 1, 1, 1), 4, 256, True), ("tiny", (1, 2, 2, 1), 4, 256, True),
                              ("small", (1, 2, 1, 2), 2, 512, True), ("small", (1, 1, 2, 1), 2, 512, False),
                              ("1b", (1, 4, 1, 1), 4, 4096, True), ("1b", (1, 2, 1, 1), 2, 2048, False)):
    tr = trace_inference(size, grid, b, s, gen)
    mem = inference_memory_per_gpu(get_preset(size), GridShape(*grid), b, s, gen, "bf16" if gen else "fp32")
    rows.append([size, grid, gen, tr.params, tr.peak, mem.weights, mem.total])
print(json.dumps(rows))
"""


def test_the_rest_is_the_traced_peak_of_the_real_forward():
    """Rank 0's live tensor bytes in the real forwards, traced under fake tensors (generation: two batches of
    prefill and a decoding step under bf16 autocast; scoring: MIA's fp32 log-probabilities) on HF's modules and
    grids with row, column and depth: the planner's bytes beyond the weights are the traced ones, to 0.5 % for
    scoring and at most 10 % above for generation (the prefill counted at the full context beside the whole
    cache)."""

    res = run_python(["-c", TRACE], timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    for size, grid, gen, params, peak, weights, total in json.loads(res.stdout.strip().splitlines()[-1]):
        ratio = (total - weights) / (peak - params)
        assert params == weights, (size, grid)
        assert (0.995 <= ratio <= 1.10) if gen else abs(ratio - 1) <= 0.005, (size, grid, gen, ratio)


def test_a_model_that_fits_one_gpu_gets_every_gpu_as_a_replica():
    """The 8b at batch 4 fits one H100: 8 GPUs are 8 data replicas of one GPU each."""
    plan = plan_inference("8b", 8, "h100-node", batch=4, context=2048)
    assert plan.grid == GridShape(8, 1, 1, 1) and plan.replicas == 8 and plan.model_parallel == 1
    assert plan.smallest_gpus == 1 == smallest_inference_gpus("8b", "h100-node", 4, 2048)


def test_a_model_that_does_not_fit_gets_the_smallest_group_and_every_replica_the_gpus_allow():
    """The 70b (280 GB of fp32 weights) on 64 Frontier GCDs: one replica needs a model-parallel group of
    ``n`` GCDs (no fewer fit, checked by planning ``n - 1``), the plan runs ``64 / n`` replicas of it, and no
    grid with more data replicas fits."""
    n = smallest_inference_gpus("70b", "frontier", 32, 2048)
    assert n > 1
    with pytest.raises(PlanError) as e:
        plan_inference("70b", n - 1, "frontier", 32, 2048)
    assert e.value.kind == "memory" and e.value.smallest_gpus == n
    assert plan_inference("70b", n, "frontier", 32, 2048).replicas == 1
    plan = plan_inference("70b", 64, "frontier", 32, 2048)
    assert 64 % n == 0 and plan.replicas == 64 // n and plan.model_parallel == n
    assert plan.grid.depth == 1 and plan.grid.row * plan.grid.col <= 8  # within a Frontier node
    cap = load_profile("frontier").usable_memory_bytes
    assert all(r.kind != "memory" or r.memory_per_gpu_bytes > cap for r in plan.rejected)
    assert not any(e.grid.data > plan.replicas for e in plan.ranked)


def test_depth_is_chosen_only_when_row_and_column_cannot_shard():
    """A 39B model whose dimensions no row or column group divides (one head, hidden 8191 prime) is split over
    depth; the same model with divisible dimensions is split over row and column, never depth."""
    prime = ModelShape("prime", layers=40, hidden=8191, heads=1, kv_heads=1, ffn=28673, vocab=32003)
    plan = plan_inference(prime, 8, "h100-node", batch=1, context=128)
    assert plan.grid.row == plan.grid.col == 1 and plan.grid.depth > 1
    assert all(e.grid.depth > 1 or e.grid.data == 8 for e in plan.ranked) and plan.grid.data < 8
    even = replace(prime, name="even", hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000)
    plan = plan_inference(even, 8, "h100-node", batch=1, context=128)
    assert plan.grid.depth == 1 and plan.grid.data > 1
    assert any(e.grid.depth > 1 for e in plan.ranked)  # depth grids fit too; they rank after


def test_405b_on_8_h100s_names_the_smallest_gpu_count():
    with pytest.raises(PlanError) as e:
        plan_inference("405b", 8, "h100-node", batch=1, context=4096)
    n = e.value.smallest_gpus
    assert e.value.kind == "memory" and n == smallest_inference_gpus("405b", "h100-node", 1, 4096) > 8
    assert f"{n} GPUs" in str(e.value)
    assert plan_inference("405b", n, "h100-node", batch=1, context=4096).model_parallel == n


def test_scoring_keeps_the_vocabulary_sharded_and_a_batch_too_large_fits_nowhere():
    """Scoring takes its log-probs from the LM head's row shards (memorization.lm.logprobs.token_stats), so eight row
    ranks hold an eighth of the logits of one; with a batch whose sharded logits still exceed a GPU at the
    largest row group the model allows, no group fits and the error says so (``smallest_gpus`` None)."""
    shape = get_preset("8b")
    one, eight = (inference_memory_per_gpu(shape, GridShape(1, r, 1, 1), 8, 4096, generate=False, dtype="fp32")
                  for r in (1, 8))
    assert one.logits >= 4 * 8 * 4096 * shape.vocab
    assert 4 * 8 * 4096 * shape.vocab / 8 <= eight.logits < one.logits / 6
    with pytest.raises(PlanError) as e:
        plan_inference(shape, 8, "h100-node", batch=1024, context=4096, generate=False, dtype="fp32")
    assert e.value.kind == "memory" and e.value.smallest_gpus is None and "lower the batch" in str(e.value)


def test_a_reference_model_shares_the_grid():
    """MIA's reference model is held on the same grid: only grids that divide both count (the 1b's 4 KV heads
    allow row 4 at most, where the 8b alone would take 8), and both models' weights are held."""
    target, ref = get_preset("8b"), get_preset("1b")
    alone = plan_inference(target, 16, "h100-node", 8, 2048, generate=False, dtype="fp32")
    both = plan_inference(target, 16, "h100-node", 8, 2048, generate=False, dtype="fp32", reference=ref)
    assert any(e.grid.row == 8 for e in alone.ranked) and max(e.grid.row for e in both.ranked) == 4
    g = GridShape(2, 4, 1, 1)
    w = [inference_memory_per_gpu(sh, g, 8, 2048, False, "fp32").weights for sh in (target, ref)]
    assert inference_memory_per_gpu(target, g, 8, 2048, False, "fp32", reference=ref).weights == sum(w)


def test_format_lists_grids_and_the_smallest_group():
    text = format_inference_plan(plan_inference("70b", 16, "h100-node", batch=8, context=2048))
    assert "grid D,R,C,Z" in text and "2,8,1,1" in text and "smallest model-parallel group" in text


def test_bad_input_is_a_plan_error():
    for kw in ({"batch": 0}, {"context": 0}, {"dtype": "fp8"}):
        with pytest.raises(PlanError) as e:
            plan_inference("8b", 8, "h100-node", **{"batch": 1, "context": 16, **kw})
        assert e.value.kind == "input"
    with pytest.raises(PlanError) as e:
        plan_inference("8b", 8, "nowhere", 1, 16)
    assert e.value.kind == "machine"


def test_the_logit_chunk_is_the_scorers():
    from axonn.planner.inference import LOGIT_CHUNK_ELEMENTS
    from memorization.lm import logprobs

    assert LOGIT_CHUNK_ELEMENTS == logprobs.LOGIT_CHUNK_ELEMENTS


# --------------------------------------------------------------------------- the eval CLIs' --plan

def _no_loading(monkeypatch):
    """Every way the eval CLIs load weights fails."""
    import transformers

    import memorization.evaluation.eval_model as em
    import memorization.training.models as models

    def refuse(*a, **k):
        raise AssertionError("--plan loaded weights")

    for mod, name in ((em, "load_on_grid"), (em, "load_checkpoint"), (models, "build_model")):
        monkeypatch.setattr(mod, name, refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


def _run(cli: str, argv: list[str]) -> int:
    """The CLI's ``main``; its exit status (extract's main returns a dict, or raises SystemExit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"plan_{cli}", REPO / "eval" / f"{cli}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        ret = mod.main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return ret if isinstance(ret, int) else 0


def _argv(cli: str, model: Path, tmp_path: Path) -> list[str]:
    return {"extract": ["--model", str(model), "--documents", str(tmp_path / "docs.jsonl"), "--prefix-mode",
                        "all-but-suffix", "--batch-size", "4"],
            "mia": ["--model", str(model), "--manifest", str(tmp_path / "manifest.json"), "--max-length", "64"],
            "downstream": ["--model", str(model), "--perplexity", str(tmp_path / "held_out.jsonl")]}[cli]


def _checkpoint(tmp_path: Path, model_dir: Path) -> Path:
    """An axonn training checkpoint directory as model_config_of reads it (COMPLETE, meta.json's hf_config;
    the weight files are not needed to plan)."""
    from transformers import AutoConfig

    from axonn.checkpoint import FORMAT

    step = tmp_path / "checkpoint" / "step_00000010"
    step.mkdir(parents=True)
    (step / "meta.json").write_text(json.dumps({"format": FORMAT,
                                                "hf_config": AutoConfig.from_pretrained(model_dir).to_dict()}))
    (step / "COMPLETE").write_text("")
    (step.parent / "LATEST").write_text(step.name)
    return step.parent


@pytest.mark.parametrize("cli", ["extract", "mia", "downstream"])
def test_plan_prints_a_grid_without_loading_weights(cli, grid_checkpoint, tmp_path, monkeypatch, capsys):
    """``--plan --gpus 4 --machine frontier`` prints the plan and the srun command for its best grid, exit 0,
    with every weight loader failing; the same from an axonn training checkpoint directory."""
    _no_loading(monkeypatch)
    model = grid_checkpoint[0] / "model"
    shape = _shape(model)
    context, generate = {"extract": (128, True), "mia": (64, False), "downstream": (128, False)}[cli]
    batch = {"extract": 4, "mia": 8, "downstream": 8}[cli]
    want = plan_inference(shape, 4, "frontier", batch, context, generate, "bf16" if generate else "fp32").grid
    checkpoint = _checkpoint(tmp_path, model)
    for source in (model, checkpoint):
        argv = _argv(cli, source, tmp_path) + ["--plan", "--gpus", "4", "--machine", "frontier"]
        assert _run(cli, argv) == 0
        out = capsys.readouterr().out
        assert "grid D,R,C,Z" in out and f"{batch} × {context} tokens" in out
        cmd = out.strip().splitlines()[-1].strip()
        assert cmd.startswith(f"srun -n 4 python eval/{cli}.py --model {source}") and cmd.endswith(f"--grid {want}")
        assert "--plan" not in cmd and "--gpus" not in cmd and "--machine" not in cmd


@pytest.mark.parametrize("cli", ["extract", "mia", "downstream"])
@pytest.mark.parametrize("flags", [["--plan"], ["--plan", "--gpus", "0"],
                                   ["--plan", "--gpus", "4", "--machine", "nope"]])
def test_plan_refuses_bad_gpus_and_machine(cli, flags, grid_checkpoint, tmp_path, monkeypatch, capsys):
    """A missing --gpus, --gpus 0 or an unknown --machine: one ``error:`` line on stderr, exit 2, nothing read."""
    _no_loading(monkeypatch)
    import memorization.evaluation.eval_model as em

    monkeypatch.setattr(em, "model_config_of", lambda *a, **k: pytest.fail("read the config before the checks"))
    assert _run(cli, _argv(cli, grid_checkpoint[0] / "model", tmp_path) + flags) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
