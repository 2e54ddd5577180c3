/* attn_sparq.c - SparQ Attention (Ribar et al., ICML 2024), as docs/ALGORITHMS.md
 * "SparQ Attention" fixes it.
 *
 * One decode step for one KV head and its g query heads:
 *   1. i1 = the r largest components of sum_h |q_h| (shared by the group).
 *   2. per head: tau_h = sqrt(d * ||q_h[i1]||_1 / ||q_h||_1),
 *      s_hat_h = softmax(q_h[i1] . K[:, i1] / tau_h) over all S positions,
 *      computed from r contiguous rows of K^T (S*r elements read).
 *   3. sel = the last l positions (current included) + the k - l others with
 *      the largest sum_h s_hat_h (or, with select_logits, summed logits).
 *   4. y'_h = exact softmax attention over sel (2*k*d elements read).
 *   5. alpha_h = sum_{sel} s_hat_h;  y_h = alpha_h y'_h + (1 - alpha_h) v_sum/S
 *      (no_realloc: alpha = 1); exactly 1 when all are selected
 *      (sparq_alpha says why).
 * With k >= S every position is selected and alpha is exactly 1, so the
 * step is plain dense attention (and is run and counted as such; through
 * the selecting path, select_always, it gives the same bits for S <
 * 2 * ATTN_PART, where dense attention is one part read in order).
 *
 * Step 2 is one pass over K^T (attn_kt_exp): each block of positions is
 * scored and exponentiated against a running max while in L1, so s_hat_h =
 * (that block's factor) x (stored value) and the g*S logits are never read
 * back for a separate softmax; the selection score and alpha apply the
 * factors on the fly.
 *
 * Transfer per step (elements): S*r (K^T rows) + 2*k*d (K, V rows) + d (read
 * v_sum) + 2*d (this step's k, v appended) + d (the cache's v_sum update) =
 * docs/ALGORITHMS.md's S*r + 2*k*d + 4*d (3*d with no_realloc: v_sum is not read).
 * With k >= S: dense's 2*S*d + 2*d.
 * The reads reported are measured where they happen (attn_meter: the K^T
 * pass, the gather, the v_sum loop); the writes are the cache's append.
 * The cache must hold K^T and v_sum (needs); without them the step still
 * works (K columns read instead of K^T rows, v_sum rebuilt from V, counted).
 *
 * adaptive_k (docs/ALGORITHMS.md "Per-head adaptive k") replaces step 3:
 * each head h gets its own k_h from the entropy of s_hat_h
 * (attn_adaptive_allot: proportional, in [k_min, S], summing to g*k) and
 * takes the window plus the k_h - l older positions with the largest
 * s_hat_h (its own, not the group's sum). The group reads the union U of
 * the heads' selections once: step 4 scores every head on U and masks the
 * positions a head did not select (-inf, weight exactly 0), so each head's
 * softmax runs over its own selection. Transfer: S*r + 2*|U|*d + 4*d, at
 * most S*r + 2*min(S, g*k)*d + 4*d, which transfer_formula reports.
 */
