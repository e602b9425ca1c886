/* Driver: reduce -- double dot_product(const double *x, const double *y, size_t n). */
#include "hpc_harness.h"

double dot_product(const double *x, const double *y, size_t n);

typedef struct { size_t n; double *x, *y; double got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->y = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) {
        c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
        c->y[i] = hpc_rand_double(&seed, -0.5, 1.5); /* a positive mean: the result grows with n */
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = dot_product(c->x, c->y, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) s += c->x[i] * c->y[i];
    c->want = s;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* reassociation error is bounded by ~n*eps*sum|x*y|, and sum|x*y| <= 1.5 n; one term
     * left out or counted twice changes the result by |x*y|, rarely below 1e-3 */
    return hpc_check_doubles(&c->got, &c->want, 1, 0.0, 1e-9 * (double)c->n, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c->y); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
