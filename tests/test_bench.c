/* test_bench.c - the benchmark arithmetic and output formats (bench.h),
 * and `sparq bench decode | attn` rows for each KV element type.
 *
 * No timing is asserted: the statistics, byte counts, GB/s, ratios, list
 * parsing, test data, the KV cache fill, the read kernel twins and the
 * JSON / CSV / gnuplot writers are checked against hand-computed values and
 * an independent parse of the output (json.h). The bench runs (binary from
 * $SPARQ_BUILD, default build/, on a `gen-model --shape tiny` file) are
 * checked for the bytes their rows report, against the transfer formula
 * written out here with Q8_0's 34 bytes per 32 elements.
 */
#include "bench/bench.h"
#include "util/json.h"
#include "core/kvcache.h"
#include "test.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_stats(void)
{
    double x[5] = { 5, 1, 4, 2, 3 }, w[5];
    bench_stats s;
    bench_stats_of(x, 5, w, &s);
    CHECK(s.n == 5, "n=%d", s.n);
    CHECK_NEAR(s.median, 3, 0);
    CHECK_NEAR(s.q1, 2, 0);
    CHECK_NEAR(s.q3, 4, 0);
    CHECK_NEAR(s.min, 1, 0);
    CHECK_NEAR(s.max, 5, 0);
    CHECK_NEAR(s.mean, 3, 1e-15);
    CHECK(x[0] == 5 && x[1] == 1 && x[4] == 3, "input reordered");

    /* even count: numpy's linear interpolation, position p*(n-1) */
    double y[4] = { 40, 10, 30, 20 }, wy[4];
    bench_stats_of(y, 4, wy, &s);
    CHECK_NEAR(s.median, 25, 1e-12);
    CHECK_NEAR(s.q1, 17.5, 1e-12);
    CHECK_NEAR(s.q3, 32.5, 1e-12);
    CHECK_NEAR(s.mean, 25, 1e-12);

    double one = 7.5, w1;
    bench_stats_of(&one, 1, &w1, &s);
    CHECK(s.median == 7.5 && s.q1 == 7.5 && s.q3 == 7.5 && s.min == 7.5 && s.max == 7.5, "single sample");
    bench_stats_of(NULL, 0, NULL, &s);
    CHECK(s.n == 0 && isnan(s.median) && isnan(s.mean), "empty sample gives NAN");

    double sorted[3] = { 1, 2, 4 };
    CHECK_NEAR(bench_quantile_sorted(sorted, 3, 0.0), 1, 0);
    CHECK_NEAR(bench_quantile_sorted(sorted, 3, 1.0), 4, 0);
    CHECK_NEAR(bench_quantile_sorted(sorted, 3, 0.75), 3, 1e-12);
    CHECK_NEAR(bench_quantile_sorted(sorted, 3, 0.9), 3.6, 1e-12);
}

/* A policy whose formula is SparQ's, written out here independently. */
static int64_t fake_formula(const sparq_attn_params *p, int64_t S, int d, int g)
{
    (void)g;
    return S * p->r + 2 * (int64_t)p->k * d + 4 * (int64_t)d;
}

static void test_transfer(void)
{
    attn_counts c[3] = { { 10, 2 }, { 10, 2 }, { 7, 1 } };
    CHECK(bench_counted_bytes(c, 3, KV_F16) == 2 * (12 + 12 + 8), "counted f16 = %lld",
          (long long)bench_counted_bytes(c, 3, KV_F16));
    CHECK(bench_counted_bytes(c, 2, KV_F32) == 4 * 24, "counted f32 = %lld",
          (long long)bench_counted_bytes(c, 2, KV_F32));
    /* Q8_0: 34 bytes per 32 elements; 64 elements = two blocks */
    attn_counts cq[2] = { { 40, 8 }, { 16, 0 } };
    CHECK(bench_counted_bytes(cq, 2, KV_Q8_0) == 2 * 34, "counted q8_0 = %lld",
          (long long)bench_counted_bytes(cq, 2, KV_Q8_0));

    attn_policy fake = { 0 };
    fake.name = "fake";
    fake.transfer_formula = fake_formula;
    sparq_attn_params p = sparq_attn_default_params();
    p.r = 16;
    p.k = 128;
    /* paper-shaped target point: S = 32k, d = 128, 8 KV heads, f16 */
    const int64_t S = 32768;
    const int64_t sparq_el = S * 16 + 2 * 128 * 128 + 4 * 128; /* 557568 */
    CHECK(bench_formula_bytes(&fake, &p, S, 128, 4, 8, KV_F16) == 8 * sparq_el * 2, "fake formula bytes");
    CHECK(bench_formula_bytes(&fake, &p, S, 128, 4, 8, KV_Q8_0) == 8 * sparq_el / 32 * 34, "fake formula q8_0");

    const attn_policy *dense = attn_policy_find("dense"), *sparq = attn_policy_find("sparq");
    CHECK(dense && sparq, "dense and sparq registered");
    if (!dense || !sparq) return;
    const int64_t dense_el = 2 * S * 128 + 2 * 128; /* 8388864 */
    int64_t db = bench_formula_bytes(dense, &p, S, 128, 4, 8, KV_F16);
    int64_t sb = bench_formula_bytes(sparq, &p, S, 128, 4, 8, KV_F16);
    CHECK(db == 8 * dense_el * 2, "dense formula bytes %lld", (long long)db);
    CHECK(sb == 8 * sparq_el * 2, "sparq formula bytes %lld", (long long)sb);
    CHECK_NEAR(bench_ratio((double)sb, (double)db), 557568.0 / 8388864.0, 1e-15);
    CHECK_NEAR(1.0 / bench_ratio((double)sb, (double)db), 15.045, 1e-3);
    CHECK(isnan(bench_ratio(1, 0)), "ratio with no dense bytes is NAN");
    /* the same call with a Q8_0 cache moves 34/64 of f16's bytes (d = 128:
     * whole blocks, so exactly) */
    int64_t dq = bench_formula_bytes(dense, &p, S, 128, 4, 8, KV_Q8_0);
    CHECK(dq == 8 * dense_el * 34 / 32, "dense formula q8_0 bytes %lld", (long long)dq);
    CHECK_NEAR((double)dq / (double)db, 34.0 / 64.0, 1e-15);

    /* 1e9 bytes in one second is 1 GB/s; 4.198e6 bytes in 319.3 us */
    CHECK_NEAR(bench_gbps(1e9, 1e6), 1.0, 1e-12);
    CHECK_NEAR(bench_gbps(4198400, 319.3), 4198400 / 319.3e-6 / 1e9, 1e-9);
    CHECK(isnan(bench_gbps(1, 0)) && isnan(bench_gbps(1, -1)), "GB/s of a zero time is NAN");
    CHECK_NEAR(bench_speedup(1000, 125), 8, 1e-12);
    CHECK(isnan(bench_speedup(NAN, 1)) && isnan(bench_speedup(1, 0)), "speed-up without reference is NAN");
}

