/* Driver: sparse_la -- dot product of two sparse vectors with sorted indices,
 * double sparse_dot(const int *ia, const double *va, size_t na,
 *                   const int *ib, const double *vb, size_t nb).
 * Problem size N gives na = N entries (index gaps 1..4) and nb = 4N/3 + 1 entries (gaps
 * 1..3), both starting at a random index below 8: about a third of the entries of a meet
 * one of b. Values in [-1, 1). */
#include "hpc_harness.h"

double sparse_dot(const int *ia, const double *va, size_t na,
                  const int *ib, const double *vb, size_t nb);

typedef struct { size_t na, nb; int *ia, *ib; double *va, *vb; double got, want; } ctx_t;

static void fill(int *idx, double *val, size_t len, long maxgap, uint64_t *seed) {
    long at = hpc_rand_int(seed, 0, 8);
    for (size_t i = 0; i < len; i++) {
        idx[i] = (int)at;
        val[i] = hpc_rand_double(seed, -1.0, 1.0);
        at += hpc_rand_int(seed, 1, maxgap + 1);
    }
}
void *hpc_setup(long size, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->na = (size_t)size;
    c->nb = (size_t)size * 4 / 3 + 1;
    c->ia = hpc_xmalloc(c->na * sizeof(int));
    c->va = hpc_xmalloc(c->na * sizeof(double));
    c->ib = hpc_xmalloc(c->nb * sizeof(int));
    c->vb = hpc_xmalloc(c->nb * sizeof(double));
    fill(c->ia, c->va, c->na, 4, &seed);
    fill(c->ib, c->vb, c->nb, 3, &seed);
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = sparse_dot(c->ia, c->va, c->na, c->ib, c->vb, c->nb); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t i = 0, j = 0;
    double s = 0.0;
    while (i < c->na && j < c->nb) {
        if (c->ia[i] < c->ib[j]) i++;
        else if (c->ia[i] > c->ib[j]) j++;
        else s += c->va[i++] * c->vb[j++];
    }
    c->want = s;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* a sum of fewer than na products in [-1, 1]: reassociation errors stay far below 1e-12 * na */
    return hpc_check_doubles(&c->got, &c->want, 1, 1e-12, 1e-12 * (double)c->na, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->ia); free(c->va); free(c->ib); free(c->vb); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