#include "attn/attn.h"
#include "attn/attn_adaptive.h"
#include "util/err.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int sparq_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    if (p->r == 0) p->r = d / 4 >= 1 ? d / 4 : 1;
    if (p->k == 0) p->k = 128;
    if (p->l == -1) p->l = p->k / 4;
    if (p->r < 1) {
        return err_set(err, err_size, "sparq: r=%d must be >= 1", p->r);
    }
    if (p->r > d) {
        return err_set(err, err_size, "sparq: r=%d exceeds head size %d", p->r, d);
    }
    if (p->k < 1) {
        return err_set(err, err_size, "sparq: k=%d must be >= 1", p->k);
    }
    if (p->l < 0) {
        return err_set(err, err_size, "sparq: l=%d must be >= 0 (or -1 for k/4)", p->l);
    }
    if (p->l > p->k) {
        return err_set(err, err_size, "sparq: l=%d exceeds k=%d", p->l, p->k);
    }
    if (p->adaptive_k != 0 && p->adaptive_k != 1) {
        return err_set(err, err_size, "sparq: adaptive_k=%d must be 0 (off) or 1 (on)", p->adaptive_k);
    }
    if (!p->adaptive_k) {
        if (p->k_min != 0) {
            return err_set(err, err_size, "sparq: k_min=%d applies only with adaptive_k", p->k_min);
        }
        return 0;
    }
    if (p->select_logits) { /* one head's logits and probabilities rank alike */
        return err_set(err, err_size, "sparq: adaptive_k ranks each head by its own scores; select_logits does not apply");
    }
    /* default: the window and at least one position chosen by score */
    if (p->k_min == 0) p->k_min = p->l + 1 <= p->k ? p->l + 1 : p->k;
    const int lo = p->l > 1 ? p->l : 1;
    if (p->k_min < lo || p->k_min > p->k) {
        return err_set(err, err_size, "sparq: k_min=%d must be between max(1, l)=%d and k=%d", p->k_min, lo, p->k);
    }
    return 0;
}

/* Scratch carve-up for S positions: see sparq_attend. */
typedef struct sparq_scratch {
    float   *e;     /* [g][S] exp(logit - block's running max)            */
    float   *score; /* [S] selection score                                 */
    float   *scale; /* [g][nb] block factors: s_hat = scale * e            */
    float   *w;     /* [g][k] gather scratch                               */
    float   *qs;    /* [g][r] q_h[i1] / tau_h                              */
    float   *absq;  /* [d] sum_h |q_h|                                     */
    float   *alpha; /* [g]                                                 */
    float   *merge; /* [g*d + 2g] a gather part's out and lse, the running lse */
    int32_t *work;  /* top-k work: attn_topk_work(max(S, d))               */
    int32_t *sel;   /* [k]                                                 */
    int32_t *i1;    /* [d]                                                 */
    /* adaptive_k only (NULL otherwise); u = min(S, g*k) bounds the union */
    double  *H;     /* [g] entropies                                       */
    double  *xw;    /* [g] allotment work                                  */
    int64_t *kh;    /* [g] each head's k                                   */
    int32_t *hsel;  /* [g*k] each head's older positions, head after head  */
    int32_t *mark;  /* [S] position -> its index in the union, or -1       */
    int32_t *keep;  /* [g][u] 1 where head h selected union entry j        */
    size_t   n_f, n_i;
} sparq_scratch;

static sparq_scratch sparq_layout(float *f, int32_t *iw, const sparq_attn_params *p, int64_t S,
                                  int d, int g)
{
    sparq_scratch s;
    const size_t kk = (size_t)(p->k < S ? p->k : S), n = (size_t)S;
    const size_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    const int ad = p->adaptive_k != 0;
    /* positions read: k, or the union of the heads' selections */
    const size_t u = ad ? ((size_t)g * kk < n ? (size_t)g * kk : n) : kk;
    size_t o = 0;
    s.e = f ? f + o : NULL;     o += attn_pad16((size_t)g * n);
    s.score = f ? f + o : NULL; o += attn_pad16(n);
    s.scale = f ? f + o : NULL; o += attn_pad16((size_t)g * nb);
    s.w = f ? f + o : NULL;     o += attn_pad16((size_t)g * u);
    s.qs = f ? f + o : NULL;    o += attn_pad16((size_t)g * d);
    s.absq = f ? f + o : NULL;  o += attn_pad16((size_t)d);
    s.alpha = f ? f + o : NULL; o += attn_pad16((size_t)g);
    s.merge = f ? f + o : NULL; o += attn_pad16((size_t)g * d + 2 * (size_t)g);
    s.H = s.xw = NULL;
    if (ad) { /* doubles in 64-byte aligned float slots */
        s.H = f ? (double *)(void *)(f + o) : NULL;  o += attn_pad16(2 * (size_t)g);
        s.xw = f ? (double *)(void *)(f + o) : NULL; o += attn_pad16(2 * (size_t)g);
    }
    s.n_f = o;
    o = 0;
    s.work = iw ? iw + o : NULL; o += attn_pad16(attn_topk_work(n > (size_t)d ? n : (size_t)d));
    s.sel = iw ? iw + o : NULL;  o += attn_pad16(u);
    s.i1 = iw ? iw + o : NULL;   o += attn_pad16((size_t)d);
    s.kh = NULL;
    s.hsel = s.mark = s.keep = NULL;
    if (ad) {
        s.kh = iw ? (int64_t *)(void *)(iw + o) : NULL; o += attn_pad16(2 * (size_t)g);
        s.hsel = iw ? iw + o : NULL; o += attn_pad16((size_t)g * kk);
        s.mark = iw ? iw + o : NULL; o += attn_pad16(n);
        s.keep = iw ? iw + o : NULL; o += attn_pad16((size_t)g * u);
    }
    s.n_i = o;
    return s;
}

