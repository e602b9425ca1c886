"""Per-rank communication volume of the 3D tensor-parallel matmul: measured vs analytic.

Run on CPU with gloo, e.g.::

    torchrun --nproc_per_node 8 benchmarks/collectives.py --grid 1,2,2,2
    mpiexec -n 4 python benchmarks/collectives.py --grid 1,2,1,2

``--grid data,row,col,depth``.  One forward + backward of a small LlamaForCausalLM
runs under :func:`axonn.communication.count_bytes`; every collective issued by
each ``axonn.intra_layer.Linear`` is attributed to (layer, collective, axis) and
compared with the per-rank volumes of REFERENCES.md ("The 3D tensor-parallel
matmul"), for ``W`` of shape ``n × k`` (out × in) and ``m`` tokens per
data-parallel replica (``m/Gz`` per rank), non-transposed layer:

* forward  all-gather W over depth:     (Gz-1)/Gz · nk/(GrGc)
* forward  all-reduce Y over col:       2(Gc-1)/Gc · mn/(GzGr)
* backward all-gather W over depth:     (Gz-1)/Gz · nk/(GrGc)
* backward all-reduce dX over row:      2(Gr-1)/Gr · mk/(GzGc)
* backward reduce-scatter dW over depth:(Gz-1)/Gz · nk/(GrGc)

(row and col swap for ``transpose=True``).  Exits non-zero if any differs.
Collectives outside the Linear layers (block entry/exit re-layouts, embedding,
loss, gradient sync) are listed separately without an analytic column.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch
import torch.distributed as dist


def analytic(layer, m_local: int) -> dict[tuple[str, str], float]:
    """Per-rank element volumes of one Linear for ``m_local`` tokens on this rank."""
    g = layer.grid
    gz, gout, gin = g.size("depth"), g.size(layer.out_axis), g.size(layer.in_axis)
    n, k = layer.out_features, layer.in_features
    vol: dict[tuple[str, str], float] = defaultdict(float)
    if gz > 1:
        w = (gz - 1) / gz * layer.weight_spec.padded_len  # = nk/(GrGc) up to depth padding
        vol[("all_gather", "depth")] += 2 * w              # forward gather + backward re-gather
        vol[("reduce_scatter", "depth")] += w
    if gin > 1:
        vol[("all_reduce", layer.in_axis)] += 2 * (gin - 1) / gin * m_local * n / gout
    if gout > 1:
        vol[("all_reduce", layer.out_axis)] += 2 * (gout - 1) / gout * m_local * k / gin
    return vol


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="1,1,1,1", help="data,row,col,depth")
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=32, help="tokens per sequence of the probe batch")
    ap.add_argument("--hidden", type=int, default=64,
                    help="hidden size of the probe Llama (divisible by every grid axis)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the probe Llama")
    args = ap.parse_args()
    import axonn
    from axonn.communication import count_bytes
    from axonn.intra_layer import Linear
    from transformers import LlamaConfig, LlamaForCausalLM

    d, r, c, z = (int(v) for v in args.grid.split(","))
    grid = axonn.init(G_data=d, G_intra_r=r, G_intra_c=c, G_intra_d=z)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
                      tie_word_embeddings=False)
    model = axonn.parallelize(LlamaForCausalLM(cfg))
    x = torch.randint(0, 256, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
    xs = axonn.batch_slice(x)
    with count_bytes() as counter:
        loss = model(input_ids=xs, labels=xs).loss
        loss.backward()
        axonn.sync_gradients(model)
    m_local = xs.numel()
    linears = {mod.axonn_name: mod for mod in model.modules() if isinstance(mod, Linear)}
    measured: dict[tuple[str, str, str], float] = defaultdict(float)
    fallback = False
    for tag, op, axes, elems, nbytes, fb in counter.records:
        measured[(tag if tag in linears else "(other)", op, axes)] += nbytes
        fallback |= fb
    esize = next(model.parameters()).element_size()
    rows, ok = [], True
    for name, layer in linears.items():
        exp = {(name, op, ax): v * esize for (op, ax), v in analytic(layer, m_local).items()}
        for key in sorted(set(exp) | {k for k in measured if k[0] == name}):
            a, b = measured.get(key, 0.0), exp.get(key, 0.0)
            good = abs(a - b) <= 1e-6 * max(b, 1.0)
            ok &= good
            rows.append((*key, a, b, "ok" if good else "MISMATCH"))
    for key in sorted(k for k in measured if k[0] == "(other)"):
        rows.append((*key, measured[key], float("nan"), "-"))
    if grid.rank == 0:
        print(f"grid {grid.sizes}, {m_local} tokens/rank, fp32; bytes moved by rank 0 per collective"
              + (" (gloo reduce-scatter fallback moves 2x the logical volume)" if fallback else ""))
        w = max(len(r[0]) for r in rows) if rows else 10
        print(f"{'layer':<{w}}  {'collective':<15}{'axis':<12}{'measured':>14}{'analytic':>14}  check")
        for name, op, ax, a, b, chk in rows:
            print(f"{name:<{w}}  {op:<15}{ax:<12}{a:>14.1f}{b:>14.1f}  {chk}")
        tot = sum(r[3] for r in rows)
        print(f"total {tot:.0f} bytes; linear layers {'MATCH' if ok else 'DO NOT MATCH'} the analytic volumes")
    flag = torch.tensor([0 if ok else 1])
    dist.all_reduce(flag)
    dist.destroy_process_group()
    return int(flag.item() != 0)


if __name__ == "__main__":
    sys.exit(main())
