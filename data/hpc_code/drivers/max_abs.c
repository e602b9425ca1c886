/* Driver: reduce -- double max_abs(const double *x, size_t n).
 * Values in [-100, 100) plus one planted value of larger magnitude, negative and at a random
 * position, so that a plain max (without fabs) and a sign-keeping answer both fail. */
#include "hpc_harness.h"

double max_abs(const double *x, size_t n);

typedef struct { size_t n; double *x; double got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -100.0, 100.0);
    if (c->n > 0) c->x[hpc_rand_int(&seed, 0, (long)c->n)] = -hpc_rand_double(&seed, 150.0, 250.0);
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = max_abs(c->x, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double m = 0.0;
    for (size_t i = 0; i < c->n; i++) {
        double a = fabs(c->x[i]);
        if (a > m) m = a;
    }
    c->want = m;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* a maximum is exact whatever the order */
    return hpc_check_doubles(&c->got, &c->want, 1, 0.0, 0.0, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
