/* test_kvcache.c - the KV cache layout: rows, K^T copy and V sums agree
 * with what was written, for both element types; shared prefixes
 * (kv_shared / sparq_prefix): a copy-on-write cache over one equals a cache
 * that wrote the same positions itself, byte for byte, and leaves the
 * shared copy and its other users alone; contexts attached to a prefix
 * give the logits of a fresh prefill bit for bit (stories260K); and 16 of
 * them over a long prefix cost about one copy of it in the process's
 * memory (/proc/self/smaps_rollup), where copying costs one each.
 * kv_shift, on plain caches and over a shared prefix, for every element
 * type, both RoPE pairings and partial rotary dims, against a naive
 * rotation of what the cache held (shift_mismatches), with controls that
 * a wrong pairing or a rotation of the other sign is caught. */
#include "test.h"
#include "core/kvcache.h"
#include "sparq.h"
#include "tensor/quant.h"
#include "util/paths.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float value(int layer, int head, int64_t pos, int j, int is_v)
{
    return (float)((layer * 7 + head * 3 + pos * 11 + j * 5 + is_v * 13) % 17) / 4.0f - 2.0f;
}

static float load(const void *base, int elem, size_t i)
{
    return elem == KV_F16 ? fp16_to_fp32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static void check_type(int elem)
{
    kv_cache c;
    char err[256];
    const int L = 2, H = 3, d = 8;
    const int64_t cap = 100;
    CHECK(kv_create(&c, L, H, d, cap, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    float k[3 * 8], v[3 * 8];
    const int64_t n = 37;
    for (int64_t p = 0; p < n; p++) {
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < H; h++)
                for (int j = 0; j < d; j++) {
                    k[h * d + j] = value(l, h, p, j, 0);
                    v[h * d + j] = value(l, h, p, j, 1);
                }
            kv_write(&c, l, p, k, v);
        }
        c.n++;
    }
    int bad_rows = 0, bad_kt = 0, bad_sum = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            attn_kv_view view;
            kv_view(&c, l, h, n, &view);
            CHECK(view.S == n && view.d == d && view.elem == elem && view.kt_stride == kv_kt_len(elem, cap),
                  "view fields");
            for (int j = 0; j < d; j++) {
                double sum = 0;
                for (int64_t p = 0; p < n; p++) {
                    /* the test values are multiples of 1/4: exact in f16 */
                    bad_rows += load(view.K, elem, (size_t)p * d + j) != value(l, h, p, j, 0);
                    bad_rows += load(view.V, elem, (size_t)p * d + j) != value(l, h, p, j, 1);
                    bad_kt += load(view.KT, elem, (size_t)j * view.kt_stride + p) != value(l, h, p, j, 0);
                    sum += value(l, h, p, j, 1);
                }
                bad_sum += fabs(view.v_sum[j] - sum) > 1e-4;
            }
        }
    CHECK(bad_rows == 0, "%d row values differ", bad_rows);
    CHECK(bad_kt == 0, "%d K^T values differ", bad_kt);
    CHECK(bad_sum == 0, "%d V sums differ", bad_sum);
    kv_reset(&c);
    CHECK(c.n == 0 && c.v_sum[0] == 0.0f, "reset");
    kv_free(&c);
    kv_free(&c); /* idempotent */
}

/* kv_kt_len against its rule, written out: f16/f32 rows of whole 64-byte
 * lines, an odd number of them, the fewest that hold cap; Q8_0 rows as
 * they are. */
static void check_kt_len(void)
{
    int bad = 0;
    for (int e = 0; e < 2; e++) {
        const int elem = e ? KV_F16 : KV_F32, es = e ? 2 : 4;
        for (int64_t cap = 1; cap <= 70000; cap += cap < 300 ? 1 : 997) {
            const int64_t len = kv_kt_len(elem, cap), bytes = len * es;
            int64_t want = (cap * es + 63) / 64; /* lines */
            if (want % 2 == 0) want++;
            bad += len < cap || bytes % 64 != 0 || (bytes / 64) % 2 != 1 || bytes / 64 != want;
        }
        /* the strides measured slow (an even 1026 lines) and fast (1024 is padded too) */
        bad += kv_kt_len(elem, 65664 / es) * es != 1027 * 64;
        bad += kv_kt_len(elem, 65536 / es) * es != 1025 * 64;
    }
    for (int64_t cap = 1; cap <= 5000; cap += 7) bad += kv_kt_len(KV_Q8_0, cap) != cap;
    CHECK(bad == 0, "kv_kt_len: %d lengths break the rule", bad);
}

