"""The GPU execution models (hpc_codegen/gpu.py, toolchain.py, ``data/hpc_code/problems/*_cuda.yaml``):
60 CUDA prompts on their problems' serial drivers, 60 HIP prompts derived from them, the trusted adapter between a
driver and a kernel, the sandbox showing a GPU's device nodes, and a machine without a GPU listing them as not run.

No GPU is needed here: the references are checked through the CPU emulator (``harness/gpu_emu``: every thread of
a launch in turn), and compiled with nvcc where it exists; running them on a GPU is ``bash
benchmarks/gpu_runbook.sh hpccuda``.  The default suite scores one problem (its reference and two wrong
candidates); the slow tests score all 60 references in the emulator (~4 min) and compile all 60 with nvcc (~11
min: nvcc takes 3-5 s a file, more than the default suite's budget allows even for a rotation).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from hpc_codegen import load_suite
from hpc_codegen import gpu
from hpc_codegen.harness import RunConfig, evaluate_c
from hpc_codegen.reference import prepare_reference
from hpc_codegen.sandbox import SandboxLimits, isolation, run_sandboxed
from hpc_codegen.toolchain import adapter_source, compile_driver, compile_library, unavailable_models
from tests.support import load_eval_cli

EMULATED = RunConfig(workers=(1,), quick=True, gpu_emulate=True, run_limits=SandboxLimits(timeout_s=60.0))


def test_every_cuda_prompt_states_its_launch_on_its_problems_driver_with_a_hip_twin():
    """60 CUDA prompts, one per problem, on the driver of the problem's serial prompt: a kernel's docstring states
    its launch configuration ("The kernel is launched ..."), a host function's gets hpc_for and device pointers;
    each has an adapter (every pointer sized); each HIP prompt is its CUDA prompt hipified -- no CUDA left in it."""
    problems, errors = load_suite()
    assert not errors
    cuda = {p.function: p for p in problems if p.model == "cuda"}
    hip = {p.function: p for p in problems if p.model == "hip"}
    serial = {p.function: p for p in problems if p.model == "serial"}
    assert len(cuda) == len(hip) == 60 and set(cuda) == set(serial) == set(hip)
    kernels = 0
    for fn, p in cuda.items():
        assert p.driver_path == serial[fn].driver_path and p.type == serial[fn].type and p.on_gpu
        sig = gpu.parse_signature(p.prompt)
        assert sig.name == fn and 'extern "C"' in p.prompt.rsplit("*/", 1)[1]
        if sig.kernel:
            kernels += 1
            assert "Use CUDA to compute in parallel. The kernel is launched " in " ".join(p.prompt.split()), fn
        else:
            assert "hpc_for(" in p.prompt and "GPU (device) memory" in " ".join(p.prompt.split()), fn
        assert "hpc_gpu_call" in adapter_source(p)
        h = hip[fn]
        assert h.name == p.name.replace("_cuda", "_hip") and h.driver_path == p.driver_path
        assert h.prompt == gpu.hipify(p.prompt) and h.reference == gpu.hipify(p.reference)
        assert "CUDA" not in h.prompt and "cuda" not in h.prompt + h.reference and "hip/hip_runtime.h" in h.prompt
    assert 30 <= kernels < 60  # most problems are one kernel launch; multi-step ones are host functions


def _sig(text: str) -> gpu.Signature:
    return gpu.parse_signature(text + " {")


def test_adapter_copies_inputs_in_outputs_back_and_returns_the_kernels_result():
    """The generated adapter has the driver's signature, copies every buffer to the device, only non-const ones
    back, launches with the stated configuration through the library's launcher (skipped in the null run), and
    returns the kernel's result
    parameter (set to its initial value first); a spec that misses a pointer or names a wrong one is refused."""
    host = gpu.driver_signature("double dot(const double *x, double *w, size_t n);\n", "dot")
    kernel = _sig('extern "C" __global__ void dot(const double *x, double *w, size_t n, double *out)')
    src = gpu.adapter_source(host, kernel, {"buffers": {"x": "n", "w": "2 * n"}, "grid": "hpc_blocks(n, 256)",
                                           "block": "256", "result": "out", "init": "1.5"})
    assert 'extern "C" double hpc_gpu_call(const double *x, double *w, size_t n)' in src
    assert "hpc_gpu_in(x, (size_t)(n))" in src and "hpc_gpu_in(w, (size_t)(2 * n))" in src
    assert "hpc_gpu_back(w, d_w" in src and "hpc_gpu_back(x" not in src
    assert "hpc_gpu_value<double>((double)(1.5))" in src and "return hpc_result;" in src
    assert "typedef void (*hpc_gpu_fn_t)(dim3 hpc_grid, dim3 hpc_block, const double *x, double *w" in src
    assert "if (!hpc_gpu_skip) hpc_k(dim3(hpc_blocks(n, 256)), dim3(256), d_x, d_w, n, d_out);" in src
    launcher = gpu.launcher_source(kernel)  # appended to the kernel's library: the launch happens where it lives
    assert 'extern "C" void hpc_gpu_launch(dim3 hpc_grid, dim3 hpc_block, const double *x' in launcher
    assert "dot<<<hpc_grid, hpc_block>>>(x, w, n, out);" in launcher
    host_fn = _sig('extern "C" double dot(const double *x, double *w, size_t n)')
    src = gpu.adapter_source(host, host_fn, {"buffers": {"x": "n", "w": "n"}, "zeroed": ["w"]})
    assert "hpc_gpu_skip ? (double)0 : hpc_k(d_x, d_w, n)" in src and "hpc_gpu_zeros<double>((size_t)(n))" in src
    for bad, why in (({"buffers": {"x": "n"}, "grid": "1", "block": "1", "result": "out"}, "no element count for"),
                     ({"buffers": {"x": "n", "w": "n", "n": "1"}, "grid": "1", "block": "1", "result": "out"},
                      "not a pointer parameter"),
                     ({"buffers": {"x": "n", "w": "n"}, "grid": "1", "block": "1"}, "gpu.result must name"),
                     ({"buffers": {"x": "n", "w": "n"}, "result": "out"}, "needs gpu.grid and gpu.block")):
        with pytest.raises(ValueError, match=why):
            gpu.adapter_source(host, kernel, bad)


def test_hipify_renames_the_runtime_api_and_keeps_kernel_code():
    """cudaMalloc/cudaMemcpy/cudaMemcpyDeviceToHost and the header become HIP's; kernel built-ins stay."""
    src = ("#include <cuda_runtime.h>\n/* Use CUDA to compute in parallel. */\n"
           "int *a; cudaMalloc(&a, 4); cudaMemcpy(a, b, 4, cudaMemcpyDeviceToHost); atomicAdd(a, threadIdx.x);")
    out = gpu.hipify(src)
    assert out == ("#include <hip/hip_runtime.h>\n/* Use AMD HIP to compute in parallel. */\n"
                   "int *a; hipMalloc(&a, 4); hipMemcpy(a, b, 4, hipMemcpyDeviceToHost); atomicAdd(a, threadIdx.x);")


