/* kvcache.c - the per-sequence key/value cache (see kvcache.h). */
#include "core/kvcache.h"
#include "tensor/quant.h"
#include "util/err.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *reserve(size_t bytes)
{
    if (bytes == 0) return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* Huge pages: attention streams these rows, and fewer TLB misses cut
     * the dense pass by ~18% per head here. Advisory; failure is harmless. */
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
}

static void release(void *p, size_t bytes)
{
    if (p) munmap(p, bytes);
}

static int kt_part_alloc(kv_cache *c);

/* The V sums of `heads` heads over their first n rows (head hh's rows start
 * at v + hh * span), in position order from the stored values, as
 * kv_write sums them. sums: heads x d, overwritten. */
static void v_sum_heads(float *sums, const uint8_t *v, size_t heads, size_t span, int elem, int d, int64_t n)
{
    memset(sums, 0, heads * (size_t)d * sizeof *sums);
    for (size_t hh = 0; hh < heads; hh++) {
        float *sum = sums + hh * d;
        const uint8_t *vh = v + hh * span;
        for (int64_t p = 0; p < n; p++)
            for (int j = 0; j < d; j++) sum[j] += attn_kv_at(vh, elem, d, p, j);
    }
}
static void kt_ref_drop(kv_cache *c);
static int kt_rebuild(kv_cache *c, int layer, int head, int64_t from, int64_t to, float *work);

int64_t kv_kt_len(int elem, int64_t cap)
{
    if (elem == KV_Q8_0 || cap <= 0) return cap;
    const int64_t per_line = 64 / (elem == KV_F16 ? 2 : 4);
    int64_t lines = (cap + per_line - 1) / per_line;
    if (lines % 2 == 0) lines++;
    return lines * per_line;
}

static void kt_set_split(kv_cache *c, int64_t split);

/* K^T rows laid out for len positions from now on (before kt is reserved). */
static void kt_set_len(kv_cache *c, int64_t len)
{
    c->kt_len = len;
    kt_set_split(c, c->kt_split);
}

/* Shape fields and kv_bytes; -1 with a message if the shape is bad. K^T
 * rows are cap long: a file's layout; fresh storage pads them (kt_set_len). */
static int kv_shape(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
                    char *err, size_t err_size)
{
    memset(c, 0, sizeof *c);
    if (n_layer <= 0 || n_kv_head <= 0 || d <= 0 || cap <= 0 ||
        (elem != KV_F32 && elem != KV_F16 && elem != KV_Q8_0)) {
        return err_set(err, err_size, "kv cache: bad shape (layers %d, heads %d, d %d, ctx %lld)",
                       n_layer, n_kv_head, d, (long long)cap);
    }
    c->n_layer = n_layer;
    c->n_kv_head = n_kv_head;
    c->d = d;
    c->cap = cap;
    c->elem = elem;
    c->elem_size = elem == KV_Q8_0 ? 1 : elem == KV_F16 ? 2 : 4;
    c->row_bytes = attn_kv_row_bytes(elem, d);
    /* Overflow-safe: layers*heads*d is small, cap is bounded below. */
    uint64_t per_pos = (uint64_t)n_layer * (uint64_t)n_kv_head * (uint64_t)c->row_bytes;
    if ((uint64_t)cap > (UINT64_C(1) << 46) / per_pos) {
        return err_set(err, err_size, "kv cache: context %lld is too large (%llu bytes per position)",
                       (long long)cap, (unsigned long long)per_pos);
    }
    c->kv_bytes = (size_t)(per_pos * (uint64_t)cap);
    kt_set_len(c, cap);
    return 0;
}

int kv_create(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
              int with_kt, int with_vsum, char *err, size_t err_size)
{
    if (kv_shape(c, n_layer, n_kv_head, d, cap, elem, err, err_size)) return -1;
    c->k = reserve(c->kv_bytes);
    c->v = reserve(c->kv_bytes);
    if (with_kt) {
        kt_set_len(c, kv_kt_len(elem, cap));
        c->kt_bytes = (size_t)n_layer * n_kv_head * c->kt_head_bytes;
        c->kt = reserve(c->kt_bytes);
    }
    if (with_vsum) c->v_sum = calloc((size_t)n_layer * n_kv_head * d, sizeof(float));
    const int part_failed = kt_part_alloc(c);
    if (part_failed) errno = ENOMEM;
    if (!c->k || !c->v || (with_kt && !c->kt) || (with_vsum && !c->v_sum) || part_failed) {
        err_set(err, err_size, "kv cache: cannot reserve %.1f GiB for context %lld: %s",
                (double)c->kv_bytes * (with_kt ? 3 : 2) / (1 << 30), (long long)cap, strerror(errno));
        kv_free(c);
        return -1;
    }
    return 0;
}

