/* test_attn.c - attention policies and kernels against independent references.
 *
 *  1. half floats: attn_f16_to_f32 against the CPU's F16C conversion, all 65536.
 *  2. top-k: attn_topk_indices against a full sort (ties, NaN, +-0, +-inf,
 *     long inputs); the k-th key (exact threshold) against a sort.
 *  3. kernel twins: every attn_*_ref against the twin of the level running
 *     (SPARQ_CPU; tests/test_cpu.c runs this at every level), odd sizes,
 *     f32, f16 and Q8_0 caches (tolerance 1e-5 relative to 1 + |value|, see
 *     test_twins; integer Q8_0 scores bit-identical); the fused
 *     SparQ pass (attn_kt_exp) also against a double softmax of naive
 *     logits, with maxima that keep rising and falling across blocks.
 *     3b. what each twin measured it read (attn_meter) == n*d or n*r, over
 *     odd shapes; test-only faulty kernels (a dropped tail, a doubled
 *     pass) are caught.
 *  4. policies vs naive double-precision loops written here (random inputs,
 *     S in {1,2,7,100,1000,4097}, d in {8,64,128}, g in {1,4}, f32 and f16;
 *     and S = 12289, where selections take their sampled-threshold paths).
 *  5. H2O over several decode steps with prefill scores, against a naive
 *     simulation of the eviction.
 *  6. golden vectors ../shared/golden/sparq/cases/{sparq,dense,exact_topk}.
 *  7. identities: SparQ k >= S == dense, oracle k >= S == dense, SparQ with
 *     r = d, l = 0, no realloc selects what the oracle selects; SparQ on a
 *     cache without K^T / v_sum computes the same.
 *  8. transfer counts: the elements the kernels measured == the formulas
 *     of docs/ALGORITHMS.md "Transfer formulas", written out here, over many (S, d, g, r, k) with odd tails.
 *  9. invalid parameters are rejected with a message.
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "attn/attn.h"
#include "util/paths.h"
#include "sparq_attn.h"
#include "test.h"

/* ---- small helpers -------------------------------------------------------- */

typedef struct rng { uint64_t s; } rng;

static uint64_t rng_next(rng *r)
{ /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_unif(rng *r) { return ((rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

static float rng_normal(rng *r)
{
    double u = rng_unif(r), v = rng_unif(r);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

/* Heavy-tailed queries, as real ones are (SparQ's premise): normal with a
 * few channels scaled up. */
static void fill_query(rng *r, float *q, int g, int d)
{
    int hot[4];
    for (int t = 0; t < 4; t++) hot[t] = (int)(rng_next(r) % (uint64_t)d);
    for (int h = 0; h < g; h++)
        for (int j = 0; j < d; j++) {
            float x = rng_normal(r);
            for (int t = 0; t < 4; t++)
                if (j == hot[t]) x *= 4.0f;
            q[h * d + j] = x;
        }
}

/* the library's conversions: bit-identical to F16C's (tests/test_quant.c
 * checks every half against the instructions) */
static int have_f16 = 1;
static float round_f16(float x) { return fp16_to_fp32(fp32_to_fp16(x)); }
static uint16_t to_f16(float x) { return fp32_to_fp16(x); }

/* The kernels of the level running (SPARQ_CPU or the CPU's best; the test
 * runs once per level, tests/test_cpu.c), compared with the reference's. */
static const attn_kernels *simd;
static int have_simd(void)
{
    if (!simd) simd = attn_kernels_at(cpu_level_get());
    return simd != &attn_kernels_ref;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Are the two index sets (any order) equal? Sorts both. */
static int same_set(int32_t *a, int64_t na, int32_t *b, int64_t nb)
{
    if (na != nb) return 0;
    qsort(a, (size_t)na, sizeof *a, cmp_i32);
    qsort(b, (size_t)nb, sizeof *b, cmp_i32);
    for (int64_t i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* Indices of x[0..n) ordered best first (value desc, index asc): the naive
 * ranking every selection here is checked against. */
static const double *sort_key;
static int cmp_rank(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    double x = sort_key[i], y = sort_key[j];
    if (x != y) return x > y ? -1 : 1;
    return (i > j) - (i < j);
}
static void rank_desc(const double *x, int64_t n, int32_t *order)
{
    for (int64_t i = 0; i < n; i++) order[i] = (int32_t)i;
    sort_key = x;
    qsort(order, (size_t)n, sizeof *order, cmp_rank);
}

/* Relative gap between the k-th and (k+1)-th best of x (1 if k >= n): a
 * selection this close to a tie is not a fair comparison between a double
 * reference and f32 kernels. */
static double rank_margin(const double *x, const int32_t *order, int64_t n, int64_t k)
{
    if (k >= n || k <= 0) return 1.0;
    double a = x[order[k - 1]], b = x[order[k]];
    return (a - b) / (fabs(a) + 1e-30);
}

/* ---- naive references (double) ---------------------------------------------- */

/* Softmax attention of every head over the positions set in `use` (NULL =
 * all S), out[g][d]; p_out (optional) gets the weights [g][S]. */
static void naive_attn(const float *q, const float *K, const float *V, int64_t S, int d, int g,
                       const char *use, double *out, double *p_out)
{
    double *s = malloc((size_t)S * sizeof *s);
    for (int h = 0; h < g; h++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < S; i++) {
            if (use && !use[i]) continue;
            double a = 0;
            for (int j = 0; j < d; j++) a += (double)q[h * d + j] * K[i * d + j];
            s[i] = a / sqrt((double)d);
            if (s[i] > mx) mx = s[i];
        }
        for (int64_t i = 0; i < S; i++) {
            if (use && !use[i]) { s[i] = 0; continue; }
            sum += (s[i] = exp(s[i] - mx));
        }
        for (int j = 0; j < d; j++) out[h * d + j] = 0;
        for (int64_t i = 0; i < S; i++) {
            s[i] /= sum;
            if (p_out) p_out[h * S + i] = s[i];
            if (s[i] == 0) continue;
            for (int j = 0; j < d; j++) out[h * d + j] += s[i] * V[i * d + j];
        }
    }
    free(s);
}

typedef struct naive_sparq_out {
    double *y;          /* [g][d] */
    char   *sel;        /* [S]    */
    int32_t *i1;        /* [r]    */
    double *alpha;      /* [g]    */
    double  margin;     /* min relative gap of the i1 / selection rankings */
} naive_sparq_out;

static void naive_sparq(const float *q, const float *K, const float *V, const double *vmean,
                        int64_t S, int d, int g, int r, int k, int l, int select_logits,
                        int no_realloc, naive_sparq_out *o)
{
    double *absq = calloc((size_t)d, sizeof *absq);
    int32_t *ord = malloc((size_t)(S > d ? S : d) * sizeof *ord);
    double *lg = malloc((size_t)g * S * sizeof *lg), *score = calloc((size_t)S, sizeof *score);
    for (int h = 0; h < g; h++)
        for (int j = 0; j < d; j++) absq[j] += fabs(q[h * d + j]);
    rank_desc(absq, d, ord);
    o->margin = rank_margin(absq, ord, d, r);
    for (int c = 0; c < r; c++) o->i1[c] = ord[c];
    for (int h = 0; h < g; h++) {
        double l1 = 0, l1s = 0;
        for (int j = 0; j < d; j++) l1 += fabs(q[h * d + j]);
        for (int c = 0; c < r; c++) l1s += fabs(q[h * d + o->i1[c]]);
        double tau = sqrt(d * l1s / l1), mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < S; i++) {
            double a = 0;
            for (int c = 0; c < r; c++) a += (double)q[h * d + o->i1[c]] * K[i * d + o->i1[c]];
            lg[h * S + i] = a / tau;
            if (select_logits) score[i] += lg[h * S + i];
            if (lg[h * S + i] > mx) mx = lg[h * S + i];
        }
        for (int64_t i = 0; i < S; i++) sum += (lg[h * S + i] = exp(lg[h * S + i] - mx));
        for (int64_t i = 0; i < S; i++) {
            lg[h * S + i] /= sum;
            if (!select_logits) score[i] += lg[h * S + i];
        }
    }
    memset(o->sel, 0, (size_t)S);
    if (k >= S) {
        memset(o->sel, 1, (size_t)S);
    } else {
        for (int64_t i = S - l; i < S; i++) o->sel[i] = 1;
        rank_desc(score, S - l, ord);
        double m = rank_margin(score, ord, S - l, k - l);
        if (m < o->margin) o->margin = m;
        for (int64_t j = 0; j < k - l; j++) o->sel[ord[j]] = 1;
    }
    naive_attn(q, K, V, S, d, g, o->sel, o->y, NULL);
    for (int h = 0; h < g; h++) {
        double a = 0;
        for (int64_t i = 0; i < S; i++)
            if (o->sel[i]) a += lg[h * S + i];
        if (k >= S || no_realloc) a = 1;
        o->alpha[h] = a;
        for (int j = 0; j < d; j++) o->y[h * d + j] = a * o->y[h * d + j] + (1 - a) * vmean[j];
    }
    free(absq); free(ord); free(lg); free(score);
}

/* Exact top-k by group-summed softmax weights; renorm or FlexGen. */
static double naive_topk(const float *q, const float *K, const float *V, int64_t S, int d, int g,
                         int k, int renorm, double *y, char *sel)
{
    double *P = malloc((size_t)g * S * sizeof *P), *score = calloc((size_t)S, sizeof *score);
    int32_t *ord = malloc((size_t)S * sizeof *ord);
    naive_attn(q, K, V, S, d, g, NULL, y, P);
    for (int h = 0; h < g; h++)
        for (int64_t i = 0; i < S; i++) score[i] += P[h * S + i];
    rank_desc(score, S, ord);
    double margin = rank_margin(score, ord, S, k);
    for (int64_t i = 0; i < S; i++) sel[i] = 0;
    for (int64_t j = 0; j < k && j < S; j++) sel[ord[j]] = 1;
    for (int h = 0; h < g; h++) {
        double mass = 0;
        for (int64_t i = 0; i < S; i++)
            if (sel[i]) mass += P[h * S + i];
        for (int j = 0; j < d; j++) {
            double a = 0;
            for (int64_t i = 0; i < S; i++)
                if (sel[i]) a += P[h * S + i] * V[i * d + j];
            y[h * d + j] = renorm ? a / mass : a;
        }
    }
    free(P); free(score); free(ord);
    return margin;
}

/* ---- 1. half floats ---------------------------------------------------------- */

#if defined(__x86_64__)
/* the instruction itself, whatever the baseline this file is compiled for */
__attribute__((target("f16c"))) static float hw_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
#else
#define hw_f16_to_f32 fp16_to_fp32 /* never reached: the test skips */
#endif

static void test_f16(void)
{
#if defined(__x86_64__)
    if (!cpu_features_get()->f16c) { test_skip("f16: no F16C to compare with"); return; }
#else
    test_skip("f16: no F16C to compare with");
    return;
#endif
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = attn_f16_to_f32((uint16_t)h), b = hw_f16_to_f32((uint16_t)h);
        uint32_t ba, bb;
        memcpy(&ba, &a, 4);
        memcpy(&bb, &b, 4);
        if (ba != bb && !(isnan(a) && isnan(b))) bad++;
    }
    CHECK(bad == 0, "%d half values convert differently from F16C", bad);
}

/* ---- 2. top-k ------------------------------------------------------------------ */

static void test_topk(void)
{
    rng r = { 7 };
    const int64_t ns[] = { 1, 2, 5, 17, 100, 1000, 2500, 9000, 40000, 100003 };
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int64_t n = ns[a];
        float *x = malloc((size_t)n * sizeof *x);
        double *xd = malloc((size_t)n * sizeof *xd);
        int32_t *idx = malloc((size_t)n * sizeof *idx), *work = malloc(attn_topk_work((size_t)n) * sizeof *work);
        int32_t *ord = malloc((size_t)n * sizeof *ord);
        for (int kind = 0; kind < 5; kind++) {
            static const float specials[] = { -0.0f, 0.0f, INFINITY, -INFINITY, 1.0f, -1.0f };
            for (int64_t i = 0; i < n; i++) {
                switch (kind) {
                case 0: x[i] = rng_normal(&r); break;
                case 1: x[i] = (float)(rng_next(&r) % 7); break;  /* many ties */
                case 2: x[i] = (float)i; break;                    /* sorted */
                case 3: x[i] = (i % 13 == 0) ? NAN : rng_normal(&r); break;
                default: x[i] = specials[rng_next(&r) % 6]; break; /* -0 ties +0 */
                }
                xd[i] = isnan(x[i]) ? -INFINITY : x[i];
            }
            rank_desc(xd, n, ord);
            const int64_t ks[] = { 1, 2, 3, 16, 96, 128, n / 16, n / 8, n - 1, n }; /* n/16, n/8: the sampled threshold */
            for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
                const int64_t k = ks[b];
                if (k < 1 || k > n) continue;
                attn_topk_indices(x, n, k, idx, work);
                int32_t *want = malloc((size_t)k * sizeof *want);
                memcpy(want, ord, (size_t)k * sizeof *want);
                CHECK(same_set(idx, k, want, k), "topk n=%lld k=%lld kind=%d", (long long)n,
                      (long long)k, kind);
                free(want);
            }
        }
        free(x); free(xd); free(idx); free(work); free(ord);
    }
}

static void test_topk_filter(void)
{
    if (!have_simd()) {
        test_skip("topk filter twin: no attention twins at SIMD level (SPARQ_CPU)");
        return;
    }
    rng r = { 3 };
    const int64_t ns[] = { 0, 1, 15, 16, 17, 100, 1001, 40000 };
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int64_t n = ns[a];
        float *x = malloc((size_t)(n + 1) * sizeof *x);
        int32_t *i1 = malloc((size_t)(n + 16) * sizeof *i1);
        int32_t *i2 = malloc((size_t)(n + 16) * sizeof *i2);
        uint32_t *k1 = malloc((size_t)(n + 16) * sizeof *k1), *k2 = malloc((size_t)(n + 16) * sizeof *k2);
        for (int64_t i = 0; i < n; i++) /* NaN, and -0 and +0 (one key) among them */
            x[i] = i % 11 == 5 ? NAN : i % 13 == 4 ? -0.0f : i % 13 == 9 ? 0.0f : rng_normal(&r);
        const float ts[] = { -INFINITY, -1.0f, 0.0f, 0.5f, 2.5f, 10.0f };
        for (int b = 0; b < 6; b++) {
            int64_t c1 = attn_topk_filter_ref(x, n, ts[b], i1, k1);
            int64_t c2 = simd->topk_filter(x, n, ts[b], i2, k2);
            CHECK(c1 == c2 && memcmp(i1, i2, (size_t)c1 * sizeof *i1) == 0,
                  "topk filter n=%lld t=%g: %lld vs %lld", (long long)n, ts[b], (long long)c1,
                  (long long)c2);
            /* the keys: each kept value's, here through a sort's order */
            int bad = 0;
            for (int64_t j = 0; j < c1 && j < c2; j++)
                bad += k1[j] != attn_topk_key(x[i1[j]]) || k2[j] != k1[j] ||
                       (j > 0 && (x[i1[j]] < x[i1[j - 1]]) != (k1[j] < k1[j - 1]));
            CHECK(bad == 0, "topk filter keys n=%lld t=%g: %d wrong", (long long)n, ts[b], bad);
        }
        free(x); free(i1); free(i2); free(k1); free(k2);
    }
}

/* attn_topk_above: both twins against a loop written here, with and
 * without a position map, at thresholds that keep none, some and all. */
static void test_topk_above(void)
{
    rng r = { 5 };
    const int64_t ms[] = { 0, 1, 15, 16, 17, 100, 1001, 40000 };
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++) {
        const int64_t m = ms[a];
        uint32_t *key = malloc((size_t)(m + 1) * sizeof *key);
        int32_t *pos = malloc((size_t)(m + 1) * sizeof *pos);
        int32_t *want = malloc((size_t)(m + 16) * sizeof *want), *got = malloc((size_t)(m + 16) * sizeof *got);
        for (int64_t j = 0; j < m; j++) {
            key[j] = (uint32_t)rng_next(&r) % 1000u * 4000000u; /* ties at every threshold */
            pos[j] = (int32_t)(3 * j + 7);
        }
        const uint32_t ts[] = { 0, 1000000000u, 2000000000u, 3996000000u, UINT32_MAX };
        for (int b = 0; b < 5; b++)
            for (int withpos = 0; withpos < 2; withpos++) {
                int64_t n = 0;
                for (int64_t j = 0; j < m; j++)
                    if (key[j] > ts[b]) want[n++] = withpos ? pos[j] : (int32_t)j;
                const int32_t *pm = withpos ? pos : NULL;
                int64_t c1 = attn_topk_above_ref(key, pm, m, ts[b], got);
                CHECK(c1 == n && memcmp(got, want, (size_t)n * sizeof *got) == 0,
                      "topk_above_ref m=%lld t=%u pos=%d: %lld vs %lld", (long long)m, ts[b], withpos,
                      (long long)c1, (long long)n);
                if (have_simd()) {
                    int64_t c2 = simd->topk_above(key, pm, m, ts[b], got);
                    CHECK(c2 == n && memcmp(got, want, (size_t)n * sizeof *got) == 0,
                          "topk_above %s m=%lld t=%u pos=%d: %lld vs %lld", cpu_level_name(cpu_level_get()),
                          (long long)m, ts[b], withpos, (long long)c2, (long long)n);
                }
            }
        free(key); free(pos); free(want); free(got);
    }
}

/* attn_topk_partition (both twins) against a count written here: the
 * sides hold exactly the keys above and below the pivot (compared sorted,
 * as their order is free), and nothing is written past them. */
static int cmp_u32_asc(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void test_topk_partition(void)
{
    rng r = { 31 };
    const int64_t ms[] = { 0, 1, 7, 8, 9, 15, 16, 17, 100, 1001 };
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++) {
        const int64_t m = ms[a];
        uint32_t *key = malloc((size_t)(m + 1) * sizeof *key), *want = malloc((size_t)(m + 1) * sizeof *key);
        uint32_t *out = malloc((size_t)(m + 1) * sizeof *out);
        for (int64_t j = 0; j < m; j++) key[j] = (uint32_t)rng_next(&r) % 7u * 0x2a000000u; /* ties */
        const uint32_t ps[] = { 0, 0x2a000000u, 0x7e000000u, 0x80000000u, 0xfc000000u, UINT32_MAX };
        for (int b = 0; b < 6; b++)
            for (int twin = 0; twin < 2; twin++) {
                if (twin && !have_simd()) continue;
                const uint32_t p = ps[b], poison = 0x5a5a5a5au;
                for (int64_t j = 0; j <= m; j++) out[j] = poison;
                int64_t n_lo = -1;
                const int64_t n_hi = twin ? simd->topk_partition(key, m, p, out, &n_lo)
                                          : attn_topk_partition_ref(key, m, p, out, &n_lo);
                int64_t want_hi = 0, want_lo = 0;
                for (int64_t j = 0; j < m; j++) {
                    want_hi += key[j] > p;
                    want_lo += key[j] < p;
                }
                int ok = n_hi == want_hi && n_lo == want_lo && out[m] == poison;
                for (int64_t j = n_hi; ok && j < m - n_lo; j++) ok = out[j] == poison;
                for (int side = 0; ok && side < 2; side++) {
                    int64_t c = 0;
                    for (int64_t j = 0; j < m; j++)
                        if (side ? key[j] < p : key[j] > p) want[c++] = key[j];
                    uint32_t *got = side ? out + m - n_lo : out;
                    qsort(want, (size_t)c, sizeof *want, cmp_u32_asc);
                    qsort(got, (size_t)c, sizeof *got, cmp_u32_asc);
                    ok = memcmp(got, want, (size_t)c * sizeof *got) == 0;
                }
                CHECK(ok, "topk_partition %s m=%lld p=%08x: %lld above, %lld below; want %lld, %lld",
                      twin ? cpu_level_name(cpu_level_get()) : "ref", (long long)m, p, (long long)n_hi,
                      (long long)n_lo, (long long)want_hi, (long long)want_lo);
            }
        free(key); free(want); free(out);
    }
}

/* attn_topk_kth_key (both twins) against a sort: the k-th largest key. */
static int cmp_u32_desc(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x < y) - (x > y);
}

