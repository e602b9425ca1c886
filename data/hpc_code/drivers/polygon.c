/* Driver: geometry -- void points_in_polygon(const double *px, const double *py, size_t nv,
 *                                             const double *qx, const double *qy, size_t nq, int *inside);
 * Problem size N = nq query points, uniform in [0, 1000)^2; the polygon is a fixed-size
 * (NV vertices) star-shaped, non-convex simple polygon around (500, 500). */
#include "hpc_harness.h"

void points_in_polygon(const double *px, const double *py, size_t nv,
                       const double *qx, const double *qy, size_t nq, int *inside);

#define NV 200
typedef struct { size_t nq; double *px, *py, *qx, *qy; int *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->nq = (size_t)n;
    c->px = hpc_xmalloc(NV * sizeof(double));
    c->py = hpc_xmalloc(NV * sizeof(double));
    for (int k = 0; k < NV; k++) {
        double ang = 2.0 * M_PI * k / NV, r = hpc_rand_double(&seed, 100.0, 480.0);
        c->px[k] = 500.0 + r * cos(ang);
        c->py[k] = 500.0 + r * sin(ang);
    }
    c->qx = hpc_xmalloc(c->nq * sizeof(double));
    c->qy = hpc_xmalloc(c->nq * sizeof(double));
    for (size_t i = 0; i < c->nq; i++) {
        c->qx[i] = hpc_rand_double(&seed, 0.0, 1000.0);
        c->qy[i] = hpc_rand_double(&seed, 0.0, 1000.0);
    }
    c->got = hpc_output_alloc(c->nq * sizeof(int));
    c->want = hpc_xmalloc(c->nq * sizeof(int));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->nq * sizeof(int)); }
void hpc_candidate(void *p) {
    ctx_t *c = p;
    points_in_polygon(c->px, c->py, NV, c->qx, c->qy, c->nq, c->got);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (size_t q = 0; q < c->nq; q++) {
        double x = c->qx[q], y = c->qy[q];
        int inside = 0;
        for (size_t i = 0, j = NV - 1; i < NV; j = i++) {
            if ((c->py[i] > y) != (c->py[j] > y) &&
                x < (c->px[j] - c->px[i]) * (y - c->py[i]) / (c->py[j] - c->py[i]) + c->px[i])
                inside = !inside;
        }
        c->want[q] = inside;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, c->nq, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->px); free(c->py); free(c->qx); free(c->qy); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->nq * sizeof *c->got;
}
