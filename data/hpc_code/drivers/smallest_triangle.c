/* Driver: geometry -- double smallest_triangle_area(const double *x, const double *y, size_t n);
 * smallest area of a triangle with vertices at three of the n points (O(n^3) triples).
 * Integer coordinates in [0, 2^20): twice an area is an integer below 2^41, exact in a
 * double, so every correct solution returns the same value. */
#include "hpc_harness.h"

double smallest_triangle_area(const double *x, const double *y, size_t n);

typedef struct { size_t n; double *x, *y; double got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->y = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) {
        c->x[i] = (double)hpc_rand_int(&seed, 0, 1L << 20);
        c->y[i] = (double)hpc_rand_int(&seed, 0, 1L << 20);
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = smallest_triangle_area(c->x, c->y, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    const double *x = c->x, *y = c->y;
    double best = INFINITY;
    for (size_t i = 0; i < c->n; i++)
        for (size_t j = i + 1; j < c->n; j++) {
            double ax = x[j] - x[i], ay = y[j] - y[i];
            for (size_t k = j + 1; k < c->n; k++) {
                double a2 = fabs(ax * (y[k] - y[i]) - ay * (x[k] - x[i]));
                if (a2 < best) best = a2;
            }
        }
    c->want = best / 2.0;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(&c->got, &c->want, 1, 1e-12, 1e-9, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c->y); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