static size_t sparq_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    sparq_scratch s = sparq_layout(NULL, NULL, p, S, d, g);
    return s.n_f > s.n_i ? s.n_f : s.n_i;
}

/* Steps 1-2 input: i1[r] and the pre-scaled query components qs[g][r];
 * absq: d floats, work: attn_topk_work(d). */
static void sparq_components(const float *q, int g, int d, int r, float *absq, int32_t *i1, float *qs,
                             int32_t *work)
{
    for (int j = 0; j < d; j++) {
        float a = 0;
        for (int h = 0; h < g; h++) a += fabsf(q[h * d + j]);
        absq[j] = a;
    }
    attn_topk_indices(absq, d, r, i1, work);
    for (int h = 0; h < g; h++) {
        const float *qh = q + (size_t)h * d;
        float l1 = 0, l1_sel = 0;
        for (int j = 0; j < d; j++) l1 += fabsf(qh[j]);
        for (int c = 0; c < r; c++) l1_sel += fabsf(qh[i1[c]]);
        /* tau -> 0 (the head is zero on i1) would make 0/0 logits: use
         * uniform scores instead, which is their limit for a zero query. */
        const float inv_tau = l1_sel > 0 ? 1.0f / sqrtf((float)d * l1_sel / l1) : 0.0f;
        for (int c = 0; c < r; c++) qs[h * r + c] = qh[i1[c]] * inv_tau;
    }
}

/* attn_kt_exp's outputs from K rows when the cache keeps no K^T: the same
 * logits read strided, exponentiated against each head's overall max (so
 * every block's scale is 1 / sum). */
static void exp_from_k(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                       int64_t n, float *e, float *scale, float *lsum)
{
    const int64_t nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    int64_t read = 0; /* K elements: r components of each row, first head's pass */
    for (int64_t i = 0; i < n; i++) {
        float ls = 0;
        for (int h = 0; h < g; h++) {
            float a = 0;
            int c;
            for (c = 0; c < r; c++) {
                const float k = attn_kv_at(kv->K, kv->elem, kv->d, i, comp[c]);
                a += qs[h * r + c] * k;
            }
            e[h * n + i] = a;
            ls += a;
            if (h == 0) read += c;
        }
        if (lsum) lsum[i] = ls;
    }
    if (kv->meter) kv->meter->k += read;
    for (int h = 0; h < g; h++) {
        float *x = e + h * n, m = -INFINITY;
        double z = 0;
        for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        for (int64_t i = 0; i < n; i++) {
            const float w = expf(x[i] - m);
            z += w;
            x[i] = attn_score_flush(w);
        }
        for (int64_t b = 0; b < nb; b++) scale[h * nb + b] = (float)(1.0 / z); /* >= 1/n: no flush needed */
    }
}

