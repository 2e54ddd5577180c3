/* test_kvq8.c - the Q8_0 KV cache (--kv-type q8_0).
 *
 * - the row format against a quantizer written here from the definition
 *   (scale = f16(max|x| / 127), q = round(x / scale));
 * - kv_write: K, V rows, K^T blocks along positions (also the partial
 *   block of the newest positions at every step), V sums, kv_shift (by
 *   angle 0: exact; by the RoPE angles of a real offset: within the Q8_0
 *   rounding bound of a naive rotation, with a wrong-sign control);
 * - every attention kernel on a Q8_0 view against the same kernel on the
 *   dequantized f32 copy (dequantized values are exact in f32, so only the
 *   order of float sums differs), prefill tiles included;
 * - the model: greedy stories260K with q8_0 vs f16 KV (>= 95% of tokens
 *   the same, the figure), SparQ with k >= S equal to dense on a
 *   q8_0 cache (the dense shortcut and, select_always, the selecting path;
 *   k = 8 through that path must differ: the comparison can fail), transfer bytes at 34 per 32 elements, KV files refused.
 */
#include "test.h"
#include <unistd.h>
#include "attn/attn.h"
#include "attn/attn_prefill.h"
#include "core/kvcache.h"
#include "tensor/quant.h"
#include "util/paths.h"
#include "sparq.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float unif(void) /* [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1 << 23))) - 1.0f;
}

/* The definition, independently of attn_q8_quantize_row: values of one
 * block x[0..n) -> scale (as f16 bits) and q. */
static void naive_block(const float *x, int n, uint16_t *h, int8_t *q)
{
    double amax = 0;
    for (int i = 0; i < n; i++) amax = fabs(x[i]) > amax ? fabs(x[i]) : amax;
    *h = fp32_to_fp16((float)(amax / 127.0));
    const double sc = fp16_to_fp32(*h);
    for (int i = 0; i < n; i++) {
        double v = sc > 0 ? round(x[i] / sc) : 0;
        q[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
}

/* Number of elements of the Q8_0 row `row` (len elements) whose block
 * scale or value differs from naive_block over x[0..len). */
static int row_mismatches(const uint8_t *row, const float *x, int64_t len)
{
    int bad = 0;
    for (int64_t b0 = 0; b0 < len; b0 += 32) {
        const int n = len - b0 < 32 ? (int)(len - b0) : 32;
        uint16_t h;
        int8_t q[32];
        naive_block(x + b0, n, &h, q);
        const uint8_t *blk = row + (b0 / 32) * 34;
        uint16_t hs;
        memcpy(&hs, blk, 2);
        if (hs != h) bad += n;
        else
            for (int i = 0; i < n; i++) bad += (int8_t)blk[2 + i] != q[i];
    }
    return bad;
}

static void test_format(void)
{
    CHECK(attn_q8_row_bytes(64) == 68 && attn_q8_row_bytes(32) == 34 && attn_q8_row_bytes(8) == 10 &&
              attn_q8_row_bytes(40) == 44 && attn_q8_row_bytes(1) == 3,
          "row bytes 64:%zu 8:%zu 40:%zu", attn_q8_row_bytes(64), attn_q8_row_bytes(8), attn_q8_row_bytes(40));
    const int lens[] = { 1, 8, 31, 32, 33, 64, 100, 128 };
    for (size_t t = 0; t < sizeof lens / sizeof lens[0]; t++) {
        const int n = lens[t];
        float x[128], y[128];
        uint8_t row[200];
        for (int i = 0; i < n; i++) x[i] = 3.0f * unif();
        if (n > 40) memset(x + 32, 0, 8 * sizeof(float)); /* part of a block zero */
        if (n >= 64) memset(x + 32, 0, 32 * sizeof(float)); /* a whole block zero: scale 0 */
        attn_q8_quantize_row(x, n, row);
        CHECK(row_mismatches(row, x, n) == 0, "len %d: quantized row differs from the definition", n);
        attn_kv_row_f32(row, KV_Q8_0, n, 0, n, y);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + (i / 32) * 34, 2);
            const float sc = fp16_to_fp32(h);
            bad += fabsf(y[i] - x[i]) > 0.5f * sc * 1.0001f + 1e-7f; /* round to nearest */
            bad += y[i] != attn_q8_at(row, i) || y[i] != attn_kv_at(row, KV_Q8_0, n, 0, i);
            /* exact in f32: f16 scale (11 bits) x int8 (8 bits) */
            bad += (double)y[i] != (double)sc * (double)(int8_t)row[(i / 32) * 34 + 2 + i % 32];
        }
        CHECK(bad == 0, "len %d: %d dequantized values wrong", n, bad);
    }
}

/* ---- the cache ------------------------------------------------------------ */

static float key_val(int l, int h, int64_t p, int j) { return sinf(0.37f * p + 1.3f * j + l + 0.5f * h) * (1 + j % 5); }
static float val_val(int l, int h, int64_t p, int j) { return cosf(0.11f * p + 0.7f * j + l - h) * 2.0f; }