/* Writes positions [from, to) of the test values into c (and advances n). */
static void write_positions(kv_cache *c, int64_t from, int64_t to, int salt)
{
    float k[3 * 8], v[3 * 8];
    for (int64_t p = from; p < to; p++) {
        for (int l = 0; l < c->n_layer; l++) {
            for (int h = 0; h < c->n_kv_head; h++)
                for (int j = 0; j < c->d; j++) {
                    k[h * c->d + j] = value(l, h, p + salt, j, 0) * 1.37f;
                    v[h * c->d + j] = value(l, h, p + salt, j, 1) * 0.61f;
                }
            kv_write(c, l, p, k, v);
        }
        c->n++;
    }
}

/* Row j of a view's K^T over positions [0, n), gathered from its pieces
 * (attn.h: a cache over a shared prefix keeps two). */
static void kt_row_bytes_of(const attn_kv_view *v, int j, int64_t n, uint8_t *out)
{
    const int64_t split = v->KT_tail && v->kt_split < n ? v->kt_split : n;
    const size_t pre = attn_kv_row_bytes(v->elem, split), used = attn_kv_row_bytes(v->elem, n);
    int64_t col;
    memcpy(out, attn_kt_row(v, j, 0, &col), pre);
    if (used > pre) memcpy(out + pre, attn_kt_row(v, j, split, &col), used - pre);
}

/* Every byte a cache exposes for positions [0, n): K, V rows, K^T columns
 * (Q8_0: whole blocks up to n's) and V sums. 0 if a and b agree. */

static int cache_diff(const kv_cache *a, const kv_cache *b, int64_t n)
{
    int bad = 0;
    for (int l = 0; l < a->n_layer; l++)
        for (int h = 0; h < a->n_kv_head; h++) {
            attn_kv_view x, y;
            kv_view(a, l, h, n, &x);
            kv_view(b, l, h, n, &y);
            bad += memcmp(x.K, y.K, (size_t)n * a->row_bytes) != 0;
            bad += memcmp(x.V, y.V, (size_t)n * a->row_bytes) != 0;
            if (x.KT || y.KT) {
                if (!x.KT || !y.KT) return -1;
                const size_t used = attn_kv_row_bytes(a->elem, n);
                uint8_t *rx = malloc(used), *ry = malloc(used);
                if (!rx || !ry) return -1;
                for (int j = 0; j < a->d; j++) {
                    kt_row_bytes_of(&x, j, n, rx);
                    kt_row_bytes_of(&y, j, n, ry);
                    bad += memcmp(rx, ry, used) != 0;
                }
                free(rx);
                free(ry);
            }
            if (x.v_sum || y.v_sum) {
                if (!x.v_sum || !y.v_sum) return -1;
                bad += memcmp(x.v_sum, y.v_sum, (size_t)a->d * sizeof(float)) != 0;
            }
        }
    return bad;
}

/* ---- context shift against a naive rotation ---------------------------------- */

/* Every K and V value of positions [0, n), dequantized: [L][H][n][d]. */
static float *snapshot(const kv_cache *c, int64_t n, int is_v)
{
    float *out = malloc((size_t)c->n_layer * c->n_kv_head * n * c->d * sizeof *out);
    if (!out) return NULL;
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_kv_head; h++) {
            attn_kv_view w;
            kv_view(c, l, h, n, &w);
            for (int64_t s = 0; s < n; s++)
                attn_kv_row_f32(is_v ? w.V : w.K, c->elem, c->d, s, c->d,
                                out + (((size_t)l * c->n_kv_head + h) * n + s) * c->d);
        }
    return out;
}

/* The RoPE table kv_shift takes for a move of `delta` positions. */
static void rope_table(float *cs, int rope_dim, int delta)
{
    for (int i = 0; i < rope_dim / 2; i++) {
        const double th = delta * pow(10000.0, -2.0 * i / rope_dim);
        cs[2 * i] = (float)cos(th);
        cs[2 * i + 1] = (float)sin(th);
    }
}

