/* quant_avx512.c - AVX-512 (F/BW/VL/VNNI, F16C, FMA; BF16 when present)
 * twins of the reference kernels in quant_ref.c.
 *
 * Every kernel here is bit-identical to its reference: integer parts are
 * exact whatever the instruction mix, and the float operations are issued
 * in the reference's order (the accumulation schemes in quant_impl.h).
 * Types without a kernel here fall back to the reference.
 *
 * Map: helpers | f16/f32 rows and helpers | float dots | Q8_0 | 32-element
 * quants (+ Q8_1 quantiser) | K-quants | dequantise | Q8_K quantiser |
 * entry points. quant_dot_rows runs four rows at a time for Q8_0, Q4_0 and
 * IQ4_NL (whose per-block work is small); the K-quants go row by row.
 */
#include "tensor/quant_impl.h"
#include "util/cpu.h"

#if defined(QUANT_CAN_AVX512)

#include <immintrin.h>

/* ------------------------------------------------------------- helpers */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

/* hsum8 / hsum16 of quant_impl.h, with vectors. */
static inline float hsum8_ps(__m256 v)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

static inline float hsum16_ps(__m512 v)
{
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8_ps(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
}

/* Streaming a float row from RAM: the lines ~2 KB ahead are requested
 * (prefetches past the end of a row are harmless hints). The K-quant dots
 * do without: with the weights in huge pages the hardware prefetcher keeps
 * up, and the extra loads cost 5-10% (llama-3.2-1b Q4_K_M decode, 1 and 2
 * threads, alternating runs). */
enum { PREFETCH_AHEAD = 2048 };
static inline void prefetch_ahead(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PREFETCH_AHEAD + o, _MM_HINT_T0);
}

/* Mask with the low n (0..16) bits set. */
static inline __mmask16 mask16(int64_t n) { return (__mmask16)((1u << n) - 1); }

/* ------------------------------------------------ f16/f32 rows and helpers */

void fp16_to_fp32_row_avx512(const uint16_t *src, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        __mmask16 m = mask16(n - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
    }
}

void fp32_to_fp16_row_avx512(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        __mmask16 m = mask16(n - i);
        _mm256_mask_storeu_epi16(dst + i, m,
                                 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, src + i), _MM_FROUND_TO_NEAREST_INT));
    }
}

void axpy_f32_avx512(float *y, float a, const float *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(_mm512_loadu_ps(x + i), va, _mm512_loadu_ps(y + i)));
    if (i < n) {
        __mmask16 m = mask16(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i), va,
                                                         _mm512_maskz_loadu_ps(m, y + i)));
    }
}

void axpy_f16_avx512(float *y, float a, const uint16_t *x, int64_t n)
{
    __m512 va = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 vx = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(x + i)));
        _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vx, va, _mm512_loadu_ps(y + i)));
    }
    if (i < n) {
        __mmask16 m = mask16(n - i);
        __m512 vx = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i));
        _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(vx, va, _mm512_maskz_loadu_ps(m, y + i)));
    }
}

/* ---------------------------------------------------------- float dots */

/* (a0 + a2) + (a1 + a3), then the 16-lane halving sum. */
static inline float reduce4x16(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    a0 = _mm512_add_ps(a0, a2);
    a1 = _mm512_add_ps(a1, a3);
    return hsum16_ps(_mm512_add_ps(a0, a1));
}