/* vmean[d] = v_sum / S, the d values of v_sum counted into kv->meter; or,
 * when the cache keeps no running sum, V summed instead (S*d counted). */
static void mean_value(const attn_kv_view *kv, float *vmean)
{
    const int64_t S = kv->S;
    const int d = kv->d;
    const float inv_s = 1.0f / (float)S;
    int j;
    if (kv->v_sum) {
        for (j = 0; j < d; j++) vmean[j] = kv->v_sum[j] * inv_s;
        if (kv->meter) kv->meter->v_sum += j;
        return;
    }
    int64_t read = 0;
    for (j = 0; j < d; j++) {
        double a = 0;
        int64_t i;
        for (i = 0; i < S; i++)
            a += attn_kv_at(kv->V, kv->elem, d, i, j);
        vmean[j] = (float)a * inv_s;
        read += i;
    }
    if (kv->meter) kv->meter->v += read;
}

/* alpha_h = sum over the selection of s_hat_h, summed in double over the
 * selected positions (k terms: the step reads only those), and exactly 1
 * when every position is selected. In exact arithmetic the full sum is 1
 * (s_hat_h is a softmax); in float it is 1 only up to its rounding (|alpha
 * - 1| up to ~1e-6), and that error mixes (1 - alpha) v_mean into the
 * output and scales y' by alpha, so a step that selects every position
 * (k >= S through the selecting path) would not be dense attention bit for
 * bit. Why bits matter: the next layer's matrix products round their input
 * to the weights' dot type (f16, q8_0), so an ulp here can flip a rounding
 * there and, fed back through the cache for 50 steps, grew to 2e-3..1.5e-2
 * in tiny-d64's logits. (Summing the complement, the mass left out, is
 * exact too but costs S terms per head instead of k, which at 32k made
 * the SparQ step measurably slower.)
 * Clamped at 1: rounding may carry a near-total sum past it. */
static float sparq_alpha(double selected)
{
    return selected < 1 ? (float)selected : 1.0f;
}

/* sum over j < k of s_hat at sel[j] (e times its block's factor), in
 * double: four partial sums, as one running sum makes every add wait on
 * the last (~3 us a call for g = 3, k = 1024, a twentieth of the call) */
static double selected_mass(const float *e, const float *scale, const int32_t *sel, int64_t k)
{
#define SHAT(j) ((double)scale[sel[j] / ATTN_EXP_BLOCK] * e[sel[j]])
    double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    int64_t j = 0;
    for (; j + 4 <= k; j += 4) {
        a0 += SHAT(j);
        a1 += SHAT(j + 1);
        a2 += SHAT(j + 2);
        a3 += SHAT(j + 3);
    }
    for (; j < k; j++) a0 += SHAT(j);
#undef SHAT
    return (a0 + a1) + (a2 + a3);
}

/* adaptive_k's steps 3-4 and alpha (see the top of the file): s->e and
 * s->scale hold every head's s_hat over S positions; the window is the last
 * l. Writes the union of the heads' selections to s->sel and returns its
 * size, the output to out[g][d] and alpha_h (selected mass) to s->alpha. */
