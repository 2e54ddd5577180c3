/* quant_avx2.c - AVX2 (+FMA, F16C) twins of the reference kernels, for
 * builds that target AVX2 without AVX-512 (e.g. -march=haswell).
 *
 * Bit-identical to quant_ref.c like the AVX-512 set: without VNNI the
 * integer lanes come from vpmaddubsw + vpmaddwd (exact for every valid
 * block: pair sums stay below 2^15), and the float operations follow the
 * reference's order. Types without a kernel here use the reference.
 *
 * Map: helpers | f16/f32 rows and helpers | float dots | 32-element quants
 * | K-quants | activation quantisers | entry points.
 */
#include "tensor/quant_impl.h"

#if defined(QUANT_CAN_AVX2)
#include "tensor/bf16_avx2.h"

#include <immintrin.h>

/* ------------------------------------------------------------- helpers */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static inline float hsum8_ps(__m256 v)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline int hsum8_epi32(__m256i v)
{
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
    return _mm_cvtsi128_si32(t);
}

/* Sum of 4-element products of unsigned a and signed b: lane k covers
 * bytes 4k..4k+3. */
static inline __m256i dot4_u8i8(__m256i a, __m256i b)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

/* Signed w times signed x (x != -128). */
static inline __m256i dot4_i8(__m256i w, __m256i x)
{
    return dot4_u8i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

static inline __m256 lanes_fma(float d, __m256i lanes, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
}

/* ------------------------------------------------ f16/f32 rows and helpers */

void fp16_to_fp32_row_avx2(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = h2f(src[i]);
}

void fp32_to_fp16_row_avx2(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = fp32_to_fp16(src[i]);
}

void axpy_f32_avx2(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(x + i), va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] = fmaf(x[i], a, y[i]);
}

void axpy_f16_avx2(float *y, float a, const uint16_t *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 vx = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vx, va, _mm256_loadu_ps(y + i)));
    }
    for (; i < n; i++) y[i] = fmaf(h2f(x[i]), a, y[i]);
}

/* ---------------------------------------------------------- float dots */

/* F32x64 with each 16-lane accumulator held as two ymm (low, high). */
typedef struct { __m256 lo[4], hi[4]; } acc64;

static inline void acc64_zero(acc64 *a)
{
    for (int j = 0; j < 4; j++) a->lo[j] = a->hi[j] = _mm256_setzero_ps();
}

static inline float acc64_reduce(acc64 *a)
{
    __m256 lo = _mm256_add_ps(_mm256_add_ps(a->lo[0], a->lo[2]), _mm256_add_ps(a->lo[1], a->lo[3]));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(a->hi[0], a->hi[2]), _mm256_add_ps(a->hi[1], a->hi[3]));
    return hsum8_ps(_mm256_add_ps(lo, hi)); /* 16-lane halving: lane i + lane i+8 first */
}

float dot_f32_avx2(const float *a, const float *b, int64_t n)
{
    acc64 acc;
    acc64_zero(&acc);
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++) {
            const float *pa = a + i + 16 * j, *pb = b + i + 16 * j;
            acc.lo[j] = _mm256_fmadd_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb), acc.lo[j]);
            acc.hi[j] = _mm256_fmadd_ps(_mm256_loadu_ps(pa + 8), _mm256_loadu_ps(pb + 8), acc.hi[j]);
        }
    float s = acc64_reduce(&acc);
    int64_t nf = np + ((n - np) & ~(int64_t)7); /* leftovers: see dot_f32_x64 in quant_ref.c */
    for (int64_t i = np; i < nf; i++) {
        float p = a[i] * b[i]; /* a separate statement: never contracted */
        s += p;
    }
    for (int64_t i = nf; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

static inline __m256 load_f16x8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

float dot_f16_f32_avx2(const uint16_t *a, const float *b, int64_t n)
{
    acc64 acc;
    acc64_zero(&acc);
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++) {
            const uint16_t *pa = a + i + 16 * j;
            const float *pb = b + i + 16 * j;
            acc.lo[j] = _mm256_fmadd_ps(load_f16x8(pa), _mm256_loadu_ps(pb), acc.lo[j]);
            acc.hi[j] = _mm256_fmadd_ps(load_f16x8(pa + 8), _mm256_loadu_ps(pb + 8), acc.hi[j]);
        }
    float s = acc64_reduce(&acc);
    for (int64_t i = np; i < n; i++) s = fmaf(h2f(a[i]), b[i], s);
    return s;
}

