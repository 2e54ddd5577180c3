/* attn_topk.c - top-k attention over a key index (Synk, Hoover et al.;
 * docs/ALGORITHMS.md "Top-k attention over a key index").
 *
 * The cache splits at the prefix boundary P:
 *   prefix [0, P)  indexed once per (layer, KV head); every decode step asks
 *                  the index for each query head's k best positions by
 *                  q_h . k_i, one search for the whole GQA group;
 *   suffix [P, S)  later prompt tokens and every generated token, read
 *                  densely.
 * Per query head: y_h = softmax(q_h . [K[sel_h]; K[P..S)] / sqrt(d)) applied
 * to [V[sel_h]; V[P..S)], one stable softmax over both parts. When the
 * index scores the cache's own key values (f16 keys of an f16 cache, hnsw)
 * its scores are used as they are; otherwise (int8 / bf16 keys, the sparq
 * selector) the selected rows are rescored from the cache's K, so an
 * approximate index changes which rows are read, never the arithmetic on
 * them. With k >= P every position is read and the step is dense attention
 * (run and counted as the dense policy). For a prefix of more than 32 MiB
 * per head (usually mapped from a KV file), the pages of the rows about to
 * be gathered are requested in one batch (madvise WILLNEED) so that the
 * reads of a cold prefix overlap.
 *
 * Prefix boundary: set_prefix(n) (sparq_context_mark_prefix, a loaded KV
 * file), else everything before the first decode step. Each (layer, head)
 * decides its index at its first decode step: a prebuilt image from the
 * index source when one matches (kind, n = P, d, and the key type / nlist
 * if they were asked for explicitly), else one built here from the cache.
 * If no index can be had (a corrupt stored image, keys the index refuses,
 * out of memory), that step and every later step of the head fail with the
 * reason (attend returns attn_fail): never a silent dense step.
 *
 * Index kinds: exact, ivf, hnsw (index.h); and sparq, SparQ's approximate
 * scores as the selector: i1 = the r largest components of sum_h |q_h|
 * (shared by the group), logits q_h[i1] . K^T[i1] from r rows of a K^T copy
 * of the prefix, and the k largest per head (tau only scales a head's
 * logits, so it cannot change that head's top k and is not applied).
 *
 * Transfer per step, layer and KV head, in elements of the cache's type
 * (index bytes are divided by the element size, rounded up). The counts
 * come from the kernels: the index bytes a search read (idx_scratch_cost:
 * keys it scored, scales, ids, ivf centroids and bonuses, counted by the
 * scan loops), the K^T elements the sparq selector's kernel read and the
 * K and V rows the gather and suffix kernels visited (attn_meter). The formula
 * (transfer_formula_state) says what they should be:
 *   index   exact  P * (d * key_bytes + 4 if int8 for the row scale)
 *           ivf    nlist * (4d + 4) (centroids, probe bonuses) + for every
 *                  key of the probed lists d * key_bytes (+4 scale) + 4 (id)
 *           hnsw   g * ef * 2M * (4d + 4): NOMINAL on both sides, Faiss
 *                  reports no visits (sparq_attn_stats.nominal_elements)
 *           sparq  P * r (K^T rows, cache element type)
 *   gather  k * d per query head (its V rows) when the index's scores are
 *           q . k of the cache's keys (f16 keys of an f16 cache, hnsw's f32
 *           copies); 2 * k * d (K rows rescored, V rows) otherwise
 *   suffix  2 * (S - P) * d read (the current token included), 2 * d
 *           written (this step's k, v)
 * The ivf formula assumes min(nlist, g * nprobe) lists of P / nlist keys;
 * the count is the keys of the lists actually probed (equal when nprobe >=
 * nlist). The stateless transfer_formula assumes the first decode step
 * (P = S - 1), the uniform budget, default index parameters and an f16
 * cache.
 */
#include "attn/attn.h"
#include "index/index.h"
#include "util/err.h"
#include "tensor/quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { K_EXACT = 1, K_IVF = 2, K_HNSW = 3, K_SPARQ = 4 };

static int kind_of(const char *name)
{
    if (!name || strcmp(name, "exact") == 0) return K_EXACT;
    if (strcmp(name, "ivf") == 0) return K_IVF;
    if (strcmp(name, "hnsw") == 0) return K_HNSW;
    if (strcmp(name, "sparq") == 0) return K_SPARQ;
    return 0;
}

/* "exact, ivf, hnsw, sparq": the index registry's kinds and this file's. */
static const char *kind_list(char *buf, size_t size)
{
    idx_kind_names(buf, size, ", ");
    const size_t n = strlen(buf);
    snprintf(buf + n, size - n, ", sparq");
    return buf;
}

