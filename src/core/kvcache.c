/* kvcache.c - the per-sequence key/value cache (see kvcache.h). */
#include "core/kvcache.h"
#include "tensor/quant.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
static int kt_rebuild(kv_cache *c, int layer, int head, int64_t from, int64_t to, float *work);

/* Shape fields and kv_bytes; -1 with a message if the shape is bad. */
static int kv_shape(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
                    char *err, size_t err_size)
{
    memset(c, 0, sizeof *c);
    if (n_layer <= 0 || n_kv_head <= 0 || d <= 0 || cap <= 0 ||
        (elem != KV_F32 && elem != KV_F16 && elem != KV_Q8_0)) {
        snprintf(err, err_size, "kv cache: bad shape (layers %d, heads %d, d %d, ctx %lld)",
                 n_layer, n_kv_head, d, (long long)cap);
        return -1;
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
        snprintf(err, err_size, "kv cache: context %lld is too large (%llu bytes per position)",
                 (long long)cap, (unsigned long long)per_pos);
        return -1;
    }
    c->kv_bytes = (size_t)(per_pos * (uint64_t)cap);
    c->kt_row_bytes = attn_kv_row_bytes(elem, cap);
    c->kt_head_bytes = (size_t)d * c->kt_row_bytes;
    return 0;
}

int kv_create(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
              int with_kt, int with_vsum, char *err, size_t err_size)
{
    if (kv_shape(c, n_layer, n_kv_head, d, cap, elem, err, err_size)) return -1;
    c->k = reserve(c->kv_bytes);
    c->v = reserve(c->kv_bytes);
    if (with_kt) {
        c->kt_bytes = (size_t)n_layer * n_kv_head * c->kt_head_bytes;
        c->kt = reserve(c->kt_bytes);
    }
    if (with_vsum) c->v_sum = calloc((size_t)n_layer * n_kv_head * d, sizeof(float));
    const int part_failed = kt_part_alloc(c);
    if (part_failed) errno = ENOMEM;
    if (!c->k || !c->v || (with_kt && !c->kt) || (with_vsum && !c->v_sum) || part_failed) {
        snprintf(err, err_size, "kv cache: cannot reserve %.1f GiB for context %lld: %s",
                 (double)c->kv_bytes * (with_kt ? 3 : 2) / (1 << 30), (long long)cap, strerror(errno));
        kv_free(c);
        return -1;
    }
    return 0;
}

void kv_free(kv_cache *c)
{
    if (!c) return;
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

int kv_create_borrowed(kv_cache *c, int n_layer, int n_kv_head, int d, int64_t cap, int elem,
                       uint8_t *k, uint8_t *v, uint8_t *kt, int64_t n, const float *v_sum,
                       int with_kt, int with_vsum, void *owner, void (*owner_free)(void *),
                       char *err, size_t err_size)
{
    if (kv_shape(c, n_layer, n_kv_head, d, cap, elem, err, err_size)) return -1;
    if (!k || !v || n < 0 || n > cap) {
        snprintf(err, err_size, "kv cache: bad borrowed storage (%lld of %lld positions)",
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
            for (size_t hh = 0; hh < heads; hh++) {
                const uint8_t *vh = v + hh * (size_t)cap * c->row_bytes;
                float *sum = c->v_sum + hh * d;
                for (int64_t s = 0; s < n; s++)
                    for (int j = 0; j < d; j++) sum[j] += attn_kv_at(vh, elem, d, s, j);
            }
        }
    }
    if ((with_kt && (!c->kt || kt_failed)) || (with_vsum && !c->v_sum)) {
        snprintf(err, err_size, "kv cache: out of memory for K^T / V sums of context %lld",
                 (long long)cap);
        if (!c->kt_borrowed) release(c->kt, c->kt_bytes);
        free(c->v_sum);
        free(c->kt_part);
        free(c->kt_part_blk);
        memset(c, 0, sizeof *c);
        return -1;
    }
    c->owner = owner;
    c->owner_free = owner_free;
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

/* Columns [from, to) of (layer, head)'s K^T from its K rows; Q8_0 blocks
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
                memcpy(kt + ((size_t)j * c->cap + (size_t)s) * es, k + ((size_t)s * d + j) * es, es);
        return 0;
    }
    const int64_t b0 = from / ATTN_Q8_BLOCK * ATTN_Q8_BLOCK;
    float *x = work ? work : malloc((size_t)(to - b0) * sizeof *x);
    if (!x) return -1;
    for (int j = 0; j < d; j++) {
        for (int64_t s = b0; s < to; s++) x[s - b0] = attn_kv_at(k, KV_Q8_0, d, s, j);
        attn_q8_quantize_row(x, to - b0, kt + (size_t)j * c->kt_row_bytes +
                                             (size_t)(b0 / ATTN_Q8_BLOCK) * ATTN_Q8_BLOCK_BYTES);
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
                for (int i = 0; i < o; i++) x[i] = attn_kv_at(kt, KV_Q8_0, c->cap, j, b * ATTN_Q8_BLOCK + i);
            x[o] = k[(size_t)h * d + j];
            attn_q8_quantize_row(x, o + 1, kt + (size_t)j * c->kt_row_bytes + (size_t)b * ATTN_Q8_BLOCK_BYTES);
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
                size_t at = ((size_t)j * c->cap + (size_t)pos) * c->elem_size;
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
    out->kt_stride = c->cap;
    out->v_sum = c->v_sum ? c->v_sum + ((size_t)layer * c->n_kv_head + head) * c->d : NULL;
    out->meter = NULL;
}

void kv_reset(kv_cache *c)
{
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
            if (c->v_sum) { /* summed again in position order, as kv_write would have */
                float *sum = c->v_sum + ((size_t)l * c->n_kv_head + h) * d;
                memset(sum, 0, (size_t)d * sizeof *sum);
                for (int64_t s = 0; s < n_new; s++)
                    for (int j = 0; j < d; j++) sum[j] += attn_kv_at(v, c->elem, d, s, j);
            }
        }
    free(x);
    c->n = n_new;
    return 0;
}