static float dot_f16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    acc64 acc;
    acc64_zero(&acc);
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int j = 0; j < 4; j++) {
            const uint16_t *pa = a + i + 16 * j, *pb = b + i + 16 * j;
            acc.lo[j] = _mm256_fmadd_ps(load_f16x8(pa), load_f16x8(pb), acc.lo[j]);
            acc.hi[j] = _mm256_fmadd_ps(load_f16x8(pa + 8), load_f16x8(pb + 8), acc.hi[j]);
        }
    double s = acc64_reduce(&acc);
    for (int64_t i = np; i < n; i++) s += (double)(h2f(a[i]) * h2f(b[i]));
    return (float)s;
}

static float dot_bf16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    __m256 c[2][2] = { { _mm256_setzero_ps(), _mm256_setzero_ps() }, { _mm256_setzero_ps(), _mm256_setzero_ps() } };
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int h = 0; h < 2; h++) { /* 16 lanes = pairs 0..7 (lo) and 8..15 (hi) of each 32 */
            c[h][0] = dpbf16x8(c[h][0], a + i + 32 * h, b + i + 32 * h);
            c[h][1] = dpbf16x8(c[h][1], a + i + 32 * h + 16, b + i + 32 * h + 16);
        }
    double s = 0.0;
    s += hsum8_ps(_mm256_add_ps(c[0][0], c[0][1]));
    s += hsum8_ps(_mm256_add_ps(c[1][0], c[1][1]));
    for (; i < n; i++) s += (double)(bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]));
    return (float)s;
}

/* ------------------------------------------------- 32-element quants */

static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

/* 0xFF in byte j when bit j of the 32-bit qh is set. */
static inline __m256i bits_to_bytes(const uint8_t *qh)
{
    uint32_t m;
    memcpy(&m, qh, 4);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m),
                                    _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll, 0x0303030303030303ll));
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

static float dot_q8_0(const blk_q8_0 *w, const blk_q8_0 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++)
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), dot4_i8(load32(w[i].qs), load32(x[i].qs)), acc);
    return hsum8_ps(acc);
}

static float dot_q4_1(const blk_q4_1 *w, const blk_q8_1 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        summs = fmaf(h2f(w[i].m), h2f(x[i].s), summs);
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), dot4_u8i8(nibbles32(w[i].qs), load32(x[i].qs)), acc);
    }
    return hsum8_ps(acc) + summs;
}

static float dot_q5_1(const blk_q5_1 *w, const blk_q8_1 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        summs = fmaf(h2f(w[i].m), h2f(x[i].s), summs);
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_and_si256(bits_to_bytes(w[i].qh), _mm256_set1_epi8(16)));
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), dot4_u8i8(q, load32(x[i].qs)), acc);
    }
    return hsum8_ps(acc) + summs;
}

static float dot_q5_0(const blk_q5_0 *w, const blk_q8_0 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_andnot_si256(bits_to_bytes(w[i].qh), _mm256_set1_epi8((char)0xF0)));
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), dot4_i8(q, load32(x[i].qs)), acc);
    }
    return hsum8_ps(acc);
}

static inline __m256i q4_0_lanes(const blk_q4_0 *w, const blk_q8_0 *x)
{
    return dot4_i8(_mm256_sub_epi8(nibbles32(w->qs), _mm256_set1_epi8(8)), load32(x->qs));
}

static float dot_q4_0(const blk_q4_0 *w, const blk_q8_0 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++)
        acc = fmaf((float)hsum8_epi32(q4_0_lanes(w + i, x + i)), h2f(w[i].d) * h2f(x[i].d), acc);
    return acc;
}

/* IQ4_NL / IQ4_XS: vpshufb looks the nibbles up in the 16-value grid. */
static inline __m256i iq4_lanes(const uint8_t *qs, const int8_t *x)
{
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values));
    return dot4_i8(_mm256_shuffle_epi8(table, nibbles32(qs)), load32(x));
}

