"""Building and launching a problem's programs: compilers (gcc, mpicc; g++ against Kokkos; nvcc, hipcc), MPI launcher,
sandbox.

A problem has two kinds of program (see :mod:`.reference` and :mod:`.harness`): trusted
ones compiled from its driver and a generic main of ``data/hpc_code/harness``
(:func:`compile_driver`), and shared libraries compiled from the prompt and a body -- the
candidate's, or the reference solution (:func:`compile_library`).  Sources are copied into
the program's directory, so compiling in a sandbox needs nothing outside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from hpc_codegen import gpu
from hpc_codegen.kokkos import INSTALL_HINT, find_kokkos, require_kokkos
from hpc_codegen.problems import CXX_MODELS, MPI_MODELS, Problem
from hpc_codegen.sandbox import (SandboxLimits, SandboxResult, memory_limited, run_per_process,
                                 run_sandboxed, scratch_dir, system_paths)

LAUNCHERS = ("local", "mpiexec", "srun")
# the variable each launcher gives a process its rank in: the init of its sandbox names its report by it
RANK_VARS = {"mpiexec": ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK"), "srun": ("SLURM_PROCID",)}
# ranks in sandboxes of their own share no /dev/shm and no PID namespace: MPICH's shared-memory transport
# cannot attach another rank's segment, so ranks on one node talk through the network module
PER_PROCESS_MPI_ENV = {"MPIR_CVAR_NOLOCAL": "1", "UCX_POSIX_USE_PROC_LINK": "n"}


@dataclass(frozen=True)
class RunConfig:
    """How candidates are built and run."""

    workers: tuple[int, ...] = (1, 2)  # OpenMP threads / MPI ranks to run with
    threads_per_rank: int = 2  # OpenMP threads of each MPI rank in mpi+omp runs
    quick: bool = False  # small inputs, one run per worker count (tests)
    repeats: int = 3  # timed runs per worker count, each on fresh inputs; the best time counts
    run_limits: SandboxLimits = SandboxLimits()
    # a build is two sandboxed steps: the preprocessor alone, then the compiler on its output.  Preprocessing
    # every prompt + reference here takes <= 0.6 s (a Kokkos prompt, 3.3 MB of output) and a whole build
    # <= 4.4 s, so a candidate whose macros expand without bound is stopped after preprocess_timeout_s
    # instead of the build's time-out
    build_limits: SandboxLimits = SandboxLimits(timeout_s=60.0, memory_mb=None)
    preprocess_timeout_s: float = 10.0
    cc: str = "gcc"
    mpicc: str = "mpicc"
    mpiexec: str = "mpiexec"
    cflags: tuple[str, ...] = ("-O2", "-fopenmp", "-std=gnu17")
    cxx: str = "g++"  # Kokkos problems (C++)
    cxxflags: tuple[str, ...] = ("-O2", "-fopenmp", "-std=c++17")
    kokkos_prefix: str | None = None  # a Kokkos install prefix; None: $KOKKOS_ROOT, else Debian's (see .kokkos)
    nvcc: str | None = None  # CUDA problems; None: found by gpu.find_nvcc ($NVCC, PATH, CUDA_HOME, the pip wheel)
    hipcc: str | None = None  # HIP problems; None: $HIPCC, PATH, /opt/rocm/bin/hipcc
    gpuflags: tuple[str, ...] = ("-O2", "-std=c++17")
    gpu_arch: str | None = None  # nvcc -arch (e.g. sm_90); None: the GPU's own (nvidia-smi), else nvcc's default
    gpu_emulate: bool = False  # CUDA problems built with g++ against the CPU emulator (gpu.py): checks, not timings
    keep_dirs: bool = False
    # how runs are started (see :func:`launch`): "local" -- all in one sandbox here; "mpiexec" -- MPI runs
    # through ``mpiexec`` (``launcher_args`` after it, e.g. ``-hosts a,b``), one sandbox per rank; "srun" --
    # every run a Slurm job step, one sandbox per process
    launcher: str = "local"
    launcher_args: tuple[str, ...] = ()
    srun: str = "srun"
    srun_mpi: str = "pmi2"  # srun --mpi=: the PMI the MPI library speaks
    nodes: int | None = None  # srun --nodes for MPI runs (at most one per rank)
    work_dir: str | None = None  # where programs' directories go (shared by the nodes); None: scratch_dir()

    def worker_counts(self, problem: Problem) -> tuple[int, ...]:
        """The worker counts n a problem runs with: cores a run may use (ranks x threads for mpi+omp)."""
        if problem.model == "serial" or problem.on_gpu:
            return (1,)  # a GPU problem runs on one GPU
        if problem.model == "kokkos" and not require_kokkos(self.kokkos_prefix).threaded:
            return (1,)  # a Serial-only Kokkos (Debian's) runs every parallel_for on one core
        if problem.model == "mpi+omp":
            return tuple(r * self.threads_per_rank for r in self.workers)
        return self.workers

    def layout(self, problem: Problem, workers: int) -> tuple[int, int]:
        """(MPI ranks, OpenMP threads per rank) of a run with ``workers`` workers."""
        if problem.model == "mpi+omp":
            return workers // self.threads_per_rank, self.threads_per_rank
        if problem.model == "mpi":
            return workers, 1
        return 1, workers

    def size(self, problem: Problem) -> int:
        return problem.quick_size if self.quick else problem.size

    def runs(self) -> int:
        return 1 if self.quick else self.repeats

    def scratch(self) -> str | None:
        """The directory programs' working directories are made in (None: the system's temp dir)."""
        return self.work_dir if self.work_dir is not None else scratch_dir()

    def per_process(self, problem: Problem) -> bool:
        """Whether ``problem``'s runs go through a launcher with one sandbox per process (not one sandbox here)."""
        return self.launcher == "srun" or (self.launcher == "mpiexec" and problem.uses_mpi)


