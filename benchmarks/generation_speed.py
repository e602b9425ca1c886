#!/usr/bin/env python
"""Sampling speed of the HPC-code evaluation: our batched KV-cache decoder (:class:`hpc_codegen.generate.
HFSampler`: the samples of a prompt share one prefill, done rows leave the batch) against ``transformers``'
``generate`` on the same inputs and settings, side by side in one process.

Both get the same chat inputs (the HPC-code prompts as the evaluation gives an instruct model), temperature, top-p,
``--samples`` per prompt and ``--batch-size`` rows at a time (``generate``: batch-size / samples prompts with
``num_return_sequences``).  Two rounds:

* ``fixed``: every row decodes exactly ``--max-new-tokens`` tokens (no stop; ``generate`` with ``min_new_tokens``):
  the same work, tokens/s = rows x max-new-tokens / seconds;
* ``stop``: as the evaluation runs, each row done once its C function closes (our stop test; for ``generate`` the
  same test as a ``StoppingCriteria``, its finished rows padded until the batch ends): tokens/s counts the tokens
  each row keeps.

    python benchmarks/generation_speed.py                                   # SmolLM2-135M-Instruct, CPU
    python benchmarks/generation_speed.py --prompts 8 --samples 5 --max-new-tokens 256
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from axonn.cli import HelpFormatter  # noqa: E402
from benchmarks.common import sync  # noqa: E402
from hpc_codegen.code_blocks import c_body_closed  # noqa: E402
from hpc_codegen.generate import HFSampler, stop_test  # noqa: E402
from hpc_codegen.problems import load_suite  # noqa: E402
from memorization.lm import Sampling, left_pad, row_seed  # noqa: E402


def ours(sampler: HFSampler, ids: list[list[int]], n: int, a: argparse.Namespace, stop: bool) -> list[list[int]]:
    """Our decoder's rows (prompt-major, ``n`` per prompt), as :meth:`HFSampler.sample` runs it."""
    rows = [p for p in ids for _ in range(n)]
    seeds = [row_seed(0, i, j) for i in range(len(ids)) for j in range(n)]
    until = stop_test(sampler.tok, c_body_closed, sampler.tok.eos_token_id) if stop else None
    sampling = Sampling(a.temperature, top_p=a.top_p, noise_on_cpu=True) if a.temperature > 0 else None
    return sampler.lm.generate_until(rows, a.max_new_tokens, until=until, sampling=sampling,
                                     seeds=seeds if sampling else None, batch_size=a.batch_size, pad_id=a.pad)