static void test_cache(void)
{
    const int L = 2, H = 2, d = 40;
    const int64_t cap = 100, N = 77;
    kv_cache c;
    char err[256];
    CHECK(kv_create(&c, L, H, d, cap, KV_Q8_0, 1, 1, err, sizeof err) == 0, "%s", err);
    if (!c.k) return;
    CHECK(c.row_bytes == 44 && c.kt_row_bytes == attn_q8_row_bytes(cap), "row bytes %zu, K^T %zu", c.row_bytes,
          c.kt_row_bytes);
    float k[2 * 40], v[2 * 40], col[100];
    int bad_rows = 0, bad_kt_step = 0;
    for (int64_t p = 0; p < N; p++) {
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < H; h++)
                for (int j = 0; j < d; j++) {
                    k[h * d + j] = key_val(l, h, p, j);
                    v[h * d + j] = val_val(l, h, p, j);
                }
            kv_write(&c, l, p, k, v);
            for (int h = 0; h < H; h++) {
                attn_kv_view view;
                kv_view(&c, l, h, p + 1, &view);
                bad_rows += row_mismatches((const uint8_t *)view.K + p * c.row_bytes, k + h * d, d);
                bad_rows += row_mismatches((const uint8_t *)view.V + p * c.row_bytes, v + h * d, d);
                /* the K^T block holding p is the quantized [block start, p] */
                const int64_t b0 = p / 32 * 32;
                for (int j = 0; j < d; j += 7) {
                    for (int64_t s = b0; s <= p; s++) col[s - b0] = key_val(l, h, s, j);
                    bad_kt_step += row_mismatches((const uint8_t *)view.KT + j * c.kt_row_bytes + b0 / 32 * 34, col,
                                                  p - b0 + 1);
                }
            }
        }
        c.n++;
    }
    CHECK(bad_rows == 0, "%d K/V row values differ from the definition", bad_rows);
    CHECK(bad_kt_step == 0, "%d K^T values differ while their block fills", bad_kt_step);
    int bad_kt = 0, bad_sum = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            attn_kv_view view;
            kv_view(&c, l, h, N, &view);
            CHECK(view.elem == KV_Q8_0 && view.kt_stride == cap, "view fields");
            for (int j = 0; j < d; j++) {
                for (int64_t s = 0; s < N; s++) col[s] = key_val(l, h, s, j);
                bad_kt += row_mismatches((const uint8_t *)view.KT + j * c.kt_row_bytes, col, N);
                double sum = 0;
                for (int64_t s = 0; s < N; s++) sum += attn_kv_at(view.V, KV_Q8_0, d, s, j);
                bad_sum += fabs(view.v_sum[j] - sum) > 1e-4;
            }
        }
    CHECK(bad_kt == 0, "%d K^T values differ from the position blocks' quantization", bad_kt);
    CHECK(bad_sum == 0, "%d V sums differ from the sums of the stored V", bad_sum);
    CHECK(kv_bytes_of(&c, 32) == 34 && kv_bytes_of(&c, 64000) == 68000, "34 bytes per 32 elements");

    /* context shift: drop [5, 5 + 40); rotation by angle 0 (cos 1, sin 0)
     * keeps the keys, so moved rows must keep their values and K^T must
     * follow K */
    float cs[40];
    for (int i = 0; i < 20; i++) cs[2 * i] = 1, cs[2 * i + 1] = 0;
    float before[77][40];
    attn_kv_view v0;
    kv_view(&c, 1, 1, N, &v0);
    for (int64_t s = 0; s < N; s++) attn_kv_row_f32(v0.K, KV_Q8_0, d, s, d, before[s]);
    CHECK(kv_shift(&c, 5, 40, cs, d, 0) == 0 && c.n == N - 40, "shift");
    attn_kv_view v1;
    kv_view(&c, 1, 1, c.n, &v1);
    int bad_shift = 0, bad_ktshift = 0;
    for (int64_t s = 0; s < c.n; s++) {
        const int64_t from = s < 5 ? s : s + 40;
        for (int j = 0; j < d; j++) {
            const float kk = attn_kv_at(v1.K, KV_Q8_0, d, s, j);
            bad_shift += kk != before[from][j]; /* re-quantizing a dequantized row is exact */
            const float kt = attn_kv_at(v1.KT, KV_Q8_0, cap, j, s);
            /* K^T re-quantized from K's rows: within half a K^T step */
            uint16_t hs;
            memcpy(&hs, (const uint8_t *)v1.KT + j * c.kt_row_bytes + s / 32 * 34, 2);
            bad_ktshift += fabsf(kt - kk) > 0.5f * fp16_to_fp32(hs) * 1.001f;
        }
    }
    CHECK(bad_shift == 0, "%d shifted key values changed", bad_shift);
    CHECK(bad_ktshift == 0, "%d K^T values after the shift do not follow K", bad_ktshift);
    /* writes continue after the shift (the partial block is reloaded) */
    for (int l = 0; l < L; l++) {
        for (int h = 0; h < H; h++)
            for (int j = 0; j < d; j++) k[h * d + j] = v[h * d + j] = (float)j - 20.0f;
        kv_write(&c, l, c.n, k, v);
    }
    kv_view(&c, 0, 1, c.n + 1, &v1);
    int bad_after = 0;
    for (int j = 0; j < d; j++)
        bad_after += fabsf(attn_kv_at(v1.KT, KV_Q8_0, cap, j, c.n) - attn_kv_at(v1.K, KV_Q8_0, d, c.n, j)) > 0.2f;
    CHECK(bad_after == 0, "%d K^T values of the write after a shift are off", bad_after);
    kv_free(&c);
}

/* Rotates row x[d] (in double) by the RoPE angle of position `delta`:
 * pairs (2i, 2i+1) or, neox, (i, i + half) over the first rope_dim
 * components, angle delta * 10000^(-2i/rope_dim). */
static void naive_rotate(const float *x, double *y, int d, int rope_dim, int neox, int delta)
{
    const int half = rope_dim / 2;
    for (int j = 0; j < d; j++) y[j] = x[j];
    for (int i = 0; i < half; i++) {
        const double th = delta * pow(10000.0, -2.0 * i / rope_dim);
        const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        y[a] = x[a] * cos(th) - x[b] * sin(th);
        y[b] = x[a] * sin(th) + x[b] * cos(th);
    }
}

/* A shift by a real offset: every moved key row, dequantized, must be the
 * naive rotation of the row it came from (dequantized before the shift)
 * within the Q8_0 rounding bound (half a step of its block's scale, plus
 * the f16 rounding of that scale), and agree with that rotation quantized
 * here from the definition to within one step; kept rows, V and V sums as
 * they were; K^T follows K. A rotation by +delta instead of -delta (a sign
 * slip) or a missed layer fails the same comparison: run as a control. */