def tool(name: str) -> str:
    """Resolve a compiler/launcher, preferring the running venv's bin/ (mpicc, mpiexec).

    A tool that cannot be found raises ``FileNotFoundError``: it is a setup fault,
    not a candidate's, and must not be scored as a build or runtime failure.
    """
    venv_bin = Path(sys.executable).parent / name
    if venv_bin.exists():
        return str(venv_bin)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name!r} not found (looked in {venv_bin.parent} and on PATH)")
    return found


def require_tools(cfg: RunConfig, models: set[str] | list[str]) -> None:
    """Raise ``FileNotFoundError`` unless the compilers/launcher for ``models`` can be found."""
    names = {cfg.cc} if set(models) & {"serial", "openmp", *CXX_MODELS} else set()
    if set(models) & set(MPI_MODELS):
        names |= {cfg.mpicc, cfg.mpiexec}
    if set(models) & set(CXX_MODELS):
        names.add(cfg.cxx)
    if "kokkos" in models:
        require_kokkos(cfg.kokkos_prefix)
    if set(models) & set(gpu.GPU_MODELS):
        names.add(cfg.cc)  # the runner
        if cfg.gpu_emulate:
            names.add(cfg.cxx)
        for model in sorted(set(models) & set(gpu.GPU_MODELS)):
            why = None if cfg.gpu_emulate and model == "cuda" else gpu.unavailable_reason(model, cfg.nvcc, cfg.hipcc)
            if why:
                raise FileNotFoundError(why)
    if cfg.launcher == "srun":
        names.add(cfg.srun)
    for name in sorted(names):
        tool(name)


def unavailable_models(cfg: RunConfig, models: set[str] | list[str]) -> dict[str, str]:
    """The execution models of ``models`` this machine cannot build or run, each with the reason: Kokkos without a
    Kokkos install or a C++ compiler; CUDA and HIP without their compiler or a GPU (unless ``cfg.gpu_emulate``).
    Their problems are listed as not run, never scored as failures."""
    out = {}
    for model in sorted(set(models) & set(gpu.GPU_MODELS)):
        why = None if cfg.gpu_emulate and model == "cuda" else gpu.unavailable_reason(model, cfg.nvcc, cfg.hipcc)
        if why:
            out[model] = why
    if "kokkos" in models:
        if find_kokkos(cfg.kokkos_prefix) is None:
            out["kokkos"] = INSTALL_HINT
        else:
            try:
                tool(cfg.cxx)
            except FileNotFoundError as exc:
                out["kokkos"] = str(exc)
    return out