/* attn_topk_kth_key (both twins) and attn_topk_kth_select (through the
 * running level's partition) against a sort, on keys spread, tied, narrow,
 * at the two ends, and in orders that trouble a quickselect's pivots
 * (increasing, decreasing, organ pipe); the select must leave its input
 * as it was. */
static void test_topk_kth(void)
{
    rng r = { 29 };
    const int64_t ms[] = { 1, 2, 15, 16, 17, 100, 1001, 5003 };
    for (size_t a = 0; a < sizeof ms / sizeof ms[0]; a++) {
        const int64_t m = ms[a];
        uint32_t *key = malloc((size_t)m * sizeof *key), *sorted = malloc((size_t)m * sizeof *key);
        uint32_t *copy = malloc((size_t)m * sizeof *key), *buf = malloc(2 * (size_t)m * sizeof *buf);
        for (int kind = 0; kind < 7; kind++) {
            for (int64_t i = 0; i < m; i++) {
                const uint64_t x = rng_next(&r);
                key[i] = kind == 0 ? (uint32_t)x                      /* spread */
                       : kind == 1 ? (uint32_t)(x % 5) * 0x40000000u  /* ties, extremes */
                       : kind == 2 ? 0x80000000u + (uint32_t)(x % 3)  /* narrow */
                       : kind == 3 ? (x & 1 ? UINT32_MAX : 0)         /* the two ends */
                       : kind == 4 ? (uint32_t)i * 977u               /* increasing */
                       : kind == 5 ? UINT32_MAX - (uint32_t)i * 977u  /* decreasing */
                                   : (uint32_t)(i < m / 2 ? i : m - i) * 31u; /* organ pipe */
            }
            memcpy(sorted, key, (size_t)m * sizeof *key);
            memcpy(copy, key, (size_t)m * sizeof *key);
            qsort(sorted, (size_t)m, sizeof *sorted, cmp_u32_desc);
            const int64_t ks[] = { 1, 2, m / 3, m / 2, m - 1, m };
            for (int b = 0; b < 6; b++) {
                const int64_t k = ks[b];
                if (k < 1 || k > m) continue;
                const uint32_t t0 = attn_topk_kth_select(key, m, k, buf, buf + m);
                CHECK(t0 == sorted[k - 1] && memcmp(key, copy, (size_t)m * sizeof *key) == 0,
                      "kth_select %s m=%lld k=%lld kind=%d: %u, want %u", cpu_level_name(cpu_level_get()),
                      (long long)m, (long long)k, kind, t0, sorted[k - 1]);
                if (m > 1001) continue; /* bisection: the shorter lengths show it */
                const uint32_t t1 = attn_topk_kth_key_ref(key, m, k);
                CHECK(t1 == sorted[k - 1], "kth_key_ref m=%lld k=%lld kind=%d: %u, want %u",
                      (long long)m, (long long)k, kind, t1, sorted[k - 1]);
                if (have_simd()) {
                    const uint32_t t2 = simd->topk_kth_key(key, m, k);
                    CHECK(t2 == sorted[k - 1], "kth_key %s m=%lld k=%lld kind=%d: %u, want %u",
                          cpu_level_name(cpu_level_get()), (long long)m, (long long)k, kind, t2, sorted[k - 1]);
                }
            }
        }
        free(key);
        free(sorted);
        free(copy);
        free(buf);
    }
}

/* ---- 3. kernel twins ----------------------------------------------------------- */

/* Tolerance 1e-5 relative to 1 + |value| per kernel: the twins sum in
 * different orders (16 lanes vs one accumulator) and the SIMD exp is within
 * ~2 ulp of expf. End to end (attn_gather_group) 3e-5: with scores of
 * magnitude ~20 (heavy-tailed queries) one ulp of a score moves its
 * softmax weight by ~2e-6 relative, and the output sums those. */

static double rel_diff(const float *a, const float *b, int64_t n)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(a[i] - b[i]) / (1 + fabs(a[i])));
    return e;
}

/* Worst relative difference of every twin pair on one random shape: n rows
 * (contiguous, then gathered from S = n + 5), r K^T components. Each kernel
 * pair gets identical inputs; *e_group gets the end-to-end difference of
 * attn_gather_group's twins, where score rounding passes through exp. */
