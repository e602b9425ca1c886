/* Driver: transform -- void huber(const double *x, double *y, size_t n, double delta);
 * y[i] = x^2 / 2 if |x[i]| <= delta, else delta * (|x[i]| - delta / 2). */
#include "hpc_harness.h"

#define DELTA 1.5
void huber(const double *x, double *y, size_t n, double delta);

typedef struct { size_t n; double *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -4.0, 4.0);
    if (c->n > 1) { c->x[0] = DELTA; c->x[1] = -DELTA; }  /* both sides of the boundary */
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; huber(c->x, c->got, c->n, DELTA); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t i = 0; i < c->n; i++) {
        double a = fabs(c->x[i]);
        c->want[i] = a <= DELTA ? 0.5 * c->x[i] * c->x[i] : DELTA * (a - 0.5 * DELTA);
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n, 1e-12, 1e-15, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
