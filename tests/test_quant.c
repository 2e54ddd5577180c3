/* test_quant.c - element types, (de)quantisation and dot-product kernels.
 *
 * 1. half/bfloat16 conversions against the hardware (F16C, AVX512-BF16).
 * 2. SIMD twins against the _ref kernels over 1, 3, 7, 33 blocks and odd
 *    float lengths. Tolerance: none - the kernels are designed to be
 *    bit-identical (same integer lanes, same float operation order).
 * 3. Dequantisation against naive decoders written here from the byte
 *    layouts (offsets, not quant_impl.h's structs).
 * 4. quant_dot against a double-precision dot of the dequantised operands:
 *    |err| <= 1e-5 * sum|w_i x_i| (float accumulation) .
 * 5. Golden: llama-quantize output in ../shared/golden/llamacpp/models/rand
 *    against the F32 model it was made from (Q4_0 requantises byte-exactly).
 * 6. quant_traits / quant_row_bytes consistency.
 */
#include "tensor/gguf.h"
#include "util/paths.h"
#include "tensor/quant.h"
#include "tensor/quant_impl.h" /* the _ref twins */
#include "util/cpu.h"
#include "test.h"

#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>

/* The instructions themselves, whatever baseline this file is compiled for;
 * called only when util/cpu.h finds them. */
