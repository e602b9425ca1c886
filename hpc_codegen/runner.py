"""Whole evaluations: run every (problem, sample) pair and aggregate the metrics."""

from __future__ import annotations

import multiprocessing as mp
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Sequence

from tqdm.auto import tqdm

from hpc_codegen.harness import RunConfig, SampleResult, evaluate_c
from hpc_codegen.humaneval import PyProblem, evaluate_python
from hpc_codegen.metrics import best_over_workers, efficiency_at_k, mean_or_none, pass_at_k, speedup_at_k
from hpc_codegen.problems import Problem, TaskError
from hpc_codegen.reference import Reference, prepare_reference

STATUS_ORDER = ("passed", "wrong_output", "runtime_error", "timeout", "build_error")


def _evaluate_one(problem, body: str, cfg: RunConfig, ref: Reference | None) -> SampleResult:
    if isinstance(problem, PyProblem):
        return evaluate_python(problem, body, cfg.run_limits, cfg.keep_dirs)
    return evaluate_c(problem, body, cfg, ref)


def evaluate_samples(
    problems: Sequence[Problem | PyProblem],
    bodies: Sequence[Sequence[str]],
    cfg: RunConfig,
    jobs: int = 1,
    progress: bool = True,
    desc: str = "evaluate",
) -> list[list[SampleResult]]:
    """Score ``bodies[i][j]`` (sample j of problem i); results keep the same shape.

    Problem by problem: its trusted programs and baseline (:func:`prepare_reference`) are
    prepared once, shared by its samples, and removed before the next problem (so their
    outputs never pile up).  ``jobs > 1`` scores a problem's samples in a spawn-context
    process pool (``preexec_fn`` is not safe in threads); keep ``jobs=1`` when the speedups
    matter, since concurrent runs share the cores with the timed kernels.
    """
    results: list[list[SampleResult | None]] = [[None] * len(bs) for bs in bodies]
    bar = tqdm(total=sum(len(bs) for bs in bodies), desc=desc, disable=not progress)
    pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) if jobs > 1 else None
    try:
        for i, (problem, bs) in enumerate(zip(problems, bodies)):
            if not bs:
                continue
            ref = prepare_reference(problem, cfg) if isinstance(problem, Problem) else None
            try:
                if pool is None:
                    for j, body in enumerate(bs):
                        results[i][j] = _evaluate_one(problem, body, cfg, ref)
                        bar.update()
                else:
                    futs = {pool.submit(_evaluate_one, problem, body, cfg, ref): j for j, body in enumerate(bs)}
                    for fut in as_completed(futs):
                        results[i][futs[fut]] = fut.result()
                        bar.update()
            finally:
                if ref is not None:
                    ref.cleanup()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        bar.close()
    return results  # type: ignore[return-value]


def _problem_summary(problem, samples: list[SampleResult], ks: Sequence[int], cfg: RunConfig) -> dict:
    n = len(samples)
    c = sum(s.status == "passed" for s in samples)
    b = sum(s.status != "build_error" for s in samples)
    out = {
        "name": problem.name,
        "type": problem.type,
        "model": problem.model,
        "task": getattr(problem, "task", "write"),
        "samples": n,
        "passed": c,
        "built": b,
        "status": samples[0].status if n == 1 else Counter(s.status for s in samples).most_common(1)[0][0],
        "status_counts": dict(Counter(s.status for s in samples)),
    }
    valid_k = [k for k in ks if k <= n]
    for k in valid_k:
        out[f"pass@{k}"] = pass_at_k(n, c, k)
        out[f"build@{k}"] = pass_at_k(n, b, k)
    if isinstance(problem, Problem):
        ns = list(cfg.worker_counts(problem))
        # best speedup among passing samples, per worker count (null when none passed)
        out["speedups"] = {
            str(w): max((s.speedups[w] for s in samples if s.status == "passed"), default=None) for w in ns
        }
        per = [s.speedups if s.status == "passed" else {} for s in samples]  # failed samples count as 0
        out["speedup_n@k"] = {
            str(w): {str(k): speedup_at_k([d.get(w, 0.0) for d in per], k) for k in valid_k} for w in ns
        }
        out["efficiency_n@k"] = {
            str(w): {str(k): efficiency_at_k([d.get(w, 0.0) for d in per], w, k) for k in valid_k} for w in ns
        }
        out["speedup_max@k"] = {str(k): speedup_at_k(best_over_workers(per), k) for k in valid_k}
        out["efficiency_max@k"] = {str(k): speedup_at_k(best_over_workers(per, efficiency=True), k)
                                   for k in valid_k}
    failure = next((s for s in samples if s.status != "passed"), None)
    out["message"] = failure.message if failure else ""
    out["sample_results"] = [s.to_dict() for s in samples]
    return out