static int64_t adaptive_attend(const attn_kv_view *kv, const sparq_attn_params *p, const float *q, int g,
                               int64_t k, int64_t l, sparq_scratch *s, float *out)
{
    const int64_t S = kv->S, nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    const int64_t lo = p->k_min < S ? p->k_min : S;
    for (int h = 0; h < g; h++) s->H[h] = attn_scores_entropy(s->e + h * S, s->scale + h * nb, S);
    /* resolve keeps l <= k_min <= k and k < S here (or k = S, select_always) */
    if (attn_adaptive_allot(s->H, g, (int64_t)g * k, lo > l ? lo : l, S, s->kh, s->xw))
        for (int h = 0; h < g; h++) s->kh[h] = k; /* unreachable: resolve's bounds */

    /* each head's older positions by its own s_hat, head after head */
    int64_t off = 0;
    for (int h = 0; h < g; h++) {
        attn_scaled_head_sum(s->e + h * S, s->scale + h * nb, 1, S, S - l, s->score);
        attn_topk_indices(s->score, S - l, s->kh[h] - l, s->hsel + off, s->work);
        off += s->kh[h] - l;
    }
    /* the union in increasing position (the rows are read in cache order,
     * and with k >= S in dense attention's order): mark[i] = its index in
     * sel, or -1 */
    for (int64_t i = 0; i < S - l; i++) s->mark[i] = 0;
    for (int64_t i = S - l; i < S; i++) s->mark[i] = 1;
    for (int64_t j = 0; j < off; j++) s->mark[s->hsel[j]] = 1;
    int64_t u = 0;
    for (int64_t i = 0; i < S; i++) {
        if (s->mark[i]) {
            s->mark[i] = (int32_t)u;
            s->sel[u++] = (int32_t)i;
        } else {
            s->mark[i] = -1;
        }
    }
    /* which union entries each head selected */
    memset(s->keep, 0, (size_t)g * (size_t)u * sizeof *s->keep);
    off = 0;
    for (int h = 0; h < g; h++) {
        int32_t *kp = s->keep + (size_t)h * u;
        for (int64_t i = S - l; i < S; i++) kp[s->mark[i]] = 1;
        for (int64_t j = 0; j < s->kh[h] - l; j++) kp[s->mark[s->hsel[off + j]]] = 1;
        off += s->kh[h] - l;
    }
    /* alpha_h: the approximate mass of head h's own selection (the window
     * and its k_h - l by score; sparq_alpha), exactly 1 when it holds all */
    off = 0;
    for (int h = 0; h < g; h++) {
        const float *eh = s->e + h * S, *sc = s->scale + h * nb;
        const int64_t kh = s->kh[h];
        double a = 0;
        for (int64_t i = S - l; kh < S && i < S; i++) a += (double)sc[i / ATTN_EXP_BLOCK] * eh[i];
        for (int64_t j = 0; kh < S && j < kh - l; j++) {
            const int32_t i = s->hsel[off + j];
            a += (double)sc[i / ATTN_EXP_BLOCK] * eh[i];
        }
        off += kh - l;
        s->alpha[h] = kh >= S ? 1.0f : sparq_alpha(a);
    }
    /* 4. each row of the union read once for the group; a head's softmax
     * covers its own selection (the others' scores are -inf: weight 0) */
    attn_scores(kv, q, g, s->sel, u, s->w);
    for (int h = 0; h < g; h++)
        for (int64_t j = 0; j < u; j++)
            if (!s->keep[(size_t)h * u + j]) s->w[(size_t)h * u + j] = -INFINITY;
    attn_softmax_weighted_sum(kv, s->w, g, s->sel, u, out, NULL);
    return u;
}

/* ---- long steps in parts ------------------------------------------------------
 * Step 4 of a step over S >= 2 * ATTN_PART positions reads its k rows in
 * sparq_gather_parts(p, S) parts of about SPARQ_GATHER_ROWS rows each (the
 * selection in its own order, an equal count each), merged in order by
 * their log-sum-exp; the model runs steps 1-3 and alpha (select) as one
 * task per KV head, the parts as tasks on every thread, then step 5
 * (finish) after the merge, so that a layer whose few KV heads would idle
 * threads (smollm2's 3 on 2 cores: a third of every layer) shares the
 * gathers instead. Steps 1-3 stay whole: their scores live in the thread's
 * scratch, where a split would move g x S floats a head between threads.
 * sparq_attend reads the same parts in turn, so a step gives the same bits
 * on any number of threads, alone or in a batch. With k >= S (and not
 * select_always) the parts are dense attention's (attn_dense_part), which
 * attn_dense_group merges in the same order. */
enum { SPARQ_GATHER_ROWS = 512, SPARQ_GATHER_PARTS_MAX = 64 };

