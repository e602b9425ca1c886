/* Driver: histogram -- void histogram(const int *x, size_t n, size_t *bins, int nbins). */
#include "hpc_harness.h"

#define NBINS 256
void histogram(const int *x, size_t n, size_t *bins, int nbins);

typedef struct { size_t n; int *x; size_t got[NBINS], want[NBINS]; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    /* skewed: the sum of two uniforms gives a triangular distribution */
    for (size_t i = 0; i < c->n; i++)
        c->x[i] = (int)((hpc_rand_int(&seed, 0, NBINS) + hpc_rand_int(&seed, 0, NBINS)) / 2);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0, sizeof c->got); }
void hpc_candidate(void *p) { ctx_t *c = p; histogram(c->x, c->n, c->got, NBINS); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    memset(c->want, 0, sizeof c->want);
    for (size_t i = 0; i < c->n; i++) c->want[c->x[i]]++;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    for (int b = 0; b < NBINS; b++)
        if (c->got[b] != c->want[b]) {
            snprintf(msg, len, "bin %d: got %zu expected %zu", b, c->got[b], c->want[b]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return sizeof c->got;
}