def theirs(sampler: HFSampler, ids: list[list[int]], n: int, a: argparse.Namespace, stop: bool) -> list[list[int]]:
    """``transformers``' ``generate`` on the same rows: ``batch_size // n`` prompts per call, ``n`` sequences each;
    a row's tokens end where the stop test first held (``stop``) or at ``max_new_tokens``."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    model, dev = sampler.model, next(sampler.model.parameters()).device
    until = stop_test(sampler.tok, c_body_closed, sampler.tok.eos_token_id)
    per = max(1, a.batch_size // n)
    out: list[list[int]] = []
    for s in range(0, len(ids), per):
        x, mask, _ = left_pad(ids[s:s + per], a.pad, dev)
        width = x.shape[1]
        ends: dict[int, int] = {}

        class Closed(StoppingCriteria):  # the evaluation's stop test, row by row
            def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kw) -> torch.Tensor:
                done = []
                for r, row in enumerate(input_ids[:, width:].tolist()):
                    if r not in ends and (keep := until(row)) is not None:
                        ends[r] = keep
                    done.append(r in ends)
                return torch.tensor(done, device=input_ids.device)

        kw = dict(do_sample=True, temperature=a.temperature, top_p=a.top_p, top_k=0) if a.temperature > 0 else \
            dict(do_sample=False)
        gen = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=a.max_new_tokens,
                             num_return_sequences=n if a.temperature > 0 else 1, pad_token_id=a.pad,
                             min_new_tokens=None if stop else a.max_new_tokens,
                             stopping_criteria=StoppingCriteriaList([Closed()]) if stop else None, **kw)
        rows = gen[:, width:].tolist()
        out += [row[:ends.get(r, len(row))] for r, row in enumerate(rows)]
    return out


def run(a: argparse.Namespace) -> dict:
    """``{round: {ours_s, theirs_s, ours_tokens, theirs_tokens, ours_tok_s, theirs_tok_s, ratio}}``, printed."""
    torch.manual_seed(0)
    sampler = HFSampler(a.model, chat=None)
    problems, _ = load_suite(None, a.problems, ["serial", "openmp", "mpi", "mpi+omp", "kokkos"])
    problems = problems[:: max(1, len(problems) // a.prompts)][: a.prompts]
    ids = sampler.input_ids([p.prompt for p in problems], [p.language for p in problems])
    a.pad = sampler.tok.pad_token_id if sampler.tok.pad_token_id is not None else 0
    n = a.samples if a.temperature > 0 else 1
    print(f"{len(problems)} prompts x {n} samples, {a.max_new_tokens} new tokens, batch {a.batch_size}, "
          f"T={a.temperature} top-p={a.top_p}, {torch.get_num_threads()} threads, input {min(map(len, ids))}-"
          f"{max(map(len, ids))} tokens")
    ours(sampler, ids[:1], 1, argparse.Namespace(**{**vars(a), "max_new_tokens": 2}), False)  # warm-up
    theirs(sampler, ids[:1], 1, argparse.Namespace(**{**vars(a), "max_new_tokens": 2}), False)
    results = {}
    print(f"{'round':6s} {'method':14s} {'tokens':>7s} {'seconds':>8s} {'tokens/s':>9s}")
    for name in a.rounds:
        stop = name == "stop"
        res = {}
        for who, fn in (("ours", ours), ("transformers", theirs)):
            dev = next(sampler.model.parameters()).device
            sync(dev)
            t0 = time.perf_counter()
            rows = fn(sampler, ids, n, a, stop)
            sync(dev)
            dt = time.perf_counter() - t0
            toks = sum(map(len, rows))
            res[who] = {"seconds": dt, "tokens": toks, "tok_s": toks / dt, "rows": rows}
            print(f"{name:6s} {who:14s} {toks:7d} {dt:8.1f} {toks / dt:9.1f}", flush=True)
        ratio = res["ours"]["tok_s"] / res["transformers"]["tok_s"]
        print(f"{name:6s} ours / transformers tokens/s: {ratio:.2f}x")
        results[name] = {**res, "ratio": ratio}
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", default=None,
                   help="HF model directory (default: SmolLM2-135M-Instruct from memorization.training.pretrained)")
    p.add_argument("--problems", nargs="+", default=None, metavar="GLOB", help="HPC-code problems (default: all CPU)")
    p.add_argument("--prompts", type=int, default=4, help="prompts, spread over the selected problems (default: 4)")
    p.add_argument("--samples", type=int, default=2, help="samples per prompt (default: 2)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per row at most (default: 64)")
    p.add_argument("--batch-size", type=int, default=8, help="rows decoded together (default: 8)")
    p.add_argument("--temperature", type=float, default=0.2, help="0: greedy (default: 0.2, as the evaluation)")
    p.add_argument("--top-p", type=float, default=0.95, help="nucleus top-p (default: 0.95)")
    p.add_argument("--rounds", nargs="+", default=["fixed", "stop"], choices=["fixed", "stop"],
                   help="which rounds to time (default: fixed stop)")
    return p


def main(argv: list[str] | None = None) -> dict:
    a = parser().parse_args(argv)
    if a.model is None:
        from memorization.training.pretrained import get_model

        a.model = str(get_model("smollm2-135m"))
    return run(a)


if __name__ == "__main__":
    main()
