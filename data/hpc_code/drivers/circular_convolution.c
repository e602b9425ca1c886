/* Driver: fft -- void circular_convolution(const double *x, const double *h, double *y, size_t n);
 * y[k] = sum_j x[j] * h[(k - j) mod n]. */
#include "hpc_harness.h"

void circular_convolution(const double *x, const double *h, double *y, size_t n);

typedef struct { size_t n; double *x, *h, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->h = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    for (size_t i = 0; i < c->n; i++) c->h[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; circular_convolution(c->x, c->h, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    const double *x = c->x, *h = c->h;
    for (size_t k = 0; k < n; k++) {
        double s = 0.0;
        for (size_t j = 0; j <= k; j++) s += x[j] * h[k - j];
        for (size_t j = k + 1; j < n; j++) s += x[j] * h[n + k - j];
        c->want[k] = s;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* outputs are O(sqrt(n)); reassociation (or an FFT-based method) errs by far less than 1e-10 n */
    return hpc_check_doubles(c->got, c->want, c->n, 1e-9, 1e-10 * (double)c->n, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->x); free(c->h); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