float dot_f32_avx512(const float *a, const float *b, int64_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64) {
        prefetch_ahead(a + i, 64 * sizeof(*a));
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    float s = reduce4x16(s0, s1, s2, s3);
    int64_t nf = np + ((n - np) & ~(int64_t)7); /* see dot_f32_x64 */
    for (int64_t i = np; i < nf; i++) {
        float p = a[i] * b[i]; /* a separate statement: never contracted */
        s += p;
    }
    for (int64_t i = nf; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

static inline __m512 load_f16x16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

float dot_f16_f32_avx512(const uint16_t *a, const float *b, int64_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64) {
        s0 = _mm512_fmadd_ps(load_f16x16(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(load_f16x16(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(load_f16x16(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(load_f16x16(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    float s = reduce4x16(s0, s1, s2, s3);
    for (int64_t i = np; i < n; i++) s = fmaf(h2f(a[i]), b[i], s);
    return s;
}

static float dot_f16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64) {
        prefetch_ahead(a + i, 64 * sizeof(*a));
        s0 = _mm512_fmadd_ps(load_f16x16(a + i), load_f16x16(b + i), s0);
        s1 = _mm512_fmadd_ps(load_f16x16(a + i + 16), load_f16x16(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(load_f16x16(a + i + 32), load_f16x16(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(load_f16x16(a + i + 48), load_f16x16(b + i + 48), s3);
    }
    double s = reduce4x16(s0, s1, s2, s3);
    for (int64_t i = np; i < n; i++) s += (double)(h2f(a[i]) * h2f(b[i]));
    return (float)s;
}

#if defined(__AVX512BF16__)
static inline __m512 dpbf16_hw(__m512 c, const uint16_t *a, const uint16_t *b)
{
    return _mm512_dpbf16_ps(c, (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b));
}
#endif

/* Without AVX512-BF16 (AVX-512 CPUs before Zen 4 / Cooper Lake), emulate
 * vdpbf16ps: subnormal inputs read as (signed) zero, odd element first,
 * subnormal results flushed. */
static inline __m512 bf16_daz(__m512i v) /* bf16 in the high half of each lane */
{
    __mmask16 sub = _mm512_testn_epi32_mask(v, _mm512_set1_epi32(0x7f800000));
    return _mm512_castsi512_ps(_mm512_mask_and_epi32(v, sub, v, _mm512_set1_epi32((int)0x80000000u)));
}

static inline __m512 ftz(__m512 v)
{
    __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_abs_ps(v), _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    return _mm512_castsi512_ps(_mm512_mask_and_epi32(_mm512_castps_si512(v), tiny, _mm512_castps_si512(v),
                                                     _mm512_set1_epi32((int)0x80000000u)));
}

static inline __m512 dpbf16_emu(__m512 c, const uint16_t *a, const uint16_t *b)
{
    __m512i va = _mm512_loadu_si512(a), vb = _mm512_loadu_si512(b);
    __m512i hi = _mm512_set1_epi32((int)0xffff0000u);
    __m512 ao = bf16_daz(_mm512_and_si512(va, hi)), bo = bf16_daz(_mm512_and_si512(vb, hi));
    __m512 ae = bf16_daz(_mm512_slli_epi32(va, 16)), be = bf16_daz(_mm512_slli_epi32(vb, 16));
    return ftz(_mm512_fmadd_ps(ae, be, ftz(_mm512_fmadd_ps(ao, bo, c))));
}

/* hw: the CPU has AVX512-BF16 (a constant at each call, so each version
 * is its own loop). */
static inline __attribute__((always_inline)) float dot_bf16_with(const uint16_t *a, const uint16_t *b,
                                                                 int64_t n, const int hw)
{
    __m512 c1 = _mm512_setzero_ps(), c2 = c1;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        prefetch_ahead(a + i, 64 * sizeof(*a));
#if defined(__AVX512BF16__)
        if (hw) {
            c1 = dpbf16_hw(c1, a + i, b + i);
            c2 = dpbf16_hw(c2, a + i + 32, b + i + 32);
            continue;
        }
#endif
        c1 = dpbf16_emu(c1, a + i, b + i);
        c2 = dpbf16_emu(c2, a + i + 32, b + i + 32);
    }
    double s = 0.0;
    s += hsum16_ps(c1);
    s += hsum16_ps(c2);
    for (; i < n; i++) s += (double)(bf16_to_fp32(a[i]) * bf16_to_fp32(b[i]));
    return (float)s;
}

static float dot_bf16(const uint16_t *a, const uint16_t *b, int64_t n)
{
    if (cpu_features_get()->avx512bf16) return dot_bf16_with(a, b, n, 1);
    return dot_bf16_with(a, b, n, 0);
}

/* ---------------------------------------------------------------- Q8_0 */

/* The integer lanes of one 32-element block: lane k = sum of w*x over
 * elements 4k..4k+3. |w| and x*sign(w) make the unsigned x signed operands
 * vpdpbusd wants; exact for any w, and for x != -128 (our quantisers never
 * produce -128). */
static inline __m256i dot32_i8(__m256i w, __m256i x)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
}

static inline __m256i load32(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

static float dot_q8_0(const blk_q8_0 *w, const blk_q8_0 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256 d = _mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot32_i8(load32(w[i].qs), load32(x[i].qs))), acc);
    }
    return hsum8_ps(acc);
}

/* Four rows at a time: x and its scale are loaded once per block. */
static void dot_q8_0_x4(const blk_q8_0 *w0, size_t stride, const blk_q8_0 *x, int64_t nb, float *out)
{
    const blk_q8_0 *w1 = (const blk_q8_0 *)((const char *)w0 + stride);
    const blk_q8_0 *w2 = (const blk_q8_0 *)((const char *)w1 + stride);
    const blk_q8_0 *w3 = (const blk_q8_0 *)((const char *)w2 + stride);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < nb; i++) {
        /* four streams: a short software prefetch keeps each one ahead */
        _mm_prefetch((const char *)(w0 + i) + 256, _MM_HINT_T0);
        _mm_prefetch((const char *)(w1 + i) + 256, _MM_HINT_T0);
        _mm_prefetch((const char *)(w2 + i) + 256, _MM_HINT_T0);
        _mm_prefetch((const char *)(w3 + i) + 256, _MM_HINT_T0);
        __m256i xv = load32(x[i].qs);
        float dx = h2f(x[i].d);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w0[i].d) * dx), _mm256_cvtepi32_ps(dot32_i8(load32(w0[i].qs), xv)), a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w1[i].d) * dx), _mm256_cvtepi32_ps(dot32_i8(load32(w1[i].qs), xv)), a1);
        a2 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w2[i].d) * dx), _mm256_cvtepi32_ps(dot32_i8(load32(w2[i].qs), xv)), a2);
        a3 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w3[i].d) * dx), _mm256_cvtepi32_ps(dot32_i8(load32(w3[i].qs), xv)), a3);
    }
    out[0] = hsum8_ps(a0);
    out[1] = hsum8_ps(a1);
    out[2] = hsum8_ps(a2);
    out[3] = hsum8_ps(a3);
}

/* 127/amax and round-half-even, as quant_q8_0 in quant_ref.c. */
static void quant_q8_0(const float *x, blk_q8_0 *y, int64_t nb)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += QK) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
        float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[i].d = fp32_to_fp16(d);
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
    }
}

static void deq_q8_0(const blk_q8_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK) {
        __m512 d = _mm512_set1_ps(h2f(b[i].d));
        __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b[i].qs));
        __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[i].qs + 16)));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d));
    }
}