@lru_cache(maxsize=8)
def mpiexec_flags(mpiexec: str) -> tuple[str, ...]:
    """Launcher flags needed here: Open MPI refuses root and oversubscription by default.

    MPICH's hydra (the venv's ``mpich`` wheel) needs none.
    """
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
    except (OSError, subprocess.SubprocessError):
        return ()
    if "Open MPI" in text or "OpenRTE" in text or "open-mpi" in text:
        flags = ("--oversubscribe",)
        return flags + ("--allow-run-as-root",) if os.geteuid() == 0 else flags
    return ()


def candidate_env(threads: int) -> dict[str, str]:
    """The whole environment a sandboxed program gets (no inherited secrets; the sandbox sets HOME and TMPDIR)."""
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
    return {
        "PATH": path,
        "LANG": "C",
        "OMP_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "passive",  # oversubscribed MPI ranks must not spin
        "OMPI_MCA_plm_rsh_agent": "",  # Open MPI: single node, do not look for ssh/rsh
    }


def tool_dirs(cfg: RunConfig, model: str) -> tuple[str, ...]:
    """Install prefixes of the tools ``model`` needs that a sandbox does not show already (e.g. a cluster's
    MPI module): bound read-only into it."""
    names = [cfg.mpicc, cfg.mpiexec] if model in MPI_MODELS else [cfg.cc]
    if model in CXX_MODELS or (model in gpu.GPU_MODELS and cfg.gpu_emulate):
        names.append(cfg.cxx)
    shown = system_paths()
    dirs = set()
    for name in names:
        path = Path(tool(name))
        prefix = path.parent.parent if path.parent.name == "bin" else path.parent
        if not any(str(path).startswith(s.rstrip("/") + "/") for s in shown):
            dirs.add(str(prefix))
    if model == "kokkos":
        dirs.update(require_kokkos(cfg.kokkos_prefix).prefixes())
    if model in gpu.GPU_MODELS and not cfg.gpu_emulate:
        dirs.update(d for d in gpu_prefixes(cfg, model) if not any(d == s or d.startswith(s.rstrip("/") + "/")
                                                                   for s in shown))
    return tuple(sorted(dirs))


def gpu_prefixes(cfg: RunConfig, model: str) -> tuple[str, ...]:
    """The install directories of ``model``'s GPU compiler and runtime (nvcc's CUDA, hipcc's ROCm)."""
    if model == "cuda":
        inst = gpu.cuda_install(cfg.nvcc)
        return inst.prefixes() if inst else ()
    hipcc = gpu.find_hipcc(cfg.hipcc)
    return (str(Path(hipcc).resolve().parent.parent),) if hipcc else ()


def _gpu_compiler(cfg: RunConfig, model: str) -> tuple[list[str], list[str]]:
    """(compiler and its flags for a ``.cu`` source, flags that link the GPU runtime) of ``model``."""
    if cfg.gpu_emulate:
        return [tool(cfg.cxx), "-O1", "-std=c++17", "-x", "c++", "-DHPC_GPU_EMULATE", f"-I{gpu.EMULATOR}"], []
    if model == "hip":
        hipcc = gpu.find_hipcc(cfg.hipcc)
        if hipcc is None:
            raise FileNotFoundError(gpu.HIPCC_HINT)
        lib = Path(hipcc).resolve().parent.parent / "lib"  # ROCm's: libamdhip64.so
        return [hipcc, *cfg.gpuflags, "-x", "hip"], [f"-L{lib}", "-lamdhip64", f"-Wl,-rpath,{lib}"]
    inst = gpu.cuda_install(cfg.nvcc)
    if inst is None:
        raise FileNotFoundError(gpu.NVCC_HINT)
    arch = cfg.gpu_arch or gpu.nvidia_arch()
    return ([inst.nvcc, *cfg.gpuflags, "--extended-lambda", *([f"-arch={arch}"] if arch else []), "-cudart", "none"],
            inst.link_flags())