static void test_shift_rotation(int neox, int rope_dim)
{
    const int L = 2, H = 2, d = 40, keep = 5, discard = 37;
    const int64_t cap = 100, N = 90;
    kv_cache c;
    char err[256];
    CHECK(kv_create(&c, L, H, d, cap, KV_Q8_0, 1, 1, err, sizeof err) == 0, "%s", err);
    if (!c.k) return;
    float k[2 * 40], v[2 * 40];
    for (int64_t p = 0; p < N; p++) {
        for (int l = 0; l < L; l++) {
            for (int h = 0; h < H; h++)
                for (int j = 0; j < d; j++) {
                    k[h * d + j] = key_val(l, h, p, j);
                    v[h * d + j] = val_val(l, h, p, j);
                }
            kv_write(&c, l, p, k, v);
        }
        c.n++;
    }
    static float kb[2][2][90][40], vb[2][2][90][40];
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            attn_kv_view w;
            kv_view(&c, l, h, N, &w);
            for (int64_t s = 0; s < N; s++) {
                attn_kv_row_f32(w.K, KV_Q8_0, d, s, d, kb[l][h][s]);
                attn_kv_row_f32(w.V, KV_Q8_0, d, s, d, vb[l][h][s]);
            }
        }
    float cs[40];
    for (int i = 0; i < rope_dim / 2; i++) {
        const double th = -(double)discard * pow(10000.0, -2.0 * i / rope_dim);
        cs[2 * i] = (float)cos(th);
        cs[2 * i + 1] = (float)sin(th);
    }
    CHECK(kv_shift(&c, keep, discard, cs, rope_dim, neox) == 0 && c.n == N - discard, "shift");
    int bad_bound = 0, bad_naive = 0, off_step = 0, bad_kept = 0, bad_v = 0, bad_sum = 0, bad_kt = 0, ctl = 0;
    int64_t moved = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            attn_kv_view w;
            kv_view(&c, l, h, c.n, &w);
            for (int64_t s = 0; s < c.n; s++) {
                const int64_t from = s < keep ? s : s + discard;
                double want[40], sign_slip[40];
                naive_rotate(kb[l][h][from], want, d, rope_dim, neox, -discard);
                naive_rotate(kb[l][h][from], sign_slip, d, rope_dim, neox, discard);
                float wantf[40];
                for (int j = 0; j < d; j++) wantf[j] = (float)want[j];
                uint8_t q[44];
                int8_t qq[32];
                uint16_t qh[2];
                for (int b = 0; b * 32 < d; b++) { /* the definition's quantization of the rotated row */
                    const int n = d - b * 32 < 32 ? d - b * 32 : 32;
                    naive_block(wantf + b * 32, n, &qh[b], qq);
                    memcpy(q + b * 34, &qh[b], 2);
                    memcpy(q + b * 34 + 2, qq, (size_t)n);
                }
                for (int j = 0; j < d; j++) {
                    const float got = attn_kv_at(w.K, KV_Q8_0, d, s, j);
                    bad_v += attn_kv_at(w.V, KV_Q8_0, d, s, j) != vb[l][h][from][j];
                    if (s < keep) {
                        bad_kept += got != kb[l][h][s][j];
                        continue;
                    }
                    moved++;
                    uint16_t hs;
                    memcpy(&hs, (const uint8_t *)w.K + s * c.row_bytes + j / 32 * 34, 2);
                    const double step = fp16_to_fp32(hs), bound = 0.5 * step * 1.002 + 1e-6;
                    bad_bound += fabs(got - want[j]) > bound;
                    ctl += fabs(got - sign_slip[j]) > bound;
                    const double ref = attn_q8_at(q, j);
                    bad_naive += fabs(got - ref) > step * 1.002 + 1e-6;
                    off_step += got != ref;
                    const float kt = attn_kv_at(w.KT, KV_Q8_0, cap, j, s);
                    memcpy(&hs, (const uint8_t *)w.KT + j * c.kt_row_bytes + s / 32 * 34, 2);
                    bad_kt += fabsf(kt - got) > 0.5f * fp16_to_fp32(hs) * 1.001f;
                }
            }
            for (int j = 0; j < d; j++) {
                double sum = 0;
                for (int64_t s = 0; s < c.n; s++) sum += vb[l][h][s < keep ? s : s + discard][j];
                bad_sum += fabs(w.v_sum[j] - sum) > 1e-3;
            }
        }
    const char *pair = neox ? "neox" : "normal";
    CHECK(moved == (int64_t)L * H * (N - discard - keep) * d, "moved elements counted");
    CHECK(bad_bound == 0, "%s rope %d: %d of %lld moved key values outside the Q8_0 rounding bound of the naive rotation",
          pair, rope_dim, bad_bound, (long long)moved);
    /* float vs double rotation may round a value at a half step the
     * other way: one step at most, and rarely */
    CHECK(bad_naive == 0 && off_step * 50 <= moved, "%s rope %d: vs the naive re-quantized rotation: %d beyond one step, %d differ",
          pair, rope_dim, bad_naive, off_step);
    CHECK(bad_kept == 0, "%d kept key values changed", bad_kept);
    CHECK(bad_v == 0, "%d value entries not moved verbatim", bad_v);
    CHECK(bad_sum == 0, "%d V sums differ from the moved values' sums", bad_sum);
    CHECK(bad_kt == 0, "%d K^T values after a rotating shift do not follow K", bad_kt);
    CHECK(ctl * 4 > moved, "control: a rotation of the wrong sign is detected (%d of %lld values off)", ctl,
          (long long)moved);
    kv_free(&c);
}

/* ---- kernels: Q8_0 view vs its dequantized f32 copy ------------------------ */

typedef struct {
    int64_t S, stride;
    int d;
    uint8_t *Kq, *Vq, *KTq;
    float *K, *V, *KT;
    attn_kv_view q8, f32;
} kfix;