void kv_free(kv_cache *c)
{
    if (!c) return;
    kt_ref_drop(c);
    if (!c->kv_borrowed) {
        release(c->k, c->kv_bytes);
        release(c->v, c->kv_bytes);
    }
    if (!c->kt_borrowed) release(c->kt, c->kt_bytes);
    free(c->v_sum);
    free(c->kt_part);
    free(c->kt_part_blk);
    if (c->owner && c->owner_free) c->owner_free(c->owner);
    memset(c, 0, sizeof *c);
}

int kv_create_borrowed(kv_cache *c, const kv_borrow *b, char *err, size_t err_size)
{
    const int n_layer = b->n_layer, n_kv_head = b->n_kv_head, d = b->d, elem = b->elem;
    const int64_t cap = b->cap, n = b->n;
    uint8_t *k = b->k, *v = b->v, *kt = b->kt;
    const float *v_sum = b->v_sum;
    const int with_kt = b->with_kt, with_vsum = b->with_vsum;
    if (kv_shape(c, n_layer, n_kv_head, d, cap, elem, err, err_size)) return -1;
    if (!k || !v || n < 0 || n > cap) {
        err_set(err, err_size, "kv cache: bad borrowed storage (%lld of %lld positions)",
                (long long)n, (long long)cap);
        memset(c, 0, sizeof *c);
        return -1;
    }
    c->k = k;
    c->v = v;
    c->kv_borrowed = 1;
    c->n = n;
    const size_t heads = (size_t)n_layer * n_kv_head;
    int kt_failed = 0;
    if (with_kt && kt) {
        c->kt = kt;
        c->kt_borrowed = 1;
        c->kt_bytes = heads * c->kt_head_bytes;
    } else if (with_kt) {
        kt_set_len(c, kv_kt_len(elem, cap));
        c->kt_bytes = heads * c->kt_head_bytes;
        c->kt = reserve(c->kt_bytes);
        if (c->kt) /* column s of head h's K^T = row s of its K */
            for (int l = 0; l < n_layer && !kt_failed; l++)
                for (int h = 0; h < n_kv_head && !kt_failed; h++) kt_failed = kt_rebuild(c, l, h, 0, n, NULL);
    }
    if (with_kt && kt_part_alloc(c)) kt_failed = 1;
    if (with_vsum) {
        c->v_sum = calloc(heads * d, sizeof(float));
        if (c->v_sum && v_sum) {
            memcpy(c->v_sum, v_sum, heads * d * sizeof(float));
        } else if (c->v_sum) {
            v_sum_heads(c->v_sum, v, heads, (size_t)cap * c->row_bytes, elem, d, n);
        }
    }
    if ((with_kt && (!c->kt || kt_failed)) || (with_vsum && !c->v_sum)) {
        err_set(err, err_size, "kv cache: out of memory for K^T / V sums of context %lld",
                (long long)cap);
        if (!c->kt_borrowed) release(c->kt, c->kt_bytes);
        free(c->v_sum);
        free(c->kt_part);
        free(c->kt_part_blk);
        memset(c, 0, sizeof *c);
        return -1;
    }
    c->owner = b->owner;
    c->owner_free = b->owner_free;
    return 0;
}

static size_t head_offset(const kv_cache *c, int layer, int head)
{
    return ((size_t)layer * c->n_kv_head + head) * (size_t)c->cap * c->row_bytes;
}

static size_t kt_offset(const kv_cache *c, int layer, int head)
{
    return ((size_t)layer * c->n_kv_head + head) * c->kt_head_bytes;
}

/* Byte offset of position s (>= kt_split; Q8_0: a block start, or the
 * position within its block's bytes is the caller's) in a row of kt. */
static size_t kt_col(const kv_cache *c, int64_t s)
{
    return attn_kv_row_bytes(c->elem, s - c->kt_split);
}

/* kt's columns start at `split` from now on (rows re-packed by the caller). */
static void kt_set_split(kv_cache *c, int64_t split)
{
    c->kt_split = split;
    c->kt_row_bytes = attn_kv_row_bytes(c->elem, c->kt_len - split);
    c->kt_head_bytes = (size_t)c->d * c->kt_row_bytes;
}

/* Back to one K^T in kt at full width: with `keep`, its rows move out to
 * their full-width places (last row first: each row's new place starts at
 * or after its old one and after every earlier row's old place) and the
 * prefix's columns are copied in front; without, they are dropped (the
 * cache is being emptied). In place: kt is reserved at full width. */
