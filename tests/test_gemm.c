/* test_gemm.c - the prefill GEMM tiles (tensor/gemm.h).
 *
 * For every packed weight type, random blocks, odd lengths and odd tile
 * shapes:
 *   1. gemm_panel (the SIMD micro-kernels) equals gemm_panel_ref bit for bit;
 *   2. the reference equals a naive double-precision dot of the weights
 *      dequantised by the decoder written below (from the ggml block
 *      layouts, not the library's) and the activations the library
 *      quantises to the vec_dot type, within float rounding;
 *   3. it equals the one-token quant_dot within float rounding (the decode
 *      path; only summation order and rounding may differ).
 */
#include "tensor/gemm.h"
#include "tensor/quant.h"
#include "test.h"

#include <stdint.h>

static uint64_t rng = 0x1234567887654321ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float unif(void) { return (float)((rnd() >> 11) * (1.0 / 9007199254740992.0)); }
static float normal(void)
{
    float s = 0;
    for (int i = 0; i < 12; i++) s += unif();
    return s - 6.0f;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static float get16h(const uint8_t *p) { return fp16_to_fp32((uint16_t)(p[0] | (p[1] << 8))); }

/* Random weight row of n elements: random bytes with sane f16 scales. */
static void random_row(int type, uint8_t *dst, int64_t n)
{
    const quant_traits *tr = quant_traits_of((uint32_t)type);
    const int64_t nb = n / tr->block_size;
    const size_t bb = tr->block_bytes;
    if (type == QT_F32 || type == QT_F16 || type == QT_BF16) {
        for (int64_t i = 0; i < n; i++) {
            float v = normal();
            if (type == QT_F32) memcpy(dst + 4 * i, &v, 4);
            else put16(dst + 2 * i, type == QT_F16 ? fp32_to_fp16(v) : fp32_to_bf16(v));
        }
        return;
    }
    for (size_t i = 0; i < nb * bb; i++) dst[i] = (uint8_t)rnd();
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = dst + b * bb;
        const uint16_t d = fp32_to_fp16(0.001f + 0.05f * unif()), m = fp32_to_fp16(0.001f + 0.02f * unif());
        switch (type) {
        case QT_Q8_0: case QT_Q4_0: case QT_IQ4_NL: case QT_IQ4_XS: put16(blk, d); break;
        case QT_Q4_K: case QT_Q5_K: put16(blk, d); put16(blk + 2, m); break;
        case QT_Q6_K: put16(blk + 208, d); break;
        }
    }
}

/* Naive decoder of one weight element, from the ggml block layouts. */
static double naive_weight(int type, const uint8_t *row, int64_t e)
{
    switch (type) {
    case QT_F32: { float v; memcpy(&v, row + 4 * e, 4); return v; }
    case QT_F16: return get16h(row + 2 * e);
    case QT_BF16: return bf16_to_fp32((uint16_t)(row[2 * e] | (row[2 * e + 1] << 8)));
    case QT_Q8_0: { const uint8_t *b = row + (e / 32) * 34; return get16h(b) * (int8_t)b[2 + e % 32]; }
    case QT_Q4_0: {
        const uint8_t *b = row + (e / 32) * 18;
        int j = (int)(e % 32);
        int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
        return get16h(b) * (q - 8);
    }
    case QT_Q4_K: case QT_Q5_K: {
        const int five = type == QT_Q5_K;
        const uint8_t *b = row + (e / 256) * (five ? 176 : 144);
        const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
        int i = (int)(e % 256), j = i / 32, s, m;
        if (j < 4) { s = sc[j] & 63; m = sc[j + 4] & 63; }
        else { s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4); m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4); }
        int q = qs[32 * (i / 64) + i % 32];
        q = (i % 64) < 32 ? (q & 15) : (q >> 4);
        if (five) q += 16 * ((qh[i % 32] >> (i / 32)) & 1);
        return (double)get16h(b) * s * q - (double)get16h(b + 2) * m;
    }
    case QT_IQ4_NL: {
        static const int grid[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };
        const uint8_t *b = row + (e / 32) * 18;
        int j = (int)(e % 32);
        return get16h(b) * grid[j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4)];
    }
    case QT_IQ4_XS: {
        static const int grid[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };
        /* d f16 | scales_h u16 | scales_l[4] | qs[128]: sub-block ib's
         * 6-bit scale is 4 low bits from scales_l, 2 high from scales_h */
        const uint8_t *b = row + (e / 256) * 136;
        int i = (int)(e % 256), ib = i / 32, j = i % 32;
        int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | (((b[2] | (b[3] << 8)) >> (2 * ib) & 3) << 4);
        int q = j < 16 ? (b[8 + 16 * ib + j] & 15) : (b[8 + 16 * ib + j - 16] >> 4);
        return (double)get16h(b) * (ls - 32) * grid[q];
    }
    case QT_Q6_K: {
        const uint8_t *b = row + (e / 256) * 210, *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        int i = (int)(e % 256), h = i / 128, s = (i % 128) / 32, l = i % 32;
        int lo = ql[64 * h + l + 32 * (s & 1)];
        int q = (s >= 2 ? lo >> 4 : lo & 15) | (((qh[32 * h + l] >> (2 * s)) & 3) << 4);
        return (double)get16h(b + 208) * sc[i / 16] * (q - 32);
    }
    }
    return NAN;
}

