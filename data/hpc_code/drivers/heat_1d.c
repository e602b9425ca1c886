/* Driver: stencil -- void heat_1d(const double *u0, double *u, size_t n, int steps, double r):
 * `steps` explicit steps of the 1D heat equation with fixed (Dirichlet) end values.
 * The driver uses HEAT_STEPS steps and a stable r in [0.2, 0.45). */
#include "hpc_harness.h"

#define HEAT_STEPS 200

void heat_1d(const double *u0, double *u, size_t n, int steps, double r);

typedef struct { size_t n; double r; double *u0, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->u0 = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    c->r = hpc_rand_double(&seed, 0.2, 0.45);
    for (size_t i = 0; i < c->n; i++) c->u0[i] = hpc_rand_double(&seed, 0.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; heat_1d(c->u0, c->got, c->n, HEAT_STEPS, c->r); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    double r = c->r;
    double *a = c->want, *b = hpc_xmalloc(n * sizeof(double));
    memcpy(a, c->u0, n * sizeof(double));
    if (n > 0) { b[0] = a[0]; b[n - 1] = a[n - 1]; }
    for (int s = 0; s < HEAT_STEPS; s++) {
        for (size_t i = 1; i + 1 < n; i++) b[i] = a[i] + r * (a[i - 1] - 2.0 * a[i] + a[i + 1]);
        double *t = a; a = b; b = t;
    }
    if (a != c->want) { memcpy(c->want, a, n * sizeof(double)); b = a; }
    free(b);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* values stay in [0, 1]; the scheme is stable, so rounding differences do not grow */
    return hpc_check_doubles(c->got, c->want, c->n, 1e-9, 1e-9, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->u0); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
