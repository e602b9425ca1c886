/* Driver: search -- long closest_index(const double *x, size_t n, double target);
 * index of the element nearest to target (smallest |x[i] - target|), the smallest such
 * index on ties.  x is uniform in [0, 1) with nothing within 1e-6 of target, then five
 * planted values: target + 2d at 5-15% of the array (close, but not the closest), and
 * four at distance exactly d = 2^-30 -- target + d at some a in 30-45%, target - d at
 * a + 1..1000 (mostly in the same block), target - d at 55-70% and target + d at 85-95% --
 * so the answer is a, found only by a full scan that breaks ties towards the smaller index,
 * within a block and across blocks. */
#include "hpc_harness.h"

long closest_index(const double *x, size_t n, double target);

#define TARGET 0.3125
typedef struct { size_t n; double *x; long got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) {
        double v;
        do v = hpc_rand_double(&seed, 0.0, 1.0);
        while (fabs(v - TARGET) < 1e-6);
        c->x[i] = v;
    }
    if (c->n > 0) {
        const double d = 0x1.0p-30, last = (double)(c->n - 1);
        c->x[(size_t)(hpc_rand_double(&seed, 0.05, 0.15) * last)] = TARGET + 2 * d;
        c->x[(size_t)(hpc_rand_double(&seed, 0.85, 0.95) * last)] = TARGET + d;
        c->x[(size_t)(hpc_rand_double(&seed, 0.55, 0.70) * last)] = TARGET - d;
        size_t a = (size_t)(hpc_rand_double(&seed, 0.30, 0.45) * last);
        c->x[a + (size_t)hpc_rand_int(&seed, 1, 1001) % (c->n - a)] = TARGET - d;
        c->x[a] = TARGET + d;
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = -2; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = closest_index(c->x, c->n, TARGET); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    c->want = -1;
    double best = INFINITY;
    for (size_t i = 0; i < c->n; i++) {
        double dist = fabs(c->x[i] - TARGET);
        if (dist < best) {
            best = dist;
            c->want = (long)i;
        }
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    if (c->got == c->want) return 1;
    snprintf(msg, len, "got index %ld expected %ld", c->got, c->want);
    return 0;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