__attribute__((target("f16c"))) static float hw_h2f(unsigned short h) { return _cvtsh_ss(h); }
__attribute__((target("f16c"))) static uint16_t hw_f2h(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
__attribute__((target("avx512bf16,avx512vl"))) static uint16_t hw_f2bf(float f)
{
    __m128bh r = _mm_cvtneps_pbh(_mm_set1_ps(f));
    uint16_t h;
    memcpy(&h, &r, 2);
    return h;
}
#define HAVE_F16C_HW() (cpu_features_get()->f16c)
#define HAVE_BF16_HW() (cpu_features_get()->avx512bf16 && cpu_features_get()->avx512vl)
#else
#define hw_h2f(h) 0.0f
#define hw_f2h(f) 0
#define hw_f2bf(f) 0
#define HAVE_F16C_HW() 0
#define HAVE_BF16_HW() 0
#endif

/* ------------------------------------------------------------ utilities */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static double rng_unif(void) { return (double)(rng_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float rng_normal(void)
{
    double u1 = rng_unif() + 1e-300, u2 = rng_unif();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
static uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static int same_bits(float a, float b) { return f2u(a) == f2u(b); }
static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static void wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

/* Naive half -> float in double arithmetic (IEEE binary16 definition). */
static double half_value(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

/* --------------------------------------------- 1. conversions vs hardware */

/* Half conversions against F16C's vcvtph2ps / vcvtps2ph. */
static void half_vs_hardware(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float hw = hw_h2f((unsigned short)h), sw = fp16_to_fp32((uint16_t)h);
        if (!same_bits(hw, sw)) { if (bad++ < 5) fprintf(stderr, "fp16_to_fp32(0x%04x) = %08x, hw %08x\n", h, f2u(sw), f2u(hw)); }
        double ref = half_value((uint16_t)h);
        if (!isnan(ref) && (double)sw != ref) bad++;
    }
    CHECK(bad == 0, "%d half->float mismatches", bad);

    /* float -> half: every half and its neighbourhood (exact, +-1 ulp, the
     * midpoints = ties, midpoints +- 1 ulp), the overflow and subnormal
     * edges, specials, then random bit patterns */
    bad = 0;
    int n_checked = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float lo = fp16_to_fp32((uint16_t)h), hi = fp16_to_fp32((uint16_t)(h + 1));
        float mid = (float)(((double)lo + (double)hi) / 2); /* exact: a tie */
        float cand[] = { lo, u2f(f2u(lo) + 1), mid, u2f(f2u(mid) - 1), u2f(f2u(mid) + 1) };
        for (int k = 0; k < 5; k++)
            for (int sg = 0; sg < 2; sg++) {
                float f = sg ? -cand[k] : cand[k];
                uint16_t hw = hw_f2h(f), sw = fp32_to_fp16(f);
                n_checked++;
                if (hw != sw && bad++ < 5) fprintf(stderr, "fp32_to_fp16(%a) = %04x, hw %04x\n", (double)f, sw, hw);
            }
    }
    float special[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, u2f(0x7f800001u), u2f(0xffc12345u),
                        65504.0f, 65519.99f, 65520.0f, 1e10f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                        1e-30f, u2f(1), 6.097555e-5f, 6.1035156e-5f };
    for (size_t k = 0; k < sizeof special / sizeof *special; k++) {
        uint16_t hw = hw_f2h(special[k]), sw = fp32_to_fp16(special[k]);
        n_checked++;
        if (hw != sw && bad++ < 5) fprintf(stderr, "fp32_to_fp16(%a) = %04x, hw %04x\n", (double)special[k], sw, hw);
    }
    int n_rand = test_quick() ? 100000 : 2000000;
    for (int k = 0; k < n_rand; k++) {
        float f = u2f((uint32_t)rng_u64());
        uint16_t hw = hw_f2h(f), sw = fp32_to_fp16(f);
        n_checked++;
        if (hw != sw && bad++ < 5) fprintf(stderr, "fp32_to_fp16(%a) = %04x, hw %04x\n", (double)f, sw, hw);
    }
    CHECK(bad == 0, "%d of %d float->half mismatches", bad, n_checked);
}

static void test_half_conversions(void)
{
    if (HAVE_F16C_HW()) half_vs_hardware();
    else test_skip("fp16 vs hardware: CPU without F16C");

    /* bfloat16: exact widening; narrowing is round-to-nearest-even (ggml's
     * rule), compared with vcvtneps2bf16 on normal numbers (the instruction
     * flushes subnormals, ggml does not) */
    for (uint32_t h = 0; h < 65536; h += 7) CHECK(f2u(bf16_to_fp32((uint16_t)h)) == h << 16, "bf16 %04x", h);
    CHECK(fp32_to_bf16(u2f(0x3f808000u)) == 0x3f80, "tie to even (down)");
    CHECK(fp32_to_bf16(u2f(0x3f818000u)) == 0x3f82, "tie to even (up)");
    CHECK(fp32_to_bf16(u2f(0x3f808001u)) == 0x3f81, "above tie");
    CHECK((fp32_to_bf16(NAN) & 0x7fc0) == 0x7fc0, "nan stays nan");
    CHECK(fp32_to_bf16(u2f(0x7f7fffffu)) == 0x7f80, "max float rounds to inf");
    if (HAVE_BF16_HW()) {
        int bbad = 0;
        for (int k = 0; k < 200000; k++) {
            float f = u2f((uint32_t)rng_u64());
            if (isnan(f) || fpclassify(f) == FP_SUBNORMAL) continue;
            if (hw_f2bf(f) != fp32_to_bf16(f)) bbad++;
        }
        CHECK(bbad == 0, "%d float->bf16 mismatches vs vcvtneps2bf16", bbad);
    } else {
        test_skip("bf16 vs hardware: CPU without AVX512-BF16");
    }

    /* the row versions, SIMD vs ref, odd lengths */
    int lens[] = { 1, 3, 15, 16, 17, 33, 100, 1023 };
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        uint16_t h[1023], h2[1023];
        float f[1023], g[1023];
        for (int i = 0; i < n; i++) h[i] = (uint16_t)rng_u64();
        fp16_to_fp32_row(h, f, n);
        fp16_to_fp32_row_ref(h, g, n);
        int ok = 1;
        for (int i = 0; i < n; i++) ok &= same_bits(f[i], g[i]);
        CHECK(ok, "fp16_to_fp32_row n=%d", n);
        for (int i = 0; i < n; i++) f[i] = rng_normal() * 1000.0f;
        fp32_to_fp16_row(f, h, n);
        fp32_to_fp16_row_ref(f, h2, n);
        CHECK(memcmp(h, h2, (size_t)n * 2) == 0, "fp32_to_fp16_row n=%d", n);
    }
}

/* ------------------------------------------- naive decoders (from layouts) */

/* The IQ4_NL/IQ4_XS value grid (ggml's kvalues_iq4nl, 16 int8 values). */
static const int iq4_grid[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

/* Decodes block `b` of `type` into y[block_size] in double. Written from the
 * documented byte layouts (ggml's block_* structs), independently of
 * quant_ref.c. Returns 0 if the type is not covered. */
static int naive_decode(int type, const uint8_t *b, double *y)
{
    switch (type) {
    case QT_Q8_0: { /* d(2) qs[32] */
        double d = half_value(rd16(b));
        for (int j = 0; j < 32; j++) y[j] = d * (int8_t)b[2 + j];
        return 1;
    }
    case QT_Q8_1: { /* d(2) s(2) qs[32] */
        double d = half_value(rd16(b));
        for (int j = 0; j < 32; j++) y[j] = d * (int8_t)b[4 + j];
        return 1;
    }
    case QT_Q4_0: { /* d(2) qs[16]: byte j = elem j (low nibble), elem j+16 (high) */
        double d = half_value(rd16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = d * ((b[2 + j] & 15) - 8);
            y[j + 16] = d * ((b[2 + j] >> 4) - 8);
        }
        return 1;
    }
    case QT_Q4_1: { /* d(2) m(2) qs[16] */
        double d = half_value(rd16(b)), m = half_value(rd16(b + 2));
        for (int j = 0; j < 16; j++) {
            y[j] = d * (b[4 + j] & 15) + m;
            y[j + 16] = d * (b[4 + j] >> 4) + m;
        }
        return 1;
    }
    case QT_Q5_0:   /* d(2) qh(4, LE u32: bit j = 5th bit of elem j) qs[16] */
    case QT_Q5_1: { /* d(2) m(2) qh(4) qs[16] */
        int o = type == QT_Q5_0 ? 2 : 4;
        double d = half_value(rd16(b)), m = type == QT_Q5_1 ? half_value(rd16(b + 2)) : 0.0;
        uint32_t qh = (uint32_t)b[o] | (uint32_t)b[o + 1] << 8 | (uint32_t)b[o + 2] << 16 | (uint32_t)b[o + 3] << 24;
        for (int j = 0; j < 32; j++) {
            int lo = j < 16 ? (b[o + 4 + j] & 15) : (b[o + 4 + j - 16] >> 4);
            int q = lo + 16 * (int)((qh >> j) & 1);
            y[j] = type == QT_Q5_0 ? d * (q - 16) : d * q + m;
        }
        return 1;
    }
    case QT_Q2_K: { /* scales[16] (lo nibble scale, hi nibble min) qs[64] d(2) dmin(2) */
        double d = half_value(rd16(b + 80)), dmin = half_value(rd16(b + 82));
        for (int e = 0; e < 256; e++) {
            /* 128-element halves; in a half, byte l (0..31) holds elems l, l+32, l+64, l+96 at bits 0,2,4,6 */
            int half = e / 128, r = e % 128;
            int q = (b[16 + 32 * half + r % 32] >> (2 * (r / 32))) & 3;
            int sc = b[e / 16];
            y[e] = d * (sc & 15) * q - dmin * (sc >> 4);
        }
        return 1;
    }
    case QT_Q3_K: { /* hmask[32] qs[64] scales[12] d(2) */
        double d = half_value(rd16(b + 108));
        const uint8_t *sc = b + 96;
        for (int e = 0; e < 256; e++) {
            int g = e / 16;
            /* 6-bit scales: low 4 bits of scale g in byte g%8 (low nibble for g<8, high for g>=8);
             * high 2 bits in byte 8 + g%4 at bit 2*(g/4) */
            int lo4 = (sc[g % 8] >> (4 * (g / 8))) & 15;
            int hi2 = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
            int s = (lo4 | hi2 << 4) - 32;
            int half = e / 128, r = e % 128;
            int q = (b[32 + 32 * half + r % 32] >> (2 * (r / 32))) & 3;
            int hbit = (b[e % 32] >> (e / 32)) & 1; /* hmask: elem e is byte e%32 bit e/32 */
            y[e] = d * s * (q - (hbit ? 0 : 4));
        }
        return 1;
    }
    case QT_Q4_K:   /* d(2) dmin(2) scales[12] qs[128] */
    case QT_Q5_K: { /* d(2) dmin(2) scales[12] qh[32] qs[128] */
        double d = half_value(rd16(b)), dmin = half_value(rd16(b + 2));
        const uint8_t *sc = b + 4, *qs = b + (type == QT_Q4_K ? 16 : 48), *qh = b + 16;
        for (int e = 0; e < 256; e++) {
            int j = e / 32, s, m;
            /* 8 six-bit scales and mins: j<4 in the low 6 bits of bytes j and j+4;
             * j>=4: low 4 bits in byte j+4 (scale: low nibble, min: high nibble),
             * high 2 bits in the top bits of bytes j-4 (scale) and j (min) */
            if (j < 4) {
                s = sc[j] & 63;
                m = sc[j + 4] & 63;
            } else {
                s = (sc[j + 4] & 15) | (sc[j - 4] >> 6) << 4;
                m = (sc[j + 4] >> 4) | (sc[j] >> 6) << 4;
            }
            /* 64-element chunks of 32 bytes: low nibbles first 32, high nibbles next 32 */
            int q = (qs[32 * (e / 64) + e % 32] >> (4 * ((e % 64) / 32))) & 15;
            if (type == QT_Q5_K) q += 16 * ((qh[e % 32] >> (e / 32)) & 1);
            y[e] = d * s * q - dmin * m;
        }
        return 1;
    }
    case QT_Q6_K: { /* ql[128] qh[64] scales[16] (int8) d(2) */
        double d = half_value(rd16(b + 208));
        for (int e = 0; e < 256; e++) {
            /* per 128-element half: ql bytes 0..31 low nibble = elems 0..31,
             * ql 32..63 low = 32..63, ql 0..31 high = 64..95, ql 32..63 high = 96..127;
             * qh byte l carries bits 4,5 of elems l, l+32, l+64, l+96 at bits 0,2,4,6 */
            int half = e / 128, r = e % 128, l = r % 32, quarter = r / 32;
            const uint8_t *ql = b + 64 * half, *qh = b + 128 + 32 * half;
            int lo = (ql[l + 32 * (quarter % 2)] >> (4 * (quarter / 2))) & 15;
            int hi = (qh[l] >> (2 * quarter)) & 3;
            y[e] = d * (int8_t)b[192 + e / 16] * ((lo | hi << 4) - 32);
        }
        return 1;
    }
    case QT_IQ4_NL: { /* d(2) qs[16]: as Q4_0, but a nibble indexes the IQ4 grid */
        double d = half_value(rd16(b));
        for (int j = 0; j < 16; j++) {
            y[j] = d * iq4_grid[b[2 + j] & 15];
            y[j + 16] = d * iq4_grid[b[2 + j] >> 4];
        }
        return 1;
    }
    case QT_IQ4_XS: { /* d(2) scales_h(2) scales_l[4] qs[128]: 8 sub-blocks of 32 */
        double d = half_value(rd16(b));
        unsigned sh = rd16(b + 2);
        for (int ib = 0; ib < 8; ib++) {
            /* 6-bit scale: low 4 bits in nibble ib%2 of scales_l[ib/2], high 2 bits at bit 2*ib of scales_h */
            int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (int)((sh >> (2 * ib)) & 3) << 4;
            const uint8_t *qs = b + 8 + 16 * ib; /* like one IQ4_NL block */
            for (int j = 0; j < 16; j++) {
                y[32 * ib + j] = d * (ls - 32) * iq4_grid[qs[j] & 15];
                y[32 * ib + 16 + j] = d * (ls - 32) * iq4_grid[qs[j] >> 4];
            }
        }
        return 1;
    }
    case QT_Q8_K: { /* d(f32) qs[256] bsums[16] */
        float d;
        memcpy(&d, b, 4);
        for (int e = 0; e < 256; e++) y[e] = (double)d * (int8_t)b[4 + e];
        return 1;
    }
    default:
        return 0;
    }
}

/* ------------------------------------------------------ random blocks */

static const int weight_types[] = { QT_F32, QT_F16, QT_BF16, QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1,
                                    QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_NL, QT_IQ4_XS };
#define N_WEIGHT_TYPES ((int)(sizeof weight_types / sizeof *weight_types))

static uint16_t rand_scale16(float lo, float hi) { return fp32_to_fp16(lo + (hi - lo) * (float)rng_unif()); }

/* A row of random but valid weights of `type`: random quant bytes, sane
 * positive f16 scales (so every bit pattern of the quants is exercised). */
static void random_row(int type, uint8_t *row, int64_t n)
{
    const quant_traits *t = quant_traits_of(type);
    size_t bytes;
    quant_row_bytes(type, n, &bytes);
    if (type == QT_F32 || type == QT_F16 || type == QT_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = 0.05f * rng_normal();
            if (type == QT_F32) memcpy(row + 4 * i, &v, 4);
            else wr16(row + 2 * i, type == QT_F16 ? fp32_to_fp16(v) : fp32_to_bf16(v));
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)rng_u64();
    for (int64_t b = 0; b < n / t->block_size; b++) {
        uint8_t *p = row + b * t->block_bytes;
        switch (type) {
        case QT_Q8_0: case QT_Q4_0: case QT_Q5_0: case QT_IQ4_NL: wr16(p, rand_scale16(1e-3f, 1e-2f)); break;
        case QT_IQ4_XS: wr16(p, rand_scale16(1e-4f, 1e-3f)); break;
        case QT_Q4_1: case QT_Q5_1: wr16(p, rand_scale16(1e-3f, 1e-2f)); wr16(p + 2, rand_scale16(-0.1f, 0.0f)); break;
        case QT_Q2_K: wr16(p + 80, rand_scale16(1e-3f, 1e-2f)); wr16(p + 82, rand_scale16(1e-3f, 1e-2f)); break;
        case QT_Q3_K: wr16(p + 108, rand_scale16(1e-4f, 1e-3f)); break;
        case QT_Q4_K: case QT_Q5_K: wr16(p, rand_scale16(1e-4f, 1e-3f)); wr16(p + 2, rand_scale16(1e-4f, 1e-3f)); break;
        case QT_Q6_K: wr16(p + 208, rand_scale16(1e-5f, 1e-4f)); break;
        default: break;
        }
    }
}

static void random_floats(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) x[i] = scale * rng_normal() * (i % 11 == 0 ? 4.0f : 1.0f);
}

/* ------------------------------------------------ 2. SIMD vs reference */

static void test_simd_vs_ref(void)
{
    printf("kernels: %s\n", quant_simd_name());
    int counts[] = { 1, 3, 7, 33 };
    for (int ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        int type = weight_types[ti];
        const quant_traits *t = quant_traits_of(type);
        int vdt = t->vec_dot_type;
        for (int ci = 0; ci < 4; ci++) {
            /* float types: odd lengths around the 64-element step */
            int64_t n = t->block_size == 1 ? (int64_t[]){ 1, 63, 129, 1000 }[ci] : counts[ci] * t->block_size;
            enum { NR = 9 };
            size_t rb, xb;
            quant_row_bytes(type, n, &rb);
            quant_row_bytes(vdt, n, &xb);
            size_t stride = rb + 40; /* rows not packed: dot_rows must honour the stride */
            uint8_t *w = malloc(stride * NR), *xq = malloc(xb), *xq2 = malloc(xb);
            float *xf = malloc(sizeof(float) * n), *d1 = malloc(sizeof(float) * n), *d2 = malloc(sizeof(float) * n);
            for (int r = 0; r < NR; r++) random_row(type, w + r * stride, n);
            random_floats(xf, n, 1.0f);

            quant_to_float(type, w, d1, n);
            quant_to_float_ref(type, w, d2, n);
            int ok = 1;
            for (int64_t i = 0; i < n; i++) ok &= same_bits(d1[i], d2[i]);
            CHECK(ok, "%s to_float SIMD == ref, n=%lld", t->name, (long long)n);

            CHECK(quant_from_float(vdt, xf, xq, n) == 0, "%s from_float", quant_traits_of(vdt)->name);
            CHECK(quant_from_float_ref(vdt, xf, xq2, n) == 0, "%s from_float_ref", quant_traits_of(vdt)->name);
            CHECK(memcmp(xq, xq2, xb) == 0, "%s from_float SIMD == ref, n=%lld", quant_traits_of(vdt)->name, (long long)n);

            float o1[NR], o2[NR];
            quant_dot_rows(type, w, stride, NR, xq, n, o1);
            quant_dot_rows_ref(type, w, stride, NR, xq, n, o2);
            ok = 1;
            for (int r = 0; r < NR; r++) {
                ok &= same_bits(o1[r], o2[r]);
                ok &= same_bits(quant_dot(type, w + r * stride, xq, n), o2[r]);
                ok &= same_bits(quant_dot_ref(type, w + r * stride, xq, n), o2[r]);
            }
            CHECK(ok, "%s dot SIMD == ref (rows and single), n=%lld", t->name, (long long)n);
            free(w); free(xq); free(xq2); free(xf); free(d1); free(d2);
        }
    }
    /* bf16 edge cases: subnormal inputs (vdpbf16ps reads them as zero),
     * products that underflow (results flushed), signed zeros */
    {
        enum { NB = 200 };
        uint16_t a[NB], b[NB];
        for (int rep = 0; rep < 50; rep++) {
            for (int i = 0; i < NB; i++) {
                uint32_t r = (uint32_t)rng_u64();
                switch (r % 5) {
                case 0: a[i] = (uint16_t)(r >> 16 & 0x807f); break;              /* subnormal or zero */
                case 1: a[i] = fp32_to_bf16((r & 8 ? -1e-20f : 1e-20f) * (1 + (float)(r >> 20) / 4096)); break;
                case 2: a[i] = 0x8000; break;                                    /* -0 */
                default: a[i] = fp32_to_bf16(rng_normal()); break;
                }
                b[i] = (r >> 3) % 3 == 0 ? fp32_to_bf16(1e-20f * (1 + rng_normal() * 0.1f)) : fp32_to_bf16(rng_normal());
            }
            int n = 64 + rep % 3 * 64 + rep % 7; /* 1-3 steps of 64 plus leftovers */
            CHECK(same_bits(quant_dot(QT_BF16, a, b, n), quant_dot_ref(QT_BF16, a, b, n)), "bf16 edge cases rep %d", rep);
        }
    }
    /* F32 leftovers (n % 64) follow GCC's code for ggml: whole groups of 8
     * as rounded products added in order, the last n % 8 fused. The pair
     * below tells the two apart: (1+2^-12)^2 rounds to 1+2^-11, so adding
     * its negation gives 0 unfused but -2^-24 fused. */
    {
        float a[16], b[16];
        for (int i = 0; i < 16; i++) a[i] = b[i] = 0.0f;
        a[0] = b[0] = a[1] = 1.0f + 0x1p-12f;
        b[1] = -(1.0f + 0x1p-12f);
        CHECK(dot_f32(a, b, 8) == 0.0f && dot_f32_ref(a, b, 8) == 0.0f, "F32 leftover group of 8 unfused");
        CHECK(dot_f32(a, b, 7) == -0x1p-24f && dot_f32_ref(a, b, 7) == -0x1p-24f, "F32 last leftovers fused");
        volatile float p0 = a[0] * b[0];
        CHECK(p0 == 1.0f + 0x1p-11f, "the test's premise");
    }
    /* weight quantisers with SIMD twins (or not): identical bytes */
    int wq[] = { QT_Q4_0, QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_F16, QT_BF16 };
    for (size_t k = 0; k < sizeof wq / sizeof *wq; k++) {
        int64_t n = 33 * 256;
        size_t rb;
        quant_row_bytes(wq[k], n, &rb);
        float *x = malloc(sizeof(float) * n);
        uint8_t *a = malloc(rb), *b = malloc(rb);
        random_floats(x, n, 0.05f);
        CHECK(quant_from_float(wq[k], x, a, n) == 0 && quant_from_float_ref(wq[k], x, b, n) == 0 &&
              memcmp(a, b, rb) == 0, "%s weight quantiser SIMD == ref", quant_traits_of(wq[k])->name);
        free(x); free(a); free(b);
    }
    /* the f32/f16 helpers */
    int lens[] = { 1, 7, 63, 64, 65, 200, 1001 };
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        int n = lens[li];
        float a[1001], b[1001], y1[1001], y2[1001];
        uint16_t h[1001];
        random_floats(a, n, 1.0f);
        random_floats(b, n, 1.0f);
        for (int i = 0; i < n; i++) h[i] = fp32_to_fp16(a[i]);
        CHECK(same_bits(dot_f32(a, b, n), dot_f32_ref(a, b, n)), "dot_f32 n=%d", n);
        CHECK(same_bits(dot_f32(a, b, n), quant_dot_ref(QT_F32, a, b, n)), "dot_f32 is quant_dot F32, n=%d", n);
        CHECK(same_bits(dot_f16_f32(h, b, n), dot_f16_f32_ref(h, b, n)), "dot_f16_f32 n=%d", n);
        double s = 0, sa = 0;
        for (int i = 0; i < n; i++) { s += (double)fp16_to_fp32(h[i]) * b[i]; sa += fabs((double)fp16_to_fp32(h[i]) * b[i]); }
        CHECK(fabs(dot_f16_f32(h, b, n) - s) <= 1e-6 * sa + 1e-30, "dot_f16_f32 value n=%d", n);
        memcpy(y1, b, sizeof(float) * n);
        memcpy(y2, b, sizeof(float) * n);
        axpy_f32(y1, 0.37f, a, n);
        axpy_f32_ref(y2, 0.37f, a, n);
        int ok = memcmp(y1, y2, sizeof(float) * n) == 0;
        for (int i = 0; i < n; i++) ok &= fabsf(y2[i] - (b[i] + 0.37f * a[i])) <= 1e-6f * (fabsf(b[i]) + fabsf(a[i]));
        CHECK(ok, "axpy_f32 n=%d", n);
        axpy_f16(y1, -1.5f, h, n);
        axpy_f16_ref(y2, -1.5f, h, n);
        CHECK(memcmp(y1, y2, sizeof(float) * n) == 0, "axpy_f16 n=%d", n);
    }
}

/* ------------------------------- 3 + 4. naive decode and dot values */

static void test_values(void)
{
    int types[] = { QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K,
                    QT_IQ4_NL, QT_IQ4_XS };
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        int type = types[ti];
        const quant_traits *t = quant_traits_of(type);
        int64_t n = 7 * 256;
        size_t rb, xb;
        quant_row_bytes(type, n, &rb);
        quant_row_bytes(t->vec_dot_type, n, &xb);
        uint8_t *w = malloc(rb), *xq = malloc(xb);
        float *y = malloc(sizeof(float) * n), *xf = malloc(sizeof(float) * n), *xd = malloc(sizeof(float) * n);
        double *ref = malloc(sizeof(double) * n);
        for (int rep = 0; rep < 4; rep++) {
            random_row(type, w, n);
            quant_to_float_ref(type, w, y, n);
            double maxerr = 0, maxv = 0;
            for (int64_t b = 0; b < n / t->block_size; b++) naive_decode(type, w + b * t->block_bytes, ref + b * t->block_size);
            for (int64_t i = 0; i < n; i++) {
                maxerr = fmax(maxerr, fabs(y[i] - ref[i]));
                maxv = fmax(maxv, fabs(ref[i]));
            }
            /* float evaluation of d*s*q - dmin*m: a few ulps of the largest term */
            CHECK(maxerr <= 4e-7 * maxv, "%s dequant vs naive decoder: max err %g (max |v| %g)", t->name, maxerr, maxv);

            random_floats(xf, n, 1.0f);
            quant_from_float(t->vec_dot_type, xf, xq, n);
            quant_to_float_ref(t->vec_dot_type, xq, xd, n);
            double s = 0, sa = 0;
            if (type == QT_Q4_1 || type == QT_Q5_1) {
                /* sum((d q + m) x) = d sum(q x) + m sum(x), and Q8_1 carries
                 * sum(x) as its f16 field s */
                for (int64_t b = 0; b < n / 32; b++) {
                    double m = half_value(rd16(w + b * t->block_bytes + 2)), sx = half_value(rd16(xq + b * 36 + 2));
                    for (int64_t i = 32 * b; i < 32 * b + 32; i++) {
                        s += ((double)y[i] - m) * xd[i];
                        sa += fabs(((double)y[i] - m) * xd[i]);
                    }
                    s += m * sx;
                    sa += fabs(m * sx);
                }
            } else {
                for (int64_t i = 0; i < n; i++) { s += (double)y[i] * xd[i]; sa += fabs((double)y[i] * xd[i]); }
            }
            float got = quant_dot(type, w, xq, n);
            CHECK(fabs(got - s) <= 1e-5 * sa, "%s dot %.9g vs dequantised %.9g (sum|.| %g)", t->name, got, s, sa);
        }
        free(w); free(xq); free(y); free(xf); free(xd); free(ref);
    }

    /* activation quantisers: values and invariants */
    int64_t n = 33 * 256;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    random_floats(x, n, 2.0f);
    for (int k = 0; k < 64; k++) x[k] = 0.0f; /* an all-zero Q8_0 block, and a zero stretch in Q8_K */
    uint8_t *q = malloc(292 * 33);
    double ref[256];
    /* Q8_0 / Q8_1: d = fp16(amax/127), |q*d - x| <= d/2 (+ d's f16 rounding) */
    int akind[] = { QT_Q8_0, QT_Q8_1 };
    for (int k = 0; k < 2; k++) {
        const quant_traits *t = quant_traits_of(akind[k]);
        quant_from_float(akind[k], x, q, n);
        int ok = 1;
        for (int64_t b = 0; b < n / 32; b++) {
            const uint8_t *p = q + b * t->block_bytes;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
            ok &= rd16(p) == fp32_to_fp16(amax / 127.f);
            naive_decode(akind[k], p, ref);
            double d = half_value(rd16(p));
            int sum = 0;
            for (int j = 0; j < 32; j++) {
                ok &= fabs(ref[j] - x[32 * b + j]) <= 0.5 * d + 1e-3 * amax;
                sum += (int8_t)p[(akind[k] == QT_Q8_0 ? 2 : 4) + j];
            }
            if (akind[k] == QT_Q8_1) ok &= rd16(p + 2) == fp32_to_fp16(amax / 127.f * (float)sum);
        }
        CHECK(ok, "%s activation quantiser values", t->name);
    }
    /* Q8_K: bsums are the group sums, |d*q - x| <= |d|/2 */
    quant_from_float(QT_Q8_K, x, q, n);
    int ok = 1;
    for (int64_t b = 0; b < n / 256; b++) {
        const uint8_t *p = q + b * 292;
        naive_decode(QT_Q8_K, p, ref);
        float d;
        memcpy(&d, p, 4);
        float amax = 0;
        for (int j = 0; j < 256; j++) amax = fmaxf(amax, fabsf(x[256 * b + j]));
        ok &= fabsf(fabsf(d) * 127.f - amax) <= 1e-6f * amax;
        for (int j = 0; j < 256; j++) ok &= fabs(ref[j] - x[256 * b + j]) <= 0.5 * fabs(d) * 1.0001;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += (int8_t)p[4 + 16 * g + j];
            ok &= (int16_t)rd16(p + 260 + 2 * g) == s;
        }
    }
    CHECK(ok, "Q8_K activation quantiser values and bsums");

    /* weight quantisers: plausible error on Gaussian weights (relative RMS) */
    /* (observed: Q8_0 .0054, Q4_0 .086, Q4_K .071, Q6_K .017, F16 .0002, BF16 .0017) */
    struct { int type; double max_rel_rms; } wq[] = { { QT_Q8_0, 0.007 }, { QT_Q4_0, 0.1 }, { QT_Q4_K, 0.08 },
                                                      { QT_Q6_K, 0.02 }, { QT_F16, 3e-4 }, { QT_BF16, 2.5e-3 } };
    for (int64_t i = 0; i < n; i++) x[i] = 0.05f * rng_normal();
    for (size_t k = 0; k < sizeof wq / sizeof *wq; k++) {
        size_t rb;
        quant_row_bytes(wq[k].type, n, &rb);
        uint8_t *buf = malloc(rb);
        CHECK(quant_from_float(wq[k].type, x, buf, n) == 0, "quantise %d", wq[k].type);
        quant_to_float(wq[k].type, buf, y, n);
        double e2 = 0, x2 = 0;
        for (int64_t i = 0; i < n; i++) { e2 += (y[i] - x[i]) * (double)(y[i] - x[i]); x2 += (double)x[i] * x[i]; }
        double rel = sqrt(e2 / x2);
        CHECK(rel <= wq[k].max_rel_rms, "%s quantiser relative rms error %.4f > %.4f", quant_traits_of(wq[k].type)->name,
              rel, wq[k].max_rel_rms);
        free(buf);
    }
    /* a zero row quantises to zeros */
    memset(x, 0, sizeof(float) * 256);
    int zt[] = { QT_Q4_0, QT_Q4_K, QT_Q6_K, QT_Q8_0, QT_Q8_K };
    for (size_t k = 0; k < sizeof zt / sizeof *zt; k++) {
        uint8_t buf[292];
        quant_from_float(zt[k], x, buf, 256);
        quant_to_float(zt[k], buf, y, 256);
        int z = 1;
        for (int i = 0; i < 256; i++) z &= y[i] == 0.0f;
        CHECK(z, "%s zero row", quant_traits_of(zt[k])->name);
    }
    CHECK(quant_from_float(QT_Q5_K, x, q, 256) == -1, "no Q5_K writer");
    CHECK(quant_from_float(QT_Q8_0, x, q, 31) == -1, "partial block refused");
    free(x); free(y); free(q);
}

