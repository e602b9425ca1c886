/* Driver: sort -- void sort_nonzero(int *x, size_t n): sort the non-zero elements ascending in
 * place, every zero staying at its index.  About a quarter of the elements are zero. */
#include "hpc_harness.h"

void sort_nonzero(int *x, size_t n);

typedef struct { size_t n; int *orig, *got, *want; } ctx_t;

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}
void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->orig = hpc_xmalloc(c->n * sizeof(int));
    c->got = hpc_output_alloc(c->n * sizeof(int));
    c->want = hpc_xmalloc(c->n * sizeof(int));
    for (size_t i = 0; i < c->n; i++) {
        int v = (int)hpc_rand_int(&seed, -1000000000L, 1000000000L);
        c->orig[i] = hpc_rand_int(&seed, 0, 4) == 0 ? 0 : (v ? v : 1);
    }
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memcpy(c->got, c->orig, c->n * sizeof(int)); }
void hpc_candidate(void *p) { ctx_t *c = p; sort_nonzero(c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    int *t = hpc_xmalloc(c->n * sizeof(int));
    size_t m = 0;
    for (size_t i = 0; i < c->n; i++)
        if (c->orig[i] != 0) t[m++] = c->orig[i];
    qsort(t, m, sizeof(int), cmp_int);
    for (size_t i = 0, k = 0; i < c->n; i++) c->want[i] = c->orig[i] != 0 ? t[k++] : 0;
    free(t);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_ints(c->got, c->want, c->n, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->orig); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