static float dot_iq4_nl(const blk_iq4_nl *w, const blk_q8_0 *x, int64_t nb)
{
    float acc = 0.0f;
    for (int64_t i = 0; i < nb; i++)
        acc = fmaf((float)hsum8_epi32(iq4_lanes(w[i].qs, x[i].qs)), h2f(w[i].d) * h2f(x[i].d), acc);
    return acc;
}

static float dot_iq4_xs(const blk_iq4_xs *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i lanes = _mm256_setzero_si256();
        for (int ib = 0; ib < QKK / 32; ib++)
            lanes = _mm256_add_epi32(lanes, _mm256_mullo_epi32(iq4_lanes(w[i].qs + 16 * ib, x[i].qs + 32 * ib),
                                                               _mm256_set1_epi32(quant_iq4xs_scale(&w[i], ib))));
        acc = lanes_fma(h2f(w[i].d) * x[i].d, lanes, acc);
    }
    return hsum8_ps(acc);
}

static void quant_q8_0(const float *x, blk_q8_0 *y, int64_t nb, blk_q8_1 *y1)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += QK) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
        }
        __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        __m256i q[4];
        for (int k = 0; k < 4; k++) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], _mm256_set1_ps(id)));
        /* int32 -> int8 keeping element order (the packs work per 128-bit half) */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        if (y1) {
            int sum = hsum8_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
            y1[i].d = fp32_to_fp16(d);
            y1[i].s = fp32_to_fp16(d * (float)sum);
            _mm256_storeu_si256((__m256i *)y1[i].qs, p);
        } else {
            y[i].d = fp32_to_fp16(d);
            _mm256_storeu_si256((__m256i *)y[i].qs, p);
        }
    }
}

/* ------------------------------------------------------------ K-quants */

/* One 32-element chunk per ymm: lane k = elements 4k..4k+3 (ggml's lanes). */

static inline __m256i scale16_pair(int lo, int hi) /* lanes 0-3 lo, 4-7 hi */
{
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

static inline void k4_unpack(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a[3];
    memcpy(a, s, 12);
    uint32_t v[4] = { a[0] & 0x3f3f3f3fu, (a[2] & 0x0f0f0f0fu) | ((a[0] >> 6) & 0x03030303u) << 4,
                      a[1] & 0x3f3f3f3fu, ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 6) & 0x03030303u) << 4 };
    memcpy(sc, v, 8);
    memcpy(mn, v + 2, 8);
}

static inline int k4_min_sum(const uint8_t mn[8], const int16_t *bsums)
{
    __m128i m = _mm_loadl_epi64((const __m128i *)mn);
    __m256i p = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)), load32(bsums));
    return hsum8_epi32(p);
}

/* lanes of Q4_K / Q5_K (qh NULL for Q4_K) */
static inline __m256i k45_lanes(const uint8_t *qs, const uint8_t *qh, const uint8_t sc[8], const int8_t *q8)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i hb = qh ? load32(qh) : _mm256_setzero_si256(), acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {
        __m256i v = load32(qs + 32 * c);
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (qh) {
            __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b0), b0), _mm256_set1_epi8(16)));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, b1), b1), _mm256_set1_epi8(16)));
        }
        __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load32(q8 + 64 * c)), _mm256_set1_epi16(sc[2 * c]));
        __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load32(q8 + 64 * c + 32)), _mm256_set1_epi16(sc[2 * c + 1]));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
    }
    return acc;
}

