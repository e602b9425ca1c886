/* Driver: dense_la -- in-place LU factorisation without pivoting,
 * void lu_factor(double *A, size_t n).
 * Problem size N gives an N x N row-major matrix, strictly diagonally dominant by rows
 * (off-diagonal entries in [-1, 1), diagonal +-(N + U[1, 2))), so no pivoting is needed. */
#include "hpc_harness.h"

void lu_factor(double *A, size_t n);

typedef struct { size_t n; double *orig, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    size_t n = c->n = (size_t)size;
    c->orig = hpc_xmalloc(n * n * sizeof(double));
    c->got = hpc_output_alloc(n * n * sizeof(double));
    c->want = hpc_xmalloc(n * n * sizeof(double));
    for (size_t i = 0; i < n * n; i++) c->orig[i] = hpc_rand_double(&seed, -1.0, 1.0);
    for (size_t i = 0; i < n; i++) {
        double d = (double)n + hpc_rand_double(&seed, 1.0, 2.0);
        c->orig[i * n + i] = (hpc_rand_u64(&seed) & 1) ? d : -d;
    }
    return c;
}
/* the function overwrites its input: give it a fresh copy before every run */
void hpc_reset(void *p) { ctx_t *c = p; memcpy(c->got, c->orig, c->n * c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; lu_factor(c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    double *A = c->want;
    memcpy(A, c->orig, n * n * sizeof(double));
    for (size_t k = 0; k < n; k++) {
        const double *ak = A + k * n;
        for (size_t i = k + 1; i < n; i++) {
            double *ai = A + i * n;
            double l = ai[k] / ak[k];
            ai[k] = l;
            for (size_t j = k + 1; j < n; j++) ai[j] -= l * ak[j];
        }
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* U is O(1) off the diagonal and O(n) on it, L is O(1/n): errors of reordered sums stay tiny */
    return hpc_check_doubles(c->got, c->want, c->n * c->n, 1e-9, 1e-11, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->orig); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * c->n * sizeof *c->got;
}