static void kt_unsplit(kv_cache *c, int keep)
{
    if (!c->kt_pre) return;
    const size_t rows = (size_t)c->n_layer * c->n_kv_head * c->d;
    const size_t full = attn_kv_row_bytes(c->elem, c->kt_len), pre = attn_kv_row_bytes(c->elem, c->kt_split);
    const size_t pre_full = attn_kv_row_bytes(c->elem, c->kt_pre_len);
    const size_t used = c->n > c->kt_split ? attn_kv_row_bytes(c->elem, c->n) - pre : 0;
    if (keep)
        for (size_t r = rows; r-- > 0;) {
            memmove(c->kt + r * full + pre, c->kt + r * c->kt_row_bytes, used);
            memcpy(c->kt + r * full, c->kt_pre + r * pre_full, pre);
        }
    c->kt_pre = NULL;
    c->kt_pre_len = 0;
    kt_ref_drop(c);
    kt_set_split(c, 0);
}

int64_t kv_bytes_of(const kv_cache *c, int64_t elements)
{
    if (c->elem == KV_Q8_0) /* 34 bytes per 32 elements */
        return (elements * ATTN_Q8_BLOCK_BYTES + ATTN_Q8_BLOCK - 1) / ATTN_Q8_BLOCK;
    return elements * (int64_t)c->elem_size;
}

const void *kv_k(const kv_cache *c, int layer, int head) { return c->k + head_offset(c, layer, head); }
const void *kv_v(const kv_cache *c, int layer, int head) { return c->v + head_offset(c, layer, head); }

static void store_row(const kv_cache *c, uint8_t *dst, const float *src)
{
    if (c->elem == KV_Q8_0) attn_q8_quantize_row(src, c->d, dst);
    else if (c->elem == KV_F16) fp32_to_fp16_row(src, (uint16_t *)dst, c->d);
    else memcpy(dst, src, (size_t)c->d * sizeof(float));
}

/* Q8_0 K^T rows run along positions, so the block of the newest positions
 * fills one column per token. Choice: re-quantize that partial block on
 * every write, from f32 side storage (kt_part) holding the block's keys as
 * they came (not as K's rows rounded them), so a block completed token by
 * token ends up exactly as if quantized once, and K^T is valid for every
 * position < n at every step. kt_part_blk[layer] is the block held (-1:
 * none, e.g. after a shift or over borrowed storage: then it is reloaded
 * from the stored block, already rounded once). */
static int kt_part_alloc(kv_cache *c)
{
    if (!c->kt || c->elem != KV_Q8_0 || c->kt_part) return 0;
    c->kt_part = malloc((size_t)c->n_layer * c->n_kv_head * c->d * ATTN_Q8_BLOCK * sizeof(float));
    c->kt_part_blk = malloc((size_t)c->n_layer * sizeof *c->kt_part_blk);
    if (!c->kt_part || !c->kt_part_blk) return -1;
    for (int l = 0; l < c->n_layer; l++) c->kt_part_blk[l] = -1;
    return 0;
}

/* Columns [from, to) (from >= kt_split) of (layer, head)'s K^T from its K rows; Q8_0 blocks
 * are re-quantized whole from the start of from's block (their values come
 * from K's rounded rows). work: to - from + 32 floats, or NULL (then
 * allocated here). Returns 0, or -1 when out of memory. */
static int kt_rebuild(kv_cache *c, int layer, int head, int64_t from, int64_t to, float *work)
{
    if (to <= from) return 0;
    const int d = c->d;
    const uint8_t *k = c->k + head_offset(c, layer, head);
    uint8_t *kt = c->kt + kt_offset(c, layer, head);
    if (c->elem != KV_Q8_0) {
        const size_t es = c->elem_size;
        for (int j = 0; j < d; j++)
            for (int64_t s = from; s < to; s++)
                memcpy(kt + (size_t)j * c->kt_row_bytes + kt_col(c, s), k + ((size_t)s * d + j) * es, es);
        return 0;
    }
    const int64_t b0 = from / ATTN_Q8_BLOCK * ATTN_Q8_BLOCK;
    float *x = work ? work : malloc((size_t)(to - b0) * sizeof *x);
    if (!x) return -1;
    for (int j = 0; j < d; j++) {
        for (int64_t s = b0; s < to; s++) x[s - b0] = attn_kv_at(k, KV_Q8_0, d, s, j);
        attn_q8_quantize_row(x, to - b0, kt + (size_t)j * c->kt_row_bytes + kt_col(c, b0));
    }
    if (!work) free(x);
    if (c->kt_part_blk) c->kt_part_blk[layer] = -1;
    return 0;
}