static const char *kind_name(int kind)
{
    static const char *const names[] = { "", "exact", "ivf", "hnsw", "sparq" };
    return kind >= 1 && kind <= 4 ? names[kind] : "";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- the "sparq" index: K^T of the prefix ---------------------------------
 * Image: 64-byte header, then K^T [d][stride] of elem (rows 64-byte aligned).
 *   0 magic "SPQKTIX1" | 8 u32 version 1 | 12 u32 elem (KV_F32/KV_F16)
 *   16 u32 d | 20 u32 0 | 24 i64 n | 32 i64 stride (n rounded up to 32)
 */
#define KT_MAGIC "SPQKTIX1"
enum { KT_HEADER = 64 };

static int64_t kt_stride_of(int64_t n) { return (n + 31) & ~(int64_t)31; }

static int kt_image_bytes(int d, int64_t n, int es, size_t *out)
{
    const int64_t stride = kt_stride_of(n);
    if (n < 1 || d < 1 || stride > (int64_t)(SIZE_MAX / 2) / d / es) return -1;
    *out = KT_HEADER + (size_t)d * (size_t)stride * (size_t)es;
    return 0;
}

static int kt_image_build(const attn_kv_view *kv, int64_t n, void **image, size_t *bytes,
                          char *err, size_t err_size)
{
    /* a Q8_0 cache gets an f32 image: its per-block scales run along the
     * head dimension, not along the image's position rows */
    const int img_elem = kv->elem == KV_Q8_0 ? KV_F32 : kv->elem;
    const int d = kv->d, es = img_elem == KV_F16 ? 2 : 4;
    size_t total;
    if (kt_image_bytes(d, n, es, &total)) {
        return err_set(err, err_size, "topk: sparq index of %lld x %d keys is too large", (long long)n, d);
    }
    uint8_t *img = aligned_alloc(64, (total + 63) & ~(size_t)63);
    if (!img) {
        return err_set(err, err_size, "topk: out of memory for a %zu-byte sparq index", total);
    }
    const int64_t stride = kt_stride_of(n);
    const uint32_t version = 1, elem = (uint32_t)img_elem, dd = (uint32_t)d, zero = 0;
    memset(img, 0, KT_HEADER);
    memcpy(img, KT_MAGIC, 8);
    memcpy(img + 8, &version, 4);
    memcpy(img + 12, &elem, 4);
    memcpy(img + 16, &dd, 4);
    memcpy(img + 20, &zero, 4);
    memcpy(img + 24, &n, 8);
    memcpy(img + 32, &stride, 8);
    uint8_t *kt = img + KT_HEADER;
    const uint8_t *k = kv->K;
    /* blocks of 64 positions: the block's rows stay in L1 while the d
     * destination rows are written */
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        const int64_t nb = n - i0 < 64 ? n - i0 : 64;
        for (int j = 0; j < d; j++) {
            uint8_t *dst = kt + ((size_t)j * (size_t)stride + (size_t)i0) * es;
            if (kv->elem == KV_Q8_0)
                for (int64_t i = 0; i < nb; i++) {
                    const float x = attn_kv_at(k, KV_Q8_0, d, i0 + i, j);
                    memcpy(dst + (size_t)i * 4, &x, 4);
                }
            else
                for (int64_t i = 0; i < nb; i++)
                    memcpy(dst + (size_t)i * es, k + ((size_t)(i0 + i) * d + j) * es, (size_t)es);
        }
    }
    for (int j = 0; j < d; j++) /* zero padding of each row */
        memset(kt + ((size_t)j * stride + (size_t)n) * es, 0, (size_t)(stride - n) * es);
    *image = img;
    *bytes = total;
    return 0;
}

/* Checks an image against the prefix it must cover: 0 and the rows; 1 if
 * it is sound but covers another prefix (n, d); -1 with a message if it is
 * not a valid image. */
static int kt_image_bind(const void *image, size_t bytes, int d, int64_t n, const uint8_t **kt,
                         int64_t *stride, int *elem, char *err, size_t err_size)
{
    const uint8_t *b = image;
    if (bytes < KT_HEADER || memcmp(b, KT_MAGIC, 8) != 0)
        return err_set(err, err_size, "sparq index image: bad magic or %zu bytes", bytes);
    if ((uintptr_t)b % 64 != 0) return err_set(err, err_size, "sparq index image is not 64-byte aligned");
    uint32_t version, el, dd;
    int64_t nn, st;
    memcpy(&version, b + 8, 4);
    memcpy(&el, b + 12, 4);
    memcpy(&dd, b + 16, 4);
    memcpy(&nn, b + 24, 8);
    memcpy(&st, b + 32, 8);
    if (version != 1 || (el != KV_F16 && el != KV_F32))
        return err_set(err, err_size, "sparq index image: version %u, element type %u", version, el);
    if ((int64_t)dd != d || nn != n) return 1;
    size_t want;
    if (st != kt_stride_of(n) || kt_image_bytes(d, n, el == KV_F16 ? 2 : 4, &want) || want != bytes)
        return err_set(err, err_size, "sparq index image: stride %lld or size %zu does not match %lld x %d keys",
                       (long long)st, bytes, (long long)n, d);
    *kt = b + KT_HEADER;
    *stride = st;
    *elem = (int)el;
    return 0;
}

/* ---- state ------------------------------------------------------------------ */

typedef struct topk_head {
    int64_t        P;         /* prefix indexed; -1 = not decided yet       */
    int            es;        /* cache element bytes (seen at that step)    */
    int            failed;    /* no index could be had: every step fails    */
    char           err[320];  /* ... and why                                */
    idx_index     *ix;        /* exact / ivf / hnsw                         */
    idx_scratch   *sc;
    const uint8_t *kt;        /* sparq: K^T [d][kt_stride]                  */
    int64_t        kt_stride;
    int            kt_elem;
    void          *owned;     /* a sparq image built here                   */
    int64_t        hits, total; /* recall@k bookkeeping (topk_check)        */
    int64_t        nominal;   /* elements estimated, not counted (hnsw)     */
    double         seconds;   /* building or binding the index              */
} topk_head;

typedef struct topk_state {
    attn_shape        shape;
    int               kind;
    int64_t           mark;   /* set_prefix's boundary, -1 if none          */
    attn_index_source src;    /* find == NULL: none                         */
    int              *k_layer;/* [n_layer]                                  */
    topk_head        *heads;  /* [n_layer][n_kv_head]                       */
} topk_state;

static topk_head *head_of(topk_state *st, int layer, int kv_head)
{
    return st->heads + (size_t)layer * st->shape.n_kv_head + kv_head;
}