static int kfix_make(kfix *f, int64_t S, int d)
{
    memset(f, 0, sizeof *f);
    f->S = S;
    f->d = d;
    f->stride = S + 7; /* K^T rows longer than S, not a multiple of 32 */
    const size_t rb = attn_q8_row_bytes(d), trb = attn_q8_row_bytes(f->stride);
    f->Kq = malloc(S * rb);
    f->Vq = malloc(S * rb);
    f->KTq = malloc(d * trb);
    f->K = malloc(S * d * sizeof(float));
    f->V = malloc(S * d * sizeof(float));
    f->KT = calloc((size_t)d * f->stride, sizeof(float));
    float *x = malloc((size_t)(S > d ? S : d) * sizeof(float) + 64);
    if (!f->Kq || !f->Vq || !f->KTq || !f->K || !f->V || !f->KT || !x) {
        free(x);
        return -1;
    }
    for (int64_t i = 0; i < S; i++) {
        for (int j = 0; j < d; j++) x[j] = 1.5f * unif() * (1 + (j % 3));
        attn_q8_quantize_row(x, d, f->Kq + i * rb);
        attn_kv_row_f32(f->Kq, KV_Q8_0, d, i, d, f->K + i * d);
        for (int j = 0; j < d; j++) x[j] = unif();
        attn_q8_quantize_row(x, d, f->Vq + i * rb);
        attn_kv_row_f32(f->Vq, KV_Q8_0, d, i, d, f->V + i * d);
    }
    for (int j = 0; j < d; j++) { /* K^T quantized along positions from the f32 keys */
        for (int64_t i = 0; i < S; i++) x[i] = f->K[i * d + j] + 0.01f * unif();
        memset(f->KTq + j * trb, 0, trb);
        attn_q8_quantize_row(x, S, f->KTq + j * trb);
        attn_kv_row_f32(f->KTq, KV_Q8_0, f->stride, j, S, f->KT + j * f->stride);
    }
    free(x);
    attn_kv_view a = { S, d, KV_Q8_0, f->Kq, f->Vq, f->KTq, f->stride, NULL, NULL, NULL, 0, 0 };
    attn_kv_view b = { S, d, KV_F32, f->K, f->V, f->KT, f->stride, NULL, NULL, NULL, 0, 0 };
    f->q8 = a;
    f->f32 = b;
    return 0;
}

static void kfix_free(kfix *f)
{
    free(f->Kq); free(f->Vq); free(f->KTq); free(f->K); free(f->V); free(f->KT);
}

/* max |a - b| / (1 + |b|) */
static double rel_err(const float *a, const float *b, size_t n)
{
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - b[i]) / (1.0 + fabs(b[i]));
        if (!(e <= w)) w = e;
    }
    return w;
}

/* The integer kernels' error against f32 on the dequantized cache, from
 * attn.h's definition (not from the kernels): a query element moves at most
 * half its block's step max|q_b| / 127, so a score moves at most
 * sum_j |K_ij| max|q_b| / 254 / sqrt(d); f32 rounding adds ~1e-7
 * relative. */
static int scores_within(const float *s, const float *s_f32, const float *q, int g, const float *K,
                         int d, const int32_t *rows, int64_t n)
{
    for (int h = 0; h < g; h++)
        for (int64_t i = 0; i < n; i++) {
            const float *k = K + (size_t)(rows ? rows[i] : i) * d;
            double bound = 0;
            for (int b = 0; b < d / 32; b++) {
                double amax = 0;
                for (int j = 32 * b; j < 32 * b + 32; j++) amax = fmax(amax, fabs(q[h * d + j]));
                for (int j = 32 * b; j < 32 * b + 32; j++) bound += fabs(k[j]) * amax / 254.0;
            }
            bound = bound / sqrt(d) * 1.001 + 1e-5 * (1 + fabs(s_f32[h * n + i]));
            if (!(fabs((double)s[h * n + i] - s_f32[h * n + i]) <= bound)) return 0;
        }
    return 1;
}

/* Same for the softmax-weighted sum of V: per 64 positions and V block the
 * weights c_i = p_i dv_i are rounded to steps of max c / 255, so output j
 * moves at most sum_i (step / 2) |code_ij| / sum_i p_i. */
static int wsum_within(const float *o, const float *o_f32, const float *s, int g, const uint8_t *Vq,
                       int d, const int32_t *rows, int64_t n)
{
    const size_t rb = attn_q8_row_bytes(d);
    double *bound = calloc((size_t)d, sizeof *bound), *p = malloc((size_t)n * sizeof *p);
    int ok = bound && p;
    for (int h = 0; ok && h < g; h++) {
        double mx = -INFINITY, z = 0;
        for (int64_t i = 0; i < n; i++) mx = fmax(mx, s[h * n + i]);
        for (int64_t i = 0; i < n; i++) z += p[i] = exp(s[h * n + i] - mx);
        memset(bound, 0, (size_t)d * sizeof *bound);
        for (int64_t i0 = 0; i0 < n; i0 += 64)
            for (int b = 0; b < d / 32; b++) {
                double cmax = 0;
                for (int64_t i = i0; i < n && i < i0 + 64; i++) {
                    const uint8_t *blk = Vq + (size_t)(rows ? rows[i] : i) * rb + 34 * b;
                    uint16_t hbits;
                    memcpy(&hbits, blk, 2);
                    cmax = fmax(cmax, p[i] * fp16_to_fp32(hbits));
                }
                for (int64_t i = i0; i < n && i < i0 + 64; i++) {
                    const uint8_t *blk = Vq + (size_t)(rows ? rows[i] : i) * rb + 34 * b;
                    for (int j = 0; j < 32; j++) bound[32 * b + j] += cmax / 510.0 * abs((int8_t)blk[2 + j]);
                }
            }
        for (int j = 0; j < d; j++)
            ok &= fabs((double)o[h * d + j] - o_f32[h * d + j]) <= bound[j] / z * 1.001 + 1e-5 * (1 + fabs(o_f32[h * d + j]));
    }
    free(bound);
    free(p);
    return ok;
}