/* Q8_0 K^T: stores column pos of every head of `layer` from k[n_kv_head][d]
 * and re-quantizes the block holding it over positions [block start, pos]. */
static void kt_write_q8(kv_cache *c, int layer, int64_t pos, const float *k)
{
    const int d = c->d, o = (int)(pos % ATTN_Q8_BLOCK);
    const int64_t b = pos / ATTN_Q8_BLOCK;
    const int reload = c->kt_part_blk[layer] != b; /* also when the block was left */
    for (int h = 0; h < c->n_kv_head; h++) {
        uint8_t *kt = c->kt + kt_offset(c, layer, h);
        float *part = c->kt_part + ((size_t)layer * c->n_kv_head + h) * d * ATTN_Q8_BLOCK;
        for (int j = 0; j < d; j++) {
            float *x = part + (size_t)j * ATTN_Q8_BLOCK;
            if (reload)
                for (int i = 0; i < o; i++) x[i] = attn_q8_at(kt + (size_t)j * c->kt_row_bytes, b * ATTN_Q8_BLOCK + i - c->kt_split);
            x[o] = k[(size_t)h * d + j];
            attn_q8_quantize_row(x, o + 1, kt + (size_t)j * c->kt_row_bytes + kt_col(c, b * ATTN_Q8_BLOCK));
        }
    }
    c->kt_part_blk[layer] = b;
}

void kv_write(kv_cache *c, int layer, int64_t pos, const float *k, const float *v)
{
    const int d = c->d;
    for (int h = 0; h < c->n_kv_head; h++) {
        size_t base = head_offset(c, layer, h);
        size_t row = base + (size_t)pos * c->row_bytes;
        store_row(c, c->k + row, k + (size_t)h * d);
        store_row(c, c->v + row, v + (size_t)h * d);
        if (c->kt && c->elem != KV_Q8_0) { /* column `pos` of the d rows of K^T: O(d) scattered stores */
            uint8_t *kt = c->kt + kt_offset(c, layer, h);
            for (int j = 0; j < d; j++) {
                size_t at = (size_t)j * c->kt_row_bytes + kt_col(c, pos);
                if (c->elem == KV_F16) {
                    uint16_t hv;
                    memcpy(&hv, c->k + row + (size_t)j * 2, 2);
                    memcpy(kt + at, &hv, 2);
                } else {
                    memcpy(kt + at, k + (size_t)h * d + j, 4);
                }
            }
        }
        if (c->v_sum) { /* sum what is stored, so the mean matches the cache */
            float *sum = c->v_sum + ((size_t)layer * c->n_kv_head + h) * d;
            const uint8_t *vr = c->v + row;
            for (int j = 0; j < d; j++) {
                if (c->elem == KV_F16) {
                    uint16_t hv;
                    memcpy(&hv, vr + (size_t)j * 2, 2);
                    sum[j] += fp16_to_fp32(hv);
                } else if (c->elem == KV_Q8_0) {
                    sum[j] += attn_q8_at(vr, j);
                } else {
                    sum[j] += v[(size_t)h * d + j];
                }
            }
        }
    }
    if (c->kt && c->elem == KV_Q8_0) kt_write_q8(c, layer, pos, k);
}

void kv_view(const kv_cache *c, int layer, int head, int64_t S, attn_kv_view *out)
{
    size_t base = head_offset(c, layer, head);
    out->S = S;
    out->d = c->d;
    out->elem = c->elem;
    out->K = c->k + base;
    out->V = c->v + base;
    out->KT = c->kt ? c->kt + kt_offset(c, layer, head) : NULL;
    out->kt_stride = c->kt_len;
    out->KT_tail = NULL;
    out->kt_split = 0;
    out->kt_tail_stride = 0;
    if (c->kt_pre) { /* the prefix's rows, then ours */
        out->KT_tail = out->KT;
        out->KT = c->kt_pre + ((size_t)layer * c->n_kv_head + head) * c->d * attn_kv_row_bytes(c->elem, c->kt_pre_len);
        out->kt_stride = c->kt_pre_len;
        out->kt_split = c->kt_split;
        out->kt_tail_stride = c->kt_len - c->kt_split;
    }
    out->v_sum = c->v_sum ? c->v_sum + ((size_t)layer * c->n_kv_head + head) * c->d : NULL;
    out->meter = NULL;
}

