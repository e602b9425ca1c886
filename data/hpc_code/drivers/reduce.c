/* Driver: reduce -- double array_sum(const double *x, size_t n). */
#include "hpc_harness.h"

double array_sum(const double *x, size_t n);

typedef struct { size_t n; double *x; double got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = array_sum(c->x, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) s += c->x[i];
    c->want = s;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* reassociation error is bounded by ~n*eps*sum|x|; n/2 is E[sum|x|] */
    return hpc_check_doubles(&c->got, &c->want, 1, 0.0, 1e-9 * (double)c->n, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
