/* attn_h2o.c - H2O "heavy hitter" eviction (Zhang et al. 2023), fixed budget k
 * as the SparQ paper ran it.
 *
 * State, per (layer, KV head): score[n_ctx], each position's cumulative
 * attention weight over every query so far (prefill rows via observe_prefill's
 * colsum, then every decode step), averaged over the g heads of the group.
 * The alive set lives in the same row: an evicted position's score is
 * -INFINITY (real scores are sums of weights, never negative), so it can
 * never be selected again - a dropped position is gone for good.
 *
 * Decode step (S positions, current included):
 *   1. keep the last l positions (l = k/4 by default) and the k - l alive
 *      older positions with the highest scores (ties: lower position);
 *   2. exact softmax attention over the kept set;
 *   3. one pass over the row: kept positions add their group-averaged
 *      weight, every other position becomes -INFINITY (evicted).
 * With k >= S nothing has ever been evicted and the step is dense.
 *
 * Transfer per step: 2*k*d (K, V of kept rows) + 2*d (k, v appended) +
 * S score reads (step 1) + S score writes (step 3) = docs/ALGORITHMS.md's
 * 2*k*d + 2*d + 2*S. K and V reads are measured by the kernels
 * (attn_meter), the score reads and writes by the two sweeps' trip counts.
 */
#include "attn/attn.h"
#include "util/err.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct h2o_state {
    int      n_layer, n_kv_head, g;
    int64_t  n_ctx;
    float   *score;   /* [n_layer][n_kv_head][n_ctx]; -INFINITY = evicted  */
    int64_t *n_seen;  /* [n_layer][n_kv_head]: score entries initialised   */
} h2o_state;

static int h2o_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    (void)d;
    if (p->k == 0) p->k = 128;
    if (p->l == -1) p->l = p->k / 4;
    if (p->k < 1) {
        return err_set(err, err_size, "h2o: k=%d must be >= 1", p->k);
    }
    if (p->l < 0) {
        return err_set(err, err_size, "h2o: l=%d must be >= 0 (or -1 for k/4)", p->l);
    }
    if (p->l > p->k) {
        return err_set(err, err_size, "h2o: l=%d exceeds k=%d", p->l, p->k);
    }
    return 0;
}

static int h2o_state_create(const sparq_attn_params *p, const attn_shape *shape, void **out)
{
    (void)p;
    *out = NULL;
    if (shape->n_layer < 1 || shape->n_kv_head < 1 || shape->g < 1 || shape->n_ctx < 1) return -1;
    const size_t rows = (size_t)shape->n_layer * (size_t)shape->n_kv_head;
    if ((size_t)shape->n_ctx > SIZE_MAX / sizeof(float) / rows) return -1;
    h2o_state *s = calloc(1, sizeof *s);
    if (!s) return -1;
    s->n_layer = shape->n_layer;
    s->n_kv_head = shape->n_kv_head;
    s->g = shape->g;
    s->n_ctx = shape->n_ctx;
    /* untouched pages of a long context stay uncommitted: rows are
     * initialised lazily, as positions arrive (n_seen) */
    s->score = malloc(rows * (size_t)shape->n_ctx * sizeof(float));
    s->n_seen = calloc(rows, sizeof *s->n_seen);
    if (!s->score || !s->n_seen) {
        free(s->score);
        free(s->n_seen);
        free(s);
        return -1;
    }
    *out = s;
    return 0;
}

static void h2o_state_free(void *state)
{
    h2o_state *s = state;
    if (!s) return;
    free(s->score);
    free(s->n_seen);
    free(s);
}

/* The score row of (layer, kv_head), with positions [n_seen, S) brought in
 * alive with score 0. NULL if S does not fit the state. */
static float *h2o_row(h2o_state *s, int layer, int kv_head, int64_t S)
{
    if (!s || layer < 0 || layer >= s->n_layer || kv_head < 0 || kv_head >= s->n_kv_head ||
        S > s->n_ctx)
        return NULL;
    const size_t r = (size_t)layer * s->n_kv_head + (size_t)kv_head;
    float *row = s->score + r * (size_t)s->n_ctx;
    for (int64_t i = s->n_seen[r]; i < S; i++) row[i] = 0.0f;
    if (S > s->n_seen[r]) s->n_seen[r] = S;
    return row;
}

static void h2o_observe_prefill(void *state, const sparq_attn_params *p, int layer, int kv_head,
                                const attn_kv_view *kv, const float *colsum)
{
    (void)p;
    h2o_state *s = state;
    float *row = h2o_row(s, layer, kv_head, kv->S);
    if (!row || !colsum) return;
    const float inv_g = 1.0f / (float)s->g;
    for (int64_t i = 0; i < kv->S; i++) row[i] += colsum[i] * inv_g; /* -INF stays -INF */
}

typedef struct h2o_scratch {
    float   *cand;     /* [S] scores of the older alive positions         */
    float   *w;        /* [g][k] attention weights over the kept set      */
    int32_t *cand_pos; /* [S] their positions                             */
    int32_t *work;     /* top-k work: attn_topk_work(S)                   */
    int32_t *pick;     /* [k] top-k result (indices into cand)            */
    int32_t *sel;      /* [k] kept positions                              */
    size_t   n_f, n_i;
} h2o_scratch;

