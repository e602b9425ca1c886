/* Driver: fft -- void idft(const double *X, double *x, size_t n);
 * inverse DFT of n complex values stored interleaved (re, im):
 * x[j] = (1/n) sum_k X[k] exp(+2 pi i j k / n). */
#include "hpc_harness.h"

void idft(const double *X, double *x, size_t n);

typedef struct { size_t n; double *X, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->X = hpc_xmalloc(2 * c->n * sizeof(double));
    c->got = hpc_output_alloc(2 * c->n * sizeof(double));
    c->want = hpc_xmalloc(2 * c->n * sizeof(double));
    for (size_t i = 0; i < 2 * c->n; i++) c->X[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, 2 * c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; idft(c->X, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    const double *X = c->X;
    double *cs = hpc_xmalloc(n * sizeof(double)), *sn = hpc_xmalloc(n * sizeof(double));
    for (size_t m = 0; m < n; m++) {               /* twiddle table: exp(+2 pi i m / n) */
        cs[m] = cos(2.0 * M_PI * (double)m / (double)n);
        sn[m] = sin(2.0 * M_PI * (double)m / (double)n);
    }
    for (size_t j = 0; j < n; j++) {
        double re = 0.0, im = 0.0;
        size_t idx = 0;                            /* (j * k) mod n */
        for (size_t k = 0; k < n; k++) {
            double a = X[2 * k], b = X[2 * k + 1];
            re += a * cs[idx] - b * sn[idx];
            im += a * sn[idx] + b * cs[idx];
            idx += j;
            if (idx >= n) idx -= n;
        }
        c->want[2 * j] = re / (double)n;
        c->want[2 * j + 1] = im / (double)n;
    }
    free(cs); free(sn);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* outputs are O(1/sqrt(n)); reassociation and twiddle rounding stay far below 1e-9 */
    return hpc_check_doubles(c->got, c->want, 2 * c->n, 1e-7, 1e-9, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->X); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return 2 * c->n * sizeof *c->got;
}