static void head_clear(topk_head *hd)
{
    idx_free(hd->ix);
    idx_scratch_free(hd->sc);
    free(hd->owned);
    hd->ix = NULL;
    hd->sc = NULL;
    hd->owned = NULL;
    hd->kt = NULL;
    hd->P = -1;
    hd->failed = 0;
    hd->err[0] = 0;
}

int attn_topk_layer_k(const sparq_attn_params *p, int n_layer, int layer)
{
    if (p->topk_schedule != SPARQ_TOPK_LINEAR || n_layer <= 1) return p->k;
    /* k_l = round(2k (l+1) / (L+1)) (at least 1): a non-decreasing ramp whose
     * ideal total is L k; the rounding error is then moved onto whole
     * layers, +1 to the last layers or -1 to the first ones that stay
     * non-decreasing, so the total is exactly L k when a ramp can hold it. */
    enum { MAXL = 1024 };
    int64_t k[MAXL];
    const int L = n_layer < MAXL ? n_layer : MAXL;
    int64_t total = 0;
    for (int l = 0; l < L; l++) {
        k[l] = (int64_t)llround(2.0 * p->k * (l + 1) / (L + 1));
        if (k[l] < 1) k[l] = 1;
        total += k[l];
    }
    int64_t left = (int64_t)L * p->k - total;
    for (int l = L - 1; l >= 0 && left > 0; l--, left--) k[l]++;
    for (int changed = 1; left < 0 && changed;) {
        changed = 0;
        for (int l = 0; l < L && left < 0; l++)
            if (k[l] > 1 && (l == 0 || k[l] - 1 >= k[l - 1])) {
                k[l]--;
                left++;
                changed = 1;
            }
    }
    const int64_t v = k[layer < L ? layer : L - 1];
    return v > INT32_MAX ? INT32_MAX : (int)v;
}

static int topk_resolve(sparq_attn_params *p, int d, char *err, size_t err_size)
{
    if (!p->index) p->index = "exact";
    const int kind = kind_of(p->index);
    if (!kind) {
    {
        char names[64];
        return err_set(err, err_size, "topk: unknown index '%s' (%s)", p->index, kind_list(names, sizeof names));
    }
    }
#ifndef SPARQ_HAVE_FAISS
    if (kind == K_HNSW) {
        return err_set(err, err_size, "topk: hnsw index not available: built without Faiss");
    }
#endif
    if (p->k == 0) p->k = 128;
    if (p->r == 0) p->r = d / 4 >= 1 ? d / 4 : 1;
    p->l = 0;
    if (p->k < 1) {
        return err_set(err, err_size, "topk: k=%d must be >= 1", p->k);
    }
    if (p->r < 1 || p->r > d) {
        return err_set(err, err_size, "topk: r=%d must be in [1, head size %d]", p->r, d);
    }
    if (p->topk_schedule != SPARQ_TOPK_UNIFORM && p->topk_schedule != SPARQ_TOPK_LINEAR) {
        return err_set(err, err_size, "topk: unknown schedule %d (0 uniform, 1 linear)", p->topk_schedule);
    }
    if (p->index_key_type < SPARQ_KEY_DEFAULT || p->index_key_type > SPARQ_KEY_I8) {
        return err_set(err, err_size, "topk: unknown index key type %d", p->index_key_type);
    }
    if (p->ivf_nlist < 0 || p->ivf_nprobe < 0 || p->hnsw_ef_search < 0) {
        return err_set(err, err_size, "topk: ivf nlist/nprobe and hnsw ef must be >= 0");
    }
    return 0;
}

static void topk_state_free(void *state)
{
    topk_state *st = state;
    if (!st) return;
    if (st->heads)
        for (size_t i = 0; i < (size_t)st->shape.n_layer * st->shape.n_kv_head; i++)
            head_clear(&st->heads[i]);
    free(st->heads);
    free(st->k_layer);
    free(st);
}

static int topk_state_create(const sparq_attn_params *p, const attn_shape *shape, void **out)
{
    *out = NULL;
    if (shape->n_layer < 1 || shape->n_kv_head < 1 || shape->g < 1 || shape->g > IDX_MAX_G)
        return -1;
    topk_state *st = calloc(1, sizeof *st);
    if (!st) return -1;
    st->shape = *shape;
    st->kind = kind_of(p->index);
    st->mark = -1;
    const size_t n = (size_t)shape->n_layer * shape->n_kv_head;
    st->heads = calloc(n, sizeof *st->heads);
    st->k_layer = malloc((size_t)shape->n_layer * sizeof *st->k_layer);
    if (!st->heads || !st->k_layer) {
        topk_state_free(st);
        return -1;
    }
    for (size_t i = 0; i < n; i++) st->heads[i].P = -1;
    for (int l = 0; l < shape->n_layer; l++) st->k_layer[l] = attn_topk_layer_k(p, shape->n_layer, l);
    *out = st;
    return 0;
}

static void topk_set_prefix(void *state, const sparq_attn_params *p, int64_t n_prefix,
                            const attn_index_source *src)
{
    (void)p;
    topk_state *st = state;
    for (size_t i = 0; i < (size_t)st->shape.n_layer * st->shape.n_kv_head; i++)
        head_clear(&st->heads[i]);
    st->mark = n_prefix;
    if (src) st->src = *src;
    else memset(&st->src, 0, sizeof st->src);
}

/* ---- building / binding an index ------------------------------------------ */

static idx_params build_params(const sparq_attn_params *p, const char *kind, int n_threads)
{
    idx_params ip = idx_default_params();
    ip.kind = kind;
    ip.key_type = p->index_key_type ? p->index_key_type : IDX_F16;
    ip.nlist = p->ivf_nlist;
    ip.nprobe = p->ivf_nprobe;
    if (p->hnsw_ef_search) ip.ef_search = p->hnsw_ef_search;
    ip.n_threads = n_threads;
    return ip;
}

