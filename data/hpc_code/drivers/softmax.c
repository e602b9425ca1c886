/* Driver: transform -- void softmax(const double *x, double *y, size_t n);
 * y[i] = exp(x[i] - max_j x[j]) / sum_j exp(x[j] - max_j x[j]).
 * The inputs lie in [720, 730): exp(x) itself would overflow, so the max must be subtracted. */
#include "hpc_harness.h"

void softmax(const double *x, double *y, size_t n);

typedef struct { size_t n; double *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, 720.0, 730.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; softmax(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    double m = -INFINITY, s = 0.0;
    for (size_t i = 0; i < c->n; i++) m = c->x[i] > m ? c->x[i] : m;
    for (size_t i = 0; i < c->n; i++) {
        c->want[i] = exp(c->x[i] - m);
        s += c->want[i];
    }
    for (size_t i = 0; i < c->n; i++) c->want[i] /= s;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* relative: the outputs are ~1/n; reassociating the sum changes it by far less than 1e-9 */
    return hpc_check_doubles(c->got, c->want, c->n, 1e-9, 0.0, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
