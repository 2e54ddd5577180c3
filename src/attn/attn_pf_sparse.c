/* attn_pf_sparse.c - sparse prefill attention (attn_pf_sparse.h): window,
 * sinks, and top-k through a growing inverted file.
 */
#include "attn/attn_pf_sparse.h"
#include "index/index.h"
#include "util/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { PF_TRAIN_PER_LIST = 16, PF_KMEANS_ITER = 6 };

typedef struct pf_head {
    int64_t  upto;      /* positions [n_sink, upto) are indexed (or scanned) */
    int      trained;
    float   *cb, *hn;   /* blocked centroids, |c|^2/2 (idx_assign's form)    */
    int32_t **list;     /* [nlist] positions, ascending                      */
    int64_t *len, *cap; /* [nlist]                                           */
} pf_head;

typedef struct pf_thread {
    float   *qm;        /* [g][d] the block's mean query per head            */
    float   *blk;       /* [d][16] a gathered block of keys, f32             */
    float   *row;       /* [d] one key                                       */
    float   *s16;       /* [g][16] scores of a block                         */
    float   *ls;        /* [nlist] a list's best score over the g queries    */
    int32_t *lord;      /* [nlist] lists, ranked                             */
    float   *tks;       /* [g][k + 32] top-k candidates                      */
    int32_t *tki;
    idx_topk *tk;       /* [g]                                               */
    int32_t *sel;       /* [g * k] selected positions                        */
    float   *sels;
} pf_thread;

struct attn_pf_sparse {
    sparq_prefill_params p;
    int n_layer, n_kv_head, d, g, n_threads, ncb;
    pf_head   *head;   /* [n_layer][n_kv_head] */
    pf_thread *thr;    /* [n_threads]          */
};

static const char *const mode_names[] = { "exact", "window", "topk", "policy" };
enum { N_MODES = (int)(sizeof mode_names / sizeof mode_names[0]) };

const char *sparq_prefill_mode_name(int i) { return i >= 0 && i < N_MODES ? mode_names[i] : NULL; }

int sparq_prefill_mode_find(const char *name)
{
    for (int i = 0; name && i < N_MODES; i++)
        if (strcmp(name, mode_names[i]) == 0) return i;
    return -1;
}

sparq_prefill_params attn_pf_resolve(const sparq_prefill_params *p, int64_t cap)
{
    sparq_prefill_params r = *p;
    if (r.window == 0) r.window = 1024;
    if (r.n_sink == 0) r.n_sink = 16;
    if (r.k == 0) r.k = 256;
    if (r.nlist == 0) {
        const double n = 2.0 * sqrt((double)(cap > 0 ? cap : 1));
        r.nlist = n < 16 ? 16 : n > 4096 ? 4096 : (int)n;
    }
    if (r.nprobe == 0) r.nprobe = 16;
    return r;
}

sparq_prefill_params sparq_prefill_resolve(const sparq_prefill_params *p, int64_t n_ctx)
{
    return attn_pf_resolve(p, n_ctx);
}

int attn_pf_check(const sparq_prefill_params *p, char *err, size_t err_size)
{
    if (p->mode < 0 || p->mode >= N_MODES) return err_set(err, err_size, "prefill attention: no mode %d", p->mode);
    if (p->window < 1) return err_set(err, err_size, "prefill window must be >= 1, not %d", p->window);
    if (p->n_sink < 0) return err_set(err, err_size, "prefill sinks must be >= 0, not %d", p->n_sink);
    if (p->k < 1 || p->k > (1 << 20)) return err_set(err, err_size, "prefill top-k must be in [1, 2^20], not %d", p->k);
    if (p->nlist < 1 || p->nlist > (1 << 16))
        return err_set(err, err_size, "prefill index lists must be in [1, 65536], not %d", p->nlist);
    if (p->nprobe < 1) return err_set(err, err_size, "prefill index probes must be >= 1, not %d", p->nprobe);
    return 0;
}

int64_t attn_pf_window_lo(const sparq_prefill_params *p, int64_t pos0)
{
    const int64_t lo = pos0 - p->window;
    return lo <= 0 ? 0 : lo / ATTN_PF_BK * ATTN_PF_BK;
}

static void head_clear(pf_head *h, int nlist)
{
    h->upto = 0;
    h->trained = 0;
    for (int l = 0; h->len && l < nlist; l++) h->len[l] = 0;
}