static void test_kernels(void)
{
    const int ds[] = { 8, 40, 64, 128, 256 };
    const int64_t Ss[] = { 1, 33, 300, 1100 };
    const int gs[] = { 1, 2, 3, 5 };
    const double tol = 2e-5; /* float sums in another order */
    for (size_t a = 0; a < sizeof ds / sizeof *ds; a++)
        for (size_t b = 0; b < sizeof Ss / sizeof *Ss; b++)
            for (size_t c = 0; c < sizeof gs / sizeof *gs; c++) {
                const int d = ds[a], g = gs[c];
                const int64_t S = Ss[b];
                kfix f;
                if (kfix_make(&f, S, d)) {
                    CHECK(0, "out of memory");
                    kfix_free(&f);
                    return;
                }
                const int r = d / 4 > 0 ? d / 4 : 1;
                const int64_t nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
                float *q = malloc(g * d * sizeof(float)), *qs = malloc(g * r * sizeof(float));
                float *s1 = malloc(g * S * sizeof(float)), *s2 = malloc(g * S * sizeof(float));
                float *o1 = malloc(g * d * sizeof(float)), *o2 = malloc(g * d * sizeof(float));
                float *sc1 = malloc(g * nb * sizeof(float)), *sc2 = malloc(g * nb * sizeof(float));
                float *l1 = malloc(S * sizeof(float)), *l2 = malloc(S * sizeof(float));
                int32_t *rows = malloc(S * sizeof(int32_t)), comp[128];
                if (!q || !qs || !s1 || !s2 || !o1 || !o2 || !sc1 || !sc2 || !l1 || !l2 || !rows) {
                    CHECK(0, "out of memory");
                    return;
                }
                for (int i = 0; i < g * d; i++) q[i] = unif();
                for (int i = 0; i < r; i++) comp[i] = (i * 7 + 3) % d;
                for (int h = 0; h < g; h++)
                    for (int i = 0; i < r; i++) qs[h * r + i] = q[h * d + comp[i]];
                const int64_t n_sel = (S + 2) / 3;
                for (int64_t i = 0; i < n_sel; i++) rows[i] = (int32_t)((i * 37 + 5) % S); /* unordered */
                char what[96];
                snprintf(what, sizeof what, "S %lld d %d g %d", (long long)S, d, g);
                /* head sizes that are multiples of 64 take the integer kernels (attn.h):
                 * error bounded against f32 instead of f32 rounding, and the AVX-512
                 * twin's scores bit-identical to the plain-C twin's */
                const int q8i = d % 64 == 0;
                if (q8i) {
                    float *t1 = malloc(g * S * sizeof(float)), *t2 = malloc(g * S * sizeof(float));
                    if (!t1 || !t2) {
                        CHECK(0, "out of memory");
                        return;
                    }
                    attn_scores(&f.q8, q, g, NULL, S, t1);
                    attn_scores_ref(&f.q8, q, g, NULL, S, t2);
                    CHECK(memcmp(t1, t2, g * S * sizeof(float)) == 0, "%s: integer scores, best = ref", what);
                    attn_scores(&f.q8, q, g, rows, n_sel, t1);
                    attn_scores_ref(&f.q8, q, g, rows, n_sel, t2);
                    CHECK(memcmp(t1, t2, g * n_sel * sizeof(float)) == 0, "%s: gathered integer scores, best = ref", what);
                    free(t1);
                    free(t2);
                }
                for (int simd = 0; simd < 2; simd++) {
                    const char *k = simd ? "best" : "ref";
                    /* scores, full and gathered rows */
                    (simd ? attn_scores : attn_scores_ref)(&f.q8, q, g, NULL, S, s1);
                    (simd ? attn_scores : attn_scores_ref)(&f.f32, q, g, NULL, S, s2);
                    if (q8i)
                        CHECK(scores_within(s1, s2, q, g, f.K, d, NULL, S), "%s %s: integer scores within bound", k, what);
                    else
                        CHECK(rel_err(s1, s2, g * S) <= tol, "%s %s: scores %g", k, what, rel_err(s1, s2, g * S));
                    (simd ? attn_scores : attn_scores_ref)(&f.q8, q, g, rows, n_sel, s1);
                    (simd ? attn_scores : attn_scores_ref)(&f.f32, q, g, rows, n_sel, s2);
                    if (q8i)
                        CHECK(scores_within(s1, s2, q, g, f.K, d, rows, n_sel), "%s %s: gathered integer scores", k, what);
                    else
                        CHECK(rel_err(s1, s2, g * n_sel) <= tol, "%s %s: gathered scores", k, what);
                    /* weighted sums */
                    for (int64_t i = 0; i < g * S; i++) s1[i] = unif();
                    (simd ? attn_weighted_sum : attn_weighted_sum_ref)(&f.q8, s1, g, NULL, S, o1);
                    (simd ? attn_weighted_sum : attn_weighted_sum_ref)(&f.f32, s1, g, NULL, S, o2);
                    CHECK(rel_err(o1, o2, g * d) <= tol * 10, "%s %s: weighted sum %g", k, what,
                          rel_err(o1, o2, g * d));
                    (simd ? attn_softmax_weighted_sum : attn_softmax_weighted_sum_ref)(&f.q8, s1, g, rows, n_sel, o1, NULL);
                    (simd ? attn_softmax_weighted_sum : attn_softmax_weighted_sum_ref)(&f.f32, s1, g, rows, n_sel, o2, NULL);
                    if (q8i)
                        CHECK(wsum_within(o1, o2, s1, g, f.Vq, d, rows, n_sel), "%s %s: integer softmax weighted sum", k, what);
                    else
                        CHECK(rel_err(o1, o2, g * d) <= tol, "%s %s: softmax weighted sum", k, what);
                    if (q8i) { /* all rows, peaked weights: one position dominates its chunks */
                        for (int64_t i = 0; i < g * S; i++) s2[i] = 8 * unif();
                        (simd ? attn_softmax_weighted_sum : attn_softmax_weighted_sum_ref)(&f.q8, s2, g, NULL, S, o1, NULL);
                        (simd ? attn_softmax_weighted_sum : attn_softmax_weighted_sum_ref)(&f.f32, s2, g, NULL, S, o2, NULL);
                        CHECK(wsum_within(o1, o2, s2, g, f.Vq, d, NULL, S), "%s %s: integer softmax weighted sum, peaked", k, what);
                    }
                    /* K^T logits and the fused exp */
                    (simd ? attn_kt_logits : attn_kt_logits_ref)(&f.q8, qs, comp, r, g, S, s1);
                    (simd ? attn_kt_logits : attn_kt_logits_ref)(&f.f32, qs, comp, r, g, S, s2);
                    CHECK(rel_err(s1, s2, g * S) <= tol, "%s %s: K^T logits", k, what);
                    (simd ? attn_kt_exp : attn_kt_exp_ref)(&f.q8, qs, comp, r, g, S, s1, sc1, l1);
                    (simd ? attn_kt_exp : attn_kt_exp_ref)(&f.f32, qs, comp, r, g, S, s2, sc2, l2);
                    CHECK(rel_err(s1, s2, g * S) <= tol && rel_err(sc1, sc2, g * nb) <= tol &&
                              rel_err(l1, l2, S) <= tol,
                          "%s %s: K^T exp", k, what);
                    /* gathered group attention (scratch g * n_sel) and dense */
                    (simd ? attn_gather_group : attn_gather_group_ref)(&f.q8, q, g, rows, n_sel, o1, s1, NULL);
                    if (q8i) { /* against f32 weighted sums of the integer scores */
                        (simd ? attn_scores : attn_scores_ref)(&f.q8, q, g, rows, n_sel, s1);
                        attn_softmax_weighted_sum_ref(&f.f32, s1, g, rows, n_sel, o2, NULL);
                        CHECK(wsum_within(o1, o2, s1, g, f.Vq, d, rows, n_sel), "%s %s: integer gather group", k, what);
                    } else {
                        (simd ? attn_gather_group : attn_gather_group_ref)(&f.f32, q, g, rows, n_sel, o2, s2, NULL);
                        CHECK(rel_err(o1, o2, g * d) <= tol, "%s %s: gather group", k, what);
                    }
                }
                attn_dense_group(&f.q8, q, g, o1, s1);
                if (q8i) {
                    attn_scores(&f.q8, q, g, NULL, S, s1);
                    attn_softmax_weighted_sum_ref(&f.f32, s1, g, NULL, S, o2, NULL);
                    CHECK(wsum_within(o1, o2, s1, g, f.Vq, d, NULL, S), "%s: integer dense group", what);
                } else {
                    attn_dense_group(&f.f32, q, g, o2, s2);
                    CHECK(rel_err(o1, o2, g * d) <= tol, "%s: dense group", what);
                }
                free(q); free(qs); free(s1); free(s2); free(o1); free(o2); free(sc1); free(sc2);
                free(l1); free(l2); free(rows);
                kfix_free(&f);
            }
}