static int sparq_everything(const sparq_attn_params *p, int64_t S)
{
    return p->k >= S && !p->select_always;
}

static int sparq_gather_parts(const sparq_attn_params *p, int64_t S)
{
    if (p->adaptive_k || S < 2 * ATTN_PART) return 1;
    const int64_t k = p->k < S ? p->k : S, n = k / SPARQ_GATHER_ROWS;
    return n < 1 ? 1 : n > SPARQ_GATHER_PARTS_MAX ? SPARQ_GATHER_PARTS_MAX : (int)n;
}

static int sparq_n_parts(const sparq_attn_params *p, int64_t S)
{
    if (p->adaptive_k) return 1;
    return sparq_everything(p, S) ? attn_dense_parts(S) : sparq_gather_parts(p, S);
}

/* Rows [j0, j1) of the selection's k: part `part` of `parts`. */
static void gather_part_range(int64_t k, int parts, int part, int64_t *j0, int64_t *j1)
{
    *j0 = k * part / parts;
    *j1 = k * (part + 1) / parts;
}

/* Step 4: out[g][d] over sel[0..k) in `parts` parts merged in order (one:
 * the plain gather). w: the gather's scores, merge: g*d + 2g floats. */
static void sparq_gather(const attn_kv_view *kv, const float *q, int g, const int32_t *sel, int64_t k,
                         int parts, float *out, float *w, float *merge)
{
    if (parts == 1) {
        attn_gather_group(kv, q, g, sel, k, out, w, NULL);
        return;
    }
    const int d = kv->d;
    float *part_out = merge, *part_lse = merge + (size_t)g * d, *lse = part_lse + g;
    for (int part = 0; part < parts; part++) {
        int64_t j0, j1;
        gather_part_range(k, parts, part, &j0, &j1);
        attn_gather_group(kv, q, g, sel + j0, j1 - j0, part ? part_out : out, w, part ? part_lse : lse);
        if (part) attn_merge_part(g, d, out, lse, part_out, part_lse);
    }
}

/* Step 5: out = alpha out + (1 - alpha) v_sum / S per head (vmean: d floats). */
static void sparq_realloc(const attn_kv_view *kv, const sparq_attn_params *p, int g, const float *alpha,
                          float *out, float *vmean)
{
    if (p->no_realloc) return;
    const int d = kv->d;
    mean_value(kv, vmean);
    for (int h = 0; h < g; h++)
        for (int j = 0; j < d; j++) out[h * d + j] = alpha[h] * out[h * d + j] + (1.0f - alpha[h]) * vmean[j];
}

/* Steps 2-3 and alpha (not adaptive_k, not everything), after step 1
 * (s->qs, s->i1): s->sel[0..k) and s->alpha[g], in s's scratch. */
static void sparq_choose(const attn_kv_view *kv, const sparq_attn_params *p, int g, sparq_scratch *s)
{
    const int64_t S = kv->S;
    const int r = p->r;
    const int64_t k = p->k < S ? p->k : S, l = p->l < k ? p->l : k,
                  nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    /* 2. approximate scores over all S positions: s_hat_h[i] =
     * scale[h][block of i] * e[h][i], never stored whole */
    float *lsum = p->select_logits ? s->score : NULL;
    if (kv->KT) attn_kt_exp(kv, s->qs, s->i1, r, g, S, s->e, s->scale, lsum);
    else exp_from_k(kv, s->qs, s->i1, r, g, S, s->e, s->scale, lsum);
    if (!p->select_logits) attn_scaled_head_sum(s->e, s->scale, g, S, S - l, s->score);
    /* 3. selection: top (k - l) of the older positions, then the window */
    attn_topk_indices(s->score, S - l, k - l, s->sel, s->work);
    for (int64_t t = 0; t < l; t++) s->sel[k - l + t] = (int32_t)(S - l + t);
    /* 5. alpha: the approximate mass selected (sparq_alpha) */
    for (int h = 0; h < g; h++)
        s->alpha[h] = p->no_realloc || k >= S ? 1.0f
                    : sparq_alpha(selected_mass(s->e + h * S, s->scale + h * nb, s->sel, k));
}