void attn_pf_sparse_free(attn_pf_sparse *s)
{
    if (!s) return;
    for (int i = 0; s->head && i < s->n_layer * s->n_kv_head; i++) {
        pf_head *h = &s->head[i];
        for (int l = 0; h->list && l < s->p.nlist; l++) free(h->list[l]);
        free(h->list);
        free(h->len);
        free(h->cap);
        free(h->cb);
        free(h->hn);
    }
    for (int t = 0; s->thr && t < s->n_threads; t++) {
        pf_thread *x = &s->thr[t];
        free(x->qm); free(x->blk); free(x->row); free(x->s16); free(x->ls); free(x->lord);
        free(x->tks); free(x->tki); free(x->tk); free(x->sel); free(x->sels);
    }
    free(s->head);
    free(s->thr);
    free(s);
}

void attn_pf_sparse_reset(attn_pf_sparse *s)
{
    for (int i = 0; i < s->n_layer * s->n_kv_head; i++) head_clear(&s->head[i], s->p.nlist);
}

const sparq_prefill_params *attn_pf_sparse_params(const attn_pf_sparse *s) { return &s->p; }

int attn_pf_sparse_create(const sparq_prefill_params *p, int n_layer, int n_kv_head, int d, int g,
                          int n_threads, attn_pf_sparse **out, char *err, size_t err_size)
{
    *out = NULL;
    if (attn_pf_check(p, err, err_size)) return -1;
    if (g < 1 || g > IDX_MAX_G || d < 1 || d > IDX_MAX_D || n_threads < 1)
        return err_set(err, err_size, "sparse prefill: unsupported shape (group %d, head size %d)", g, d);
    attn_pf_sparse *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, err_size, "sparse prefill: out of memory");
    s->p = *p;
    s->n_layer = n_layer;
    s->n_kv_head = n_kv_head;
    s->d = d;
    s->g = g;
    s->n_threads = n_threads;
    s->ncb = (p->nlist + IDX_BLOCK - 1) / IDX_BLOCK;
    const int nl = p->nlist, k = p->k, tcap = k + 32;
    const size_t nh = (size_t)n_layer * n_kv_head;
    s->head = calloc(nh, sizeof *s->head);
    s->thr = calloc((size_t)n_threads, sizeof *s->thr);
    int bad = !s->head || !s->thr;
    for (size_t i = 0; !bad && i < nh && p->mode == SPARQ_PREFILL_TOPK; i++) {
        pf_head *h = &s->head[i];
        h->list = calloc((size_t)nl, sizeof *h->list);
        h->len = calloc((size_t)nl, sizeof *h->len);
        h->cap = calloc((size_t)nl, sizeof *h->cap);
        h->cb = malloc((size_t)s->ncb * IDX_BLOCK * d * sizeof(float));
        h->hn = malloc((size_t)s->ncb * IDX_BLOCK * sizeof(float));
        bad = !h->list || !h->len || !h->cap || !h->cb || !h->hn;
    }
    for (int t = 0; !bad && t < n_threads && p->mode == SPARQ_PREFILL_TOPK; t++) {
        pf_thread *x = &s->thr[t];
        x->qm = malloc((size_t)g * d * sizeof(float));
        x->blk = malloc((size_t)d * IDX_BLOCK * sizeof(float));
        x->row = malloc((size_t)d * sizeof(float));
        x->s16 = malloc((size_t)g * IDX_BLOCK * sizeof(float));
        x->ls = malloc((size_t)s->ncb * IDX_BLOCK * sizeof(float));
        x->lord = malloc((size_t)nl * sizeof(int32_t));
        x->tks = malloc((size_t)g * tcap * sizeof(float));
        x->tki = malloc((size_t)g * tcap * sizeof(int32_t));
        x->tk = malloc((size_t)g * sizeof(idx_topk));
        x->sel = malloc((size_t)g * k * sizeof(int32_t));
        x->sels = malloc((size_t)g * k * sizeof(float));
        bad = !x->qm || !x->blk || !x->row || !x->s16 || !x->ls || !x->lord || !x->tks || !x->tki || !x->tk ||
              !x->sel || !x->sels;
    }
    if (bad) {
        attn_pf_sparse_free(s);
        return err_set(err, err_size, "sparse prefill: out of memory for its index");
    }
    *out = s;
    return 0;
}

