#!/usr/bin/env python
"""Training throughput: our trainer (axonn grid 1x1x1x1, Goldfish k=4, chunked CE, fused AdamW,
torch.compile, SDPA) against plain Hugging Face training, in the same run. Three HF baselines:
fp32 weights with bf16 autocast (our trainer's numerics), the model cast to bf16 (fewer bytes per
step, so faster on a GPU), and that bf16 model under ``torch.compile`` (``bf16-compile``: what a user
gets from one line of HF + PyTorch); the 1.5x target is against the faster eager baseline, and the
compiled one is printed beside it.

    python benchmarks/train_throughput.py                        # GPU: 1b preset, 4 x 2048 tokens, bf16
    python benchmarks/train_throughput.py --size tiny --seq 128 --batch 8 --steps 5   # CPU smoke run
    python benchmarks/train_throughput.py --which ours --profile 3 --trace ours.json  # where the time goes
    python benchmarks/train_throughput.py --which attention   # ours with causal_sdpa vs with HF's compiled mask
    python benchmarks/train_throughput.py --fp8 rowwise --hf-weights bf16-compile   # + ours with FP8 Linears
    python benchmarks/train_throughput.py --size 8b --layers 8 --which ours          # the 8b's layers, fewer of them
    python benchmarks/train_throughput.py --init "$(python data/models/get.py smollm2-135m)" --seq 128 --batch 4 \
        --steps 10 --warmup 1 --hf-weights fp32 --hf-adamw fused,for-loop --no-compile --interleave
                  # CPU: the real pretrained model, fp32, one process, HF with either AdamW, timed in turns

``--init DIR`` trains a pretrained HF checkpoint on both sides instead of a preset (its own config and vocabulary,
tied embeddings tied; ``from_pretrained``'s weights for HF, ``build_model(init=DIR)`` for ours).

MFU = tokens/s x (6 N + 12 L h s) / peak, N = parameters that do matmuls (all but the input
embedding), peak = 989 TFLOP/s (H100 SXM dense bf16) unless --peak-tflops says otherwise.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from axonn.presets import get_preset  # noqa: E402
from benchmarks.common import H100_BF16_PEAK, device, flops_per_token, stream_context, sync, timed  # noqa: E402
from memorization.training.goldfish import GoldfishConfig  # noqa: E402
from memorization.training.models import build_model, model_config  # noqa: E402
from memorization.training.train import TrainConfig, Trainer  # noqa: E402

VOCAB = 32000  # both sides build their model with this vocabulary, whatever the preset's own


def is_checkpoint(size: str) -> bool:
    """``size`` names a HF checkpoint directory (``--init``), not a preset."""
    return (Path(size) / "config.json").is_file()


def bench_shape(size: str, layers: int | None = None):
    """The preset's shape with the vocabulary the benchmark's models really have (:data:`VOCAB`) and ``layers``
    layers if given (the preset's otherwise); a checkpoint's own shape for a checkpoint directory.

    The MFU's 6 N counts the output head (vocab x hidden): with the preset's vocabulary instead, the
    tiny/mini presets (4096) would under-count and the Llama 3.1 ones (128256) over-count it (8b: +5%).
    """
    from memorization.training.models import padded_vocab

    if is_checkpoint(size):
        from axonn.presets import ModelShape

        shape = ModelShape.from_hf_config(model_config(None, 0, init=size), name=Path(size).name)
        return dataclasses.replace(shape, layers=layers) if layers else shape
    shape = dataclasses.replace(get_preset(size), vocab=padded_vocab(VOCAB))
    return dataclasses.replace(shape, layers=layers) if layers else shape


def bench_model(size: str, layers: int | None = None) -> torch.nn.Module:
    """The preset's HF model with :data:`VOCAB` and ``layers`` layers if given, seed 0 (both sides build this), or
    the checkpoint directory ``size``'s model (its first ``layers`` layers if given)."""
    init = size if is_checkpoint(size) else None
    config = model_config(None, 0, init=init) if init else model_config(size, VOCAB)
    if layers:
        config.num_hidden_layers = layers
    return build_model(None if init else size, config.vocab_size, init=init, seed=0, config=config)


HF_WEIGHTS = ("fp32", "bf16", "bf16-compile")


HF_ADAMW = ("fused", "for-loop")


def hf_label(weights: str, dev: torch.device, adamw: str = "fused") -> str:
    """The name a HF baseline is printed under (autocast runs on CUDA only)."""
    opt = "" if adamw == "fused" else f", {adamw} AdamW"
    if weights == "bf16-compile":
        return f"HF + torch.compile (bf16 weights{opt})"
    if weights == "bf16":
        return f"HF eager (bf16 weights{opt})"
    return f"HF eager (fp32 weights + bf16 autocast{opt})" if dev.type == "cuda" else f"HF eager (fp32{opt})"


def hf_trainer(size: str, rows: torch.Tensor, batch: int, dev: torch.device, weights: str = "fp32",
               layers: int | None = None, adamw: str = "fused"):
    """Plain HF training, ``(step, model)``: SDPA, ``model(input_ids, labels).loss``, clip, AdamW.

    ``adamw="fused"``: torch's fused AdamW, which HF's ``Trainer`` uses by default (``adamw_torch_fused`` on
    torch >= 2.8, on a CPU too); ``"for-loop"``: ``torch.optim.AdamW``'s default on a CPU, what a hand-written
    loop gets there.

    ``weights="fp32"``: fp32 weights and AdamW state, bf16 autocast on CUDA (the same numerics as our
    trainer). ``weights="bf16"``: the model cast to bf16 and trained without autocast, AdamW state in bf16
    too: fewer bytes per step, the usual "plain HF in bf16" and the stronger baseline on a GPU.
    A plain HF run of this shape measured elsewhere (47.7k tok/s, 37% MFU, 24 GiB at 4 x 2048) fits this one: fp32
    weights, gradients and AdamW state alone would take 17.6 GB before any activation.
    ``weights="bf16-compile"``: the bf16 model with ``model.compile()`` (its forward compiled by
    ``torch.compile``, default mode; backward through AOTAutograd), the optimizer step left eager.
    """
    if weights not in HF_WEIGHTS:
        raise ValueError(f"HF weights must be one of {', '.join(HF_WEIGHTS)}, got {weights!r}")
    dtype = torch.float32 if weights == "fp32" else torch.bfloat16
    model = bench_model(size, layers).to(dev, dtype=dtype)
    if weights == "bf16-compile":
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=adamw == "fused", foreach=False)
    autocast = dev.type == "cuda" and weights == "fp32"
    it = iter(range(10**9))

    def step() -> None:
        i = next(it) % (len(rows) // batch)
        x = rows[i * batch : (i + 1) * batch].to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, model


def hf_eager(size: str, rows: torch.Tensor, batch: int, steps: int, warmup: int, dev: torch.device,
             weights: str = "fp32", layers: int | None = None, adamw: str = "fused") -> float:
    """Seconds per step of :func:`hf_trainer`."""
    step, model = hf_trainer(size, rows, batch, dev, weights, layers, adamw)
    s = timed(step, steps, warmup, dev)
    del step, model
    return s


def ours_trainer(size: str, rows: torch.Tensor, batch: int, dev: torch.device, compile: bool, ac: bool, tmp: str,
                 attention: str = "causal_sdpa", fp8: str = "", layers: int | None = None):
    """``(step, trainer)``: our trainer writing to ``tmp``; ``attention="sdpa"`` puts back HF's own mask path (under
    compile: a materialised mask); ``fp8``: its Linears but the head in FP8 with that torchao recipe
    (``TrainConfig.fp8``)."""
    docs = torch.zeros_like(rows, dtype=torch.int32)
    cfg = TrainConfig(batch_size=batch, lr=1e-4, checkpoint_every=0, progress=False, compile=compile,
                      activation_checkpointing=ac, goldfish=GoldfishConfig(k=4, h=13), fp8=fp8)
    t = Trainer(bench_model(size, layers), rows, docs, rows[:batch], cfg, tmp, run_name="ours",
                row_context=stream_context(rows))
    t.total_steps = len(rows) // batch
    if attention != t.model.config._attn_implementation:
        t.model.set_attn_implementation(attention)  # before the first step, so compilation sees it

    def step() -> None:
        if t.step >= t.total_steps:
            t.step = 0
        t.train_step()

    return step, t


def ours(size: str, rows: torch.Tensor, batch: int, steps: int, warmup: int, dev: torch.device, compile: bool,
         ac: bool, profile_steps: int = 0, trace: str | None = None, attention: str = "causal_sdpa",
         fp8: str = "", layers: int | None = None) -> float:
    """Seconds per step of :func:`ours_trainer`."""
    with tempfile.TemporaryDirectory() as tmp:
        step, t = ours_trainer(size, rows, batch, dev, compile, ac, tmp, attention, fp8, layers)
        s = timed(step, steps, warmup, dev)
        if profile_steps:
            profile(step, profile_steps, dev, trace)
        del step, t
    return s


def interleaved(steps: dict[str, Callable[[], None]], n: int, warmup: int, dev: torch.device) -> dict[str, float]:
    """Median seconds per step of each of ``steps``, timed in turns: ``warmup`` untimed rounds, then ``n`` rounds
    of one step each, the order rotated every round.  Where the machine's speed drifts (a shared host, thermal
    limits), each contender sees the same conditions, which timing one after the other does not give."""
    names = list(steps)
    for _ in range(warmup):
        for name in names:
            steps[name]()
    sync(dev)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            steps[name]()
            sync(dev)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def profile(step, n: int, dev: torch.device, trace: str | None) -> None:
    """Run ``n`` more steps under torch.profiler; print the ops by self time (device time on GPU)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with torch_profile(activities=acts, record_shapes=True) as prof:
        for _ in range(n):
            step()
        sync(dev)
    key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=25))
    print_categories(prof, n, dev)
    print_attention_calls(prof)
    if trace:
        prof.export_chrome_trace(trace)
        print(f"chrome trace: {trace} (open in chrome://tracing or https://ui.perfetto.dev)")


# what each self-time entry of the profile is, by the first pattern its name matches (kernel names on CUDA: cuBLAS /
# CUTLASS / nvjet GEMMs, flash / cuDNN attention, fused AdamW, Inductor's Triton kernels; aten op names on CPU)
CATEGORIES = (
    ("attention", ("flash", "fmha", "cudnn", "scaled_dot_product", "attention")),
    ("AdamW", ("adam", "multi_tensor_apply")),
    ("GEMM", ("gemm", "cutlass", "nvjet", "xmma", "sm90_", "sm100_", "scaled_mm", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::matmul", "aten::linear")),
    ("elementwise (Triton)", ("triton_",)),
    ("memcpy / memset", ("memcpy", "memset")),
)


def categorize(name: str) -> str:
    """The :data:`CATEGORIES` entry ``name`` belongs to, ``other`` if none."""
    low = name.lower()
    for cat, pats in CATEGORIES:
        if any(p in low for p in pats):
            return cat
    return "other"


def print_categories(prof, steps: int, dev: torch.device) -> None:
    """Self time per step by category (device time on CUDA): the profile's side of the floor table in
    ``benchmarks/results/throughput_notes.md`` (GEMMs, attention, AdamW, elementwise)."""
    cuda = dev.type == "cuda"
    tot: dict[str, float] = {}
    for e in prof.key_averages():
        t = e.self_device_time_total if cuda else e.self_cpu_time_total
        if t > 0:
            cat = categorize(e.key)
            tot[cat] = tot.get(cat, 0.0) + t / 1e3 / steps
    print(f"per step by category ({'device' if cuda else 'CPU'} self time, {steps} steps):")
    for cat, ms in sorted(tot.items(), key=lambda kv: -kv[1]):
        print(f"  category {cat:22s} {ms:8.1f} ms")
    print(f"  category {'total':22s} {sum(tot.values()):8.1f} ms")


def print_attention_calls(prof) -> None:
    """Print each distinct SDPA kernel op the profiled steps ran, with its input shapes and scalar arguments.

    What to read: a 4-D mask input (``(B, 1, T, T)``) or K and V with as many heads as Q on a GQA model mean the
    step lost causal flash attention (a materialised mask, ``is_causal=False``, K and V repeated to every head);
    ``causal_sdpa`` exists to prevent exactly that (``memorization/training/attention.py``).
    """
    seen = set()
    for e in prof.events():
        if "scaled_dot_product" in e.name and "backward" not in e.name and e.input_shapes:
            sig = (e.name, str(e.input_shapes))
            if sig in seen:
                continue
            seen.add(sig)
            scalars = [c for c in getattr(e, "concrete_inputs", []) if c not in (None, "", [])]
            print(f"attention op {e.name}: input shapes {e.input_shapes}, scalars {scalars}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--size", default="1b", help="model preset")
    p.add_argument("--init", default=None, metavar="DIR",
                   help="a pretrained HF checkpoint to train instead of the preset (both sides), e.g. the output of "
                        "`python data/models/get.py smollm2-135m`")
    p.add_argument("--layers", type=int, default=0, help="layers to build (0: the preset's), e.g. the 8b's on one GPU")
    p.add_argument("--fp8", default="", choices=["", "rowwise", "tensorwise"],
                   help="also run ours with its Linears but the LM head in FP8 (torchao's float8 recipe) and print "
                        "its speedup over ours in bf16")
    p.add_argument("--seq", type=int, default=2048, help="sequence length")
    p.add_argument("--batch", type=int, default=4, help="sequences per step")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--which", default="both", choices=["both", "ours", "hf", "attention"],
                   help="what to run: ours and HF eager, one of them, or 'attention': ours with causal_sdpa "
                        "against ours with HF's sdpa mask path (memorization/training/attention.py)")
    p.add_argument("--hf-weights", default="fp32,bf16,bf16-compile",
                   help="the HF baselines to run, comma-separated: fp32 (fp32 weights and AdamW state, bf16 "
                        "autocast: our trainer's numerics), bf16 (the model cast to bf16, no autocast), "
                        "bf16-compile (that model under torch.compile); the 1.5x target is against the faster "
                        "eager one")
    p.add_argument("--hf-adamw", default="fused",
                   help="the AdamW of the HF baselines, comma-separated: fused (HF Trainer's default, on a CPU "
                        "too) and/or for-loop (torch.optim.AdamW's default on a CPU: a hand-written loop's); ours "
                        "uses TrainConfig.adamw_impl's default, fused")
    p.add_argument("--interleave", action="store_true",
                   help="build every contender first (HF baselines and ours: they must fit in memory together) and "
                        "time them in turns, one step each, the median per contender: for a machine whose speed "
                        "drifts (a shared CPU host); with --which both only")
    p.add_argument("--no-compile", action="store_true", help="do not torch.compile our step")
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in backward")
    p.add_argument("--peak-tflops", type=float, default=H100_BF16_PEAK / 1e12, help="peak for MFU")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N more steps of our trainer and print the top ops by self time")
    p.add_argument("--trace", default=None, metavar="FILE.json", help="with --profile: write a Chrome trace here")
    a = p.parse_args()
    hf_weights = [w.strip() for w in a.hf_weights.split(",") if w.strip()]
    bad = [w for w in hf_weights if w not in HF_WEIGHTS]
    if bad or not hf_weights:
        p.error(f"--hf-weights takes a comma-separated list of {', '.join(HF_WEIGHTS)}; got {a.hf_weights!r}")
    hf_adamw = [w.strip() for w in a.hf_adamw.split(",") if w.strip()]
    if not hf_adamw or any(w not in HF_ADAMW for w in hf_adamw):
        p.error(f"--hf-adamw takes a comma-separated list of {', '.join(HF_ADAMW)}; got {a.hf_adamw!r}")
    if a.interleave and (a.which != "both" or a.fp8 or a.profile):
        p.error("--interleave times HF and ours together: --which both, without --fp8 and --profile")
    if a.layers < 0:
        p.error(f"--layers must be >= 0 (0: the preset's), got {a.layers}")
    if a.fp8:
        try:
            import torchao.float8  # noqa: F401
        except ImportError:
            p.error("--fp8 needs torchao: pip install -e '.[fp8]'")
    dev = device()
    layers = a.layers or None
    if a.init:
        if not is_checkpoint(a.init):
            p.error(f"--init {a.init}: no Hugging Face checkpoint (config.json) there")
        a.size = a.init
    shape = bench_shape(a.size, layers)
    rows = torch.randint(3, shape.vocab if a.init else VOCAB, (a.batch * 64, a.seq))
    tok = a.batch * a.seq
    fpt = flops_per_token(shape, a.seq)
    res = {}
    if a.interleave:
        with tempfile.TemporaryDirectory() as tmp:
            steps = {hf_label(w, dev, opt): hf_trainer(a.size, rows, a.batch, dev, w, layers, opt)[0]
                     for w in hf_weights for opt in hf_adamw}
            steps["ours"] = ours_trainer(a.size, rows, a.batch, dev, not a.no_compile, a.activation_checkpointing,
                                         tmp, layers=layers)[0]
            res = interleaved(steps, a.steps, a.warmup, dev)
            del steps
    if a.which in ("both", "hf") and not a.interleave:
        for w in hf_weights:
            for opt in hf_adamw:
                res[hf_label(w, dev, opt)] = hf_eager(a.size, rows, a.batch, a.steps, a.warmup, dev, w, layers, opt)
                gc.collect()
                if dev.type == "cuda":
                    print(f"{hf_label(w, dev, opt)} peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
    if a.which in ("both", "ours") and not a.interleave:
        res["ours"] = ours(a.size, rows, a.batch, a.steps, a.warmup, dev, not a.no_compile, a.activation_checkpointing,
                           a.profile, a.trace, layers=layers)
        if dev.type == "cuda":
            print(f"ours peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        if a.fp8:
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            res[f"ours FP8 ({a.fp8})"] = ours(a.size, rows, a.batch, a.steps, a.warmup, dev, not a.no_compile,
                                              a.activation_checkpointing, fp8=a.fp8, layers=layers)
            if dev.type == "cuda":
                print(f"ours FP8 peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    if a.which == "attention":
        for name, attn in (("ours", "causal_sdpa"), ("ours, HF sdpa mask", "sdpa")):
            gc.collect()
            res[name] = ours(a.size, rows, a.batch, a.steps, a.warmup, dev, not a.no_compile,
                             a.activation_checkpointing, attention=attn, layers=layers)
    print(f"device {dev}, size {shape.name if a.init else a.size}{f' with {layers} layers' if layers else ''} "
          f"({shape.num_params() / 1e9:.3f}B), {a.batch} x {a.seq} tokens/step, "
          f"{fpt / 1e9:.2f} GFLOP/token, peak {a.peak_tflops:.0f} TFLOP/s")
    width = max(len(n) for n in res)
    for name, s in res.items():
        tps = tok / s
        mfu = tps * fpt / (a.peak_tflops * 1e12)
        print(f"{name:{width}s}: {s * 1e3:8.1f} ms/step {tps:10.0f} tok/s  MFU {mfu:6.1%}")
    if a.which == "attention":
        print(f"speedup causal_sdpa / HF sdpa mask = {res['ours, HF sdpa mask'] / res['ours']:.2f}x")
    elif "ours" in res:
        for name, s in res.items():
            if name.startswith("HF"):
                target = "  (target >= 1.2x, MFU >= 55%)" if "compile" in name else ""
                print(f"speedup ours / {name} = {s / res['ours']:.2f}x{target}")
                if a.fp8:
                    print(f"speedup ours FP8 / {name} = {s / res[f'ours FP8 ({a.fp8})']:.2f}x")
        if a.fp8:
            print(f"speedup ours FP8 / ours bf16 = {res['ours'] / res[f'ours FP8 ({a.fp8})']:.2f}x  (target >= 1.4x)")
        hf = {n: s for n, s in res.items() if n.startswith("HF eager")}
        if hf:
            name = min(hf, key=hf.get)
            print(f"speedup ours / fastest HF ({name}) = {hf[name] / res['ours']:.2f}x  "
                  "(target >= 1.5x, MFU >= 55% on H100)")


if __name__ == "__main__":
    main()
