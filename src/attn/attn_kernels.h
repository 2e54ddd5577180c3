/* attn_kernels.h - the decode-attention kernel twins and their tables.
 *
 * Every kernel attn.h declares under "kernel building blocks" has a plain-C
 * `_ref` twin (attn_kernels_ref.c, integer Q8_0 ones in
 * attn_kernels_q8i_ref.c) and SIMD twins of the same signature
 * (attn_kernels_avx2.c, attn_kernels_avx512.c, attn_kernels_neon.c, the
 * attn_kernels_q8i_*.c files); each level's are gathered in one
 * attn_kernels table. attn.c picks the table of the level running and
 * holds the un-suffixed names: the twins include this header and never
 * attn.h, so no kernel depends on its dispatcher.
 */
#ifndef SPARQ_ATTN_KERNELS_H
#define SPARQ_ATTN_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "attn/attn_exp.h"
#include "attn/attn_kv_view.h"

/* x, or exactly 0 where x < ATTN_SCORE_MIN (attn_exp.h): the factors of
 * SparQ's approximate scores, never subnormal nor multiplying into one. */
static inline float attn_score_flush(float x) { return x >= ATTN_SCORE_MIN ? x : 0.0f; }

/* Top-k's order key of a float: unsigned order = float order. -0 and +0
 * share a key; NaN takes -inf's, so a poisoned score ranks last and never
 * displaces a real one. */
static inline uint32_t attn_topk_key(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    if (v != v) b = 0xff800000u; /* NaN -> -inf */
    if (b == 0x80000000u) b = 0; /* -0 -> +0 */
    return b & 0x80000000u ? ~b : b | 0x80000000u;
}

/* Positions per block of attn_kt_exp's running maximum. */
enum { ATTN_EXP_BLOCK = 256 };

/* attn_gather_group over no rows: out 0, and lse (unless NULL) -inf, which
 * attn_merge_part gives no weight. */
static inline void attn_gather_none(int g, int d, float *out, float *lse)
{
    memset(out, 0, (size_t)g * d * sizeof *out);
    if (lse)
        for (int h = 0; h < g; h++) lse[h] = -INFINITY;
}

/* ---- integer kernels for Q8_0 caches (attn_kernels_q8i_*.c) ------------
 * A Q8_0 cache whose head size is a multiple of 64 is read in integers:
 * attn_scores quantizes each query head to Q8_0 blocks (scale max|q|/127,
 * round to nearest) and sums code products exactly in int32 per 32-element
 * block, s = sum_b (sum_j k_j q_j) * (dk_b * (dq_b / sqrt(d))), the blocks
 * added in order by fused multiply-adds; attn_softmax_weighted_sum
 * quantizes, per 64 positions and V block, the weights c_i = p_i * dv_i
 * (p_i = exp(s_i - max) >= 0, dv_i the block's scale) to u8 against their
 * maximum (sigma = max / 255) and sums u_i * v_ij exactly in int32, then
 * o_j += I_j * sigma per 64 positions and o_j / sum_i p_i at the end. This is
 * what llama.cpp does for q8_0 caches (the query meets the cache in Q8_0),
 * and it is what makes them cheaper to read than f16: one VNNI instruction
 * multiplies 64 codes, where widening each code to f32 cost more than the
 * bytes it saved (tests/test_kvq8.c bounds both quantizations' error
 * against f32). Other head sizes, and the unfused attn_weighted_sum, widen
 * to f32. */
enum { ATTN_Q8I_CHUNK = 64, ATTN_Q8I_MAX_D = 512 };

static inline int attn_q8i_applies(const attn_kv_view *kv)
{
    return kv->elem == KV_Q8_0 && kv->d % 64 == 0 && kv->d <= ATTN_Q8I_MAX_D;
}

/* One query head q[0..d) -> codes qi[0..d), per 32-element block b the scale
 * dq_b times `scale` in dqs[b] and 128 * sum of the block's codes in
 * corr[b] (the offset of codes made unsigned by adding 128). */
void attn_q8i_query(const float *q, int d, float scale, int8_t *qi, float *dqs, int32_t *corr);
void attn_scores_q8i_ref(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                         int64_t n, float *s);
void attn_softmax_weighted_sum_q8i_ref(const attn_kv_view *kv, const float *s, int g,
                                       const int32_t *rows, int64_t n, float *out, float *lse);
/* ATTN_HAVE_AVX512 / ATTN_HAVE_Q8I_AVX512: the file being compiled may use
 * those instructions (the *_avx512.c files are compiled for them); the
 * kernels that run are chosen at run time (attn_kernels_at). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__F16C__) && defined(__FMA__)
#define ATTN_HAVE_Q8I_AVX512 1
#endif
void attn_scores_q8i_avx512(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                            int64_t n, float *s);
void attn_softmax_weighted_sum_q8i_avx512(const attn_kv_view *kv, const float *s, int g,
                                          const int32_t *rows, int64_t n, float *out, float *lse);
/* attn_kernels_q8i_avx2.c: the same without VNNI (compiled for AVX2). */
void attn_scores_q8i_avx2(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                          int64_t n, float *s);
void attn_softmax_weighted_sum_q8i_avx2(const attn_kv_view *kv, const float *s, int g,
                                        const int32_t *rows, int64_t n, float *out, float *lse);


int64_t attn_topk_filter_ref(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key);
int64_t attn_topk_partition_ref(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out,
                                int64_t *n_lo);
uint32_t attn_topk_kth_key_ref(const uint32_t *key, int64_t m, int64_t k);
int64_t attn_topk_above_ref(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                            int32_t *idx);
void attn_softmax_weighted_sum_ref(const attn_kv_view *kv, const float *s, int g,
                                   const int32_t *rows, int64_t n, float *out, float *lse);