static void test_prefill_tiles(void)
{
    const int d = 40, g = 2, n = 45;
    const int64_t pos0 = 30, S = pos0 + n;
    kfix f;
    if (kfix_make(&f, S, d)) {
        CHECK(0, "out of memory");
        kfix_free(&f);
        return;
    }
    float *q = malloc((size_t)n * g * d * sizeof(float)), *o1 = malloc((size_t)n * g * d * sizeof(float)),
          *o2 = malloc((size_t)n * g * d * sizeof(float)), *ml1 = malloc((size_t)n * g * 2 * sizeof(float)),
          *ml2 = malloc((size_t)n * g * 2 * sizeof(float)), *c1 = malloc((S + ATTN_PF_BK) * sizeof(float)),
          *c2 = malloc((S + ATTN_PF_BK) * sizeof(float));
    float *scratch = aligned_alloc(64, (attn_prefill_scratch(d, g) * sizeof(float) + 63) / 64 * 64);
    if (!q || !o1 || !o2 || !ml1 || !ml2 || !c1 || !c2 || !scratch) {
        CHECK(0, "out of memory");
        return;
    }
    for (int i = 0; i < n * g * d; i++) q[i] = unif();
    const int bq = attn_prefill_bq(g);
    for (int simd = 0; simd < 2; simd++) {
        for (int t0 = 0; t0 < n; t0 += bq) {
            const int nt = n - t0 < bq ? n - t0 : bq;
            const attn_pf_rows b1 = attn_pf_rows_packed(pos0, t0, nt, g, d, q, o1);
            const attn_pf_rows b2 = attn_pf_rows_packed(pos0, t0, nt, g, d, q, o2);
            (simd ? attn_prefill_block : attn_prefill_block_ref)(&f.q8, &b1, ml1 + (size_t)t0 * g * 2, scratch);
            (simd ? attn_prefill_block : attn_prefill_block_ref)(&f.f32, &b2, ml2 + (size_t)t0 * g * 2, scratch);
        }
        CHECK(memcmp(o1, o2, (size_t)n * g * d * sizeof(float)) == 0, "prefill block %d: q8 tiles = f32 tiles", simd);
        for (int64_t k0 = 0; k0 < S; k0 += ATTN_PF_BK) {
            const int nk = S - k0 < ATTN_PF_BK ? (int)(S - k0) : ATTN_PF_BK;
            const attn_pf_rows b = attn_pf_rows_packed(pos0, 0, n, g, d, q, NULL);
            (simd ? attn_prefill_colsum : attn_prefill_colsum_ref)(&f.q8, k0, nk, &b, ml1, c1 + k0, scratch);
            (simd ? attn_prefill_colsum : attn_prefill_colsum_ref)(&f.f32, k0, nk, &b, ml2, c2 + k0, scratch);
        }
        CHECK(memcmp(c1, c2, S * sizeof(float)) == 0, "prefill colsum %d: q8 tiles = f32 tiles", simd);
    }
    free(q); free(o1); free(o2); free(ml1); free(ml2); free(c1); free(c2); free(scratch);
    kfix_free(&f);
}

/* ---- the model -------------------------------------------------------------- */

