/* Driver: stencil -- void sobel_magnitude(const int *img, double *out, size_t rows, size_t cols):
 * Sobel gradient magnitude of a grayscale image (pixels 0..255, row-major), 0 on the border.
 * Problem size N gives a rectangular N x (N + N/2 + 1) image. */
#include "hpc_harness.h"

void sobel_magnitude(const int *img, double *out, size_t rows, size_t cols);

typedef struct { size_t rows, cols; int *img; double *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->rows = (size_t)n;
    c->cols = (size_t)n + (size_t)n / 2 + 1;
    size_t np = c->rows * c->cols;
    c->img = hpc_xmalloc(np * sizeof(int));
    c->got = hpc_output_alloc(np * sizeof(double));
    c->want = hpc_xmalloc(np * sizeof(double));
    for (size_t i = 0; i < np; i++) c->img[i] = (int)hpc_rand_int(&seed, 0, 256);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->rows * c->cols * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; sobel_magnitude(c->img, c->got, c->rows, c->cols); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t R = c->rows, C = c->cols;
    const int *a = c->img;
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++) {
            if (i == 0 || j == 0 || i + 1 >= R || j + 1 >= C) { c->want[i * C + j] = 0.0; continue; }
            const int *u = a + (i - 1) * C + j, *m = a + i * C + j, *d = a + (i + 1) * C + j;
            int gx = (u[1] + 2 * m[1] + d[1]) - (u[-1] + 2 * m[-1] + d[-1]);
            int gy = (d[-1] + 2 * d[0] + d[1]) - (u[-1] + 2 * u[0] + u[1]);
            c->want[i * C + j] = sqrt((double)(gx * gx + gy * gy));
        }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_doubles(c->got, c->want, c->rows * c->cols, 1e-12, 1e-12, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->img); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->rows * c->cols * sizeof *c->got;
}