/* f32 copy of the first n keys of kv; NULL when out of memory. */
static int build_idx(const sparq_attn_params *p, const char *kind, const attn_kv_view *kv,
                     int64_t n, int n_threads, idx_index **out, char *err, size_t err_size)
{
    float *x = attn_kv_keys_f32(kv, 0, n);
    if (!x) {
        return err_set(err, err_size, "topk: out of memory for %lld keys", (long long)n);
    }
    idx_params ip = build_params(p, kind, n_threads);
    int rc = idx_build(&ip, x, n, kv->d, out, err, err_size);
    free(x);
    return rc;
}

/* The serialized image of ix (freed here), 64-byte aligned. */
static int image_of(idx_index *ix, const char *kind, void **image, size_t *bytes, char *err, size_t err_size)
{
    const size_t sz = idx_serialized_size(ix);
    void *img = aligned_alloc(64, (sz + 63) & ~(size_t)63);
    if (!img) {
        err_set(err, err_size, "topk: out of memory for a %zu-byte %s index", sz, kind);
        idx_free(ix);
        return -1;
    }
    int rc = idx_serialize(ix, img, sz, err, err_size);
    idx_free(ix);
    if (rc) {
        free(img);
        return -1;
    }
    *image = img;
    *bytes = sz;
    return 0;
}

int attn_topk_ivf_image_preset(const sparq_attn_params *p, const attn_kv_view *kv, int64_t n, int nlist,
                               const float *centroids, const int32_t *labels, void **image, size_t *bytes,
                               char *err, size_t err_size)
{
    *image = NULL;
    *bytes = 0;
    if (n < 1 || n > kv->S || n > INT32_MAX || nlist < 1 || nlist > n)
        return err_set(err, err_size, "topk: cannot index %lld of %lld positions in %d lists", (long long)n,
                       (long long)kv->S, nlist);
    float *x = attn_kv_keys_f32(kv, 0, n);
    if (!x) return err_set(err, err_size, "topk: out of memory for %lld keys", (long long)n);
    idx_params ip = build_params(p, "ivf", 1);
    ip.nlist = nlist;
    ip.nprobe = 0; /* the image's default for its own nlist */
    ip.n_train = 0;
    ip.centroids = centroids;
    ip.labels = labels;
    idx_index *ix = NULL;
    const int rc = idx_build(&ip, x, n, kv->d, &ix, err, err_size);
    free(x);
    if (rc) return -1;
    return image_of(ix, "ivf", image, bytes, err, err_size);
}

int attn_topk_index_image(const sparq_attn_params *p, const char *kind, const attn_kv_view *kv,
                          int64_t n, int n_threads, void **image, size_t *bytes, char *err,
                          size_t err_size)
{
    *image = NULL;
    *bytes = 0;
    const int k = kind_of(kind);
    if (!k || !kind) {
        char names[64];
        return err_set(err, err_size, "topk: unknown index kind '%s' (%s)", kind_list(names, sizeof names),
                 kind ? kind : "(null)");
    }
    if (n < 1 || n > kv->S || n > INT32_MAX) {
        return err_set(err, err_size, "topk: cannot index %lld of %lld positions", (long long)n,
                 (long long)kv->S);
    }
    if (k == K_SPARQ) return kt_image_build(kv, n, image, bytes, err, err_size);
    idx_index *ix = NULL;
    if (build_idx(p, kind, kv, n, n_threads, &ix, err, err_size)) return -1;
    return image_of(ix, kind, image, bytes, err, err_size);
}

/* A stored image for this head: 0 and bound when it fits (the right kind,
 * P keys of size d, the build parameters the user asked for explicitly);
 * 1 when there is none or it was made for another prefix or parameters (an
 * index is then built here); -1 with a message when the image is corrupt. */
static int bind_source(topk_state *st, topk_head *hd, const sparq_attn_params *p, int layer,
                       int kv_head, int d, char *err, size_t err_size)
{
    if (!st->src.find) return 1;
    size_t bytes = 0;
    const void *img = st->src.find(st->src.user, layer, kv_head, kind_name(st->kind), &bytes);
    if (!img) return 1;
    if (st->kind == K_SPARQ)
        return kt_image_bind(img, bytes, d, hd->P, &hd->kt, &hd->kt_stride, &hd->kt_elem, err, err_size);
    idx_index *ix = NULL;
    if (idx_deserialize(img, bytes, &ix, err, err_size)) return -1;
    if (strcmp(idx_kind_name(ix), kind_name(st->kind)) != 0 || idx_count(ix) != hd->P || idx_dim(ix) != d ||
        (st->kind != K_HNSW && p->index_key_type && idx_key_type(ix) != p->index_key_type) ||
        (st->kind == K_IVF && p->ivf_nlist && idx_nlist(ix) != p->ivf_nlist)) {
        idx_free(ix);
        return 1;
    }
    hd->ix = ix;
    return 0;
}

static int build_here(topk_state *st, topk_head *hd, const sparq_attn_params *p,
                      const attn_kv_view *kv, char *err, size_t err_size)
{
    if (st->kind == K_SPARQ) {
        void *img;
        size_t bytes;
        if (kt_image_build(kv, hd->P, &img, &bytes, err, err_size)) return -1;
        hd->owned = img;
        return kt_image_bind(img, bytes, kv->d, hd->P, &hd->kt, &hd->kt_stride, &hd->kt_elem, err,
                             err_size) ? -1 : 0;
    }
    /* one thread: the model already runs the heads in parallel */
    return build_idx(p, kind_name(st->kind), kv, hd->P, 1, &hd->ix, err, err_size);
}