/* ---- the growing inverted file ------------------------------------------------------- */

static int list_push(pf_head *h, int l, int32_t pos)
{
    if (h->len[l] == h->cap[l]) {
        const int64_t nc = h->cap[l] ? 2 * h->cap[l] : 64;
        int32_t *nl = realloc(h->list[l], (size_t)nc * sizeof *nl);
        if (!nl) return -1;
        h->list[l] = nl;
        h->cap[l] = nc;
    }
    h->list[l][h->len[l]++] = pos;
    return 0;
}

/* Assigns keys [a, b) to their nearest centroids, appending to the lists. */
static int assign_range(attn_pf_sparse *s, pf_head *h, const attn_kv_view *kv, int64_t a, int64_t b)
{
    enum { CHUNK = 4096 };
    for (int64_t c0 = a; c0 < b; c0 += CHUNK) {
        const int64_t c1 = b - c0 < CHUNK ? b : c0 + CHUNK;
        float *x = attn_kv_keys_f32(kv, c0, c1);
        int32_t *lab = malloc((size_t)(c1 - c0) * sizeof *lab);
        float *best = malloc((size_t)(c1 - c0) * sizeof *best);
        int bad = !x || !lab || !best;
        if (!bad) idx_assign(x, c1 - c0, s->d, h->cb, h->hn, s->p.nlist, lab, best);
        for (int64_t i = 0; !bad && i < c1 - c0; i++) bad = list_push(h, lab[i], (int32_t)(c0 + i));
        free(x);
        free(lab);
        free(best);
        if (bad) return -1;
    }
    return 0;
}

int attn_pf_sparse_grow(attn_pf_sparse *s, int layer, int head, const attn_kv_view *kv, int64_t pos0,
                        char *err, size_t err_size)
{
    if (s->p.mode != SPARQ_PREFILL_TOPK) return 0;
    pf_head *h = &s->head[(size_t)layer * s->n_kv_head + head];
    const int64_t lo = attn_pf_window_lo(&s->p, pos0), sink = s->p.n_sink;
    if (h->upto < sink) h->upto = sink;
    if (lo <= h->upto) return 0;
    if (h->trained) {
        if (assign_range(s, h, kv, h->upto, lo))
            return err_set(err, err_size, "sparse prefill: out of memory for the index lists");
        h->upto = lo;
        return 0;
    }
    h->upto = lo; /* untrained: the older keys are scanned whole */
    const int64_t n = lo - sink, nl = s->p.nlist;
    if (n < PF_TRAIN_PER_LIST * nl) return 0;
    float *x = attn_kv_keys_f32(kv, sink, lo);
    if (!x) return err_set(err, err_size, "sparse prefill: out of memory training the index");
    char e2[160];
    /* a sample of 32 keys per list is plenty for k-means; a context loaded
     * with many positions must not train on all of them */
    const int64_t n_train = n < 2 * PF_TRAIN_PER_LIST * nl ? n : 2 * PF_TRAIN_PER_LIST * nl;
    const idx_kmeans_params kp = {.nc = (int)nl,
                                  .n_train = n_train,
                                  .n_iter = PF_KMEANS_ITER,
                                  .seed = 0x5eed + (uint64_t)layer * 131 + head,
                                  .n_threads = 1};
    const int rc = idx_ivf_centroids(x, n, s->d, &kp, h->cb, h->hn, e2, sizeof e2);
    free(x);
    if (rc) return err_set(err, err_size, "sparse prefill: %s", e2);
    h->trained = 1;
    if (assign_range(s, h, kv, sink, lo))
        return err_set(err, err_size, "sparse prefill: out of memory for the index lists");
    return 0;
}