/* What a staged step's select leaves for its parts and finish. */
typedef struct sparq_shared {
    int32_t *sel;   /* [k]: the selection                     */
    float   *alpha; /* [g]                                    */
    size_t   n_f;
} sparq_shared;

static sparq_shared shared_layout(const float *f, const sparq_attn_params *p, int64_t S, int g)
{
    sparq_shared sh;
    const size_t kk = (size_t)(p->k < S ? p->k : S);
    float *w = (float *)(uintptr_t)f; /* read only where the caller's shared is const */
    sh.alpha = w;
    sh.sel = w ? (int32_t *)(void *)(w + attn_pad16((size_t)g)) : NULL; /* int32 in float slots */
    sh.n_f = attn_pad16((size_t)g) + attn_pad16(kk);
    return sh;
}

static size_t sparq_shared_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)d;
    return shared_layout(NULL, p, S, g).n_f;
}

static void count(const attn_step *step, const attn_meter *m, int64_t written)
{
    if (!step->counts) return;
    step->counts->read += attn_meter_total(m);
    step->counts->written += written;
}

static int sparq_select(void *state, const sparq_attn_params *p, const attn_step *step, float *shared)
{
    const int64_t S = step->kv->S;
    (void)state;
    if (sparq_everything(p, S)) return 0;
    sparq_scratch s = sparq_layout(step->scratch->f, step->scratch->i, p, S, step->kv->d, step->g);
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *step->kv;
    v.meter = &m;
    const sparq_shared sh = shared_layout(shared, p, S, step->g);
    s.sel = sh.sel; /* the selection and alpha go straight to the parts */
    s.alpha = sh.alpha;
    sparq_components(step->q, step->g, step->kv->d, p->r, s.absq, s.i1, s.qs, s.work);
    sparq_choose(&v, p, step->g, &s);
    count(step, &m, 0);
    return 0;
}

static int sparq_attend_part(void *state, const sparq_attn_params *p, const attn_step *step, int part,
                             float *lse, const float *shared)
{
    const int64_t S = step->kv->S;
    (void)state;
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view v = *step->kv;
    v.meter = &m;
    if (sparq_everything(p, S)) {
        attn_dense_part(&v, step->q, step->g, part, step->out, lse, step->scratch->f);
    } else {
        const sparq_shared sh = shared_layout(shared, p, S, step->g);
        int64_t j0, j1;
        gather_part_range(p->k < S ? p->k : S, sparq_gather_parts(p, S), part, &j0, &j1);
        attn_gather_group(&v, step->q, step->g, sh.sel + j0, j1 - j0, step->out, step->scratch->f, lse);
    }
    count(step, &m, 0);
    return 0;
}

static void sparq_finish(void *state, const sparq_attn_params *p, const attn_step *step, const float *shared)
{
    const int64_t S = step->kv->S;
    const int d = step->kv->d;
    (void)state;
    attn_meter m = { 0, 0, 0, 0 };
    if (sparq_everything(p, S)) {
        count(step, &m, 2 * (int64_t)d);
        return;
    }
    attn_kv_view v = *step->kv;
    v.meter = &m;
    sparq_realloc(&v, p, step->g, shared_layout(shared, p, S, step->g).alpha, step->out, step->scratch->f);
    count(step, &m, 3 * (int64_t)d); /* k, v appended; v_sum updated (by the cache) */
}

