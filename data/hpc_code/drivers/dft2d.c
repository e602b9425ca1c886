/* Driver: fft -- void dft2d_magnitude(const double *img, double *mag, size_t rows, size_t cols);
 * mag[u*cols+v] = | sum_{r,c} img[r*cols+c] exp(-2 pi i (u r / rows + v c / cols)) |.
 * Problem size N gives an N x (3N/2) image (not square, so rows and cols cannot be swapped). */
#include "hpc_harness.h"

void dft2d_magnitude(const double *img, double *mag, size_t rows, size_t cols);

typedef struct { size_t rows, cols; double *img, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->rows = (size_t)n;
    c->cols = (size_t)n + (size_t)n / 2;
    size_t cells = c->rows * c->cols;
    c->img = hpc_xmalloc(cells * sizeof(double));
    c->got = hpc_output_alloc(cells * sizeof(double));
    c->want = hpc_xmalloc(cells * sizeof(double));
    for (size_t i = 0; i < cells; i++) c->img[i] = hpc_rand_double(&seed, 0.0, 1.0);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->rows * c->cols * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; dft2d_magnitude(c->img, c->got, c->rows, c->cols); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t R = c->rows, C = c->cols;
    double *ccs = hpc_xmalloc(C * sizeof(double)), *csn = hpc_xmalloc(C * sizeof(double));
    double *rcs = hpc_xmalloc(R * sizeof(double)), *rsn = hpc_xmalloc(R * sizeof(double));
    for (size_t m = 0; m < C; m++) {
        ccs[m] = cos(2.0 * M_PI * (double)m / (double)C);
        csn[m] = sin(2.0 * M_PI * (double)m / (double)C);
    }
    for (size_t m = 0; m < R; m++) {
        rcs[m] = cos(2.0 * M_PI * (double)m / (double)R);
        rsn[m] = sin(2.0 * M_PI * (double)m / (double)R);
    }
    /* 1. DFT of every row: T[r][v] = sum_c img[r][c] exp(-2 pi i v c / C) */
    double *tr = hpc_xmalloc(R * C * sizeof(double)), *ti = hpc_xmalloc(R * C * sizeof(double));
    for (size_t r = 0; r < R; r++) {
        const double *row = c->img + r * C;
        for (size_t v = 0; v < C; v++) {
            double re = 0.0, im = 0.0;
            size_t idx = 0;                        /* (v * c) mod C */
            for (size_t col = 0; col < C; col++) {
                re += row[col] * ccs[idx];
                im -= row[col] * csn[idx];
                idx += v;
                if (idx >= C) idx -= C;
            }
            tr[r * C + v] = re;
            ti[r * C + v] = im;
        }
    }
    /* 2. DFT along the columns: F[u][v] = sum_r T[r][v] exp(-2 pi i u r / R) */
    double *ar = hpc_xmalloc(C * sizeof(double)), *ai = hpc_xmalloc(C * sizeof(double));
    for (size_t u = 0; u < R; u++) {
        memset(ar, 0, C * sizeof(double));
        memset(ai, 0, C * sizeof(double));
        size_t idx = 0;                            /* (u * r) mod R */
        for (size_t r = 0; r < R; r++) {
            double wr = rcs[idx], wi = -rsn[idx];
            const double *a = tr + r * C, *b = ti + r * C;
            for (size_t v = 0; v < C; v++) {
                ar[v] += a[v] * wr - b[v] * wi;
                ai[v] += a[v] * wi + b[v] * wr;
            }
            idx += u;
            if (idx >= R) idx -= R;
        }
        for (size_t v = 0; v < C; v++) c->want[u * C + v] = sqrt(ar[v] * ar[v] + ai[v] * ai[v]);
    }
    free(ccs); free(csn); free(rcs); free(rsn); free(tr); free(ti); free(ar); free(ai);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* magnitudes are O(sqrt(rows*cols)) (mag[0] ~ rows*cols/2); summation order and twiddle
     * rounding stay far below these bounds */
    double scale = sqrt((double)(c->rows * c->cols));
    return hpc_check_doubles(c->got, c->want, c->rows * c->cols, 1e-7, 1e-7 * scale, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->img); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->rows * c->cols * sizeof *c->got;
}