/* ------------------------------------------------- 32-element quants */

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high. */
static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i v = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
}

static inline uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Integer lanes of one block as a float vector, scaled into acc. */
static inline __m256 lanes_fma(float d, __m256i lanes, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc);
}

static float dot_q4_1(const blk_q4_1 *w, const blk_q8_1 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        summs = fmaf(h2f(w[i].m), h2f(x[i].s), summs);
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), nibbles32(w[i].qs), load32(x[i].qs));
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), p, acc);
    }
    return hsum8_ps(acc) + summs;
}

static float dot_q5_1(const blk_q5_1 *w, const blk_q8_1 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        summs = fmaf(h2f(w[i].m), h2f(x[i].s), summs);
        __m256i q = _mm256_mask_add_epi8(nibbles32(w[i].qs), (__mmask32)load_u32(w[i].qh), nibbles32(w[i].qs),
                                         _mm256_set1_epi8(16));
        __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, load32(x[i].qs));
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), p, acc);
    }
    return hsum8_ps(acc) + summs;
}

static float dot_q5_0(const blk_q5_0 *w, const blk_q8_0 *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        /* nibble | 0xF0 is nibble - 16 as int8: set where the fifth bit is 0 */
        __m256i q = _mm256_or_si256(nibbles32(w[i].qs), _mm256_maskz_mov_epi8(~(__mmask32)load_u32(w[i].qh),
                                                                              _mm256_set1_epi8((char)0xF0)));
        acc = lanes_fma(h2f(w[i].d) * h2f(x[i].d), dot32_i8(q, load32(x[i].qs)), acc);
    }
    return hsum8_ps(acc);
}

/* Q4_0 (ROW1): whole-block integer sums, four blocks reduced together. */
static inline __m256i q4_0_lanes(const blk_q4_0 *w, const blk_q8_0 *x)
{
    return dot32_i8(_mm256_sub_epi8(nibbles32(w->qs), _mm256_set1_epi8(8)), load32(x->qs));
}

static float dot_q4_0(const blk_q4_0 *w, const blk_q8_0 *x, int64_t nb)
{
    float acc = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m256i s01 = _mm256_hadd_epi32(q4_0_lanes(w + i, x + i), q4_0_lanes(w + i + 1, x + i + 1));
        __m256i s23 = _mm256_hadd_epi32(q4_0_lanes(w + i + 2, x + i + 2), q4_0_lanes(w + i + 3, x + i + 3));
        __m256i s = _mm256_hadd_epi32(s01, s23);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        float f[4];
        _mm_storeu_ps(f, _mm_cvtepi32_ps(t));
        for (int k = 0; k < 4; k++) acc = fmaf(f[k], h2f(w[i + k].d) * h2f(x[i + k].d), acc);
    }
    for (; i < nb; i++) {
        __m256i s = q4_0_lanes(w + i, x + i);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
        acc = fmaf((float)_mm_cvtsi128_si32(t), h2f(w[i].d) * h2f(x[i].d), acc);
    }
    return acc;
}

/* Four rows: the four block sums come out of one reduction and feed four
 * independent fma chains (one chain per block would be latency-bound). */
static void dot_q4_0_x4(const blk_q4_0 *w0, size_t stride, const blk_q8_0 *x, int64_t nb, float *out)
{
    const blk_q4_0 *w[4];
    for (int r = 0; r < 4; r++) w[r] = (const blk_q4_0 *)((const char *)w0 + r * stride);
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int64_t i = 0; i < nb; i++) {
        for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(w[r] + i) + 256, _MM_HINT_T0);
        __m256i s01 = _mm256_hadd_epi32(q4_0_lanes(w[0] + i, x + i), q4_0_lanes(w[1] + i, x + i));
        __m256i s23 = _mm256_hadd_epi32(q4_0_lanes(w[2] + i, x + i), q4_0_lanes(w[3] + i, x + i));
        __m256i s = _mm256_hadd_epi32(s01, s23);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        __m128i dw = _mm_setr_epi16((short)w[0][i].d, (short)w[1][i].d, (short)w[2][i].d, (short)w[3][i].d, 0, 0, 0, 0);
        __m128 d = _mm_mul_ps(_mm_cvtph_ps(dw), _mm_set1_ps(h2f(x[i].d)));
        float f[4], dd[4];
        _mm_storeu_ps(f, _mm_cvtepi32_ps(t));
        _mm_storeu_ps(dd, d);
        for (int r = 0; r < 4; r++) acc[r] = fmaf(f[r], dd[r], acc[r]);
    }
    for (int r = 0; r < 4; r++) out[r] = acc[r];
}

/* IQ4_NL / IQ4_XS: a nibble indexes the 16-value grid; vpshufb looks up
 * 32 at once from the table copied into both 128-bit halves. */
static inline __m256i iq4_table(void)
{
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)quant_iq4nl_values));
}

static inline __m256i iq4_lanes(const uint8_t *qs, const int8_t *x, __m256i table)
{
    return dot32_i8(_mm256_shuffle_epi8(table, nibbles32(qs)), load32(x));
}

