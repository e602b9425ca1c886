"""The GPU execution models (CUDA, HIP): compilers, devices, and the trusted adapter between a driver and a kernel.

**One source of truth.**  A CUDA problem (``problems/*_cuda.yaml``) is a ParEval-style prompt -- an ``extern "C"``
``__global__`` kernel whose docstring states its launch configuration ("launched with at least m threads"), or a
host function taking device pointers for multi-step problems -- its reference, and a ``gpu`` mapping::

    gpu:
      buffers: {A: m * n, x: n, y: m}   # element count of each pointer parameter (C expressions of the parameters)
      grid: hpc_blocks(m, 256)          # kernels: blocks and threads per block, as the prompt states them
      block: 256
      result: sum                       # a kernel parameter receiving the serial function's return value ...
      init: "0.0"                       # ... a device pointer to one element, set to init before the launch
      zeroed: [bins]                    # buffers the kernel finds zeroed on the device (not the host's contents)

A host-function prompt (no ``__global__``) takes device pointers and returns what the serial function returns;
its prompt defines ``hpc_for(n, f)``, a launch of the device lambda ``f`` (``[=] __device__ (size_t i) {...}``)
on ``n`` threads, since a completion is one function body and cannot define kernels of its own.

The HIP problem of the same type is derived from it (:func:`hipify`): the prompt says HIP, ``cuda*`` runtime calls
become ``hip*``; the kernel syntax is the same.  So HIP needs no prompt, reference or driver of its own.

**The adapter.**  Every problem keeps its serial driver (inputs, baseline, checker): the driver calls the serial
function's signature, and :func:`adapter_source` generates, from that signature and the ``gpu`` mapping, a trusted
host function with that signature which copies every buffer to the device, launches the candidate (the kernel with
the stated configuration, through the launcher :func:`launcher_source` appends to the candidate's library, or the
host function with device pointers), synchronises, copies the non-``const``
buffers and the result back and frees the device memory.  It is compiled into the runner, never into the candidate.
The null run executes the same adapter without the launch, so a candidate's time (its window minus the null run's)
is the kernel's, as ParEval times kernels: copies and allocation are subtracted, module loading is not.

**Emulation.**  Without a GPU, :data:`EMULATOR` (``harness/gpu_emu/cuda_runtime.h``) runs a kernel on the CPU one
thread after another (no ``__shared__``, no ``__syncthreads``, no warp functions): the suite's references are
written for it, so their correctness against every driver is checked on any machine; it checks semantics, not
speed, and is not a way to score candidates.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

GPU_MODELS = ("cuda", "hip")
BLOCK = 256  # threads per block of the 1D launches (hpc_blocks(n, 256) blocks)
NVCC_HINT = ("nvcc not found: pass --nvcc PATH, put it on PATH, or `pip install nvidia-cuda-nvcc nvidia-cuda-crt "
             "nvidia-nvvm nvidia-cuda-runtime` (the CUDA 13 wheels; ~100 MB download, ~265 MB installed)")
HIPCC_HINT = "hipcc not found: install ROCm (its bin/hipcc), or pass --hipcc PATH"
# device nodes a GPU program needs: NVIDIA's (control, devices, unified memory, capabilities) and AMD's (KFD, DRM)
DEVICE_GLOBS = ("nvidia[0-9]*", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps/*",
                "kfd", "dri/card*", "dri/renderD*")
EMULATOR = "gpu_emu"  # directory of data/hpc_code/harness holding the emulator's cuda_runtime.h


# ---- compilers and devices -------------------------------------------------------------------------------------

def _site_dirs() -> list[Path]:
    import site
    dirs = [Path(p) for p in (*site.getsitepackages(), site.getusersitepackages()) if p]
    return [d for d in dirs if d.is_dir()]


@lru_cache(maxsize=8)
def find_nvcc(path: str | None = None) -> str | None:
    """``path``, else ``$NVCC``, else ``nvcc`` on PATH, else ``$CUDA_HOME/bin/nvcc``, else the pip wheel's
    (``site-packages/nvidia/cu13/bin/nvcc``, ``nvidia/cuda_nvcc/bin/nvcc`` for CUDA 12): an executable or None."""
    candidates = [path] if path else [os.environ.get("NVCC"), shutil.which("nvcc")]
    if not path:
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home:
                candidates.append(str(Path(home) / "bin" / "nvcc"))
        for site in _site_dirs():
            candidates += [str(site / "nvidia" / sub / "bin" / "nvcc") for sub in ("cu13", "cuda_nvcc")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def find_hipcc(path: str | None = None) -> str | None:
    """``path``, else ``$HIPCC``, else ``hipcc`` on PATH, else ``/opt/rocm/bin/hipcc``: an executable or None."""
    for c in ([path] if path else [os.environ.get("HIPCC"), shutil.which("hipcc"), "/opt/rocm/bin/hipcc"]):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


@dataclass(frozen=True)
class CudaInstall:
    """An nvcc and the CUDA runtime library it compiles against."""

    nvcc: str
    prefix: Path  # the directory holding bin/nvcc
    cudart: Path  # libcudart.so[.N]: linked by path, so a wheel without the unversioned name works

    def link_flags(self, nvcc: bool = False) -> list[str]:
        """Link the runtime by its path, with a run path to its directory (for gcc, or nvcc's own syntax)."""
        rpath = ["-Xlinker", f"-rpath={self.cudart.parent}"] if nvcc else [f"-Wl,-rpath,{self.cudart.parent}"]
        return [str(self.cudart), *rpath]

    def prefixes(self) -> tuple[str, ...]:
        """Directories a sandbox must show for a build or a run (the real prefix: a wrapper script may point there)."""
        return tuple(sorted({str(self.prefix), str(self.cudart.parent)}))


def cuda_install(nvcc: str | None = None) -> CudaInstall | None:
    """The CUDA install of :func:`find_nvcc` (following a wrapper script like ``exec /usr/local/cuda-X/bin/nvcc``)."""
    found = find_nvcc(nvcc)
    if found is None:
        return None
    real = Path(found)
    try:
        text = real.read_text(errors="ignore")[:4096] if real.stat().st_size < 4096 else ""
    except OSError:
        text = ""
    m = re.search(r"exec\s+(\S+/bin/nvcc)\b", text)
    if m and os.path.isfile(m.group(1)):
        real = Path(m.group(1))
    prefix = real.resolve().parent.parent
    for lib in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
        libs = sorted(glob.glob(str(prefix / lib / "libcudart.so*")), key=len)
        if libs:
            return CudaInstall(found, prefix, Path(libs[0]))
    for site in _site_dirs():  # CUDA 12 wheels: nvidia/cuda_runtime/lib/libcudart.so.12
        libs = sorted(glob.glob(str(site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so*")), key=len)
        if libs:
            return CudaInstall(found, prefix, Path(libs[0]))
    return None


def device_nodes(dev: str = "/dev") -> tuple[str, ...]:
    """The GPU device nodes under ``dev`` (:data:`DEVICE_GLOBS`): all a sandboxed GPU run is shown of ``/dev``
    beyond null/zero/random."""
    found = set()
    for pattern in DEVICE_GLOBS:
        found.update(p for p in glob.glob(os.path.join(dev, pattern)) if not os.path.isdir(p))
    return tuple(sorted(found))


def driver_library_dirs(environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The directories of ``$LD_LIBRARY_PATH`` that hold a GPU driver library (``libcuda.so*``, ``libamdhip64.so*``):
    where some images keep the driver instead of the system library directories; a GPU run's sandbox needs them."""
    env = os.environ if environ is None else environ
    dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d and os.path.isabs(d) and os.path.isdir(d)]
    return tuple(d for d in dict.fromkeys(dirs)
                 if glob.glob(os.path.join(d, "libcuda.so*")) or glob.glob(os.path.join(d, "libamdhip64.so*")))


def has_nvidia_gpu(dev: str = "/dev") -> bool:
    return os.path.exists(os.path.join(dev, "nvidiactl")) and bool(glob.glob(os.path.join(dev, "nvidia[0-9]*")))


def has_amd_gpu(dev: str = "/dev") -> bool:
    return os.path.exists(os.path.join(dev, "kfd"))


@lru_cache(maxsize=1)
def nvidia_arch() -> str | None:
    """``sm_XY`` of the first GPU (``nvidia-smi --query-gpu=compute_cap``), or None (nvcc's default then)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.fullmatch(r"(\d+)\.(\d+)", out[0]) if out else None
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


def unavailable_reason(model: str, nvcc: str | None = None, hipcc: str | None = None, dev: str = "/dev") -> str | None:
    """Why ``model`` (cuda or hip) cannot run here -- no compiler, or no GPU -- or None when it can."""
    if model == "cuda":
        if cuda_install(nvcc) is None:
            return NVCC_HINT if find_nvcc(nvcc) is None else f"no libcudart.so beside {find_nvcc(nvcc)}"
        if not has_nvidia_gpu(dev):
            return f"no NVIDIA GPU here ({dev}/nvidiactl and {dev}/nvidia0 missing)"
        return None
    if find_hipcc(hipcc) is None:
        return HIPCC_HINT
    if not (has_amd_gpu(dev) or has_nvidia_gpu(dev)):
        return f"no GPU here ({dev}/kfd and {dev}/nvidia0 missing)"
    return None


# ---- signatures and the adapter -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Param:
    type: str  # e.g. "const double *"
    name: str

    @property
    def pointer(self) -> bool:
        return "*" in self.type

    @property
    def const(self) -> bool:
        return self.type.lstrip().startswith("const ")

    @property
    def element(self) -> str:
        """The pointee's type without const (``double`` for ``const double *``)."""
        return re.sub(r"\bconst\b", "", self.type.replace("*", "")).strip()


@dataclass(frozen=True)
class Signature:
    returns: str
    name: str
    params: tuple[Param, ...]
    kernel: bool  # __global__

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


def parse_signature(prompt: str) -> Signature:
    """The function that ends ``prompt`` (``... name(params) {``): return type, name, parameters, __global__."""
    m = re.search(r"(?:^|\n|\*/)([^\n;{}]*?)\b(\w+)\s*\(([^()]*)\)\s*\{\s*$", prompt)
    if m is None:
        raise ValueError("the prompt does not end with a function signature and '{'")
    head = re.sub(r'extern\s+"C"', "", m.group(1))
    kernel = "__global__" in head
    returns = " ".join(head.replace("__global__", "").replace("__host__", "").split())
    params = []
    for part in (p.strip() for p in m.group(3).split(",")):
        if not part or part == "void":
            continue
        pm = re.fullmatch(r"(.*?)(\w+)", " ".join(part.split()))
        if pm is None or not pm.group(1).strip():
            raise ValueError(f"cannot read the parameter {part!r} of {m.group(2)}")
        params.append(Param(pm.group(1).strip(), pm.group(2)))
    return Signature(returns or "void", m.group(2), tuple(params), kernel)


def driver_signature(driver: str, name: str) -> Signature:
    """The prototype of ``name`` a driver declares (``<type> name(params);``): the signature the adapter takes."""
    m = re.search(rf"^([A-Za-z_][\w ]*?[\s*]){re.escape(name)}\s*\(([^()]*)\)\s*;", driver, re.MULTILINE)
    if m is None:
        raise ValueError(f"the driver declares no prototype of {name}")
    return parse_signature(f"{m.group(1)}{name}({m.group(2)}) {{")


def _c_decl(p: Param, name: str | None = None) -> str:
    sep = "" if p.type.endswith("*") else " "
    return f"{p.type}{sep}{name or p.name}"


def adapter_source(host: Signature, device: Signature, spec: dict) -> str:
    """The trusted C++ host function ``hpc_gpu_call`` with ``host``'s signature that runs ``device`` (the candidate's
    kernel or host function, through the pointer ``hpc_gpu_fn``) on device copies of the buffers (module docstring).

    Raises ``ValueError`` when ``spec`` does not cover every pointer parameter or names one that does not exist.
    """
    buffers: dict = dict(spec.get("buffers") or {})
    result = spec.get("result")
    for p in host.params:
        if p.pointer and p.name not in buffers:
            raise ValueError(f"gpu.buffers gives no element count for the pointer parameter {p.name}")
    for name in buffers:
        if host.param(name) is None or not host.param(name).pointer:
            raise ValueError(f"gpu.buffers names {name}, not a pointer parameter of {host.name}")
    returns = host.returns != "void"
    if device.kernel and returns != (result is not None):
        raise ValueError(f"{host.name} returns {host.returns}: gpu.result must name the kernel parameter receiving it"
                         if result is None else f"gpu.result {result} given, but {host.name} returns nothing")
    if not device.kernel and (result is not None or device.returns != host.returns):
        raise ValueError(f"a host-function prompt returns what {host.name} returns ({host.returns}), "
                         "without gpu.result")
    if device.kernel and not ("grid" in spec and "block" in spec):
        raise ValueError("a __global__ prompt needs gpu.grid and gpu.block (its launch configuration)")
    launch = ["dim3 hpc_grid", "dim3 hpc_block"] if device.kernel else []
    lines = ['#include "hpc_gpu.h"', "",
             f"typedef {device.returns} (*hpc_gpu_fn_t)({', '.join(launch + [_c_decl(p) for p in device.params])});",
             "HPC_GPU_STATE", "",
             f'extern "C" {host.returns} hpc_gpu_call({", ".join(_c_decl(p) for p in host.params)}) {{']
    args = []
    for p in device.params:
        hp = host.param(p.name)
        if p.name == result:
            if not p.pointer:
                raise ValueError(f"gpu.result {result} must be a pointer parameter of the kernel")
            init = f"({p.element})({spec.get('init', 0)})"
            lines.append(f"    {p.element} *d_{p.name} = hpc_gpu_value<{p.element}>({init});")
            args.append(f"d_{p.name}")
        elif hp is None:
            raise ValueError(f"the kernel parameter {p.name} is neither a parameter of {host.name} nor gpu.result")
        elif hp.pointer:
            args.append(f"d_{p.name}")
        else:
            args.append(p.name)
    zeroed = set(spec.get("zeroed") or ())
    if not zeroed <= set(buffers):
        raise ValueError(f"gpu.zeroed names {sorted(zeroed - set(buffers))}, not in gpu.buffers")
    for name, count in buffers.items():
        hp = host.param(name)
        make = f"hpc_gpu_zeros<{hp.element}>(" if name in zeroed else f"hpc_gpu_in({name}, "
        lines.append(f"    {hp.element} *d_{name} = {make}(size_t)({count}));")
    lines.append("    hpc_gpu_fn_t hpc_k = (hpc_gpu_fn_t)hpc_gpu_fn;")
    if returns and not device.kernel:  # a host function returns the value itself
        lines.append(f"    {host.returns} hpc_result = hpc_gpu_skip ? ({host.returns})0 : hpc_k({', '.join(args)});")
    elif device.kernel:  # through the library's launcher (launcher_source): the kernel is launched where it lives
        lines.append(f"    if (!hpc_gpu_skip) hpc_k(dim3({spec['grid']}), dim3({spec['block']}), {', '.join(args)});")
    else:
        lines.append(f"    if (!hpc_gpu_skip) hpc_k({', '.join(args)});")
    lines.append("    hpc_gpu_finish();")
    for name, count in buffers.items():
        if not host.param(name).const:
            lines.append(f"    hpc_gpu_back({name}, d_{name}, (size_t)({count}));")
    if result is not None:
        lines.append(f"    {host.returns} hpc_result = ({host.returns})hpc_gpu_take(d_{result});")
    lines += [f"    hpc_gpu_free(d_{name});" for name in buffers]
    if result is not None:
        lines.append(f"    hpc_gpu_free(d_{result});")
    if returns:
        lines.append("    return hpc_result;")
    lines.append("}")
    return "\n".join(lines) + "\n"


LAUNCHER = "hpc_gpu_launch"  # the function a kernel problem's library exports (launcher_source)


def launcher_source(device: Signature) -> str:
    """What follows a kernel candidate in its library: ``extern "C" hpc_gpu_launch(grid, block, params)``, which
    launches the kernel with that configuration.  The kernel is launched from the library that holds it (nvcc 13
    gives kernels hidden visibility, and a launch through another library's pointer is not what the runtime
    promises); the runner calls this launcher, through the adapter, inside its timed window."""
    params = ", ".join(["dim3 hpc_grid", "dim3 hpc_block", *(_c_decl(p) for p in device.params)])
    names = ", ".join(p.name for p in device.params)
    return (f'\nextern "C" void {LAUNCHER}({params}) {{\n'
            f"    {device.name}<<<hpc_grid, hpc_block>>>({names});\n}}\n")


# ---- HIP from CUDA, and the emulator's launch syntax -----------------------------------------------------------

_HIP_TEXT = ((re.compile(r"#include\s*<cuda_runtime\.h>"), "#include <hip/hip_runtime.h>"),
             (re.compile(r"\bUse CUDA\b"), "Use AMD HIP"),
             (re.compile(r"\bCUDA\b"), "HIP"),
             (re.compile(r"\bcuda([A-Z]\w*)"), r"hip\1"))


def hipify(source: str) -> str:
    """A CUDA source as HIP: the runtime header, ``cuda*`` calls and types as ``hip*``, CUDA named HIP in prose
    (what ``hipify-perl`` does to runtime-API code; kernel syntax and built-ins are the same in HIP)."""
    for pattern, repl in _HIP_TEXT:
        source = pattern.sub(repl, source)
    return source


_CHEVRONS = re.compile(r"([\w:]+(?:<[^<>()]*>)?)\s*<<<(.*?)>>>\s*\(", re.DOTALL)


def emulated_source(source: str) -> str:
    """``k<<<grid, block>>>(args)`` as ``hpc_emu_launch(k, grid, block)(args)``: a launch the emulator runs."""
    return _CHEVRONS.sub(lambda m: f"hpc_emu_launch({m.group(1)}, {m.group(2)})(", source)

