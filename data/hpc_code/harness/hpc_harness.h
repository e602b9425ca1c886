/* Shared declarations for HPC-code problem drivers.
 *
 * A problem driver (data/hpc_code/drivers/<type>.c) implements the hooks below;
 * the generic mains (main_omp.c for serial/OpenMP, main_mpi.c for MPI) own
 * argument parsing, timing, repetition and the result line the Python runner
 * parses.  Inputs are generated from a fixed seed with hpc_rand_*, so every MPI
 * rank (and every run) sees identical data.
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

#endif