void kv_reset(kv_cache *c)
{
    if (c->n > c->n_max) c->n_max = c->n;
    kt_unsplit(c, 0);
    c->n = 0;
    if (c->v_sum) memset(c->v_sum, 0, (size_t)c->n_layer * c->n_kv_head * c->d * sizeof(float));
    if (c->kt_part_blk)
        for (int l = 0; l < c->n_layer; l++) c->kt_part_blk[l] = -1;
}

int kv_shift(kv_cache *c, int64_t n_keep, int64_t n_discard, const float *cs, int rope_dim, int neox)
{
    if (n_keep < 0 || n_discard < 0 || n_keep + n_discard > c->n || rope_dim < 0 || rope_dim > c->d ||
        (rope_dim & 1))
        return -1;
    if (n_discard == 0) return 0;
    kt_unsplit(c, 1); /* the moved columns are rebuilt in place below */
    const int d = c->d, half = rope_dim / 2;
    const size_t row = c->row_bytes;
    const int64_t n_new = c->n - n_discard, n_move = n_new - n_keep;
    /* x: one key row; then (Q8_0 K^T) room for kt_rebuild, taken before
     * anything moves so that running out of memory leaves the cache as is */
    const size_t ktw = c->kt && c->elem == KV_Q8_0 ? (size_t)(n_new - n_keep) + ATTN_Q8_BLOCK : 0;
    float *x = malloc(((size_t)d + ktw) * sizeof *x);
    if (!x) return -1;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_kv_head; h++) {
            const size_t base = head_offset(c, l, h);
            uint8_t *k = c->k + base, *v = c->v + base;
            memmove(k + (size_t)n_keep * row, k + (size_t)(n_keep + n_discard) * row, (size_t)n_move * row);
            memmove(v + (size_t)n_keep * row, v + (size_t)(n_keep + n_discard) * row, (size_t)n_move * row);
            /* a cached key is R(p) k: rotating it by R(-n_discard) gives
             * R(p - n_discard) k, the key at its new position */
            for (int64_t s = n_keep; s < n_new; s++) {
                uint8_t *kr = k + (size_t)s * row;
                attn_kv_row_f32(kr, c->elem, d, 0, d, x);
                for (int i = 0; i < half; i++) {
                    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                    const float x0 = x[a], x1 = x[b], co = cs[2 * i], si = cs[2 * i + 1];
                    x[a] = x0 * co - x1 * si;
                    x[b] = x0 * si + x1 * co;
                }
                store_row(c, kr, x);
            }
            /* columns [n_keep, n_new) of K^T from the rotated rows */
            if (c->kt) kt_rebuild(c, l, h, n_keep, n_new, ktw ? x + d : NULL); /* f16/f32: no allocation */
            if (c->v_sum) /* summed again */
                v_sum_heads(c->v_sum + ((size_t)l * c->n_kv_head + h) * d, v, 1, 0, c->elem, d, n_new);
        }
    free(x);
    c->n = n_new;
    return 0;
}

/* ---- shared read-only prefixes (kvcache.h) ---------------------------------- */

struct kv_shared {
    pthread_mutex_t mu;
    int      refs, users;     /* [mu] owner + mapping caches; mapping caches */
    int      fd;              /* the memfd                                   */
    uint8_t *base;            /* MAP_SHARED, total bytes                     */
    size_t   total, off_v, off_kt;
    kv_cache view;            /* shape, and k / v / kt pointing into base    */
    int      kt_built;        /* [mu]                                        */
    float   *v_sum;           /* [n_layer][n_kv_head][d] over the n positions */
};

static size_t page_up(size_t x)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (x + pg - 1) / pg * pg;
}

static size_t page_down(size_t x)
{
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return x / pg * pg;
}