/* The counted bytes of real calls through a cache equal the formula (what
 * `bench attn` reports as counted vs formula), for dense and sparq. */
static void counted_matches_formula(int elem)
{
    const int B = 2, kvh = 2, g = 2, d = 16;
    const int64_t S = 300;
    kv_cache kv;
    char err[256];
    if (kv_create(&kv, B, kvh, d, S, elem, 1, 1, err, sizeof err)) {
        CHECK(0, "kv_create: %s", err);
        return;
    }
    bench_rng r;
    bench_rng_seed(&r, 3);
    float kvrow[2 * 2 * 16];
    for (int b = 0; b < B; b++)
        for (int64_t p = 0; p < S; p++) {
            bench_randn(&r, kvrow, sizeof kvrow / sizeof kvrow[0]);
            kv_write(&kv, b, p, kvrow, kvrow + kvh * d);
        }
    kv.n = S;
    const char *names[2] = { "dense", "sparq" };
    for (int ip = 0; ip < 2; ip++) {
        const attn_policy *pol = attn_policy_find(names[ip]);
        if (!pol) { CHECK(0, "policy %s missing", names[ip]); continue; }
        sparq_attn_params p = sparq_attn_default_params();
        p.policy = pol->name;
        p.r = 4;
        p.k = 64;
        CHECK(pol->resolve(&p, d, err, sizeof err) == 0, "resolve %s: %s", names[ip], err);
        size_t nf = attn_pad16(pol->scratch_floats(&p, S, d, g));
        float *sf = aligned_alloc(64, nf * sizeof(float));
        int32_t *si = aligned_alloc(64, nf * sizeof(int32_t));
        float q[2 * 16], out[2 * 16];
        attn_counts c[4];
        for (int i = 0; i < B * kvh; i++) {
            attn_kv_view v;
            kv_view(&kv, i / kvh, i % kvh, S, &v);
            attn_scratch s = { .f = sf, .n_f = nf, .i = si };
            bench_randn(&r, q, 2 * 16);
            c[i].read = c[i].written = 0;
            CHECK(pol->attend(NULL, &p, &(attn_step){ i / kvh, i % kvh, &v, q, g, out, &s, &c[i], NULL }) == 0,
                  "%s: attend failed", names[ip]);
        }
        int64_t counted = bench_counted_bytes(c, B * kvh, elem);
        int64_t formula = bench_formula_bytes(pol, &p, S, d, g, B * kvh, elem);
        CHECK(counted == formula, "%s %s counted %lld != formula %lld", names[ip], bench_kv_name(elem),
              (long long)counted, (long long)formula);
        /* and in the cache's own byte count */
        int64_t el = 0;
        for (int i = 0; i < B * kvh; i++) el += c[i].read + c[i].written;
        CHECK(counted == kv_bytes_of(&kv, el), "%s %s: bench bytes %lld, kv_bytes_of %lld", names[ip],
              bench_kv_name(elem), (long long)counted, (long long)kv_bytes_of(&kv, el));
        free(sf);
        free(si);
    }
    kv_free(&kv);
}

static void test_counted_matches_formula(void)
{
    counted_matches_formula(KV_F16);
    counted_matches_formula(KV_Q8_0);
}

/* Bytes per KV element type, as the cache counts them (kv_bytes_of). */
static void test_kv_bytes(void)
{
    CHECK(bench_kv_bytes(KV_F32, 10) == 40 && bench_kv_bytes(KV_F16, 10) == 20, "f32/f16 bytes");
    CHECK(bench_kv_bytes(KV_Q8_0, 32) == 34 && bench_kv_bytes(KV_Q8_0, 64 * 1000) == 68000, "q8_0 bytes");
    CHECK(bench_kv_bytes(KV_Q8_0, 33) == 36, "q8_0 rounds up: %lld", (long long)bench_kv_bytes(KV_Q8_0, 33));
    CHECK(bench_kv_elem_bytes(KV_F32) == 4 && bench_kv_elem_bytes(KV_F16) == 2 &&
              bench_kv_elem_bytes(KV_Q8_0) == 1.0625 && isnan(bench_kv_elem_bytes(7)), "bytes per element");
    CHECK(strcmp(bench_kv_name(KV_F32), "f32") == 0 && strcmp(bench_kv_name(KV_F16), "f16") == 0 &&
              strcmp(bench_kv_name(KV_Q8_0), "q8_0") == 0, "kv names");
    const int elems[3] = { KV_F32, KV_F16, KV_Q8_0 };
    for (int e = 0; e < 3; e++) {
        kv_cache kv;
        char err[256];
        if (kv_create(&kv, 1, 1, 64, 64, elems[e], 0, 0, err, sizeof err)) {
            CHECK(0, "kv_create: %s", err);
            continue;
        }
        int bad = 0;
        for (int64_t n = 0; n < 200; n += 7) bad += bench_kv_bytes(elems[e], n) != kv_bytes_of(&kv, n);
        CHECK(bad == 0, "%s: %d counts differ from kv_bytes_of", bench_kv_name(elems[e]), bad);
        kv_free(&kv);
    }
}

/* |x - y| <= 0.6 x (a Q8_0 block's step) + a rounding floor: q = round(x /
 * scale) is within half a step, and the f16 scale adds at most 127 x 2^-11
 * of one step. */
static int q8_close(float x, float y, float block_amax)
{
    return fabsf(x - y) <= 0.6f * block_amax / 127.0f + 1e-6f;
}

/* The fill `bench attn` times over: a Q8_0 cache gets valid blocks for K,
 * V and K^T (each value within half a quantization step of the f32 cache's
 * value from the same seed), V sums of what V stores, and the same bytes
 * however the fill is split into calls. */
