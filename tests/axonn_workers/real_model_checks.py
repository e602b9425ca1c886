"""The real pretrained SmolLM2-135M (tied embeddings, 9/3 heads, 30 layers, 49k vocabulary) on grids.

    real_model_checks.py MODEL_DIR STATE_DIR GRID [GRID ...] [--save | --resume]

For each grid: ``build_model(init=MODEL_DIR)`` on the grid (every rank reads only its rows) gives the loss of
``from_pretrained``'s model within 1e-5 relative, fp32, and every gradient as accurately as that serial fp32
model computes it: its error against the same model in fp64 is at most ``SLACK`` times the serial fp32 model's
own on that tensor or, where that is smaller, on the median tensor (the rounding level at this depth: one
tensor's serial error can be lucky, e.g. 3.5e-6 where the median is 7.9e-6 and the largest 1.1e-4), and at
least ``FLOOR``.  30 layers deep, fp32 rounding alone puts the first layers' gradients ~1e-5 from the fp64 ones,
and a parallel computation sums in another order, so a fixed tolerance would test the rounding; a wrong shard,
a missing reduction or an untied embedding is off by orders of magnitude more.  ``--save`` (first grid): two AdamW
steps, a sharded checkpoint in STATE_DIR/ckpt and the losses of two more steps in STATE_DIR/losses.json;
``--resume`` (first grid): that checkpoint loaded onto this grid continues with the same two losses.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import axonn  # noqa: E402
import axonn.checkpoint as ckpt  # noqa: E402
from common import assert_close, mean_over_batch_ranks, rel_err, run_main, train_step  # noqa: E402

from memorization.training.models import build_model  # noqa: E402
from memorization.training.runtime import Runtime  # noqa: E402


def batch(step: int, b: int = 6, t: int = 24, vocab: int = 49152) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(77 + step)
    x = torch.randint(3, vocab, (b, t), generator=g)
    y = x.clone()
    y[:, 5::4] = -100  # Goldfish-style dropped labels, the same count in every row
    return x, y


SLACK, FLOOR = 4.0, 1e-6


def fp64_gradients(model_dir: str, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of the batch's loss computed in fp64 (rank 0 only: the same on every rank).  The loss is
    taken from the fp64 logits here: HF's ``ForCausalLMLoss`` casts logits to float32 whatever their dtype, which
    would put the float32 softmax's rounding (~4e-6 relative at this model's logits, ~35) into the reference,
    the same rounding the serial fp32 model makes -- flattering it and blaming any other exact computation."""
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    if dist.get_rank() != 0:
        return {}
    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="sdpa")
    logits = m(input_ids=x).logits
    shifted = F.pad(y, (0, 1), value=-100)[..., 1:]  # HF's shift: position t predicts label t + 1
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), shifted.reshape(-1), ignore_index=-100).backward()
    return {n: p.grad for n, p in m.named_parameters()}


def check_grid(spec: str, model_dir: str, ref, ref_out, x, exact: dict, serial: dict
               ) -> tuple[Runtime, torch.nn.Module]:
    d, r, c, z = (int(v) for v in spec.split(","))
    rt = Runtime(axonn.init(G_data=d, G_intra_r=r, G_intra_c=c, G_intra_d=z))
    par = build_model(None, ref.config.vocab_size, init=model_dir, runtime=rt)
    assert axonn.is_tied(par), "the tied model was untied"
    _, y = batch(0)
    out = par(input_ids=axonn.batch_slice(x), labels=axonn.batch_slice(y))
    out.loss.backward()
    axonn.sync_gradients(par)
    assert_close(mean_over_batch_ranks(out.loss), ref_out.loss, f"{spec} loss")
    grads = axonn.full_grad_dict(par)
    assert set(grads) == {n for n, _ in ref.named_parameters()}, set(grads) ^ {n for n, _ in ref.named_parameters()}
    worst = ""
    if dist.get_rank() == 0:  # the full gradients are on every rank; the fp64 ones on rank 0
        level = max(statistics.median(serial.values()), FLOOR)
        ratios = {}
        for n in serial:
            parallel = rel_err(grads[n], exact[n])
            ratios[n] = parallel / max(serial[n], level)
            assert ratios[n] <= SLACK, (f"{spec} grad {n}: {parallel:.2e} from fp64, the serial fp32 model's "
                                        f"{serial[n]:.2e} (median tensor {level:.2e}; x{SLACK:g} allowed)")
        n = max(ratios, key=ratios.get)
        worst = f" (worst gradient {n}: {ratios[n]:.2f}x the serial fp32 model's error, or the median tensor's)"
    if rt.grid.rank == 0:
        print(f"OK real model grid {spec}{worst}", flush=True)
    return rt, par


def steps(model, opt, first: int, n: int) -> list[float]:
    return [train_step(model, opt, *batch(s)) for s in range(first, first + n)]


def main() -> None:
    model_dir, state = sys.argv[1], Path(sys.argv[2])
    grids = [a for a in sys.argv[3:] if not a.startswith("--")]
    from transformers import AutoModelForCausalLM

    world = axonn.init(G_data=int(os.environ["WORLD_SIZE"]))  # each grid below is built over the world
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    x, y = batch(0)
    ref_out = ref(input_ids=x, labels=y)
    ref_out.loss.backward()
    exact = fp64_gradients(model_dir, x, y)
    # the serial fp32 model's error per tensor (rank 0, where the fp64 gradients are): the same for every grid
    serial = {n: rel_err(p.grad, exact[n]) for n, p in ref.named_parameters()} if exact else {}
    for i, spec in enumerate(grids):
        rt, par = check_grid(spec, model_dir, ref, ref_out, x, exact, serial)
        if i == 0 and ("--save" in sys.argv or "--resume" in sys.argv):
            par.zero_grad(set_to_none=True)
            opt = torch.optim.AdamW(par.parameters(), lr=1e-4, weight_decay=0.1)
            if "--save" in sys.argv:
                steps(par, opt, 1, 2)
                ckpt.save(par, opt, state / "ckpt", extra_state={"step": 2})
                cont = steps(par, opt, 3, 2)
                if rt.grid.rank == 0:
                    (state / "losses.json").write_text(json.dumps(cont))
            else:
                ckpt.load(par, opt, state / "ckpt")
                resumed = steps(par, opt, 3, 2)
                want = json.loads((state / "losses.json").read_text())
                for a, b in zip(resumed, want):
                    assert abs(a - b) <= 1e-5 * abs(b), f"resumed on {spec}: {resumed} vs {want}"
                if rt.grid.rank == 0:
                    print(f"OK resumed on {spec}: {resumed}", flush=True)
        del par
        dist.barrier()
        rt.grid.destroy()
    world.destroy()


if __name__ == "__main__":
    run_main(main)
