/* bench.h - the arithmetic and reporting behind `sparq bench`.
 *
 * The timing runs are bench_run.h's (one file per mode); this module owns
 * what can be checked without a clock:
 *   - order statistics of repeated timings (median, quartiles, min/max);
 *   - bytes a decode-attention call moves, counted (the policy's own
 *     attn_counts) and by formula (attn_policy.transfer_formula), in the
 *     cache's own bytes per element (f32 4, f16 2, Q8_0 34 per 32), with
 *     GB/s, speed-up and the theoretical transfer ratio derived from them;
 *   - comma lists of sizes ("1k,32k,1M"), deterministic N(0,1) test data
 *     and the KV cache fill `bench attn` times over (any element type);
 *   - the read-bandwidth kernel `bench membw` times (ref + AVX-512 twins);
 *   - writing result rows as a human table, JSON (an array of objects) or
 *     CSV, and a gnuplot script drawing speed-up over dense against S.
 *
 * Conventions: a double field holding NAN means "not applicable / not
 * measured" and is written as null (JSON), an empty cell (CSV) or "-"
 * (table). Times are microseconds, sizes bytes, bandwidth 1e9 bytes/s.
 * Nothing here prints to stdout unless handed stdout as the FILE.
 */
#ifndef SPARQ_BENCH_H
#define SPARQ_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "attn/attn.h"
#include "core/kvcache.h"

/* ---- statistics ---------------------------------------------------------- */

typedef struct bench_stats {
    int    n;                 /* samples                                      */
    double median, q1, q3;    /* quantiles, linear interpolation (numpy's)    */
    double min, max, mean;
} bench_stats;

/* Summarises x[0..n) (n >= 1; x is not modified). work: room for n
 * doubles. n == 0 gives all-NAN stats. */
void bench_stats_of(const double *x, int n, double *work, bench_stats *out);
/* The p-quantile (0..1) of sorted[0..n), linear interpolation between the
 * closest ranks: position p*(n-1). */
double bench_quantile_sorted(const double *sorted, int n, double p);

/* ---- transfer arithmetic -------------------------------------------------- */

/* kv_elem below is attn.h's KV_F32, KV_F16 or KV_Q8_0.
 * Bytes of `elements` cache elements of kv_elem, counted as the cache
 * counts them (kv_bytes_of): 4 or 2 each, Q8_0 34 per 32 rounded up. */
int64_t bench_kv_bytes(int kv_elem, int64_t elements);
/* Bytes per element: 4, 2 or 34/32 = 1.0625 (NAN for an unknown type). */
double bench_kv_elem_bytes(int kv_elem);
/* "f32", "f16", "q8_0" ("?" for an unknown type). */
const char *bench_kv_name(int kv_elem);

/* Bytes the cache moved for `pairs` (batch element, KV head) calls whose
 * counts are c[0..pairs): bench_kv_bytes of the summed read + written
 * elements. */
int64_t bench_counted_bytes(const attn_counts *c, int64_t pairs, int kv_elem);
/* The policy's formula for one call over `pairs` KV heads, in bytes:
 * bench_kv_bytes of pairs x transfer_formula(p, S, d, g) elements. */
int64_t bench_formula_bytes(const attn_policy *pol, const sparq_attn_params *p, int64_t S, int d,
                            int g, int64_t pairs, int kv_elem);
/* 1e9 bytes per second for `bytes` moved in `us` microseconds (NAN if us <= 0). */
double bench_gbps(double bytes, double us);
/* How many times faster than the reference: ref_us / us (NAN if unknown). */
double bench_speedup(double ref_us, double us);
/* Transfer ratio policy / dense (0.125 = one eighth of dense's traffic);
 * its inverse is the theoretical speed-up of a bandwidth-bound kernel. */
double bench_ratio(double policy_bytes, double dense_bytes);

/* ---- inputs ---------------------------------------------------------------- */

/* Parses a comma list of non-negative integers into out[0..max); a value
 * may end in k (x1024) or M (x1048576), so "1k,32k,1M". Returns the count
 * (>= 1), or -1 with a message naming the bad item. */
int bench_parse_list(const char *s, int64_t *out, int max, char *err, size_t err_size);
/* Splits a comma list of names into out[0..max) pointers into buf (a copy
 * of s of buf_size bytes). Returns the count or -1 (empty item, too many). */
int bench_split_names(const char *s, char *buf, size_t buf_size, const char **out, int max,
                      char *err, size_t err_size);

/* Seeded generator for benchmark data (the splitmix64 stream, util/rng.h). */
typedef struct bench_rng { uint64_t s; } bench_rng;
void     bench_rng_seed(bench_rng *r, uint64_t seed);
uint64_t bench_rng_next(bench_rng *r);
/* x[0..n) ~ N(0, 1) (Marsaglia's polar method on 52-bit uniforms). */
void bench_randn(bench_rng *r, float *x, size_t n);
/* Queries for n_heads heads of size d. heavy == 0: N(0,1). heavy != 0: each
 * component is N(0,1) times a per-component scale exp(1.5 N(0,1)) shared by
 * all heads of the call, so a few components dominate |q| as in real
 * models' queries (what SparQ's component selection exploits). */