static int sparq_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    attn_trace *tr = step->trace;
    (void)state;
    const int64_t S = kv->S;
    const int d = kv->d, r = p->r;
    sparq_scratch s = sparq_layout(step->scratch->f, step->scratch->i, p, S, d, g);
    attn_counts cnt = { 0, 0 };
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view mv = *kv; /* every read below is measured into m */
    mv.meter = &m;
    kv = &mv;

    sparq_components(q, g, d, r, s.absq, s.i1, s.qs, s.work);
    if (tr) {
        if (tr->i1) memcpy(tr->i1, s.i1, (size_t)r * sizeof *s.i1);
        tr->n_i1 = r;
    }

    /* everything selected, alpha = 1: dense attention (select_always runs
     * the selection below instead, with k = S, so a test can hold that path
     * to this identity) */
    if (sparq_everything(p, S)) {
        attn_dense_group(kv, q, g, out, s.e);
        cnt.written = 2 * (int64_t)d;
        if (tr) {
            if (tr->sel)
                for (int64_t i = 0; i < S; i++) tr->sel[i] = (int32_t)i;
            tr->n_sel = S;
            if (tr->alpha)
                for (int h = 0; h < g; h++) tr->alpha[h] = 1.0f;
        }
        goto done;
    }

    const int64_t k = p->k < S ? p->k : S, l = p->l < k ? p->l : k;
    float *alpha = s.alpha;
    int64_t n_read = k; /* positions read in step 4 */
    if (p->adaptive_k) {
        /* 2. approximate scores over all S positions, then adaptive_k's steps 3-4 */
        float *lsum = p->select_logits ? s.score : NULL;
        if (kv->KT) attn_kt_exp(kv, s.qs, s.i1, r, g, S, s.e, s.scale, lsum);
        else exp_from_k(kv, s.qs, s.i1, r, g, S, s.e, s.scale, lsum);
        n_read = adaptive_attend(kv, p, q, g, k, l, &s, out);
        if (p->no_realloc)
            for (int h = 0; h < g; h++) alpha[h] = 1.0f;
    } else {
        sparq_choose(kv, p, g, &s); /* 2, 3 and alpha */
        /* 4. exact attention over the selection */
        sparq_gather(kv, q, g, s.sel, k, sparq_gather_parts(p, S), out, s.w, s.merge);
    }
    /* 5. mean-value reallocation (qs is spent; its >= d floats hold v_sum / S) */
    sparq_realloc(kv, p, g, alpha, out, s.qs);
    cnt.written += 3 * d; /* k, v appended; v_sum updated (by the cache) */
    if (tr) {
        if (tr->sel) memcpy(tr->sel, s.sel, (size_t)n_read * sizeof *s.sel);
        tr->n_sel = n_read;
        if (tr->alpha) memcpy(tr->alpha, alpha, (size_t)g * sizeof *alpha);
    }
done:
    cnt.read = attn_meter_total(&m);
    if (step->counts) {
        step->counts->read += cnt.read;
        step->counts->written += cnt.written;
    }
    return 0;
}

static int64_t sparq_transfer(const sparq_attn_params *p, int64_t S, int d, int g)
{
    if (p->k >= S) return 2 * S * d + 2 * (int64_t)d;
    /* adaptive_k reads the union of the heads' selections: at most g*k rows */
    const int64_t rows = p->adaptive_k ? ((int64_t)g * p->k < S ? (int64_t)g * p->k : S) : p->k;
    /* no_realloc never reads v_sum (the cache still keeps it up to date) */
    return S * p->r + 2 * rows * d + (p->no_realloc ? 3 : 4) * (int64_t)d;
}

const attn_policy attn_policy_sparq = {
    .name = "sparq",
    .summary = "r components of every key, then k full rows (SparQ)",
    .in_all = 1,
    .needs = ATTN_NEEDS_KT | ATTN_NEEDS_VSUM,
    .resolve = sparq_resolve,
    .scratch_floats = sparq_scratch_floats,
    .attend = sparq_attend,
    .transfer_formula = sparq_transfer,
    .n_parts = sparq_n_parts,
    .attend_part = sparq_attend_part,
    .shared_floats = sparq_shared_floats,
    .select = sparq_select,
    .finish = sparq_finish,
};