static float dot_q4_K(const blk_q4_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        k4_unpack(w[i].scales, sc, mn);
        int isum = hsum8_epi32(k45_lanes(w[i].qs, NULL, sc, x[i].qs));
        int imin = k4_min_sum(mn, x[i].bsums);
        acc = fmaf((float)isum, h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

static float dot_q5_K(const blk_q5_K *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        uint8_t sc[8], mn[8];
        k4_unpack(w[i].scales, sc, mn);
        __m256i lanes = k45_lanes(w[i].qs, w[i].qh, sc, x[i].qs);
        summs = fmaf(-x[i].d * h2f(w[i].dmin), (float)k4_min_sum(mn, x[i].bsums), summs);
        acc = lanes_fma(x[i].d * h2f(w[i].d), lanes, acc);
    }
    return hsum8_ps(acc) + summs;
}

static float dot_q6_K(const blk_q6_K *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < nb; i++) {
        const int8_t *sc = w[i].scales;
        __m256i lanes = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i l0 = load32(w[i].ql + 64 * h), l1 = load32(w[i].ql + 64 * h + 32), H = load32(w[i].qh + 32 * h);
            __m256i q[4] = { /* quarters of the half: 32 elements each */
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(H, m3), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 2), m3), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4), m3), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 6), m3), 4)),
            };
            for (int s = 0; s < 4; s++) {
                int g = 8 * h + 2 * s;
                __m256i p = _mm256_maddubs_epi16(q[s], load32(x[i].qs + 128 * h + 32 * s));
                lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(p, scale16_pair(sc[g], sc[g + 1])));
            }
        }
        __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(load32(x[i].bsums),
                                                           _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc))), 5);
        acc = lanes_fma(x[i].d * h2f(w[i].d), _mm256_sub_epi32(lanes, corr), acc);
    }
    return hsum8_ps(acc);
}

static float dot_q3_K(const blk_q3_K *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    for (int64_t i = 0; i < nb; i++) {
        int sc[16];
        for (int g = 0; g < 16; g++) sc[g] = quant_q3k_scale(w[i].scales, g);
        __m256i hm = load32(w[i].hmask), lanes = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i qs = load32(w[i].qs + 32 * h);
            for (int s = 0; s < 4; s++) {
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), m3);
                __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + s)));
                __m256i neg = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), four);
                __m256i q8 = load32(x[i].qs + 128 * h + 32 * s);
                __m256i d16 = _mm256_sub_epi16(_mm256_maddubs_epi16(lo, q8), _mm256_maddubs_epi16(neg, q8));
                int g = 8 * h + 2 * s;
                lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(d16, scale16_pair(sc[g], sc[g + 1])));
            }
        }
        acc = lanes_fma(x[i].d * h2f(w[i].d), lanes, acc);
    }
    return hsum8_ps(acc);
}

static float dot_q2_K(const blk_q2_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *sc = w[i].scales;
        __m256i lanes = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i qs = load32(w[i].qs + 32 * h);
            for (int s = 0; s < 4; s++) {
                __m256i v = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * s), m3);
                int g = 8 * h + 2 * s;
                __m256i p = _mm256_maddubs_epi16(v, load32(x[i].qs + 128 * h + 32 * s));
                lanes = _mm256_add_epi32(lanes, _mm256_madd_epi16(p, scale16_pair(sc[g] & 0xF, sc[g + 1] & 0xF)));
            }
        }
        __m128i s8 = _mm_loadu_si128((const __m128i *)sc);
        __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(0x0F)));
        int imin = hsum8_epi32(_mm256_madd_epi16(mins, load32(x[i].bsums)));
        acc = fmaf((float)hsum8_epi32(lanes), h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

/* --------------------------------------- Q8_K quantiser, dequantisers */

/* Q8_K as quant_q8_K in quant_ref.c: the scale comes from the first element
 * of largest magnitude, with its sign; nearest-even codes, at most 127. */
static void quant_q8_K(const float *x, blk_q8_K *y, int64_t nb)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += QKK) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < QKK / 8; k++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)));
        __m128 r = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        r = _mm_max_ps(r, _mm_movehl_ps(r, r));
        const float amax = _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max = 0.0f;
        for (int k = 0; k < QKK / 8; k++) {
            const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * k)),
                                                            _mm256_set1_ps(amax), _CMP_EQ_OQ));
            if (eq) {
                max = x[8 * k + __builtin_ctz((unsigned)eq)];
                break;
            }
        }
        const float iscale = -127.f / max;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int k = 0; k < QKK / 16; k++) {
            __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * k), vs));
            __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16 * k + 8), vs));
            q0 = _mm256_min_epi32(q0, _mm256_set1_epi32(127));
            q1 = _mm256_min_epi32(q1, _mm256_set1_epi32(127));
            /* the packs keep lane order within 128 bits: permute back */
            const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8);
            const __m128i b = _mm_packs_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
            _mm_storeu_si128((__m128i *)(void *)(y[i].qs + 16 * k), b);
            y[i].bsums[k] = (int16_t)hsum8_epi32(_mm256_add_epi32(q0, q1));
        }
        y[i].d = 1 / iscale;
    }
}

