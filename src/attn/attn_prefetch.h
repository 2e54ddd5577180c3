/* attn_prefetch.h - software prefetch of K/V rows for the x86 decode
 * kernels (AVX2 and AVX-512 alike: _mm_prefetch is SSE). Included by
 * attn_avx2.h and attn_avx512.h.
 *
 * Rows go to L2, not L1: L1 prefetches wait for the few L1 miss buffers and
 * stall the loads behind them (2x slower gathers measured); the kernels' own
 * loads then find the rows in L2.
 *
 * Every function here is forced inline: a call to a function that only
 * prefetches has no side effect gcc 12's mod-ref analysis can see, and it
 * deletes such calls when it does not inline them on its own (it dropped
 * prefetch_kv_stream whole).
 */
#ifndef SPARQ_ATTN_PREFETCH_H
#define SPARQ_ATTN_PREFETCH_H

#include <stddef.h>
#include <stdint.h>
#include <xmmintrin.h>

#define PREFETCH_INLINE static inline __attribute__((always_inline))

/* Requests rows [from, to) of a gathered K or V (rows[] index it). */
PREFETCH_INLINE void prefetch_rows(const void *base, const int32_t *rows, int64_t from,
                                 int64_t to, size_t row_bytes)
{
    for (int64_t i = from; i < to; i++)
        for (size_t b = 0; b < row_bytes; b += 64)
            _mm_prefetch((const char *)base + (size_t)rows[i] * row_bytes + b, _MM_HINT_T1);
}

/* Requests rows [from, to) of contiguous rows (rb bytes each), every line:
 * the hardware prefetcher alone leaves the kernels waiting on memory. */
PREFETCH_INLINE void prefetch_span(const void *base, int64_t from, int64_t to, size_t rb)
{
    const char *a = (const char *)base + (size_t)from * rb, *b = (const char *)base + (size_t)to * rb;
    for (a = (const char *)((uintptr_t)a & ~(uintptr_t)63); a < b; a += 64) _mm_prefetch(a, _MM_HINT_T1);
}

/* A dense pass over contiguous K or V rows: how far ahead it requests them.
 * On a Zen 5 guest the f16 dense op (K pass, then V pass) read 12-13 GB/s
 * a thread with the hardware prefetcher alone where a plain sum of an
 * array reads 37-40, 25 with K's lines requested 8 KiB ahead and 27 with
 * V's too (4-16 KiB measured alike, 32 KiB slower). */
enum { ATTN_STREAM_AHEAD_BYTES = 8192 };

static inline int64_t stream_ahead_rows(size_t rb)
{
    return (int64_t)(ATTN_STREAM_AHEAD_BYTES / rb) + 1;
}

/* Requests rows [a, b) of the stream "K rows 0..n, then V rows 0..vn"
 * (vn <= n): the score pass runs on into V's first rows, which the
 * weighted sum reads next. V may be NULL (a scores-only view). */
PREFETCH_INLINE void prefetch_kv_stream(const void *K, const void *V, int64_t n, int64_t vn,
                                        int64_t a, int64_t b, size_t rb)
{
    if (a < n) prefetch_span(K, a, b < n ? b : n, rb);
    if (b > n && V && a - n < vn) prefetch_span(V, a > n ? a - n : 0, b - n < vn ? b - n : vn, rb);
}

#endif
