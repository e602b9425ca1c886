/* Driver: geometry -- void nearest_neighbor(const double *px, const double *py, size_t np,
 *                                            const double *qx, const double *qy, size_t nq, int *nn);
 * Problem size N = np = nq. Integer coordinates in [0, R), R = 8 sqrt(N) (exact squared
 * distances): equal distances and duplicate points occur, so the smallest-index tie rule
 * matters (~4% of the queries have a tie). */
#include "hpc_harness.h"

void nearest_neighbor(const double *px, const double *py, size_t np,
                      const double *qx, const double *qy, size_t nq, int *nn);

typedef struct { size_t n; double *px, *py, *qx, *qy; int *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->px = hpc_xmalloc(c->n * sizeof(double));
    c->py = hpc_xmalloc(c->n * sizeof(double));
    c->qx = hpc_xmalloc(c->n * sizeof(double));
    c->qy = hpc_xmalloc(c->n * sizeof(double));
    long range = 1 + (long)(8.0 * sqrt((double)n));
    for (size_t i = 0; i < c->n; i++) {
        c->px[i] = (double)hpc_rand_int(&seed, 0, range);
        c->py[i] = (double)hpc_rand_int(&seed, 0, range);
    }
    for (size_t i = 0; i < c->n; i++) {
        c->qx[i] = (double)hpc_rand_int(&seed, 0, range);
        c->qy[i] = (double)hpc_rand_int(&seed, 0, range);
    }
    c->got = hpc_output_alloc(c->n * sizeof(int));
    c->want = hpc_xmalloc(c->n * sizeof(int));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->n * sizeof(int)); }
void hpc_candidate(void *p) {
    ctx_t *c = p;
    nearest_neighbor(c->px, c->py, c->n, c->qx, c->qy, c->n, c->got);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t q = 0; q < c->n; q++) {
        double best = INFINITY;
        int arg = -1;
        for (size_t i = 0; i < c->n; i++) {
            double dx = c->px[i] - c->qx[q], dy = c->py[i] - c->qy[q];
            double d2 = dx * dx + dy * dy;
            if (d2 < best) { best = d2; arg = (int)i; }
        }
        c->want[q] = arg;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, c->n, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->px); free(c->py); free(c->qx); free(c->qy); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