/* Values of c (after kv_shift(keep, discard)) that differ from the naive
 * shift of the snapshots kb, vb taken over n0 positions before it: kept
 * rows and all V rows verbatim; a moved key row is the old row rotated
 * here, in double, by the angle of position -discard (pairs (2i, 2i+1),
 * or with neox (i, i + rope_dim/2), over the first rope_dim components),
 * within the rounding of the element type; K^T follows K; V sums are the
 * moved values' sums. */
static int shift_mismatches(const kv_cache *c, const float *kb, const float *vb, int64_t n0, int64_t keep,
                            int64_t discard, int rope_dim, int neox)
{
    const int d = c->d, half = rope_dim / 2;
    int bad = 0;
    double want[64];
    for (int l = 0; l < c->n_layer; l++)
        for (int h = 0; h < c->n_kv_head; h++) {
            attn_kv_view w;
            kv_view(c, l, h, c->n, &w);
            const size_t head = ((size_t)l * c->n_kv_head + h) * n0;
            double vs[64] = { 0 };
            for (int64_t s = 0; s < c->n; s++) {
                const int64_t from = s < keep ? s : s + discard;
                const float *old = kb + (head + from) * d;
                for (int j = 0; j < d; j++) want[j] = old[j];
                for (int i = 0; s >= keep && i < half; i++) {
                    const double th = -(double)discard * pow(10000.0, -2.0 * i / rope_dim);
                    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
                    want[a] = old[a] * cos(th) - old[b] * sin(th);
                    want[b] = old[a] * sin(th) + old[b] * cos(th);
                }
                for (int j = 0; j < d; j++) {
                    const float got = attn_kv_at(w.K, c->elem, d, s, j);
                    double tol = 1e-5, row_step = 0; /* f32: float against double */
                    if (c->elem == KV_F16) tol += fabs(want[j]) / 2048; /* half an f16 ulp */
                    if (c->elem == KV_Q8_0) {
                        uint16_t hs;
                        memcpy(&hs, (const uint8_t *)w.K + (size_t)s * c->row_bytes + j / 32 * 34, 2);
                        row_step = fp16_to_fp32(hs);
                        tol += 0.501 * row_step; /* half a quantization step */
                    }
                    bad += s < keep ? got != old[j] : fabs(got - want[j]) > tol;
                    const float v = attn_kv_at(w.V, c->elem, d, s, j);
                    bad += v != vb[(head + from) * d + j];
                    vs[j] += v;
                    /* K^T: the same value (f32, f16) or, Q8_0 (quantized
                     * along positions), within half its own block's step of
                     * K: a moved column is rebuilt from K's rows; a kept one
                     * came from the written values, half a K step away */
                    int64_t col;
                    const uint8_t *kt = attn_kt_row(&w, j, s, &col);
                    const float ktv = attn_kv_at(kt, c->elem, 0, 0, col);
                    if (c->elem == KV_Q8_0) {
                        uint16_t hs;
                        memcpy(&hs, kt + col / 32 * 34, 2);
                        bad += fabsf(ktv - got) > 0.501 * fp16_to_fp32(hs) + (s < keep ? 0.501 * row_step : 0);
                    } else {
                        bad += ktv != got;
                    }
                }
            }
            for (int j = 0; j < d && w.v_sum; j++) bad += fabs(w.v_sum[j] - vs[j]) > 1e-3 * (1 + fabs(vs[j]));
        }
    return bad;
}

/* A cache of L layers written, shifted by kv_shift, checked against the
 * naive shift; and the check is shown to fail for a wrong reference (the
 * other pairing, a rotation of the other sign). */
