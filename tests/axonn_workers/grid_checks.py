"""For each grid given on the command line (data,row,col,depth), check parallel == serial.

Checks per grid: forward logits, loss, every gathered parameter gradient (embedding,
norms, q/k/v/o with biases, MLP, lm_head; and a model whose head is tied to its embedding) after sync_gradients; clip_grad_norm_ (2 and inf);
a Linear-with-bias stack (auto_parallelize + explicit transposed pair); N training steps
with AdamW + clipping following the serial loss curve; overlap on == overlap off; bf16
autocast; gradients reduced in bf16.
"""
from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import axonn  # noqa: E402
from common import (assert_close, assert_matches_serial, assert_same_greedy, batch, mean_over_batch_ranks,  # noqa: E402
                    run_main, tiny_llama)


def check_llama(grid, bias: bool, tied: bool = False) -> None:
    kw = dict(attention_bias=bias, mlp_bias=bias, tie_word_embeddings=tied)
    ref = tiny_llama(0, **kw)
    assert ref.lm_head.weight is ref.model.embed_tokens.weight or not tied
    par = axonn.parallelize(copy.deepcopy(ref))
    assert axonn.is_tied(par) == tied, "parallelize kept the head and embedding tied (or untied) as given"
    x, y = batch(0)
    out_ref = ref(input_ids=x, labels=y)
    out_ref.loss.backward()
    out = par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y))
    out.loss.backward()
    # small buckets: many all-reduces, some gradients larger than a bucket (the default is used below)
    axonn.sync_gradients(par, bucket_elements=3000)
    assert_matches_serial(par, ref, x, out.loss, out_ref)
    for nt in (2.0, float("inf")):
        tot_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9, norm_type=nt)  # 1e9: no clipping
        tot = axonn.clip_grad_norm_(par.parameters(), 1e9, norm_type=nt)
        assert_close(tot, tot_ref, f"clip_grad_norm_ total ({nt})")
    # generate (greedy) picks the serial tokens (up to near-ties: the logits agree to fp32 rounding only)
    prompt = x[:1, :4]
    if grid.size(("data", "depth")) == 1:
        assert_same_greedy(par, ref, prompt, "generate", attention_mask=torch.ones_like(prompt), max_new_tokens=4)


def check_linear_stack(grid) -> None:
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    torch.manual_seed(1)
    with axonn.auto_parallelize():
        par = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    assert isinstance(par[0], axonn.intra_layer.Linear)
    # explicit expert-mode pair: non-transposed (input sharded over col) then transposed
    l1 = axonn.intra_layer.Linear(16, 32, expert_mode=True)
    l2 = axonn.intra_layer.Linear(32, 8, transpose=True, expert_mode=True)
    l1.load_full(ref[0].weight.data, ref[0].bias.data)
    l2.load_full(ref[2].weight.data, ref[2].bias.data)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 3, 16, generator=g)
    yr = ref(x)
    (yr ** 2).mean().backward()
    xs = axonn.batch_slice(x)
    yp = par(xs)
    (yp ** 2).mean().backward()
    h = l1(axonn.intra_layer.drop(xs, "col", grid))
    ye = axonn.intra_layer.gather(l2(torch.nn.functional.gelu(h)), "col", grid)
    (ye ** 2).mean().backward()
    assert_close(yp, axonn.batch_slice(yr), "linear stack output")
    assert_close(ye, axonn.batch_slice(yr), "expert pair output")
    axonn.sync_gradients(par)
    axonn.sync_gradients(torch.nn.ModuleList([l1, l2]))
    fp = axonn.full_grad_dict(par)
    for i, (a, b) in enumerate(((par[0], l1), (par[2], l2))):
        ri = 0 if i == 0 else 2
        for pn in ("weight", "bias"):
            assert_close(fp[f"{ri}.{pn}"], getattr(ref[ri], pn).grad, f"linear {ri}.{pn} grad")
        eg = axonn.full_grad_dict(b)
        for pn in ("weight", "bias"):
            assert_close(eg[pn], getattr(ref[ri], pn).grad, f"expert {ri}.{pn} grad")


def train(model, steps: int, parallel: bool) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for s in range(steps):
        x, y = batch(s % 2)  # two alternating batches: the model memorises them
        if parallel:
            x, y = axonn.batch_slice(x), axonn.batch_slice(y)
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        if parallel:
            axonn.sync_gradients(model)
            axonn.clip_grad_norm_(model.parameters(), 1.0)
            losses.append(float(mean_over_batch_ranks(loss)))
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            losses.append(float(loss))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses


