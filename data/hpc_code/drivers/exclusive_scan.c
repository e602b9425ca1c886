/* Driver: scan -- void exclusive_prefix_sum(const double *x, double *out, size_t n);
 * out[0] = 0, out[i] = x[0] + ... + x[i-1].  The values are non-negative, so every
 * summation order of the first i terms is within ~i*eps of the exact prefix sum
 * (relative): the check allows 2*n*DBL_EPSILON relative, far below one element. */
#include <float.h>
#include "hpc_harness.h"

void exclusive_prefix_sum(const double *x, double *out, size_t n);

typedef struct { size_t n; double *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, 0.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; exclusive_prefix_sum(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) {
        c->want[i] = s;
        s += c->x[i];
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n, 2.0 * (double)c->n * DBL_EPSILON, 1e-12, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
