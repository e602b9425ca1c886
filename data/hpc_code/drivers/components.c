/* Driver: graph -- int connected_components(int nv, const int *rowptr, const int *adj);
 * Random undirected graph in CSR form made of clusters: vertices are cut into consecutive
 * blocks of 8-64 vertices, each vertex gets ~3 random edges inside its block and, with
 * probability 1/48, one edge to a uniformly random vertex (joining blocks into larger
 * components); 2% of the vertices are isolated. Tens of thousands of components at full size. */
#include "hpc_harness.h"

int connected_components(int nv, const int *rowptr, const int *adj);

typedef struct { int nv; int *rowptr, *adj; int got, want; } ctx_t;

static int isolated(int v) { return v % 50 == 49; }

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    int nv = (int)n;
    c->nv = nv;
    size_t cap = (size_t)nv * 4 + 1;
    int *eu = hpc_xmalloc(cap * sizeof(int)), *ev = hpc_xmalloc(cap * sizeof(int));
    int *deg = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    memset(deg, 0, ((size_t)nv + 1) * sizeof(int));
    size_t m = 0;
    int block_lo = 0, block_hi = 0;
    for (int u = 0; u < nv; u++) {
        if (u == block_hi) {
            block_lo = u;
            block_hi = u + (int)hpc_rand_int(&seed, 8, 65);
            if (block_hi > nv) block_hi = nv;
        }
        if (isolated(u)) continue;
        for (int k = 0; k < 4; k++) {
            int v;
            if (k < 3) v = (int)hpc_rand_int(&seed, block_lo, block_hi);
            else if (hpc_rand_int(&seed, 0, 48) == 0) v = (int)hpc_rand_int(&seed, 0, nv);
            else continue;
            if (v == u || isolated(v)) continue;
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
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = (int)0xA5A5A5A5; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = connected_components(c->nv, c->rowptr, c->adj); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    /* union-find with path halving; the smaller root becomes the parent */
    int *parent = hpc_xmalloc((size_t)c->nv * sizeof(int) + 1);
    for (int v = 0; v < c->nv; v++) parent[v] = v;
    int count = c->nv;
    for (int u = 0; u < c->nv; u++)
        for (int k = c->rowptr[u]; k < c->rowptr[u + 1]; k++) {
            int a = u, b = c->adj[k];
            while (parent[a] != a) a = parent[a] = parent[parent[a]];
            while (parent[b] != b) b = parent[b] = parent[parent[b]];
            if (a == b) continue;
            if (a < b) parent[b] = a; else parent[a] = b;
            count--;
        }
    free(parent);
    c->want = count;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(&c->got, &c->want, 1, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->rowptr); free(c->adj); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