static void test_fill_kv(void)
{
    const int L = 2, kvh = 2, d = 40; /* d: one full block and a short one */
    const int64_t S = 100;             /* K^T: three full blocks and a short one */
    kv_cache f, q, q2;
    char err[256];
    if (kv_create(&f, L, kvh, d, S, KV_F32, 1, 1, err, sizeof err)) { CHECK(0, "kv_create: %s", err); return; }
    if (kv_create(&q, L, kvh, d, S, KV_Q8_0, 1, 1, err, sizeof err)) {
        CHECK(0, "kv_create q8_0: %s", err);
        kv_free(&f);
        return;
    }
    if (kv_create(&q2, L, kvh, d, S, KV_Q8_0, 1, 1, err, sizeof err)) {
        CHECK(0, "kv_create q8_0: %s", err);
        kv_free(&f);
        kv_free(&q);
        return;
    }
    CHECK(bench_fill_kv(&f, 0, S, 5, 2) == 0 && f.n == S, "f32 fill");
    CHECK(bench_fill_kv(&q, 0, S, 5, 2) == 0 && q.n == S, "q8_0 fill");
    /* split mid-block, and a chunk per call */
    CHECK(bench_fill_kv(&q2, 0, 37, 5, 1) == 0 && bench_fill_kv(&q2, 37, 38, 5, 2) == 0 &&
              bench_fill_kv(&q2, 38, S, 5, 2) == 0 && q2.n == S, "split q8_0 fill");
    CHECK(memcmp(q.k, q2.k, q.kv_bytes) == 0 && memcmp(q.v, q2.v, q.kv_bytes) == 0 &&
              memcmp(q.kt, q2.kt, q.kt_bytes) == 0, "split fill stores the same bytes");
    int bad_k = 0, bad_v = 0, bad_kt = 0, bad_sum = 0;
    double sq = 0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < kvh; h++) {
            attn_kv_view vf, vq;
            kv_view(&f, l, h, S, &vf);
            kv_view(&q, l, h, S, &vq);
            for (int64_t s = 0; s < S; s++)
                for (int b0 = 0; b0 < d; b0 += 32) { /* blocks along d: K and V rows */
                    const int b1 = b0 + 32 < d ? b0 + 32 : d;
                    float ak = 0, av = 0;
                    for (int j = b0; j < b1; j++) {
                        ak = fmaxf(ak, fabsf(attn_kv_at(vf.K, KV_F32, d, s, j)));
                        av = fmaxf(av, fabsf(attn_kv_at(vf.V, KV_F32, d, s, j)));
                    }
                    for (int j = b0; j < b1; j++) {
                        const float x = attn_kv_at(vf.K, KV_F32, d, s, j);
                        sq += (double)x * x;
                        bad_k += !q8_close(x, attn_kv_at(vq.K, KV_Q8_0, d, s, j), ak);
                        bad_v += !q8_close(attn_kv_at(vf.V, KV_F32, d, s, j), attn_kv_at(vq.V, KV_Q8_0, d, s, j), av);
                    }
                }
            for (int j = 0; j < d; j++) {
                for (int64_t s0 = 0; s0 < S; s0 += 32) { /* blocks along positions: K^T rows */
                    const int64_t s1 = s0 + 32 < S ? s0 + 32 : S;
                    float a = 0;
                    for (int64_t s = s0; s < s1; s++) a = fmaxf(a, fabsf(attn_kv_at(vf.K, KV_F32, d, s, j)));
                    for (int64_t s = s0; s < s1; s++)
                        bad_kt += !q8_close(attn_kv_at(vf.K, KV_F32, d, s, j),
                                            attn_kv_at(vq.KT, KV_Q8_0, vq.kt_stride, j, s), a);
                }
                double sum = 0;
                for (int64_t s = 0; s < S; s++) sum += attn_kv_at(vq.V, KV_Q8_0, d, s, j);
                bad_sum += fabs(vq.v_sum[j] - sum) > 1e-4 * (1 + fabs(sum));
            }
        }
    CHECK(bad_k == 0 && bad_v == 0, "q8_0 K/V values off the f32 fill: %d, %d", bad_k, bad_v);
    CHECK(bad_kt == 0, "q8_0 K^T values off the f32 keys: %d", bad_kt);
    CHECK(bad_sum == 0, "q8_0 V sums off the stored V: %d", bad_sum);
    /* the f32 fill is N(0,1): mean square near 1 over 8000 values */
    sq /= (double)L * kvh * d * S;
    CHECK(fabs(sq - 1) < 0.06, "fill mean square %g", sq);
    kv_free(&f);
    kv_free(&q);
    kv_free(&q2);
}

static void test_lists(void)
{
    int64_t v[8];
    char err[256];
    CHECK(bench_parse_list("1k,32k,1M", v, 8, err, sizeof err) == 3 && v[0] == 1024 && v[1] == 32768 &&
              v[2] == 1048576, "suffixes");
    CHECK(bench_parse_list("0,8192,32768", v, 8, err, sizeof err) == 3 && v[0] == 0 && v[2] == 32768, "plain");
    CHECK(bench_parse_list("7", v, 8, err, sizeof err) == 1 && v[0] == 7, "single");
    const char *bad[] = { "", "1,,2", "abc", "1x", "-1", "1,", "99999999999999999999", "9223372036854775807k" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECK(bench_parse_list(bad[i], v, 8, err, sizeof err) == -1 && err[0], "'%s' accepted", bad[i]);
    }
    CHECK(bench_parse_list("1,2,3", v, 2, err, sizeof err) == -1, "too many items accepted");

    char buf[64];
    const char *names[4];
    CHECK(bench_split_names("dense,sparq,h2o", buf, sizeof buf, names, 4, err, sizeof err) == 3 &&
              strcmp(names[0], "dense") == 0 && strcmp(names[1], "sparq") == 0 && strcmp(names[2], "h2o") == 0,
          "names split");
    CHECK(bench_split_names("a,,b", buf, sizeof buf, names, 4, err, sizeof err) == -1, "empty name accepted");
    CHECK(bench_split_names("a,b,c,d,e", buf, sizeof buf, names, 4, err, sizeof err) == -1, "5 names in 4 slots");
}