static double twin_case(rng *r, int d, int64_t n, int g, int elem, double *e_group)
{
    const int64_t S = n + 5;
    const size_t nel = (size_t)S * d;
    const size_t krow = attn_kv_row_bytes(elem, d), ktrow = attn_kv_row_bytes(elem, S);
    uint8_t *K = malloc((size_t)S * krow), *V = malloc((size_t)S * krow), *KT = malloc((size_t)d * ktrow);
    if (elem == KV_Q8_0) { /* rows quantized as the cache stores them: K, V per head row, K^T per position row */
        float *x = malloc((size_t)(S > d ? S : d) * sizeof *x);
        for (int64_t i = 0; i < S; i++) {
            for (int j = 0; j < d; j++) x[j] = rng_normal(r);
            attn_q8_quantize_row(x, d, K + (size_t)i * krow);
            for (int j = 0; j < d; j++) x[j] = rng_normal(r);
            attn_q8_quantize_row(x, d, V + (size_t)i * krow);
        }
        for (int j = 0; j < d; j++) {
            for (int64_t i = 0; i < S; i++) x[i] = rng_normal(r);
            attn_q8_quantize_row(x, S, KT + (size_t)j * ktrow);
        }
        free(x);
    } else
        for (size_t i = 0; i < nel; i++) {
            const float k = rng_normal(r), v = rng_normal(r), kt = rng_normal(r);
            if (elem == KV_F16) {
                ((uint16_t *)K)[i] = to_f16(k);
                ((uint16_t *)V)[i] = to_f16(v);
                ((uint16_t *)KT)[i] = to_f16(kt);
            } else {
                ((float *)K)[i] = k;
                ((float *)V)[i] = v;
                ((float *)KT)[i] = kt;
            }
        }
    attn_kv_view kv = { S, d, elem, K, V, KT, S, NULL, NULL, NULL, 0, 0 };
    /* Q8_0 heads of a multiple of 64 take the integer kernels (attn.h): their
     * scores are bit-identical across twins; their softmax-weighted sums
     * quantize the weights, where an exp 2e-7 apart may move a code by one
     * (tests/test_kvq8.c bounds that against f32), so those are left out */
    const int q8i = attn_q8i_applies(&kv);
    const int nc = d < 33 ? d : 33;
    float *q = malloc((size_t)g * d * sizeof *q), *qs = malloc((size_t)g * nc * sizeof *qs);
    float *s1 = malloc((size_t)g * S * sizeof *s1), *s2 = malloc((size_t)g * S * sizeof *s2);
    float *o1 = malloc((size_t)g * d * sizeof *o1), *o2 = malloc((size_t)g * d * sizeof *o2);
    int32_t *rows = malloc((size_t)n * sizeof *rows), comp[33];
    fill_query(r, q, g, d);
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(rng_next(r) % (uint64_t)S);
    for (int t = 0; t < nc; t++) comp[t] = (int32_t)(rng_next(r) % (uint64_t)d);
    for (int t = 0; t < g * nc; t++) qs[t] = rng_normal(r);
    double e = 0;
    for (int use_rows = 0; use_rows < 2; use_rows++) {
        const int32_t *rw = use_rows ? rows : NULL;
        attn_scores_ref(&kv, q, g, rw, n, s1);
        simd->scores(&kv, q, g, rw, n, s2);
        if (q8i && memcmp(s1, s2, (size_t)g * n * sizeof *s1) != 0) e = INFINITY;
        e = fmax(e, rel_diff(s1, s2, g * n));
        memcpy(s2, s1, (size_t)g * n * sizeof *s1);
        attn_softmax_ref(s1, g, n);
        simd->softmax(s2, g, n);
        e = fmax(e, rel_diff(s1, s2, g * n));
        attn_weighted_sum_ref(&kv, s1, g, rw, n, o1);
        simd->weighted_sum(&kv, s1, g, rw, n, o2);
        e = fmax(e, rel_diff(o1, o2, (int64_t)g * d));
        if (q8i) continue;
        float lse1[32], lse2[32]; /* g <= 17 */
        attn_gather_group_ref(&kv, q, g, rw, n, o1, s1, lse1);
        simd->gather_group(&kv, q, g, rw, n, o2, s2, lse2);
        *e_group = fmax(*e_group, rel_diff(o1, o2, (int64_t)g * d));
        for (int h = 0; h < g; h++) /* absolute: a log-sum-exp near 0 */
            *e_group = fmax(*e_group, fabs(lse1[h] - lse2[h]) / (1 + fabs(lse1[h])));
    }
    for (int rr = 1; rr <= nc; rr += rr < 8 ? 1 : 8) { /* r = 1..8, 9, 17, 25, 33 */
        attn_kt_logits_ref(&kv, qs, comp, rr, g, S, s1);
        simd->kt_logits(&kv, qs, comp, rr, g, S, s2);
        e = fmax(e, rel_diff(s1, s2, g * S));
    }
    /* the softmax-weighted sum from scores (no weights stored) */
    for (int use_rows = 0; use_rows < 2 && !q8i; use_rows++) {
        const int32_t *rw = use_rows ? rows : NULL;
        attn_scores_ref(&kv, q, g, rw, n, s1);
        attn_softmax_weighted_sum_ref(&kv, s1, g, rw, n, o1, NULL);
        simd->softmax_weighted_sum(&kv, s1, g, rw, n, o2, NULL);
        e = fmax(e, rel_diff(o1, o2, (int64_t)g * d));
    }
    /* SparQ's fused pass (every output) and the group sum over its blocks */
    const int64_t nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    float *sc1 = malloc((size_t)g * nb * sizeof *sc1), *sc2 = malloc((size_t)g * nb * sizeof *sc2);
    float *l1 = malloc((size_t)S * sizeof *l1), *l2 = malloc((size_t)S * sizeof *l2);
    for (int rr = 1; rr <= nc; rr += rr < 2 ? 1 : 16) { /* r = 1, 2, 18 */
        const int with_lsum = rr != 2;
        attn_kt_exp_ref(&kv, qs, comp, rr, g, S, s1, sc1, with_lsum ? l1 : NULL);
        simd->kt_exp(&kv, qs, comp, rr, g, S, s2, sc2, with_lsum ? l2 : NULL);
        e = fmax(e, rel_diff(s1, s2, g * S));
        for (int64_t t = 0; t < g * nb; t++) /* relative: a scale is ~1/S */
            e = fmax(e, fabs(sc1[t] - sc2[t]) / (fabs(sc1[t]) + 1e-30));
        if (with_lsum) e = fmax(e, rel_diff(l1, l2, S));
        for (int64_t t = 0; t < g * nb; t++) sc1[t] = 0.5f + (float)rng_unif(r); /* any scales */
        attn_scaled_head_sum_ref(s1, sc1, g, S, S - 2, l1);
        simd->scaled_head_sum(s1, sc1, g, S, S - 2, l2);
        e = fmax(e, rel_diff(l1, l2, S - 2));
    }
    free(K); free(V); free(KT); free(q); free(qs); free(s1); free(s2); free(o1); free(o2);
    free(rows); free(sc1); free(sc2); free(l1); free(l2);
    return e;
}

static void test_twins(void)
{
    if (!have_simd()) {
        test_skip("kernel twins: no attention twins at SIMD level (SPARQ_CPU)");
        return;
    }
    rng r = { 11 };
    const int ds[] = { 1, 7, 16, 33, 64, 80, 100, 128, 256 };
    const int64_t ns[] = { 1, 3, 15, 17, 63, 65, 129, 1001 };
    const int gs[] = { 1, 3, 4, 5, 8, 17 };
    double worst = 0, worst_group = 0;
    for (size_t a = 0; a < sizeof ds / sizeof ds[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t c = 0; c < sizeof gs / sizeof gs[0]; c++)
                for (int elem = 0; elem < 3; elem++) {
                    if (elem == KV_F16 && !have_f16) continue;
                    double eg = 0;
                    const double e = twin_case(&r, ds[a], ns[b], gs[c], elem, &eg);
                    CHECK(e <= 1e-5 && eg <= 3e-5, "twins d=%d n=%lld g=%d elem=%d: max err %g, "
                          "group %g", ds[a], (long long)ns[b], gs[c], elem, e, eg);
                    worst = fmax(worst, e);
                    worst_group = fmax(worst_group, eg);
                }
    fprintf(stderr, "kernel twins: worst relative difference %.3g (tolerance 1e-5), "
            "gather_group %.3g (3e-5)\n", worst, worst_group);
    /* exp on its own: softmax of a spread of values against expf; below
     * e^-87 of the row's largest the weight is exactly 0, never a
     * subnormal (attn_avx512.h's exp_neg: Intel's assists) */
    float x[37], y[37];
    for (int i = 0; i < 37; i++) x[i] = y[i] = -110.0f + 3.0f * i;
    attn_softmax_ref(x, 1, 37);
    simd->softmax(y, 1, 37);
    double e = 0;
    int not_zero = 0, subnormal = 0;
    for (int i = 0; i < 37; i++) {
        subnormal += fpclassify(y[i]) == FP_SUBNORMAL;
        if (-110.0f + 3.0f * i - -2.0f >= -87.0f) e = fmax(e, fabs(x[i] - y[i]) / x[i]);
        else not_zero += y[i] != 0.0f;
    }
    CHECK(e <= 1e-6, "softmax over [-110, -2]: max relative err %g above e^-87", e);
    CHECK(not_zero == 0 && subnormal == 0, "softmax over [-110, -2]: %d weights not 0 below e^-87, %d subnormal",
          not_zero, subnormal);
}

/* ---- 3b. kernel meters ----------------------------------------------------------
 * Every kernel twin measures what it read into kv->meter: n rows of K or V
 * (n*d elements), or r rows of K^T over n positions (n*r). Checked exactly
 * for both twins over odd row counts, head sizes and group sizes, every
 * element type; a kernel whose loops skipped a tail or ran a block twice
 * would miss the count (meter_selftest shows the check catches both). */

typedef struct meter_want {
    int64_t k, v, kt;
} meter_want;

static int meter_is(const attn_meter *m, meter_want w)
{
    return m->k == w.k && m->v == w.v && m->kt == w.kt && m->v_sum == 0;
}

/* K, V and K^T of S rows (zeros: the counts do not depend on values). */
typedef struct meter_kv {
    attn_kv_view kv;
    attn_meter m;
    void *K, *V, *KT;
} meter_kv;

static int meter_kv_make(meter_kv *c, int64_t S, int d, int elem)
{
    const size_t row = attn_kv_row_bytes(elem, d), ktrow = attn_kv_row_bytes(elem, S);
    c->K = calloc((size_t)S, row);
    c->V = calloc((size_t)S, row);
    c->KT = calloc((size_t)d, ktrow + 64); /* + room for a tile's whole blocks */
    memset(&c->m, 0, sizeof c->m);
    attn_kv_view kv = { S, d, elem, c->K, c->V, c->KT, S, NULL, &c->m, NULL, 0, 0 };
    c->kv = kv;
    return c->K && c->V && c->KT;
}

static void meter_kv_free(meter_kv *c) { free(c->K); free(c->V); free(c->KT); }

typedef void (*scores_fn)(const attn_kv_view *, const float *, int, const int32_t *, int64_t, float *);
typedef void (*wsum_fn)(const attn_kv_view *, const float *, int, const int32_t *, int64_t, float *);
typedef void (*sws_fn)(const attn_kv_view *, const float *, int, const int32_t *, int64_t, float *, float *);
typedef void (*ktl_fn)(const attn_kv_view *, const float *, const int32_t *, int, int, int64_t, float *);
typedef void (*kte_fn)(const attn_kv_view *, const float *, const int32_t *, int, int, int64_t, float *,
                       float *, float *);
typedef void (*gather_fn)(const attn_kv_view *, const float *, int, const int32_t *, int64_t, float *,
                          float *, float *);

typedef struct twin_set {
    const char *name;
    scores_fn scores;
    wsum_fn wsum;
    sws_fn sws;
    ktl_fn ktl;
    kte_fn kte;
    gather_fn gather;
} twin_set;

/* One shape through one twin set; returns the number of wrong counts. */
static int meter_shape(const twin_set *t, int64_t n, int d, int g, int r, int elem, rng *rg)
{
    const int64_t S = n + 3;
    meter_kv c;
    int bad = 0;
    const int64_t nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    float *q = calloc((size_t)g * d, sizeof *q), *qs = calloc((size_t)g * r, sizeof *qs);
    float *s = calloc((size_t)g * S, sizeof *s), *o = calloc((size_t)g * d, sizeof *o);
    float *sc = calloc((size_t)g * nb, sizeof *sc), *ls = calloc((size_t)S, sizeof *ls);
    int32_t *rows = malloc((size_t)n * sizeof *rows), *comp = malloc((size_t)r * sizeof *comp);
    if (!meter_kv_make(&c, S, d, elem) || !q || !qs || !s || !o || !sc || !ls || !rows || !comp) {
        CHECK(0, "meter_shape: out of memory");
        goto done;
    }
    for (int64_t i = 0; i < n; i++) rows[i] = (int32_t)(rng_next(rg) % (uint64_t)S);
    for (int j = 0; j < r; j++) comp[j] = (int32_t)(rng_next(rg) % (uint64_t)d);
    for (int use_rows = 0; use_rows < 2; use_rows++) {
        const int32_t *rw = use_rows ? rows : NULL;
        memset(&c.m, 0, sizeof c.m);
        t->scores(&c.kv, q, g, rw, n, s);
        bad += !meter_is(&c.m, (meter_want){ n * d, 0, 0 });
        memset(&c.m, 0, sizeof c.m);
        t->wsum(&c.kv, s, g, rw, n, o);
        bad += !meter_is(&c.m, (meter_want){ 0, n * d, 0 });
        memset(&c.m, 0, sizeof c.m);
        t->sws(&c.kv, s, g, rw, n, o, NULL);
        bad += !meter_is(&c.m, (meter_want){ 0, n * d, 0 });
        memset(&c.m, 0, sizeof c.m);
        t->gather(&c.kv, q, g, rw, n, o, s, NULL);
        bad += !meter_is(&c.m, (meter_want){ n * d, n * d, 0 });
    }
    memset(&c.m, 0, sizeof c.m);
    t->ktl(&c.kv, qs, comp, r, g, S, s);
    bad += !meter_is(&c.m, (meter_want){ 0, 0, S * r });
    memset(&c.m, 0, sizeof c.m);
    t->kte(&c.kv, qs, comp, r, g, S, s, sc, ls);
    bad += !meter_is(&c.m, (meter_want){ 0, 0, S * r });
    if (bad)
        fprintf(stderr, "meter %s n=%lld d=%d g=%d r=%d elem=%d: %d wrong counts\n", t->name,
                (long long)n, d, g, r, elem, bad);
done:
    meter_kv_free(&c);
    free(q); free(qs); free(s); free(o); free(sc); free(ls); free(rows); free(comp);
    return bad;
}

/* Test-only faulty kernels: a gather whose weighted sum drops the tail of
 * the last 16 rows, and one that scores every row twice. The meter check
 * must reject both (so it is not an identity). */
static void gather_drops_tail(const attn_kv_view *kv, const float *q, int g, const int32_t *sel,
                              int64_t n, float *out, float *scratch, float *lse)
{
    (void)lse;
    attn_scores_ref(kv, q, g, sel, n, scratch);
    attn_softmax_ref(scratch, g, n);
    attn_weighted_sum_ref(kv, scratch, g, sel, n / 16 * 16, out);
}

static void gather_twice(const attn_kv_view *kv, const float *q, int g, const int32_t *sel,
                         int64_t n, float *out, float *scratch, float *lse)
{
    attn_scores_ref(kv, q, g, sel, n, scratch);
    attn_gather_group_ref(kv, q, g, sel, n, out, scratch, lse);
}

static void test_meters(void)
{
    rng rg = { 31 };
    twin_set sets[3] = {
        { "ref", attn_scores_ref, attn_weighted_sum_ref, attn_softmax_weighted_sum_ref,
          attn_kt_logits_ref, attn_kt_exp_ref, attn_gather_group_ref },
    };
    int n_sets = 1;
    /* every other level this CPU runs, whatever SPARQ_CPU chose */
    for (int l = CPU_REF + 1; l < CPU_LEVELS; l++) {
        const attn_kernels *k = attn_kernels_at((cpu_level)l);
        if (!cpu_level_supported((cpu_level)l) || k == &attn_kernels_ref) continue;
        sets[n_sets++] = (twin_set){ cpu_level_name((cpu_level)l), k->scores, k->weighted_sum,
                                     k->softmax_weighted_sum, k->kt_logits, k->kt_exp, k->gather_group };
    }
    if (n_sets == 1) test_skip("kernel meters: no attention twins at any SIMD level here (plain-C twins checked)");
    const int64_t ns[] = { 1, 2, 15, 17, 33, 63, 65, 257, 1001 };
    const int ds[] = { 1, 7, 16, 33, 64, 80, 128 };
    const int gs[] = { 1, 3, 4, 5, 8, 17, 65 };
    const int rs[] = { 1, 3, 16 };
    int shapes = 0;
    for (int t = 0; t < n_sets; t++)
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
            for (size_t b = 0; b < sizeof ds / sizeof ds[0]; b++)
                for (size_t c = 0; c < sizeof gs / sizeof gs[0]; c++)
                    for (int elem = 0; elem < 3; elem++) {
                        /* the big group only on a few shapes (time) */
                        if (gs[c] == 65 && (b % 3 || a % 2)) continue;
                        const int r = rs[(a + b + c) % 3] < ds[b] ? rs[(a + b + c) % 3] : ds[b];
                        CHECK(meter_shape(&sets[t], ns[a], ds[b], gs[c], r, elem, &rg) == 0,
                              "meter %s n=%lld d=%d g=%d r=%d elem=%d", sets[t].name,
                              (long long)ns[a], ds[b], gs[c], r, elem);
                        shapes++;
                    }
    fprintf(stderr, "kernel meters: %d shapes x %d twin sets, counts exact\n", shapes / n_sets, n_sets);

    /* the check catches a kernel that skips or doubles work */
    twin_set faulty[2] = { sets[0], sets[0] };
    faulty[0].name = "drops-tail";
    faulty[0].gather = gather_drops_tail;
    faulty[1].name = "twice";
    faulty[1].gather = gather_twice;
    for (int t = 0; t < 2; t++) {
        fprintf(stderr, "(a deliberately faulty kernel follows; its count must be wrong)\n");
        CHECK(meter_shape(&faulty[t], 37, 8, 2, 3, KV_F32, &rg) == 2,
              "meter check misses the %s gather", faulty[t].name);
    }
}

/* attn_kt_exp's contract against a double softmax of naive logits:
 * softmax(l_h)_i == scale[h][i / ATTN_EXP_BLOCK] * e[h][i] and lsum ==
 * sum_h l_h. K^T rows carry a trend (rising, then falling), so the running
 * maximum moves across blocks, and noise spikes on top. The kernel the
 * build dispatches to is checked (AVX-512 when compiled in), for g = 3 and
 * g = 65 (more heads than one pass keeps on the stack). */
static void kt_exp_case(rng *r, int64_t S, int g, int rr, int elem, double *worst)
{
    const int d = 24, nc = rr;
    const int64_t stride = S + 7; /* rows not a power of two apart, for variety */
    const size_t es = elem == KV_F16 ? 2 : 4;
    uint8_t *KT = calloc((size_t)d * stride, es);
    double *kt = malloc((size_t)d * S * sizeof *kt);
    for (int j = 0; j < d; j++)
        for (int64_t i = 0; i < S; i++) {
            const double trend = (i < S / 2 ? (double)i : (double)(S - i)) * 8.0 / (double)S;
            float x = (float)(0.3 * rng_normal(r) + trend * (j % 3 == 0 ? 1 : -0.5));
            if (rng_next(r) % 1000 == 0) x += 6.0f;
            if (elem == KV_F16) {
                ((uint16_t *)KT)[j * stride + i] = to_f16(x);
                x = round_f16(x);
            } else {
                ((float *)KT)[j * stride + i] = x;
            }
            kt[j * S + i] = x;
        }
    attn_kv_view kv = { S, d, elem, NULL, NULL, KT, stride, NULL, NULL, NULL, 0, 0 };
    int32_t comp[24];
    float *qs = malloc((size_t)g * nc * sizeof *qs);
    for (int c = 0; c < nc; c++) comp[c] = (c * 7) % d;
    for (int t = 0; t < g * nc; t++) qs[t] = rng_normal(r);
    const int64_t nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    float *e = malloc((size_t)g * S * sizeof *e), *sc = malloc((size_t)g * nb * sizeof *sc);
    float *ls = malloc((size_t)S * sizeof *ls);
    double *l = malloc((size_t)S * sizeof *l);
    attn_kt_exp(&kv, qs, comp, nc, g, S, e, sc, ls);
    double *lsum = calloc((size_t)S, sizeof *lsum);
    for (int h = 0; h < g; h++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < S; i++) {
            double a = 0;
            for (int c = 0; c < nc; c++) a += (double)qs[h * nc + c] * kt[comp[c] * S + i];
            l[i] = a;
            lsum[i] += a;
            mx = fmax(mx, a);
        }
        for (int64_t i = 0; i < S; i++) sum += exp(l[i] - mx);
        for (int64_t i = 0; i < S; i++) {
            const double got = (double)sc[h * nb + i / ATTN_EXP_BLOCK] * e[h * S + i];
            const double want = exp(l[i] - mx) / sum;
            *worst = fmax(*worst, fabs(got - want) / (want + 1e-3 / (double)S));
        }
    }
    for (int64_t i = 0; i < S; i++)
        *worst = fmax(*worst, fabs(ls[i] - lsum[i]) / (1 + fabs(lsum[i])));
    free(KT); free(kt); free(qs); free(e); free(sc); free(ls); free(l); free(lsum);
}

