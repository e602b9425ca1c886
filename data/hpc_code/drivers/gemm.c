/* Driver: dense_la -- C = A B, all row-major,
 * void gemm(const double *A, const double *B, double *C, size_t m, size_t k, size_t n).
 * Problem size N gives m = N, k = 5N/4 + 1, n = 3N/4 + 2 (three different dimensions). */
#include "hpc_harness.h"

void gemm(const double *A, const double *B, double *C, size_t m, size_t k, size_t n);

typedef struct { size_t m, k, n; double *A, *B, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->m = (size_t)size;
    c->k = (size_t)size * 5 / 4 + 1;
    c->n = (size_t)size * 3 / 4 + 2;
    c->A = hpc_xmalloc(c->m * c->k * sizeof(double));
    c->B = hpc_xmalloc(c->k * c->n * sizeof(double));
    c->got = hpc_output_alloc(c->m * c->n * sizeof(double));
    c->want = hpc_xmalloc(c->m * c->n * sizeof(double));
    for (size_t i = 0; i < c->m * c->k; i++) c->A[i] = hpc_rand_double(&seed, -1.0, 1.0);
    for (size_t i = 0; i < c->k * c->n; i++) c->B[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->m * c->n * sizeof(double)); } /* NaN */
void hpc_candidate(void *p) { ctx_t *c = p; gemm(c->A, c->B, c->got, c->m, c->k, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t m = c->m, k = c->k, n = c->n;
    for (size_t i = 0; i < m; i++) {
        double *ci = c->want + i * n;
        for (size_t j = 0; j < n; j++) ci[j] = 0.0;
        for (size_t l = 0; l < k; l++) {
            double a = c->A[i * k + l];
            const double *bl = c->B + l * n;
            for (size_t j = 0; j < n; j++) ci[j] += a * bl[j];
        }
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* entries are sums of k products of values in [-1, 1] */
    return hpc_check_doubles(c->got, c->want, c->m * c->n, 1e-9, 1e-11 * (double)c->k, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->A); free(c->B); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->m * c->n * sizeof *c->got;
}
