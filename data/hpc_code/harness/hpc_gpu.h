/* Helpers of the trusted GPU adapter (generated per problem by hpc_codegen/gpu.py, compiled into the
 * runner, never into a candidate): device memory, copies, the launch and its error check.
 *
 * One source for the three targets: CUDA (nvcc), HIP (hipcc: __HIPCC__) and the CPU emulator (g++ with
 * -DHPC_GPU_EMULATE -Igpu_emu, whose cuda_runtime.h runs a kernel's threads one after another).  The adapter
 * calls the gpu* names below; the runner (main_run_omp.c built with -DHPC_GPU) calls hpc_gpu_init before its
 * timed window, sets hpc_gpu_fn to the candidate's function and hpc_gpu_skip for the null run (the copies
 * without the launch, so that a candidate's time is its kernel's).  A failed allocation, copy or launch ends the
 * run with exit status 5 and the runtime's message.
 */
#ifndef HPC_GPU_H
#define HPC_GPU_H
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
typedef hipError_t gpuError_t;
#define gpuSuccess hipSuccess
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuGetLastError hipGetLastError
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuGetErrorString hipGetErrorString
#else
#include <cuda_runtime.h>
typedef cudaError_t gpuError_t;
#define gpuSuccess cudaSuccess
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuGetLastError cudaGetLastError
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuGetErrorString cudaGetErrorString
#endif

#ifdef HPC_GPU_EMULATE
#define HPC_GPU_EMU_STATE HPC_EMU_STATE
#else
#define HPC_GPU_EMU_STATE
#endif

extern "C" void *hpc_gpu_fn; /* the candidate's host function, or its kernel's launcher (from dlsym) */
extern "C" int hpc_gpu_skip; /* 1 in the null run: everything but the launch */

static inline void hpc_gpu_die(const char *what, gpuError_t e) {
    fprintf(stderr, "driver: %s: %s\n", what, gpuGetErrorString(e));
    exit(5);
}

/* The adapter defines the runner's GPU state once; hpc_gpu_init creates the device context (before the window). */
#define HPC_GPU_STATE                                                              \
    HPC_GPU_EMU_STATE                                                              \
    extern "C" {                                                                   \
    void *hpc_gpu_fn;                                                              \
    int hpc_gpu_skip;                                                              \
    void hpc_gpu_init(void) {                                                      \
        gpuError_t e = gpuFree(0);                                                 \
        if (e != gpuSuccess) hpc_gpu_die("cannot start the GPU", e);               \
    }                                                                              \
    }

/* Blocks of `block` threads covering n threads (at least one block): "launched with at least n threads". */
static inline unsigned hpc_blocks(size_t n, unsigned block) {
    size_t b = (n + block - 1) / block;
    return (unsigned)(b ? b : 1);
}

/* A device copy of the n elements at h (allocation of at least one element). */
template <class T> static T *hpc_gpu_in(const T *h, size_t n) {
    T *d = NULL;
    gpuError_t e = gpuMalloc((void **)&d, (n ? n : 1) * sizeof(T));
    if (e != gpuSuccess) hpc_gpu_die("cannot allocate device memory", e);
    if (n && (e = gpuMemcpy(d, h, n * sizeof(T), gpuMemcpyHostToDevice)) != gpuSuccess)
        hpc_gpu_die("cannot copy to the device", e);
    return d;
}
/* n zeroed device elements. */
template <class T> static T *hpc_gpu_zeros(size_t n) {
    T *zero = (T *)calloc(n ? n : 1, sizeof(T));
    if (!zero) {
        fprintf(stderr, "driver: out of memory\n");
        exit(3);
    }
    T *d = hpc_gpu_in(zero, n);
    free(zero);
    return d;
}
/* One device element set to v (a kernel's result). */
template <class T> static T *hpc_gpu_value(T v) { return hpc_gpu_in(&v, 1); }
/* The n device elements at d copied back to h. */
template <class T> static void hpc_gpu_back(T *h, const T *d, size_t n) {
    gpuError_t e = n ? gpuMemcpy(h, d, n * sizeof(T), gpuMemcpyDeviceToHost) : gpuSuccess;
    if (e != gpuSuccess) hpc_gpu_die("cannot copy from the device", e);
}
template <class T> static T hpc_gpu_take(const T *d) {
    T v;
    hpc_gpu_back(&v, d, 1);
    return v;
}
template <class T> static void hpc_gpu_free(T *d) { gpuFree((void *)d); }
/* Wait for the launch; its error (a bad configuration, a fault in the kernel) ends the run. */
static inline void hpc_gpu_finish(void) {
    gpuError_t e = gpuGetLastError();
    if (e == gpuSuccess) e = gpuDeviceSynchronize();
    if (e != gpuSuccess) hpc_gpu_die("the GPU code failed", e);
}
#endif