static h2o_scratch h2o_layout(float *f, int32_t *iw, const sparq_attn_params *p, int64_t S, int g)
{
    h2o_scratch s;
    const size_t n = (size_t)S, kk = (size_t)(p->k < S ? p->k : S);
    size_t o = 0;
    s.cand = f ? f + o : NULL; o += attn_pad16(n);
    s.w = f ? f + o : NULL;    o += attn_pad16((size_t)g * kk);
    s.n_f = o;
    o = 0;
    s.cand_pos = iw ? iw + o : NULL; o += attn_pad16(n);
    s.work = iw ? iw + o : NULL;     o += attn_pad16(attn_topk_work(n));
    s.pick = iw ? iw + o : NULL;     o += attn_pad16(kk);
    s.sel = iw ? iw + o : NULL;      o += attn_pad16(kk);
    s.n_i = o;
    return s;
}

static size_t h2o_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)d;
    h2o_scratch s = h2o_layout(NULL, NULL, p, S, g);
    return s.n_f > s.n_i ? s.n_f : s.n_i;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int h2o_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    attn_trace *tr = step->trace;
    const int64_t S = kv->S, d = kv->d;
    h2o_scratch s = h2o_layout(step->scratch->f, step->scratch->i, p, S, g);
    float *row = h2o_row(state, step->layer, step->kv_head, S);
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view mv = *kv;
    mv.meter = &m;
    kv = &mv;
    if (!row) { /* no state for this head (cannot happen via the model) */
        attn_dense_group(kv, q, g, out, step->scratch->f);
        if (step->counts) {
            step->counts->read += attn_meter_total(&m);
            step->counts->written += 2 * d;
        }
        if (tr) tr->n_sel = 0;
        return 0;
    }

    /* 1. selection: the window, then the best older alive positions */
    const int64_t k = p->k, ws = S - (p->l < S ? p->l : S);
    int64_t n_sel = 0, n_cand = 0, i;
    for (i = 0; i < S; i++) {
        const float v = row[i];
        if (v == -INFINITY) continue;
        if (i >= ws) {
            s.sel[n_sel++] = (int32_t)i;
        } else {
            s.cand[n_cand] = v;
            s.cand_pos[n_cand++] = (int32_t)i;
        }
    }
    const int64_t score_reads = i;
    int64_t rest = k - n_sel;
    if (rest > n_cand) rest = n_cand;
    if (rest > 0) {
        /* candidates are in position order, so ties still go to the lower position */
        attn_topk_indices(s.cand, n_cand, rest, s.pick, s.work);
        for (int64_t j = 0; j < rest; j++) s.sel[n_sel++] = s.cand_pos[s.pick[j]];
    }

    /* 2. exact attention over the kept set */
    attn_scores(kv, q, g, s.sel, n_sel, s.w);
    attn_softmax(s.w, g, n_sel);
    attn_weighted_sum(kv, s.w, g, s.sel, n_sel, out);
    if (tr) { /* before the sort below reorders sel */
        if (tr->sel)
            for (int64_t j = 0; j < n_sel; j++) tr->sel[j] = s.sel[j];
        tr->n_sel = n_sel;
        tr->n_i1 = 0;
        if (tr->alpha)
            for (int h = 0; h < g; h++) tr->alpha[h] = 1.0f;
    }

    /* 3. accumulate the kept positions' group-averaged weights, then one
     * sweep of the row in position order evicts everything else */
    const float inv_g = 1.0f / (float)g;
    for (int64_t j = 0; j < n_sel; j++) {
        float a = 0;
        for (int h = 0; h < g; h++) a += s.w[h * n_sel + j];
        row[s.sel[j]] += a * inv_g;
    }
    qsort(s.sel, (size_t)n_sel, sizeof *s.sel, cmp_i32);
    int64_t j = 0;
    for (i = 0; i < S; i++) {
        if (j < n_sel && s.sel[j] == i) j++;
        else row[i] = -INFINITY;
    }
    const int64_t score_writes = i; /* kept entries updated above, the rest evicted here */

    if (step->counts) {
        step->counts->read += attn_meter_total(&m) + score_reads;
        step->counts->written += 2 * d + score_writes;
    }
    return 0;
}

static int64_t h2o_transfer(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)g;
    const int64_t k = p->k < S ? p->k : S;
    return 2 * k * d + 2 * (int64_t)d + 2 * S;
}

const attn_policy attn_policy_h2o = {
    .name = "h2o",
    .summary = "heavy hitters by cumulative attention + recent window, evicted for good",
    .in_all = 1,
    .needs = ATTN_NEEDS_COLSUM,
    .resolve = h2o_resolve,
    .state_create = h2o_state_create,
    .state_free = h2o_state_free,
    .observe_prefill = h2o_observe_prefill,
    .scratch_floats = h2o_scratch_floats,
    .attend = h2o_attend,
    .transfer_formula = h2o_transfer,
};
