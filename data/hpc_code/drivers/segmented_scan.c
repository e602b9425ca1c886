/* Driver: scan -- void segmented_prefix_sum(const long long *x, const int *flags,
 *                                           long long *out, size_t n);
 * inclusive prefix sum that restarts at every i with flags[i] != 0 (and at i = 0).
 * Segments are 1..2000 long (a flag with probability 1/1000, some flags are 2 or -1),
 * except one segment without any flag from ~40% to ~75% of the array: it spans
 * whole blocks once there are three or more workers, and the block boundary at 50%. */
#include "hpc_harness.h"

void segmented_prefix_sum(const long long *x, const int *flags, long long *out, size_t n);

typedef struct { size_t n; long long *x, *got, *want; int *flags; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(long long));
    c->flags = hpc_xmalloc(c->n * sizeof(int));
    c->got = hpc_output_alloc(c->n * sizeof(long long));
    c->want = hpc_xmalloc(c->n * sizeof(long long));
    size_t quiet_lo = (size_t)(0.4 * (double)c->n), quiet_hi = (size_t)(0.75 * (double)c->n);
    for (size_t i = 0; i < c->n; i++) {
        c->x[i] = hpc_rand_int(&seed, -1000, 1000);
        long r = hpc_rand_int(&seed, 0, 1000);
        c->flags[i] = (r == 0) ? (hpc_rand_int(&seed, 0, 4) == 0 ? -1 : (int)hpc_rand_int(&seed, 1, 3)) : 0;
        if (i > quiet_lo && i < quiet_hi) c->flags[i] = 0;
    }
    if (c->n > 0) c->flags[0] = 0; /* index 0 starts a segment anyway */
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->n * sizeof(long long)); }
void hpc_candidate(void *p) { ctx_t *c = p; segmented_prefix_sum(c->x, c->flags, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    long long s = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->flags[i]) s = 0;
        s += c->x[i];
        c->want[i] = s;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_longs(c->got, c->want, c->n, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->x);
    free(c->flags);
    hpc_output_free(c->got);
    free(c->want);
    free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