static const int types[] = { QT_Q8_0, QT_Q4_0, QT_IQ4_NL, QT_Q4_K, QT_Q5_K, QT_Q6_K, QT_IQ4_XS, QT_F32, QT_F16, QT_BF16 };

static void test_type(int type)
{
    const quant_traits *tr = quant_traits_of((uint32_t)type);
    const int vdt = tr->vec_dot_type;
    const int64_t bs = tr->block_size;
    const int64_t lens_q[] = { 32, 96, 160, 320 }, lens_k[] = { 256, 768 }, lens_f[] = { 1, 7, 16, 33, 100 };
    const int64_t *lens = bs == 32 ? lens_q : bs == 256 ? lens_k : lens_f;
    const int n_lens = bs == 32 ? 4 : bs == 256 ? 2 : 5;
    /* rows: one group, a partial one, two and more (16-row groups, pairs
     * of them per kernel); tokens: within and past a 6-token tile */
    const int shapes[][2] = { { 1, 1 }, { 3, 5 }, { 4, 4 }, { 9, 7 }, { 6, 2 }, { 16, 6 }, { 33, 13 }, { 48, 1 }, { 17, 12 }, { 20, 10 } };
    int n_bitsame = 0, n_cases = 0;
    double worst_naive = 0, worst_dot = 0;
    for (int li = 0; li < n_lens; li++) {
        const int64_t n = lens[li];
        size_t wrb, xrb;
        quant_row_bytes((uint32_t)type, n, &wrb);
        quant_row_bytes((uint32_t)vdt, n, &xrb);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int nr = shapes[si][0], nt = shapes[si][1];
            const size_t prb = gemm_row_bytes((uint32_t)type, n), pab = gemm_act_bytes((uint32_t)type, n);
            CHECK(pab % 64 == 0, "packed tokens are whole cache lines");
            const int nr_pad = (nr + GEMM_GROUP - 1) / GEMM_GROUP * GEMM_GROUP;
            uint8_t *w = malloc((size_t)nr * wrb), *xq = malloc((size_t)nt * xrb);
            float *x = malloc((size_t)nt * n * sizeof(float)), *xd = malloc((size_t)n * sizeof(float));
            /* aligned_alloc wants a multiple of the alignment: Q8_0 groups are 544 bytes a block */
            uint8_t *pw = aligned_alloc(64, ((size_t)nr_pad * prb + 63) / 64 * 64), *px = aligned_alloc(64, (size_t)nt * pab);
            float *o_simd = malloc((size_t)nr * nt * sizeof(float)), *o_ref = malloc((size_t)nr * nt * sizeof(float));
            if (!w || !xq || !x || !xd || !pw || !px || !o_simd || !o_ref) {
                CHECK(0, "out of memory");
                return;
            }
            for (int r = 0; r < nr; r++) random_row(type, w + r * wrb, n);
            for (int64_t i = 0; i < nt * n; i++) x[i] = normal();
            gemm_pack_rows((uint32_t)type, w, wrb, nr, n, pw);
            for (int t = 0; t < nt; t++) {
                gemm_pack_act((uint32_t)type, x + t * n, n, px + t * pab);
                quant_from_float((uint32_t)vdt, x + t * n, xq + t * xrb, n);
            }
            gemm_panel((uint32_t)type, pw, nr, px, nt, n, o_simd, (size_t)nr);
            gemm_panel_ref((uint32_t)type, pw, nr, px, nt, n, o_ref, (size_t)nr);
            n_bitsame += memcmp(o_simd, o_ref, (size_t)nr * nt * sizeof(float)) == 0;
            n_cases++;
            for (int t = 0; t < nt; t++) {
                quant_to_float((uint32_t)vdt, xq + t * xrb, xd, n);
                for (int r = 0; r < nr; r++) {
                    double dot = 0, mag = 0;
                    for (int64_t e = 0; e < n; e++) {
                        double we = naive_weight(type, w + r * wrb, e);
                        dot += we * xd[e];
                        mag += fabs(we * xd[e]);
                    }
                    const double got = o_ref[t * nr + r];
                    const double one = quant_dot((uint32_t)type, w + r * wrb, xq + t * xrb, n);
                    const double e1 = fabs(got - dot) / (mag + 1e-30), e2 = fabs(got - one) / (mag + 1e-30);
                    if (e1 > worst_naive) worst_naive = e1;
                    if (e2 > worst_dot) worst_dot = e2;
                }
            }
            free(w); free(xq); free(x); free(xd); free(pw); free(px); free(o_simd); free(o_ref);
        }
    }
    CHECK(n_bitsame == n_cases, "%s: SIMD tiles differ from the reference in %d of %d cases", tr->name,
          n_cases - n_bitsame, n_cases);
    CHECK(worst_naive <= 2e-6, "%s: reference vs naive dot: relative error %g", tr->name, worst_naive);
    CHECK(worst_dot <= 2e-6, "%s: reference vs quant_dot: relative error %g", tr->name, worst_dot);
    printf("%-5s naive rel err %.2e, vs quant_dot %.2e\n", tr->name, worst_naive, worst_dot);
}

