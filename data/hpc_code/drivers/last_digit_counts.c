/* Driver: histogram -- void last_digit_counts(const int *x, size_t n, size_t *counts).
 * Values in (-10^9, 10^9), about half of them negative. */
#include "hpc_harness.h"

#define NDIGITS 10
void last_digit_counts(const int *x, size_t n, size_t *counts);

typedef struct { size_t n; int *x; size_t *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    c->got = hpc_output_alloc(NDIGITS * sizeof(size_t));
    c->want = hpc_xmalloc(NDIGITS * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        /* skewed digits: small magnitudes are frequent, so the counts differ from bin to bin */
        long mag = hpc_rand_int(&seed, 0, 100) < 40 ? hpc_rand_int(&seed, 0, 7) : hpc_rand_int(&seed, 0, 1000000000);
        c->x[i] = (int)(hpc_rand_int(&seed, 0, 2) ? -mag : mag);
    }
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, NDIGITS * sizeof(size_t)); }
void hpc_candidate(void *p) { ctx_t *c = p; last_digit_counts(c->x, c->n, c->got); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    memset(c->want, 0, NDIGITS * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        int v = c->x[i];
        c->want[(v < 0 ? -v : v) % 10]++;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    for (int d = 0; d < NDIGITS; d++)
        if (c->got[d] != c->want[d]) {
            snprintf(msg, len, "digit %d: got %zu expected %zu", d, c->got[d], c->want[d]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return NDIGITS * sizeof(size_t);
}
