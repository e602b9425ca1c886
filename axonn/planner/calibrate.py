"""Measure a machine profile: GEMM rate, memory bandwidth and collective bandwidth/latency.

    python -m axonn.planner calibrate --out profile.yaml                      # one process
    torchrun --nproc-per-node 8 -m axonn.planner calibrate --out p.yaml        # one node
    srun -N 2 --ntasks-per-node 8 python -m axonn.planner calibrate --out p.yaml
    mpiexec -n 4 python -m axonn.planner calibrate --out p.yaml

GEMMs run in bf16 on CUDA/ROCm and fp32 on CPU. ``measured_tflops`` is the rate of an
``m = n = k = --ref-dim`` GEMM; ``gemm_half_dim`` is fitted to smaller GEMMs with the cost model's
curve ``rate(d)/rate(ref) = f(d)³/f(ref)³``, ``f(d) = d/(d + d_half)``.

Collectives (only with world size > 1; the world is started the trainer's way, ``axonn.init``:
torchrun variables, else mpi4py under mpiexec/srun): the ring "bus bandwidth" of all-reduce
(``2(p−1)/p·bytes / t``) and all-gather (``(p−1)/p·bytes / t``) inside a node gives
``intra_node_gbps``; across nodes, all ranks with the same local rank all-reduce at once, so
``g`` rings share each node's NICs and ``inter_node_gbps = g · busbw``. Latencies are the times of
small (4 KiB) all-reduces divided by ``2·⌈log₂ p⌉``. Figures that cannot be measured (e.g. the
network in a single process) are copied from ``--base`` (a profile name or path), except the at-scale terms
below, which describe one network and are reset to neutral unless measured.

``--sweep`` measures what the at-scale terms need (world size > 1):

* a message-size sweep of all-reduce bus bandwidth, inside a node and across nodes, from 64 KiB up to
  ``--comm-mbytes``; ``S½`` (``*_half_bw_mbytes``) is the median over the sizes below 95 % of the largest
  one's bandwidth ``B`` of ``S·(B/b(S) − 1)``, the solution of ``b = B·S/(S + S½)`` at each size;
* ``collective_launch_us``: the time of a one-element all-reduce on a one-rank group (a call with no
  network hop: launch, proxy and bookkeeping only);
* concurrent streams across nodes: the cross-node bus bandwidth of one ring at a time (local rank 0 of each
  node) next to all local ranks' rings at once (the profile's ``inter_node_gbps``), both in the raw output;
* with ``--group-nodes N`` (nodes per full-bisection domain: dragonfly group, fat-tree pod; needs ≥ 2N nodes
  in the job), the cross-node bandwidth of rings that stay inside each domain and of rings whose every hop
  leaves it, all at once; ``global_taper`` is their ratio (at most 1) and ``nodes_per_group = N``.
"""
from __future__ import annotations

import argparse
import math
import os
import socket
import sys
import time
from dataclasses import replace
from typing import Callable

from ..cli import HelpFormatter
from .profiles import GIB, SCALE_TERMS_NEUTRAL, MachineProfile, load_profile, save_profile


def _timeit(fn: Callable[[], object], sync: Callable[[], None], min_time: float = 0.2, max_iters: int = 50,
            agree: Callable[[int], int] | None = None) -> float:
    """Warm up, then average over as many iterations as fit ``min_time`` (at most ``max_iters``).

    ``agree`` makes all ranks of a collective use the same iteration count (else they deadlock).
    """
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    iters = max(1, min(max_iters, int(min_time / one)))
    if agree is not None:
        iters = agree(iters)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def measure_gemm(device: str, dims: list[int], dtype_name: str) -> dict[int, float]:
    """FLOP/s of square ``d × d × d`` GEMMs for each ``d`` in ``dims``."""
    import torch
    dtype = getattr(torch, dtype_name)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out = {}
    for d in dims:
        a = torch.randn(d, d, device=device, dtype=dtype)
        b = torch.randn(d, d, device=device, dtype=dtype)
        t = _timeit(lambda: a @ b, sync)
        out[d] = 2.0 * d**3 / t
        del a, b
    return out