void bench_query(bench_rng *r, float *q, int n_heads, int d, int heavy);
/* Writes positions [from, to) of every cache "layer" (bench attn uses one
 * layer per batch element) through kv_write, so every element type gets
 * what the model's append stores (Q8_0 blocks, K^T, V sums): keys and
 * values N(0,1), seeded per (layer, position) so the data does not depend
 * on how the fill is split or on the element type. Sets kv->n = to.
 * Returns 0, or -1 when out of memory. */
int bench_fill_kv(kv_cache *kv, int64_t from, int64_t to, uint64_t seed, int threads);

/* ---- read bandwidth kernel (bench membw) ----------------------------------- */

/* Sum of x[0..n): one sequential read of the array. x need not be aligned.
 * The twins differ only by the order of additions. */
float bench_sum_f32(const float *x, size_t n);
float bench_sum_f32_ref(const float *x, size_t n);
float bench_sum_f32_avx2(const float *x, size_t n);
float bench_sum_f32_avx512(const float *x, size_t n);
/* One level's kernels (bench_sum_f32 calls through the level running). */
typedef struct bench_kernels {
    float (*sum_f32)(const float *x, size_t n);
} bench_kernels;
extern const bench_kernels bench_kernels_ref, bench_kernels_avx2, bench_kernels_avx512;
const bench_kernels *bench_kernels_at(cpu_level level);

/* ---- result rows ------------------------------------------------------------ */

typedef enum { BENCH_ATTN = 0, BENCH_MEMBW = 1, BENCH_DECODE = 2 } bench_kind;

typedef struct bench_row {
    bench_kind kind;
    char    policy[24];      /* attention policy; "read" for membw           */
    char    model[64];       /* decode: model file name (no directory)       */
    char    fill[12];        /* decode: "random" or "prefill"                 */
    int     B, H, kv_heads, d;
    int64_t S;               /* attn: context length; decode: = depth         */
    int     r, k, l;         /* resolved policy parameters (0 = not used)     */
    int     threads;
    int     kv_elem;         /* KV_F16, KV_F32 or KV_Q8_0 (kv_type column;
                              * bytes per element: bench_kv_elem_bytes)    */
    int     heavy_query;
    int     inner;           /* calls per timed sample                        */
    bench_stats us;          /* time per call / token / pass, microseconds    */
    int64_t bytes_counted;   /* per call (attn, decode attention), or per pass*/
    int64_t bytes_formula;   /* per call, the policy's formula                */
    int64_t bytes_dense;     /* per call, dense's formula for the same shape  */
    double  gbps;            /* bytes_counted / median                        */
    double  speedup_vs_dense;
    double  theoretical_ratio; /* bytes_formula / bytes_dense                 */
    double  pct_bw;          /* gbps / measured read bandwidth x 100          */
    /* decode only */
    int64_t depth;
    double  tok_s;           /* 1e6 / median us per token                     */
    double  tok_s_mean;      /* tokens / total time                           */
    double  ms_weights;      /* median ms/token of the same policy at depth 0 */
    double  ms_attn;         /* median ms/token minus ms_weights              */
    int64_t rss, peak_rss;   /* bytes: resident after the row; process peak   */
} bench_row;

/* A row with every double NAN, ints 0, kv_elem KV_F16. */
void bench_row_init(bench_row *r, bench_kind kind);
const char *bench_kind_name(bench_kind k);

/* Human table: one section per kind present, in row order. */
void bench_print_table(FILE *f, const bench_row *rows, int n);
/* JSON: one array of objects, keys as in the CSV header; NAN -> null.
 * Returns 0, or -1 if writing failed. */
int bench_write_json(FILE *f, const bench_row *rows, int n);
/* CSV: header line, then one line per row (RFC 4180 quoting for text). */
int bench_write_csv(FILE *f, const bench_row *rows, int n);

/* The label a row's curve gets in the plot ("sparq r=16 k=128"), plus
 * B/H/kv/d/threads/kv type when they vary between the attn rows. */
void bench_series_label(const bench_row *rows, int n, const bench_row *r, char *buf, size_t size);
/* gnuplot script drawing, for the attn rows with a speed-up, measured
 * (solid) and theoretical (dashed) speed-up over dense against S (log2 x),
 * one curve per series, in the style of the SparQ paper's Figure 8.
 * terminal: "pngcairo" or "png". Returns the number of curves (0: nothing
 * to plot) or -1 if writing failed. */
/* The same for decode rows: tokens/s against depth, one curve per policy
 * setting (plus model, threads, KV type where they vary). Returns the
 * curve count (0: no decode rows) or -1. */
int bench_write_gnuplot_decode(FILE *f, const bench_row *rows, int n, const char *png_path,
                               const char *terminal, const char *title);
int bench_write_gnuplot(FILE *f, const bench_row *rows, int n, const char *png_path,
                        const char *terminal, const char *title);

/* The cost of grammar-constrained sampling (sparq_sampler_set_grammar):
 * `steps` draws from logits of pseudo-random values (seeded; the worst
 * case: the grammar rarely allows the top token, so a greedy draw sorts
 * the vocabulary) by a free and a constrained sampler at temperature
 * temp (0: greedy), timed around sparq_sample only. The grammar restarts
 * when the constrained draws complete it. Mean microseconds per draw in
 * *us_free / *us_grammar; 0, or -1 with a message. */
int bench_grammar(const sparq_model *m, const sparq_grammar *g, int steps, float temp, uint64_t seed,
                  double *us_free, double *us_grammar, char *err, size_t err_size);

#endif