static void deq_q8_0(const blk_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const __m256 d = _mm256_set1_ps(h2f(b[i].d));
        for (int k = 0; k < QK / 8; k++)
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                          _mm_loadl_epi64((const __m128i *)(const void *)(b[i].qs + 8 * k)))), d));
    }
}

static void deq_q4_0(const blk_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK) {
        const __m256i q = _mm256_sub_epi8(nibbles32(b[i].qs), _mm256_set1_epi8(8));
        const __m256 d = _mm256_set1_ps(h2f(b[i].d));
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        _mm256_storeu_ps(y, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), d));
        _mm256_storeu_ps(y + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), d));
        _mm256_storeu_ps(y + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), d));
        _mm256_storeu_ps(y + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), d));
    }
}

/* -------------------------------------------------------- entry points */

void quant_to_float_avx2(uint32_t type, const void *src, float *dst, int64_t n)
{
    switch (type) {
    case QT_F16:  fp16_to_fp32_row_avx2(src, dst, n); return;
    case QT_Q8_0: deq_q8_0(src, dst, n / QK); return;
    case QT_Q4_0: deq_q4_0(src, dst, n / QK); return;
    default:      quant_to_float_ref(type, src, dst, n); return;
    }
}

int quant_from_float_avx2(uint32_t type, const float *src, void *dst, int64_t n)
{
    switch (type) {
    case QT_F16:
        fp32_to_fp16_row_avx2(src, dst, n);
        return 0;
    case QT_Q8_0:
    case QT_Q8_1:
        if (n % QK != 0) return -1;
        quant_q8_0(src, type == QT_Q8_0 ? dst : NULL, n / QK, type == QT_Q8_1 ? dst : NULL);
        return 0;
    case QT_Q8_K:
        if (n % QKK != 0) return -1;
        quant_q8_K(src, dst, n / QKK);
        return 0;
    default:
        return quant_from_float_ref(type, src, dst, n);
    }
}

float quant_dot_avx2(uint32_t type, const void *w, const void *x, int64_t n)
{
    switch (type) {
    case QT_F32:  return dot_f32_avx2(w, x, n);
    case QT_F16:  return dot_f16(w, x, n);
    case QT_BF16: return dot_bf16(w, x, n);
    case QT_Q8_0: return dot_q8_0(w, x, n / QK);
    case QT_Q4_0: return dot_q4_0(w, x, n / QK);
    case QT_Q4_1: return dot_q4_1(w, x, n / QK);
    case QT_Q5_0: return dot_q5_0(w, x, n / QK);
    case QT_Q5_1: return dot_q5_1(w, x, n / QK);
    case QT_Q2_K: return dot_q2_K(w, x, n / QKK);
    case QT_Q3_K: return dot_q3_K(w, x, n / QKK);
    case QT_Q4_K: return dot_q4_K(w, x, n / QKK);
    case QT_Q5_K: return dot_q5_K(w, x, n / QKK);
    case QT_Q6_K: return dot_q6_K(w, x, n / QKK);
    case QT_IQ4_NL: return dot_iq4_nl(w, x, n / QK);
    case QT_IQ4_XS: return dot_iq4_xs(w, x, n / QKK);
    default:      return quant_dot_ref(type, w, x, n);
    }
}

/* ---------------------------------------------- four rows at a time
 * Decode's matrix-vector products: the token's block and its scale are
 * loaded once for four weight rows, four independent chains keep the FMA
 * latency hidden, and a short software prefetch keeps each of the four
 * row streams ahead. Per row the operations of the one-row kernels above,
 * in their order (so the same floats as the reference). */

