/* Driver: search -- long find_last(const int *x, size_t n, int target);
 * index of the last occurrence of target, or -1.  The target occurs twice, at a random
 * place in 5-15% and one in 30-40% of the array, so a serial scan from the end still
 * reads most of it and a parallel search must return the *last* hit. */
#include "hpc_harness.h"

long find_last(const int *x, size_t n, int target);

#define TARGET 42
typedef struct { size_t n; int *x; long got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    for (size_t i = 0; i < c->n; i++) {
        int v = (int)hpc_rand_int(&seed, 0, 1000000);
        c->x[i] = v == TARGET ? TARGET + 1 : v;
    }
    if (c->n > 0) {
        double last = (double)(c->n - 1);
        c->x[(size_t)(hpc_rand_double(&seed, 0.05, 0.15) * last)] = TARGET;
        c->x[(size_t)(hpc_rand_double(&seed, 0.30, 0.40) * last)] = TARGET;
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = -2; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = find_last(c->x, c->n, TARGET); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    c->want = -1;
    for (size_t i = c->n; i-- > 0;)
        if (c->x[i] == TARGET) { c->want = (long)i; break; }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    if (c->got == c->want) return 1;
    snprintf(msg, len, "got index %ld expected %ld", c->got, c->want);
    return 0;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