/* Decides the head's prefix at its first decode step and gets its index.
 * Returns -1 (and every later step of the head too) when no index can be
 * had: a step never falls back to dense silently. */
static int prepare(topk_state *st, topk_head *hd, const sparq_attn_params *p, int layer,
                   int kv_head, const attn_kv_view *kv)
{
    if (hd->P >= 0) return hd->failed ? -1 : 0;
    /* Q8_0: 1.0625 bytes an element, counted as 1 (element counts stay integral) */
    hd->es = kv->elem == KV_Q8_0 ? 1 : kv->elem == KV_F16 ? 2 : 4;
    int64_t P = kv->S - 1;
    if (st->mark >= 0 && st->mark < P) P = st->mark;
    hd->P = P;
    if (P == 0 || st->k_layer[layer] >= P) return 0; /* dense: no index needed */
    const double t0 = now_s();
    char err[192];
    const char *what = "load the stored";
    int rc = bind_source(st, hd, p, layer, kv_head, kv->d, err, sizeof err);
    if (rc > 0) {
        what = "build the";
        rc = build_here(st, hd, p, kv, err, sizeof err);
    }
    if (rc == 0 && hd->ix) {
        what = "reserve search memory for the";
        hd->sc = idx_scratch_create();
        if (!hd->sc) rc = err_set(err, sizeof err, "out of memory for index scratch");
        else rc = idx_scratch_reserve(hd->sc, hd->ix, st->shape.g, st->k_layer[layer], 1, err, sizeof err);
    }
    hd->seconds += now_s() - t0;
    if (rc == 0) return 0;
    head_clear(hd);
    hd->P = P;
    hd->failed = 1;
    return err_set(hd->err, sizeof hd->err, "topk: layer %d head %d: cannot %s %s index of %lld keys: %s", layer,
                   kv_head, what, kind_name(st->kind), (long long)P, err);
}

/* ---- transfer arithmetic ---------------------------------------------------- */

/* Do the index's scores equal q . k of the cache's keys (up to the order
 * of additions)? f16 keys of an f16 cache, hnsw's f32 copies: yes; int8 /
 * bf16 keys and the sparq selector: no, their rows are rescored from K. */
static int scores_exact(int kind, int key_type, int cache_es)
{
    if (kind == K_HNSW) return 1;
    return (kind == K_EXACT || kind == K_IVF) && key_type == IDX_F16 && cache_es == 2;
}


static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static int key_bytes(int key_type) { return key_type == IDX_I8 ? 1 : 2; }

/* Index bytes of one step by formula. ivf: min(nlist, g*nprobe) lists of
 * P / nlist keys. */
static int64_t index_bytes_formula(int kind, int key_type, int nlist, int nprobe, int ef, int m,
                                   int64_t P, int d, int g, int k, int r, int es)
{
    const int64_t row = (int64_t)d * key_bytes(key_type) + (key_type == IDX_I8 ? 4 : 0);
    switch (kind) {
    case K_EXACT: return P * row;
    case K_IVF: {
        const int64_t lists = (int64_t)g * nprobe < nlist ? (int64_t)g * nprobe : nlist;
        return (int64_t)nlist * (4 * d + 4) + lists * P / nlist * (row + 4);
    }
    case K_HNSW: return (int64_t)g * (ef > k ? ef : k) * 2 * m * (4 * (int64_t)d + 4);
    default: return P * r * es;
    }
}

static int default_nlist(int64_t P)
{
    int64_t n = (int64_t)llround(sqrt((double)P));
    return (int)(n < 1 ? 1 : n > P ? P : n);
}

static int default_nprobe(int nlist) { return nlist / 16 > 8 ? nlist / 16 : 8; }

/* The head's actual parameters (index built) or the defaults. */
static int64_t head_index_formula(const topk_state *st, const topk_head *hd,
                                  const sparq_attn_params *p, int d, int g, int k)
{
    int key_type = p->index_key_type ? p->index_key_type : IDX_F16, nlist = p->ivf_nlist;
    int nprobe = p->ivf_nprobe, ef = p->hnsw_ef_search ? p->hnsw_ef_search : 64, m = 16;
    if (hd && hd->ix) {
        key_type = idx_key_type(hd->ix);
        nlist = idx_nlist(hd->ix);
        if (!nprobe) nprobe = hd->ix->nprobe;
        if (!p->hnsw_ef_search && hd->ix->ef_search) ef = hd->ix->ef_search;
        if (hd->ix->hnsw_m) m = hd->ix->hnsw_m;
    }
    const int64_t P = hd->P;
    if (!nlist) nlist = default_nlist(P);
    if (!nprobe) nprobe = default_nprobe(nlist);
    if (nprobe > nlist) nprobe = nlist;
    const int es = hd->es ? hd->es : 2;
    return ceil_div(index_bytes_formula(st->kind, key_type, nlist, nprobe, ef, m, P, d, g, k,
                                        p->r, es), es);
}

static int64_t dense_elements(int64_t S, int d) { return 2 * S * d + 2 * (int64_t)d; }

static int64_t step_formula(const topk_state *st, const topk_head *hd, const sparq_attn_params *p,
                            int k, int64_t S, int d, int g)
{
    const int64_t P = hd->P;
    if (P <= 0 || k >= P) return dense_elements(S, d);
    const int key_type = hd->ix ? idx_key_type(hd->ix) : p->index_key_type ? p->index_key_type : IDX_F16;
    const int rows = scores_exact(st->kind, key_type, hd->es ? hd->es : 2) ? 1 : 2;
    return head_index_formula(st, hd, p, d, g, k) + rows * (int64_t)g * k * d + 2 * (S - P) * d +
           2 * (int64_t)d;
}

