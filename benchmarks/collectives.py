"""Per-rank communication volume of the 3D tensor-parallel matmul: measured vs analytic.

Run on CPU with gloo, e.g.::

    torchrun --nproc_per_node 8 benchmarks/collectives.py --grid 1,2,2,2
    mpiexec -n 4 python benchmarks/collectives.py --grid 1,2,1,2

``--grid data,row,col,depth``.  One forward + backward of a small LlamaForCausalLM
runs under :func:`axonn.communication.count_bytes`; every collective issued by
each ``axonn.intra_layer.Linear`` is attributed to (layer, collective, axis) and
compared with the per-rank volumes of the 3D tensor-parallel matmul (Singh et al., AxoNN, arXiv:2502.08145),
for ``W`` of shape ``n × k`` (out × in) and ``m`` tokens per
data-parallel replica (``m/Gz`` per rank), non-transposed layer:

* forward  all-gather W over depth:     (Gz-1)/Gz · nk/(GrGc)
* forward  all-reduce Y over col:       2(Gc-1)/Gc · mn/(GzGr)
* backward all-gather W over depth:     (Gz-1)/Gz · nk/(GrGc)
* backward all-reduce dX over row:      2(Gr-1)/Gr · mk/(GzGc)
* backward reduce-scatter dW over depth:(Gz-1)/Gz · nk/(GrGc)

(row and col swap for ``transpose=True``), and for the ``V × h`` embedding (vocabulary over
row × col, each chunk flattened over depth):

* forward  all-gather the chunk over depth:       (Gz-1)/Gz · Vh/(GrGc)
* forward  all-reduce the output over row × col:  2(GrGc-1)/(GrGc) · mh/Gz
* backward reduce-scatter its gradient over depth:(Gz-1)/Gz · Vh/(GrGc)

Bytes per element: 4 in fp32.  With ``--autocast`` (bf16 autocast, as the trainer runs on a
GPU) the Linear weights are all-gathered and the Linear activations all-reduced in bf16 (2 B);
weight gradients are reduce-scattered in fp32 and the embedding stays fp32.  With
``--grad-reduce-dtype bf16`` (the trainer's option) every weight gradient, the embedding's too,
is reduce-scattered in bf16 (2 B).  Exits non-zero if any differs.  Other collectives (block entry/exit re-layouts, loss, gradient sync) are listed
separately without an analytic column.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch
import torch.distributed as dist


def analytic(layer, m_local: int, low: int, grad: int = 4) -> dict[tuple[str, str], float]:
    """Per-rank byte volumes of one Linear or Embedding for ``m_local`` tokens on this rank.

    ``low``: bytes per element of what autocast runs in low precision (2 for bf16, else 4);
    ``grad``: bytes per element of the weight gradients' reduce-scatter (4 fp32, 2 bf16).
    """
    from axonn.intra_layer import Embedding

    g = layer.grid
    gz = g.size("depth")
    vol: dict[tuple[str, str], float] = defaultdict(float)
    w = (gz - 1) / gz * layer.weight_spec.padded_len  # = nk/(GrGc) up to depth padding
    if isinstance(layer, Embedding):
        t = g.size(("row", "col"))
        if gz > 1:
            vol[("all_gather", "depth")] += 4 * w
            vol[("reduce_scatter", "depth")] += grad * w
        if t > 1:
            vol[("all_reduce", "row+col")] += 4 * 2 * (t - 1) / t * m_local * layer.embedding_dim
        return vol
    gout, gin = g.size(layer.out_axis), g.size(layer.in_axis)
    n, k = layer.out_features, layer.in_features
    if gz > 1:
        vol[("all_gather", "depth")] += low * 2 * w              # forward gather + backward re-gather
        vol[("reduce_scatter", "depth")] += grad * w
    if gin > 1:
        vol[("all_reduce", layer.in_axis)] += low * 2 * (gin - 1) / gin * m_local * n / gout
    if gout > 1:
        vol[("all_reduce", layer.out_axis)] += low * 2 * (gout - 1) / gout * m_local * k / gin
    return vol


def main() -> int:
    from axonn.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--grid", default="1,1,1,1", help="data,row,col,depth")
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence of the probe batch")
    ap.add_argument("--hidden", type=int, default=64,
                    help="hidden size of the probe Llama (divisible by every grid axis)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the probe Llama")
    ap.add_argument("--autocast", action="store_true",
                    help="run the forward under bf16 autocast (on the CPU here), as the trainer does on a GPU")
    ap.add_argument("--grad-reduce-dtype", default="fp32", choices=["fp32", "bf16"],
                    help="dtype the weight gradients are reduced in (the trainer's --grad-reduce-dtype)")
    args = ap.parse_args()
    import axonn
    from axonn.communication import count_bytes
    from axonn.grid_shape import GridShape
    from axonn.intra_layer import Embedding, Linear
    from transformers import LlamaConfig, LlamaForCausalLM

    try:
        shape = GridShape.parse(args.grid)
    except ValueError as e:
        ap.error(f"--grid: {e}")
    grid = axonn.init(shape)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = axonn.parallelize(LlamaForCausalLM(cfg).to(grid.device))  # NCCL takes GPU tensors only
    x = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    xs = axonn.batch_slice(x).to(grid.device)
    wire = torch.bfloat16 if args.grad_reduce_dtype == "bf16" else None
    with count_bytes() as counter, axonn.optimize_communication(grad_reduce_dtype=wire):
        with torch.autocast(grid.device.type, dtype=torch.bfloat16, enabled=args.autocast):
            loss = model(input_ids=xs, labels=xs).loss
        loss.backward()
        axonn.sync_gradients(model)
    m_local = xs.numel()
    linears = {mod.axonn_name: mod for mod in model.modules() if isinstance(mod, (Linear, Embedding))}
    measured: dict[tuple[str, str, str], float] = defaultdict(float)
    fallback = False
    for tag, op, axes, elems, nbytes, fb in counter.records:
        measured[(tag if tag in linears else "(other)", op, axes)] += nbytes
        fallback |= fb
    low = 2 if args.autocast else 4
    rows, ok = [], True
    for name, layer in linears.items():
        exp = {(name, op, ax): v for (op, ax), v in analytic(layer, m_local, low, 2 if wire else 4).items()}
        for key in sorted(set(exp) | {k for k in measured if k[0] == name}):
            a, b = measured.get(key, 0.0), exp.get(key, 0.0)
            good = abs(a - b) <= 1e-6 * max(b, 1.0)
            ok &= good
            rows.append((*key, a, b, "ok" if good else "MISMATCH"))
    for key in sorted(k for k in measured if k[0] == "(other)"):
        rows.append((*key, measured[key], float("nan"), "-"))
    if grid.rank == 0:
        print(f"grid {grid.sizes}, {m_local} tokens/rank, {'bf16 autocast' if args.autocast else 'fp32'}, "
              f"gradients reduced in {args.grad_reduce_dtype}; "
              "bytes moved by rank 0 per collective"
              + (" (gloo reduce-scatter fallback moves 2x the logical volume)" if fallback else ""))
        w = max(len(r[0]) for r in rows) if rows else 10
        print(f"{'layer':<{w}}  {'collective':<15}{'axis':<12}{'measured':>14}{'analytic':>14}  check")
        for name, op, ax, a, b, chk in rows:
            print(f"{name:<{w}}  {op:<15}{ax:<12}{a:>14.1f}{b:>14.1f}  {chk}")
        tot = sum(r[3] for r in rows)
        print(f"total {tot:.0f} bytes; linear and embedding layers {'MATCH' if ok else 'DO NOT MATCH'} "
              "the analytic volumes")
    flag = torch.tensor([0 if ok else 1], device=grid.device)
    dist.all_reduce(flag)
    dist.destroy_process_group()
    return int(flag.item() != 0)


if __name__ == "__main__":
    sys.exit(main())