/* ------------------------------------------------------------ 5. golden */

static const float *f32_tensor(const gguf_file *f, const char *name, int64_t n)
{
    const gguf_tensor *t = gguf_find_tensor(f, name);
    if (!t || t->type != QT_F32 || (int64_t)(t->nbytes / 4) != n) return NULL;
    return t->data;
}

static void golden_model(const char *qname, const gguf_file *ff)
{
    char path[4096], err[256];
    snprintf(path, sizeof path, "golden/llamacpp/models/rand/%s", qname);
    char full[4096];
    if (path_find(path, full, sizeof full) != 0) {
        char msg[4200];
        snprintf(msg, sizeof msg, "golden %s not found", qname);
        test_skip(msg);
        return;
    }
    gguf_file *qf = NULL;
    if (gguf_open(full, &qf, err, sizeof err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    int n_checked = 0;
    for (uint64_t ti = 0; ti < qf->n_tensors; ti++) {
        const gguf_tensor *t = &qf->tensors[ti];
        const quant_traits *tr = quant_traits_of(t->type);
        if (!tr || t->type == QT_F32 || t->n_dims != 2) continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.data);
        int64_t n = t->ne[0], rows = t->ne[1];
        const float *src = f32_tensor(ff, name, n * rows);
        CHECK(src != NULL, "%s: %s has no F32 original", qname, name);
        CHECK(tr->has_kernels, "%s: %s type %s has kernels", qname, name, tr->name);
        if (!src || !tr->has_kernels) continue;
        size_t rb;
        CHECK(quant_row_bytes(t->type, n, &rb) == 0 && rb * (size_t)rows == t->nbytes, "%s: %s size", qname, name);
        float *y = malloc(sizeof(float) * n);
        double *ref = malloc(sizeof(double) * n);
        uint8_t *mine = malloc(rb);
        double e2 = 0, x2 = 0, dec_err = 0, y2 = 0, mine_e2 = 0;
        int64_t byte_diff = 0, max_q_step = 0;
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)t->data + r * rb;
            const float *x = src + r * n;
            quant_to_float(t->type, row, y, n);
            if (t->type == QT_F16) for (int64_t i = 0; i < n; i++) ref[i] = half_value(rd16(row + 2 * i));
            else if (t->type == QT_BF16) for (int64_t i = 0; i < n; i++) ref[i] = u2f((uint32_t)rd16(row + 2 * i) << 16);
            else for (int64_t b = 0; b < n / tr->block_size; b++) naive_decode(t->type, row + b * tr->block_bytes, ref + b * tr->block_size);
            for (int64_t i = 0; i < n; i++) {
                dec_err = fmax(dec_err, fabs(y[i] - ref[i]));
                e2 += (y[i] - x[i]) * (double)(y[i] - x[i]);
                x2 += (double)x[i] * x[i];
                y2 += (double)y[i] * y[i];
            }
            /* our K-quant writers on the same floats: as good as llama-quantize's */
            if (t->type == QT_Q4_K || t->type == QT_Q6_K) {
                quant_from_float(t->type, x, mine, n);
                quant_to_float(t->type, mine, y, n);
                for (int64_t i = 0; i < n; i++) mine_e2 += (y[i] - x[i]) * (double)(y[i] - x[i]);
            }
            /* our other quantisers on the same floats */
            if (t->type == QT_Q4_0 || t->type == QT_Q8_0 || t->type == QT_F16 || t->type == QT_BF16) {
                quant_from_float(t->type, x, mine, n);
                for (size_t k = 0; k < rb; k++) byte_diff += mine[k] != row[k];
                if (t->type == QT_Q8_0)
                    for (int64_t b = 0; b < n / 32; b++)
                        for (int j = 0; j < 32; j++) {
                            int64_t dq = (int8_t)mine[b * 34 + 2 + j] - (int8_t)row[b * 34 + 2 + j];
                            if (llabs(dq) > max_q_step) max_q_step = llabs(dq);
                        }
            }
        }
        double rel = sqrt(e2 / x2), std_ratio = sqrt(y2 / x2);
        /* observed (numpy N(0, sigma) weights): Q8_0 .0053, Q6_K .0177, Q5_K .036,
         * Q4_K .071, Q4_0 .086, BF16 .0017, F16 .0002 */
        double bound = t->type == QT_Q8_0 ? 0.007 : t->type == QT_Q6_K ? 0.023 : t->type == QT_Q5_K ? 0.045
                     : t->type == QT_Q4_K ? 0.09 : t->type == QT_Q4_0 ? 0.11 : t->type == QT_BF16 ? 2.5e-3
                     : t->type == QT_F16 ? 3e-4
                     /* the F.2 files: bounds from the bit widths (a halving of the step per extra bit,
                      * the non-linear IQ4 grid no worse than Q4_0, Q2_K/Q3_K's coarse grids) */
                     : t->type == QT_Q4_1 || t->type == QT_IQ4_NL || t->type == QT_IQ4_XS ? 0.11
                     : t->type == QT_Q5_0 || t->type == QT_Q5_1 ? 0.055 : t->type == QT_Q3_K ? 0.18
                     : t->type == QT_Q2_K ? 0.35 : 0.0;
        CHECK(dec_err == 0.0 || dec_err <= 1e-6 * sqrt(x2 / (double)(n * rows)),
              "%s: %s (%s) dequant vs naive decoder %g", qname, name, tr->name, dec_err);
        CHECK(rel <= bound, "%s: %s (%s) rel rms error %.4f > %.3f", qname, name, tr->name, rel, bound);
        CHECK(std_ratio > 0.9 && std_ratio < 1.1, "%s: %s (%s) std ratio %.3f", qname, name, tr->name, std_ratio);
        if (t->type == QT_Q4_K || t->type == QT_Q6_K)
            CHECK(mine_e2 <= 1.05 * e2, "%s: %s (%s) our writer's squared error %.4g vs llama-quantize %.4g", qname, name,
                  tr->name, mine_e2, e2);
        if (t->type == QT_Q4_0 || t->type == QT_F16 || t->type == QT_BF16)
            CHECK(byte_diff == 0, "%s: %s (%s) requantised: %lld bytes differ from llama-quantize", qname, name, tr->name,
                  (long long)byte_diff);
        if (t->type == QT_Q8_0) /* ggml's file writer rounds half away from zero, our activation path to even */
            CHECK(max_q_step <= 1 && byte_diff * 1000 <= (int64_t)t->nbytes, "%s: %s Q8_0 requantised: %lld bytes differ, max step %lld",
                  qname, name, (long long)byte_diff, (long long)max_q_step);
        n_checked++;
        free(y); free(ref); free(mine);
    }
    CHECK(n_checked > 0, "%s: no quantised tensors found", qname);
    gguf_close(qf);
}