/* IQ4_NL (ROW1, as dot_q4_0): whole-block sums, four reduced together. */
static float dot_iq4_nl(const blk_iq4_nl *w, const blk_q8_0 *x, int64_t nb)
{
    const __m256i table = iq4_table();
    float acc = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m256i s01 = _mm256_hadd_epi32(iq4_lanes(w[i].qs, x[i].qs, table), iq4_lanes(w[i + 1].qs, x[i + 1].qs, table));
        __m256i s23 = _mm256_hadd_epi32(iq4_lanes(w[i + 2].qs, x[i + 2].qs, table), iq4_lanes(w[i + 3].qs, x[i + 3].qs, table));
        __m256i s = _mm256_hadd_epi32(s01, s23);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        float f[4];
        _mm_storeu_ps(f, _mm_cvtepi32_ps(t));
        for (int k = 0; k < 4; k++) acc = fmaf(f[k], h2f(w[i + k].d) * h2f(x[i + k].d), acc);
    }
    for (; i < nb; i++) {
        __m256i s = iq4_lanes(w[i].qs, x[i].qs, table);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
        t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
        acc = fmaf((float)_mm_cvtsi128_si32(t), h2f(w[i].d) * h2f(x[i].d), acc);
    }
    return acc;
}

/* Four rows, as dot_q4_0_x4: one reduction gives the four block sums. */
static void dot_iq4_nl_x4(const blk_iq4_nl *w0, size_t stride, const blk_q8_0 *x, int64_t nb, float *out)
{
    const __m256i table = iq4_table();
    const blk_iq4_nl *w[4];
    for (int r = 0; r < 4; r++) w[r] = (const blk_iq4_nl *)((const char *)w0 + r * stride);
    float acc[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
    for (int64_t i = 0; i < nb; i++) {
        for (int r = 0; r < 4; r++) _mm_prefetch((const char *)(w[r] + i) + 256, _MM_HINT_T0);
        __m256i s01 = _mm256_hadd_epi32(iq4_lanes(w[0][i].qs, x[i].qs, table), iq4_lanes(w[1][i].qs, x[i].qs, table));
        __m256i s23 = _mm256_hadd_epi32(iq4_lanes(w[2][i].qs, x[i].qs, table), iq4_lanes(w[3][i].qs, x[i].qs, table));
        __m256i s = _mm256_hadd_epi32(s01, s23);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        __m128i dw = _mm_setr_epi16((short)w[0][i].d, (short)w[1][i].d, (short)w[2][i].d, (short)w[3][i].d, 0, 0, 0, 0);
        __m128 d = _mm_mul_ps(_mm_cvtph_ps(dw), _mm_set1_ps(h2f(x[i].d)));
        float f[4], dd[4];
        _mm_storeu_ps(f, _mm_cvtepi32_ps(t));
        _mm_storeu_ps(dd, d);
        for (int r = 0; r < 4; r++) acc[r] = fmaf(f[r], dd[r], acc[r]);
    }
    for (int r = 0; r < 4; r++) out[r] = acc[r];
}

/* IQ4_XS (LANES8): each sub-block's lanes times its signed scale, summed
 * over the super-block in integers (exact), then one fma per block. */
static float dot_iq4_xs(const blk_iq4_xs *w, const blk_q8_K *x, int64_t nb)
{
    const __m256i table = iq4_table();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        __m256i lanes = _mm256_setzero_si256();
        for (int ib = 0; ib < QKK / 32; ib++) {
            __m256i p = iq4_lanes(w[i].qs + 16 * ib, x[i].qs + 32 * ib, table);
            lanes = _mm256_add_epi32(lanes, _mm256_mullo_epi32(p, _mm256_set1_epi32(quant_iq4xs_scale(&w[i], ib))));
        }
        acc = lanes_fma(h2f(w[i].d) * x[i].d, lanes, acc);
    }
    return hsum8_ps(acc);
}

static void quant_q8_1(const float *x, blk_q8_1 *y, int64_t nb)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += QK) {
        __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
        float d = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        __m512 vid = _mm512_set1_ps(id);
        __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
        __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
        int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        y[i].d = fp32_to_fp16(d);
        y[i].s = fp32_to_fp16(d * (float)sum);
        _mm_storeu_si128((__m128i *)y[i].qs, _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(y[i].qs + 16), _mm512_cvtsepi32_epi8(q1));
    }
}

/* ------------------------------------------------------------ K-quants */

/* The K-quant kernels work on 64 elements per zmm: int32 lane k covers
 * elements 4k..4k+3, so lanes 0-7 and 8-15 are two 32-element chunks and
 * folding them gives ggml's 8 lanes. Quants enter vpmaddubsw unsigned; the
 * 16-bit pair sums are scaled and accumulated by vpdpwssd, with the group
 * scales spread over the lanes by vpermw. */

static inline __m512i bcast32(const uint8_t *p) { return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p)); }
static inline __m512i load64(const void *p) { return _mm512_loadu_si512(p); }

/* 16-bit lane j of quarter q (64 elements) of a super-block: group
 * 4q + 2(j/16) + (j%16)/8 when groups have 16 elements (Q2_K, Q3_K, Q6_K),
 * group 2q + j/16 when they have 32 (Q4_K, Q5_K). */
#define G16(q) 4*q, 4*q, 4*q, 4*q, 4*q, 4*q, 4*q, 4*q, 4*q+1, 4*q+1, 4*q+1, 4*q+1, 4*q+1, 4*q+1, 4*q+1, 4*q+1, \
               4*q+2, 4*q+2, 4*q+2, 4*q+2, 4*q+2, 4*q+2, 4*q+2, 4*q+2, 4*q+3, 4*q+3, 4*q+3, 4*q+3, 4*q+3, 4*q+3, 4*q+3, 4*q+3