def check_training(grid, steps: int, tied: bool = False) -> None:
    ref = tiny_llama(0, attention_bias=True, tie_word_embeddings=tied)
    serial = train(copy.deepcopy(ref), steps, parallel=False)
    off = train(axonn.parallelize(copy.deepcopy(ref)), steps, parallel=True)
    from axonn.intra_layer.overlap import STATS

    before = dict(STATS)
    with axonn.optimize_communication(overlap_all_reduce=True, overlap_reduce_scatter=True,
                                      overlap_all_gather=True):
        on = train(axonn.parallelize(copy.deepcopy(ref)), steps, parallel=True)
    if grid.size("depth") > 1:  # the overlapped paths were really taken
        assert STATS["prefetch_hits"] > before["prefetch_hits"], STATS
        assert STATS["async_reduce_scatters"] > before["async_reduce_scatters"], STATS
    assert off == on, f"overlap changed the losses:\n{off}\n{on}"
    for i, (a, b) in enumerate(zip(off, serial)):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {i}: parallel loss {a} vs serial {b}"
    assert steps < 10 or serial[-1] < serial[0] - 0.5, "training did not reduce the loss"


def check_checkpointing(grid) -> None:
    """Activation checkpointing (layer inputs sharded over row x col when R·C > 1) gives the serial grads."""
    from axonn.recompute import _SlicedRecompute

    ref = tiny_llama(0)
    ref.train()
    x, y = batch(0)
    ref(input_ids=x, labels=y).loss.backward()
    par = axonn.parallelize(copy.deepcopy(ref))
    for p in par.parameters():
        p.grad = None
    axonn.enable_activation_checkpointing(par)
    calls = []
    orig = _SlicedRecompute.backward
    _SlicedRecompute.backward = staticmethod(lambda ctx, dy: calls.append(1) or orig(ctx, dy))
    try:
        out = par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y))
        out.loss.backward()
    finally:
        _SlicedRecompute.backward = staticmethod(orig)
    sharded = grid.size(("row", "col")) > 1
    assert len(calls) == (par.config.num_hidden_layers if sharded else 0), (len(calls), grid)
    axonn.sync_gradients(par)
    grads = axonn.full_grad_dict(par)
    for n, p in ref.named_parameters():
        assert_close(grads[n], p.grad, f"checkpointed grad {n}")
    # with every overlap on: the same gradients bit for bit; the recomputed forwards gather for
    # themselves and no prefetched weight is dropped or left behind
    from axonn.intra_layer import Linear
    from axonn.intra_layer.overlap import PENDING_GRADS, STATS

    for p in par.parameters():
        p.grad = None
    before = dict(STATS)
    with axonn.optimize_communication(overlap_all_reduce=True, overlap_reduce_scatter=True,
                                      overlap_all_gather=True):
        par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y)).loss.backward()
        axonn.sync_gradients(par)
    assert not PENDING_GRADS
    again = axonn.full_grad_dict(par)
    for n in grads:
        assert torch.equal(again[n], grads[n]), f"overlap changed the checkpointed grad {n}"
    linears = [m for m in par.modules() if isinstance(m, Linear)]
    assert all(m._prefetch is None for m in linears), "a prefetched weight was left behind"
    if grid.size("depth") > 1:
        layers = par.config.num_hidden_layers
        assert STATS["recompute_gathers"] - before["recompute_gathers"] == 7 * layers, STATS
        # forward: every Linear but the first is prefetched; backward: every one but lm_head
        assert STATS["prefetch_hits"] - before["prefetch_hits"] == 2 * (len(linears) - 1), STATS


