/* Driver: transform -- void standardize_rows(const double *A, double *B, size_t rows, size_t cols);
 * B[i][j] = (A[i][j] - mean_i) / std_i (population std), a row of zeros where std_i == 0.
 * Problem size N gives N rows of COLS values; every 16th row is constant (std exactly 0). */
#include "hpc_harness.h"

#define COLS 1000
void standardize_rows(const double *A, double *B, size_t rows, size_t cols);

typedef struct { size_t rows; double *A, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->rows = (size_t)n;
    size_t cells = c->rows * COLS;
    c->A = hpc_xmalloc(cells * sizeof(double));
    c->got = hpc_output_alloc(cells * sizeof(double));
    c->want = hpc_xmalloc(cells * sizeof(double));
    for (size_t i = 0; i < c->rows; i++) {
        double *row = c->A + i * COLS;
        if (i % 16 == 5) {                         /* constant row: an exact small integer */
            double v = (double)hpc_rand_int(&seed, -8, 9);
            for (size_t j = 0; j < COLS; j++) row[j] = v;
            continue;
        }
        double offset = hpc_rand_double(&seed, -10.0, 10.0), scale = hpc_rand_double(&seed, 0.1, 5.0);
        for (size_t j = 0; j < COLS; j++) row[j] = offset + scale * hpc_rand_double(&seed, -1.0, 1.0);
    }
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, c->rows * COLS * sizeof(double)); }
void hpc_candidate(void *p) { ctx_t *c = p; standardize_rows(c->A, c->got, c->rows, COLS); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t i = 0; i < c->rows; i++) {
        const double *a = c->A + i * COLS;
        double *b = c->want + i * COLS;
        double mean = 0.0, var = 0.0;
        for (size_t j = 0; j < COLS; j++) mean += a[j];
        mean /= COLS;
        for (size_t j = 0; j < COLS; j++) var += (a[j] - mean) * (a[j] - mean);
        double sd = sqrt(var / COLS);
        for (size_t j = 0; j < COLS; j++) b[j] = sd > 0.0 ? (a[j] - mean) / sd : 0.0;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* outputs are O(1) (|B| <= sqrt(cols)); summation order changes them by ~1e-13 */
    return hpc_check_doubles(c->got, c->want, c->rows * COLS, 1e-9, 1e-9, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->A); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->rows * COLS * sizeof *c->got;
}