#: GEMMs faster than this are launch-bound; the efficiency curve is fitted to the slower ones only
MIN_FIT_SECONDS = 30e-6


def fit_half_dim(rates: dict[int, float], ref_dim: int) -> float:
    """Least-squares ``d_half`` of ``rate(d)/rate(ref) = (f(d)/f(ref))³`` over a log grid.

    ``rates`` may carry ``"overhead_s"``, the per-call time of a tiny GEMM (launch + Python), which is
    subtracted first; sizes under :data:`MIN_FIT_SECONDS` or 3× that overhead are left out: their
    rate measures launch overhead, which the cost model does not describe with this curve.
    """
    overhead = rates.pop("overhead_s", 0.0)
    fit = {}
    for d, r in rates.items():
        t = 2.0 * d**3 / r
        if d == ref_dim or (t >= MIN_FIT_SECONDS and t > 3 * overhead):
            fit[d] = 2.0 * d**3 / max(t - overhead, 1e-9) if d != ref_dim else r
    rates = fit
    ref = rates[ref_dim]
    best, best_err = 128.0, math.inf
    for i in range(200):
        half = 4.0 * (1.04 ** i)
        f = lambda d: d / (d + half)  # noqa: E731
        err = sum((math.log(min(rates[d] / ref, 1.0)) - 3 * math.log(f(d) / f(ref_dim))) ** 2
                  for d in rates if d != ref_dim)
        if err < best_err:
            best, best_err = half, err
    return best