static void test_golden(void)
{
    char full[4096], err[256];
    if (path_find("golden/llamacpp/models/rand/rand-llama-f32.gguf", full, sizeof full) != 0) {
        test_skip("golden rand-llama-f32.gguf not found");
        return;
    }
    gguf_file *ff = NULL;
    if (gguf_open(full, &ff, err, sizeof err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    const char *models[] = { "rand-llama-q8_0.gguf", "rand-llama-q4_0.gguf", "rand-llama-q4_k_m.gguf",
                             "rand-llama-q5_k_m.gguf", "rand-llama-q6_k.gguf", "rand-llama-f16.gguf",
                             "rand-llama-bf16.gguf", "rand-llama-q4_1.gguf", "rand-llama-q5_0.gguf",
                             "rand-llama-q5_1.gguf", "rand-llama-q2_k.gguf", "rand-llama-q3_k_s.gguf",
                             "rand-llama-q4_k_s.gguf", "rand-llama-q5_k_s.gguf", "rand-llama-iq4_nl.gguf",
                             "rand-llama-iq4_xs.gguf" };
    for (size_t k = 0; k < sizeof models / sizeof *models; k++) golden_model(models[k], ff);
    gguf_close(ff);
}

/* ------------------------------------------------------------ 6. traits */

static void test_traits(void)
{
    struct { int type; int64_t bs; size_t bytes; } ggml[] = {
        { QT_F32, 1, 4 }, { QT_F16, 1, 2 }, { QT_BF16, 1, 2 }, { QT_Q4_0, 32, 18 }, { QT_Q4_1, 32, 20 },
        { QT_Q5_0, 32, 22 }, { QT_Q5_1, 32, 24 }, { QT_Q8_0, 32, 34 }, { QT_Q8_1, 32, 36 }, { QT_Q2_K, 256, 84 },
        { QT_Q3_K, 256, 110 }, { QT_Q4_K, 256, 144 }, { QT_Q5_K, 256, 176 }, { QT_Q6_K, 256, 210 },
        { QT_Q8_K, 256, 292 }, { QT_IQ4_NL, 32, 18 }, { QT_IQ4_XS, 256, 136 }, { QT_IQ2_XXS, 256, 66 },
        { QT_TQ2_0, 256, 66 }, { QT_MXFP4, 32, 17 },
    };
    for (size_t k = 0; k < sizeof ggml / sizeof *ggml; k++) {
        const quant_traits *t = quant_traits_of((uint32_t)ggml[k].type);
        CHECK(t && t->block_size == ggml[k].bs && t->block_bytes == ggml[k].bytes, "traits of %d", ggml[k].type);
    }
    uint32_t unassigned[] = { 4, 5, 31, 32, 33, 36, 37, 38, QT_COUNT, 1000, UINT32_MAX };
    for (size_t k = 0; k < sizeof unassigned / sizeof *unassigned; k++)
        CHECK(quant_traits_of(unassigned[k]) == NULL, "type %u is unknown", unassigned[k]);
    for (uint32_t type = 0; type < QT_COUNT; type++) {
        const quant_traits *t = quant_traits_of(type);
        if (!t || !t->has_kernels) continue;
        /* every type with kernels can have its activations produced */
        CHECK(t->vec_dot_type >= 0 && quant_traits_of((uint32_t)t->vec_dot_type) != NULL, "%s vec_dot_type", t->name);
        CHECK(quant_traits_of((uint32_t)t->vec_dot_type)->block_size == t->block_size ||
              quant_traits_of((uint32_t)t->vec_dot_type)->block_size == 1 || t->block_size == 1,
              "%s and its vec_dot_type agree on blocks", t->name);
        float x[256] = { 0 };
        uint8_t buf[1024];
        CHECK(quant_from_float((uint32_t)t->vec_dot_type, x, buf, 256) == 0, "%s activations quantisable", t->name);
    }
    size_t out = 7;
    CHECK(quant_row_bytes(QT_Q4_K, 512, &out) == 0 && out == 288, "Q4_K row of 512");
    CHECK(quant_row_bytes(QT_Q4_K, 100, &out) == -1, "Q4_K partial block");
    CHECK(quant_row_bytes(QT_F32, 0, &out) == 0 && out == 0, "empty row");
    CHECK(quant_row_bytes(QT_F32, -4, &out) == -1, "negative length");
    CHECK(quant_row_bytes(31, 32, &out) == -1, "unknown type");
    CHECK(quant_row_bytes(QT_Q8_0, INT64_MAX - 31, &out) == -1 || out > 0, "huge row does not wrap");
    CHECK(quant_row_bytes(QT_F32, INT64_MAX, &out) == -1, "overflowing row refused");
}

int main(void)
{
    test_traits();
    test_half_conversions();
    test_simd_vs_ref();
    test_values();
    test_golden();
    return test_summary("test_quant");
}
