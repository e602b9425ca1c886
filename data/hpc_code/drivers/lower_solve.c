/* Driver: dense_la -- forward substitution with several right-hand sides, L X = B,
 * void lower_solve(const double *L, const double *B, double *X, size_t n, size_t k).
 * Problem size N gives n = N, k = N/12 + 3 right-hand sides; L is N x N row-major, lower
 * triangular (off-diagonal entries in [-1, 1), diagonal +-(2..4) sqrt(N)); the entries above the
 * diagonal are filled with garbage (NaN) that a correct solution never reads. */
#include "hpc_harness.h"

void lower_solve(const double *L, const double *B, double *X, size_t n, size_t k);

typedef struct { size_t n, k; double *L, *B, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    size_t n = c->n = (size_t)size, k = c->k = (size_t)size / 12 + 3;
    c->L = hpc_xmalloc(n * n * sizeof(double));
    c->B = hpc_xmalloc(n * k * sizeof(double));
    c->got = hpc_output_alloc(n * k * sizeof(double));
    c->want = hpc_xmalloc(n * k * sizeof(double));
    double scale = sqrt((double)n);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) c->L[i * n + j] = hpc_rand_double(&seed, -1.0, 1.0);
        double d = scale * hpc_rand_double(&seed, 2.0, 4.0);
        c->L[i * n + i] = (hpc_rand_u64(&seed) & 1) ? d : -d;
        for (size_t j = i + 1; j < n; j++) c->L[i * n + j] = NAN;
    }
    for (size_t i = 0; i < n * k; i++) c->B[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * c->k * sizeof(double)); } /* NaN */
void hpc_candidate(void *p) { ctx_t *c = p; lower_solve(c->L, c->B, c->got, c->n, c->k); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n, k = c->k;
    double *X = c->want;
    for (size_t i = 0; i < n; i++) {
        double *xi = X + i * k;
        const double *li = c->L + i * n;
        for (size_t r = 0; r < k; r++) xi[r] = c->B[i * k + r];
        for (size_t j = 0; j < i; j++) {
            double l = li[j];
            const double *xj = X + j * k;
            for (size_t r = 0; r < k; r++) xi[r] -= l * xj[r];
        }
        for (size_t r = 0; r < k; r++) xi[r] /= li[i];
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* the solution entries are O(1/sqrt(n)) and the substitution is well conditioned */
    return hpc_check_doubles(c->got, c->want, c->n * c->k, 1e-8, 1e-12, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->L); free(c->B); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * c->k * sizeof *c->got;
}