def measure_hbm(device: str) -> float:
    """Bytes/s of a large device-to-device copy (read + write)."""
    import torch
    n = (256 if device.startswith("cuda") else 64) * 1024 * 1024
    x = torch.empty(n, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t = _timeit(lambda: y.copy_(x), sync)
    return 2.0 * n / t


def measure_collectives(device: str, nbytes: int) -> dict[str, float]:
    """Collective figures across the launched ranks (see module docstring)."""
    import torch
    import torch.distributed as dist
    world, rank = dist.get_world_size(), dist.get_rank()
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    nodes = sorted(set(hosts), key=hosts.index)
    by_node = [[r for r in range(world) if hosts[r] == h] for h in nodes]
    local = min(len(x) for x in by_node)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    n = nbytes // esize

    def bus(group, ranks: int) -> tuple[float, float, float]:
        def agree(iters: int) -> int:
            t = torch.tensor([iters], dtype=torch.int64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
            return int(t.item())

        x = torch.ones(n, dtype=dtype, device=device)
        t_ar = _timeit(lambda: dist.all_reduce(x, group=group), sync, agree=agree)
        shard = torch.ones(n // ranks, dtype=dtype, device=device)
        full = torch.empty(shard.numel() * ranks, dtype=dtype, device=device)
        t_ag = _timeit(lambda: dist.all_gather_into_tensor(full, shard, group=group), sync, agree=agree)
        small = torch.ones(1024, dtype=dtype, device=device)
        t_small = _timeit(lambda: dist.all_reduce(small, group=group), sync, max_iters=200, agree=agree)
        p = ranks
        ar_bw = 2 * (p - 1) / p * n * esize / t_ar
        ag_bw = (p - 1) / p * full.numel() * esize / t_ag
        lat = t_small / (2 * max(1, math.ceil(math.log2(p))))
        return ar_bw, ag_bw, lat

    out: dict[str, float] = {"nodes": len(nodes), "gpus_per_node": local}
    node_groups = [dist.new_group(r) for r in by_node]
    my_node = nodes.index(hosts[rank])
    if local > 1:
        ar, ag, lat = bus(node_groups[my_node], local)
        out.update(intra_allreduce_gbps=ar / 1e9, intra_allgather_gbps=ag / 1e9, intra_latency_us=lat * 1e6)
    if len(nodes) > 1:
        cross = [dist.new_group([by_node[k][i] for k in range(len(nodes))]) for i in range(local)]
        my_local = by_node[my_node].index(rank) if rank in by_node[my_node][:local] else None
        if my_local is not None:
            ar, ag, lat = bus(cross[my_local], len(nodes))
            out.update(inter_node_gbps=local * min(ar, ag) / 1e9, inter_latency_us=lat * 1e6)
    dist.barrier()
    return out


def fit_half_bytes(busbw: dict[int, float]) -> float:
    """``S½`` of ``b(S) = B·S/(S + S½)`` from bus bandwidths ``{buffer bytes: bytes/s}`` (``B`` = the
    largest buffer's): the median of ``S·(B/b(S) − 1)`` over the sizes below 95 % of ``B`` (0 when none)."""
    if not busbw:
        return 0.0
    big = busbw[max(busbw)]
    est = sorted(size * (big / b - 1.0) for size, b in busbw.items() if 0 < b < 0.95 * big)
    return est[len(est) // 2] if est else 0.0


def measure_sweep(device: str, max_bytes: int, group_nodes: int | None = None) -> dict[str, float]:
    """The at-scale terms' measurements (see module docstring); every rank must call it."""
    import torch
    import torch.distributed as dist
    world, rank = dist.get_world_size(), dist.get_rank()
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    nodes = sorted(set(hosts), key=hosts.index)
    by_node = [[r for r in range(world) if hosts[r] == h] for h in nodes]
    local = min(len(x) for x in by_node)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()

    def agree(group):
        def f(iters: int) -> int:
            t = torch.tensor([iters], dtype=torch.int64, device=device)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
            return int(t.item())
        return f

    def busbw(group, p: int, nbytes: int) -> float:
        x = torch.ones(max(1, nbytes // esize), dtype=dtype, device=device)
        t = _timeit(lambda: dist.all_reduce(x, group=group), sync, agree=agree(group))
        return 2 * (p - 1) / p * x.numel() * esize / t

    sizes = []
    size = 64 * 1024
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    sizes.append(max_bytes)
    out: dict[str, float] = {}
    solo = dist.new_group([rank], use_local_synchronization=True)  # only its member creates it
    one = torch.ones(1, dtype=dtype, device=device)
    out["collective_launch_us"] = _timeit(lambda: dist.all_reduce(one, group=solo), sync, max_iters=200) * 1e6
    node_groups = [dist.new_group(r) for r in by_node]
    me = nodes.index(hosts[rank])
    if local > 1:
        curve = {n: busbw(node_groups[me], local, n) for n in sizes}
        out["intra_node_half_bw_mbytes"] = fit_half_bytes(curve) / 1e6
        out.update({f"intra_busbw_gbps_{n >> 10}KiB": b / 1e9 for n, b in curve.items()})
    if len(nodes) > 1:
        my_local = by_node[me].index(rank) if rank in by_node[me][:local] else None
        cross = [dist.new_group([by_node[k][i] for k in range(len(nodes))]) for i in range(local)]
        if my_local is not None:
            curve = {n: busbw(cross[my_local], len(nodes), n) for n in sizes}
            out["inter_node_half_bw_mbytes"] = fit_half_bytes(curve) / 1e6
            out["inter_concurrent_gbps"] = local * curve[max_bytes] / 1e9
        dist.barrier()
        if my_local == 0:  # one ring at a time: local rank 0 of every node, the others wait
            out["inter_single_stream_gbps"] = busbw(cross[0], len(nodes), max_bytes) / 1e9
        dist.barrier()
        n = group_nodes or 0
        if n and len(nodes) >= 2 * n:
            k = len(nodes) // n  # k domains of n nodes; rings of local rank i inside a domain, or across all
            inside = [dist.new_group([by_node[d * n + j][i] for j in range(n)]) for i in range(local) for d in range(k)]
            across = [dist.new_group([by_node[d * n + j][i] for d in range(k)]) for i in range(local) for j in range(n)]
            if my_local is not None and me < k * n:
                d, j = divmod(me, n)
                b_in = busbw(inside[my_local * k + d], n, max_bytes)
                b_out = busbw(across[my_local * n + j], k, max_bytes)
                out["taper_inside_gbps"], out["taper_across_gbps"] = b_in / 1e9, b_out / 1e9
                out["global_taper"] = min(1.0, b_out / b_in)
                out["nodes_per_group"] = float(n)
    dist.barrier()
    return out


def _union_keys(keys: list[str]) -> list[str]:
    """The union of every rank's ``keys``, sorted (all ranks then reduce the same vector)."""
    import torch.distributed as dist
    every: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, keys)
    return sorted({k for ks in every for k in ks})


def _agree_min(values: dict, device: str) -> dict:
    """Element-wise minimum of ``values`` over all ranks (the slowest rank sets the pace of a step).

    Every rank must end with the same profile: otherwise ranks rank grids differently and pick
    different process-group layouts, and the job deadlocks.
    """
    import torch
    import torch.distributed as dist
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return values
    keys = sorted(values, key=str)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64,
                     device=device if device.startswith("cuda") else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return {k: type(values[k])(v) for k, v in zip(keys, t.tolist())}


def calibrate(base: str = "h100-node", ref_dim: int | None = None, comm_mbytes: int = 256,
              name: str | None = None, sweep: bool = False,
              group_nodes: int | None = None) -> tuple[MachineProfile, dict[str, float]]:
    """Measure this machine and return ``(profile, raw measurements)`` (profile based on ``base``).

    With several ranks, every rank measures its GEMMs and copies at the same time (after a
    barrier), as during training: ranks that share a node's power, memory bandwidth or — on a
    CPU — cores see the rate they will get. On a CPU, ``memory_gib`` is the host memory divided
    by the ranks on the node. Reuses an initialised ``torch.distributed`` (e.g. ``axonn.init``). The at-scale
    terms are neutral in the result unless ``sweep`` measures them (``group_nodes``: nodes per
    full-bisection domain, for the taper).
    """
    import torch
    import torch.distributed as dist

    from axonn.grid import init as axonn_init, launcher_world_size, local_device_index
    world = launcher_world_size()
    if world > 1 and not dist.is_initialized():
        axonn_init(G_data=world)  # the trainer's launch path: torchrun / mpiexec / srun, GPU bound per rank
    cuda = torch.cuda.is_available()
    if cuda and world == 1:
        torch.cuda.set_device(local_device_index(0, torch.cuda.device_count()))
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    dtype = "bfloat16" if cuda else "float32"
    if world > 1:
        dist.barrier()
    ref_dim = ref_dim or (8192 if cuda else 1024)
    dims = sorted({d for d in (ref_dim // 16, ref_dim // 8, ref_dim // 4, 3 * ref_dim // 8, ref_dim // 2,
                               3 * ref_dim // 4, ref_dim) if d >= 32})
    rates = measure_gemm(device, dims, dtype)
    rate32 = measure_gemm(device, [32], dtype)[32]
    hbm = measure_hbm(device)
    agreed = _agree_min({**rates, "rate32": rate32, "hbm": hbm}, device)
    hbm, rate32 = agreed.pop("hbm"), agreed.pop("rate32")
    rates = {int(d): r for d, r in agreed.items()}
    raw: dict[str, float] = {f"gemm_tflops_{d}": r / 1e12 for d, r in rates.items()}
    overhead = 2.0 * 32**3 / rate32
    raw["gemm_call_overhead_us"] = overhead * 1e6
    raw["hbm_gbps"] = hbm / 1e9
    prof = load_profile(base)
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        mem_gib, gpu, per_node = props.total_memory / GIB, props.name, torch.cuda.device_count()
    else:
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
        gpu, per_node = f"CPU ({os.cpu_count()} cores, fp32)", 1
    measured = rates[ref_dim] / 1e12
    updates = dict(SCALE_TERMS_NEUTRAL)  # the base's network terms describe another machine
    updates.update(name=name or f"calibrated-{socket.gethostname()}", gpu=gpu, memory_gib=round(mem_gib, 2),
                   measured_tflops=float(f"{measured:.4g}"), peak_tflops=float(f"{max(prof.peak_tflops, measured):.4g}"),
                   gemm_ref_dim=ref_dim, gemm_half_dim=round(fit_half_dim({**rates, "overhead_s": overhead}, ref_dim), 1),
                   hbm_gbps=round(hbm / 1e9, 1), gpus_per_node=per_node,
                   description=f"measured on {socket.gethostname()} ({world} rank(s)); unmeasured "
                               f"figures from profile {prof.name}")
    if not cuda:  # no vendor peak for a CPU: use the best rate seen
        updates["peak_tflops"] = float(f"{max(rates.values()) / 1e12:.4g}")
    if world > 1:
        coll = measure_collectives(device, comm_mbytes * 1024 * 1024)
        lat = {k: -v for k, v in coll.items() if k.endswith("latency_us")}  # max latency = min of negatives
        coll = _agree_min({k: v for k, v in coll.items() if k not in lat}, device) | {
            k: -v for k, v in _agree_min(lat, device).items()}
        raw.update(coll)
        updates["gpus_per_node"] = int(coll["gpus_per_node"])
        if not cuda:  # CPU ranks on a node share its memory
            updates["memory_gib"] = round(mem_gib / updates["gpus_per_node"], 2)
        if "intra_allreduce_gbps" in coll:
            updates["intra_node_gbps"] = round(min(coll["intra_allreduce_gbps"], coll["intra_allgather_gbps"]), 2)
            updates["intra_node_latency_us"] = round(coll["intra_latency_us"], 2)
        if "inter_node_gbps" in coll:
            updates["inter_node_gbps"] = round(coll["inter_node_gbps"], 2)
            updates["inter_node_latency_us"] = round(coll["inter_latency_us"], 2)
        if sweep:
            sw = measure_sweep(device, comm_mbytes * 1024 * 1024, group_nodes)
            # a rank outside a measured ring lacks some keys: every rank reduces the same vector, and the
            # minimum over the ranks that measured a figure is the agreed one
            sw = _agree_min({k: sw.get(k, math.inf) for k in _union_keys(sorted(sw))}, device)
            sw = {k: v for k, v in sw.items() if v != math.inf}
            raw.update(sw)
            for k in ("intra_node_half_bw_mbytes", "inter_node_half_bw_mbytes", "collective_launch_us"):
                if k in sw:
                    updates[k] = round(sw[k], 3)
            if "global_taper" in sw:
                updates["global_taper"] = round(sw["global_taper"], 4)
                updates["nodes_per_group"] = int(sw["nodes_per_group"])
    return replace(prof, **updates), raw


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m axonn.planner calibrate", formatter_class=HelpFormatter,
                                description="Measure GEMM rate, memory bandwidth and collective bandwidth "
                                            "on this machine and write a machine-profile YAML.")
    p.add_argument("--out", required=True, help="profile YAML to write")
    p.add_argument("--base", default="h100-node",
                   help="profile to copy unmeasured figures from (name or path; default h100-node)")
    p.add_argument("--name", default=None, help="profile name (default calibrated-<host>)")
    p.add_argument("--ref-dim", type=int, default=None, help="GEMM size of measured_tflops (8192 GPU, 1024 CPU)")
    p.add_argument("--comm-mbytes", type=int, default=256, help="collective message size in MiB (the sweep's largest)")
    p.add_argument("--sweep", action="store_true",
                   help="also measure the at-scale terms: bus bandwidth vs message size inside and across nodes "
                        "(*_half_bw_mbytes), the per-collective launch cost, one vs all concurrent cross-node rings")
    p.add_argument("--group-nodes", type=int, default=None,
                   help="with --sweep: nodes per full-bisection domain (dragonfly group, fat-tree pod); with at "
                        "least twice as many nodes in the job, measures global_taper across domains")
    args = p.parse_args(argv)
    prof, raw = calibrate(args.base, args.ref_dim, args.comm_mbytes, args.name, sweep=args.sweep,
                          group_nodes=args.group_nodes)
    from ..grid import launcher_rank

    if launcher_rank() == 0:  # the process group's rank while it exists; torchrun's, MPI's or Slurm's
        header = "Written by `python -m axonn.planner calibrate`. Raw measurements:\n" + "\n".join(
            f"  {k}: {v:.4g}" for k, v in raw.items())
        save_profile(prof, args.out, header=header)
        for k, v in raw.items():
            print(f"{k:>24}: {v:.4g}")
        print(f"wrote {args.out}")
    try:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - best effort cleanup
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
