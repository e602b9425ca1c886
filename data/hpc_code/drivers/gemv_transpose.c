/* Driver: dense_la -- y = A^T x with A m x n row-major,
 * void gemv_transpose(const double *A, const double *x, double *y, size_t m, size_t n).
 * Problem size N gives m = N rows and n = 4N/5 + 3 columns. */
#include "hpc_harness.h"

void gemv_transpose(const double *A, const double *x, double *y, size_t m, size_t n);

typedef struct { size_t m, n; double *A, *x, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->m = (size_t)size;
    c->n = (size_t)size * 4 / 5 + 3;
    c->A = hpc_xmalloc(c->m * c->n * sizeof(double));
    c->x = hpc_xmalloc(c->m * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->m * c->n; i++) c->A[i] = hpc_rand_double(&seed, -1.0, 1.0);
    for (size_t i = 0; i < c->m; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); } /* NaN */
void hpc_candidate(void *p) { ctx_t *c = p; gemv_transpose(c->A, c->x, c->got, c->m, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    /* row by row (y += x[i] * row i): reads A contiguously */
    for (size_t j = 0; j < c->n; j++) c->want[j] = 0.0;
    for (size_t i = 0; i < c->m; i++) {
        const double *ai = c->A + i * c->n;
        double xi = c->x[i];
        for (size_t j = 0; j < c->n; j++) c->want[j] += xi * ai[j];
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n, 1e-9, 1e-11 * (double)c->m, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->A); free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