static int64_t topk_formula_state(const void *state, const sparq_attn_params *p, int layer,
                                  int64_t S, int d, int g)
{
    const topk_state *st = state;
    topk_head hd = *(st->heads + (size_t)layer * st->shape.n_kv_head);
    if (hd.P < 0) { /* no step yet: the boundary it would take */
        hd.P = S - 1;
        if (st->mark >= 0 && st->mark < hd.P) hd.P = st->mark;
    }
    return step_formula(st, &hd, p, st->k_layer[layer], S, d, g);
}

static int64_t topk_formula(const sparq_attn_params *p, int64_t S, int d, int g)
{
    topk_state st;
    memset(&st, 0, sizeof st);
    st.kind = kind_of(p->index);
    topk_head hd;
    memset(&hd, 0, sizeof hd);
    hd.P = S - 1;
    hd.es = 2;
    return step_formula(&st, &hd, p, p->k, S, d, g);
}

/* ---- one step ----------------------------------------------------------------- */

/* Scratch carve-up for S positions (k: the largest layer budget). */
typedef struct topk_scratch {
    float   *lg;    /* [g][S]  sparq logits; exact scores (topk_check)      */
    float   *sc;    /* [g][k]  index scores                                  */
    float   *ssuf;  /* [g][S]  suffix scores, then suffix weights            */
    float   *buf;   /* [k + S] one head's scores / weights                   */
    float   *tmp;   /* [g][d]  suffix part of the output                     */
    float   *absq;  /* [d]                                                   */
    float   *qs;    /* [g][d]  sparq: q_h[i1]                                */
    int32_t *ids;   /* [g][k]                                                */
    int32_t *ids2;  /* [g][k]  trace / check work                            */
    int32_t *work;  /* attn_topk_work(max(S, d))                             */
    int32_t *i1;    /* [d]                                                   */
    size_t   n_f, n_i;
} topk_scratch;

static int k_bound(const sparq_attn_params *p)
{
    return p->topk_schedule == SPARQ_TOPK_LINEAR ? 2 * p->k + 2 : p->k;
}

static topk_scratch topk_layout(float *f, int32_t *iw, int kmax, int64_t S, int d, int g)
{
    topk_scratch s;
    const size_t n = (size_t)S, kk = (size_t)kmax, gg = (size_t)g;
    size_t o = 0;
    s.lg = f ? f + o : NULL;   o += attn_pad16(gg * n);
    s.sc = f ? f + o : NULL;   o += attn_pad16(gg * kk);
    s.ssuf = f ? f + o : NULL; o += attn_pad16(gg * n);
    s.buf = f ? f + o : NULL;  o += attn_pad16(kk + n);
    s.tmp = f ? f + o : NULL;  o += attn_pad16(gg * d);
    s.absq = f ? f + o : NULL; o += attn_pad16((size_t)d);
    s.qs = f ? f + o : NULL;   o += attn_pad16(gg * d);
    s.n_f = o;
    o = 0;
    s.ids = iw ? iw + o : NULL;  o += attn_pad16(gg * kk);
    s.ids2 = iw ? iw + o : NULL; o += attn_pad16(gg * kk);
    s.work = iw ? iw + o : NULL; o += attn_pad16(attn_topk_work(n > (size_t)d ? n : (size_t)d));
    s.i1 = iw ? iw + o : NULL;   o += attn_pad16((size_t)d);
    s.n_i = o;
    return s;
}

static size_t topk_scratch_floats(const sparq_attn_params *p, int64_t S, int d, int g)
{
    topk_scratch s = topk_layout(NULL, NULL, k_bound(p), S, d, g);
    return s.n_f > s.n_i ? s.n_f : s.n_i;
}

/* Selection: ids [g][k] (and scores [g][k] in s->sc when *exact); returns
 * the index elements read, or -1. */
static int64_t select_ids(topk_state *st, topk_head *hd, const sparq_attn_params *p,
                          const attn_kv_view *kv, const float *q, int g, int k, topk_scratch *s,
                          int *exact, char *err, size_t err_size)
{
    *exact = 0;
    const int d = kv->d;
    const int64_t P = hd->P;
    if (st->kind == K_SPARQ) {
        const int r = p->r;
        for (int j = 0; j < d; j++) {
            float a = 0;
            for (int h = 0; h < g; h++) a += fabsf(q[h * d + j]);
            s->absq[j] = a;
        }
        attn_topk_indices(s->absq, d, r, s->i1, s->work);
        for (int h = 0; h < g; h++)
            for (int c = 0; c < r; c++) s->qs[h * r + c] = q[h * d + s->i1[c]];
        attn_meter m = { 0, 0, 0, 0 };
        attn_kv_view v;
        memset(&v, 0, sizeof v);
        v.S = P;
        v.d = d;
        v.elem = hd->kt_elem;
        v.KT = hd->kt;
        v.kt_stride = hd->kt_stride;
        v.meter = &m;
        attn_kt_logits(&v, s->qs, s->i1, r, g, P, s->lg);
        for (int h = 0; h < g; h++)
            attn_topk_indices(s->lg + (size_t)h * P, P, k, s->ids + (size_t)h * k, s->work);
        /* the K^T components the kernel measured it read (r rows of P),
         * in the image's element type: as the cache's elements */
        return m.kt * (hd->kt_elem == KV_F16 ? 2 : 4) / hd->es;
    }
    idx_search_params sp = { p->ivf_nprobe, p->hnsw_ef_search, 1 };
    if (idx_search(hd->ix, q, g, k, &sp, hd->sc, s->ids, s->sc, err, err_size)) return -1;
    *exact = scores_exact(st->kind, idx_key_type(hd->ix), hd->es);
    /* what the search itself counted it read (hnsw: nominal, Faiss reports
     * nothing) */
    uint64_t bytes;
    int nominal;
    idx_scratch_cost(hd->sc, &bytes, &nominal);
    const int64_t elems = ceil_div((int64_t)bytes, hd->es);
    if (nominal) hd->nominal += elems;
    return elems;
}