def _mean_of(entries: list[dict], metric: str, *keys: str) -> float | None:
    """Mean over ``entries`` of ``entry[metric][keys...]`` where present."""
    vals = []
    for e in entries:
        v = e.get(metric)
        for key in keys:
            v = v.get(key) if isinstance(v, dict) else None
        if v is not None:
            vals.append(v)
    return mean_or_none(vals)


def _aggregate(entries: list[dict], ks: Sequence[int], workers: Sequence[int] | None) -> dict:
    agg: dict = {"problems": len(entries)}
    for k in ks:
        for metric in ("pass", "build"):
            vals = [e[f"{metric}@{k}"] for e in entries if f"{metric}@{k}" in e]
            agg[f"{metric}@{k}"] = mean_or_none(vals)
    if workers is not None:
        for metric in ("speedup_n@k", "efficiency_n@k"):
            agg[metric] = {str(w): {str(k): _mean_of(entries, metric, str(w), str(k)) for k in ks}
                           for w in sorted({1, *workers})}
        for metric in ("speedup_max@k", "efficiency_max@k"):
            agg[metric] = {str(k): _mean_of(entries, metric, str(k)) for k in ks}
    return agg


def summarize(
    problems: Sequence[Problem | PyProblem],
    results: list[list[SampleResult]],
    ks: Sequence[int],
    cfg: RunConfig,
    task_errors: Sequence[TaskError] = (),
    speedup_models: Sequence[str] = ("openmp", "mpi", "mpi+omp", "kokkos"),
) -> dict:
    """Aggregate per-problem results into the JSON report.

    ``pass@k``/``build@k`` average over all problems.  ``speedup@k`` is the
    headline ParEval speedup_n@k at the largest of ``cfg.workers``, n, averaged over
    the parallel problems (``speedup_models``) that ran with n workers (an
    mpi+omp run's n is ranks x threads, :meth:`RunConfig.worker_counts`); failed samples count as 0;
    ``efficiency@k`` (speedup_n / n), ``speedup_max@k`` and ``efficiency_max@k``
    (each sample's best over its worker counts) likewise.  ``speedup_n@k`` and
    ``efficiency_n@k`` give every n (n=1 also includes serial problems);
    ``by_model``, ``by_type`` and ``by_task`` split everything per execution
    model, per problem type and per task kind (write / translate).
    """
    entries = [_problem_summary(p, r, ks, cfg) for p, r in zip(problems, results)]
    counts = {p.model: cfg.worker_counts(p) for p in problems if isinstance(p, Problem)}
    is_c = bool(counts)
    workers = sorted({*cfg.workers, *(n for ns in counts.values() for n in ns)})
    report = _aggregate(entries, ks, workers if is_c else None)
    if is_c:
        top = str(max(cfg.workers))
        par = [e for e in entries if e["model"] in speedup_models]
        par_agg = _aggregate(par, ks, workers)
        report["speedup_n"] = int(top)
        for k in ks:
            report[f"speedup@{k}"] = par_agg["speedup_n@k"][top][str(k)]
            report[f"efficiency@{k}"] = par_agg["efficiency_n@k"][top][str(k)]
            report[f"speedup_max@{k}"] = par_agg["speedup_max@k"][str(k)]
            report[f"efficiency_max@{k}"] = par_agg["efficiency_max@k"][str(k)]
        report["by_model"] = {m: _aggregate([e for e in entries if e["model"] == m], ks, counts[m])
                              for m in sorted(counts)}
        report["by_type"] = {t: _aggregate([e for e in entries if e["type"] == t], ks, workers)
                             for t in sorted({e["type"] for e in entries})}
        report["by_task"] = {t: _aggregate([e for e in entries if e["task"] == t], ks, workers)
                             for t in sorted({e["task"] for e in entries})}
    counts = Counter(s["status"] for e in entries for s in e["sample_results"])
    report["status_counts"] = {s: counts.get(s, 0) for s in STATUS_ORDER}
    report["task_errors"] = [{"name": t.name, "path": str(t.path), "error": t.error} for t in task_errors]
    report["results"] = entries
    return report
