/* simd_avx2.h - small AVX2 pieces the *_avx2.c twins of several layers
 * share: lane masks for the tails (AVX2 has no mask registers; maskload
 * and maskstore take a vector whose lanes' top bits select) and the
 * in-register compress AVX-512 has as one instruction (vpcompressd).
 * Include only from a *_avx2.c file: the Makefile compiles those alone
 * for AVX2 (util/cpu.h).
 */
#ifndef SPARQ_UTIL_SIMD_AVX2_H
#define SPARQ_UTIL_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>

/* Byte u of entry m: the lane of the u-th set bit of m (simd_avx2.c). */
extern const uint64_t simd_compress8_lut[256];

/* The lanes of v whose bit is set in m (8 bits), moved to the front in
 * lane order; the lanes after them are undefined. One table load and a
 * cross-lane permute: BMI2's pext would do it without the table, but it is
 * microcoded (hundreds of cycles) on AMD before Zen 3. */
static inline __m256i simd_compress8_epi32(__m256i v, unsigned m)
{
    const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)simd_compress8_lut[m & 255]));
    return _mm256_permutevar8x32_epi32(v, perm);
}

static inline __m256 simd_compress8_ps(__m256 v, unsigned m)
{
    return _mm256_castsi256_ps(simd_compress8_epi32(_mm256_castps_si256(v), m));
}

/* All-ones in the low min(max(k, 0), 8) 32-bit lanes, zero above: the
 * mask of maskload/maskstore for a tail of k elements. */
static inline __m256i simd_lanes8(int64_t k)
{
    const int kk = k <= 0 ? 0 : k >= 8 ? 8 : (int)k;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(kk), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#endif
