/* Driver: geometry -- double convex_hull_area(const double *x, const double *y, size_t n);
 * area of the convex hull of n points, uniform in a disc of radius 1000 (the hull has
 * ~n^(1/3) vertices). Baseline: Andrew's monotone chain after a qsort. */
#include "hpc_harness.h"

double convex_hull_area(const double *x, const double *y, size_t n);

typedef struct { size_t n; double *x, *y; double got, want; } ctx_t;
typedef struct { double x, y; } pt_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(double));
    c->y = hpc_xmalloc(c->n * sizeof(double));
    for (size_t i = 0; i < c->n; i++) {
        double px, py;
        do {
            px = hpc_rand_double(&seed, -1000.0, 1000.0);
            py = hpc_rand_double(&seed, -1000.0, 1000.0);
        } while (px * px + py * py >= 1000.0 * 1000.0);
        c->x[i] = px;
        c->y[i] = py;
    }
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = NAN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = convex_hull_area(c->x, c->y, c->n); }
static int cmp_pt(const void *a, const void *b) {
    const pt_t *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? -1 : 1;
    return (p->y > q->y) - (p->y < q->y);
}
static double cross(pt_t o, pt_t a, pt_t b) { return (a.x - o.x) * (b.y - o.y) - (a.y - o.y) * (b.x - o.x); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    if (n < 3) { c->want = 0.0; return; }
    pt_t *s = hpc_xmalloc(n * sizeof(pt_t)), *h = hpc_xmalloc((2 * n + 1) * sizeof(pt_t));
    for (size_t i = 0; i < n; i++) { s[i].x = c->x[i]; s[i].y = c->y[i]; }
    qsort(s, n, sizeof(pt_t), cmp_pt);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        while (k >= 2 && cross(h[k - 2], h[k - 1], s[i]) <= 0) k--;
        h[k++] = s[i];
    }
    for (size_t i = n - 1, t = k + 1; i-- > 0;) {
        while (k >= t && cross(h[k - 2], h[k - 1], s[i]) <= 0) k--;
        h[k++] = s[i];
    }
    double a = 0.0;
    for (size_t i = 0; i + 1 < k; i++) a += h[i].x * h[i + 1].y - h[i + 1].x * h[i].y;
    c->want = fabs(a) / 2.0;
    free(s); free(h);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* the hull's vertices are the same in any correct solution; only the order of the
       shoelace sum (and near-collinear vertices of negligible area) may differ */
    return hpc_check_doubles(&c->got, &c->want, 1, 1e-9, 1e-9, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c->y); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
