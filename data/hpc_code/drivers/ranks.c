/* Driver: sort -- void element_ranks(const double *x, size_t *ranks, size_t n): ranks[i] = the
 * position of x[i] in the stable ascending sort of x (equal values ranked by index).  Values are
 * multiples of 0.25 with about 4 copies of each, so the tie rule matters. */
#include "hpc_harness.h"

void element_ranks(const double *x, size_t *ranks, size_t n);

typedef struct { size_t n; double *x; size_t *got, *want; } ctx_t;
typedef struct { double v; size_t idx; } vidx_t;

static int cmp_vidx(const void *a, const void *b) {
    const vidx_t *x = a, *y = b;
    if (x->v != y->v) return (x->v > y->v) - (x->v < y->v);
    return (x->idx > y->idx) - (x->idx < y->idx);
}
void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(size_t));
    c->want = hpc_xmalloc(c->n * sizeof(size_t));
    long half = (long)(c->n / 8) + 1;
    for (size_t i = 0; i < c->n; i++) c->x[i] = 0.25 * (double)hpc_rand_int(&seed, -half, half);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->n * sizeof(size_t)); }
void hpc_candidate(void *p) { ctx_t *c = p; element_ranks(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    vidx_t *t = hpc_xmalloc(c->n * sizeof *t);
    for (size_t i = 0; i < c->n; i++) { t[i].v = c->x[i]; t[i].idx = i; }
    qsort(t, c->n, sizeof *t, cmp_vidx);
    for (size_t p = 0; p < c->n; p++) c->want[t[p].idx] = p;
    free(t);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    for (size_t i = 0; i < c->n; i++)
        if (c->got[i] != c->want[i]) {
            snprintf(msg, len, "index %zu: got %zu expected %zu", i, c->got[i], c->want[i]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
