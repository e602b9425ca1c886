/* Driver: graph -- long long count_triangles(int nv, const int *rowptr, const int *adj);
 * Random undirected simple graph in CSR form, each adjacency list sorted ascending: every
 * vertex u gets 6 edges to u+1..u+40 (many triangles) and one to a uniformly random vertex;
 * duplicates and self-loops are removed. Average degree ~13, skewed lists near hubs: 1 vertex
 * in 1000 also gets 200 random edges. */
#include "hpc_harness.h"

long long count_triangles(int nv, const int *rowptr, const int *adj);

typedef struct { int nv; int *rowptr, *adj; long long got, want; } ctx_t;

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}
void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    int nv = (int)n;
    c->nv = nv;
    size_t cap = (size_t)nv * 7 + (size_t)(nv / 1000 + 1) * 200 + 1;
    int *eu = hpc_xmalloc(cap * sizeof(int)), *ev = hpc_xmalloc(cap * sizeof(int));
    int *deg = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    memset(deg, 0, ((size_t)nv + 1) * sizeof(int));
    size_t m = 0;
    for (int u = 0; u < nv; u++) {
        int extra = u % 1000 == 500 ? 200 : 0;
        for (int k = 0; k < 7 + extra; k++) {
            long v = k < 6 ? u + hpc_rand_int(&seed, 1, 41) : hpc_rand_int(&seed, 0, nv);
            if (v >= nv || v == u) continue;
            eu[m] = u; ev[m] = (int)v; m++;
            deg[u]++; deg[v]++;
        }
    }
    int *row = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    row[0] = 0;
    for (int u = 0; u < nv; u++) row[u + 1] = row[u] + deg[u];
    int *tmp = hpc_xmalloc((size_t)row[nv] * sizeof(int) + 1);
    memcpy(deg, row, (size_t)nv * sizeof(int));   /* reuse as fill cursor */
    for (size_t e = 0; e < m; e++) {
        tmp[deg[eu[e]]++] = ev[e];
        tmp[deg[ev[e]]++] = eu[e];
    }
    free(eu); free(ev);
    /* sort each list and drop duplicates, compacting into the final CSR arrays */
    c->rowptr = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    c->adj = hpc_xmalloc((size_t)row[nv] * sizeof(int) + 1);
    int out = 0;
    c->rowptr[0] = 0;
    for (int u = 0; u < nv; u++) {
        qsort(tmp + row[u], (size_t)(row[u + 1] - row[u]), sizeof(int), cmp_int);
        for (int k = row[u]; k < row[u + 1]; k++)
            if (k == row[u] || tmp[k] != tmp[k - 1]) c->adj[out++] = tmp[k];
        c->rowptr[u + 1] = out;
    }
    free(tmp); free(row); free(deg);
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = (long long)0xA5A5A5A5A5A5A5A5ULL; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = count_triangles(c->nv, c->rowptr, c->adj); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    const int *rowptr = c->rowptr, *adj = c->adj;
    long long count = 0;
    /* each triangle u < v < w once: merge the parts of adj(u) and adj(v) above v */
    for (int u = 0; u < c->nv; u++)
        for (int k = rowptr[u]; k < rowptr[u + 1]; k++) {
            int v = adj[k];
            if (v <= u) continue;
            int i = k + 1, j = rowptr[v];
            while (j < rowptr[v + 1] && adj[j] <= v) j++;
            while (i < rowptr[u + 1] && j < rowptr[v + 1]) {
                if (adj[i] < adj[j]) i++;
                else if (adj[i] > adj[j]) j++;
                else { count++; i++; j++; }
            }
        }
    c->want = count;
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_longs(&c->got, &c->want, 1, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->rowptr); free(c->adj); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