static void check_shift_naive(int elem, int neox, int rope_dim)
{
    const int L = 2, H = 3, d = 8;
    const int64_t n0 = 90, keep = 7, discard = 29;
    kv_cache c;
    char err[256];
    CHECK(kv_create(&c, L, H, d, 128, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    if (!c.k) return;
    write_positions(&c, 0, n0, 3);
    float *kb = snapshot(&c, n0, 0), *vb = snapshot(&c, n0, 1), cs[8];
    rope_table(cs, rope_dim, -(int)discard);
    CHECK(kb && vb && kv_shift(&c, keep, discard, cs, rope_dim, neox) == 0 && c.n == n0 - discard, "shift");
    if (kb && vb) {
        const int bad = shift_mismatches(&c, kb, vb, n0, keep, discard, rope_dim, neox);
        CHECK(bad == 0, "elem %d neox %d rope %d: %d values differ from the naive shift", elem, neox, rope_dim, bad);
        /* controls: the other pairing, and keys rotated the other way */
        CHECK(shift_mismatches(&c, kb, vb, n0, keep, discard, rope_dim, !neox) > 0,
              "elem %d: a reference with the other pairing is told apart (the check can fail)", elem);
        kv_cache wrong;
        float cs_wrong[8];
        rope_table(cs_wrong, rope_dim, (int)discard);
        CHECK(kv_create(&wrong, L, H, d, 128, elem, 1, 1, err, sizeof err) == 0, "%s", err);
        write_positions(&wrong, 0, n0, 3);
        kv_shift(&wrong, keep, discard, cs_wrong, rope_dim, neox);
        CHECK(shift_mismatches(&wrong, kb, vb, n0, keep, discard, rope_dim, neox) > 0,
              "elem %d: a shift rotating by +discard is detected (the check can fail)", elem);
        kv_free(&wrong);
    }
    free(kb);
    free(vb);
    kv_free(&c);
}

/* A source of n positions shared; caches over it at n and at a shorter m,
 * each then writing its own suffix, equal fresh caches that wrote it all;
 * the shared copy and the other user are untouched. */
static void check_shared(int elem)
{
    const int L = 2, H = 3, d = 8;
    const int64_t cap = 2048, n = 1024, m = 512, more = 300; /* 512: a Q8_0 block boundary */
    char err[256];
    kv_cache src, ref_n, ref_m, a, b;
    /* another capacity; Q8_0's K^T comes from the source (f32, f16: built) */
    CHECK(kv_create(&src, L, H, d, 1500, elem, elem == KV_Q8_0, 0, err, sizeof err) == 0, "%s", err);
    CHECK(kv_create(&ref_n, L, H, d, cap, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    CHECK(kv_create(&ref_m, L, H, d, cap, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    write_positions(&src, 0, n, 0);
    write_positions(&ref_n, 0, n, 0);
    write_positions(&ref_m, 0, m, 0);
    kv_shared *s = NULL;
    CHECK(kv_shared_create(&src, n, cap, &s, err, sizeof err) == 0, "kv_shared_create: %s", err);
    if (!s) return;
    CHECK(kv_shared_n(s) == n && kv_shared_cap(s) == cap && kv_shared_users(s) == 0 &&
              kv_shared_bytes(s) == (size_t)(2 * L * H * n) * src.row_bytes +
                                        (elem == KV_Q8_0 ? (size_t)(L * H * d) * attn_kv_row_bytes(elem, n) : 0),
          "shared prefix fields");
    CHECK(kv_create_cow(&a, s, L, H, d, n, 1, 1, err, sizeof err) == 0, "cow of n: %s", err);
    CHECK(kv_create_cow(&b, s, L, H, d, m, 0, 1, err, sizeof err) == 0, "cow of m: %s", err);
    CHECK(kv_shared_users(s) == 2 &&
              kv_shared_bytes(s) == (size_t)(2 * L * H * n) * src.row_bytes + (size_t)(L * H * d) * attn_kv_row_bytes(elem, n),
          "two users, K^T built once");
    CHECK(a.kt_pre && a.kt_split == n, "elem %d: K^T of the cache over the prefix is read from the prefix (split %lld)",
          elem, (long long)a.kt_split);
    CHECK(cache_diff(&a, &ref_n, n) == 0, "elem %d: a cache over the shared prefix differs from a fresh one", elem);
    kv_cache tmp;
    CHECK(kv_create_cow(&tmp, s, L, H, d + 1, m, 0, 0, err, sizeof err) != 0, "a shape mismatch is refused");
    CHECK(kv_create_cow(&tmp, s, L, H, d, n + 1, 0, 0, err, sizeof err) != 0, "more than the prefix is refused");
    /* each writes its own suffix (b over positions the prefix holds) */
    write_positions(&a, n, n + more, 5);
    write_positions(&ref_n, n, n + more, 5);
    write_positions(&b, m, m + more, 9);
    write_positions(&ref_m, m, m + more, 9);
    kv_free(&ref_m); /* b's reference without K^T: compare rows and sums */
    CHECK(kv_create(&ref_m, L, H, d, cap, elem, 0, 1, err, sizeof err) == 0, "%s", err);
    write_positions(&ref_m, 0, m, 0);
    write_positions(&ref_m, m, m + more, 9);
    CHECK(cache_diff(&a, &ref_n, n + more) == 0, "elem %d: after its suffix, the first cache differs", elem);
    CHECK(cache_diff(&b, &ref_m, m + more) == 0, "elem %d: after its suffix, the second cache differs", elem);
    kv_cache c;
    CHECK(kv_create_cow(&c, s, L, H, d, n, 1, 1, err, sizeof err) == 0, "cow after others wrote: %s", err);
    kv_shared_unref(s); /* the owner lets go: the users keep it alive */
    kv_free(&a); /* users leaving punch the holes past the prefix: c keeps reading */
    kv_free(&b);
    kv_cache fresh;
    CHECK(kv_create(&fresh, L, H, d, cap, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    write_positions(&fresh, 0, n, 0);
    CHECK(cache_diff(&c, &fresh, n) == 0, "elem %d: the shared copy changed under its users' writes", elem);
    write_positions(&c, n, n + more, 5);
    write_positions(&fresh, n, n + more, 5);
    CHECK(cache_diff(&c, &fresh, n + more) == 0, "elem %d: a user after others left differs", elem);
    /* a reset and a context shift give up the prefix's K^T: the same as a fresh cache's */
    kv_cache e, fresh2;
    CHECK(kv_create_cow(&e, s, L, H, d, n, 1, 1, err, sizeof err) == 0, "cow to reset: %s", err);
    CHECK(kv_create(&fresh2, L, H, d, cap, elem, 1, 1, err, sizeof err) == 0, "%s", err);
    kv_reset(&e);
    CHECK(e.n == 0 && !e.kt_pre && e.kt_split == 0, "elem %d: a reset cache holds nothing of the prefix", elem);
    write_positions(&e, 0, 700, 13);
    write_positions(&fresh2, 0, 700, 13);
    CHECK(cache_diff(&e, &fresh2, 700) == 0, "elem %d: a cache over the prefix, reset and rewritten, differs", elem);
    kv_free(&e);
    kv_free(&fresh2);
    /* a shift: against the naive rotation of what the cache held (which
     * kv_shift does not compute), then the same bytes as a plain cache's */
    float cs[8];
    rope_table(cs, d, -100);
    const int64_t n0 = c.n;
    float *kb = snapshot(&c, n0, 0), *vb = snapshot(&c, n0, 1);
    CHECK(kb && vb && kv_shift(&c, n + 76, 100, cs, d, 0) == 0 && kv_shift(&fresh, n + 76, 100, cs, d, 0) == 0 &&
              !c.kt_pre && c.n == n + more - 100,
          "elem %d: shift of a cache over a shared prefix", elem);
    if (kb && vb)
        CHECK(shift_mismatches(&c, kb, vb, n0, n + 76, 100, d, 0) == 0,
              "elem %d: the shifted cache over the prefix differs from the naive shift", elem);
    free(kb);
    free(vb);
    CHECK(cache_diff(&c, &fresh, c.n) == 0, "elem %d: shifted, the cache over the prefix differs from a plain one", elem);
    write_positions(&c, c.n, c.n + 40, 11);
    write_positions(&fresh, fresh.n, fresh.n + 40, 11);
    CHECK(cache_diff(&c, &fresh, c.n) == 0, "elem %d: writes after the shift differ", elem);
    kv_free(&fresh);
    kv_free(&c); /* the last user: the memfd goes (ASan/valgrind see the rest) */
    kv_free(&ref_n);
    kv_free(&ref_m);
    kv_free(&src);
}

/* ---- contexts over a shared prefix (the library) ----------------------------- */

enum { NB = 32, PROMPT = 150, STEPS = 4 };

static sparq_attn_params policy(const char *name)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = name;
    if (!strcmp(name, "sparq")) { p.r = 4; p.k = 16; p.l = 4; }
    else if (!strcmp(name, "topk")) p.k = 16;
    return p;
}

static sparq_context_params ctx_params(const char *pol, int kv_type, int64_t n_ctx)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 1;
    cp.n_batch = NB;
    cp.kv_type = kv_type;
    cp.attn = policy(pol);
    return cp;
}

static sparq_context *make_ctx(sparq_model *m, const char *pol, int kv_type, int64_t n_ctx)
{
    const sparq_context_params cp = ctx_params(pol, kv_type, n_ctx);
    sparq_context *c = NULL;
    char err[256];
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) fprintf(stderr, "context: %s\n", err);
    return c;
}

/* Prompt tokens [from, np) in chunks aligned to NB, then STEPS decode
 * steps; rows[1 + STEPS][V]. 0 or -1. */
static int finish_run(sparq_context *c, const int32_t *prompt, int np, int from, const int32_t *next, float *rows,
                      int V)
{
    for (int at = from; at < np; at += NB) {
        const int nb = np - at < NB ? np - at : NB;
        if (sparq_eval_prefill(c, prompt + at, nb, rows)) return -1;
    }
    for (int t = 0; t < STEPS; t++)
        if (sparq_decode_batch(&c, &next[t], 1, rows + (size_t)(1 + t) * V)) return -1;
    return 0;
}

/* np = 150: a prefix of 128 positions, below one K^T block; 300: 288, K^T's
 * first block read in place from the prefix and the rest copied. */
static void check_attach(sparq_model *m, const char *pol, int kv_type, int np)
{
    const int n_ctx = np + 106, n_src = np + 50;
    const int V = sparq_model_n_vocab(m);
    int32_t prompt[2 * PROMPT], next[STEPS];
    for (int i = 0; i < np; i++) prompt[i] = 3 + (i * 37 + 11) % (V - 3);
    for (int t = 0; t < STEPS; t++) next[t] = 5 + t * 13;
    float *ref = malloc((size_t)(1 + STEPS) * V * sizeof(float)), *row = malloc((size_t)(1 + STEPS) * V * sizeof(float));
    /* the source runs another policy (prefill does not depend on it); for
     * Q8_0 one with K^T, whose blocks a rebuild from K would not match */
    const char *src_pol = kv_type == SPARQ_KV_Q8_0 ? "sparq" : strcmp(pol, "dense") ? "dense" : "streaming";
    sparq_context *fresh = make_ctx(m, pol, kv_type, n_ctx), *src = make_ctx(m, src_pol, kv_type, n_src);
    int ok = ref && row && fresh && src && finish_run(fresh, prompt, np, 0, next, ref, V) == 0 &&
             sparq_eval(src, prompt, np, NULL) == 0;
    CHECK(ok, "%s: the fresh run failed", pol);
    char err[256] = "";
    sparq_prefix *p = NULL;
    const int P = (np - 1) / NB * NB;
    ok = ok && sparq_prefix_create(src, P, n_ctx, &p, err, sizeof err) == 0;
    CHECK(ok && sparq_prefix_pos(p) == P && sparq_prefix_n_ctx(p) == n_ctx, "%s: prefix_create: %s", pol, err);
    sparq_context_free(src); /* the prefix is its own copy */
    if (!ok) goto done;
    /* two contexts at once, at the whole prefix and at a shorter chunk boundary */
    sparq_context *a = make_ctx(m, pol, kv_type, n_ctx), *b = make_ctx(m, pol, kv_type, n_ctx);
    const int ra = a ? sparq_context_attach_prefix(a, p, P, err, sizeof err) : -1;
    if (!strcmp(pol, "h2o")) {
        CHECK(ra == -1 && strstr(err, "observes the prefill"), "h2o: attach refused: %s", err);
    } else {
        CHECK(ra == 0 && sparq_context_pos(a) == P, "%s: attach: %s", pol, err);
        const int rb = b ? sparq_context_attach_prefix(b, p, P - 2 * NB, err, sizeof err) : -1;
        CHECK(rb == 0 && sparq_prefix_users(p) == 2, "%s: second attach: %s", pol, err);
        /* `fresh`, reset for a new sequence after holding another prompt
         * as long (its pages then hold other keys): the prefix is copied
         * into its own pages, not mapped (K^T's whole blocks are read in
         * place, as over a mapping) */
        int32_t other_prompt[2 * PROMPT];
        for (int i = 0; i < np; i++) other_prompt[i] = 3 + (i * 53 + 7) % (V - 3);
        sparq_context_reset(fresh);
        CHECK(sparq_eval(fresh, other_prompt, np, NULL) == 0, "%s: another prompt: %s", pol,
              sparq_context_error(fresh));
        const sparq_context_params same = ctx_params(pol, kv_type, n_ctx);
        sparq_context_params other = same;
        other.n_ctx = 255;
        const int mismatch = sparq_context_reuse(fresh, &other);
        other = same;
        other.attn = policy(strcmp(pol, "dense") ? "dense" : "streaming");
        const int mismatch2 = sparq_context_reuse(fresh, &other), mapped = sparq_context_reuse(a, &same);
        CHECK(mismatch == 0 && mismatch2 == 0 && mapped == 0,
              "%s: reuse must refuse other parameters (%d, %d) and a shared prefix's mapping (%d)", pol, mismatch,
              mismatch2, mapped);
        const int reused = sparq_context_reuse(fresh, &same);
        const int rc = reused ? sparq_context_attach_prefix(fresh, p, P, err, sizeof err) : -1;
        CHECK(reused == 1 && rc == 0 && sparq_context_pos(fresh) == P, "%s kv %d: reuse %d, attach into it %d (%s)", pol,
              kv_type, reused, rc, err);
        int dc = -1;
        if (!rc && !finish_run(fresh, prompt, np, P, next, row, V)) dc = memcmp(row, ref, (size_t)(1 + STEPS) * V * sizeof(float));
        CHECK(dc == 0, "%s kv %d: logits over a prefix copied into a reused context differ from a fresh prefill", pol,
              kv_type);
        /* a copy, not a mapping (a mapped context is never reused), and its
         * reset lets go of the prefix */
        CHECK(sparq_context_reuse(fresh, &same) == 1 && sparq_prefix_users(p) == 2,
              "%s kv %d: after the copy, reuse again and %d users (want 2)", pol, kv_type, sparq_prefix_users(p));
        sparq_prefix_free(p); /* the contexts keep it */
        p = NULL;
        int da = -1, db = -1;
        if (!ra && !finish_run(a, prompt, np, P, next, row, V)) da = memcmp(row, ref, (size_t)(1 + STEPS) * V * sizeof(float));
        if (!rb && !finish_run(b, prompt, np, P - 2 * NB, next, row, V))
            db = memcmp(row, ref, (size_t)(1 + STEPS) * V * sizeof(float));
        CHECK(da == 0 && db == 0, "%s kv %d: logits over a shared prefix differ from a fresh prefill (%d, %d)", pol,
              kv_type, da, db);
    }
    sparq_context_free(a);
    sparq_context_free(b);
done:
    sparq_prefix_free(p);
    sparq_context_free(fresh);
    free(ref);
    free(row);
}

/* Pss and Private_Dirty of the process, in bytes. */
static void mem_now(double *pss, double *priv)
{
    *pss = *priv = -1;
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return;
    char line[256];
    double v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "Pss: %lf", &v) == 1) *pss = v * 1024;
        if (sscanf(line, "Private_Dirty: %lf", &v) == 1) *priv = v * 1024;
    }
    fclose(f);
}

/* 16 contexts decoding over one long shared prefix: the process grows by
 * about one copy of it (Pss: each page counted once however many map it),
 * and its private dirty memory by less than one copy; 4 contexts with
 * their own copies (sparq_context_copy_prefix) grow it by 4. */
static void check_memory(sparq_model *m, const char *pol)
{
    enum { N = 16, S = 65536, CAP = S + 64 };
    double pss0, prv0, pss1, prv1, pss2, prv2, pss3, prv3;
    sparq_context *src = make_ctx(m, "dense", SPARQ_KV_F16, CAP), *ctx[N] = { 0 };
    char err[256] = "";
    const int32_t tok = 7;
    if (!src || sparq_context_fill_random(src, S, 42)) {
        CHECK(0, "memory: source context");
        sparq_context_free(src);
        return;
    }
    mem_now(&pss0, &prv0);
    sparq_prefix *p = NULL;
    int ok = sparq_prefix_create(src, S, 0, &p, err, sizeof err) == 0;
    for (int i = 0; ok && i < N; i++) {
        ctx[i] = make_ctx(m, pol, SPARQ_KV_F16, CAP);
        ok = ctx[i] && sparq_context_attach_prefix(ctx[i], p, S, err, sizeof err) == 0 &&
             sparq_eval(ctx[i], &tok, 1, NULL) == 0 && sparq_eval(ctx[i], &tok, 1, NULL) == 0;
    }
    CHECK(ok, "memory %s: attach and decode: %s", pol, err);
    const double copy = ok ? (double)sparq_prefix_bytes(p) : 1; /* K and V (and K^T for sparq) */
    mem_now(&pss1, &prv1);
    for (int i = 0; i < N; i++) sparq_context_free(ctx[i]);
    sparq_prefix_free(p);
    mem_now(&pss2, &prv2);
    /* the control: copies */
    for (int i = 0; ok && i < 4; i++) {
        ctx[i] = make_ctx(m, pol, SPARQ_KV_F16, CAP);
        ok = ctx[i] && sparq_context_copy_prefix(ctx[i], src, S, err, sizeof err) == 0 &&
             sparq_eval(ctx[i], &tok, 1, NULL) == 0;
    }
    mem_now(&pss3, &prv3);
    for (int i = 0; i < 4; i++) sparq_context_free(ctx[i]);
    sparq_context_free(src);
    fprintf(stderr, "memory %s: one copy %.1f MiB; %d sharing contexts: Pss +%.2f copies, Private_Dirty +%.2f; "
            "freed: Pss -%.2f; 4 copying contexts: Pss +%.2f copies\n", pol, copy / 1048576, N, (pss1 - pss0) / copy,
            (prv1 - prv0) / copy, (pss1 - pss2) / copy, (pss3 - pss2) / copy);
    CHECK(pss0 > 0 && prv0 > 0, "smaps_rollup unreadable");
    CHECK(pss1 - pss0 > 0.9 * copy && pss1 - pss0 < 2.0 * copy, "%s: %d contexts over a shared prefix grew Pss by "
          "%.2f copies", pol, N, (pss1 - pss0) / copy);
    CHECK(prv1 - prv0 < 1.0 * copy, "%s: private dirty memory grew by %.2f copies", pol, (prv1 - prv0) / copy);
    CHECK(pss1 - pss2 > 0.9 * copy, "%s: freeing the contexts and the prefix returned only %.2f copies", pol,
          (pss1 - pss2) / copy);
    CHECK(pss3 - pss2 > 3.5 * copy, "%s: 4 copies grew Pss by only %.2f copies: the measure is blind", pol,
          (pss3 - pss2) / copy);
}

int main(void)
{
    check_kt_len();
    check_type(KV_F32);
    check_type(KV_F16);
    check_shared(KV_F32);
    check_shared(KV_F16);
    check_shared(KV_Q8_0);
    for (int e = 0; e < 3; e++) {
        const int elem = e == 0 ? KV_F32 : e == 1 ? KV_F16 : KV_Q8_0;
        check_shift_naive(elem, 0, 8);
        check_shift_naive(elem, 1, 6); /* NEOX pairs over part of the head */
    }
    kv_cache c;
    char err[256];
    CHECK(kv_create(&c, 1, 1, 8, 0, KV_F16, 0, 0, err, sizeof err) != 0, "zero capacity rejected");
    CHECK(kv_create(&c, 32, 8, 128, INT64_C(1) << 40, KV_F16, 0, 0, err, sizeof err) != 0 &&
              strstr(err, "too large"), "absurd capacity rejected: %s", err);
    /* a large reservation costs address space only */
    CHECK(kv_create(&c, 16, 8, 64, 1 << 20, KV_F16, 1, 1, err, sizeof err) == 0, "1M-token reserve: %s", err);
    kv_free(&c);
    char model[1024];
    if (path_find("stories260K.gguf", model, sizeof model)) {
        test_skip("stories260K.gguf not found: shared prefixes in contexts not checked");
        return test_summary("test_kvcache");
    }
    sparq_model *mdl = NULL;
    CHECK(sparq_model_load(model, &mdl, err, sizeof err) == 0, "load %s: %s", model, err);
    if (!mdl) return test_summary("test_kvcache");
    static const char *pols[] = { "dense", "sparq", "topk", "streaming", "h2o" };
    for (int i = 0; i < 5; i++) check_attach(mdl, pols[i], SPARQ_KV_F16, PROMPT);
    check_attach(mdl, "dense", SPARQ_KV_F32, PROMPT);
    check_attach(mdl, "sparq", SPARQ_KV_Q8_0, PROMPT);
    check_attach(mdl, "sparq", SPARQ_KV_F16, 2 * PROMPT);
    check_attach(mdl, "sparq", SPARQ_KV_Q8_0, 2 * PROMPT);
    check_memory(mdl, "dense");
    check_memory(mdl, "sparq");
    sparq_model_free(mdl);
    return test_summary("test_kvcache");
}
