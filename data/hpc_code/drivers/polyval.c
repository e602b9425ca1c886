/* Driver: transform -- void polyval(const double *coef, size_t degree, const double *x, double *y, size_t n);
 * y[i] = sum_{k<=degree} coef[k] * x[i]^k. */
#include "hpc_harness.h"

#define DEGREE 24
void polyval(const double *coef, size_t degree, const double *x, double *y, size_t n);

typedef struct { size_t n; double coef[DEGREE + 1]; double *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    for (int k = 0; k <= DEGREE; k++) c->coef[k] = hpc_rand_double(&seed, -1.0, 1.0);
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; polyval(c->coef, DEGREE, c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t i = 0; i < c->n; i++) {
        double xi = c->x[i], s = c->coef[DEGREE];
        for (int k = DEGREE - 1; k >= 0; k--) s = s * xi + c->coef[k];
        c->want[i] = s;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* |x| < 1 and |coef| < 1: any evaluation order errs by < DEGREE * 1e-16 * sum|coef| */
    return hpc_check_doubles(c->got, c->want, c->n, 1e-10, 1e-11, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
