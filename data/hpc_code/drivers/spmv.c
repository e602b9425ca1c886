/* Driver: sparse_la -- CSR y = A x,
 * void spmv(size_t nrows, const int *rowptr, const int *colidx, const double *values,
 *           const double *x, double *y).
 * Square N x N matrix with a variable number (1..31) of nonzeros per row. */
#include "hpc_harness.h"

void spmv(size_t nrows, const int *rowptr, const int *colidx, const double *values,
          const double *x, double *y);

typedef struct { size_t n; int *rowptr, *col; double *val, *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->rowptr = hpc_xmalloc((c->n + 1) * sizeof(int));
    c->rowptr[0] = 0;
    for (size_t i = 0; i < c->n; i++) c->rowptr[i + 1] = c->rowptr[i] + (int)hpc_rand_int(&seed, 1, 32);
    size_t nnz = (size_t)c->rowptr[c->n];
    c->col = hpc_xmalloc(nnz * sizeof(int));
    c->val = hpc_xmalloc(nnz * sizeof(double));
    for (size_t k = 0; k < nnz; k++) {
        c->col[k] = (int)hpc_rand_int(&seed, 0, (long)c->n);
        c->val[k] = hpc_rand_double(&seed, -1.0, 1.0);
    }
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) {
    ctx_t *c = p;
    spmv(c->n, c->rowptr, c->col, c->val, c->x, c->got);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t i = 0; i < c->n; i++) {
        double s = 0.0;
        for (int k = c->rowptr[i]; k < c->rowptr[i + 1]; k++) s += c->val[k] * c->x[c->col[k]];
        c->want[i] = s;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n, 1e-9, 1e-9, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->col); free(c->val); free(c->x); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
