/* Driver: sparse_la -- CSR transpose-multiply y = A^T x,
 * void spmv_transpose(size_t nrows, size_t ncols, const int *rowptr, const int *colidx,
 *                     const double *values, const double *x, double *y).
 * Problem size N gives nrows = N, ncols = 3N/2 + 1, 1..31 nonzeros per row in random columns
 * below ncols - ncols/8 (so the last columns, and a few others, hold no nonzero: their y is 0). */
#include "hpc_harness.h"

void spmv_transpose(size_t nrows, size_t ncols, const int *rowptr, const int *colidx,
                    const double *values, const double *x, double *y);

typedef struct { size_t nrows, ncols; int *rowptr, *col; double *val, *x, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    size_t m = c->nrows = (size_t)size, n = c->ncols = (size_t)size * 3 / 2 + 1;
    c->rowptr = hpc_xmalloc((m + 1) * sizeof(int));
    c->rowptr[0] = 0;
    for (size_t i = 0; i < m; i++) c->rowptr[i + 1] = c->rowptr[i] + (int)hpc_rand_int(&seed, 1, 32);
    size_t nnz = (size_t)c->rowptr[m];
    c->col = hpc_xmalloc(nnz * sizeof(int));
    c->val = hpc_xmalloc(nnz * sizeof(double));
    for (size_t e = 0; e < nnz; e++) {
        c->col[e] = (int)hpc_rand_int(&seed, 0, (long)(n - n / 8));
        c->val[e] = hpc_rand_double(&seed, -1.0, 1.0);
    }
    c->x = hpc_xmalloc(m * sizeof(double));
    for (size_t i = 0; i < m; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    c->got = hpc_output_alloc(n * sizeof(double));
    c->want = hpc_xmalloc(n * sizeof(double));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->ncols * sizeof(double)); } /* NaN */
void hpc_candidate(void *p) {
    ctx_t *c = p;
    spmv_transpose(c->nrows, c->ncols, c->rowptr, c->col, c->val, c->x, c->got);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t j = 0; j < c->ncols; j++) c->want[j] = 0.0;
    for (size_t i = 0; i < c->nrows; i++) {
        double xi = c->x[i];
        for (int e = c->rowptr[i]; e < c->rowptr[i + 1]; e++) c->want[c->col[e]] += c->val[e] * xi;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->ncols, 1e-9, 1e-9, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->col); free(c->val); free(c->x); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->ncols * sizeof *c->got;
}