#define G32(q) 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, 2*q, \
               2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1, 2*q+1
static const int16_t group16_idx[4][32] __attribute__((aligned(64))) = { { G16(0) }, { G16(1) }, { G16(2) }, { G16(3) } };
static const int16_t group32_idx[4][32] __attribute__((aligned(64))) = { { G32(0) }, { G32(1) }, { G32(2) }, { G32(3) } };
#undef G16
#undef G32

static inline __m512i scales_q16(int q, __m512i s) { return _mm512_permutexvar_epi16(load64(group16_idx[q]), s); }
static inline __m512i scales_q32(int q, __m512i s) { return _mm512_permutexvar_epi16(load64(group32_idx[q]), s); }

/* 16-bit shift counts: a in the low 256 bits, b in the high. */
static inline __m512i shifts16(int a, int b)
{
    return _mm512_inserti64x4(_mm512_set1_epi16((short)a), _mm256_set1_epi16((short)b), 1);
}

/* Bytes: a in the low 256 bits, b in the high. */
static inline __m512i bytes2(int a, int b)
{
    return _mm512_inserti64x4(_mm512_set1_epi8((char)a), _mm256_set1_epi8((char)b), 1);
}

static inline __m256i fold_lanes(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Integer totals of four vectors at once: lane k = sum of the lanes of v_k. */
static inline __m128i hsum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d)
{
    __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    __m512i s = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    __m256i t = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

static inline int hsum_epi32(__m512i v) { return _mm512_reduce_add_epi32(v); }

/* Scales and mins (6 bits each) of the 8 groups of a Q4_K/Q5_K block,
 * as 16-bit lanes: scales in 0..7; mins twice each (lanes 2j, 2j+1) so a
 * vpmaddwd with the 16 bsums gives m_j * (bsums[2j] + bsums[2j+1]). */
static inline void k4_scales(const uint8_t *s, __m512i *scales, __m256i *mins2)
{
    uint32_t a[3];
    memcpy(a, s, 12);
    uint32_t sc_lo = a[0] & 0x3f3f3f3fu, mn_lo = a[1] & 0x3f3f3f3fu;
    uint32_t sc_hi = (a[2] & 0x0f0f0f0fu) | ((a[0] >> 6) & 0x03030303u) << 4;
    uint32_t mn_hi = ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 6) & 0x03030303u) << 4;
    __m128i v = _mm_set_epi32((int)mn_hi, (int)mn_lo, (int)sc_hi, (int)sc_lo); /* sc[0..7] mn[0..7] */
    *scales = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(v));
    __m128i mn = _mm_unpackhi_epi64(v, v);
    *mins2 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
}

static inline __m256i bsums16(const blk_q8_K *x) { return _mm256_loadu_si256((const __m256i *)x->bsums); }

/* Integer lanes of one Q4_K super-block (all groups, scales applied). */
static inline __m512i q4k_lanes(const blk_q4_K *w, const blk_q8_K *x, __m256i *min_lanes)
{
    __m512i scales;
    __m256i mins2;
    k4_scales(w->scales, &scales, &mins2);
    *min_lanes = _mm256_madd_epi16(mins2, bsums16(x));
    const __m512i sh = shifts16(0, 4), m4 = _mm512_set1_epi8(0x0F);
    __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i q = _mm512_and_si512(_mm512_srlv_epi16(bcast32(w->qs + 32 * c), sh), m4);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, load64(x->qs + 64 * c)), scales_q32(c, scales));
    }
    return acc;
}

static inline __m512i q5k_lanes(const blk_q5_K *w, const blk_q8_K *x, __m256i *min_lanes)
{
    __m512i scales;
    __m256i mins2;
    k4_scales(w->scales, &scales, &mins2);
    *min_lanes = _mm256_madd_epi16(mins2, bsums16(x));
    const __m512i sh = shifts16(0, 4), m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    const __m512i hb = bcast32(w->qh);
    __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m512i q = _mm512_and_si512(_mm512_srlv_epi16(bcast32(w->qs + 32 * c), sh), m4);
        __mmask64 hi = _mm512_test_epi8_mask(hb, bytes2(1 << (2 * c), 1 << (2 * c + 1)));
        q = _mm512_mask_add_epi8(q, hi, q, sixteen);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, load64(x->qs + 64 * c)), scales_q32(c, scales));
    }
    return acc;
}

