/* Driver: scan -- void running_max(const int *x, int *out, size_t n);
 * out[i] = max(x[0], ..., x[i]).  x is a random walk that starts well below zero, so the
 * running maximum is often negative, keeps rising over the whole array, and a block that
 * ignores the maximum of the blocks before it is wrong. */
#include "hpc_harness.h"

void running_max(const int *x, int *out, size_t n);

typedef struct { size_t n; int *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    c->got = hpc_output_alloc(c->n * sizeof(int));
    c->want = hpc_xmalloc(c->n * sizeof(int));
    long v = hpc_rand_int(&seed, -2000000, -1000000);
    for (size_t i = 0; i < c->n; i++) {
        v += hpc_rand_int(&seed, -1000, 1001);
        c->x[i] = (int)v;
    }
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->n * sizeof(int)); }
void hpc_candidate(void *p) { ctx_t *c = p; running_max(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    if (c->n == 0) return;
    int m = c->x[0];
    for (size_t i = 0; i < c->n; i++) {
        if (c->x[i] > m) m = c->x[i];
        c->want[i] = m;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, c->n, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
