/* Driver: search -- int kth_smallest(const int *x, size_t n, size_t k);
 * the k-th smallest value of x (k is 1-based, duplicates count: the value that would be
 * at index k-1 of x sorted ascending).  90% of x is uniform in [-10^9, 10^9), 10% is drawn
 * from 1000 values spread over that range (heavy duplicates), and k is random in about
 * [n/4, 3n/4]: the answer's neighbours in sorted order mostly differ from it, so an
 * off-by-one k is caught, and ignoring duplicates shifts the answer far. */
#include <limits.h>
#include "hpc_harness.h"

int kth_smallest(const int *x, size_t n, size_t k);

typedef struct { size_t n, k; int *x; int got, want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->x = hpc_xmalloc(c->n * sizeof(int));
    for (size_t i = 0; i < c->n; i++)
        c->x[i] = hpc_rand_int(&seed, 0, 10) == 0 ? (int)(hpc_rand_int(&seed, 0, 1000) * 2000003 - 1000000000)
                                                  : (int)hpc_rand_int(&seed, -1000000000, 1000000000);
    c->k = 1 + c->n / 4 + (size_t)hpc_rand_int(&seed, 0, (long)(c->n / 2) + 1);
    return c;
}
void hpc_reset(void *p) { ((ctx_t *)p)->got = INT_MIN; }
void hpc_candidate(void *p) { ctx_t *c = p; c->got = kth_smallest(c->x, c->n, c->k); }
static void swap_int(int *a, int *b) { int t = *a; *a = *b; *b = t; }
void hpc_baseline(void *p) {
    /* quickselect (median-of-three, Hoare partition) on a copy */
    ctx_t *c = p;
    if (c->n == 0) { c->want = INT_MIN; return; }
    int *a = hpc_xmalloc(c->n * sizeof(int));
    memcpy(a, c->x, c->n * sizeof(int));
    size_t lo = 0, hi = c->n - 1, k = c->k - 1;
    while (hi > lo) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid] < a[lo]) swap_int(&a[mid], &a[lo]);
        if (a[hi] < a[lo]) swap_int(&a[hi], &a[lo]);
        if (a[hi] < a[mid]) swap_int(&a[hi], &a[mid]);
        int pivot = a[mid];
        size_t i = lo, j = hi;
        while (i <= j) { /* afterwards a[lo..j] <= pivot <= a[i..hi], j < i */
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                swap_int(&a[i], &a[j]);
                i++;
                if (j == 0) break;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else break; /* j < k < i: a[k] == pivot */
    }
    c->want = a[k];
    free(a);
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    if (c->got == c->want) return 1;
    snprintf(msg, len, "got %d expected %d (k = %zu of n = %zu)", c->got, c->want, c->k, c->n);
    return 0;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->x); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = &c->got;
    *want = &c->want;
    return sizeof c->got;
}