int kv_shared_create(const kv_cache *src, int64_t n, int64_t cap, kv_shared **out, char *err, size_t err_size)
{
    *out = NULL;
    if (!src || n < 0 || n > src->n || n > cap) {
        return err_set(err, err_size, "shared prefix: cannot share %lld of %lld positions in a cache of capacity %lld",
                       (long long)n, src ? (long long)src->n : 0LL, (long long)cap);
    }
    kv_shared *s = calloc(1, sizeof *s);
    if (!s) {
        return err_set(err, err_size, "shared prefix: out of memory");
    }
    s->fd = -1;
    if (kv_shape(&s->view, src->n_layer, src->n_kv_head, src->d, cap, src->elem, err, err_size)) {
        free(s);
        return -1;
    }
    kv_cache *v = &s->view;
    kt_set_len(v, kv_kt_len(v->elem, cap));
    const size_t heads = (size_t)v->n_layer * v->n_kv_head;
    v->kt_bytes = heads * v->kt_head_bytes;
    s->off_v = page_up(v->kv_bytes);
    s->off_kt = s->off_v + page_up(v->kv_bytes);
    s->total = s->off_kt + page_up(v->kt_bytes);
    pthread_mutex_init(&s->mu, NULL);
    s->refs = 1;
    s->v_sum = calloc(heads * (size_t)v->d, sizeof(float));
    /* a memfd, not anonymous memory: other mappings of the same pages
     * must be private (copy on write), which only a file offers */
    s->fd = memfd_create("sparq-prefix", MFD_CLOEXEC);
    if (!s->v_sum || s->fd < 0 || ftruncate(s->fd, (off_t)s->total) != 0 ||
        (s->base = mmap(NULL, s->total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, s->fd, 0)) == MAP_FAILED) {
        err_set(err, err_size, "shared prefix: cannot create %.1f MiB of shared memory: %s",
                (double)s->total / 1048576.0, strerror(errno));
        if (s->base == MAP_FAILED) s->base = NULL;
        kv_shared_unref(s);
        return -1;
    }
    v->k = s->base;
    v->v = s->base + s->off_v;
    v->kt = s->base + s->off_kt;
    v->n = n;
    const size_t row = v->row_bytes;
    for (size_t hh = 0; hh < heads; hh++) { /* rows are contiguous per head in both layouts */
        memcpy(v->k + hh * (size_t)cap * row, src->k + hh * (size_t)src->cap * row, (size_t)n * row);
        memcpy(v->v + hh * (size_t)cap * row, src->v + hh * (size_t)src->cap * row, (size_t)n * row);
    }
    v_sum_heads(s->v_sum, v->v, heads, (size_t)cap * row, v->elem, v->d, n);
    /* src's own K^T, when whole for [0, n) (Q8_0: complete blocks), is
     * kept: it is what a prefill made (Q8_0 K^T blocks are quantized from
     * the keys as they came, not from K's rounded rows as a rebuild is) */
    if (src->kt && (v->elem != KV_Q8_0 || n % ATTN_Q8_BLOCK == 0)) {
        /* columns below src's split from its prefix, the rest from its own rows */
        const int64_t split = n < src->kt_split ? n : src->kt_split;
        const size_t used = attn_kv_row_bytes(v->elem, n), pre = attn_kv_row_bytes(v->elem, split);
        const size_t src_full = attn_kv_row_bytes(v->elem, src->kt_pre_len);
        for (size_t r = 0; r < heads * (size_t)v->d; r++) {
            if (pre) memcpy(v->kt + r * v->kt_row_bytes, src->kt_pre + r * src_full, pre);
            memcpy(v->kt + r * v->kt_row_bytes + pre, src->kt + r * src->kt_row_bytes, used - pre);
        }
        s->kt_built = 1;
    }
    *out = s;
    return 0;
}

void kv_shared_unref(kv_shared *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    const int left = --s->refs;
    pthread_mutex_unlock(&s->mu);
    if (left > 0) return;
    if (s->base) munmap(s->base, s->total);
    if (s->fd >= 0) close(s->fd);
    free(s->v_sum);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int64_t kv_shared_n(const kv_shared *s) { return s->view.n; }
int64_t kv_shared_cap(const kv_shared *s) { return s->view.cap; }
int     kv_shared_elem(const kv_shared *s) { return s->view.elem; }

size_t kv_shared_bytes(const kv_shared *s)
{
    kv_shared *m = (kv_shared *)s; /* the mutex only */
    const kv_cache *v = &s->view;
    const size_t heads = (size_t)v->n_layer * v->n_kv_head;
    size_t b = 2 * heads * (size_t)v->n * v->row_bytes;
    pthread_mutex_lock(&m->mu);
    if (s->kt_built) b += heads * (size_t)v->d * attn_kv_row_bytes(v->elem, v->n);
    pthread_mutex_unlock(&m->mu);
    return b;
}

int kv_shared_users(const kv_shared *s)
{
    kv_shared *m = (kv_shared *)s;
    pthread_mutex_lock(&m->mu);
    const int u = s->users;
    pthread_mutex_unlock(&m->mu);
    return u;
}

/* A private write fault on a page the memfd has no data for (a suffix
 * position) makes tmpfs allocate that page in the file before copying it:
 * zero pages nobody needs, shared, up to a whole context. Punching the
 * holes again when a user leaves keeps the file at its data; it is safe
 * while others map it (the range holds zeros, and pages a cache already
 * copied privately are its own). */
static void shared_trim(kv_shared *s, int with_kt)
{
    const kv_cache *v = &s->view;
    const size_t heads = (size_t)v->n_layer * v->n_kv_head;
    const size_t row = v->row_bytes, span = (size_t)v->cap * row;
    for (size_t hh = 0; hh < heads; hh++)
        for (int kv = 0; kv < 2; kv++) {
            const size_t off = (kv ? s->off_v : 0) + hh * span;
            const size_t a = page_up(off + (size_t)v->n * row), b = page_down(off + span);
            if (b > a) fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, (off_t)(b - a));
        }
    if (!with_kt) return;
    const size_t used = attn_kv_row_bytes(v->elem, v->n);
    for (size_t r = 0; r < heads * (size_t)v->d; r++) {
        const size_t off = s->off_kt + r * v->kt_row_bytes;
        const size_t a = page_up(off + used), b = page_down(off + v->kt_row_bytes);
        if (b > a) fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a, (off_t)(b - a));
    }
}