def test_emulated_launch_rewrites_chevrons_of_plain_and_template_kernels():
    assert (gpu.emulated_source("k<<<g, 256>>>(a, b); f<F><<<(n + 255) / 256, 256>>>(n, f);")
            == "hpc_emu_launch(k, g, 256)(a, b); hpc_emu_launch(f<F>, (n + 255) / 256, 256)(n, f);")


def test_gpu_device_nodes_are_the_gpus_and_nothing_else(tmp_path):
    """NVIDIA's and AMD's nodes are found under a /dev; disks, terminals and directories are not; of
    LD_LIBRARY_PATH, only the directories holding a GPU driver library are taken (once each)."""
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1", "kfd",
                 "dri/renderD128", "dri/card0", "sda", "tty0", "nvme0n1", "dri/by-path/x"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    found = {os.path.relpath(p, tmp_path) for p in gpu.device_nodes(str(tmp_path))}
    assert found == {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1", "kfd",
                     "dri/renderD128", "dri/card0"}
    assert gpu.has_nvidia_gpu(str(tmp_path)) and gpu.has_amd_gpu(str(tmp_path))
    assert not gpu.has_nvidia_gpu(str(tmp_path / "nvidia-caps"))
    (tmp_path / "drv").mkdir()
    (tmp_path / "drv" / "libcuda.so.1").write_text("")  # a driver kept on LD_LIBRARY_PATH is shown to GPU runs
    path = f"{tmp_path / 'drv'}:{tmp_path}:relative:{tmp_path / 'drv'}"
    assert gpu.driver_library_dirs({"LD_LIBRARY_PATH": path}) == (str(tmp_path / "drv"),)