static void test_data(void)
{
    enum { N = 200001 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    bench_rng r;
    bench_rng_seed(&r, 42);
    bench_randn(&r, x, N);
    double m = 0, v = 0;
    for (int i = 0; i < N; i++) m += x[i];
    m /= N;
    for (int i = 0; i < N; i++) v += (x[i] - m) * (x[i] - m);
    v /= N - 1;
    /* standard errors: 1/sqrt(N) = 0.0022 for the mean, sqrt(2/N) = 0.0032 for the variance */
    CHECK(fabs(m) < 0.012, "mean %g", m);
    CHECK(fabs(v - 1) < 0.016, "variance %g", v);
    bench_rng_seed(&r, 42);
    bench_randn(&r, y, N);
    CHECK(memcmp(x, y, N * sizeof(float)) == 0, "same seed, same data");

    /* heavy == 0 is plain N(0,1); heavy != 0 concentrates |q| on few components */
    bench_rng_seed(&r, 9);
    bench_query(&r, y, 2, 128, 0);
    bench_rng_seed(&r, 9);
    bench_randn(&r, x, 256);
    CHECK(memcmp(x, y, 256 * sizeof(float)) == 0, "normal query = randn");
    double top_share[2];
    for (int heavy = 0; heavy < 2; heavy++) {
        double share = 0;
        for (int t = 0; t < 50; t++) {
            bench_query(&r, y, 1, 128, heavy);
            double tot = 0, a[128];
            for (int j = 0; j < 128; j++) tot += a[j] = fabs(y[j]);
            for (int i = 0; i < 16; i++) /* the 16 largest, by selection */
                for (int j = i + 1; j < 128; j++)
                    if (a[j] > a[i]) { double s = a[i]; a[i] = a[j]; a[j] = s; }
            double top = 0;
            for (int i = 0; i < 16; i++) top += a[i];
            share += top / tot / 50;
        }
        top_share[heavy] = share;
    }
    CHECK(top_share[1] > top_share[0] + 0.15, "heavy-tailed top-16 share %g vs normal %g", top_share[1],
          top_share[0]);
    free(x);
    free(y);
}

static void test_sum_kernels(void)
{
    enum { N = 1000003 };
    float *x = malloc((N + 1) * sizeof(float));
    /* small integers: every partial sum is exact in f32, so any order of
     * additions must agree exactly (tolerance 0) */
    for (int i = 0; i < N + 1; i++) x[i] = (float)((i * 7) % 5) - 2.0f;
    double want = 0;
    for (int i = 0; i < N; i++) want += x[i];
    CHECK(bench_sum_f32_ref(x, N) == (float)want, "ref sum");
    CHECK(bench_sum_f32(x, N) == (float)want, "dispatched sum %g vs %g", bench_sum_f32(x, N), want);
    /* every level this CPU runs, whatever SPARQ_CPU chose */
    int n_twins = 0;
    for (int l = CPU_REF + 1; l < CPU_LEVELS; l++) {
        const bench_kernels *k = bench_kernels_at((cpu_level)l);
        if (!cpu_level_supported((cpu_level)l) || k == &bench_kernels_ref) continue;
        int bad = 0;
        for (size_t n = 0; n < 300; n++) /* odd lengths and a misaligned start */
            bad += k->sum_f32(x + 1, n) != bench_sum_f32_ref(x + 1, n) || k->sum_f32(x, n) != bench_sum_f32_ref(x, n);
        CHECK(bad == 0, "%d lengths differ between %s and ref", bad, cpu_level_name((cpu_level)l));
        CHECK(k->sum_f32(x, N) == (float)want, "%s long sum", cpu_level_name((cpu_level)l));
        n_twins++;
    }
    if (!n_twins) test_skip("sum kernels: no SIMD level with a twin on this CPU (no AVX2)");
    free(x);
}

/* Rows covering each kind, NAN fields and awkward text. */
static void sample_rows(bench_row *rows)
{
    bench_row_init(&rows[0], BENCH_ATTN);
    strcpy(rows[0].policy, "dense");
    rows[0].B = 1, rows[0].H = 32, rows[0].kv_heads = 8, rows[0].d = 128, rows[0].S = 4096;
    rows[0].threads = 2;
    rows[0].us.n = 10, rows[0].us.median = 1236.5, rows[0].us.q1 = 1200, rows[0].us.q3 = 1300;
    rows[0].us.min = 1100, rows[0].us.max = 1400, rows[0].us.mean = 1250;
    rows[0].bytes_counted = rows[0].bytes_formula = rows[0].bytes_dense = 16781312;
    rows[0].gbps = 13.5, rows[0].speedup_vs_dense = 1, rows[0].theoretical_ratio = 1;

    rows[1] = rows[0];
    strcpy(rows[1].policy, "sparq");
    rows[1].r = 16, rows[1].k = 128, rows[1].l = 32;
    rows[1].us.median = 150;
    rows[1].bytes_counted = rows[1].bytes_formula = ((int64_t)1 << 40) + 1; /* printed as an integer */
    rows[1].speedup_vs_dense = 8.25, rows[1].theoretical_ratio = 0.125;

    rows[2] = rows[1];
    rows[2].S = 1024;
    rows[2].speedup_vs_dense = 2.0;

    bench_row_init(&rows[3], BENCH_DECODE);
    strcpy(rows[3].policy, "sparq");
    strcpy(rows[3].model, "a \"quoted\", model.gguf");
    strcpy(rows[3].fill, "random");
    rows[3].depth = rows[3].S = 32768;
    rows[3].us.median = 4000;
    rows[3].tok_s = 250;
    rows[3].peak_rss = (int64_t)9007199254740993LL; /* 2^53 + 1: must print exactly */

    bench_row_init(&rows[4], BENCH_MEMBW);
    strcpy(rows[4].policy, "read");
    rows[4].threads = 1;
    rows[4].bytes_counted = 1 << 30;
    rows[4].us.median = 1e5;
    rows[4].gbps = bench_gbps(1 << 30, 1e5);
}

static char *capture(int which, const bench_row *rows, int n, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    if (which == 0) bench_write_json(f, rows, n);
    else if (which == 1) bench_write_csv(f, rows, n);
    else if (which == 2) bench_print_table(f, rows, n);
    else bench_write_gnuplot(f, rows, n, "out's.png", "pngcairo", NULL);
    fclose(f);
    return buf;
}

static double num_of(const json_value *o, const char *key)
{
    const json_value *v = json_get(o, key);
    return v && v->type == JSON_NUMBER ? v->u.number : NAN;
}

static void test_json(void)
{
    bench_row rows[5];
    sample_rows(rows);
    size_t len;
    char *txt = capture(0, rows, 5, &len);
    char err[256];
    json_doc *doc = json_parse(txt, len, 0, err, sizeof err);
    CHECK(doc != NULL, "JSON does not parse: %s\n%s", err, txt);
    if (doc) {
        const json_value *root = json_root(doc);
        CHECK(root->type == JSON_ARRAY && root->n == 5, "array of 5");
        const json_value *a = json_at(root, 0), *s = json_at(root, 1), *dec = json_at(root, 3);
        const char *must[] = { "policy", "B", "H", "kv_heads", "d", "S", "r", "k", "threads", "median_us",
                               "gbps", "speedup_vs_dense", "theoretical_ratio", "depth", "tok_s" };
        for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
            CHECK(json_get(a, must[i]) != NULL, "key %s missing", must[i]);
        const json_value *pol = json_get(s, "policy");
        CHECK(pol && pol->type == JSON_STRING && strcmp(pol->u.str, "sparq") == 0, "policy sparq");
        CHECK(num_of(a, "S") == 4096 && num_of(a, "H") == 32 && num_of(a, "kv_heads") == 8, "shape");
        CHECK(num_of(a, "median_us") == 1236.5 && num_of(a, "q1_us") == 1200, "timings");
        CHECK(num_of(s, "r") == 16 && num_of(s, "k") == 128, "params");
        CHECK(num_of(s, "speedup_vs_dense") == 8.25, "speed-up");
        CHECK(num_of(s, "theoretical_ratio") == 0.125 && num_of(s, "theoretical_speedup") == 8, "ratio");
        const json_value *kind = json_get(dec, "kind"), *model = json_get(dec, "model");
        CHECK(kind && strcmp(kind->u.str, "decode") == 0, "decode kind");
        CHECK(model && strcmp(model->u.str, "a \"quoted\", model.gguf") == 0, "escaped model name");
        CHECK(num_of(dec, "depth") == 32768 && num_of(dec, "tok_s") == 250, "decode depth, tok/s");
        CHECK(num_of(dec, "ms_token") == 4, "ms per token");
        const json_value *g = json_get(dec, "gbps");
        CHECK(g && g->type == JSON_NULL, "NAN written as null");
        const json_value *kt = json_get(a, "kv_type");
        CHECK(kt && strcmp(kt->u.str, "f16") == 0, "kv_type");
        json_free(doc);
    }
    /* integers print exactly, even above 2^53 */
    CHECK(strstr(txt, "\"peak_rss_bytes\":9007199254740993") != NULL, "exact int64");
    CHECK(strstr(txt, "\"bytes_counted\":1099511627777") != NULL, "exact bytes");
    /* a membw row carries only what a bandwidth pass has */
    const char *mb = strstr(txt, "\"kind\":\"membw\"");
    CHECK(mb && !strstr(mb, "\"B\":") && !strstr(mb, "\"H\":") && !strstr(mb, "\"kv_type\":") &&
              !strstr(mb, "\"depth\":") && strstr(mb, "\"gbps\":") && strstr(mb, "\"threads\":1"),
          "membw JSON fields: %s", mb ? mb : txt);
    free(txt);

    txt = capture(0, rows, 0, &len);
    doc = json_parse(txt, len, 0, err, sizeof err);
    CHECK(doc && json_root(doc)->type == JSON_ARRAY && json_root(doc)->n == 0, "empty array");
    json_free(doc);
    free(txt);
}

/* Splits one CSV line into fields (RFC 4180 quotes); returns the count. */
static int csv_fields(const char *line, char out[][64], int max)
{
    int n = 0;
    const char *p = line;
    for (;;) {
        char *o = out[n];
        size_t k = 0;
        if (*p == '"') {
            p++;
            while (*p && !(*p == '"' && p[1] != '"')) {
                if (*p == '"') p++;
                if (k < 63) o[k++] = *p;
                p++;
            }
            if (*p == '"') p++;
        } else {
            while (*p && *p != ',' && *p != '\n')
                if (k < 63) o[k++] = *p++;
                else p++;
        }
        o[k] = 0;
        n++;
        if (*p != ',' || n == max) return n;
        p++;
    }
}

static void test_csv(void)
{
    bench_row rows[5];
    sample_rows(rows);
    size_t len;
    char *txt = capture(1, rows, 5, &len);
    char (*f)[64] = malloc(64 * sizeof *f);
    char *save = NULL, *line = strtok_r(txt, "\n", &save);
    int n_head = csv_fields(line, f, 64);
    CHECK(strcmp(f[0], "kind") == 0 && strcmp(f[1], "policy") == 0, "header starts kind,policy");
    int col_S = -1, col_gbps = -1, col_model = -1, col_med = -1;
    for (int i = 0; i < n_head; i++) {
        if (strcmp(f[i], "S") == 0) col_S = i;
        if (strcmp(f[i], "gbps") == 0) col_gbps = i;
        if (strcmp(f[i], "model") == 0) col_model = i;
        if (strcmp(f[i], "median_us") == 0) col_med = i;
    }
    CHECK(col_S > 0 && col_gbps > 0 && col_model > 0 && col_med > 0, "columns present");
    int n_lines = 0;
    while ((line = strtok_r(NULL, "\n", &save))) {
        int n = csv_fields(line, f, 64);
        CHECK(n == n_head, "line %d has %d fields, header %d", n_lines, n, n_head);
        if (n_lines == 0) {
            CHECK(strcmp(f[col_S], "4096") == 0, "S cell '%s'", f[col_S]);
            CHECK(strcmp(f[col_med], "1236.5") == 0, "median cell '%s'", f[col_med]);
            CHECK(strcmp(f[col_gbps], "13.5") == 0, "gbps cell '%s'", f[col_gbps]);
        }
        if (n_lines == 3) {
            CHECK(strcmp(f[col_model], "a \"quoted\", model.gguf") == 0, "quoted cell '%s'", f[col_model]);
            CHECK(f[col_gbps][0] == 0, "NAN cell empty");
        }
        n_lines++;
    }
    CHECK(n_lines == 5, "5 data lines, got %d", n_lines);
    free(f);
    free(txt);
}

static void test_table_and_plot(void)
{
    bench_row rows[5];
    sample_rows(rows);
    size_t len;
    char *txt = capture(2, rows, 5, &len);
    CHECK(strstr(txt, "policy") && strstr(txt, "sparq") && strstr(txt, "tok/s") && strstr(txt, "GB/s"),
          "table sections");
    free(txt);

    char lab[128];
    bench_series_label(rows, 5, &rows[1], lab, sizeof lab);
    CHECK(strcmp(lab, "sparq r=16 k=128") == 0, "label '%s'", lab);
    bench_row two[2] = { rows[1], rows[1] };
    two[1].threads = 1;
    bench_series_label(two, 2, &two[0], lab, sizeof lab);
    CHECK(strcmp(lab, "sparq r=16 k=128 t=2") == 0, "label with threads '%s'", lab);

    txt = capture(3, rows, 5, &len);
    CHECK(strstr(txt, "set terminal pngcairo") != NULL, "terminal");
    CHECK(strstr(txt, "set output 'out''s.png'") != NULL, "quoted output path");
    CHECK(strstr(txt, "'sparq r=16 k=128'") != NULL, "curve title");
    const char *p1024 = strstr(txt, "\n1024 2 8\n"), *p4096 = strstr(txt, "\n4096 8.25 8\n");
    CHECK(p1024 && p4096 && p1024 < p4096, "points sorted by S:\n%s", txt);
    CHECK(strstr(txt, "$s1") == NULL, "one curve only (dense is the reference line)");
    free(txt);

    char *buf = NULL;
    FILE *f = open_memstream(&buf, &len);
    CHECK(bench_write_gnuplot(f, rows + 3, 2, "x.png", "png", NULL) == 0, "nothing to plot without attn rows");
    CHECK(bench_write_gnuplot(f, rows, 3, "x.png", "png", NULL) == 1, "one curve");
    fclose(f);
    free(buf);

    /* decode rows: tok/s against depth, one curve per policy, points by depth */
    bench_row dr[4];
    for (int i = 0; i < 4; i++) {
        dr[i] = rows[3];
        strcpy(dr[i].policy, i < 2 ? "dense" : "sparq");
        dr[i].r = i < 2 ? 0 : 16;
        dr[i].k = i < 2 ? 0 : 128;
        dr[i].depth = dr[i].S = i % 2 ? 0 : 4096;
        dr[i].tok_s = 100 + i;
    }
    buf = NULL;
    f = open_memstream(&buf, &len);
    CHECK(bench_write_gnuplot_decode(f, dr, 4, "d.png", "png", NULL) == 2, "two decode curves");
    CHECK(bench_write_gnuplot_decode(f, rows, 3, "d.png", "png", NULL) == 0, "no decode rows, no curve");
    fclose(f);
    const char *d0 = buf ? strstr(buf, "$d0 << EOD\n0 101\n4096 100\nEOD") : NULL;
    CHECK(d0 && strstr(buf, "title 'sparq r=16 k=128'") && strstr(buf, "decode tokens/s"), "decode plot:\n%s", buf);
    free(buf);
}

/* ---- sparq bench decode | attn with each KV type ------------------------------- */

static char bin[1024];
static char tmpdir[] = "/tmp/sparq_bench_XXXXXX"; /* mkdtemp: suites may run at once */

/* Runs `sparq ARGS` with stdout captured into *out (stderr to a file);
 * returns the exit code. */
static int run_sparq(const char *args, char **out, char **err_out)
{
    char cmd[4096], po[300], pe[300];
    snprintf(po, sizeof po, "%s/out.txt", tmpdir);
    snprintf(pe, sizeof pe, "%s/err.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "timeout 120 %s %s >%s 2>%s", bin, args, po, pe);
    int st = system(cmd);
    size_t n;
    *out = test_read_file(po, &n);
    if (!*out) *out = calloc(1, 1);
    if (err_out) {
        *err_out = test_read_file(pe, &n);
        if (!*err_out) *err_out = calloc(1, 1);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static const char *str_of(const json_value *o, const char *key)
{
    const char *s = json_get_str(o, key, NULL);
    return s ? s : "";
}

/* `sparq ARGS` must fail, its message containing want. */
static void check_refused(const char *args, const char *want)
{
    char *out, *err;
    const int rc = run_sparq(args, &out, &err);
    CHECK(rc != 0 && strstr(err, want), "sparq %s: exit %d, want a message with '%s': %s", args, rc, want, err);
    free(out);
    free(err);
}

/* The row of `kind` with this policy, kv_type and S (decode: depth). */
static const json_value *find_row(const json_value *root, const char *policy, const char *kv, int64_t S)
{
    for (size_t i = 0; i < json_len(root); i++) {
        const json_value *r = json_at(root, i);
        if (strcmp(str_of(r, "policy"), policy) == 0 && strcmp(str_of(r, "kv_type"), kv) == 0 &&
            num_of(r, "S") == (double)S)
            return r;
    }
    return NULL;
}

/* Dense decode transfer, elements per token, written out: each of the
 * n_layer x n_kv_head heads reads S rows of K and of V (d each) and
 * appends one of each, S = position + 1. After the fill to `depth` come
 * `warm` untimed tokens, then n timed ones at S = depth + warm + 1 ...
 * depth + warm + n; the row reports their total over n. */
static double dense_decode_elements(int n_layer, int kvh, int d, int64_t depth, int warm, int n)
{
    double total = 0;
    for (int i = 1; i <= n; i++) total += 2.0 * (double)(depth + warm + i) * d + 2.0 * d;
    return total * n_layer * kvh / n;
}

static void test_bench_decode_kv(const char *model)
{
    /* tiny: 2 layers, 2 KV heads, head size 32 (whole Q8_0 blocks, so the
     * byte counts are exact); n = 3 makes every total divide by n */
    const int n_layer = 2, n = 3, warm = 1;
    const int64_t depth = 96;
    char args[2048], *out, *err, e[256];
    snprintf(args, sizeof args, "bench decode -m %s --depth %lld --attn dense,sparq --sparq-r 8 --sparq-k 16 "
             "--kv-type f16,q8_0 --fill random -n %d --warmup %d -t 1 --json", model, (long long)depth, n, warm);
    int rc = run_sparq(args, &out, &err);
    CHECK(rc == 0, "bench decode --kv-type f16,q8_0: exit %d: %s", rc, err);
    json_doc *doc = json_parse(out, strlen(out), 0, e, sizeof e);
    CHECK(doc != NULL, "bench decode --json is JSON: %s", e);
    if (doc) {
        const json_value *root = json_root(doc);
        CHECK(json_len(root) == 8, "2 kv types x 2 policies x depths 0 and %lld: %zu rows", (long long)depth,
              json_len(root));
        const json_value *df = find_row(root, "dense", "f16", depth), *dq = find_row(root, "dense", "q8_0", depth);
        const json_value *sq = find_row(root, "sparq", "q8_0", depth), *z = find_row(root, "dense", "q8_0", 0);
        CHECK(df && dq && sq && z, "rows dense f16, dense q8_0, sparq q8_0 at depth %lld, dense q8_0 at 0",
              (long long)depth);
        if (df && dq && sq && z) {
            const int kvh = (int)num_of(dq, "kv_heads"), d = (int)num_of(dq, "d");
            CHECK(kvh == 2 && d == 32, "tiny's shape: %d KV heads, d %d", kvh, d);
            const double el = dense_decode_elements(n_layer, kvh, d, depth, warm, n);
            const double want_q8 = el * 34 / 32, want_f16 = el * 2;
            CHECK(num_of(dq, "bytes_counted") == want_q8, "dense q8_0 counted %.0f bytes/token, want %.0f",
                  num_of(dq, "bytes_counted"), want_q8);
            CHECK(num_of(dq, "bytes_dense") == want_q8 && num_of(dq, "bytes_formula") == want_q8,
                  "dense q8_0 formula %.0f, dense %.0f, want %.0f", num_of(dq, "bytes_formula"),
                  num_of(dq, "bytes_dense"), want_q8);
            CHECK(num_of(df, "bytes_counted") == want_f16, "dense f16 counted %.0f, want %.0f",
                  num_of(df, "bytes_counted"), want_f16);
            CHECK(num_of(dq, "kv_elem_bytes") == 1.0625 && num_of(df, "kv_elem_bytes") == 2, "kv_elem_bytes");
            const double want0 = dense_decode_elements(n_layer, kvh, d, 0, warm, n) * 34 / 32;
            CHECK(num_of(z, "bytes_counted") == want0, "depth 0 q8_0: %.0f, want %.0f", num_of(z, "bytes_counted"),
                  want0);
            /* SparQ on the q8_0 cache: the same dense reference, a fraction of it moved */
            CHECK(num_of(sq, "bytes_dense") == want_q8, "sparq q8_0 dense reference %.0f", num_of(sq, "bytes_dense"));
            CHECK(num_of(sq, "bytes_counted") > 0 && num_of(sq, "bytes_counted") < 0.5 * want_q8 &&
                      fabs(num_of(sq, "bytes_counted") / num_of(sq, "bytes_formula") - 1) < 0.01,
                  "sparq q8_0 counted %.0f, formula %.0f", num_of(sq, "bytes_counted"), num_of(sq, "bytes_formula"));
            const json_value *g = json_get(dq, "gbps");
            if (g && g->type == JSON_NUMBER) /* attention time > 0: GB/s of the real bytes */
                CHECK_NEAR(g->u.number, want_q8 / (num_of(dq, "ms_attn") * 1e6), 2e-4 * g->u.number);
            else /* no rate only when the step's attention time came out <= 0 (timing noise) */
                CHECK(num_of(dq, "ms_attn") <= 0, "q8_0 row has no gbps with attention time %g ms",
                      num_of(dq, "ms_attn"));
        }
        json_free(doc);
    }
    free(out);
    free(err);

    /* CSV carries the type too */
    snprintf(args, sizeof args, "bench decode -m %s --depth 0 --attn dense --kv-type q8_0 -n 1 --warmup 0 -t 1 --csv",
             model);
    rc = run_sparq(args, &out, NULL);
    CHECK(rc == 0 && strstr(out, ",kv_type,kv_elem_bytes,") && strstr(out, ",q8_0,1.0625,"), "decode CSV: %s", out);
    free(out);
    snprintf(args, sizeof args, "bench decode -m %s --depth 0 --kv-type q4", model);
    check_refused(args, "'q4' is not f16, f32 or q8_0");
}

/* bench decode -np: nb sequences in one batched step each move what one
 * sequence moves, nb times over, and the row's tok/s is the aggregate. */
static void test_bench_decode_parallel(const char *model)
{
    const int n_layer = 2, n = 3, warm = 1, nb = 3;
    const int64_t depth = 96;
    char args[2048], *out, *err, e[256];
    snprintf(args, sizeof args, "bench decode -m %s --depth %lld --attn dense -np 1,%d --fill random -n %d "
             "--warmup %d -t 1 --json", model, (long long)depth, nb, n, warm);
    int rc = run_sparq(args, &out, &err);
    CHECK(rc == 0, "bench decode -np 1,%d: exit %d: %s", nb, rc, err);
    json_doc *doc = rc == 0 ? json_parse(out, strlen(out), 0, e, sizeof e) : NULL;
    CHECK(doc != NULL, "bench decode -np --json is JSON: %s", e);
    if (doc) {
        const json_value *root = json_root(doc), *one = NULL, *many = NULL;
        CHECK(json_len(root) == 4, "2 np x depths 0 and %lld: %zu rows", (long long)depth, json_len(root));
        for (size_t i = 0; i < json_len(root); i++) {
            const json_value *r = json_at(root, i);
            if (num_of(r, "S") != (double)depth) continue;
            if (num_of(r, "B") == 1) one = r;
            if (num_of(r, "B") == nb) many = r;
        }
        CHECK(one && many, "rows np 1 and np %d at depth %lld", nb, (long long)depth);
        if (one && many) {
            const double el = dense_decode_elements(n_layer, (int)num_of(one, "kv_heads"), (int)num_of(one, "d"),
                                                    depth, warm, n) * 2;
            CHECK(num_of(one, "bytes_counted") == el && num_of(many, "bytes_counted") == nb * el,
                  "a step of %d sequences moves %d x one's bytes: %.0f, %.0f (one: %.0f)", nb, nb,
                  num_of(many, "bytes_counted"), nb * el, num_of(one, "bytes_counted"));
            const json_value *us = json_get(many, "median_us");
            /* both numbers are printed with 6 significant digits (%.6g), each
             * off by up to 5e-6 of itself: together up to 1e-5 relative */
            if (us && us->type == JSON_NUMBER)
                CHECK_NEAR(num_of(many, "tok_s"), nb * 1e6 / us->u.number, 2e-5 * num_of(many, "tok_s"));
            else
                CHECK(0, "np %d row has median_us", nb);
        }
        json_free(doc);
    }
    free(out);
    free(err);
    const char *bad[] = { "0", "257", "1,x" };
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "bench decode -m %s --depth 0 -np %s -n 1", model, bad[i]);
        check_refused(args, "-np");
    }
}

/* bench decode --rounds: both policies' contexts at once, taking turns;
 * each row counts its own R x n steps (the dense one moves exactly the
 * bytes of R x n tokens after the warm-up, so no step of the other policy
 * is booked to it), and the log shows every round. */
static void test_bench_decode_rounds(const char *model)
{
    const int n_layer = 2, n = 3, warm = 1, nb = 2, R = 3;
    const int64_t depth = 96;
    char args[2048], *out, *err, e[256];
    snprintf(args, sizeof args, "bench decode -m %s --depth %lld --attn dense,sparq --sparq-r 8 --sparq-k 16 -np %d "
             "--fill random -n %d --warmup %d --rounds %d -t 1 --json", model, (long long)depth, nb, n, warm, R);
    int rc = run_sparq(args, &out, &err);
    CHECK(rc == 0, "bench decode --rounds %d: exit %d: %s", R, rc, err);
    json_doc *doc = rc == 0 ? json_parse(out, strlen(out), 0, e, sizeof e) : NULL;
    CHECK(doc != NULL, "bench decode --rounds --json is JSON: %s", e);
    if (doc) {
        const json_value *root = json_root(doc);
        const json_value *dn = find_row(root, "dense", "f16", depth), *sp = find_row(root, "sparq", "f16", depth);
        CHECK(json_len(root) == 4 && dn && sp, "2 policies x depths 0 and %lld: %zu rows", (long long)depth,
              json_len(root));
        if (dn && sp) {
            const double el = dense_decode_elements(n_layer, (int)num_of(dn, "kv_heads"), (int)num_of(dn, "d"), depth,
                                                    warm, R * n) * 2 * nb;
            CHECK(num_of(dn, "n_samples") == R * n && num_of(sp, "n_samples") == R * n, "samples %.0f, %.0f (want %d)",
                  num_of(dn, "n_samples"), num_of(sp, "n_samples"), R * n);
            CHECK(num_of(dn, "bytes_counted") == el, "dense over %d rounds: %.0f bytes a step, want %.0f", R,
                  num_of(dn, "bytes_counted"), el);
            CHECK(num_of(sp, "bytes_counted") > 0 && num_of(sp, "bytes_counted") < el &&
                      fabs(num_of(sp, "speedup_vs_dense") - num_of(sp, "tok_s") / num_of(dn, "tok_s")) <
                          1e-4 * num_of(sp, "speedup_vs_dense"),
                  "sparq: %.0f bytes a step, speed-up %.4f", num_of(sp, "bytes_counted"), num_of(sp, "speedup_vs_dense"));
        }
        json_free(doc);
    }
    char want[64];
    snprintf(want, sizeof want, "depth=%lld round %d/%d: dense", (long long)depth, R, R);
    CHECK(strstr(err, want) && strstr(strstr(err, want), " sparq "), "the log shows round %d of both: %s", R, err);
    free(out);
    free(err);
    snprintf(args, sizeof args, "bench decode -m %s --depth 0 --rounds 0 -n 1", model);
    check_refused(args, "--rounds");
}

static void test_bench_attn_kv(void)
{
    const int64_t S = 256;
    const int d = 64, kvh = 2;
    char args[1024], *out, *err, e[256];
    snprintf(args, sizeof args, "bench attn --S %lld --H 4 --kv-heads %d --d %d --kv-type f16,q8_0 "
             "--attn dense,sparq --sparq-r 8 --sparq-k 32 --reps 1 --warmup 1 --min-sample-us 0 -t 1 --json",
             (long long)S, kvh, d);
    int rc = run_sparq(args, &out, &err);
    CHECK(rc == 0, "bench attn --kv-type f16,q8_0: exit %d: %s", rc, err);
    json_doc *doc = json_parse(out, strlen(out), 0, e, sizeof e);
    CHECK(doc != NULL, "bench attn --json is JSON: %s", e);
    if (doc) {
        const json_value *root = json_root(doc);
        const json_value *df = find_row(root, "dense", "f16", S), *dq = find_row(root, "dense", "q8_0", S);
        const json_value *sf = find_row(root, "sparq", "f16", S), *sq = find_row(root, "sparq", "q8_0", S);
        CHECK(json_len(root) == 4 && df && dq && sf && sq, "dense and sparq rows for f16 and q8_0 (%zu rows)",
              json_len(root));
        if (df && dq && sf && sq) {
            /* one call, B = 1: kvh heads, each S rows of K and V plus the append */
            const double el = (double)kvh * (2.0 * S * d + 2.0 * d);
            CHECK(num_of(df, "bytes_counted") == el * 2 && num_of(dq, "bytes_counted") == el * 34 / 32,
                  "dense bytes f16 %.0f (want %.0f), q8_0 %.0f (want %.0f)", num_of(df, "bytes_counted"), el * 2,
                  num_of(dq, "bytes_counted"), el * 34 / 32);
            CHECK_NEAR(num_of(dq, "bytes_counted") / num_of(df, "bytes_counted"), 34.0 / 64.0, 1e-12);
            CHECK_NEAR(num_of(sq, "bytes_counted") / num_of(sf, "bytes_counted"), 34.0 / 64.0, 0.01);
            CHECK(num_of(sq, "bytes_dense") == el * 34 / 32, "sparq q8_0 dense reference %.0f",
                  num_of(sq, "bytes_dense"));
            CHECK_NEAR(num_of(dq, "gbps"), num_of(dq, "bytes_counted") / (num_of(dq, "median_us") * 1e3),
                       2e-4 * num_of(dq, "gbps"));
            CHECK(num_of(dq, "kv_elem_bytes") == 1.0625, "q8_0 bytes per element");
        }
        json_free(doc);
    }
    free(out);
    free(err);
}

static void test_bench_runs(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return;
    }
    if (!mkdtemp(tmpdir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    char model[300], args[1024], *out;
    snprintf(model, sizeof model, "%s/tiny.gguf", tmpdir);
    snprintf(args, sizeof args, "gen-model --shape tiny --type Q8_0 --seed 3 -o %s", model);
    CHECK(run_sparq(args, &out, NULL) == 0, "gen-model tiny");
    free(out);
    test_bench_decode_kv(model);
    test_bench_decode_parallel(model);
    test_bench_decode_rounds(model);
    test_bench_attn_kv();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(void)
{
    test_stats();
    test_transfer();
    test_counted_matches_formula();
    test_kv_bytes();
    test_fill_kv();
    test_lists();
    test_data();
    test_sum_kernels();
    test_json();
    test_csv();
    test_table_and_plot();
    test_bench_runs();
    return test_summary("test_bench");
}
