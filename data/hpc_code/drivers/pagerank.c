/* Driver: graph -- void pagerank(int nv, const int *rowptr, const int *src, const int *outdeg,
 *                                 int iters, double *pr);
 * Random directed graph, stored by in-edges (CSR of the transpose) with the out-degrees:
 * every vertex gets 0-12 out-edges (5% none: dangling) to random targets, 20% of them to one
 * of 64 popular vertices (long in-lists). ITERS = 20 iterations. */
#include "hpc_harness.h"

void pagerank(int nv, const int *rowptr, const int *src, const int *outdeg, int iters, double *pr);

#define ITERS 20
typedef struct { int nv; int *rowptr, *src, *outdeg; double *got, *want, *tmp; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    int nv = (int)n;
    c->nv = nv;
    size_t cap = (size_t)nv * 12 + 1;
    int *eu = hpc_xmalloc(cap * sizeof(int)), *ev = hpc_xmalloc(cap * sizeof(int));
    c->outdeg = hpc_xmalloc((size_t)nv * sizeof(int) + 1);
    int *indeg = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    memset(indeg, 0, ((size_t)nv + 1) * sizeof(int));
    size_t m = 0;
    for (int u = 0; u < nv; u++) {
        int d = hpc_rand_int(&seed, 0, 20) == 0 ? 0 : (int)hpc_rand_int(&seed, 1, 13);
        c->outdeg[u] = d;
        for (int k = 0; k < d; k++) {
            int v = hpc_rand_int(&seed, 0, 5) == 0 ? (int)hpc_rand_int(&seed, 0, nv < 64 ? nv : 64)
                                                   : (int)hpc_rand_int(&seed, 0, nv);
            eu[m] = u; ev[m] = v; m++;
            indeg[v]++;
        }
    }
    c->rowptr = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    c->rowptr[0] = 0;
    for (int v = 0; v < nv; v++) c->rowptr[v + 1] = c->rowptr[v] + indeg[v];
    c->src = hpc_xmalloc(m * sizeof(int) + 1);
    memcpy(indeg, c->rowptr, (size_t)nv * sizeof(int));   /* reuse as fill cursor */
    for (size_t e = 0; e < m; e++) c->src[indeg[ev[e]]++] = eu[e];
    free(eu); free(ev); free(indeg);
    c->got = hpc_output_alloc((size_t)nv * sizeof(double));
    c->want = hpc_xmalloc((size_t)nv * sizeof(double));
    c->tmp = hpc_xmalloc((size_t)nv * sizeof(double));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xFF, (size_t)c->nv * sizeof(double)); }
void hpc_candidate(void *p) {
    ctx_t *c = p;
    pagerank(c->nv, c->rowptr, c->src, c->outdeg, ITERS, c->got);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    int nv = c->nv;
    double *cur = c->want, *next = c->tmp;
    for (int v = 0; v < nv; v++) cur[v] = 1.0 / nv;
    for (int it = 0; it < ITERS; it++) {
        double dangling = 0.0;
        for (int u = 0; u < nv; u++)
            if (c->outdeg[u] == 0) dangling += cur[u];
        double base = (1.0 - 0.85) / nv + 0.85 * dangling / nv;
        for (int v = 0; v < nv; v++) {
            double s = 0.0;
            for (int k = c->rowptr[v]; k < c->rowptr[v + 1]; k++) s += cur[c->src[k]] / c->outdeg[c->src[k]];
            next[v] = base + 0.85 * s;
        }
        double *t = cur; cur = next; next = t;
    }
    if (cur != c->want) memcpy(c->want, cur, (size_t)nv * sizeof(double));
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    /* values are ~1/nv; summation order changes them by a few ulps per iteration */
    return hpc_check_doubles(c->got, c->want, (size_t)c->nv, 1e-9, 1e-300, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->src); free(c->outdeg); hpc_output_free(c->got); free(c->want); free(c->tmp); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return (size_t)c->nv * sizeof *c->got;
}