@pytest.mark.skipif(not isolation().filesystem, reason="the sandbox has no root of its own here")
def test_sandbox_shows_the_device_nodes_asked_for_and_no_other(tmp_path):
    """A device node outside the always-shown ones (null, zero, ...) exists in the sandbox only when passed as a
    device; a path outside /dev is refused before anything runs."""
    node = next((d for d in ("/dev/ptmx", "/dev/tty", "/dev/loop-control") if os.path.exists(d)), None)
    if node is None:
        pytest.skip("no device node to show")
    limits = SandboxLimits(timeout_s=30.0)
    assert run_sandboxed(["/bin/sh", "-c", f"test -e {node}"], tmp_path, limits).returncode != 0
    assert run_sandboxed(["/bin/sh", "-c", f"test -e {node}"], tmp_path, limits, devices=(node,)).returncode == 0
    with pytest.raises(ValueError, match="under /dev"):
        run_sandboxed(["true"], tmp_path, limits, devices=("/etc/passwd",))


NO_GPU = pytest.mark.skipif(gpu.has_nvidia_gpu() or gpu.has_amd_gpu(), reason="this machine has a GPU")


@NO_GPU
def test_without_a_gpu_cuda_and_hip_are_unavailable_and_alone_refused(capsys):
    """Here (no GPU) CUDA and HIP are unavailable, each with its reason (no GPU, or no compiler) and the C models
    are not; asking for CUDA alone is a setup error (exit 2, nothing run), and so is an --nvcc that is not an
    executable (before any work)."""
    missing = unavailable_models(RunConfig(), {"cuda", "hip", "serial", "openmp"})
    assert missing == {"cuda": gpu.unavailable_reason("cuda"), "hip": gpu.unavailable_reason("hip")}
    assert "no NVIDIA GPU" in missing["cuda"] or "nvcc" in missing["cuda"]
    assert unavailable_models(RunConfig(gpu_emulate=True), {"cuda"}) == {}  # the emulator needs no GPU
    cli = load_eval_cli("hpc_code")
    assert cli.main(["--use-references", "--quick", "--no-progress", "--execution-models", "cuda"]) == 2
    assert f"nothing to run here: every selected problem's execution model is unavailable (cuda: {missing['cuda']})" \
        in capsys.readouterr().err
    assert cli.main(["--use-references", "--nvcc", "/nonexistent/nvcc"]) == 2
    assert "--nvcc /nonexistent/nvcc: not an executable file" in capsys.readouterr().err


