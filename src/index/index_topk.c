/* index_topk.c - the top-k candidate buffers every blocked scan fills
 * (index.h: idx_topk_*), in a module of their own below the scan and its
 * kernel twins, which all push into them: a threshold buffer that a
 * quickselect shrinks to the best k, merged across threads, sorted once at
 * the end.
 */
#include "index/index.h"

#include <math.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* ---- top-k buffers ----------------------------------------------------------- */

/* The total order of candidates: higher score first, then lower id. Ids are
 * unique within a buffer, so this is strict and results are independent of
 * how the keys were split among threads. */
ALWAYS_INLINE int better(float sa, int32_t ia, float sb, int32_t ib)
{
    return sa > sb || (sa == sb && ia < ib);
}

ALWAYS_INLINE void swap2(float *s, int32_t *id, int64_t a, int64_t b)
{
    float ts = s[a];
    s[a] = s[b];
    s[b] = ts;
    int32_t ti = id[a];
    id[a] = id[b];
    id[b] = ti;
}

void idx_select(float *s, int32_t *id, int64_t n, int64_t m)
{
    if (m <= 0 || m >= n) return;
    int64_t lo = 0, hi = n - 1, kth = m - 1;
    uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (lo < hi) {
        /* random pivot: expected linear time whatever the input order */
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        swap2(s, id, lo + (int64_t)(rng % (uint64_t)(hi - lo + 1)), hi);
        float ps = s[hi];
        int32_t pi = id[hi];
        int64_t st = lo;
        for (int64_t i = lo; i < hi; i++)
            if (better(s[i], id[i], ps, pi)) swap2(s, id, i, st++);
        swap2(s, id, st, hi);
        if (st == kth) break;
        if (st < kth) lo = st + 1;
        else hi = st - 1;
    }
}

/* Heap sort, best first: a max-heap on "worse" pops the worst to the end. */
static void sift_down(float *s, int32_t *id, int64_t i, int64_t n)
{
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) return;
        if (c + 1 < n && better(s[c], id[c], s[c + 1], id[c + 1])) c++;
        if (!better(s[i], id[i], s[c], id[c])) return;
        swap2(s, id, i, c);
        i = c;
    }
}

static void sort_best_first(float *s, int32_t *id, int64_t n)
{
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down(s, id, i, n);
    for (int64_t e = n - 1; e > 0; e--) {
        swap2(s, id, 0, e);
        sift_down(s, id, 0, e);
    }
}

void idx_topk_init(idx_topk *t, float *s, int32_t *id, int cap, int k)
{
    t->s = s;
    t->id = id;
    t->n = 0;
    t->cap = cap;
    t->k = k;
    t->thr = -INFINITY;
}

void idx_topk_shrink(idx_topk *t)
{
    if (t->n <= t->k) return;
    idx_select(t->s, t->id, t->n, t->k);
    t->n = t->k;
    float m = t->s[0];
    for (int i = 1; i < t->n; i++)
        if (t->s[i] < m) m = t->s[i];
    t->thr = m;
}

void idx_topk_push16_ref(idx_topk *t, const float *s16, const int32_t *ids16,
                         int32_t base, uint32_t valid)
{
    for (int r = 0; r < IDX_BLOCK; r++) {
        if (!(valid >> r & 1) || !(s16[r] >= t->thr)) continue;
        if (t->n == t->cap) {
            idx_topk_shrink(t);
            if (!(s16[r] >= t->thr)) continue;
        }
        t->s[t->n] = s16[r];
        t->id[t->n] = ids16 ? ids16[r] : base + r;
        t->n++;
    }
}


void idx_topk_merge(idx_topk *dst, const idx_topk *src)
{
    for (int i = 0; i < src->n; i++) {
        if (!(src->s[i] >= dst->thr)) continue;
        if (dst->n == dst->cap) {
            idx_topk_shrink(dst);
            if (!(src->s[i] >= dst->thr)) continue;
        }
        dst->s[dst->n] = src->s[i];
        dst->id[dst->n] = src->id[i];
        dst->n++;
    }
}

void idx_topk_finish(idx_topk *t, int k_out, int32_t *ids, float *scores)
{
    idx_topk_shrink(t);
    sort_best_first(t->s, t->id, t->n);
    for (int r = 0; r < k_out; r++) {
        ids[r] = r < t->n ? t->id[r] : -1;
        scores[r] = r < t->n ? t->s[r] : -INFINITY;
    }
}

int idx_topk_cap(int64_t k, int64_t n)
{
    int64_t keff = k < n ? k : n;
    int64_t cap = 2 * keff + 32;
    if (cap > n + 32) cap = n + 32;  /* never more than everything */
    return (int)cap;
}