void attn_kt_exp_ref(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g,
                     int64_t n, float *e, float *scale, float *lsum);
void attn_scaled_head_sum_ref(const float *e, const float *scale, int g, int64_t n, int64_t m,
                              float *out);
void attn_scores_ref(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                     int64_t n, float *s);
void attn_softmax_ref(float *s, int g, int64_t n);
void attn_weighted_sum_ref(const attn_kv_view *kv, const float *w, int g, const int32_t *rows,
                           int64_t n, float *out);
void attn_kt_logits_ref(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                        int g, int64_t n, float *s);
/* attn_gather_group's twins: _ref runs the scores and softmax_weighted_sum
 * _ref kernels; _avx2 and _avx512 their own level's. */
void attn_gather_group_ref(const attn_kv_view *kv, const float *q, int g,
                           const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse);
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ATTN_HAVE_AVX512 1
#endif
int64_t attn_topk_filter_avx512(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key);
int64_t attn_topk_partition_avx512(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out,
                                   int64_t *n_lo);
uint32_t attn_topk_kth_key_avx512(const uint32_t *key, int64_t m, int64_t k);
int64_t attn_topk_above_avx512(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                               int32_t *idx);
void attn_softmax_weighted_sum_avx512(const attn_kv_view *kv, const float *s, int g,
                                      const int32_t *rows, int64_t n, float *out, float *lse);
void attn_kt_exp_avx512(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                        int g, int64_t n, float *e, float *scale, float *lsum);
void attn_scaled_head_sum_avx512(const float *e, const float *scale, int g, int64_t n,
                                 int64_t m, float *out);
void attn_scores_avx512(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                        int64_t n, float *s);
void attn_softmax_avx512(float *s, int g, int64_t n);
void attn_weighted_sum_avx512(const attn_kv_view *kv, const float *w, int g,
                              const int32_t *rows, int64_t n, float *out);
void attn_kt_logits_avx512(const attn_kv_view *kv, const float *qs, const int32_t *comp,
                           int r, int g, int64_t n, float *s);
void attn_gather_group_avx512(const attn_kv_view *kv, const float *q, int g,
                              const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse);
int64_t attn_topk_filter_avx2(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key);
int64_t attn_topk_partition_avx2(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out,
                                 int64_t *n_lo);
uint32_t attn_topk_kth_key_avx2(const uint32_t *key, int64_t m, int64_t k);
int64_t attn_topk_above_avx2(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t,
                             int32_t *idx);
void attn_softmax_weighted_sum_avx2(const attn_kv_view *kv, const float *s, int g,
                                    const int32_t *rows, int64_t n, float *out, float *lse);
void attn_kt_exp_avx2(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r,
                      int g, int64_t n, float *e, float *scale, float *lsum);
void attn_scaled_head_sum_avx2(const float *e, const float *scale, int g, int64_t n,
                               int64_t m, float *out);
void attn_scores_avx2(const attn_kv_view *kv, const float *q, int g, const int32_t *rows,
                      int64_t n, float *s);
void attn_softmax_avx2(float *s, int g, int64_t n);
void attn_weighted_sum_avx2(const attn_kv_view *kv, const float *w, int g,
                            const int32_t *rows, int64_t n, float *out);
void attn_kt_logits_avx2(const attn_kv_view *kv, const float *qs, const int32_t *comp,
                         int r, int g, int64_t n, float *s);
void attn_gather_group_avx2(const attn_kv_view *kv, const float *q, int g,
                            const int32_t *sel, int64_t n_sel, float *out, float *scratch, float *lse);

/* One level's kernel building blocks (attn.h's un-suffixed functions call
 * through the table of the level running). */
typedef struct attn_kernels {
    int64_t (*topk_filter)(const float *x, int64_t n, float t, int32_t *idx, uint32_t *key);
    void (*scores)(const attn_kv_view *kv, const float *q, int g, const int32_t *rows, int64_t n, float *s);
    void (*softmax)(float *s, int g, int64_t n);
    void (*weighted_sum)(const attn_kv_view *kv, const float *w, int g, const int32_t *rows, int64_t n,
                         float *out);
    void (*kt_logits)(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g, int64_t n,
                      float *s);
    void (*softmax_weighted_sum)(const attn_kv_view *kv, const float *s, int g, const int32_t *rows,
                                 int64_t n, float *out, float *lse);
    void (*kt_exp)(const attn_kv_view *kv, const float *qs, const int32_t *comp, int r, int g, int64_t n,
                   float *e, float *scale, float *lsum);
    void (*scaled_head_sum)(const float *e, const float *scale, int g, int64_t n, int64_t m, float *out);
    uint32_t (*topk_kth_key)(const uint32_t *key, int64_t m, int64_t k);
    int64_t (*topk_above)(const uint32_t *key, const int32_t *pos, int64_t m, uint32_t t, int32_t *idx);
    int64_t (*topk_partition)(const uint32_t *key, int64_t m, uint32_t p, uint32_t *out, int64_t *n_lo);
    void (*gather_group)(const attn_kv_view *kv, const float *q, int g, const int32_t *sel, int64_t n_sel,
                         float *out, float *scratch, float *lse);
} attn_kernels;
extern const attn_kernels attn_kernels_ref, attn_kernels_avx2, attn_kernels_avx512;
/* ARM64: attn_kernels_neon.c's two builds (Makefile) */
extern const attn_kernels attn_kernels_neon, attn_kernels_neondp;

#endif