int attn_pf_sparse_ivf(const attn_pf_sparse *s, int layer, int head, const attn_kv_view *kv, int64_t n,
                       attn_pf_ivf *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const pf_head *h = &s->head[(size_t)layer * s->n_kv_head + head];
    if (s->p.mode != SPARQ_PREFILL_TOPK || !h->trained) return 1;
    const int nl = s->p.nlist, d = s->d;
    if (n < 1 || n > kv->S || nl > n) return 1;
    const size_t cb = (size_t)nl * d * sizeof(float);
    uint8_t *mem = malloc(cb + (size_t)n * sizeof(int32_t));
    if (!mem) return err_set(err, err_size, "sparse prefill: out of memory exporting the index");
    float *c = (float *)(void *)mem;
    int32_t *lab = (int32_t *)(void *)(mem + cb);
    for (int l = 0; l < nl; l++) /* unblock: [ncb][d][16] -> [nl][d] */
        for (int j = 0; j < d; j++)
            c[(size_t)l * d + j] = h->cb[((size_t)(l / IDX_BLOCK) * d + j) * IDX_BLOCK + l % IDX_BLOCK];
    for (int64_t i = 0; i < n; i++) lab[i] = -1;
    for (int l = 0; l < nl; l++)
        for (int64_t i = 0; i < h->len[l]; i++)
            if (h->list[l][i] < n) lab[h->list[l][i]] = l;
    /* the sinks and the last window never left it: assign them now */
    enum { CHUNK = 1024 };
    float *x = malloc((size_t)CHUNK * d * sizeof(float)), *best = malloc(CHUNK * sizeof(float));
    int32_t *tl = malloc(CHUNK * sizeof(int32_t)), *pos = malloc(CHUNK * sizeof(int32_t));
    int bad = !x || !best || !tl || !pos;
    for (int64_t i = 0; !bad && i < n;) {
        int m = 0;
        for (; i < n && m < CHUNK; i++)
            if (lab[i] < 0) {
                attn_kv_row_f32(kv->K, kv->elem, d, i, d, x + (size_t)m * d);
                pos[m++] = (int32_t)i;
            }
        if (m) idx_assign(x, m, d, h->cb, h->hn, nl, tl, best);
        for (int r = 0; r < m; r++) lab[pos[r]] = tl[r];
    }
    free(x);
    free(best);
    free(tl);
    free(pos);
    if (bad) {
        free(mem);
        return err_set(err, err_size, "sparse prefill: out of memory exporting the index");
    }
    out->block = mem;
    out->centroids = c;
    out->labels = lab;
    out->nlist = nl;
    return 0;
}

/* ---- selection --------------------------------------------------------------------------- */

/* Scores positions pos[0..n) (or a + 0..n when pos is NULL) against the
 * mean queries, pushing them into the per-head top-k buffers. */
