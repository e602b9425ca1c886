/* Driver: sparse_la -- CSR matrix times dense matrix, C = A B,
 * void spmm(size_t n, const int *rowptr, const int *colidx, const double *values,
 *           const double *B, double *C, size_t k).
 * Square N x N sparse A with 1..31 nonzeros per row (random columns); B and C are N x 16
 * row-major. */
#include "hpc_harness.h"

void spmm(size_t n, const int *rowptr, const int *colidx, const double *values,
          const double *B, double *C, size_t k);

enum { NCOLS_B = 16 };
typedef struct { size_t n, k; int *rowptr, *col; double *val, *B, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    size_t n = c->n = (size_t)size;
    c->k = NCOLS_B;
    c->rowptr = hpc_xmalloc((n + 1) * sizeof(int));
    c->rowptr[0] = 0;
    for (size_t i = 0; i < n; i++) c->rowptr[i + 1] = c->rowptr[i] + (int)hpc_rand_int(&seed, 1, 32);
    size_t nnz = (size_t)c->rowptr[n];
    c->col = hpc_xmalloc(nnz * sizeof(int));
    c->val = hpc_xmalloc(nnz * sizeof(double));
    for (size_t e = 0; e < nnz; e++) {
        c->col[e] = (int)hpc_rand_int(&seed, 0, (long)n);
        c->val[e] = hpc_rand_double(&seed, -1.0, 1.0);
    }
    c->B = hpc_xmalloc(n * c->k * sizeof(double));
    for (size_t i = 0; i < n * c->k; i++) c->B[i] = hpc_rand_double(&seed, -1.0, 1.0);
    c->got = hpc_output_alloc(n * c->k * sizeof(double));
    c->want = hpc_xmalloc(n * c->k * sizeof(double));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * c->k * sizeof(double)); } /* NaN */
void hpc_candidate(void *p) {
    ctx_t *c = p;
    spmm(c->n, c->rowptr, c->col, c->val, c->B, c->got, c->k);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t k = c->k;
    for (size_t i = 0; i < c->n; i++) {
        double *ci = c->want + i * k;
        for (size_t r = 0; r < k; r++) ci[r] = 0.0;
        for (int e = c->rowptr[i]; e < c->rowptr[i + 1]; e++) {
            double a = c->val[e];
            const double *bj = c->B + (size_t)c->col[e] * k;
            for (size_t r = 0; r < k; r++) ci[r] += a * bj[r];
        }
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n * c->k, 1e-9, 1e-9, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->col); free(c->val); free(c->B); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * c->k * sizeof *c->got;
}
