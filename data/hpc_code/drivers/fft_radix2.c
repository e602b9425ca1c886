/* Driver: fft -- void fft_radix2(const double *x, double *y, size_t n);
 * out-of-place forward FFT of n complex values (n a power of two) stored interleaved (re, im):
 * y[k] = sum_j x[j] exp(-2 pi i j k / n).  Problem size N must be a power of two. */
#include "hpc_harness.h"

void fft_radix2(const double *x, double *y, size_t n);

typedef struct { size_t n; double *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    if (n < 1 || (n & (n - 1)) != 0) {
        fprintf(stderr, "driver: fft_radix2 needs a power-of-two size, got %ld\n", n);
        exit(3);
    }
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(2 * c->n * sizeof(double));
    c->got = hpc_output_alloc(2 * c->n * sizeof(double));
    c->want = hpc_xmalloc(2 * c->n * sizeof(double));
    for (size_t i = 0; i < 2 * c->n; i++) c->x[i] = hpc_rand_double(&seed, -1.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, 2 * c->n * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; fft_radix2(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n, logn = 0;
    while (((size_t)1 << logn) < n) logn++;
    double *y = c->want;
    for (size_t i = 0; i < n; i++) {               /* bit-reversed copy */
        size_t r = 0;
        for (size_t b = 0; b < logn; b++) r |= ((i >> b) & 1) << (logn - 1 - b);
        y[2 * r] = c->x[2 * i];
        y[2 * r + 1] = c->x[2 * i + 1];
    }
    size_t half_n = n / 2;
    double *wr = hpc_xmalloc((half_n ? half_n : 1) * sizeof(double));
    double *wi = hpc_xmalloc((half_n ? half_n : 1) * sizeof(double));
    for (size_t m = 0; m < half_n; m++) {          /* twiddles exp(-2 pi i m / n) */
        wr[m] = cos(2.0 * M_PI * (double)m / (double)n);
        wi[m] = -sin(2.0 * M_PI * (double)m / (double)n);
    }
    for (size_t len = 2; len <= n; len <<= 1) {    /* iterative Cooley-Tukey, decimation in time */
        size_t half = len / 2, step = n / len;
        for (size_t s = 0; s < n; s += len)
            for (size_t j = 0; j < half; j++) {
                double tr = wr[j * step], ti = wi[j * step];
                double *u = y + 2 * (s + j), *v = y + 2 * (s + j + half);
                double br = v[0] * tr - v[1] * ti, bi = v[0] * ti + v[1] * tr;
                v[0] = u[0] - br;
                v[1] = u[1] - bi;
                u[0] += br;
                u[1] += bi;
            }
    }
    free(wr); free(wi);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* outputs are O(sqrt(n)); any FFT ordering (or recurrence twiddles) stays far inside this */
    return hpc_check_doubles(c->got, c->want, 2 * c->n, 1e-6, 1e-6 * sqrt((double)c->n), msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return 2 * c->n * sizeof *c->got;
}