/* A wrong kernel must be caught: the checks above compare against values
 * computed without the packed layout, so corrupting one packed scale (row
 * 0's f16 in block 0: after the block's 16 x 32 codes, gemm.h) has to move
 * the result. */
static void test_sensitivity(void)
{
    const int64_t n = 64;
    uint8_t w[68];
    random_row(QT_Q8_0, w, n);
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = normal();
    const size_t prb = gemm_row_bytes(QT_Q8_0, n), pab = gemm_act_bytes(QT_Q8_0, n);
    uint8_t *pw = aligned_alloc(64, (GEMM_GROUP * prb + 63) / 64 * 64), *px = aligned_alloc(64, pab);
    if (!pw || !px) { CHECK(0, "out of memory"); return; }
    gemm_pack_rows(QT_Q8_0, w, sizeof w, 1, n, pw);
    gemm_pack_act(QT_Q8_0, x, n, px);
    float a, b;
    gemm_panel(QT_Q8_0, pw, 1, px, 1, n, &a, 1);
    pw[GEMM_GROUP * 32 + 1] += 4; /* f16 exponent + 1 (gemm.h: Q8_0 keeps the file's f16 scale) */
    gemm_panel(QT_Q8_0, pw, 1, px, 1, n, &b, 1);
    CHECK(a != b, "a corrupted scale changes the dot");
    free(pw);
    free(px);
}

int main(void)
{
    printf("gemm kernels: %s\n", quant_simd_name());
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_type(types[i]);
    test_sensitivity();
    return test_summary("test_gemm");
}