typedef struct cow_map {
    kv_shared *s;
    uint8_t   *k, *v;
    size_t     kv_bytes;
} cow_map;

/* A user of s is done with it: its reference goes, and the zero pages
 * its writes may have made in the memfd are punched out again. */
static void shared_leave(kv_shared *s)
{
    pthread_mutex_lock(&s->mu);
    s->users--;
    const int kt = s->kt_built;
    pthread_mutex_unlock(&s->mu);
    shared_trim(s, kt);
    kv_shared_unref(s);
}

static void kt_ref_drop(kv_cache *c)
{
    if (!c->kt_ref) return;
    shared_leave(c->kt_ref);
    c->kt_ref = NULL;
}

static void cow_unmap(void *p)
{
    cow_map *m = p;
    if (m->k) munmap(m->k, m->kv_bytes);
    if (m->v) munmap(m->v, m->kv_bytes);
    shared_leave(m->s);
    free(m);
}

static uint8_t *map_private(const kv_shared *s, size_t off, size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, s->fd, (off_t)off);
    return p == MAP_FAILED ? NULL : p;
}

/* K^T of a cache over shared prefix `v` holding its first n positions:
 * whole blocks of ATTN_EXP_BLOCK columns are read from the prefix's K^T
 * (built, never written again), the rest are copied into the cache's
 * own rows. 0, or -1 when out of memory (c's K^T then absent). */
static int kv_attach_kt(kv_cache *c, const kv_cache *v, int64_t n)
{
    const size_t rows = (size_t)c->n_layer * c->n_kv_head * c->d;
    kt_set_len(c, kv_kt_len(c->elem, c->cap));
    c->kt_bytes = rows * c->kt_row_bytes; /* full width (no split yet): kt_unsplit needs it */
    c->kt = reserve(c->kt_bytes);
    if (!c->kt || kt_part_alloc(c)) return -1;
    const int64_t split = n / ATTN_EXP_BLOCK * ATTN_EXP_BLOCK;
    c->kt_pre = split ? v->kt : NULL;
    c->kt_pre_len = split ? v->kt_len : 0;
    kt_set_split(c, split);
    const size_t pre = attn_kv_row_bytes(c->elem, split), used = attn_kv_row_bytes(c->elem, n) - pre;
    for (size_t r = 0; r < rows; r++) memcpy(c->kt + r * c->kt_row_bytes, v->kt + r * v->kt_row_bytes + pre, used);
    return 0;
}

/* K^T of the shared prefix, built in place the first time a user needs it
 * (never written afterwards). s->mu held. 0, or -1 when out of memory. */
static int shared_kt_build(kv_shared *s)
{
    const kv_cache *v = &s->view;
    int failed = 0;
    if (s->kt_built) return 0;
    for (int l = 0; l < v->n_layer && !failed; l++)
        for (int h = 0; h < v->n_kv_head && !failed; h++) failed = kt_rebuild(&s->view, l, h, 0, v->n, NULL);
    s->kt_built = !failed;
    return failed ? -1 : 0;
}

