/* Driver: reduce -- size_t index_of_min(const int *x, size_t n).
 * Values in [-10^9, 10^9); the minimum (below that range) is planted once in each eighth of
 * the last two thirds of x, so it is tied across MPI ranks / threads (2 or more) and its
 * first occurrence is not at the start. */
#include "hpc_harness.h"

size_t index_of_min(const int *x, size_t n);

typedef struct { size_t n; int *x; size_t got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    for (size_t i = 0; i < c->n; i++) c->x[i] = (int)hpc_rand_int(&seed, -1000000000, 1000000000);
    if (c->n > 0) {
        /* one copy of the minimum at a random position in each eighth of [n/3, n) */
        int low = (int)hpc_rand_int(&seed, -2000000000, -1000000000);
        size_t from = c->n / 3, span = c->n - from;
        for (size_t k = 0; k < 8; k++) {
            size_t a = from + span * k / 8, b = from + span * (k + 1) / 8;
            if (b > a) c->x[a + (size_t)hpc_rand_int(&seed, 0, (long)(b - a))] = low;
        }
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = (size_t)-1; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = index_of_min(c->x, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t best = 0;
    int v = c->n > 0 ? c->x[0] : 0;
    for (size_t i = 1; i < c->n; i++)
        if (c->x[i] < v) {
            v = c->x[i];
            best = i;
        }
    c->want = best;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    if (c->got == c->want) return 1;
    if (c->got < c->n)
        snprintf(msg, len, "got index %zu (value %d) expected %zu (value %d)", c->got, c->x[c->got], c->want,
                 c->x[c->want]);
    else
        snprintf(msg, len, "got index %zu (out of range) expected %zu", c->got, c->want);
    return 0;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
