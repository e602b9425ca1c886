/* Driver: sort -- void sort_by_magnitude(double *x, size_t n): ascending by |x|, a negative value
 * before the positive one of the same magnitude; in place.  Values are multiples of 0.125 in
 * (-12500, 12500), so equal magnitudes of both signs are common. */
#include "hpc_harness.h"

void sort_by_magnitude(double *x, size_t n);

typedef struct { size_t n; double *orig, *got, *want; } ctx_t;

static int cmp_mag(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    double ax = fabs(x), ay = fabs(y);
    if (ax != ay) return (ax > ay) - (ax < ay);
    return (x > y) - (x < y);
}
void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->orig = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->orig[i] = 0.125 * (double)hpc_rand_int(&seed, -99999, 100000);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memcpy(c->got, c->orig, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; sort_by_magnitude(c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    memcpy(c->want, c->orig, c->n * sizeof(double));
    qsort(c->want, c->n, sizeof(double), cmp_mag);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n, 0.0, 0.0, msg, len); /* values are moved: exact */
}
void hpc_free(void *p) { ctx_t *c = p; free(c->orig); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