static void dot_q8_0_x4(const blk_q8_0 *w0, size_t stride, const blk_q8_0 *x, int64_t nb, float *out)
{
    const blk_q8_0 *w[4];
    for (int r = 0; r < 4; r++) w[r] = (const blk_q8_0 *)((const char *)w0 + r * stride);
    __m256 a[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (int64_t i = 0; i < nb; i++) {
        const __m256i xv = load32(x[i].qs);
        const float dx = h2f(x[i].d);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            _mm_prefetch((const char *)(w[r] + i) + 256, _MM_HINT_T0);
            a[r] = lanes_fma(h2f(w[r][i].d) * dx, dot4_i8(load32(w[r][i].qs), xv), a[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = hsum8_ps(a[r]);
}

/* The four rows' block sums from their lanes by one hadd tree (exact), then
 * each row's fmaf as in dot_q4_0 / dot_iq4_nl. */
static inline void x4_block(__m256i l0, __m256i l1, __m256i l2, __m256i l3, const uint16_t dw[4], float dx,
                            float acc[4])
{
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(l0, l1), _mm256_hadd_epi32(l2, l3));
    const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    float f[4];
    _mm_storeu_ps(f, _mm_cvtepi32_ps(t));
    for (int r = 0; r < 4; r++) acc[r] = fmaf(f[r], h2f(dw[r]) * dx, acc[r]);
}

static void dot_q4_0_x4(const blk_q4_0 *w0, size_t stride, const blk_q8_0 *x, int64_t nb, float *out)
{
    const blk_q4_0 *w[4];
    for (int r = 0; r < 4; r++) w[r] = (const blk_q4_0 *)((const char *)w0 + r * stride);
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int64_t i = 0; i < nb; i++) {
        for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(w[r] + i) + 256, _MM_HINT_T0);
        const uint16_t dw[4] = { w[0][i].d, w[1][i].d, w[2][i].d, w[3][i].d };
        x4_block(q4_0_lanes(w[0] + i, x + i), q4_0_lanes(w[1] + i, x + i), q4_0_lanes(w[2] + i, x + i),
                 q4_0_lanes(w[3] + i, x + i), dw, h2f(x[i].d), acc);
    }
    for (int r = 0; r < 4; r++) out[r] = acc[r];
}

static void dot_iq4_nl_x4(const blk_iq4_nl *w0, size_t stride, const blk_q8_0 *x, int64_t nb, float *out)
{
    const blk_iq4_nl *w[4];
    for (int r = 0; r < 4; r++) w[r] = (const blk_iq4_nl *)((const char *)w0 + r * stride);
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int64_t i = 0; i < nb; i++) {
        for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(w[r] + i) + 256, _MM_HINT_T0);
        const uint16_t dw[4] = { w[0][i].d, w[1][i].d, w[2][i].d, w[3][i].d };
        x4_block(iq4_lanes(w[0][i].qs, x[i].qs), iq4_lanes(w[1][i].qs, x[i].qs), iq4_lanes(w[2][i].qs, x[i].qs),
                 iq4_lanes(w[3][i].qs, x[i].qs), dw, h2f(x[i].d), acc);
    }
    for (int r = 0; r < 4; r++) out[r] = acc[r];
}

void quant_dot_rows_avx2(uint32_t type, const void *w, size_t w_stride, int nr,
                         const void *x, int64_t n, float *out)
{
    const char *wp = w;
    int r = 0;
    if (type == QT_Q8_0)
        for (; r + 4 <= nr; r += 4) dot_q8_0_x4((const blk_q8_0 *)(wp + (size_t)r * w_stride), w_stride, x, n / QK, out + r);
    if (type == QT_Q4_0)
        for (; r + 4 <= nr; r += 4) dot_q4_0_x4((const blk_q4_0 *)(wp + (size_t)r * w_stride), w_stride, x, n / QK, out + r);
    if (type == QT_IQ4_NL)
        for (; r + 4 <= nr; r += 4) dot_iq4_nl_x4((const blk_iq4_nl *)(wp + (size_t)r * w_stride), w_stride, x, n / QK, out + r);
    for (; r < nr; r++) out[r] = quant_dot_avx2(type, wp + (size_t)r * w_stride, x, n);
}

const quant_kernels quant_kernels_avx2 = {
    quant_to_float_avx2, quant_from_float_avx2, quant_dot_avx2, quant_dot_rows_avx2,
    dot_f32_avx2, dot_f16_f32_avx2, axpy_f32_avx2, axpy_f16_avx2,
    fp16_to_fp32_row_avx2, fp32_to_fp16_row_avx2,
};

#endif /* QUANT_CAN_AVX2 */
