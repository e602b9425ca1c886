/* Driver: histogram -- void histogram_2d(const double *x, const double *y, size_t n,
 *                                        size_t *counts, size_t nx, size_t ny).
 * Points in [0,1) x [0,1), clustered; no coordinate lies within 1e-7 of a cell edge
 * (relative to the cell width). */
#include "hpc_harness.h"

#define NX 64
#define NY 48
void histogram_2d(const double *x, const double *y, size_t n, size_t *counts, size_t nx, size_t ny);

typedef struct { size_t n; double *x, *y; size_t *got, *want; } ctx_t;

/* a coordinate in [0,1) that is not within 1e-7 cell widths of an edge of the `cells` cells */
static double coord(uint64_t *seed, int cells, int triangular) {
    double v, f;
    do {
        double u = hpc_rand_double(seed, 0.0, 1.0);
        v = triangular ? 0.5 * (u + hpc_rand_double(seed, 0.0, 1.0)) : u * u;
        f = v * cells - floor(v * cells);
    } while (f < 1e-7 || f > 1.0 - 1e-7);
    return v;
}

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->y = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(NX * NY * sizeof(size_t));
    c->want = hpc_xmalloc(NX * NY * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        c->x[i] = coord(&seed, NX, 1);
        c->y[i] = coord(&seed, NY, 0);
    }
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, NX * NY * sizeof(size_t)); }
void hpc_candidate(void *p) { ctx_t *c = p; histogram_2d(c->x, c->y, c->n, c->got, NX, NY); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    memset(c->want, 0, NX * NY * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        size_t ix = (size_t)(c->x[i] * NX), iy = (size_t)(c->y[i] * NY);
        c->want[iy * NX + ix]++;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    for (size_t b = 0; b < NX * NY; b++)
        if (c->got[b] != c->want[b]) {
            snprintf(msg, len, "cell (row %zu, column %zu): got %zu expected %zu", b / NX, b % NX, c->got[b],
                     c->want[b]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->x);
    free(c->y);
    hpc_output_free(c->got);
    free(c->want);
    free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return NX * NY * sizeof(size_t);
}