/* Valid ids of head h (index results put -1 padding last). */
static int n_valid(const int32_t *ids, int k)
{
    int n = 0;
    while (n < k && ids[n] >= 0) n++;
    return n;
}

/* A long prefix is usually mapped from a KV file (kvfile.h) and partly on
 * disk, where faulting the gathered rows in one at a time runs at the
 * device's single-request latency: ask for all their pages at once so the
 * reads overlap. Below PREFETCH_MIN bytes per head the prefix is normally
 * in memory and the system calls would only cost. */
enum { PREFETCH_MIN = 32 << 20 };

static int cmp_uptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

static void prefetch_rows(const void *base, const int32_t *ids, int n, size_t row_bytes,
                          uintptr_t *pages)
{
    const uintptr_t pg = 4096;
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0) {
            const uintptr_t a = (uintptr_t)base + (uintptr_t)ids[i] * row_bytes;
            pages[m++] = a & ~(pg - 1);
            if (((a + row_bytes - 1) & ~(pg - 1)) != (a & ~(pg - 1))) pages[m++] = (a + row_bytes - 1) & ~(pg - 1);
        }
    qsort(pages, (size_t)m, sizeof *pages, cmp_uptr);
    for (int i = 0; i < m;) { /* runs of consecutive pages: one call each */
        int j = i + 1;
        while (j < m && pages[j] <= pages[j - 1] + pg) j++;
        madvise((void *)pages[i], pages[j - 1] + pg - pages[i], MADV_WILLNEED); /* a hint */
        i = j;
    }
}

/* out[h] = softmax over head h's prefix rows and the suffix [P, S), one max.
 * sc: the index's exact scores [g][k] (then only V rows are read), or NULL
 * (rows rescored from K). The kernels measure the rows into kv->meter.
 * Returns the prefix rows gathered (all heads). */
static int64_t combine(const attn_kv_view *kv, int64_t P, const float *q, int g, int k,
                       const float *sc, float *out, topk_scratch *s)
{
    const int d = kv->d;
    const int64_t ns = kv->S - P;
    const size_t rowb = attn_kv_row_bytes(kv->elem, d);
    const float scale = 1.0f / sqrtf((float)d);
    if ((size_t)P * rowb >= PREFETCH_MIN && kv->S >= 4 * (int64_t)k) {
        uintptr_t *pages = (uintptr_t *)(void *)s->lg; /* >= 4gk words: lg holds g*S floats */
        prefetch_rows(kv->V, s->ids, g * k, rowb, pages);
        if (!sc) prefetch_rows(kv->K, s->ids, g * k, rowb, pages);
    }
    attn_kv_view suf = *kv; /* the suffix as a view of its own: rows 0..ns-1 */
    suf.S = ns;
    suf.K = (const uint8_t *)kv->K + (size_t)P * rowb;
    suf.V = (const uint8_t *)kv->V + (size_t)P * rowb;
    suf.KT = NULL;
    attn_scores(&suf, q, g, NULL, ns, s->ssuf);
    int64_t rows = 0;
    for (int h = 0; h < g; h++) {
        const int32_t *ids = s->ids + (size_t)h * k;
        const int nv = n_valid(ids, k);
        if (sc)
            for (int r = 0; r < nv; r++) s->buf[r] = sc[(size_t)h * k + r] * scale;
        else
            attn_scores(kv, q + (size_t)h * d, 1, ids, nv, s->buf);
        memcpy(s->buf + nv, s->ssuf + (size_t)h * ns, (size_t)ns * sizeof(float));
        attn_softmax(s->buf, 1, nv + ns);
        attn_weighted_sum(kv, s->buf, 1, ids, nv, out + (size_t)h * d);
        memcpy(s->ssuf + (size_t)h * ns, s->buf + nv, (size_t)ns * sizeof(float));
        rows += nv;
    }
    attn_weighted_sum(&suf, s->ssuf, g, NULL, ns, s->tmp);
    for (size_t i = 0; i < (size_t)g * d; i++) out[i] += s->tmp[i];
    return rows;
}

/* recall@k: selected ids whose exact score reaches the k-th best exact
 * score of the prefix (a tie with the k-th is as good as it). */
