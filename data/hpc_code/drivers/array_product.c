/* Driver: reduce -- double array_product(const double *x, size_t n).
 * Factors near 1: 1 +/- [1e-4, 1e-3) with a random sign, so the product stays in range for
 * any n used here while leaving out (or repeating) any factor changes it by >= 1e-4. */
#include "hpc_harness.h"

double array_product(const double *x, size_t n);

typedef struct { size_t n; double *x; double got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) {
        double d = hpc_rand_double(&seed, 1e-4, 1e-3);
        c->x[i] = hpc_rand_int(&seed, 0, 2) ? 1.0 + d : 1.0 - d;
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = array_product(c->x, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double s = 1.0;
    for (size_t i = 0; i < c->n; i++) s *= c->x[i];
    c->want = s;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* every product order has a relative error below ~n*eps (2.2e-16 each); 1e-15*n + 1e-12 is
     * far below the 1e-4 relative change of a wrong factor for any size used here */
    return hpc_check_doubles(&c->got, &c->want, 1, 1e-15 * (double)c->n + 1e-12, 0.0, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