/* ROW1 with the horizontal sums of four super-blocks done together. */
static float dot_q4_K(const blk_q4_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m256i m0, m1, m2, m3;
        __m512i l0 = q4k_lanes(w + i, x + i, &m0), l1 = q4k_lanes(w + i + 1, x + i + 1, &m1);
        __m512i l2 = q4k_lanes(w + i + 2, x + i + 2, &m2), l3 = q4k_lanes(w + i + 3, x + i + 3, &m3);
        float fs[4], fm[4];
        _mm_storeu_ps(fs, _mm_cvtepi32_ps(hsum4_epi32(l0, l1, l2, l3)));
        _mm_storeu_ps(fm, _mm_cvtepi32_ps(hsum4_epi32(_mm512_zextsi256_si512(m0), _mm512_zextsi256_si512(m1),
                                                      _mm512_zextsi256_si512(m2), _mm512_zextsi256_si512(m3))));
        for (int k = 0; k < 4; k++) {
            acc = fmaf(fs[k], h2f(w[i + k].d) * x[i + k].d, acc);
            accm = fmaf(fm[k], h2f(w[i + k].dmin) * x[i + k].d, accm);
        }
    }
    for (; i < nb; i++) {
        __m256i m;
        int isum = hsum_epi32(q4k_lanes(w + i, x + i, &m));
        int imin = hsum_epi32(_mm512_zextsi256_si512(m));
        acc = fmaf((float)isum, h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

static float dot_q5_K(const blk_q5_K *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m256i m[4], l[4];
        for (int k = 0; k < 4; k++) l[k] = fold_lanes(q5k_lanes(w + i + k, x + i + k, &m[k]));
        float fm[4];
        _mm_storeu_ps(fm, _mm_cvtepi32_ps(hsum4_epi32(_mm512_zextsi256_si512(m[0]), _mm512_zextsi256_si512(m[1]),
                                                      _mm512_zextsi256_si512(m[2]), _mm512_zextsi256_si512(m[3]))));
        for (int k = 0; k < 4; k++) {
            summs = fmaf(-x[i + k].d * h2f(w[i + k].dmin), fm[k], summs);
            acc = lanes_fma(x[i + k].d * h2f(w[i + k].d), l[k], acc);
        }
    }
    for (; i < nb; i++) {
        __m256i m;
        __m256i l = fold_lanes(q5k_lanes(w + i, x + i, &m));
        summs = fmaf(-x[i].d * h2f(w[i].dmin), (float)hsum_epi32(_mm512_zextsi256_si512(m)), summs);
        acc = lanes_fma(x[i].d * h2f(w[i].d), l, acc);
    }
    return hsum8_ps(acc) + summs;
}

static float dot_q6_K(const blk_q6_K *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh_a = shifts16(0, 2), sh_b = shifts16(4, 6);
    for (int64_t i = 0; i < nb; i++) {
        __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        __m512i scales = _mm512_zextsi256_si512(s16);
        __m512i lanes = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i L = load64(w[i].ql + 64 * h), H = bcast32(w[i].qh + 32 * h);
            /* elements 0..63 of the half: low nibbles, qh bits 0-1 | 2-3;
             * elements 64..127: high nibbles, qh bits 4-5 | 6-7 */
            __m512i a = _mm512_or_si512(_mm512_and_si512(L, m4),
                                        _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(H, sh_a), 4), m30));
            __m512i b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                        _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(H, sh_b), 4), m30));
            const int8_t *q8 = x[i].qs + 128 * h;
            lanes = _mm512_dpwssd_epi32(lanes, _mm512_maddubs_epi16(a, load64(q8)), scales_q16(2 * h, scales));
            lanes = _mm512_dpwssd_epi32(lanes, _mm512_maddubs_epi16(b, load64(q8 + 64)), scales_q16(2 * h + 1, scales));
        }
        /* the quants entered unsigned: lane k -= 32 * (bsum*scale of groups 2k, 2k+1) */
        __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bsums16(&x[i]), s16), 5);
        acc = lanes_fma(x[i].d * h2f(w[i].d), _mm256_sub_epi32(fold_lanes(lanes), corr), acc);
    }
    return hsum8_ps(acc);
}

/* 16 signed 6-bit scales of a Q3_K block as int8. */
static inline __m128i q3k_scales(const uint8_t *s)
{
    uint32_t a[3];
    memcpy(a, s, 12);
    __m128i v = _mm_set_epi32((int)(((a[1] >> 4) & 0x0f0f0f0fu) | ((a[2] >> 6) & 0x03030303u) << 4),
                              (int)(((a[0] >> 4) & 0x0f0f0f0fu) | ((a[2] >> 4) & 0x03030303u) << 4),
                              (int)((a[1] & 0x0f0f0f0fu) | ((a[2] >> 2) & 0x03030303u) << 4),
                              (int)((a[0] & 0x0f0f0f0fu) | ((a[2] >> 0) & 0x03030303u) << 4));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

static float dot_q3_K(const blk_q3_K *w, const blk_q8_K *x, int64_t nb)
{
    __m256 acc = _mm256_setzero_ps();
    const __m512i m3 = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i sh[2] = { shifts16(0, 2), shifts16(4, 6) };
    for (int64_t i = 0; i < nb; i++) {
        __m512i scales = _mm512_zextsi256_si512(_mm256_cvtepi8_epi16(q3k_scales(w[i].scales)));
        __m512i hm = bcast32(w[i].hmask);
        __m512i lanes = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) { /* quarter q: elements 64q..64q+63 */
            int h = q / 2, p = q % 2, bit = 2 * q;
            __m512i lo = _mm512_and_si512(_mm512_srlv_epi16(bcast32(w[i].qs + 32 * h), sh[p]), m3);
            __mmask64 set = _mm512_test_epi8_mask(hm, bytes2(1 << bit, 1 << (bit + 1)));
            __m512i neg = _mm512_maskz_mov_epi8(~set, four); /* an unset high bit means -4 */
            __m512i q8 = load64(x[i].qs + 64 * q);
            __m512i d16 = _mm512_sub_epi16(_mm512_maddubs_epi16(lo, q8), _mm512_maddubs_epi16(neg, q8));
            lanes = _mm512_dpwssd_epi32(lanes, d16, scales_q16(q, scales));
        }
        acc = lanes_fma(x[i].d * h2f(w[i].d), fold_lanes(lanes), acc);
    }
    return hsum8_ps(acc);
}