static void test_kt_exp(void)
{
    rng r = { 41 };
    double worst = 0;
    const int64_t Ss[] = { 1, 5, 255, 256, 257, 3001 };
    for (size_t a = 0; a < sizeof Ss / sizeof Ss[0]; a++)
        for (int elem = 0; elem < 2; elem++) {
            if (elem == KV_F16 && !have_f16) continue;
            kt_exp_case(&r, Ss[a], 3, 5, elem, &worst);
            if (Ss[a] > 256) kt_exp_case(&r, Ss[a], 65, 3, elem, &worst);
        }
    fprintf(stderr, "kt_exp vs double softmax: worst relative error %.3g (tolerance 1e-5)\n",
            worst);
    CHECK(worst <= 1e-5, "kt_exp: softmax rebuilt from e and scale off by %g", worst);
}

/* SparQ's score factors never make a subnormal (attn_exp.h, ATTN_SCORE_MIN):
 * logits spread over hundreds of nats (a steep trend across blocks and
 * within them) give probabilities far below FLT_MIN, yet every e and scale
 * the kernel and the reference write is 0 or >= 2^-63, so every product
 * and group sum is 0 or normal (on Intel each subnormal an FMA meets is a
 * microcode assist). The old kernels wrote them gradually underflowed. */
static void test_kt_exp_no_subnormal(void)
{
    enum { S = 2048, d = 8, g = 4, nc = 4 };
    const int64_t nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    float *KT = malloc((size_t)d * S * sizeof *KT), qs[g * nc], e[2][g * S], sc[2][g * nb], out[2][S];
    int32_t comp[nc];
    rng r = { 43 };
    for (int j = 0; j < d; j++)
        for (int64_t i = 0; i < S; i++) KT[j * S + i] = (float)(0.15 * (double)i + 3.0 * rng_normal(&r));
    for (int c = 0; c < nc; c++) comp[c] = 2 * c;
    for (int t = 0; t < g * nc; t++) qs[t] = (float)(0.25 + 0.1 * (t % 3)) * (t % 2 ? 1.0f : 0.5f);
    attn_kv_view kv = { S, d, KV_F32, NULL, NULL, (uint8_t *)KT, S, NULL, NULL, NULL, 0, 0 };
    int bad = 0, tiny = 0;
    for (int k = 0; k < 2; k++) {
        (k ? attn_kt_exp : attn_kt_exp_ref)(&kv, qs, comp, nc, g, S, e[k], sc[k], NULL);
        (k ? attn_scaled_head_sum : attn_scaled_head_sum_ref)(e[k], sc[k], g, S, S, out[k]);
        for (int h = 0; h < g; h++) {
            for (int64_t i = 0; i < S; i++) {
                const float x = e[k][h * S + i], p = x * sc[k][h * nb + i / ATTN_EXP_BLOCK];
                bad += (x != 0 && x < ATTN_SCORE_MIN) || fpclassify(p) == FP_SUBNORMAL;
                tiny += p == 0;
            }
            for (int64_t b = 0; b < nb; b++) bad += sc[k][h * nb + b] != 0 && sc[k][h * nb + b] < ATTN_SCORE_MIN;
        }
        for (int64_t i = 0; i < S; i++) bad += fpclassify(out[k][i]) == FP_SUBNORMAL;
    }
    CHECK(tiny > S, "kt_exp flush case: the logits should spread past 2^-126 (%d zero products)", tiny);
    CHECK(bad == 0, "kt_exp: %d score factors or products below the flush threshold or subnormal", bad);
    free(KT);
}

/* A K^T in two pieces (a cache over a shared prefix, attn.h) must give
 * exactly what the same columns in one piece give: the pieces' columns at
 * or past the split are poisoned in the first piece (NaN), so a kernel
 * reading the wrong piece cannot pass. Every element type, the dispatched
 * kernel and the plain-C twin, both SparQ K^T passes. */
static void kt_split_case(rng *r, int64_t S, int elem, int *bad)
{
    const int d = 16, g = 3, nc = 5;
    const int64_t stride = S + 37, split = S / ATTN_EXP_BLOCK * ATTN_EXP_BLOCK;
    const size_t rb = attn_kv_row_bytes(elem, stride), pre = attn_kv_row_bytes(elem, split);
    const int64_t tstride = stride - split;
    const size_t trb = attn_kv_row_bytes(elem, tstride);
    uint8_t *whole = calloc((size_t)d, rb), *head = malloc((size_t)d * rb), *tail = malloc((size_t)d * trb);
    float *x = malloc((size_t)stride * sizeof *x);
    for (int j = 0; j < d; j++) {
        for (int64_t i = 0; i < stride; i++) x[i] = i < S ? rng_normal(r) : 0.0f;
        uint8_t *row = whole + (size_t)j * rb;
        for (int64_t i = 0; i < stride; i++) {
            if (elem == KV_F32) memcpy(row + 4 * i, &x[i], 4);
            else if (elem == KV_F16) { const uint16_t h = to_f16(x[i]); memcpy(row + 2 * i, &h, 2); }
        }
        if (elem == KV_Q8_0) attn_q8_quantize_row(x, stride, row);
        memcpy(head + (size_t)j * rb, row, rb);
        memcpy(tail + (size_t)j * trb, row + pre, trb);
        uint8_t *h = head + (size_t)j * rb;
        if (elem == KV_Q8_0) { /* every block's scale from the split on: NaN */
            for (size_t o = pre; o + ATTN_Q8_BLOCK_BYTES <= rb; o += ATTN_Q8_BLOCK_BYTES) h[o] = 0x00, h[o + 1] = 0x7e;
        } else if (elem == KV_F16) {
            for (int64_t i = split; i < stride; i++) h[2 * i] = 0x00, h[2 * i + 1] = 0x7e;
        } else {
            const float nan = NAN;
            for (int64_t i = split; i < stride; i++) memcpy(h + 4 * i, &nan, 4);
        }
    }
    attn_kv_view one = { S, d, elem, NULL, NULL, whole, stride, NULL, NULL, NULL, 0, 0 };
    attn_kv_view two = { S, d, elem, NULL, NULL, head, stride, NULL, NULL, tail, split, tstride };
    int32_t comp[8];
    float qs[3 * 8];
    for (int c = 0; c < nc; c++) comp[c] = (c * 5 + 3) % d;
    for (int t = 0; t < g * nc; t++) qs[t] = rng_normal(r);
    const int64_t nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    const size_t ne = (size_t)g * S, ns = (size_t)g * nb;
    float *e[2], *sc[2], *ls[2], *lg[2];
    for (int k = 0; k < 2; k++) {
        e[k] = malloc(ne * 4), sc[k] = malloc(ns * 4), ls[k] = malloc((size_t)S * 4), lg[k] = malloc(ne * 4);
    }
    for (int twin = 0; twin < 2; twin++) {
        for (int k = 0; k < 2; k++) {
            const attn_kv_view *v = k ? &two : &one;
            if (twin) {
                attn_kt_exp_ref(v, qs, comp, nc, g, S, e[k], sc[k], ls[k]);
                attn_kt_logits_ref(v, qs, comp, nc, g, S, lg[k]);
            } else {
                attn_kt_exp(v, qs, comp, nc, g, S, e[k], sc[k], ls[k]);
                attn_kt_logits(v, qs, comp, nc, g, S, lg[k]);
            }
        }
        if (memcmp(e[0], e[1], ne * 4) || memcmp(sc[0], sc[1], ns * 4) || memcmp(ls[0], ls[1], (size_t)S * 4) ||
            memcmp(lg[0], lg[1], ne * 4)) {
            fprintf(stderr, "  split K^T differs: S %lld, elem %d, %s\n", (long long)S, elem, twin ? "plain C" : "dispatched");
            (*bad)++;
        }
    }
    for (int k = 0; k < 2; k++) { free(e[k]); free(sc[k]); free(ls[k]); free(lg[k]); }
    free(whole); free(head); free(tail); free(x);
}

