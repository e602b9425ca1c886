/* Driver: stencil -- void game_of_life(const int *in, int *out, size_t n): one step of Conway's
 * Game of Life on an n x n grid (row-major, cells 0/1, outside the grid dead).  About 30 % of
 * the cells start alive. */
#include "hpc_harness.h"

void game_of_life(const int *in, int *out, size_t n);

typedef struct { size_t n; int *in, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    size_t nn = c->n * c->n;
    c->in = hpc_xmalloc(nn * sizeof(int));
    c->got = hpc_output_alloc(nn * sizeof(int));
    c->want = hpc_xmalloc(nn * sizeof(int));
    for (size_t i = 0; i < nn; i++) c->in[i] = hpc_rand_int(&seed, 0, 10) < 3;
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->n * c->n * sizeof(int)); }
void hpc_candidate(void *p) { ctx_t *c = p; game_of_life(c->in, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    size_t n = c->n;
    const int *a = c->in;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < n; j++) {
            int live = 0;
            for (int di = -1; di <= 1; di++)
                for (int dj = -1; dj <= 1; dj++) {
                    if (di == 0 && dj == 0) continue;
                    long ii = (long)i + di, jj = (long)j + dj;
                    if (ii >= 0 && ii < (long)n && jj >= 0 && jj < (long)n) live += a[ii * (long)n + jj];
                }
            int alive = a[i * n + j];
            c->want[i * n + j] = alive ? (live == 2 || live == 3) : (live == 3);
        }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, c->n * c->n, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->in); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * c->n * sizeof *c->got;
}
