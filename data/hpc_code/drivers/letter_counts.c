/* Driver: histogram -- void letter_counts(const char *s, size_t n, size_t *counts).
 * Text of printable ASCII (letters of both cases, digits, punctuation, spaces, newlines). */
#include "hpc_harness.h"

#define NLETTERS 26
void letter_counts(const char *s, size_t n, size_t *counts);

typedef struct { size_t n; char *s; size_t *got, *want; } ctx_t;

void *hpc_setup(long n, uint64_t seed) {
    ctx_t *c = hpc_xmalloc(sizeof *c);
    c->n = (size_t)n;
    c->s = hpc_xmalloc(c->n + 1);
    c->got = hpc_output_alloc(NLETTERS * sizeof(size_t));
    c->want = hpc_xmalloc(NLETTERS * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        long r = hpc_rand_int(&seed, 0, 100);
        if (r < 50) /* lowercase, skewed towards the start of the alphabet */
            c->s[i] = (char)('a' + (hpc_rand_int(&seed, 0, 26) * hpc_rand_int(&seed, 1, 27)) / 26);
        else if (r < 65)
            c->s[i] = (char)('A' + hpc_rand_int(&seed, 0, 26));
        else if (r < 80)
            c->s[i] = ' ';
        else if (r < 82)
            c->s[i] = '\n';
        else /* any printable character: digits, punctuation such as '@' '[' '`' '{' next to the letters */
            c->s[i] = (char)hpc_rand_int(&seed, 32, 127);
    }
    c->s[c->n] = '\0';
    return c;
}
void hpc_reset(void *p) { ctx_t *c = p; memset(c->got, 0xA5, NLETTERS * sizeof(size_t)); }
void hpc_candidate(void *p) { ctx_t *c = p; letter_counts(c->s, c->n, c->got); }
void hpc_baseline(void *p) {
    ctx_t *c = p;
    memset(c->want, 0, NLETTERS * sizeof(size_t));
    for (size_t i = 0; i < c->n; i++) {
        char ch = c->s[i];
        if (ch >= 'a' && ch <= 'z') c->want[ch - 'a']++;
        else if (ch >= 'A' && ch <= 'Z') c->want[ch - 'A']++;
    }
}
int hpc_check(void *p, char *msg, size_t len) {
    ctx_t *c = p;
    for (int b = 0; b < NLETTERS; b++)
        if (c->got[b] != c->want[b]) {
            snprintf(msg, len, "letter '%c': got %zu expected %zu", 'a' + b, c->got[b], c->want[b]);
            return 0;
        }
    return 1;
}
void hpc_free(void *p) { ctx_t *c = p; free(c->s); hpc_output_free(c->got); free(c->want); free(c); }
size_t hpc_result(void *p, void **got, void **want) {
    ctx_t *c = p;
    *got = c->got;
    *want = c->want;
    return NLETTERS * sizeof(size_t);
}