static sparq_context *make_ctx_sel(sparq_model *m, int kv_type, const char *policy, int k, int select_always)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 256;
    cp.kv_type = kv_type;
    cp.n_threads = 2;
    cp.attn = sparq_attn_default_params();
    cp.attn.policy = policy;
    if (k) cp.attn.k = k;
    cp.attn.select_always = select_always;
    sparq_context *c = NULL;
    char err[256];
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) fprintf(stderr, "context: %s\n", err);
    return c;
}

static sparq_context *make_ctx(sparq_model *m, int kv_type, const char *policy, int k)
{
    return make_ctx_sel(m, kv_type, policy, k, 0);
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy: prompt then n tokens into out; returns 0 or -1. */
static int greedy(sparq_context *c, const int32_t *prompt, int np, int n, int32_t *out, float *logits, int V)
{
    if (sparq_eval(c, prompt, np, logits)) return -1;
    for (int i = 0; i < n; i++) {
        out[i] = argmax(logits, V);
        if (i + 1 < n && sparq_eval(c, &out[i], 1, logits)) return -1;
    }
    (void)V;
    return 0;
}

static void test_model(void)
{
    char path[1024], err[512];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        test_skip("stories260K.gguf not found");
        return;
    }
    sparq_model *m = NULL;
    CHECK(sparq_model_load(path, &m, err, sizeof err) == 0, "%s", err);
    if (!m) return;
    const int V = sparq_model_n_vocab(m);
    float *logits = malloc((size_t)V * sizeof(float)), *l2 = malloc((size_t)V * sizeof(float));
    static const char *const prompts[] = { "Once upon a time", "Lily and Tom went to the park",
                                           "The sad dog", "A boy had a cat. One day" };
    enum { NP = 4, NT = 64 };
    int same = 0, total = 0, forced_same = 0;
    for (int p = 0; p < NP; p++) {
        int32_t ids[64], a[NT], b[NT];
        const int np = sparq_tokenize(m, prompts[p], (int)strlen(prompts[p]), 1, ids, 64);
        sparq_context *c16 = make_ctx(m, SPARQ_KV_F16, "dense", 0), *c8 = make_ctx(m, SPARQ_KV_Q8_0, "dense", 0);
        CHECK(np > 0 && c16 && c8, "prompt %d: contexts", p);
        if (np > 0 && c16 && c8) {
            CHECK(greedy(c16, ids, np, NT, a, logits, V) == 0 && greedy(c8, ids, np, NT, b, logits, V) == 0,
                  "generate %d", p);
            for (int i = 0; i < NT; i++) same += a[i] == b[i];
            total += NT;
            /* teacher-forced: the q8_0 cache's greedy choice at every step
             * of the f16 run (one near-tie that flips sends a free run on
             * another story, so its later tokens say little about the KV) */
            sparq_context *cf = make_ctx(m, SPARQ_KV_Q8_0, "dense", 0);
            CHECK(cf && sparq_eval(cf, ids, np, logits) == 0, "forced prefill %d", p);
            for (int i = 0; cf && i < NT; i++) {
                forced_same += argmax(logits, V) == a[i];
                if (i + 1 < NT && sparq_eval(cf, &a[i], 1, logits)) {
                    CHECK(0, "forced step %d", i);
                    break;
                }
            }
            sparq_context_free(cf);
            if (p == 0) { /* 34 bytes per 32 elements: same elements as f16, 1.0625 bytes each */
                sparq_attn_stats s16, s8;
                sparq_context_attn_stats(c16, &s16);
                sparq_context_attn_stats(c8, &s8);
                CHECK(s8.steps == s16.steps && s8.elements == s16.elements && s16.bytes == 2 * s16.elements,
                      "same decode elements (%lld, %lld)", (long long)s8.elements, (long long)s16.elements);
                CHECK(s8.bytes >= s8.elements * 34 / 32 && s8.bytes <= s8.elements * 34 / 32 + s8.steps,
                      "q8_0 bytes %lld for %lld elements", (long long)s8.bytes, (long long)s8.elements);
                printf("q8_0 KV: %lld bytes for %lld elements over %lld steps (f16: %lld)\n", (long long)s8.bytes,
                       (long long)s8.elements, (long long)s8.steps, (long long)s16.bytes);
                /* a q8_0 cache saved to a KV file and loaded back is the
                 * same cache: the next step's logits are bit-identical */
                char tmpl[] = "/tmp/test_kvq8_XXXXXX";
                char *dir = mkdtemp(tmpl);
                if (dir) {
                    char file[256], e[512];
                    snprintf(file, sizeof file, "%s/c.kv", dir);
                    const int rc = sparq_context_save_kv(c8, file, NULL, NULL, 0, e, sizeof e);
                    CHECK(rc == 0, "save q8_0: %s", e);
                    sparq_context_params lp = sparq_context_default_params();
                    lp.kv_type = SPARQ_KV_Q8_0;
                    sparq_context *cl = NULL;
                    if (rc == 0)
                        CHECK(sparq_context_load_kv(m, &lp, file, SPARQ_VERIFY_ALWAYS, &cl, e, sizeof e) == 0,
                              "load q8_0: %s", e);
                    if (cl) {
                        CHECK(sparq_context_pos(cl) == sparq_context_pos(c8), "loaded %lld positions of %lld",
                              (long long)sparq_context_pos(cl), (long long)sparq_context_pos(c8));
                        const int32_t t1 = 1;
                        const int ok = sparq_eval(c8, &t1, 1, logits) == 0 && sparq_eval(cl, &t1, 1, l2) == 0;
                        CHECK(ok && memcmp(logits, l2, (size_t)V * sizeof(float)) == 0,
                              "q8_0 cache from its KV file: identical logits");
                        sparq_context_free(cl);
                    }
                    /* a byte of the file flipped is caught by its checksums */
                    FILE *f = rc == 0 ? fopen(file, "r+b") : NULL;
                    uint64_t k_off = 0; /* header: K's offset at byte 144 */
                    if (f && (fseek(f, 144, SEEK_SET) || fread(&k_off, 8, 1, f) != 1)) k_off = 0;
                    CHECK(k_off >= 8192 && k_off % 4096 == 0, "K section at %llu", (unsigned long long)k_off);
                    if (f && k_off) {
                        fseek(f, (long)k_off + 40, SEEK_SET); /* the second row's codes */
                        const int byte = fgetc(f);
                        fseek(f, (long)k_off + 40, SEEK_SET);
                        fputc(byte ^ 0x20, f);
                        fclose(f);
                        cl = NULL;
                        CHECK(sparq_context_load_kv(m, &lp, file, SPARQ_VERIFY_ALWAYS, &cl, e, sizeof e) != 0 &&
                              strstr(e, "checksum"), "corrupt q8_0 file refused: %s", cl ? "loaded" : e);
                        sparq_context_free(cl);
                    } else if (f) {
                        fclose(f);
                    }
                    unlink(file);
                    rmdir(dir);
                }
            }
        }
        sparq_context_free(c16);
        sparq_context_free(c8);
    }
    const double frac = total ? (double)same / total : 0;
    const double ffrac = total ? (double)forced_same / total : 0;
    printf("greedy stories260K, q8_0 vs f16 KV: free runs %d of %d tokens identical (%.4f), "
           "teacher-forced %d of %d (%.4f)\n", same, total, frac, forced_same, total, ffrac);
    CHECK(total == NP * NT && ffrac >= 0.95, "teacher-forced identical greedy tokens %.4f < 0.95", ffrac);
    /* free runs: the first divergence ends the comparison of a story, so
     * only a floor (2 of the 4 stories run identical for all 64 tokens) */
    CHECK(frac >= 0.5, "free-run identical greedy tokens %.4f < 0.5", frac);

    /* SparQ with k >= S reads every position: dense on the same q8_0 cache,
     * through the dense shortcut and through the selecting path (top-k of
     * all S, gather, alpha); k = 8 through that path is the control */
    for (int run = 0; run < 3; run++) {
        const int k = run < 2 ? 256 : 8, sa = run > 0, equal = run < 2;
        int32_t ids[64];
        const int np = sparq_tokenize(m, prompts[0], (int)strlen(prompts[0]), 1, ids, 64);
        sparq_context *cd = make_ctx(m, SPARQ_KV_Q8_0, "dense", 0), *cs = make_ctx_sel(m, SPARQ_KV_Q8_0, "sparq", k, sa);
        CHECK(cd && cs && np > 0, "contexts dense / sparq");
        if (cd && cs && np > 0) {
            CHECK(sparq_eval(cd, ids, np, logits) == 0 && sparq_eval(cs, ids, np, l2) == 0, "prefill");
            double worst = 0;
            int agree = 1;
            for (int i = 0; i < 40; i++) {
                for (int v = 0; v < V; v++) worst = fmax(worst, fabs(logits[v] - l2[v]));
                int32_t t = argmax(logits, V), t2 = argmax(l2, V);
                agree &= t == t2;
                if (sparq_eval(cd, &t, 1, logits) || sparq_eval(cs, &t, 1, l2)) {
                    CHECK(0, "decode step %d", i);
                    break;
                }
            }
            if (equal)
                CHECK(worst <= 1e-4 && agree, "sparq k >= S%s vs dense on q8_0: max |dlogit| %g",
                      sa ? " (selecting)" : "", worst);
            else
                CHECK(worst > 1e-2, "sparq k = 8 (selecting) vs dense on q8_0: max |dlogit| only %g", worst);
            sparq_attn_stats st;
            sparq_context_attn_stats(cs, &st);
            CHECK(st.steps > 0 && st.bytes > 0, "sparq steps counted");
        }
        sparq_context_free(cd);
        sparq_context_free(cs);
    }
    /* top-k over a q8_0 cache: its indexes are built from the keys
     * dequantized to f32 (exact: f16 keys; sparq: an f32 K^T image); with
     * every component (r = d) the sparq index scores exactly, and recall
     * against the exact top-k of the cache stays high */
    {
        const char *text = "Once upon a time there was a little girl named Lily who loved to play in the park";
        int32_t ids[64];
        const int np = sparq_tokenize(m, text, (int)strlen(text), 1, ids, 64);
        const char *kinds[] = { "exact", "sparq" };
        for (int ki = 0; ki < 2; ki++) {
            sparq_context_params cp = sparq_context_default_params();
            cp.n_ctx = 128;
            cp.kv_type = SPARQ_KV_Q8_0;
            cp.n_threads = 2;
            cp.attn = sparq_attn_default_params();
            cp.attn.policy = "topk";
            cp.attn.index = kinds[ki];
            cp.attn.k = 4;
            cp.attn.r = 8;
            cp.attn.topk_check = 1;
            sparq_context *c = NULL;
            const int rc = sparq_context_create(m, &cp, &c, err, sizeof err);
            CHECK(rc == 0 && np > 8, "topk %s context: %s", kinds[ki], rc ? err : "");
            if (rc) continue;
            int ok = sparq_eval(c, ids, np, logits) == 0;
            for (int i = 0; ok && i < 10; i++) {
                int32_t t = argmax(logits, V);
                ok = sparq_eval(c, &t, 1, logits) == 0 && isfinite(logits[t]);
            }
            CHECK(ok, "topk %s decodes on q8_0: %s", kinds[ki], sparq_context_error(c));
            sparq_attn_stats st;
            sparq_context_attn_stats(c, &st);
            const double recall = st.recall_total ? (double)st.recall_hits / st.recall_total : 0;
            printf("topk %s on q8_0 KV: recall@4 %.3f over %lld\n", kinds[ki], recall, (long long)st.recall_total);
            CHECK(st.recall_total > 0 && recall >= 0.9, "topk %s recall %.3f", kinds[ki], recall);
            sparq_context_free(c);
        }
    }
    free(logits);
    free(l2);
    sparq_model_free(m);
}

int main(void)
{
    test_format();
    test_cache();
    test_shift_rotation(0, 40);
    test_shift_rotation(1, 24); /* partial rotary dims: the rest stay as they are */
    test_kernels();
    test_prefill_tiles();
    test_model();
    return test_summary("test_kvq8");
}
