/* Driver: scan -- void suffix_sum(const long long *x, long long *out, size_t n);
 * out[i] = x[i] + x[i+1] + ... + x[n-1] (a reverse inclusive scan). */
#include "hpc_harness.h"

void suffix_sum(const long long *x, long long *out, size_t n);

typedef struct { size_t n; long long *x, *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(long long));
    c->got = hpc_output_alloc(c->n * sizeof(long long));
    c->want = hpc_xmalloc(c->n * sizeof(long long));
    for (size_t i = 0; i < c->n; i++) c->x[i] = hpc_rand_int(&seed, -1000, 1000);
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, c->n * sizeof(long long)); }
void hpc_candidate(void *p) { ctx_t *c = p; suffix_sum(c->x, c->got, c->n); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    long long s = 0;
    for (size_t i = c->n; i-- > 0;) {
        s += c->x[i];
        c->want[i] = s;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    return hpc_check_longs(c->got, c->want, c->n, msg, len);
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return c->n * sizeof *c->got;
}