def _build_step(cmd: list[str], wd: Path, limits: SandboxLimits, ro: tuple[str, ...], step: str,
                why: str = "") -> SandboxResult:
    """One sandboxed build step; past its time-out, its stderr ends with the line "<step> ran past N s<why>"."""
    res = run_sandboxed(cmd, wd, limits, candidate_env(1), ro=ro)
    if res.timed_out:
        res.stderr += f"\n{step} ran past {limits.timeout_s:g} s{why}"
    return res


def _compile_gpu_library(problem: Problem, body: str, wd: Path, cfg: RunConfig, name: str) -> SandboxResult:
    """prompt + ``body`` into ``wd/<name>.so`` with nvcc / hipcc (or g++ against the emulator)."""
    compiler, link = _gpu_compiler(cfg, problem.model)
    device = gpu.parse_signature(problem.prompt)
    code = problem.prompt + body + (gpu.launcher_source(device) if device.kernel else "")
    (wd / f"{name}.cu").write_text(gpu.emulated_source(code) if cfg.gpu_emulate else code)  # launches the emulator runs
    if cfg.gpu_emulate:  # the emulator's state is the runner's (-rdynamic): resolved when the runner loads it
        shutil.copytree(problem.harness_dir / gpu.EMULATOR, wd / gpu.EMULATOR, dirs_exist_ok=True)
        cmd = [*compiler, "-fPIC", "-shared", f"{name}.cu", "-o", f"{name}.so", "-lm"]
    else:
        pic = ["-fPIC"] if problem.model == "hip" else ["-Xcompiler", "-fPIC"]
        if problem.model == "cuda":
            link = gpu.cuda_install(cfg.nvcc).link_flags(nvcc=True)
            no_undefined = ["-Xlinker", "--no-undefined"]
        else:  # hipcc (clang) links its runtime itself
            link, no_undefined = [], ["-Wl,--no-undefined"]
        cmd = [*compiler, *pic, "-shared", f"{name}.cu", "-o", f"{name}.so", *link, "-lm", *no_undefined]
    return _build_step(cmd, wd, cfg.build_limits, tool_dirs(cfg, problem.model), "compiling")


def adapter_source(problem: Problem) -> str:
    """The trusted adapter of a GPU problem (:func:`.gpu.adapter_source`): the driver's signature of its function
    calling the prompt's kernel or host function on device copies."""
    host = gpu.driver_signature(problem.driver_path.read_text(), problem.function)
    return gpu.adapter_source(host, gpu.parse_signature(problem.prompt), problem.gpu or {})


def _compile_gpu_driver(problem: Problem, wd: Path, cfg: RunConfig) -> SandboxResult:
    """The runner of a GPU problem: driver + ``main_run_omp.c -DHPC_GPU`` (gcc) + the adapter (nvcc / hipcc)."""
    compiler, link = _gpu_compiler(cfg, problem.model)
    shutil.copyfile(problem.harness_dir / "hpc_gpu.h", wd / "hpc_gpu.h")
    (wd / "adapter.cu").write_text(adapter_source(problem))
    ro = tool_dirs(cfg, problem.model)
    if cfg.gpu_emulate:  # the emulator's state is defined here and exported to the library the runner loads
        shutil.copytree(problem.harness_dir / gpu.EMULATOR, wd / gpu.EMULATOR, dirs_exist_ok=True)
        link = ["-rdynamic"]
    res = run_sandboxed([*compiler, "-I.", "-c", "adapter.cu", "-o", "adapter.o"], wd, cfg.build_limits,
                        candidate_env(1), ro=ro)
    if res.returncode != 0:
        return res
    fn = problem.function  # the runner's C parts with gcc, linked against the GPU runtime (libcudart, libamdhip64)
    loads = gpu.LAUNCHER if gpu.parse_signature(problem.prompt).kernel else fn
    cmd = [tool(cfg.cc), *cfg.cflags, f"-D{fn}=(*hpc_kernel)", f'-DHPC_KERNEL_NAME="{loads}"', "-DHPC_GPU", "-I.",
           problem.driver_path.name, "main_run_omp.c", "adapter.o", *link, "-lstdc++", "-o", "prog", "-lm", "-ldl"]
    return run_sandboxed(cmd, wd, cfg.build_limits, candidate_env(1), ro=ro)