static inline __m512i q2k_lanes(const blk_q2_K *w, const blk_q8_K *x, __m256i *min_lanes)
{
    const __m512i m3 = _mm512_set1_epi8(3);
    const __m512i sh[2] = { shifts16(0, 2), shifts16(4, 6) };
    __m128i sc = _mm_loadu_si128((const __m128i *)w->scales);
    __m512i scales = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0x0F))));
    __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(0x0F)));
    *min_lanes = _mm256_madd_epi16(mins, bsums16(x));
    __m512i lanes = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        __m512i v = _mm512_and_si512(_mm512_srlv_epi16(bcast32(w->qs + 32 * (q / 2)), sh[q % 2]), m3);
        lanes = _mm512_dpwssd_epi32(lanes, _mm512_maddubs_epi16(v, load64(x->qs + 64 * q)), scales_q16(q, scales));
    }
    return lanes;
}

static float dot_q2_K(const blk_q2_K *w, const blk_q8_K *x, int64_t nb)
{
    float acc = 0.0f, accm = 0.0f;
    int64_t i = 0;
    for (; i + 4 <= nb; i += 4) {
        __m256i m0, m1, m2, m3;
        __m512i l0 = q2k_lanes(w + i, x + i, &m0), l1 = q2k_lanes(w + i + 1, x + i + 1, &m1);
        __m512i l2 = q2k_lanes(w + i + 2, x + i + 2, &m2), l3 = q2k_lanes(w + i + 3, x + i + 3, &m3);
        float fs[4], fm[4];
        _mm_storeu_ps(fs, _mm_cvtepi32_ps(hsum4_epi32(l0, l1, l2, l3)));
        _mm_storeu_ps(fm, _mm_cvtepi32_ps(hsum4_epi32(_mm512_zextsi256_si512(m0), _mm512_zextsi256_si512(m1),
                                                      _mm512_zextsi256_si512(m2), _mm512_zextsi256_si512(m3))));
        for (int k = 0; k < 4; k++) {
            acc = fmaf(fs[k], h2f(w[i + k].d) * x[i + k].d, acc);
            accm = fmaf(fm[k], h2f(w[i + k].dmin) * x[i + k].d, accm);
        }
    }
    for (; i < nb; i++) {
        __m256i m;
        int isum = hsum_epi32(q2k_lanes(w + i, x + i, &m));
        int imin = hsum_epi32(_mm512_zextsi256_si512(m));
        acc = fmaf((float)isum, h2f(w[i].d) * x[i].d, acc);
        accm = fmaf((float)imin, h2f(w[i].dmin) * x[i].d, accm);
    }
    return acc - accm;
}

/* ---------------------------------------------------------- dequantise */

/* 64 quant bytes (as built for the dot kernels) -> floats, in four pieces of
 * 16 with per-piece scale a and offset b: y = fma(a, q, -b). */
static inline void store64_fms(float *y, __m512i q, const float a[4], const float b[4], int is_signed)
{
    for (int k = 0; k < 4; k++) {
        __m128i q16 = _mm512_extracti32x4_epi32(q, 0);
        switch (k) { /* the extract index must be a constant */
        case 1: q16 = _mm512_extracti32x4_epi32(q, 1); break;
        case 2: q16 = _mm512_extracti32x4_epi32(q, 2); break;
        case 3: q16 = _mm512_extracti32x4_epi32(q, 3); break;
        default: break;
        }
        __m512 f = _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(q16) : _mm512_cvtepu8_epi32(q16));
        _mm512_storeu_ps(y + 16 * k, _mm512_fmsub_ps(_mm512_set1_ps(a[k]), f, _mm512_set1_ps(b[k])));
    }
}

static void deq_q4_0(const blk_q4_0 *b, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += QK) {
        __m256i q = _mm256_sub_epi8(nibbles32(b[i].qs), _mm256_set1_epi8(8));
        __m512 d = _mm512_set1_ps(h2f(b[i].d));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), d));
    }
}

static void deq_q4_K(const blk_q4_K *b, float *y, int64_t nb)
{
    const __m512i sh = shifts16(0, 4), m4 = _mm512_set1_epi8(0x0F);
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        for (int c = 0; c < 4; c++) {
            int sc0, m0, sc1, m1;
            quant_k4_scale_min(b[i].scales, 2 * c, &sc0, &m0);
            quant_k4_scale_min(b[i].scales, 2 * c + 1, &sc1, &m1);
            float a[4] = { d * sc0, d * sc0, d * sc1, d * sc1 }, o[4] = { dmin * m0, dmin * m0, dmin * m1, dmin * m1 };
            __m512i q = _mm512_and_si512(_mm512_srlv_epi16(bcast32(b[i].qs + 32 * c), sh), m4);
            store64_fms(y + 64 * c, q, a, o, 0);
        }
    }
}

static void deq_q5_K(const blk_q5_K *b, float *y, int64_t nb)
{
    const __m512i sh = shifts16(0, 4), m4 = _mm512_set1_epi8(0x0F), sixteen = _mm512_set1_epi8(16);
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d), dmin = h2f(b[i].dmin);
        __m512i hb = bcast32(b[i].qh);
        for (int c = 0; c < 4; c++) {
            int sc0, m0, sc1, m1;
            quant_k4_scale_min(b[i].scales, 2 * c, &sc0, &m0);
            quant_k4_scale_min(b[i].scales, 2 * c + 1, &sc1, &m1);
            float a[4] = { d * sc0, d * sc0, d * sc1, d * sc1 }, o[4] = { dmin * m0, dmin * m0, dmin * m1, dmin * m1 };
            __m512i q = _mm512_and_si512(_mm512_srlv_epi16(bcast32(b[i].qs + 32 * c), sh), m4);
            __mmask64 hi = _mm512_test_epi8_mask(hb, bytes2(1 << (2 * c), 1 << (2 * c + 1)));
            store64_fms(y + 64 * c, _mm512_mask_add_epi8(q, hi, q, sixteen), a, o, 0);
        }
    }
}

