/* Driver: sparse_la -- Jacobi iteration for A x = b with a CSR matrix,
 * void jacobi_csr(size_t n, const int *rowptr, const int *colidx, const double *values,
 *                 const double *b, double *x, int iters).
 * Problem size N gives an N x N strictly diagonally dominant matrix: every row holds 2..16
 * off-diagonal entries (distinct random columns, values in [-1, 1)) and its diagonal entry
 * (sum of the row's |off-diagonals| + U[1, 2)) once, at a random position in the row.
 * x holds a random initial guess; the function runs SWEEPS sweeps in place. */
#include "hpc_harness.h"

void jacobi_csr(size_t n, const int *rowptr, const int *colidx, const double *values,
                const double *b, double *x, int iters);

enum { SWEEPS = 11 }; /* odd: the result of the last sweep is not where an even count leaves it */
typedef struct { size_t n; int *rowptr, *col; double *val, *b, *x0, *tmp, *got, *want; } ctx_t;

void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    size_t n = c->n = (size_t)size;
    c->rowptr = hpc_xmalloc((n + 1) * sizeof(int));
    c->rowptr[0] = 0;
    for (size_t i = 0; i < n; i++) {
        long off = hpc_rand_int(&seed, 2, 17);
        if ((size_t)off > n - 1) off = (long)n - 1; /* tiny matrices: at most n-1 other columns */
        c->rowptr[i + 1] = c->rowptr[i] + (int)off + 1;
    }
    size_t nnz = (size_t)c->rowptr[n];
    c->col = hpc_xmalloc(nnz * sizeof(int));
    c->val = hpc_xmalloc(nnz * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        int lo = c->rowptr[i], hi = c->rowptr[i + 1];
        int diag = lo + (int)hpc_rand_int(&seed, 0, hi - lo);
        double sum = 0.0;
        for (int e = lo; e < hi; e++) {
            if (e == diag) continue;
            int j, dup;
            do { /* a column other than i and than the row's earlier ones */
                j = (int)hpc_rand_int(&seed, 0, (long)n);
                dup = j == (int)i;
                for (int f = lo; f < e && !dup; f++) dup = f != diag && c->col[f] == j;
            } while (dup);
            c->col[e] = j;
            c->val[e] = hpc_rand_double(&seed, -1.0, 1.0);
            sum += fabs(c->val[e]);
        }
        c->col[diag] = (int)i;
        c->val[diag] = sum + hpc_rand_double(&seed, 1.0, 2.0);
    }
    c->b = hpc_xmalloc(n * sizeof(double));
    c->x0 = hpc_xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) c->b[i] = hpc_rand_double(&seed, -1.0, 1.0);
    for (size_t i = 0; i < n; i++) c->x0[i] = hpc_rand_double(&seed, -1.0, 1.0);
    c->tmp = hpc_xmalloc(n * sizeof(double));
    c->got = hpc_output_alloc(n * sizeof(double));
    c->want = hpc_xmalloc(n * sizeof(double));
    return c;
}
/* x is updated in place: give the function the initial guess before every run */
void hpc_reset(void *p) { ctx_t *c = p; memcpy(c->got, c->x0, c->n * sizeof(double)); }
void hpc_candidate(void *p) {
    ctx_t *c = p;
    jacobi_csr(c->n, c->rowptr, c->col, c->val, c->b, c->got, SWEEPS);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double *cur = c->want, *next = c->tmp;
    memcpy(cur, c->x0, c->n * sizeof(double));
    for (int it = 0; it < SWEEPS; it++) {
        for (size_t i = 0; i < c->n; i++) {
            double s = c->b[i], d = 0.0;
            for (int e = c->rowptr[i]; e < c->rowptr[i + 1]; e++) {
                if ((size_t)c->col[e] == i) d = c->val[e];
                else s -= c->val[e] * cur[c->col[e]];
            }
            next[i] = s / d;
        }
        double *t = cur; cur = next; next = t;
    }
    if (cur != c->want) memcpy(c->want, cur, c->n * sizeof(double));
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* a contraction: differences in summation order do not grow over the sweeps */
    return hpc_check_doubles(c->got, c->want, c->n, 1e-9, 1e-12, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->col); free(c->val); free(c->b); free(c->x0); free(c->tmp);
    hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
