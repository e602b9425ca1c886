/* Driver: fft -- void dft_magnitude(const double *x, double *mag, size_t n);
 * mag[k] = |sum_j x[j] exp(-2 pi i j k / n)| for real input x. */
#include "hpc_harness.h"

void dft_magnitude(const double *x, double *mag, size_t n);

typedef struct { size_t n; double *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->got = hpc_output_alloc(c->n * sizeof(double));
    c->want = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; dft_magnitude(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    double *cs = hpc_xmalloc(n * sizeof(double)), *sn = hpc_xmalloc(n * sizeof(double));
    for (size_t m = 0; m < n; m++) {               /* twiddle table */
        cs[m] = cos(2.0 * M_PI * (double)m / (double)n);
        sn[m] = sin(2.0 * M_PI * (double)m / (double)n);
    }
    for (size_t k = 0; k < n; k++) {
        double re = 0.0, im = 0.0;
        size_t idx = 0;                            /* (j * k) mod n */
        for (size_t j = 0; j < n; j++) {
            re += c->x[j] * cs[idx];
            im -= c->x[j] * sn[idx];
            idx += k;
            if (idx >= n) idx -= n;
        }
        c->want[k] = sqrt(re * re + im * im);
    }
    free(cs); free(sn);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* magnitudes are O(sqrt(n)); allow for cos/sin argument-reduction drift */
    return hpc_check_doubles(c->got, c->want, c->n, 1e-6, 1e-3, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