static void deq_q6_K(const blk_q6_K *b, float *y, int64_t nb)
{
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30), off = _mm512_set1_epi8(32);
    const __m512i sh_a = shifts16(0, 2), sh_b = shifts16(4, 6);
    const float zero[4] = { 0, 0, 0, 0 };
    for (int64_t i = 0; i < nb; i++, y += QKK) {
        float d = h2f(b[i].d);
        for (int h = 0; h < 2; h++) {
            __m512i L = load64(b[i].ql + 64 * h), H = bcast32(b[i].qh + 32 * h);
            __m512i qa = _mm512_or_si512(_mm512_and_si512(L, m4),
                                         _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(H, sh_a), 4), m30));
            __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4),
                                         _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(H, sh_b), 4), m30));
            const int8_t *sc = b[i].scales + 8 * h;
            float a[4] = { d * sc[0], d * sc[1], d * sc[2], d * sc[3] }, c4[4] = { d * sc[4], d * sc[5], d * sc[6], d * sc[7] };
            /* (d * scale) * q: fmsub with a zero offset is a plain product */
            store64_fms(y + 128 * h, _mm512_sub_epi8(qa, off), a, zero, 1);
            store64_fms(y + 128 * h + 64, _mm512_sub_epi8(qb, off), c4, zero, 1);
        }
    }
}

/* ---------------------------------------------------------- Q8_K quantiser */

/* Q8_K as quant_q8_K in quant_ref.c: the scale comes from the first element
 * of largest magnitude, with its sign. */
static void quant_q8_K(const float *x, blk_q8_K *y, int64_t nb)
{
    const __m512 sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < nb; i++, x += QKK) {
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < 16; k++) m = _mm512_max_ps(m, _mm512_andnot_ps(sign, _mm512_loadu_ps(x + 16 * k)));
        float amax = _mm512_reduce_max_ps(m);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        float max = 0.0f;
        for (int k = 0; k < 16; k++) {
            __mmask16 eq = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + 16 * k)),
                                              _mm512_set1_ps(amax), _CMP_EQ_OQ);
            if (eq) {
                max = x[16 * k + __builtin_ctz(eq)];
                break;
            }
        }
        float iscale = -127.f / max;
        __m512 vs = _mm512_set1_ps(iscale);
        for (int k = 0; k < 16; k++) {
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16 * k), vs));
            q = _mm512_min_epi32(q, _mm512_set1_epi32(127));
            _mm_storeu_si128((__m128i *)(y[i].qs + 16 * k), _mm512_cvtsepi32_epi8(q));
            y[i].bsums[k] = (int16_t)_mm512_reduce_add_epi32(q);
        }
        y[i].d = 1 / iscale;
    }
}

/* -------------------------------------------------------- entry points */

void quant_to_float_avx512(uint32_t type, const void *src, float *dst, int64_t n)
{
    switch (type) {
    case QT_F16:  fp16_to_fp32_row_avx512(src, dst, n); return;
    case QT_Q8_0: deq_q8_0(src, dst, n / QK); return;
    case QT_Q4_0: deq_q4_0(src, dst, n / QK); return;
    case QT_Q4_K: deq_q4_K(src, dst, n / QKK); return;
    case QT_Q5_K: deq_q5_K(src, dst, n / QKK); return;
    case QT_Q6_K: deq_q6_K(src, dst, n / QKK); return;
    default:      quant_to_float_ref(type, src, dst, n); return;
    }
}

int quant_from_float_avx512(uint32_t type, const float *src, void *dst, int64_t n)
{
    switch (type) {
    case QT_F16:
        fp32_to_fp16_row_avx512(src, dst, n);
        return 0;
    case QT_Q8_0:
        if (n % QK != 0) return -1;
        quant_q8_0(src, dst, n / QK);
        return 0;
    case QT_Q8_1:
        if (n % QK != 0) return -1;
        quant_q8_1(src, dst, n / QK);
        return 0;
    case QT_Q8_K:
        if (n % QKK != 0) return -1;
        quant_q8_K(src, dst, n / QKK);
        return 0;
    default:
        return quant_from_float_ref(type, src, dst, n);
    }
}

float quant_dot_avx512(uint32_t type, const void *w, const void *x, int64_t n)
{
    switch (type) {
    case QT_F32:  return dot_f32_avx512(w, x, n);
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

void quant_dot_rows_avx512(uint32_t type, const void *w, size_t w_stride, int nr,
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
    for (; r < nr; r++) out[r] = quant_dot_avx512(type, wp + (size_t)r * w_stride, x, n);
}

const quant_kernels quant_kernels_avx512 = {
    quant_to_float_avx512, quant_from_float_avx512, quant_dot_avx512, quant_dot_rows_avx512,
    dot_f32_avx512, dot_f16_f32_avx512, axpy_f32_avx512, axpy_f16_avx512,
    fp16_to_fp32_row_avx512, fp32_to_fp16_row_avx512,
};

#endif /* QUANT_CAN_AVX512 */