static void scan(const attn_pf_sparse *s, pf_thread *x, const attn_kv_view *kv, const int32_t *pos, int64_t a,
                 int64_t n)
{
    const int d = s->d, g = s->g;
    for (int64_t i0 = 0; i0 < n; i0 += IDX_BLOCK) {
        const int nb = n - i0 < IDX_BLOCK ? (int)(n - i0) : IDX_BLOCK;
        int32_t ids[IDX_BLOCK];
        for (int r = 0; r < IDX_BLOCK; r++) {
            const int64_t p = r < nb ? (pos ? pos[i0 + r] : a + i0 + r) : 0;
            ids[r] = (int32_t)p;
            if (r < nb) attn_kv_row_f32(kv->K, kv->elem, d, p, d, x->row);
            else memset(x->row, 0, (size_t)d * sizeof(float));
            for (int e = 0; e < d; e++) x->blk[(size_t)e * IDX_BLOCK + r] = x->row[e];
        }
        idx_block_scores(IDX_F32, x->blk, NULL, d, x->qm, g, x->s16);
        const uint32_t valid = nb == IDX_BLOCK ? 0xffffu : (1u << nb) - 1;
        for (int j = 0; j < g; j++) idx_topk_push16(&x->tk[j], x->s16 + j * IDX_BLOCK, ids, 0, valid);
    }
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Selects the block's older keys into x->sel; returns their number. */
static int select_older(attn_pf_sparse *s, pf_thread *x, const pf_head *h, const attn_kv_view *kv, int64_t lo,
                        int nt, const float *q, size_t q_stride)
{
    const int d = s->d, g = s->g, k = s->p.k, nl = s->p.nlist;
    for (int j = 0; j < g; j++) { /* mean query of head j over the block's tokens */
        float *m = x->qm + (size_t)j * d;
        memset(m, 0, (size_t)d * sizeof(float));
        for (int t = 0; t < nt; t++)
            for (int e = 0; e < d; e++) m[e] += q[(size_t)t * q_stride + (size_t)j * d + e];
        for (int e = 0; e < d; e++) m[e] /= (float)nt;
        idx_topk_init(&x->tk[j], x->tks + (size_t)j * (k + 32), x->tki + (size_t)j * (k + 32), k + 32, k);
    }
    const int64_t sink = s->p.n_sink;
    const int64_t upto = h->upto > sink ? (h->upto < lo ? h->upto : lo) : sink;
    if (!h->trained) {
        scan(s, x, kv, NULL, sink, upto - sink);
    } else {
        /* lists ranked by their centroid's best score over the mean queries */
        for (int b = 0; b < s->ncb; b++) {
            idx_block_scores(IDX_F32, h->cb + (size_t)b * d * IDX_BLOCK, NULL, d, x->qm, g, x->s16);
            for (int r = 0; r < IDX_BLOCK && b * IDX_BLOCK + r < nl; r++) {
                float best = -INFINITY;
                for (int j = 0; j < g; j++) best = fmaxf(best, x->s16[j * IDX_BLOCK + r]);
                x->ls[b * IDX_BLOCK + r] = best;
                x->lord[b * IDX_BLOCK + r] = b * IDX_BLOCK + r;
            }
        }
        const int np = s->p.nprobe < nl ? s->p.nprobe : nl;
        idx_select(x->ls, x->lord, nl, np);
        for (int i = 0; i < np; i++) {
            const int l = x->lord[i];
            int64_t n = h->len[l]; /* positions ascending: stop at upto */
            while (n > 0 && h->list[l][n - 1] >= upto) n--;
            scan(s, x, kv, h->list[l], 0, n);
        }
    }
    scan(s, x, kv, NULL, upto, lo - upto); /* left the window since the chunk began */
    int n = 0;
    for (int j = 0; j < g; j++) {
        idx_topk_finish(&x->tk[j], k, x->sel + n, x->sels + n);
        int w = n; /* drop the -1 padding of a short list */
        for (int r = 0; r < k; r++)
            if (x->sel[n + r] >= 0) x->sel[w++] = x->sel[n + r];
        n = w;
    }
    qsort(x->sel, (size_t)n, sizeof *x->sel, cmp_i32);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (u == 0 || x->sel[i] != x->sel[u - 1]) x->sel[u++] = x->sel[i];
    return u;
}

int attn_pf_sparse_exact(const attn_pf_sparse *s, int64_t pos)
{
    const int64_t lo = attn_pf_window_lo(&s->p, pos), sink = s->p.n_sink < lo ? s->p.n_sink : lo;
    return s->p.mode == SPARQ_PREFILL_EXACT || lo <= sink || (s->p.mode == SPARQ_PREFILL_TOPK && lo - sink <= s->p.k);
}

void attn_pf_sparse_block(attn_pf_sparse *s, int thread, int layer, int head, const attn_kv_view *kv,
                          const attn_pf_rows *b, float *scratch, int64_t *n_keys)
{
    const int64_t pos0 = b->pos0;
    const int nt = b->nt;
    const int64_t end = pos0 + nt, lo = attn_pf_window_lo(&s->p, pos0);
    const int64_t sink = s->p.n_sink < lo ? s->p.n_sink : lo;
    attn_pf_seg seg[3] = { { 0, end, NULL, 0 } };
    int n_seg = 1;
    int64_t seen = end;
    if (s->p.mode != SPARQ_PREFILL_EXACT && lo > sink) {
        int n_sel = 0;
        const int32_t *sel = NULL;
        if (s->p.mode == SPARQ_PREFILL_TOPK && lo - sink > s->p.k) {
            pf_thread *x = &s->thr[thread];
            n_sel = select_older(s, x, &s->head[(size_t)layer * s->n_kv_head + head], kv, lo, nt, b->q, b->q_stride);
            sel = x->sel;
        } else if (s->p.mode == SPARQ_PREFILL_TOPK) {
            n_sel = (int)(lo - sink); /* every older key: the exact pass */
        }
        if (n_sel < lo - sink) {
            seg[0] = (attn_pf_seg){ 0, sink, NULL, 0 };
            seg[1] = (attn_pf_seg){ 0, 0, sel, n_sel };
            seg[2] = (attn_pf_seg){ lo, end, NULL, 0 };
            n_seg = 3;
            seen = sink + n_sel + (end - lo);
        }
    }
    attn_prefill_block_segs(kv, seg, n_seg, b, scratch);
    if (n_keys) *n_keys = seen;
}