static void test_kt_split(void)
{
    rng r = { 43 };
    int bad = 0, cases = 0;
    const int64_t Ss[] = { 256, 300, 511, 512, 1000, 2049 };
    for (size_t a = 0; a < sizeof Ss / sizeof Ss[0]; a++)
        for (int elem = 0; elem < 3; elem++) {
            if (elem == KV_F16 && !have_f16) continue;
            kt_split_case(&r, Ss[a], elem, &bad);
            cases++;
        }
    fprintf(stderr, "kt split: %d of %d cases differ from one piece\n", bad, cases);
    CHECK(bad == 0, "kt split: K^T in two pieces differs from one piece in %d cases", bad);
}

/* ---- 4. policies against the naive loops ----------------------------------------- */

typedef struct case_data {
    int64_t S;
    int d, g, elem;
    float *q, *K, *V;   /* K, V already rounded to f16 when elem == f16 */
    double *vmean;
} case_data;

static void case_make(case_data *c, rng *r, int64_t S, int d, int g, int elem)
{
    c->S = S; c->d = d; c->g = g; c->elem = elem;
    c->q = malloc((size_t)g * d * sizeof *c->q);
    c->K = malloc((size_t)S * d * sizeof *c->K);
    c->V = malloc((size_t)S * d * sizeof *c->V);
    c->vmean = calloc((size_t)d, sizeof *c->vmean);
    fill_query(r, c->q, g, d);
    for (int64_t i = 0; i < S * d; i++) {
        c->K[i] = rng_normal(r);
        c->V[i] = rng_normal(r);
        if (elem == KV_F16) {
            c->K[i] = round_f16(c->K[i]);
            c->V[i] = round_f16(c->V[i]);
        }
    }
    for (int64_t i = 0; i < S; i++)
        for (int j = 0; j < d; j++) c->vmean[j] += c->V[i * d + j] / (double)S;
}

static void case_free(case_data *c) { free(c->q); free(c->K); free(c->V); free(c->vmean); }

typedef struct run_out {
    float *y, *alpha;
    int32_t *sel, *i1;
    int64_t n_sel, elements;
    int rc;
    char err[256];
} run_out;

static void run_policy(const case_data *c, const sparq_attn_params *p, run_out *o)
{
    o->y = malloc((size_t)c->g * c->d * sizeof *o->y);
    o->alpha = malloc((size_t)c->g * sizeof *o->alpha);
    o->sel = malloc((size_t)c->S * sizeof *o->sel);
    o->i1 = malloc((size_t)c->d * sizeof *o->i1);
    o->err[0] = 0;
    sparq_attn_io io = { .kv_type = c->elem == KV_F16 ? SPARQ_KV_F16 : SPARQ_KV_F32, .S = c->S,
                         .d = c->d, .g = c->g, .q = c->q, .K = c->K, .V = c->V, .out = o->y,
                         .sel = o->sel, .i1 = o->i1, .alpha = o->alpha };
    o->rc = sparq_attn_run(p, &io, o->err, sizeof o->err);
    o->n_sel = io.n_sel;
    o->elements = io.elements;
}

static void run_free(run_out *o) { free(o->y); free(o->alpha); free(o->sel); free(o->i1); }

static double max_err(const float *a, const double *b, int64_t n)
{
    double e = 0;
    for (int64_t i = 0; i < n; i++) e = fmax(e, fabs(a[i] - b[i]));
    return e;
}

static int sel_matches(const run_out *o, const char *want, int64_t S)
{
    int64_t n = 0;
    for (int64_t i = 0; i < S; i++) n += want[i] != 0;
    if (n != o->n_sel) return 0;
    for (int64_t j = 0; j < o->n_sel; j++)
        if (o->sel[j] < 0 || o->sel[j] >= S || !want[o->sel[j]]) return 0;
    return 1;
}

static sparq_attn_params params(const char *policy, int r, int k, int l)
{
    sparq_attn_params p;
    memset(&p, 0, sizeof p);
    p.policy = policy;
    p.r = r; p.k = k; p.l = l;
    return p;
}

/* Selections whose k-th and (k+1)-th scores are within 2e-5 (relative) are
 * not compared: f32 kernels may legitimately order them differently from
 * the double reference. Counted and bounded. */
static int n_close_calls, n_sel_calls;

static void check_case(const case_data *c, const char *tag)
{
    const int64_t S = c->S;
    const int d = c->d, g = c->g;
    double *y = malloc((size_t)g * d * sizeof *y);
    char *sel = malloc((size_t)S);
    const double tol = 1e-5;

    /* dense */
    {
        sparq_attn_params p = params("dense", 0, 0, -1);
        run_out o;
        run_policy(c, &p, &o);
        naive_attn(c->q, c->K, c->V, S, d, g, NULL, y, NULL);
        CHECK(o.rc == 0 && max_err(o.y, y, (int64_t)g * d) <= tol, "%s dense: err %g (%s)", tag,
              max_err(o.y, y, (int64_t)g * d), o.err);
        run_free(&o);
    }
    /* sparq: a few (r, k, l, select, realloc) per shape */
    const int rs[] = { 1, d / 4 > 0 ? d / 4 : 1, d };
    /* k = 2000: the selection spans every part of a long step (and is all
     * of a short one) */
    const int kl[][2] = { { 1, 0 }, { 16, 4 }, { 16, 0 }, { 128, 32 }, { 4, 4 }, { 2000, 500 } };
    for (size_t a = 0; a < 3; a++)
        for (size_t b = 0; b < 6; b++)
            for (int variant = 0; variant < 3; variant++) {
                const int r = rs[a], k = kl[b][0], l = kl[b][1];
                if (variant && !(a == 1 && b == 1)) continue; /* variants on one setting */
                sparq_attn_params p = params("sparq", r, k, l);
                p.select_logits = variant == 1;
                p.no_realloc = variant == 2;
                naive_sparq_out n;
                n.y = y; n.sel = sel;
                n.i1 = malloc((size_t)d * sizeof *n.i1);
                n.alpha = malloc((size_t)g * sizeof *n.alpha);
                naive_sparq(c->q, c->K, c->V, c->vmean, S, d, g, r, k, l, p.select_logits,
                            p.no_realloc, &n);
                n_sel_calls++;
                if (n.margin < 2e-5) {
                    n_close_calls++;
                } else {
                    run_out o;
                    run_policy(c, &p, &o);
                    double e = max_err(o.y, y, (int64_t)g * d), ea = max_err(o.alpha, n.alpha, g);
                    CHECK(o.rc == 0 && e <= tol && ea <= tol && sel_matches(&o, sel, S),
                          "%s sparq r=%d k=%d l=%d v=%d: y err %g alpha err %g n_sel %lld (%s)",
                          tag, r, k, l, variant, e, ea, (long long)o.n_sel, o.err);
                    CHECK(same_set(o.i1, r, n.i1, r), "%s sparq r=%d: i1 differs", tag, r);
                    run_free(&o);
                }
                free(n.i1);
                free(n.alpha);
            }
    /* oracle and flexgen */
    const int ks[] = { 1, 5, 64 };
    for (int renorm = 0; renorm < 2; renorm++)
        for (size_t a = 0; a < 3; a++) {
            sparq_attn_params p = params(renorm ? "oracle" : "flexgen", 0, ks[a], -1);
            double m = naive_topk(c->q, c->K, c->V, S, d, g, ks[a], renorm, y, sel);
            n_sel_calls++;
            if (m < 2e-5) { n_close_calls++; continue; }
            run_out o;
            run_policy(c, &p, &o);
            double e = max_err(o.y, y, (int64_t)g * d);
            CHECK(o.rc == 0 && e <= tol && sel_matches(&o, sel, S), "%s %s k=%d: err %g (%s)", tag,
                  p.policy, ks[a], e, o.err);
            run_free(&o);
        }
    /* streaming: first n_sink + most recent */
    const int sk[][2] = { { 4, 2 }, { 20, 16 }, { 3, 16 }, { 128, 0 } };
    for (size_t a = 0; a < 4; a++) {
        sparq_attn_params p = params("streaming", 0, sk[a][0], -1);
        p.n_sink = sk[a][1];
        const int64_t k = sk[a][0], sinks0 = sk[a][1] ? sk[a][1] : 16;
        const int64_t sinks = sinks0 < k ? sinks0 : k - 1;
        memset(sel, 0, (size_t)S);
        for (int64_t i = 0; i < S; i++)
            sel[i] = k >= S || i < sinks || i >= S - (k - sinks);
        naive_attn(c->q, c->K, c->V, S, d, g, sel, y, NULL);
        run_out o;
        run_policy(c, &p, &o);
        double e = max_err(o.y, y, (int64_t)g * d);
        CHECK(o.rc == 0 && e <= tol && sel_matches(&o, sel, S), "%s streaming k=%lld: err %g", tag,
              (long long)k, e);
        run_free(&o);
    }
    free(y);
    free(sel);
}

static void test_policies_naive(void)
{
    rng r = { 2024 };
    const int64_t Ss[] = { 1, 2, 7, 100, 1000, 4097 };
    const int ds[] = { 8, 64, 128 };
    const int gs[] = { 1, 4 };
    int n_cases = 0;
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t c = 0; c < 2; c++)
                for (int elem = 0; elem < 3; elem++) {
                    if (elem == KV_F16 && !have_f16) continue;
                    /* sanitizer runs: the biggest shapes only in f32 */
                    if (test_quick() && Ss[a] > 1000 && (elem == KV_F16 || ds[b] > 64)) continue;
                    case_data cd;
                    case_make(&cd, &r, Ss[a], ds[b], gs[c], elem);
                    char tag[64];
                    snprintf(tag, sizeof tag, "S=%lld d=%d g=%d %s", (long long)Ss[a], ds[b], gs[c],
                             elem ? "f16" : "f32");
                    check_case(&cd, tag);
                    case_free(&cd);
                    n_cases++;
                }
    /* long enough for the sampled selection paths (S - l > 8192) */
    for (int elem = 0; elem < 2; elem++) {
        if (elem == KV_F16 && (!have_f16 || test_quick())) continue;
        case_data cd;
        case_make(&cd, &r, 12289, 32, 4, elem);
        check_case(&cd, elem ? "S=12289 d=32 g=4 f16" : "S=12289 d=32 g=4 f32");
        case_free(&cd);
        n_cases++;
    }
    if (!have_f16) test_skip("policies: f16 cases (no F16C to round with)");
    fprintf(stderr, "policies vs naive: %d shapes, %d of %d selections skipped as near-ties\n",
            n_cases, n_close_calls, n_sel_calls);
    CHECK(n_close_calls * 50 <= n_sel_calls, "too many near-tie skips: %d of %d", n_close_calls,
          n_sel_calls);
}

/* ---- 5. H2O over several steps ------------------------------------------------------ */

/* Naive H2O: scores in double, alive flags; one decode step at S. */
static void naive_h2o_step(const float *q, const float *K, const float *V, int64_t S, int d, int g,
                           int k, int l, double *score, char *alive, double *y, char *kept)
{
    alive[S - 1] = 1;
    score[S - 1] = 0;
    memset(kept, 0, (size_t)S);
    const int64_t ws = S - (l < S ? l : S);
    int64_t n = 0, nc = 0;
    for (int64_t i = ws; i < S; i++)
        if (alive[i]) { kept[i] = 1; n++; }
    double *cs = malloc((size_t)S * sizeof *cs);
    int32_t *ord = malloc((size_t)S * sizeof *ord);
    for (int64_t i = 0; i < ws; i++) cs[i] = alive[i] ? score[i] : -INFINITY;
    for (int64_t i = 0; i < ws; i++) nc += alive[i];
    rank_desc(cs, ws, ord);
    for (int64_t j = 0; j < k - n && j < nc; j++) kept[ord[j]] = 1;
    double *P = malloc((size_t)g * S * sizeof *P);
    naive_attn(q, K, V, S, d, g, kept, y, P);
    for (int64_t i = 0; i < S; i++) {
        if (kept[i]) {
            double a = 0;
            for (int h = 0; h < g; h++) a += P[h * S + i];
            score[i] += a / g;
        } else {
            alive[i] = 0;
        }
    }
    free(cs); free(ord); free(P);
}