int kv_create_cow(kv_cache *c, kv_shared *s, int n_layer, int n_kv_head, int d, int64_t n,
                  int with_kt, int with_vsum, char *err, size_t err_size)
{
    memset(c, 0, sizeof *c);
    const kv_cache *v = &s->view;
    if (n_layer != v->n_layer || n_kv_head != v->n_kv_head || d != v->d || n < 0 || n > v->n) {
        return err_set(err, err_size, "shared prefix: shape or length (%lld of %lld positions) does not match",
                       (long long)n, (long long)v->n);
    }
    pthread_mutex_lock(&s->mu);
    const int kt_failed = with_kt && shared_kt_build(s);
    s->refs++;
    s->users++;
    pthread_mutex_unlock(&s->mu);
    cow_map *m = calloc(1, sizeof *m);
    if (m) {
        m->s = s;
        m->kv_bytes = v->kv_bytes;
        m->k = map_private(s, 0, v->kv_bytes);
        m->v = map_private(s, s->off_v, v->kv_bytes);
    }
    if (!m || !m->k || !m->v || kt_failed) {
        err_set(err, err_size, "shared prefix: cannot map it: %s", kt_failed ? "out of memory for K^T" : strerror(errno));
        if (m) cow_unmap(m);
        else { /* undo the references taken above */
            pthread_mutex_lock(&s->mu);
            s->users--;
            pthread_mutex_unlock(&s->mu);
            kv_shared_unref(s);
        }
        return -1;
    }
    const kv_borrow b = { .n_layer = v->n_layer, .n_kv_head = v->n_kv_head, .d = v->d, .cap = v->cap,
                          .elem = v->elem, .k = m->k, .v = m->v, .n = n,
                          .v_sum = n == v->n ? s->v_sum : NULL, .with_vsum = with_vsum, .owner = m,
                          .owner_free = cow_unmap };
    if (kv_create_borrowed(c, &b, err, err_size)) {
        cow_unmap(m);
        return -1;
    }
    if (with_kt && kv_attach_kt(c, v, n)) {
        err_set(err, err_size, "shared prefix: out of memory for K^T of context %lld", (long long)v->cap);
        kv_free(c); /* unmaps m through owner_free */
        return -1;
    }
    return 0;
}

int kv_copy_shared(kv_cache *c, kv_shared *s, int64_t n, int n_threads, char *err, size_t err_size)
{
    const kv_cache *v = &s->view;
    if (c->kv_borrowed || c->kt_borrowed || c->kt_pre || c->n != 0 || c->n_layer != v->n_layer ||
        c->n_kv_head != v->n_kv_head || c->d != v->d || c->cap != v->cap || c->elem != v->elem || n < 0 || n > v->n) {
        return err_set(err, err_size, "shared prefix: cannot copy %lld of %lld positions into this cache (it must be "
                       "empty, its own, and of the prefix's shape)", (long long)n, (long long)v->n);
    }
    /* whole blocks of K^T columns are read in place, as over a mapping
     * (kv_attach_kt): a user's reference keeps them */
    const int64_t split = c->kt ? n / ATTN_EXP_BLOCK * ATTN_EXP_BLOCK : 0;
    pthread_mutex_lock(&s->mu);
    const int kt_failed = c->kt && shared_kt_build(s);
    if (!kt_failed && split) {
        s->refs++;
        s->users++;
    }
    pthread_mutex_unlock(&s->mu);
    if (kt_failed) {
        return err_set(err, err_size, "shared prefix: out of memory for K^T");
    }
    const size_t heads = (size_t)v->n_layer * v->n_kv_head, span = (size_t)v->cap * v->row_bytes;
    const size_t kt_rows = c->kt ? heads * (size_t)v->d : 0;
    if (split) {
        c->kt_pre = v->kt;
        c->kt_pre_len = v->kt_len;
        c->kt_ref = s;
        kt_set_split(c, split);
    }
    const size_t pre = attn_kv_row_bytes(v->elem, split), used = attn_kv_row_bytes(v->elem, n) - pre;
    /* a copy of ~100 MiB: both threads' bandwidth (the worker only waits otherwise) */
#pragma omp parallel num_threads(n_threads > 0 ? n_threads : 1)
    {
#pragma omp for schedule(static) nowait
        for (size_t hh = 0; hh < heads; hh++) { /* one layout and capacity: the same offsets */
            memcpy(c->k + hh * span, v->k + hh * span, (size_t)n * v->row_bytes);
            memcpy(c->v + hh * span, v->v + hh * span, (size_t)n * v->row_bytes);
        }
#pragma omp for schedule(static)
        for (size_t r = 0; r < kt_rows; r++) /* the partial block: reloaded from here on its next write */
            memcpy(c->kt + r * c->kt_row_bytes, v->kt + r * v->kt_row_bytes + pre, used);
    }
    if (c->kt_part_blk)
        for (int l = 0; l < c->n_layer; l++) c->kt_part_blk[l] = -1;
    if (c->v_sum && n == v->n) {
        memcpy(c->v_sum, s->v_sum, heads * (size_t)v->d * sizeof(float));
    } else if (c->v_sum) {
        v_sum_heads(c->v_sum, c->v, heads, span, v->elem, v->d, n);
    }
    c->n = n;
    if (n > c->n_max) c->n_max = n;
    return 0;
}
