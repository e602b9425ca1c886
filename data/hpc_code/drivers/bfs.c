/* Driver: graph -- void bfs_levels(int nv, const int *rowptr, const int *adj, int source, int *level).
 * Random undirected graph in CSR form: N vertices, ~4 random edges added per
 * vertex (average degree ~8), plus 1% isolated vertices that must stay -1. */
#include "hpc_harness.h"

void bfs_levels(int nv, const int *rowptr, const int *adj, int source, int *level);

typedef struct { int nv; int *rowptr, *adj, *got, *want, *queue; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    int nv = (int)n, per = 4;
    c->nv = nv;
    size_t ne = (size_t)nv * per;
    int *eu = hpc_xmalloc(ne * sizeof(int)), *ev = hpc_xmalloc(ne * sizeof(int));
    int *deg = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    memset(deg, 0, ((size_t)nv + 1) * sizeof(int));
    size_t m = 0;
    for (int u = 0; u < nv; u++) {
        if (u % 100 == 99) continue;               /* isolated vertex */
        for (int k = 0; k < per; k++) {
            int v = (int)hpc_rand_int(&seed, 0, nv);
            if (v == u || v % 100 == 99) continue;
            eu[m] = u; ev[m] = v; m++;
            deg[u]++; deg[v]++;
        }
    }
    c->rowptr = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    c->rowptr[0] = 0;
    for (int u = 0; u < nv; u++) c->rowptr[u + 1] = c->rowptr[u] + deg[u];
    c->adj = hpc_xmalloc((size_t)c->rowptr[nv] * sizeof(int) + 1);
    memcpy(deg, c->rowptr, (size_t)nv * sizeof(int));   /* reuse as fill cursor */
    for (size_t e = 0; e < m; e++) {
        c->adj[deg[eu[e]]++] = ev[e];
        c->adj[deg[ev[e]]++] = eu[e];
    }
    free(eu); free(ev); free(deg);
    c->got = hpc_output_alloc((size_t)nv * sizeof(int));
    c->want = hpc_xmalloc((size_t)nv * sizeof(int));
    c->queue = hpc_xmalloc((size_t)nv * sizeof(int));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0x5A, (size_t)c->nv * sizeof(int)); }
void hpc_candidate(void *p) { ctx_t *c = p; bfs_levels(c->nv, c->rowptr, c->adj, 0, c->got); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    for (int v = 0; v < c->nv; v++) c->want[v] = -1;
    int head = 0, tail = 0;
    c->want[0] = 0;
    c->queue[tail++] = 0;
    while (head < tail) {
        int u = c->queue[head++];
        for (int k = c->rowptr[u]; k < c->rowptr[u + 1]; k++) {
            int v = c->adj[k];
            if (c->want[v] < 0) { c->want[v] = c->want[u] + 1; c->queue[tail++] = v; }
        }
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, (size_t)c->nv, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->adj); hpc_output_free(c->got); free(c->want); free(c->queue); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return (size_t)c->nv * sizeof *c->got;
}