static void test_h2o_steps(void)
{
    const attn_policy *pol = attn_policy_find("h2o");
    CHECK(pol != NULL, "h2o registered");
    if (!pol) return;
    rng r = { 99 };
    const int S0 = 300, T = 40;
    /* k, l, d, g: GQA and not, window sizes 0..k, k beyond S */
    const int kls[][4] = { { 64, -1, 64, 4 }, { 32, 0, 128, 1 }, { 400, -1, 8, 4 },
                           { 16, 16, 64, 1 }, { 40, 3, 64, 4 } };
    for (int elem = 0; elem < 2; elem++)
        for (size_t a = 0; a < sizeof kls / sizeof kls[0]; a++) {
            if (elem == KV_F16 && !have_f16) continue;
            const int d = kls[a][2], g = kls[a][3];
            const int64_t Smax = S0 + T;
            sparq_attn_params p = params("h2o", 0, kls[a][0], kls[a][1]);
            char err[128];
            CHECK(pol->resolve(&p, d, err, sizeof err) == 0, "h2o resolve: %s", err);
            attn_shape shape = { 2, 2, g, d, Smax };
            void *state = NULL;
            CHECK(pol->state_create(&p, &shape, &state) == 0, "h2o state");
            float *K = malloc((size_t)Smax * d * sizeof *K);
            float *V = malloc((size_t)Smax * d * sizeof *V);
            uint16_t *Kh = malloc((size_t)Smax * d * 2), *Vh = malloc((size_t)Smax * d * 2);
            for (int64_t i = 0; i < Smax * d; i++) {
                K[i] = rng_normal(&r);
                V[i] = rng_normal(&r);
                if (elem == KV_F16) {
                    Kh[i] = to_f16(K[i]); K[i] = round_f16(K[i]);
                    Vh[i] = to_f16(V[i]); V[i] = round_f16(V[i]);
                }
            }
            /* prefill scores: colsum of a causal prefill (as the model reports) */
            float *colsum = calloc((size_t)S0, sizeof *colsum);
            double *score = calloc((size_t)Smax, sizeof *score);
            double *y = malloc((size_t)g * d * sizeof *y);
            char *alive = calloc((size_t)Smax, 1), *kept = malloc((size_t)Smax);
            float *q = malloc((size_t)g * d * sizeof *q);
            for (int t = 0; t < S0; t += 7) { /* a subset of rows keeps it quick */
                fill_query(&r, q, g, d);
                double *P = malloc((size_t)g * (t + 1) * sizeof *P);
                naive_attn(q, K, V, t + 1, d, g, NULL, y, P);
                for (int h = 0; h < g; h++)
                    for (int i = 0; i <= t; i++) colsum[i] += (float)P[h * (t + 1) + i];
                free(P);
            }
            for (int64_t i = 0; i < S0; i++) {
                score[i] = colsum[i] / (double)g;
                alive[i] = 1;
            }
            attn_kv_view kv = { S0, d, elem, elem ? (void *)Kh : (void *)K,
                                elem ? (void *)Vh : (void *)V, NULL, 0, NULL, NULL, NULL, 0, 0 };
            pol->observe_prefill(state, &p, 1, 1, &kv, colsum);
            const size_t nscr = pol->scratch_floats(&p, Smax, d, g);
            attn_scratch scr = { aligned_alloc(64, attn_pad16(nscr) * 4), nscr,
                                 aligned_alloc(64, attn_pad16(nscr) * 4), NULL, 0 };
            float *out = malloc((size_t)g * d * sizeof *out);
            int32_t *tsel = malloc((size_t)Smax * sizeof *tsel);
            int ok_y = 1, ok_sel = 1, ok_cnt = 1;
            double worst = 0;
            for (int t = 1; t <= T; t++) {
                const int64_t S = S0 + t;
                fill_query(&r, q, g, d);
                kv.S = S;
                attn_counts cnt = { 0, 0 };
                attn_trace tr = { tsel, 0, NULL, 0, NULL };
                ok_y &= pol->attend(state, &p, &(attn_step){ 1, 1, &kv, q, g, out, &scr, &cnt, &tr }) == 0;
                naive_h2o_step(q, K, V, S, d, g, p.k, p.l, score, alive, y, kept);
                run_out o = { .sel = tsel, .n_sel = tr.n_sel };
                ok_sel &= sel_matches(&o, kept, S);
                worst = fmax(worst, max_err(out, y, (int64_t)g * d));
                ok_y &= max_err(out, y, (int64_t)g * d) <= 1e-5;
                ok_cnt &= cnt.read + cnt.written == pol->transfer_formula(&p, S, d, g);
            }
            CHECK(ok_y && ok_sel && ok_cnt,
                  "h2o k=%d l=%d d=%d g=%d elem=%d: y ok %d (worst %g) sel ok %d counts ok %d",
                  p.k, p.l, d, g, elem, ok_y, worst, ok_sel, ok_cnt);
            pol->state_free(state);
            free(K); free(V); free(Kh); free(Vh); free(colsum); free(score); free(y); free(alive);
            free(kept); free(q); free(scr.f); free(scr.i); free(out); free(tsel);
        }
}

/* ---- 6. golden vectors --------------------------------------------------------------- */

/* Minimal manifest reading: the integer after "key": (first occurrence
 * after `from`), a string value, an integer list. */
