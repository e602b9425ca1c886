/* Driver: histogram -- void bin_doubles(const double *x, size_t n, size_t *bins, size_t nbins).
 * Equal-width bins over [0, 1); no value lies within 1e-7 of a bin edge (relative to the bin
 * width), so x*nbins, x/(1.0/nbins) and floor() all agree on the bin. */
#include "hpc_harness.h"

#define NBINS 100
void bin_doubles(const double *x, size_t n, size_t *bins, size_t nbins);

typedef struct { size_t n; double *x; size_t *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(NBINS * sizeof(size_t));
    c->want = hpc_xmalloc(NBINS * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        double v, f;
        do { /* skewed towards 0 (u^2), away from the bin edges */
            double u = hpc_rand_double(&seed, 0.0, 1.0);
            v = u * u;
            f = v * NBINS - floor(v * NBINS);
        } while (f < 1e-7 || f > 1.0 - 1e-7);
        c->x[i] = v;
    }
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, NBINS * sizeof(size_t)); }
void hpc_candidate(void *p) { ctx_t *c = p; bin_doubles(c->x, c->n, c->got, NBINS); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    memset(c->want, 0, NBINS * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) c->want[(size_t)(c->x[i] * NBINS)]++;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    for (size_t b = 0; b < NBINS; b++)
        if (c->got[b] != c->want[b]) {
            snprintf(msg, len, "bin %zu: got %zu expected %zu", b, c->got[b], c->want[b]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return NBINS * sizeof(size_t);
}