def compile_library(problem: Problem, body: str, workdir: str | Path, cfg: RunConfig,
                    name: str = "candidate") -> SandboxResult:
    """Compile prompt + ``body`` alone into the shared library ``workdir/<name>.so``, sandboxed.

    A CPU problem's build is two steps, each in the sandbox: the preprocessor writes ``<name>.i`` (``.ii`` for
    C++) within ``cfg.preprocess_timeout_s``, then the compiler builds the library from it within
    ``cfg.build_limits``; the result of the first step that fails is returned.  A GPU problem's (nvcc, hipcc)
    is one step within ``cfg.build_limits``.  Every symbol must
    resolve (``--no-undefined``), so a wrong call is a build error here, not a failed load at run time.
    """
    wd = Path(workdir)
    if problem.on_gpu:
        return _compile_gpu_library(problem, body, wd, cfg, name)
    if problem.cxx:  # C++ against Kokkos: the function is extern "C", so the runner finds it by its name
        kokkos = require_kokkos(cfg.kokkos_prefix)
        source, flags, link = f"{name}.cpp", [tool(cfg.cxx), *cfg.cxxflags, *kokkos.compile_flags()], \
            [*kokkos.link_flags(), "-lm"]
        preprocessed = f"{name}.ii"
    else:
        source, flags, link = f"{name}.c", [tool(cfg.mpicc if problem.uses_mpi else cfg.cc), *cfg.cflags], ["-lm"]
        preprocessed = f"{name}.i"
    (wd / source).write_text(problem.prompt + body)
    ro = tool_dirs(cfg, problem.model)
    pre = _build_step([*flags, "-E", source, "-o", preprocessed], wd,
                      replace(cfg.build_limits, timeout_s=cfg.preprocess_timeout_s), ro, "preprocessing",
                      " (a macro that expands without bound?)")
    if pre.returncode != 0:
        return pre
    return _build_step([*flags, "-fPIC", "-shared", preprocessed, "-o", f"{name}.so", *link, "-Wl,--no-undefined"],
                       wd, cfg.build_limits, ro, "compiling")


_KOKKOS_INIT: dict[tuple, bytes] = {}  # the Kokkos runner's start-up object (kokkos_init.o) by toolchain


def compile_driver(problem: Problem, workdir: str | Path, cfg: RunConfig, main: str) -> SandboxResult:
    """Compile the problem's driver with ``main`` into ``workdir/prog`` (trusted: no candidate code).

    The driver's calls to the candidate's function go through ``hpc_kernel``, a pointer the
    runner sets from the library it loads (see ``hpc_harness.h``); a GPU problem's runner sets it to its
    adapter (:func:`adapter_source`), which launches the library's function on the device.  A Kokkos problem's runner
    (``main_run_omp.c`` with ``-DHPC_KOKKOS``) also links ``kokkos_init.cpp``, which starts Kokkos
    before the timed window.
    """
    wd = Path(workdir)
    for src in (problem.driver_path, problem.harness_dir / "hpc_harness.h", problem.harness_dir / main):
        shutil.copyfile(src, wd / src.name)
    if problem.on_gpu and main == "main_run_omp.c":
        return _compile_gpu_driver(problem, wd, cfg)
    fn = problem.function
    extra: list[str] = []
    ro = tool_dirs(cfg, problem.model)
    if problem.model == "kokkos" and main == "main_run_omp.c":
        kokkos = require_kokkos(cfg.kokkos_prefix)
        key = (str(problem.harness_dir), tool(cfg.cxx), cfg.cxxflags, kokkos)
        if key not in _KOKKOS_INIT:  # compiled once per process: a Kokkos header costs seconds to compile
            shutil.copyfile(problem.harness_dir / "kokkos_init.cpp", wd / "kokkos_init.cpp")
            res = run_sandboxed([tool(cfg.cxx), *cfg.cxxflags, *kokkos.compile_flags(), "-c", "kokkos_init.cpp",
                                 "-o", "kokkos_init.o"], wd, cfg.build_limits, candidate_env(1), ro=ro)
            if res.returncode != 0:
                return res
            _KOKKOS_INIT[key] = (wd / "kokkos_init.o").read_bytes()
        (wd / "kokkos_init.o").write_bytes(_KOKKOS_INIT[key])
        extra = ["-DHPC_KOKKOS", "kokkos_init.o", *kokkos.link_flags(), "-lstdc++"]
    cmd = [tool(cfg.mpicc if problem.uses_mpi else cfg.cc), *cfg.cflags, f"-D{fn}=(*hpc_kernel)",
           f'-DHPC_KERNEL_NAME="{fn}"', "-I.", problem.driver_path.name, main, *extra, "-o", "prog", "-lm", "-ldl"]
    return run_sandboxed(cmd, wd, cfg.build_limits, candidate_env(1), ro=ro)


