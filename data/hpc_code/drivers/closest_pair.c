/* Driver: geometry -- double closest_pair(const double *x, const double *y, size_t n);
 * smallest Euclidean distance between two distinct points. */
#include "hpc_harness.h"

double closest_pair(const double *x, const double *y, size_t n);

typedef struct { size_t n; double *x, *y; double got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->y = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) {
        c->x[i] = hpc_rand_double(&seed, 0.0, 1000.0);
        c->y[i] = hpc_rand_double(&seed, 0.0, 1000.0);
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = closest_pair(c->x, c->y, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double best = INFINITY;
    for (size_t i = 0; i < c->n; i++)
        for (size_t j = i + 1; j < c->n; j++) {
            double dx = c->x[i] - c->x[j], dy = c->y[i] - c->y[j];
            double d2 = dx * dx + dy * dy;
            if (d2 < best) best = d2;
        }
    c->want = sqrt(best);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(&c->got, &c->want, 1, 1e-9, 1e-12, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c->y); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