@NO_GPU
def test_without_a_gpu_the_report_lists_cuda_and_hip_as_not_run(capsys):
    """The report scores the C problem and lists the CUDA and HIP ones under not_run with their reasons -- never
    as failed samples (about 1.5 s once torch is imported, as it is in the suite)."""
    rc = load_eval_cli("hpc_code").main(["--use-references", "--quick", "--workers", "1", "--no-progress", "--json",
                                         "--problems", "reduce_array_sum_serial", "reduce_array_sum_cuda",
                                         "reduce_array_sum_hip"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    report = json.loads(out.out)
    assert report["problems"] == 1 and report["pass@1"] == 1.0 and report["status_counts"]["build_error"] == 0
    assert report["not_run"] == [
        {"model": "cuda", "reason": gpu.unavailable_reason("cuda"), "problems": ["reduce_array_sum_cuda"]},
        {"model": "hip", "reason": gpu.unavailable_reason("hip"), "problems": ["reduce_array_sum_hip"]}]


WRONG_SUM = {
    "drops the last value": """    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i + 1 < n; i += (size_t)gridDim.x * blockDim.x)
        s += x[i];
    atomicAdd(sum, s);
}
""",
    "overwrites the sum instead of adding to it": """    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += x[i];
    *sum = s;
}
""",
}


def test_cuda_reference_passes_and_wrong_kernels_fail_in_the_emulator():
    """Through the whole harness (runner + adapter + driver + checker, sandboxed), the emulated reference of
    reduce_array_sum_cuda passes with a timing, and two plausible wrong kernels -- an off-by-one, and a plain
    store racing the other threads' (in the emulator: the last thread's partial sum wins) -- are wrong_output."""
    (problem,), _ = load_suite(patterns=["reduce_array_sum_cuda"])
    ref = prepare_reference(problem, EMULATED)
    try:
        ok = evaluate_c(problem, problem.reference, EMULATED, ref)
        assert ok.status == "passed", ok.message
        assert set(ok.speedups) == {1} and ok.candidate_s[1] > 0
        for what, body in WRONG_SUM.items():
            res = evaluate_c(problem, body, EMULATED, ref)
            assert res.status == "wrong_output", (what, res.status, res.message)
    finally:
        ref.cleanup()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_cuda_reference_passes_in_the_emulator():
    """All 60 CUDA references (kernels and host functions with hpc_for), each through its adapter and driver,
    match the serial baseline when every thread runs in turn (about 5 s each on 2 cores)."""
    problems, _ = load_suite(models=["cuda"])
    assert len(problems) == 60
    failed = {}
    for p in problems:
        res = evaluate_c(p, p.reference, EMULATED)
        if res.status != "passed":
            failed[p.name] = (res.status, res.message[:500])
    assert not failed


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.skipif(gpu.cuda_install() is None, reason=gpu.NVCC_HINT)
def test_every_cuda_reference_and_runner_compiles_with_nvcc():
    """nvcc (no GPU needed to compile) builds all 60 CUDA references as the shared library a run loads, exporting
    what the runner loads (the host function, or the kernel's launcher: nvcc 13 hides kernels themselves), and
    each problem's runner (driver + adapter, linked against libcudart): what the GPU runbook stage then runs
    (about 11 s a problem on 2 busy cores: 10-11 min)."""
    problems, _ = load_suite(models=["cuda"])
    cfg = RunConfig(workers=(1,), quick=True, gpu_arch="sm_90")
    failed = {}
    for p in problems:
        with tempfile.TemporaryDirectory() as d:
            lib = compile_library(p, p.reference, d, cfg, name="reference")
            runner = compile_driver(p, d, cfg, "main_run_omp.c")
            if lib.returncode != 0 or runner.returncode != 0 or not (Path(d) / "prog").is_file():
                failed[p.name] = (lib.stderr + runner.stderr)[-800:]
                continue
            symbols = subprocess.run(["nm", "-D", "--defined-only", str(Path(d) / "reference.so")],
                                     capture_output=True, text=True).stdout.split()
            loads = gpu.LAUNCHER if gpu.parse_signature(p.prompt).kernel else p.function
            if loads not in symbols:
                failed[p.name] = f"{loads} is not exported"
    assert not failed