static void check_recall(topk_head *hd, const attn_kv_view *kv, const float *q, int g, int k,
                         topk_scratch *s)
{
    const int64_t P = hd->P;
    attn_scores(kv, q, g, NULL, P, s->lg);
    for (int h = 0; h < g; h++) {
        const float *x = s->lg + (size_t)h * P;
        int32_t *ex = s->ids2 + (size_t)h * k;
        attn_topk_indices(x, P, k, ex, s->work);
        float kth = INFINITY;
        for (int r = 0; r < k; r++) kth = x[ex[r]] < kth ? x[ex[r]] : kth;
        const int32_t *sel = s->ids + (size_t)h * k;
        for (int r = 0; r < k; r++)
            if (sel[r] >= 0 && x[sel[r]] >= kth) hd->hits++;
        hd->total += k;
    }
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void trace_dense(attn_trace *tr, int64_t S, int g)
{
    if (!tr) return;
    if (tr->sel)
        for (int64_t i = 0; i < S; i++) tr->sel[i] = (int32_t)i;
    tr->n_sel = S;
    tr->n_i1 = 0;
    if (tr->alpha)
        for (int h = 0; h < g; h++) tr->alpha[h] = 1.0f;
}

/* Positions read: the union of the heads' prefix rows, then the suffix. */
static void trace_sparse(attn_trace *tr, const topk_scratch *s, int64_t P, int64_t S, int g, int k)
{
    if (!tr) return;
    int64_t n = 0;
    for (int h = 0; h < g; h++) {
        const int32_t *ids = s->ids + (size_t)h * k;
        const int nv = n_valid(ids, k);
        memcpy(s->ids2 + n, ids, (size_t)nv * sizeof *ids);
        n += nv;
    }
    qsort(s->ids2, (size_t)n, sizeof *s->ids2, cmp_i32);
    int64_t u = 0;
    for (int64_t i = 0; i < n; i++)
        if (i == 0 || s->ids2[i] != s->ids2[i - 1]) {
            if (tr->sel) tr->sel[u] = s->ids2[i];
            u++;
        }
    for (int64_t i = P; i < S; i++, u++)
        if (tr->sel) tr->sel[u] = (int32_t)i;
    tr->n_sel = u;
    tr->n_i1 = 0;
    if (tr->alpha)
        for (int h = 0; h < g; h++) tr->alpha[h] = 1.0f;
}

int attn_topk_select(void *state, const sparq_attn_params *p, int layer, int kv_head,
                     const attn_kv_view *kv, const float *q, int g, int32_t *ids,
                     attn_scratch *scratch)
{
    topk_state *st = state;
    topk_head *hd = head_of(st, layer, kv_head);
    if (prepare(st, hd, p, layer, kv_head, kv)) return attn_fail(scratch, "%s", hd->err);
    const int k = st->k_layer[layer];
    if (hd->P == 0 || k >= hd->P) return 0;
    topk_scratch s = topk_layout(scratch->f, scratch->i, k_bound(p), kv->S, kv->d, g);
    int exact;
    char err[192];
    if (select_ids(st, hd, p, kv, q, g, k, &s, &exact, err, sizeof err) < 0)
        return attn_fail(scratch, "topk: layer %d head %d: %s", layer, kv_head, err);
    memcpy(ids, s.ids, (size_t)g * k * sizeof *ids);
    return k;
}

static int topk_attend(void *state, const sparq_attn_params *p, const attn_step *step)
{
    int layer = step->layer;
    int kv_head = step->kv_head;
    const attn_kv_view *kv = step->kv;
    const float *q = step->q;
    int g = step->g;
    float *out = step->out;
    attn_trace *tr = step->trace;
    topk_state *st = state;
    topk_head *hd = head_of(st, layer, kv_head);
    const int64_t S = kv->S;
    const int d = kv->d;
    if (prepare(st, hd, p, layer, kv_head, kv)) return attn_fail(step->scratch, "%s", hd->err);
    const int k = st->k_layer[layer];
    attn_counts cnt = { 0, 0 };
    attn_meter m = { 0, 0, 0, 0 };
    attn_kv_view mv = *kv; /* the cache reads of this step, measured into m */
    mv.meter = &m;
    int64_t idx_elems = -1;
    int exact = 0;
    topk_scratch s = topk_layout(step->scratch->f, step->scratch->i, k_bound(p), S, d, g);
    if (hd->P > 0 && k < hd->P) {
        char err[192];
        idx_elems = select_ids(st, hd, p, kv, q, g, k, &s, &exact, err, sizeof err);
        if (idx_elems < 0) return attn_fail(step->scratch, "topk: layer %d head %d: %s", layer, kv_head, err);
    }
    if (idx_elems < 0) { /* k >= P: every position, as dense */
        attn_dense_group(&mv, q, g, out, s.lg);
        cnt.read = attn_meter_total(&m);
        cnt.written = 2 * (int64_t)d;
        trace_dense(tr, S, g);
    } else {
        combine(&mv, hd->P, q, g, k, exact ? s.sc : NULL, out, &s);
        cnt.read = idx_elems + attn_meter_total(&m);
        cnt.written = 2 * (int64_t)d;
        /* the recall check's exact scan is a diagnostic, not the step's
         * transfer: the unmetered view */
        attn_kv_view plain = *kv;
        plain.meter = NULL;
        if (p->topk_check) check_recall(hd, &plain, q, g, k, &s);
        trace_sparse(tr, &s, hd->P, S, g, k);
    }
    if (step->counts) {
        step->counts->read += cnt.read;
        step->counts->written += cnt.written;
    }
    return 0;
}

static void topk_stats(const void *state, sparq_attn_stats *out)
{
    const topk_state *st = state;
    for (size_t i = 0; i < (size_t)st->shape.n_layer * st->shape.n_kv_head; i++) {
        out->recall_hits += st->heads[i].hits;
        out->recall_total += st->heads[i].total;
        out->index_seconds += st->heads[i].seconds;
        out->nominal_elements += st->heads[i].nominal;
    }
}

const attn_policy attn_policy_topk = {
    .name = "topk",
    .summary = "the prefix through a key index (--index), the rest dense",
    .in_all = 0,
    .needs = 0,
    .resolve = topk_resolve,
    .state_create = topk_state_create,
    .state_free = topk_state_free,
    .scratch_floats = topk_scratch_floats,
    .attend = topk_attend,
    .transfer_formula = topk_formula,
    .set_prefix = topk_set_prefix,
    .transfer_formula_state = topk_formula_state,
    .stats = topk_stats,
};
