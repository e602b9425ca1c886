/* A CPU emulator of the CUDA runtime, for checking the suite's CUDA references without a GPU (see
 * hpc_codegen/gpu.py): compiled with g++ in place of <cuda_runtime.h>.  A launch, written
 * hpc_emu_launch(kernel, grid, block)(args) (the harness rewrites k<<<grid, block>>>(args) into it), runs every
 * thread of every block one after another, so a kernel is correct here when it is correct under any order of
 * its threads -- except that __shared__, __syncthreads and warp functions are not provided (a kernel using them
 * does not build).  Device memory is host memory.  Semantics only: nothing here is timed.
 */
#ifndef HPC_GPU_EMU_CUDA_RUNTIME_H
#define HPC_GPU_EMU_CUDA_RUNTIME_H
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct hpc_emu_state_t {
    dim3 t, b, bd, gd;
};
/* One state for the runner and the candidate's library: defined in the runner (HPC_EMU_STATE, linked with
 * -rdynamic), which the library's references resolve to when it is loaded. */
extern "C" hpc_emu_state_t hpc_emu_state;
#define HPC_EMU_STATE extern "C" { hpc_emu_state_t hpc_emu_state; }
#define threadIdx (hpc_emu_state.t)
#define blockIdx (hpc_emu_state.b)
#define blockDim (hpc_emu_state.bd)
#define gridDim (hpc_emu_state.gd)

template <class F> struct hpc_emu_launcher {
    F f;
    dim3 grid, block;
    template <class... A> void operator()(A... a) const {
        hpc_emu_state_t saved = hpc_emu_state;
        hpc_emu_state.gd = grid;
        hpc_emu_state.bd = block;
        for (unsigned bz = 0; bz < grid.z; bz++)
            for (unsigned by = 0; by < grid.y; by++)
                for (unsigned bx = 0; bx < grid.x; bx++)
                    for (unsigned tz = 0; tz < block.z; tz++)
                        for (unsigned ty = 0; ty < block.y; ty++)
                            for (unsigned tx = 0; tx < block.x; tx++) {
                                hpc_emu_state.b = dim3(bx, by, bz);
                                hpc_emu_state.t = dim3(tx, ty, tz);
                                f(a...);
                            }
        hpc_emu_state = saved;
    }
};
template <class F> hpc_emu_launcher<F> hpc_emu_launch(F f, dim3 grid, dim3 block, size_t = 0, void * = 0) {
    return hpc_emu_launcher<F>{f, grid, block};
}

typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2 };
enum cudaMemcpyKind { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice,
                      cudaMemcpyDefault };
inline cudaError_t cudaMalloc(void **p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
template <class T> inline cudaError_t cudaMalloc(T **p, size_t bytes) { return cudaMalloc((void **)p, bytes); }
inline cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void *d, const void *s, size_t bytes, cudaMemcpyKind) {
    if (bytes) memmove(d, s, bytes);
    return cudaSuccess;
}
inline cudaError_t cudaMemset(void *d, int v, size_t bytes) { memset(d, v, bytes); return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
inline cudaError_t cudaGetLastError(void) { return cudaSuccess; }
inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated CUDA error" : "no error"; }

#define HPC_EMU_ATOMIC(name, T, op)                                                                        \
    inline T name(T *p, T v) { T old = *p; op; return old; }
HPC_EMU_ATOMIC(atomicAdd, int, *p = old + v)
HPC_EMU_ATOMIC(atomicAdd, unsigned, *p = old + v)
HPC_EMU_ATOMIC(atomicAdd, unsigned long long, *p = old + v)
HPC_EMU_ATOMIC(atomicAdd, float, *p = old + v)
HPC_EMU_ATOMIC(atomicAdd, double, *p = old + v)
HPC_EMU_ATOMIC(atomicSub, int, *p = old - v)
HPC_EMU_ATOMIC(atomicSub, unsigned, *p = old - v)
HPC_EMU_ATOMIC(atomicMin, int, *p = v < old ? v : old)
HPC_EMU_ATOMIC(atomicMin, unsigned, *p = v < old ? v : old)
HPC_EMU_ATOMIC(atomicMin, long long, *p = v < old ? v : old)
HPC_EMU_ATOMIC(atomicMin, unsigned long long, *p = v < old ? v : old)
HPC_EMU_ATOMIC(atomicMax, int, *p = v > old ? v : old)
HPC_EMU_ATOMIC(atomicMax, unsigned, *p = v > old ? v : old)
HPC_EMU_ATOMIC(atomicMax, long long, *p = v > old ? v : old)
HPC_EMU_ATOMIC(atomicMax, unsigned long long, *p = v > old ? v : old)
HPC_EMU_ATOMIC(atomicExch, int, *p = v)
HPC_EMU_ATOMIC(atomicExch, unsigned, *p = v)
HPC_EMU_ATOMIC(atomicExch, unsigned long long, *p = v)
HPC_EMU_ATOMIC(atomicExch, float, *p = v)
HPC_EMU_ATOMIC(atomicOr, int, *p = old | v)
HPC_EMU_ATOMIC(atomicOr, unsigned, *p = old | v)
HPC_EMU_ATOMIC(atomicOr, unsigned long long, *p = old | v)
HPC_EMU_ATOMIC(atomicAnd, int, *p = old & v)
HPC_EMU_ATOMIC(atomicAnd, unsigned, *p = old & v)
HPC_EMU_ATOMIC(atomicAnd, unsigned long long, *p = old & v)
#undef HPC_EMU_ATOMIC
#define HPC_EMU_CAS(T) \
    inline T atomicCAS(T *p, T cmp, T v) { T old = *p; if (old == cmp) *p = v; return old; }
HPC_EMU_CAS(int)
HPC_EMU_CAS(unsigned)
HPC_EMU_CAS(unsigned long long)
#undef HPC_EMU_CAS
inline long long __double_as_longlong(double d) { long long v; memcpy(&v, &d, sizeof v); return v; }
inline double __longlong_as_double(long long v) { double d; memcpy(&d, &v, sizeof d); return d; }
#endif