def launch(problem: Problem, workdir: str | Path, cfg: RunConfig, workers: int, program: str | Path,
           args: list[str], ro: tuple[str, ...] = ()) -> SandboxResult:
    """Run ``program args`` in ``workdir`` with ``workers`` workers, sandboxed: OpenMP threads, MPI ranks
    (``mpiexec -n``) or ranks x threads (:meth:`RunConfig.layout`); ``ro`` are extra host paths the run may read
    (the trusted runner's directory).  With ``cfg.launcher`` "local" the whole run is one sandbox here; where
    :meth:`RunConfig.per_process` holds, :func:`launcher_command` starts it, one sandbox per process
    (:func:`~.sandbox.run_per_process`; MPI ranks keep the host's network)."""
    limits = cfg.run_limits
    cmd = [str(program), *args]
    ranks, threads = cfg.layout(problem, workers)
    if cfg.per_process(problem):
        return _launch_per_process(problem, workdir, cfg, ranks, threads, cmd, ro)
    if problem.uses_mpi:  # memory limit per rank, not on the launcher
        launcher = tool(cfg.mpiexec)
        cmd = [launcher, *mpiexec_flags(launcher), "-n", str(ranks), *memory_limited(cmd, limits.memory_mb)]
        limits = replace(limits, memory_mb=None)
    devices: tuple[str, ...] = ()
    env = candidate_env(threads)
    if problem.on_gpu and not cfg.gpu_emulate:
        # the GPU's device nodes, nothing else of /dev; no address-space limit: a GPU runtime reserves tens of GiB
        # of virtual addresses for unified memory (host memory is then bounded by the machine only).  Modules load
        # when the library is loaded (as in the null run, whose time is subtracted), not at the first launch
        devices, limits = gpu.device_nodes(), replace(limits, memory_mb=None)
        env["CUDA_MODULE_LOADING"] = "EAGER"
        drivers = gpu.driver_library_dirs()  # a driver outside the system's library directories
        if drivers:
            env["LD_LIBRARY_PATH"] = ":".join(drivers)
            ro = (*ro, *drivers)
    return run_sandboxed(cmd, workdir, limits, env, ro=(*tool_dirs(cfg, problem.model), *ro), devices=devices)


