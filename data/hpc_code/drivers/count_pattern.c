/* Driver: search -- long count_pattern(const int *x, size_t n, const int *pattern);
 * the number of i with x[i..i+3] == pattern[0..3] (overlapping matches count).
 * x is random over {0, 1, 2, 3} (a match every ~256 positions) and pattern = a b a b
 * (a != b, from the seed); stretches "a b a b ..." -- full of overlapping matches -- are
 * planted at random places and around every k/p of the array for p = 2..16, so a worker
 * that ignores matches straddling its block boundary, or counts without overlaps, is
 * wrong whatever the (near-even) split. */
#include "hpc_harness.h"

long count_pattern(const int *x, size_t n, const int *pattern);

typedef struct { size_t n; int *x; int pattern[4]; long got, want; } ctx_t;

static void plant(ctx_t *c, size_t lo, size_t hi) { /* a b a b ... over [lo, hi) */
    if (hi > c->n) hi = c->n;
    for (size_t i = lo; i < hi; i++) c->x[i] = c->pattern[(i - lo) & 1];
}

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    int a = (int)hpc_rand_int(&seed, 0, 4), b = (a + (int)hpc_rand_int(&seed, 1, 4)) % 4;
    c->pattern[0] = c->pattern[2] = a;
    c->pattern[1] = c->pattern[3] = b;
    for (size_t i = 0; i < c->n; i++) c->x[i] = (int)hpc_rand_int(&seed, 0, 4);
    for (size_t i = 0; i < c->n; i++)
        if (hpc_rand_int(&seed, 0, 5000) == 0) {
            size_t len = (size_t)hpc_rand_int(&seed, 4, 200);
            plant(c, i, i + len);
            i += len;
        }
    for (size_t p = 2; p <= 16; p++)
        for (size_t k = 1; k < p; k++) {
            size_t at = c->n * k / p, w = (size_t)hpc_rand_int(&seed, 40, 60);
            plant(c, at > w ? at - w : 0, at + (size_t)hpc_rand_int(&seed, 40, 60));
        }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = -2; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = count_pattern(c->x, c->n, c->pattern); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    const int *x = c->x, *q = c->pattern;
    long count = 0;
    for (size_t i = 0; i + 4 <= c->n; i++)
        if (x[i] == q[0] && x[i + 1] == q[1] && x[i + 2] == q[2] && x[i + 3] == q[3]) count++;
    c->want = count;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    if (c->got == c->want) return 1;
    snprintf(msg, len, "got %ld matches expected %ld", c->got, c->want);
    return 0;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
