/* Driver: graph -- void shortest_paths(int nv, const int *rowptr, const int *adj, const int *weight,
 *                                       int source, int *dist);
 * Random directed graph in CSR form (out-edges): every vertex gets 4 edges to uniformly random
 * vertices, weights uniform in 1..9; 1% of the vertices have no edges at all (isolated, like
 * vertices without in-edges they stay -1). Baseline: Dijkstra with a binary heap. */
#include "hpc_harness.h"

void shortest_paths(int nv, const int *rowptr, const int *adj, const int *weight, int source, int *dist);

typedef struct { int nv; int *rowptr, *adj, *weight, *got, *want; } ctx_t;

static int isolated(int v) { return v % 100 == 99; }

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    int nv = (int)n, per = 4;
    c->nv = nv;
    c->rowptr = hpc_xmalloc(((size_t)nv + 1) * sizeof(int));
    c->adj = hpc_xmalloc((size_t)nv * per * sizeof(int) + 1);
    c->weight = hpc_xmalloc((size_t)nv * per * sizeof(int) + 1);
    int m = 0;
    c->rowptr[0] = 0;
    for (int u = 0; u < nv; u++) {
        if (!isolated(u))
            for (int k = 0; k < per; k++) {
                int v = (int)hpc_rand_int(&seed, 0, nv);
                int w = (int)hpc_rand_int(&seed, 1, 10);
                if (v == u || isolated(v)) continue;
                c->adj[m] = v;
                c->weight[m] = w;
                m++;
            }
        c->rowptr[u + 1] = m;
    }
    c->got = hpc_output_alloc((size_t)nv * sizeof(int));
    c->want = hpc_xmalloc((size_t)nv * sizeof(int));
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, (size_t)c->nv * sizeof(int)); }
void hpc_candidate(void *p) {
    ctx_t *c = p;
    shortest_paths(c->nv, c->rowptr, c->adj, c->weight, 0, c->got);
}
void hpc_baseline(void *p) {
    ctx_t *c = p;
    int nv = c->nv;
    int *dist = c->want;
    /* lazy binary heap of (distance, vertex) entries; at most one entry per relaxation */
    size_t cap = (size_t)c->rowptr[nv] + 1, len = 0;
    long long *heap = hpc_xmalloc(cap * sizeof(long long));   /* key = dist << 32 | vertex */
    for (int v = 0; v < nv; v++) dist[v] = -1;
    int *done = hpc_xmalloc((size_t)nv * sizeof(int) + 1);
    memset(done, 0, (size_t)nv * sizeof(int));
    dist[0] = 0;
    heap[len++] = 0;
    while (len > 0) {
        long long top = heap[0], last = heap[--len];
        size_t i = 0;
        for (;;) {   /* sift `last` down from the root */
            size_t ch = 2 * i + 1;
            if (ch >= len) break;
            if (ch + 1 < len && heap[ch + 1] < heap[ch]) ch++;
            if (heap[ch] >= last) break;
            heap[i] = heap[ch];
            i = ch;
        }
        if (len > 0) heap[i] = last;
        int u = (int)(top & 0xFFFFFFFF), du = (int)(top >> 32);
        if (done[u]) continue;
        done[u] = 1;
        for (int k = c->rowptr[u]; k < c->rowptr[u + 1]; k++) {
            int v = c->adj[k], nd = du + c->weight[k];
            if (dist[v] < 0 || nd < dist[v]) {
                dist[v] = nd;
                long long key = (long long)nd << 32 | v;
                size_t j = len++;
                while (j > 0 && heap[(j - 1) / 2] > key) { heap[j] = heap[(j - 1) / 2]; j = (j - 1) / 2; }
                heap[j] = key;
            }
        }
    }
    free(heap); free(done);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, (size_t)c->nv, msg, len);
}
void hpc_free(void *p) {
    ctx_t *c = p;
    free(c->rowptr); free(c->adj); free(c->weight); hpc_output_free(c->got); free(c->want); free(c);
}
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return (size_t)c->nv * sizeof *c->got;
}
