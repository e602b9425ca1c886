/* Driver: stencil -- void jacobi_2d(const double *in, double *out, size_t n). */
#include "hpc_harness.h"

void jacobi_2d(const double *in, double *out, size_t n);

typedef struct { size_t n; double *in, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    size_t nn = c->n * c->n;
    c->in = hpc_xmalloc(nn * sizeof(double));
    c->got = hpc_output_alloc(nn * sizeof(double));
    c->want = hpc_xmalloc(nn * sizeof(double));
    for (size_t i = 0; i < nn; i++) c->in[i] = hpc_rand_double(&seed, 0.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; jacobi_2d(c->in, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    const double *a = c->in;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            double s = a[i * n + j];
            if (i > 0) s += a[(i - 1) * n + j];
            if (i + 1 < n) s += a[(i + 1) * n + j];
            if (j > 0) s += a[i * n + j - 1];
            if (j + 1 < n) s += a[i * n + j + 1];
            c->want[i * n + j] = 0.2 * s;
        }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n * c->n, 1e-12, 1e-12, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->in); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * c->n * sizeof *c->got;
}