static const char *json_find(const char *js, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = strstr(js, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ' || *p == ':' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}

static long json_int(const char *js, const char *key, long def)
{
    const char *p = json_find(js, key);
    if (!p || (*p != '-' && (*p < '0' || *p > '9'))) return def;
    return strtol(p, NULL, 10);
}

static int json_int_list(const char *js, const char *key, long *out, int max)
{
    const char *p = json_find(js, key);
    if (!p || *p != '[') return 0;
    p++;
    int n = 0;
    while (n < max) {
        while (*p == ' ' || *p == '\n' || *p == ',' || *p == '\r' || *p == '\t') p++;
        if (*p == ']' || !*p) break;
        char *end;
        out[n++] = strtol(p, &end, 10);
        if (end == p) break;
        p = end;
    }
    return n;
}

static void json_mask_type(const char *js, char *out, size_t n)
{
    out[0] = 0;
    const char *m = json_find(js, "mask");
    if (!m) return;
    const char *p = json_find(m, "type");
    if (!p || *p != '"') return;
    p++;
    size_t i = 0;
    while (*p && *p != '"' && i + 1 < n) out[i++] = *p++;
    out[i] = 0;
}

static void *load_arr(const char *dir, const char *name, size_t want_elems)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n;
    void *buf = test_read_file(path, &n);
    if (!buf || n != want_elems * 4) {
        free(buf);
        return NULL;
    }
    return buf;
}

static int close_rel(float a, float b) { return fabsf(a - b) <= 1e-5f + 1e-5f * fabsf(b); }

static void golden_sparq(const char *dir, const char *js, int *n_ok)
{
    const long B = json_int(js, "batch", 0), H = json_int(js, "n_kv_heads", 0);
    const long g = json_int(js, "group_size", 0), d = json_int(js, "head_size", 0);
    const long S = json_int(js, "seq_len", 0), r = json_int(js, "r", 0), k = json_int(js, "k", 0);
    char mt[32];
    json_mask_type(js, mt, sizeof mt);
    long vl[16];
    int nvl = json_int_list(js, "valid_len", vl, 16);
    if (B < 1 || H < 1 || g < 1 || d < 1 || S < 1 || r < 1 || k < 1 || B > 16) {
        CHECK(0, "%s: manifest unreadable", dir);
        return;
    }
    if (strcmp(mt, "none") && strcmp(mt, "zero") && !(strcmp(mt, "suffix") == 0 && nvl == B)) {
        char why[1600];
        snprintf(why, sizeof why, "%s: mask '%s' is not a suffix", dir, mt);
        test_skip(why);
        return;
    }
    float *Q = load_arr(dir, "Q.f32", B * H * g * d), *K = load_arr(dir, "K.f32", B * H * S * d);
    float *V = load_arr(dir, "V.f32", B * H * S * d), *Vm = load_arr(dir, "V_mean.f32", B * H * d);
    float *Y = load_arr(dir, "y.f32", B * H * g * d), *A = load_arr(dir, "alpha.f32", B * H * g);
    int32_t *I1 = load_arr(dir, "i1.i32", B * H * r), *I2 = load_arr(dir, "i2.i32", B * H * k);
    if (!Q || !K || !V || !Vm || !Y || !A || !I1 || !I2) {
        CHECK(0, "%s: missing or short arrays", dir);
    } else {
        sparq_attn_params p = params("sparq", (int)r, (int)k, 0);
        float *out = malloc(g * d * sizeof *out), alpha[8];
        int32_t *sel = malloc(S * sizeof *sel), *i1 = malloc(d * sizeof *i1);
        int32_t *want = malloc((k > r ? k : r) * sizeof *want);
        int ok = 1;
        for (long b = 0; b < B; b++)
            for (long h = 0; h < H; h++) {
                const long bh = b * H + h, Se = strcmp(mt, "suffix") == 0 ? vl[b] : S;
                int64_t n_sel = 0;
                char err[256] = "";
                sparq_attn_io io = { .kv_type = SPARQ_KV_F32, .S = Se, .d = (int)d, .g = (int)g,
                                     .q = Q + bh * g * d, .K = K + bh * S * d, .V = V + bh * S * d,
                                     .v_mean = Vm + bh * d, .out = out, .sel = sel, .i1 = i1,
                                     .alpha = alpha };
                int rc = sparq_attn_run(&p, &io, err, sizeof err);
                n_sel = io.n_sel;
                if (rc) { CHECK(0, "%s: %s", dir, err); ok = 0; continue; }
                for (long t = 0; t < g * d; t++)
                    if (!close_rel(out[t], Y[bh * g * d + t])) {
                        CHECK(0, "%s b=%ld h=%ld y[%ld]=%.9g want %.9g", dir, b, h, t, out[t],
                              Y[bh * g * d + t]);
                        ok = 0;
                        break;
                    }
                for (long t = 0; t < g; t++)
                    if (!close_rel(alpha[t], A[bh * g + t])) {
                        CHECK(0, "%s b=%ld h=%ld alpha=%.9g want %.9g", dir, b, h, alpha[t],
                              A[bh * g + t]);
                        ok = 0;
                    }
                memcpy(want, I1 + bh * r, r * sizeof *want);
                if (!same_set(i1, r, want, r)) {
                    CHECK(0, "%s b=%ld h=%ld: i1 differs", dir, b, h);
                    ok = 0;
                }
                /* i2 restricted to the unmasked positions we ran on */
                long nw = 0;
                for (long t = 0; t < k; t++)
                    if (I2[bh * k + t] < Se) want[nw++] = I2[bh * k + t];
                if (!same_set(sel, n_sel, want, nw)) {
                    CHECK(0, "%s b=%ld h=%ld: i2 differs", dir, b, h);
                    ok = 0;
                }
            }
        CHECK(ok, "%s", dir);
        *n_ok += ok;
        free(out); free(sel); free(i1); free(want);
    }
    free(Q); free(K); free(V); free(Vm); free(Y); free(A); free(I1); free(I2);
}

static void golden_topk(const char *dir, const char *js, int *n_ok)
{
    const long B = json_int(js, "batch", 0), H = json_int(js, "n_kv_heads", 0);
    const long g = json_int(js, "group_size", 0), d = json_int(js, "head_size", 0);
    const long S = json_int(js, "seq_len", 0), k = json_int(js, "k", 0);
    char mt[32];
    json_mask_type(js, mt, sizeof mt);
    long vl[16];
    int nvl = json_int_list(js, "valid_len", vl, 16);
    if (B < 1 || H < 1 || g < 1 || d < 1 || S < 1 || k < 1 || B > 16 || g > 8) {
        CHECK(0, "%s: manifest unreadable", dir);
        return;
    }
    if (strcmp(mt, "none") && strcmp(mt, "zero") && !(strcmp(mt, "suffix") == 0 && nvl == B)) {
        char why[1600];
        snprintf(why, sizeof why, "%s: mask '%s' is not a suffix", dir, mt);
        test_skip(why);
        return;
    }
    float *Q = load_arr(dir, "Q.f32", B * H * g * d), *K = load_arr(dir, "K.f32", B * H * S * d);
    float *V = load_arr(dir, "V.f32", B * H * S * d), *Y = load_arr(dir, "y.f32", B * H * g * d);
    float *KM = load_arr(dir, "kept_mass.f32", B * H * g);
    int32_t *I = load_arr(dir, "idx.i32", B * H * k);
    if (!Q || !K || !V || !Y || !KM || !I) {
        CHECK(0, "%s: missing or short arrays", dir);
    } else {
        sparq_attn_params p = params("flexgen", 0, (int)k, -1);
        float *out = malloc(g * d * sizeof *out), mass[8];
        int32_t *sel = malloc(S * sizeof *sel), *want = malloc(k * sizeof *want);
        int ok = 1;
        for (long b = 0; b < B; b++)
            for (long h = 0; h < H; h++) {
                const long bh = b * H + h, Se = strcmp(mt, "suffix") == 0 ? vl[b] : S;
                int64_t n_sel = 0;
                char err[256] = "";
                sparq_attn_io io = { .kv_type = SPARQ_KV_F32, .S = Se, .d = (int)d, .g = (int)g,
                                     .q = Q + bh * g * d, .K = K + bh * S * d, .V = V + bh * S * d,
                                     .out = out, .sel = sel, .alpha = mass };
                int rc = sparq_attn_run(&p, &io, err, sizeof err);
                n_sel = io.n_sel;
                if (rc) { CHECK(0, "%s: %s", dir, err); ok = 0; continue; }
                for (long t = 0; t < g * d; t++)
                    if (!close_rel(out[t], Y[bh * g * d + t])) {
                        CHECK(0, "%s b=%ld h=%ld y[%ld]=%.9g want %.9g", dir, b, h, t, out[t],
                              Y[bh * g * d + t]);
                        ok = 0;
                        break;
                    }
                for (long t = 0; t < g; t++)
                    if (!close_rel(mass[t], KM[bh * g + t])) {
                        CHECK(0, "%s kept mass %.9g want %.9g", dir, mass[t], KM[bh * g + t]);
                        ok = 0;
                    }
                long nw = 0;
                for (long t = 0; t < k; t++)
                    if (I[bh * k + t] < Se) want[nw++] = I[bh * k + t];
                if (!same_set(sel, n_sel, want, nw)) {
                    CHECK(0, "%s b=%ld h=%ld: idx differs", dir, b, h);
                    ok = 0;
                }
            }
        CHECK(ok, "%s", dir);
        *n_ok += ok;
        free(out); free(sel); free(want);
    }
    free(Q); free(K); free(V); free(Y); free(KM); free(I);
}

static void golden_dense(const char *dir, const char *js, int *n_ok)
{
    const long B = json_int(js, "batch", 0), H = json_int(js, "n_kv_heads", 0);
    const long g = json_int(js, "group_size", 0), d = json_int(js, "head_size", 0);
    const long S = json_int(js, "seq_len", 0), Lq = json_int(js, "q_len", 1);
    if (B < 1 || H < 1 || g < 1 || d < 1 || S < 1 || Lq < 1 || Lq > S) {
        CHECK(0, "%s: manifest unreadable", dir);
        return;
    }
    char mt[32];
    json_mask_type(js, mt, sizeof mt);
    float *Q = load_arr(dir, "Q.f32", B * H * g * Lq * d);
    float *K = load_arr(dir, "K.f32", B * H * S * d), *V = load_arr(dir, "V.f32", B * H * S * d);
    float *Y = load_arr(dir, "y.f32", B * H * g * Lq * d);
    float *M = load_arr(dir, "M.f32", B * Lq * S);
    if (!Q || !K || !V || !Y || !M) {
        CHECK(0, "%s: missing or short arrays", dir);
    } else {
        float *q = malloc(g * d * sizeof *q), *out = malloc(g * d * sizeof *out);
        float *sc = aligned_alloc(64, attn_pad16(g * S) * sizeof *sc);
        int32_t *rows = malloc(S * sizeof *rows);
        int ok = 1;
        for (long b = 0; b < B; b++)
            for (long h = 0; h < H; h++)
                for (long t = 0; t < Lq; t++) {
                    const long bh = b * H + h;
                    for (long gi = 0; gi < g; gi++)
                        memcpy(q + gi * d, Q + ((bh * g + gi) * Lq + t) * d, d * sizeof *q);
                    /* the positions this query sees, from the mask itself */
                    int64_t n = 0;
                    for (long s = 0; s < S; s++)
                        if (M[(b * Lq + t) * S + s] == 0.0f) rows[n++] = (int32_t)s;
                    int prefix = n > 0 && rows[n - 1] == n - 1;
                    if (prefix) { /* a prefix 0..n-1: the dense policy on S = n */
                        sparq_attn_params p = params("dense", 0, 0, -1);
                        char err[256] = "";
                        sparq_attn_io io = { .kv_type = SPARQ_KV_F32, .S = n, .d = (int)d,
                                             .g = (int)g, .q = q, .K = K + bh * S * d,
                                             .V = V + bh * S * d, .out = out };
                        int rc = sparq_attn_run(&p, &io, err, sizeof err);
                        if (rc) { CHECK(0, "%s: %s", dir, err); ok = 0; continue; }
                    } else { /* any other mask: gathered attention over the kept rows */
                        attn_kv_view kv = { S, (int)d, KV_F32, K + bh * S * d, V + bh * S * d,
                                            NULL, 0, NULL, NULL, NULL, 0, 0 };
                        attn_gather_group(&kv, q, (int)g, rows, n, out, sc, NULL);
                    }
                    for (long gi = 0; gi < g; gi++)
                        for (long j = 0; j < d; j++) {
                            float want = Y[((bh * g + gi) * Lq + t) * d + j];
                            if (!close_rel(out[gi * d + j], want)) {
                                CHECK(0, "%s b=%ld h=%ld t=%ld: %.9g want %.9g", dir, b, h, t,
                                      out[gi * d + j], want);
                                ok = 0;
                                gi = g;
                                break;
                            }
                        }
                }
        CHECK(ok, "%s (%s mask)", dir, mt);
        *n_ok += ok;
        free(q); free(out); free(sc); free(rows);
    }
    free(Q); free(K); free(V); free(Y); free(M);
}

static void test_golden(void)
{
    const char *kinds[] = { "sparq", "dense", "exact_topk" };
    for (int a = 0; a < 3; a++) {
        char rel[128], root[1024];
        snprintf(rel, sizeof rel, "golden/sparq/cases/%s", kinds[a]);
        if (path_find(rel, root, sizeof root)) {
            char why[256];
            snprintf(why, sizeof why, "golden %s: %s not found", kinds[a], rel);
            test_skip(why);
            continue;
        }
        DIR *dir = opendir(root);
        if (!dir) { test_skip("golden: cannot open case directory"); continue; }
        int n_cases = 0, n_ok = 0;
        struct dirent *e;
        while ((e = readdir(dir))) {
            if (e->d_name[0] == '.') continue;
            char cdir[1400], mpath[1500];
            snprintf(cdir, sizeof cdir, "%s/%s", root, e->d_name);
            snprintf(mpath, sizeof mpath, "%s/manifest.json", cdir);
            size_t n;
            char *js = test_read_file(mpath, &n);
            if (!js) continue;
            n_cases++;
            if (a == 0) golden_sparq(cdir, js, &n_ok);
            else if (a == 1) golden_dense(cdir, js, &n_ok);
            else golden_topk(cdir, js, &n_ok);
            free(js);
        }
        closedir(dir);
        fprintf(stderr, "golden %s: %d of %d cases match\n", kinds[a], n_ok, n_cases);
        CHECK(n_cases > 0, "golden %s: no cases in %s", kinds[a], root);
    }
}

/* ---- 7. identities ----------------------------------------------------------------------- */

static void test_identities(void)
{
    rng r = { 5 };
    const int64_t Ss[] = { 1, 3, 50, 700, 3000 };
    for (size_t a = 0; a < 5; a++)
        for (int elem = 0; elem < 2; elem++) {
            if (elem == KV_F16 && !have_f16) continue;
            case_data c;
            case_make(&c, &r, Ss[a], 64, 4, elem);
            run_out dn, sp, orc;
            sparq_attn_params pd = params("dense", 0, 0, -1);
            run_policy(&c, &pd, &dn);
            /* k >= S: SparQ and oracle are dense */
            sparq_attn_params ps = params("sparq", 8, (int)c.S, -1);
            run_policy(&c, &ps, &sp);
            CHECK(sp.rc == 0 && memcmp(sp.y, dn.y, 64 * 4 * sizeof(float)) == 0,
                  "sparq k=S=%lld differs from dense", (long long)c.S);
            CHECK(sp.alpha[0] == 1.0f && sp.n_sel == c.S, "sparq k=S: alpha %g n_sel %lld",
                  sp.alpha[0], (long long)sp.n_sel);
            run_free(&sp);
            sparq_attn_params po = params("oracle", 0, (int)c.S + 3, -1);
            run_policy(&c, &po, &orc);
            double e = 0;
            for (int i = 0; i < 64 * 4; i++) e = fmax(e, fabs(orc.y[i] - dn.y[i]));
            CHECK(orc.rc == 0 && e <= 1e-6, "oracle k>=S differs from dense by %g", e);
            run_free(&orc);
            /* r = d, l = 0, no realloc: SparQ's scores are exact, so it
             * selects what the oracle selects and computes the same */
            if (c.S > 16) {
                sparq_attn_params pq = params("sparq", 64, 16, 0);
                pq.no_realloc = 1;
                sparq_attn_params pk = params("oracle", 0, 16, -1);
                run_policy(&c, &pq, &sp);
                run_policy(&c, &pk, &orc);
                e = 0;
                for (int i = 0; i < 64 * 4; i++) e = fmax(e, fabs(orc.y[i] - sp.y[i]));
                CHECK(sp.rc == 0 && orc.rc == 0 && same_set(sp.sel, sp.n_sel, orc.sel, orc.n_sel) &&
                          e <= 1e-5,
                      "sparq r=d l=0 no-realloc vs oracle S=%lld: err %g", (long long)c.S, e);
                run_free(&sp);
                run_free(&orc);
            }
            run_free(&dn);
            case_free(&c);
        }
}

/* A cache without K^T or a running V sum: SparQ still computes the same
 * (K columns instead of K^T rows, V summed on the spot) and counts the
 * extra reads. */
/* The staged protocol of a policy's long steps (attn.h: n_parts, select,
 * attend_part, finish) gives exactly what its attend gives, in whatever
 * order the caller runs the parts (the model's threads take them in any
 * order): here last part first. SparQ with K^T and without (K columns
 * read), select_logits, no_realloc, k >= S (dense attention's parts), and
 * dense itself; the counts agree too. */
static void test_staged_parts(void)
{
    rng r = { 41 };
    const int d = 64, g = 3;
    const int64_t S = 3 * ATTN_PART + 100;
    case_data c;
    case_make(&c, &r, S, d, g, KV_F32);
    float *KT = malloc((size_t)d * S * sizeof *KT), *vsum = calloc((size_t)d, sizeof *vsum);
    for (int64_t i = 0; i < S; i++)
        for (int j = 0; j < d; j++) {
            KT[(size_t)j * S + i] = c.K[i * d + j];
            vsum[j] += c.V[i * d + j];
        }
    struct { const char *policy; int r, k, l, logits, no_realloc, with_kt; } cases[] = {
        { "sparq", 16, 2000, 250, 0, 0, 1 }, { "sparq", 8, 3000, 0, 1, 0, 1 }, { "sparq", 16, 1100, 100, 0, 0, 0 },
        { "sparq", 4, 1600, 16, 0, 1, 1 }, { "sparq", 16, 1 << 20, 0, 0, 0, 1 }, { "dense", 0, 0, -1, 0, 0, 1 },
    };
    for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        sparq_attn_params p = params(cases[t].policy, cases[t].r, cases[t].k, cases[t].l);
        p.select_logits = cases[t].logits;
        p.no_realloc = cases[t].no_realloc;
        const attn_policy *pol = attn_policy_find(p.policy);
        char err[128];
        CHECK(pol->resolve(&p, d, err, sizeof err) == 0, "resolve: %s", err);
        enum { MAX_PARTS = 8 };
        const int parts = pol->n_parts(&p, S);
        CHECK(parts > 1 && parts <= MAX_PARTS, "%s k=%d: %d parts at S = %lld", p.policy, p.k, parts,
              (long long)S);
        if (parts <= 1 || parts > MAX_PARTS) continue;
        const size_t nf = attn_pad16(pol->scratch_floats(&p, S, d, g));
        const size_t ns = pol->shared_floats ? pol->shared_floats(&p, S, d, g) : 0;
        attn_scratch scr = { aligned_alloc(64, nf * 4), nf, aligned_alloc(64, nf * 4), NULL, 0 };
        float *shared = ns ? malloc(ns * sizeof *shared) : NULL;
        float want[3 * 64], got[3 * 64], part[MAX_PARTS][3 * 64 + 3];
        attn_kv_view kv = { S, d, KV_F32, c.K, c.V, cases[t].with_kt ? KT : NULL, S, vsum, NULL, NULL, 0, 0 };
        attn_counts cw = { 0, 0 }, cg = { 0, 0 };
        CHECK(pol->attend(NULL, &p, &(attn_step){ 0, 0, &kv, c.q, g, want, &scr, &cw, NULL }) == 0, "attend");
        int ok = 1;
        if (pol->select)
            ok &= pol->select(NULL, &p, &(attn_step){ 0, 0, &kv, c.q, g, NULL, &scr, &cg, NULL }, shared) == 0;
        for (int q = parts - 1; q >= 0; q--)
            ok &= pol->attend_part(NULL, &p, &(attn_step){ 0, 0, &kv, c.q, g, part[q], &scr, &cg, NULL }, q,
                                   part[q] + g * d, shared) == 0;
        memcpy(got, part[0], sizeof got);
        for (int q = 1; q < parts; q++) attn_merge_part(g, d, got, part[0] + g * d, part[q], part[q] + g * d);
        if (pol->finish) pol->finish(NULL, &p, &(attn_step){ 0, 0, &kv, c.q, g, got, &scr, &cg, NULL }, shared);
        CHECK(ok && memcmp(got, want, sizeof got) == 0, "%s r=%d k=%d logits=%d K^T=%d: staged parts != attend",
              p.policy, p.r, p.k, p.select_logits, cases[t].with_kt);
        CHECK(cg.read == cw.read && cg.written == cw.written,
              "%s k=%d: staged counts %lld + %lld, attend %lld + %lld", p.policy, p.k, (long long)cg.read,
              (long long)cg.written, (long long)cw.read, (long long)cw.written);
        free(scr.f); free(scr.i); free(shared);
    }
    free(KT); free(vsum);
    case_free(&c);
}

static void test_sparq_fallbacks(void)
{
    rng r = { 23 };
    case_data c;
    case_make(&c, &r, 777, 64, 4, KV_F32);
    sparq_attn_params p = params("sparq", 16, 32, 8);
    run_out want;
    run_policy(&c, &p, &want);
    const attn_policy *pol = attn_policy_find("sparq");
    char err[128];
    CHECK(pol->resolve(&p, 64, err, sizeof err) == 0, "resolve: %s", err);
    const size_t nf = pol->scratch_floats(&p, c.S, 64, 4);
    attn_scratch scr = { aligned_alloc(64, attn_pad16(nf) * 4), nf,
                         aligned_alloc(64, attn_pad16(nf) * 4), NULL, 0 };
    attn_kv_view kv = { c.S, 64, KV_F32, c.K, c.V, NULL, 0, NULL, NULL, NULL, 0, 0 };
    float out[4 * 64], alpha[4];
    int32_t *sel = malloc((size_t)c.S * sizeof *sel);
    attn_trace tr = { sel, 0, NULL, 0, alpha };
    attn_counts cnt = { 0, 0 };
    CHECK(pol->attend(NULL, &p, &(attn_step){ 0, 0, &kv, c.q, 4, out, &scr, &cnt, &tr }) == 0, "attend failed");
    double e = 0;
    for (int i = 0; i < 4 * 64; i++) e = fmax(e, fabs(out[i] - want.y[i]));
    CHECK(e <= 1e-5 && same_set(sel, tr.n_sel, want.sel, want.n_sel),
          "sparq without K^T / v_sum: err %g", e);
    CHECK(cnt.read + cnt.written == want.elements + c.S * 64 - 64,
          "sparq without v_sum counts %lld, want %lld", (long long)(cnt.read + cnt.written),
          (long long)(want.elements + c.S * 64 - 64));
    free(scr.f); free(scr.i); free(sel);
    run_free(&want);
    case_free(&c);
}

/* ---- 8. transfer counts ------------------------------------------------------------------- */