def check_autocast(grid) -> None:
    """Under bf16 autocast (the trainer's GPU recipe, here on the CPU) the depth all-gathers move
    bf16 weights (prefetched ones too) and the gradients still match the serial model's."""
    from axonn.communication import count_bytes
    from axonn.intra_layer.overlap import STATS

    ref = tiny_llama(0)
    par = axonn.parallelize(copy.deepcopy(ref))
    x, y = batch(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_ref = ref(input_ids=x, labels=y).loss
    loss_ref.backward()
    hits = STATS["prefetch_hits"]
    with axonn.optimize_communication(overlap_all_reduce=True, overlap_reduce_scatter=True,
                                      overlap_all_gather=True), count_bytes() as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y)).loss
        loss.backward()
    axonn.sync_gradients(par)
    assert_close(mean_over_batch_ranks(loss), loss_ref, "autocast loss", tol=2e-2)
    grads = axonn.full_grad_dict(par)
    for n, p in ref.named_parameters():
        assert_close(grads[n], p.grad, f"autocast grad {n}", tol=AUTOCAST_GRAD_TOL)
    if grid.size("depth") > 1:
        assert STATS["prefetch_hits"] > hits, "no prefetched all-gather was used under autocast"
        for tag, op, axes, elems, nbytes, _ in counter.records:
            if op == "all_gather" and axes == "depth":
                want = 4 if tag == "model.embed_tokens" else 2  # the embedding's output stays fp32
                assert nbytes == want * elems, f"{tag}: all-gathered {nbytes / elems} B per element, not {want}"


AUTOCAST_GRAD_TOL = 5e-2
BF16_REDUCE_TOL = 2e-2  # bf16 rounding of each rank's contribution and of the sum (8-bit mantissa)


def check_bf16_grad_reduce(grid) -> None:
    """``grad_reduce_dtype=bf16``: every gradient reduce-scatter (depth) and all-reduce (data,
    data x depth) moves 2 B per element, the gradients stay fp32 and match the serial model's to
    bf16 rounding, and where nothing is reduced (D = Z = 1) they are bit-identical to fp32's."""
    from axonn.communication import count_bytes
    from axonn.intra_layer.overlap import CONFIG, PENDING_GRADS

    ref = tiny_llama(0)
    par = axonn.parallelize(copy.deepcopy(ref))
    x, y = batch(0)
    ref(input_ids=x, labels=y).loss.backward()
    runs = {}
    for wire in (None, torch.bfloat16):
        for p in par.parameters():
            p.grad = None
        with axonn.optimize_communication(overlap_all_reduce=True, overlap_reduce_scatter=True,
                                          overlap_all_gather=True, grad_reduce_dtype=wire), count_bytes() as counter:
            par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y)).loss.backward()
            axonn.sync_gradients(par)
        assert not PENDING_GRADS and CONFIG.grad_reduce_dtype is None
        runs[wire] = (axonn.full_grad_dict(par), counter)
    grads, counter = runs[torch.bfloat16]
    for n, p in ref.named_parameters():
        assert grads[n].dtype == torch.float32, f"{n}: gradient kept in {grads[n].dtype}"
        assert_close(grads[n], p.grad, f"bf16-reduced grad {n}", tol=BF16_REDUCE_TOL)
    reductions = _grad_reductions(counter)
    for tag, op, axes, elems, nbytes, _ in reductions:
        assert nbytes == 2 * elems, f"{tag or 'sync_gradients'}: {op} over {axes} moved {nbytes / elems} B per element"
    if grid.size(("data", "depth")) > 1:
        fp32 = _grad_reductions(runs[None][1])
        assert reductions and [r[3] for r in reductions] == [r[3] for r in fp32], "not the same reductions"
        assert 2 * sum(r[4] for r in reductions) == sum(r[4] for r in fp32), "not half the fp32 bytes"
    else:
        for n in grads:
            assert torch.equal(grads[n], runs[None][0][n]), f"{n}: rounded to bf16 with nothing to reduce"


def _grad_reductions(counter) -> list[tuple]:
    """The gradient reductions a counter saw: depth reduce-scatters and data (x depth) all-reduces."""
    return [r for r in counter.records
            if (r[1] == "reduce_scatter" and r[2] == "depth") or (r[1] == "all_reduce" and "data" in r[2])]


def main() -> None:
    steps = int(os.environ.get("AXONN_TEST_STEPS", "10"))  # 10: the descent check still runs
    for spec in sys.argv[1:]:
        d, r, c, z = (int(v) for v in spec.split(","))
        grid = axonn.init(G_data=d, G_intra_r=r, G_intra_c=c, G_intra_d=z)
        check_llama(grid, bias=False)
        check_llama(grid, bias=True)
        check_llama(grid, bias=False, tied=True)
        check_linear_stack(grid)
        check_checkpointing(grid)
        check_autocast(grid)
        check_bf16_grad_reduce(grid)
        check_training(grid, steps)
        check_training(grid, steps, tied=True)
        dist.barrier()
        if grid.rank == 0:
            print(f"OK grid data={d} row={r} col={c} depth={z}", flush=True)


if __name__ == "__main__":
    run_main(main)
