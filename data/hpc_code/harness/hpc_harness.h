/* Shared declarations for HPC-code problem drivers.
 *
 * A problem driver (data/hpc_code/drivers/<type>.c) implements the hooks below.
 * Two trusted programs are linked from it, neither with candidate code in it:
 *   - the runner (main_run_omp.c / main_run_mpi.c): builds the inputs, loads the candidate
 *     (a shared library, only after the inputs exist), calls its function once and writes
 *     the output to a file, marking the start and end of that timed window;
 *   - the reference program (main_ref.c): writes the serial baseline's output, and checks
 *     a candidate's output file against it.
 * The driver calls the candidate's function by its name; the build defines that name as
 * (*hpc_kernel), a pointer the runner sets from the loaded library (-D<name>=(*hpc_kernel)).
 * Inputs are generated from the run's seed with hpc_rand_*, so every MPI rank (and the
 * reference program) sees identical data.
 */
#ifndef HPC_HARNESS_H
#define HPC_HARNESS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hooks every driver implements ------------------------------------ */
/* Allocate and deterministically initialise inputs of problem size n. */
void *hpc_setup(long n, uint64_t seed);
/* Restore candidate inputs/outputs before each timed candidate run. */
void hpc_reset(void *ctx);
/* Call the candidate (model-written) function once. Called on every rank. */
void hpc_candidate(void *ctx);
/* Serial reference kernel written by us; stores the expected output. */
void hpc_baseline(void *ctx);
/* Compare candidate output with the baseline; 1 = correct. Rank 0 only. */
int hpc_check(void *ctx, char *msg, size_t msglen);
/* The output buffers: *got (the candidate's), *want (the baseline's); returns their size in bytes. */
size_t hpc_result(void *ctx, void **got, void **want);
void hpc_free(void *ctx);

/* ---- deterministic RNG (splitmix64) ----------------------------------- */
static inline uint64_t hpc_rand_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* Uniform double in [lo, hi). */
static inline double hpc_rand_double(uint64_t *s, double lo, double hi) {
    return lo + (hi - lo) * ((double)(hpc_rand_u64(s) >> 11) * 0x1.0p-53);
}
/* Uniform integer in [lo, hi). */
static inline long hpc_rand_int(uint64_t *s, long lo, long hi) {
    return lo + (long)(hpc_rand_u64(s) % (uint64_t)(hi - lo));
}

static inline void *hpc_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "driver: out of memory allocating %zu bytes\n", bytes);
        exit(3);
    }
    return p;
}

/* ---- comparison helpers ------------------------------------------------ */
/* |a-b| <= atol + rtol*|b|; NaN never matches. */
static inline int hpc_close(double a, double b, double rtol, double atol) {
    if (isnan(a) || isnan(b)) return 0;
    return fabs(a - b) <= atol + rtol * fabs(b);
}
static inline int hpc_check_doubles(const double *got, const double *want, size_t n,
                                    double rtol, double atol, char *msg, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (!hpc_close(got[i], want[i], rtol, atol)) {
            snprintf(msg, len, "index %zu: got %.17g expected %.17g", i, got[i], want[i]);
            return 0;
        }
    return 1;
}
static inline int hpc_check_longs(const long long *got, const long long *want, size_t n,
                                  char *msg, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            snprintf(msg, len, "index %zu: got %lld expected %lld", i, got[i], want[i]);
            return 0;
        }
    return 1;
}
static inline int hpc_check_ints(const int *got, const int *want, size_t n,
                                 char *msg, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            snprintf(msg, len, "index %zu: got %d expected %d", i, got[i], want[i]);
            return 0;
        }
    return 1;
}

/* ---- timing marks ------------------------------------------------------ */
/* Mark the start ('S') or end ('E') of the timed window: one byte to the FIFO named by
 * $HPC_MARKS, which the sandbox's init reads and timestamps (no-op outside a sandbox).
 * At 'E' the init ends every process of the run, so the output is what it was then. */
#include <fcntl.h>
#include <unistd.h>
static inline void hpc_mark(char what) {
    static int fd = -2;
    if (fd == -2) {
        const char *path = getenv("HPC_MARKS");
        fd = path ? open(path, O_WRONLY | O_NONBLOCK) : -1;
    }
    if (fd >= 0 && write(fd, &what, 1) != 1) fprintf(stderr, "driver: cannot write a timing mark\n");
}

/* ---- the candidate's output buffer -------------------------------------- */
/* Allocate the candidate's output buffer (`got`) with hpc_output_alloc and free it with
 * hpc_output_free.  In the runner (hpc_output_path set, rank 0 only) the buffer is a shared
 * mapping of the output file: what the candidate writes is in the file at once, so the
 * output needs no copy inside the timed window.  Elsewhere it is plain memory. */
#include <sys/mman.h>
extern const char *hpc_output_path; /* NULL: plain memory */
extern void *hpc_output_mapped;      /* the mapped buffer, once allocated */
extern size_t hpc_output_bytes;
/* Each main defines the three once. */
#define HPC_OUTPUT_STATE const char *hpc_output_path; void *hpc_output_mapped; size_t hpc_output_bytes;
static inline void *hpc_output_alloc(size_t bytes) {
    if (!hpc_output_path || hpc_output_mapped) return hpc_xmalloc(bytes);
    int fd = open(hpc_output_path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        fprintf(stderr, "driver: cannot create %s\n", hpc_output_path);
        exit(3);
    }
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "driver: cannot map %s\n", hpc_output_path);
        exit(3);
    }
    hpc_output_mapped = p;
    hpc_output_bytes = bytes;
    return p;
}
static inline void hpc_output_free(void *p) {
    if (p && p == hpc_output_mapped) munmap(p, hpc_output_bytes ? hpc_output_bytes : 1);
    else free(p);
}

/* The null run's report of its thread/rank count (to the file `workers`: stdout may be lost
 * when the sandbox ends the run at its end mark). */
static inline void hpc_report_workers(int workers) {
    FILE *f = fopen("workers", "w");
    if (f) {
        fprintf(f, "%d\n", workers);
        fclose(f);
    }
}

/* ---- output files ------------------------------------------------------ */
/* Write bytes to path; 0 on success. */
static inline int hpc_write_file(const char *path, const void *buf, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t put = fwrite(buf, 1, bytes, f);
    return (fclose(f) != 0 || put != bytes) ? -1 : 0;
}
/* Read exactly `bytes` from path into buf; 0 on success, -1 if unreadable, else the file's size. */
static inline long hpc_read_file(const char *path, void *buf, size_t bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long size = (fseek(f, 0, SEEK_END) == 0) ? ftell(f) : -1;
    if (size != (long)bytes || fseek(f, 0, SEEK_SET) != 0 || fread(buf, 1, bytes, f) != bytes) {
        fclose(f);
        return size < 0 ? -1 : (size == 0 ? -2 : size);
    }
    fclose(f);
    return 0;
}

#endif