/* docs/ALGORITHMS.md's transfer per step ("Transfer formulas"), written
 * out here from the text (not the policies' transfer_formula), for the resolved parameters. */
static int64_t spec_transfer(const char *pol, const sparq_attn_params *p, int64_t S, int64_t d)
{
    const int64_t kk = p->k < S ? p->k : S, dense = 2 * S * d + 2 * d;
    if (!strcmp(pol, "dense")) return dense;
    if (!strcmp(pol, "sparq"))
        return p->k >= S ? dense : S * p->r + 2 * p->k * d + (p->no_realloc ? 3 : 4) * d;
    if (!strcmp(pol, "oracle") || !strcmp(pol, "flexgen")) return S * d + kk * d + 2 * d;
    if (!strcmp(pol, "h2o")) return 2 * kk * d + 2 * d + 2 * S;
    if (!strcmp(pol, "streaming")) return 2 * kk * d + 2 * d;
    return -1;
}

/* Measured transfer == docs/ALGORITHMS.md over many shapes: S, d and g with odd
 * tails, several r and k, both cache types, SparQ's variants. */
static void test_counts_shapes(void)
{
    rng r = { 41 };
    const char *pols[] = { "dense", "sparq", "oracle", "flexgen", "h2o", "streaming" };
    const int64_t Ss[] = { 2, 17, 63, 65, 300, 1031 };
    const int ds[] = { 7, 16, 33, 64, 96 };
    const int gs[] = { 1, 3, 4, 7 };
    int n = 0, bad = 0;
    for (size_t a = 0; a < 6; a++)
        for (size_t b = 0; b < 5; b++) {
            const int g = gs[(a + b) % 4], d = ds[b];
            const int elem = (a + b) % 2 && have_f16 ? KV_F16 : KV_F32;
            case_data c;
            case_make(&c, &r, Ss[a], d, g, elem);
            for (size_t pi = 0; pi < 6; pi++)
                for (int v = 0; v < 4; v++) {
                    const int ks[] = { 1, 13, 40, 5000 }, rr[] = { 1, 3, d / 2 > 0 ? d / 2 : 1, d };
                    sparq_attn_params p = params(pols[pi], rr[v], ks[v], -1);
                    if (!strcmp(pols[pi], "sparq") && v == 2) p.no_realloc = 1;
                    if (!strcmp(pols[pi], "sparq") && v == 1) p.select_logits = 1;
                    if (!strcmp(pols[pi], "streaming")) p.n_sink = 4;
                    run_out o;
                    run_policy(&c, &p, &o);
                    char err[128];
                    sparq_attn_params rp = p; /* resolved, for the formula */
                    const attn_policy *pol = attn_policy_find(pols[pi]);
                    const int ok_res = pol->resolve(&rp, d, err, sizeof err) == 0;
                    const int64_t want = spec_transfer(pols[pi], &rp, c.S, d);
                    const int64_t f = sparq_attn_formula(&p, c.S, d, g, err, sizeof err);
                    const int ok = ok_res && o.rc == 0 && o.elements == want && f == want;
                    bad += !ok;
                    CHECK(ok, "%s r=%d k=%d S=%lld d=%d g=%d elem=%d: measured %lld, formula %lld, "
                          "formula %lld (%s)", pols[pi], p.r, p.k, (long long)c.S, d, g, elem,
                          (long long)o.elements, (long long)want, (long long)f, o.err);
                    run_free(&o);
                    n++;
                }
            case_free(&c);
        }
    fprintf(stderr, "transfer counts: %d policy runs, measured == formula in %d\n", n, n - bad);
}

static void test_counts(void)
{
    test_counts_shapes();
    rng r = { 17 };
    const char *pols[] = { "dense", "sparq", "oracle", "flexgen", "h2o", "streaming" };
    const int64_t Ss[] = { 1, 5, 40, 129, 1000 };
    for (size_t a = 0; a < 5; a++) {
        case_data c;
        case_make(&c, &r, Ss[a], 32, 2, KV_F32);
        for (size_t b = 0; b < 6; b++)
            for (int kk = 0; kk < 3; kk++) {
                const int ks[] = { 0, 8, 100 };
                sparq_attn_params p = params(pols[b], 0, ks[kk], -1);
                run_out o;
                run_policy(&c, &p, &o);
                char err[128];
                int64_t f = sparq_attn_formula(&p, c.S, 32, 2, err, sizeof err);
                CHECK(o.rc == 0 && o.elements == f && f > 0,
                      "%s k=%d S=%lld: counted %lld, formula %lld", pols[b], ks[kk],
                      (long long)c.S, (long long)o.elements, (long long)f);
                run_free(&o);
            }
        case_free(&c);
    }
    /* the formulas themselves, from docs/ALGORITHMS.md, at a long context */
    const int64_t S = 10000;
    const int d = 128;
    char err[128];
    sparq_attn_params p = params("sparq", 0, 0, -1);
    CHECK(sparq_attn_formula(&p, S, d, 4, err, sizeof err) == S * 32 + 2 * 128 * d + 4 * d,
          "sparq formula");
    p = params("dense", 0, 0, -1);
    CHECK(sparq_attn_formula(&p, S, d, 4, err, sizeof err) == 2 * S * d + 2 * d, "dense formula");
    p = params("flexgen", 0, 64, -1);
    CHECK(sparq_attn_formula(&p, S, d, 4, err, sizeof err) == S * d + 64 * d + 2 * d,
          "flexgen formula");
    p = params("h2o", 0, 64, -1);
    CHECK(sparq_attn_formula(&p, S, d, 4, err, sizeof err) == 2 * 64 * d + 2 * d + 2 * S,
          "h2o formula");
    p = params("streaming", 0, 64, -1);
    CHECK(sparq_attn_formula(&p, S, d, 4, err, sizeof err) == 2 * 64 * d + 2 * d,
          "streaming formula");
}

/* ---- 9. invalid parameters ------------------------------------------------------------------ */

static void expect_reject(sparq_attn_params p, int d, const char *needle)
{
    char err[256] = "";
    int64_t f = sparq_attn_formula(&p, 100, d, 1, err, sizeof err);
    CHECK(f == -1 && strstr(err, needle) != NULL && strchr(err, '\n') == NULL,
          "%s r=%d k=%d l=%d: got %lld '%s', want '%s'", p.policy ? p.policy : "(null)", p.r, p.k,
          p.l, (long long)f, err, needle);
}

static void test_invalid(void)
{
    expect_reject(params("sparq", 200, 0, -1), 128, "sparq: r=200 exceeds head size 128");
    expect_reject(params("sparq", -3, 0, -1), 128, "r=-3");
    expect_reject(params("sparq", 0, -5, -1), 128, "k=-5");
    expect_reject(params("sparq", 0, 16, 17), 128, "l=17 exceeds k=16");
    expect_reject(params("sparq", 0, 16, -2), 128, "l=-2");
    expect_reject(params("h2o", 0, 16, 20), 128, "l=20 exceeds k=16");
    expect_reject(params("oracle", 0, -1, -1), 64, "k=-1");
    expect_reject(params("flexgen", 0, -1, -1), 64, "k=-1");
    expect_reject(params("nosuch", 0, 0, -1), 64, "unknown policy 'nosuch'");
    sparq_attn_params s = params("streaming", 0, 0, -1);
    s.n_sink = -1;
    expect_reject(s, 64, "n_sink=-1");

    /* defaults: r = d/4 (at least 1), k = 128, l = k/4 */
    sparq_attn_params p = params("sparq", 0, 0, -1);
    char err[128];
    const attn_policy *pol = attn_policy_find("sparq");
    CHECK(pol && pol->resolve(&p, 128, err, sizeof err) == 0 && p.r == 32 && p.k == 128 &&
              p.l == 32,
          "sparq defaults r=%d k=%d l=%d", p.r, p.k, p.l);
    p = params("sparq", 0, 0, -1);
    CHECK(pol && pol->resolve(&p, 2, err, sizeof err) == 0 && p.r == 1,
          "sparq r default for d=2: %d", p.r);
    CHECK(attn_policy_find(NULL) == attn_policy_find("dense"), "NULL policy is dense");

    /* the kernel API's own argument checks */
    float q[8] = { 0 }, K[8] = { 0 }, out[8];
    char e2[256] = "";
    sparq_attn_params pd = params("dense", 0, 0, -1);
    sparq_attn_io io = { .kv_type = SPARQ_KV_F32, .S = 0, .d = 8, .g = 1, .q = q, .K = K, .V = K,
                         .out = out };
    CHECK(sparq_attn_run(&pd, &io, e2, sizeof e2) == -1 && strstr(e2, "S=0"), "S=0: '%s'", e2);
    io.S = 1;
    io.kv_type = 7;
    CHECK(sparq_attn_run(&pd, &io, e2, sizeof e2) == -1 && strstr(e2, "kv_type"), "kv_type: '%s'", e2);
    io.kv_type = SPARQ_KV_F32;
    io.q = NULL;
    CHECK(sparq_attn_run(&pd, &io, e2, sizeof e2) == -1, "NULL q rejected");
    CHECK(sparq_attn_run(&pd, NULL, e2, sizeof e2) == -1 && strstr(e2, "io"), "NULL io: '%s'", e2);
}

/* Long dense steps in parts (attn.h): attn_dense_group over S >= 2 ATTN_PART
 * against the naive softmax in double; the parts merged by hand in order
 * give the same bits (what the model's threads do); each part's log-sum-exp
 * against the naive one; a view too short to split is one part. */
static void test_dense_parts(void)
{
    rng r = { 77 };
    const int64_t Ss[] = { 2 * ATTN_PART - 1, 2 * ATTN_PART, 3 * ATTN_PART + 37 };
    const int d = 40, g = 3;
    CHECK(attn_dense_parts(2 * ATTN_PART - 1) == 1 && attn_dense_parts(2 * ATTN_PART) == 2 &&
              attn_dense_parts(3 * ATTN_PART + 37) == 3 && attn_dense_parts(1) == 1,
          "part counts");
    for (size_t a = 0; a < sizeof Ss / sizeof Ss[0]; a++) {
        const int64_t S = Ss[a];
        float *K = malloc((size_t)S * d * sizeof *K), *V = malloc((size_t)S * d * sizeof *V);
        float *q = malloc((size_t)g * d * sizeof *q), *o1 = malloc((size_t)g * d * sizeof *o1);
        float *o2 = malloc((size_t)g * d * sizeof *o2), *po = malloc((size_t)g * d * sizeof *po);
        float *scratch = malloc(((size_t)g * S + 64) * sizeof *scratch);
        double *want = malloc((size_t)g * d * sizeof *want);
        if (!K || !V || !q || !o1 || !o2 || !po || !scratch || !want) {
            CHECK(0, "out of memory");
            return;
        }
        for (int64_t i = 0; i < S * d; i++) {
            K[i] = 2 * rng_normal(&r); /* peaked softmaxes: parts differ in their max */
            V[i] = rng_normal(&r);
        }
        fill_query(&r, q, g, d);
        attn_kv_view kv = { S, d, KV_F32, K, V, NULL, 0, NULL, NULL, NULL, 0, 0 };
        attn_dense_group(&kv, q, g, o1, scratch);
        naive_attn(q, K, V, S, d, g, NULL, want, NULL);
        double worst = 0;
        for (int i = 0; i < g * d; i++) worst = fmax(worst, fabs(o1[i] - want[i]) / (1 + fabs(want[i])));
        CHECK(worst < 2e-5, "dense S %lld in %d parts vs naive: %g", (long long)S, attn_dense_parts(S), worst);
        /* by hand: parts in order, merged; and each part's lse */
        const int parts = attn_dense_parts(S);
        float lse[3], plse[3];
        double lse_err = 0;
        for (int p = 0; p < parts; p++) {
            attn_dense_part(&kv, q, g, p, p ? po : o2, p ? plse : lse, scratch);
            const int64_t i0 = (int64_t)p * ATTN_PART, i1 = p == parts - 1 ? S : i0 + ATTN_PART;
            for (int h = 0; h < g; h++) {
                double mx = -INFINITY, z = 0;
                for (int64_t i = i0; i < i1; i++) {
                    double dot = 0;
                    for (int j = 0; j < d; j++) dot += (double)q[h * d + j] * K[i * d + j];
                    scratch[i - i0] = (float)(dot / sqrt((double)d));
                    mx = fmax(mx, scratch[i - i0]);
                }
                for (int64_t i = i0; i < i1; i++) z += exp(scratch[i - i0] - mx);
                lse_err = fmax(lse_err, fabs((p ? plse : lse)[h] - (mx + log(z))) / (1 + fabs(mx + log(z))));
            }
            if (p) attn_merge_part(g, d, o2, lse, po, plse);
        }
        CHECK(lse_err < 1e-5, "S %lld: parts' log-sum-exp vs naive %g", (long long)S, lse_err);
        CHECK(memcmp(o1, o2, (size_t)g * d * sizeof *o1) == 0, "S %lld: parts merged in order = attn_dense_group",
              (long long)S);
        free(K); free(V); free(q); free(o1); free(o2); free(po); free(scratch); free(want);
    }
}

int main(void)
{
    test_f16();
    test_topk();
    test_topk_filter();
    test_topk_above();
    test_topk_kth();
    test_topk_partition();
    test_twins();
    test_dense_parts();
    test_kt_exp();
    test_kt_exp_no_subnormal();
    test_kt_split();
    test_policies_naive();
    test_staged_parts();
    test_h2o_steps();
    test_golden();
    test_identities();
    test_sparq_fallbacks();
    test_meters();
    test_counts();
    test_invalid();
    return test_summary("test_attn");
}