def launcher_command(problem: Problem, cfg: RunConfig, ranks: int, threads: int) -> list[str]:
    """The launcher prefix of a run of ``ranks`` x ``threads`` under ``cfg.launcher`` ("mpiexec" or "srun").

    ``srun``: one job step, ``--ntasks`` ranks of ``--cpus-per-task`` threads (MPI through ``--mpi``), ended
    by Slurm after the run's timeout (``--time``, whole minutes) and when a task fails; ``mpiexec``: ``-n``
    ranks, ``cfg.launcher_args`` placing them."""
    if cfg.launcher == "srun":
        minutes = int(cfg.run_limits.timeout_s // 60) + 2
        cmd = [tool(cfg.srun), f"--ntasks={ranks}", f"--cpus-per-task={threads}", f"--time={minutes}",
               "--kill-on-bad-exit=1"]
        if problem.uses_mpi:
            cmd += [f"--mpi={cfg.srun_mpi}", *([f"--nodes={min(cfg.nodes, ranks)}"] if cfg.nodes else [])]
        else:
            cmd.append("--nodes=1")
        return [*cmd, *cfg.launcher_args]
    launcher = tool(cfg.mpiexec)
    return [launcher, *mpiexec_flags(launcher), *cfg.launcher_args, "-n", str(ranks)]


def _launch_per_process(problem: Problem, workdir: str | Path, cfg: RunConfig, ranks: int, threads: int,
                        cmd: list[str], ro: tuple[str, ...]) -> SandboxResult:
    env = candidate_env(threads)
    if problem.uses_mpi:
        env.update(PER_PROCESS_MPI_ENV)
    return run_per_process(launcher_command(problem, cfg, ranks, threads), cmd, workdir, cfg.run_limits, env,
                           ro=(*tool_dirs(cfg, problem.model), *ro), rank_env=RANK_VARS[cfg.launcher],
                           network=not problem.uses_mpi and cfg.run_limits.isolate_network)


LOCAL_ONLY = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # directories no other node sees


def launcher_refusal(cfg: RunConfig, environ: dict[str, str] | None = None) -> str | None:
    """Why ``cfg``'s launcher cannot work here (a message for the user), or None when it can.

    Checked before anything is built: ``srun`` needs a Slurm allocation (``SLURM_JOB_ID``); a run whose
    processes may land on other nodes (``srun`` with more than one node, ``mpiexec`` with host arguments)
    needs ``cfg.work_dir`` on a filesystem every node sees (not under /tmp, /var/tmp, /dev/shm, /run, nor
    the default temp dir); launcher options need a launcher that takes them.
    """
    environ = os.environ if environ is None else environ
    if cfg.launcher not in LAUNCHERS:
        return f"--launcher {cfg.launcher}: one of {', '.join(LAUNCHERS)}"
    if cfg.launcher == "local" and cfg.launcher_args:
        return "--launcher-args is for --launcher mpiexec or srun"
    if cfg.launcher != "srun" and cfg.nodes is not None:
        return "--nodes is for --launcher srun (with mpiexec, place ranks with --launcher-args, e.g. -hosts a,b)"
    if cfg.nodes is not None and cfg.nodes < 1:
        return f"--nodes must be >= 1, got {cfg.nodes}"
    if cfg.work_dir is not None and not Path(cfg.work_dir).is_dir():
        return f"--work-dir {cfg.work_dir}: not a directory"
    if cfg.launcher == "srun":
        if not environ.get("SLURM_JOB_ID"):
            return ("--launcher srun runs job steps of a Slurm allocation: no SLURM_JOB_ID here (run inside "
                    "sbatch/salloc, or use --launcher local or mpiexec)")
        nodes = cfg.nodes or int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 1)
        spans = nodes > 1
        why = f"the allocation has {nodes} nodes" if cfg.nodes is None else f"--nodes {nodes}"
    elif cfg.launcher == "mpiexec":
        hosts = ("-host", "-hosts", "--host", "-f", "-hostfile", "--hostfile", "-machinefile", "--machinefile",
                 "-ppn", "--map-by")
        spans = any(a.split("=")[0] in hosts for a in cfg.launcher_args)
        why = "--launcher-args place ranks on hosts"
    else:
        spans = False
    if spans:
        where = cfg.work_dir
        if where is None:
            return (f"--launcher {cfg.launcher}: {why}, so the run directories must be on a filesystem every node "
                    "sees: pass --work-dir DIR on it")
        real = os.path.realpath(where)
        if any(real == d or real.startswith(d + "/") for d in LOCAL_ONLY):
            return (f"--work-dir {where} is node-local ({real}), but {why}: put it on a filesystem every node "
                    "sees")
    return None


def sandbox_report(base: dict, cfg: RunConfig) -> dict:
    """The report's ``sandbox`` entry: ``base`` (:meth:`~.sandbox.Isolation.to_dict`, what one sandbox here
    enforces) with what ``cfg.launcher`` changes -- one sandbox per process, MPI ranks on the host's network."""
    if cfg.launcher == "local":
        return base
    which = "every run" if cfg.launcher == "srun" else "MPI runs"
    return {
        "how": f"{base['how']}; --launcher {cfg.launcher}: one sandbox per process for {which}",
        "launcher": cfg.launcher,
        "not_enforced": [*base["not_enforced"],
                         f"network isolation of MPI runs (under --launcher {cfg.launcher} each rank keeps the "
                         "host's network: ranks on other nodes talk through it)"],
    }


def tail_text(text: str, limit: int = 1500) -> str:
    """The last ``limit`` characters of ``text`` (stripped), with ``...`` before them when cut: what a report
    keeps of a compiler's or a candidate's output."""
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]
