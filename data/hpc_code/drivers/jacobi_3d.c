/* Driver: stencil -- void jacobi_3d(const double *in, double *out, size_t n): one Jacobi step of
 * a 7-point stencil on an n x n x n grid, out-of-grid neighbours 0. */
#include "hpc_harness.h"

void jacobi_3d(const double *in, double *out, size_t n);

typedef struct { size_t n; double *in, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    size_t nnn = c->n * c->n * c->n;
    c->in = hpc_xmalloc(nnn * sizeof(double));
    c->got = hpc_output_alloc(nnn * sizeof(double));
    c->want = hpc_xmalloc(nnn * sizeof(double));
    for (size_t i = 0; i < nnn; i++) c->in[i] = hpc_rand_double(&seed, 0.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * c->n * c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; jacobi_3d(c->in, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n, nn = n * n;
    const double *a = c->in;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++)
            for (size_t k = 0; k < n; k++) {
                size_t q = i * nn + j * n + k;
                double s = a[q];
                if (i > 0) s += a[q - nn];
                if (i + 1 < n) s += a[q + nn];
                if (j > 0) s += a[q - n];
                if (j + 1 < n) s += a[q + n];
                if (k > 0) s += a[q - 1];
                if (k + 1 < n) s += a[q + 1];
                c->want[q] = s / 7.0;
            }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->n * c->n * c->n, 1e-12, 1e-12, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->in); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * c->n * c->n * sizeof *c->got;
}
