/* Driver: sort -- void sort_pairs_by_key(int *keys, double *values, size_t n): stable sort of
 * (key, value) pairs by key, ascending, in place.  Many equal keys (about 4 pairs per key), so
 * the order of the values checks stability.  The output buffer holds the n values, then the n keys. */
#include "hpc_harness.h"

void sort_pairs_by_key(int *keys, double *values, size_t n);

typedef struct { size_t n; int *okeys; double *ovals; char *got, *want; } ctx_t;
typedef struct { int key; size_t idx; } kidx_t;

static int cmp_kidx(const void *a, const void *b) {
    const kidx_t *x = a, *y = b;
    if (x->key != y->key) return (x->key > y->key) - (x->key < y->key);
    return (x->idx > y->idx) - (x->idx < y->idx);
}
void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    size_t bytes = c->n * (sizeof(double) + sizeof(int));
    c->okeys = hpc_xmalloc(c->n * sizeof(int));
    c->ovals = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(bytes);
    c->want = hpc_xmalloc(bytes);
    long nkeys = (long)(c->n / 8) + 1;
    for (size_t i = 0; i < c->n; i++) {
        c->okeys[i] = (int)hpc_rand_int(&seed, -nkeys, nkeys);
        c->ovals[i] = hpc_rand_double(&seed, -1.0, 1.0);
    }
    return c;
}
void hpc_reset(void *p) {
    ctx_t *c = p;
    memcpy(c->got, c->ovals, c->n * sizeof(double));
    memcpy(c->got + c->n * sizeof(double), c->okeys, c->n * sizeof(int));
}
void hpc_candidate(void *p) {
    ctx_t *c = p;
    sort_pairs_by_key((int *)(c->got + c->n * sizeof(double)), (double *)c->got, c->n);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    kidx_t *t = hpc_xmalloc(c->n * sizeof *t);
    for (size_t i = 0; i < c->n; i++) { t[i].key = c->okeys[i]; t[i].idx = i; }
    qsort(t, c->n, sizeof *t, cmp_kidx); /* ties by original index: stable */
    double *vals = (double *)c->want;
    int *keys = (int *)(c->want + c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) { keys[i] = t[i].key; vals[i] = c->ovals[t[i].idx]; }
    free(t);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    const int *gk = (const int *)(c->got + c->n * sizeof(double)), *wk = (const int *)(c->want + c->n * sizeof(double));
    const double *gv = (const double *)c->got, *wv = (const double *)c->want;
    for (size_t i = 0; i < c->n; i++)
        if (gk[i] != wk[i]) {
            snprintf(msg, len, "keys index %zu: got %d expected %d", i, gk[i], wk[i]);
            return 0;
        }
    for (size_t i = 0; i < c->n; i++)
        if (!(gv[i] == wv[i])) { /* values are moved, never computed: exact */
            snprintf(msg, len, "values index %zu: got %.17g expected %.17g (not a stable sort?)", i, gv[i], wv[i]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->okeys); free(c->ovals); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * (sizeof(double) + sizeof(int));
}
