/* The runner of MPI problems (trusted: no candidate code is linked in).
 *
 * usage: mpiexec -n P prog N SEED OUT LIBRARY [skip]
 * As main_run_omp.c, on every rank: all ranks build the same inputs from SEED; the window
 * opens (rank 0 marks S) once every rank has them, then every rank loads LIBRARY and calls
 * the candidate's function; rank 0 writes its output to OUT and marks E.  With `skip`
 * (the null run) rank 0 also writes the number of workers it got to `workers`: ranks x OpenMP
 * threads per rank (1 thread for MPI problems, OMP_NUM_THREADS for mpi+omp ones).  MPI is
 * initialised with MPI_THREAD_FUNNELED: a hybrid candidate calls MPI from its main thread only.
 */
#include <dlfcn.h>
#include <mpi.h>
#include <omp.h>
#include "hpc_harness.h"

extern void (*hpc_kernel)(void);
HPC_OUTPUT_STATE

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 5 && !(argc == 6 && strcmp(argv[5], "skip") == 0)) {
        if (rank == 0) fprintf(stderr, "usage: %s N SEED OUT LIBRARY [skip]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    int skip = argc == 6;
    if (rank == 0) hpc_output_path = argv[3];
    void *ctx = hpc_setup(atol(argv[1]), strtoull(argv[2], NULL, 10));
    hpc_reset(ctx);
    if (skip && rank == 0) hpc_report_workers(size * omp_get_max_threads());
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) hpc_mark('S');
    MPI_Barrier(MPI_COMM_WORLD); /* no rank loads the candidate before the window opens */
    void *lib = dlopen(argv[4], RTLD_NOW | RTLD_LOCAL);
    void *fn = lib ? dlsym(lib, HPC_KERNEL_NAME) : NULL;
    if (!fn) {
        fprintf(stderr, "driver: cannot load %s from %s: %s\n", HPC_KERNEL_NAME, argv[4], dlerror());
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
    *(void **)&hpc_kernel = fn;
    if (!skip) hpc_candidate(ctx);
    int rc = 0;
    if (rank == 0) {
        void *got, *want;
        size_t bytes = hpc_result(ctx, &got, &want);
        if (got != hpc_output_mapped && hpc_write_file(argv[3], got, bytes) != 0) { /* a scalar output */
            fprintf(stderr, "driver: cannot write %s\n", argv[3]);
            rc = 3;
        }
        hpc_mark('E');
    }
    hpc_free(ctx);
    MPI_Finalize();
    return rc;
}
