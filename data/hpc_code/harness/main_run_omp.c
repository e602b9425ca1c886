/* The runner of serial, OpenMP and Kokkos problems (trusted: no candidate code is linked in).
 *
 * usage: prog N SEED OUT LIBRARY [skip]
 * Builds the inputs of size N from SEED, then -- inside the timed window marked S ... E --
 * loads LIBRARY (the candidate, compiled as a shared library: none of its code, not even a
 * constructor, runs before the window opens), calls its function once and writes the
 * output to OUT (a mapping of OUT itself for array outputs: no copy).  The sandbox's init timestamps the marks and
 * ends the run at E; the reference program (main_ref.c) checks OUT.
 *
 * With `skip` it is the null run: the same window without the call (LIBRARY is then the
 * reference solution), whose time is subtracted from the candidate's.  It also writes how
 * many threads it got to the file `workers`, so the runner knows the requested count took effect.
 *
 * Built with -DHPC_KOKKOS (and kokkos_init.cpp) for Kokkos problems: Kokkos is initialised before the
 * window opens, as MPI is for MPI problems, so the candidate finds it ready and its start-up is not timed;
 * the worker count reported is then Kokkos' host concurrency.
 */
#include <dlfcn.h>
#include <omp.h>
#include "hpc_harness.h"

extern void (*hpc_kernel)(void);
#ifdef HPC_KOKKOS
void hpc_kokkos_init(void);
int hpc_kokkos_workers(void);
void hpc_kokkos_finalize(void);
#endif
HPC_OUTPUT_STATE

int main(int argc, char **argv) {
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "skip") == 0)) {
        fprintf(stderr, "usage: %s N SEED OUT LIBRARY [skip]\n", argv[0]);
        return 2;
    }
    int skip = argc == 6;
    hpc_output_path = argv[3];
    void *ctx = hpc_setup(atol(argv[1]), strtoull(argv[2], NULL, 10));
    hpc_reset(ctx);
#ifdef HPC_KOKKOS
    hpc_kokkos_init();
    if (skip) hpc_report_workers(hpc_kokkos_workers());
#else
    if (skip) hpc_report_workers(omp_get_max_threads());
#endif
    hpc_mark('S');
    void *lib = dlopen(argv[4], RTLD_NOW | RTLD_LOCAL);
    void *fn = lib ? dlsym(lib, HPC_KERNEL_NAME) : NULL;
    if (!fn) {
        fprintf(stderr, "driver: cannot load %s from %s: %s\n", HPC_KERNEL_NAME, argv[4], dlerror());
        return 4;
    }
    *(void **)&hpc_kernel = fn;
    if (!skip) hpc_candidate(ctx);
    void *got, *want;
    size_t bytes = hpc_result(ctx, &got, &want);
    if (got != hpc_output_mapped && hpc_write_file(argv[3], got, bytes) != 0) { /* a scalar output */
        fprintf(stderr, "driver: cannot write %s\n", argv[3]);
        return 3;
    }
    hpc_mark('E');
#ifdef HPC_KOKKOS
    hpc_kokkos_finalize();
#endif
    hpc_free(ctx);
    return 0;
}
