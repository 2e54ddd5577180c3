/* bench.c - benchmark arithmetic and reporting (see bench.h).
 *
 * Map: statistics | transfer arithmetic (bytes per KV element type) | list
 * parsing | test data and the KV cache fill | read-bandwidth kernels |
 * rows -> table / JSON / CSV | gnuplot script.
 */
#include "bench/bench.h"
#include "util/err.h"
#include "util/rng.h"

#include <math.h>
#include <stdint.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* ---- statistics ------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_quantile_sorted(const double *sorted, int n, double p)
{
    if (n <= 0) return NAN;
    if (p <= 0) return sorted[0];
    if (p >= 1) return sorted[n - 1];
    double pos = p * (double)(n - 1);
    int lo = (int)floor(pos);
    if (lo >= n - 1) return sorted[n - 1];
    double frac = pos - lo;
    return sorted[lo] + frac * (sorted[lo + 1] - sorted[lo]);
}

void bench_stats_of(const double *x, int n, double *work, bench_stats *out)
{
    out->n = n > 0 ? n : 0;
    if (n <= 0) {
        out->median = out->q1 = out->q3 = out->min = out->max = out->mean = NAN;
        return;
    }
    memcpy(work, x, (size_t)n * sizeof *work);
    qsort(work, (size_t)n, sizeof *work, cmp_double);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += work[i];
    out->min = work[0];
    out->max = work[n - 1];
    out->mean = sum / n;
    out->median = bench_quantile_sorted(work, n, 0.5);
    out->q1 = bench_quantile_sorted(work, n, 0.25);
    out->q3 = bench_quantile_sorted(work, n, 0.75);
}

/* ---- transfer arithmetic ----------------------------------------------------- */

int64_t bench_kv_bytes(int kv_elem, int64_t elements)
{
    /* ask the cache itself, so bench rows and the context's counters
     * (forward.c adds kv_bytes_of to sparq_attn_stats.bytes) agree */
    kv_cache shape;
    memset(&shape, 0, sizeof shape);
    shape.elem = kv_elem;
    shape.elem_size = kv_elem == KV_F32 ? 4 : kv_elem == KV_F16 ? 2 : 1;
    return kv_bytes_of(&shape, elements);
}

double bench_kv_elem_bytes(int kv_elem)
{
    switch (kv_elem) {
    case KV_F32: return 4;
    case KV_F16: return 2;
    case KV_Q8_0: return (double)ATTN_Q8_BLOCK_BYTES / ATTN_Q8_BLOCK;
    default: return NAN;
    }
}

const char *bench_kv_name(int kv_elem)
{
    return kv_elem == KV_F32 ? "f32" : kv_elem == KV_F16 ? "f16" : kv_elem == KV_Q8_0 ? "q8_0" : "?";
}

int64_t bench_counted_bytes(const attn_counts *c, int64_t pairs, int kv_elem)
{
    int64_t el = 0;
    for (int64_t i = 0; i < pairs; i++) el += c[i].read + c[i].written;
    return bench_kv_bytes(kv_elem, el);
}

int64_t bench_formula_bytes(const attn_policy *pol, const sparq_attn_params *p, int64_t S, int d,
                            int g, int64_t pairs, int kv_elem)
{
    return bench_kv_bytes(kv_elem, pairs * pol->transfer_formula(p, S, d, g));
}

double bench_gbps(double bytes, double us)
{
    if (!(us > 0)) return NAN;
    return bytes / (us * 1e3); /* bytes / (us * 1e-6 s) / 1e9 */
}

double bench_speedup(double ref_us, double us)
{
    if (!(us > 0) || !(ref_us > 0)) return NAN;
    return ref_us / us;
}

double bench_ratio(double policy_bytes, double dense_bytes)
{
    if (!(dense_bytes > 0)) return NAN;
    return policy_bytes / dense_bytes;
}

/* ---- list parsing -------------------------------------------------------------- */

int bench_parse_list(const char *s, int64_t *out, int max, char *err, size_t err_size)
{
    int n = 0;
    const char *p = s;
    if (!s || !*s) {
        return err_set(err, err_size, "empty list");
    }
    for (;;) {
        const char *item = p;
        int64_t v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9') {
            if (v > (INT64_MAX - 9) / 10) goto bad;
            v = v * 10 + (*p - '0');
            p++;
            digits++;
        }
        if (!digits) goto bad;
        int64_t mul = 1;
        if (*p == 'k' || *p == 'K') mul = 1024, p++;
        else if (*p == 'm' || *p == 'M') mul = 1048576, p++;
        if (v > INT64_MAX / mul) goto bad;
        v *= mul;
        if (*p != ',' && *p != 0) goto bad;
        if (n >= max) {
            return err_set(err, err_size, "list '%s' has more than %d items", s, max);
        }
        out[n++] = v;
        if (*p == 0) return n;
        p++;
        continue;
    bad:;
        const char *end = strchr(item, ',');
        int len = end ? (int)(end - item) : (int)strlen(item);
        return err_set(err, err_size, "'%.*s' in list '%s' is not a non-negative integer (suffix k or M allowed)",
                       len, item, s);
    }
}

int bench_split_names(const char *s, char *buf, size_t buf_size, const char **out, int max,
                      char *err, size_t err_size)
{
    size_t len = s ? strlen(s) : 0;
    if (len == 0 || len >= buf_size) {
        return err_set(err, err_size, "list '%s' is empty or too long", s ? s : "");
    }
    memcpy(buf, s, len + 1);
    int n = 0;
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (!*p) {
            return err_set(err, err_size, "list '%s' has an empty item", s);
        }
        if (n >= max) {
            return err_set(err, err_size, "list '%s' has more than %d items", s, max);
        }
        out[n++] = p;
        if (!comma) return n;
        p = comma + 1;
    }
}

/* ---- test data ------------------------------------------------------------------ */

void bench_rng_seed(bench_rng *r, uint64_t seed) { r->s = seed; }

uint64_t bench_rng_next(bench_rng *r) { return rng_splitmix64(&r->s); }

/* Marsaglia's polar method: two exact N(0,1) values per accepted point of
 * the unit disc (acceptance pi/4), one log and one sqrt, no trigonometry. */
void bench_randn(bench_rng *r, float *x, size_t n)
{
    for (size_t i = 0; i < n; i += 2) {
        double u, v, s;
        do {
            u = (double)(bench_rng_next(r) >> 11) * 0x1.0p-52 - 1.0;
            v = (double)(bench_rng_next(r) >> 11) * 0x1.0p-52 - 1.0;
            s = u * u + v * v;
        } while (s >= 1.0 || s == 0.0);
        double f = sqrt(-2.0 * log(s) / s);
        x[i] = (float)(u * f);
        if (i + 1 < n) x[i + 1] = (float)(v * f);
    }
}

void bench_query(bench_rng *r, float *q, int n_heads, int d, int heavy)
{
    bench_randn(r, q, (size_t)n_heads * d);
    if (!heavy) return;
    float scale[1024];
    for (int j0 = 0; j0 < d; j0 += 1024) {
        int m = d - j0 < 1024 ? d - j0 : 1024;
        bench_randn(r, scale, (size_t)m);
        for (int j = 0; j < m; j++) scale[j] = expf(1.5f * scale[j]);
        for (int h = 0; h < n_heads; h++)
            for (int j = 0; j < m; j++) q[(size_t)h * d + j0 + j] *= scale[j];
    }
}

/* Generating the numbers is the slow part and runs on all threads, a chunk
 * of positions at a time; kv_write keeps per-layer state (the running V
 * sum, Q8_0 K^T's partial block), so each layer's rows are then stored by
 * one thread, in position order. */
int bench_fill_kv(kv_cache *kv, int64_t from, int64_t to, uint64_t seed, int threads)
{
    const size_t row = (size_t)kv->n_kv_head * kv->d, B = (size_t)kv->n_layer;
    int64_t chunk = (int64_t)(((size_t)8 << 20) / (B * 2 * row)); /* ~32 MiB of f32 */
    if (chunk < 1) chunk = 1;
    float *buf = malloc((size_t)chunk * B * 2 * row * sizeof(float));
    if (!buf) return -1;
    for (int64_t p0 = from; p0 < to; p0 += chunk) {
        const int64_t n = to - p0 < chunk ? to - p0 : chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t i = 0; i < n * (int64_t)B; i++) {
            const int64_t b = i / n, p = p0 + i % n;
            bench_rng r;
            bench_rng_seed(&r, seed ^ ((uint64_t)p * 0xD1B54A32D192ED03ull) ^ ((uint64_t)b << 48));
            bench_randn(&r, buf + (size_t)i * 2 * row, 2 * row);
        }
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int b = 0; b < (int)B; b++)
            for (int64_t i = 0; i < n; i++) {
                const float *k = buf + ((size_t)b * n + i) * 2 * row;
                kv_write(kv, b, p0 + i, k, k + row);
            }
    }
    free(buf);
    kv->n = to;
    return 0;
}

/* ---- read-bandwidth kernels ------------------------------------------------------- */

float bench_sum_f32_ref(const float *x, size_t n)
{
    float s = 0;
    for (size_t i = 0; i < n; i++) s += x[i];
    return s;
}

const bench_kernels bench_kernels_ref = { bench_sum_f32_ref };

/* Levels without a twin (ARM64's) read through the reference loop, which
 * GCC vectorises only as far as the baseline allows: bench membw then
 * measures a slower loop, not a slower memory. */
static const bench_kernels *const tables[CPU_LEVELS] = {
    [CPU_REF] = &bench_kernels_ref,
#if defined(__x86_64__)
    [CPU_AVX2] = &bench_kernels_avx2,
    [CPU_AVX512] = &bench_kernels_avx512,
#else
    [CPU_AVX2] = &bench_kernels_ref,
    [CPU_AVX512] = &bench_kernels_ref,
#endif
    [CPU_NEON] = &bench_kernels_ref,
    [CPU_NEON_DOTPROD] = &bench_kernels_ref,
};

const bench_kernels *bench_kernels_at(cpu_level level) { return tables[level]; }

float bench_sum_f32(const float *x, size_t n) { return tables[cpu_level_get()]->sum_f32(x, n); }

/* ---- rows ---------------------------------------------------------------------------- */

void bench_row_init(bench_row *r, bench_kind kind)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->kv_elem = KV_F16;
    r->us.median = r->us.q1 = r->us.q3 = r->us.min = r->us.max = r->us.mean = NAN;
    r->gbps = r->speedup_vs_dense = r->theoretical_ratio = r->pct_bw = NAN;
    r->tok_s = r->tok_s_mean = r->ms_weights = r->ms_attn = NAN;
}

const char *bench_kind_name(bench_kind k)
{
    return k == BENCH_ATTN ? "attn" : k == BENCH_MEMBW ? "membw" : "decode";
}

/* One column of the JSON / CSV output. Computed columns have kind F_FN. */
typedef enum { F_INT, F_I64, F_DBL, F_STR, F_FN } field_kind;
typedef struct field {
    const char *name;
    field_kind  kind;
    size_t      off;
} field;

#define RF(name, kind, member) { name, kind, offsetof(bench_row, member) }
static const field fields[] = {
    { "kind", F_FN, 0 },
    RF("policy", F_STR, policy),
    RF("model", F_STR, model),
    RF("fill", F_STR, fill),
    RF("B", F_INT, B),
    RF("H", F_INT, H),
    RF("kv_heads", F_INT, kv_heads),
    RF("d", F_INT, d),
    RF("S", F_I64, S),
    RF("r", F_INT, r),
    RF("k", F_INT, k),
    RF("l", F_INT, l),
    RF("threads", F_INT, threads),
    { "kv_type", F_FN, 0 },
    { "kv_elem_bytes", F_FN, 0 },
    RF("heavy_query", F_INT, heavy_query),
    RF("inner", F_INT, inner),
    RF("n_samples", F_INT, us.n),
    RF("median_us", F_DBL, us.median),
    RF("q1_us", F_DBL, us.q1),
    RF("q3_us", F_DBL, us.q3),
    RF("min_us", F_DBL, us.min),
    RF("max_us", F_DBL, us.max),
    RF("mean_us", F_DBL, us.mean),
    RF("bytes_counted", F_I64, bytes_counted),
    RF("bytes_formula", F_I64, bytes_formula),
    RF("bytes_dense", F_I64, bytes_dense),
    RF("gbps", F_DBL, gbps),
    RF("pct_bw", F_DBL, pct_bw),
    RF("speedup_vs_dense", F_DBL, speedup_vs_dense),
    RF("theoretical_ratio", F_DBL, theoretical_ratio),
    { "theoretical_speedup", F_FN, 0 },
    RF("depth", F_I64, depth),
    RF("tok_s", F_DBL, tok_s),
    RF("tok_s_mean", F_DBL, tok_s_mean),
    { "ms_token", F_FN, 0 },
    RF("ms_weights", F_DBL, ms_weights),
    RF("ms_attn", F_DBL, ms_attn),
    RF("rss_bytes", F_I64, rss),
    RF("peak_rss_bytes", F_I64, peak_rss),
};
#undef RF
enum { N_FIELDS = sizeof fields / sizeof fields[0] };

/* Value of a computed or double column (NAN = none); *str set for text. */
static double field_value(const bench_row *r, const field *f, const char **str)
{
    const char *base = (const char *)r + f->off;
    *str = NULL;
    switch (f->kind) {
    case F_INT: return *(const int *)base;
    case F_I64: return (double)*(const int64_t *)base;
    case F_DBL: return *(const double *)base;
    case F_STR: *str = base; return 0;
    case F_FN: break;
    }
    if (strcmp(f->name, "kind") == 0) { *str = bench_kind_name(r->kind); return 0; }
    if (strcmp(f->name, "kv_type") == 0) { *str = bench_kv_name(r->kv_elem); return 0; }
    if (strcmp(f->name, "kv_elem_bytes") == 0) return bench_kv_elem_bytes(r->kv_elem);
    if (strcmp(f->name, "theoretical_speedup") == 0)
        return r->theoretical_ratio > 0 ? 1.0 / r->theoretical_ratio : NAN;
    if (strcmp(f->name, "ms_token") == 0) return r->kind == BENCH_DECODE ? r->us.median / 1e3 : NAN;
    return NAN;
}

/* Exact value of an integer column (doubles would round int64 above 2^53). */
static long long field_int(const bench_row *r, const field *f)
{
    const char *base = (const char *)r + f->off;
    return f->kind == F_INT ? (long long)*(const int *)base : (long long)*(const int64_t *)base;
}

static void json_text(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* JSON leaves out what a kind of row does not have: a bandwidth pass has
 * no attention shape, policy parameters, KV type or decode figures. (CSV
 * keeps every column: one header serves every row.) */
static int field_applies(bench_kind kind, const char *name)
{
    static const char *const membw[] = { "kind", "policy", "threads", "inner", "n_samples", "median_us", "q1_us",
                                         "q3_us", "min_us", "max_us", "mean_us", "bytes_counted", "gbps" };
    if (kind != BENCH_MEMBW) return 1;
    for (size_t i = 0; i < sizeof membw / sizeof membw[0]; i++)
        if (strcmp(name, membw[i]) == 0) return 1;
    return 0;
}

int bench_write_json(FILE *f, const bench_row *rows, int n)
{
    fputs("[", f);
    for (int i = 0; i < n; i++) {
        fputs(i ? ",\n {" : "\n {", f);
        for (int j = 0, first = 1; j < N_FIELDS; j++) {
            if (!field_applies(rows[i].kind, fields[j].name)) continue;
            const char *str;
            double v = field_value(&rows[i], &fields[j], &str);
            fprintf(f, "%s\"%s\":", first ? "" : ", ", fields[j].name);
            first = 0;
            if (str) json_text(f, str);
            else if (fields[j].kind == F_INT || fields[j].kind == F_I64)
                fprintf(f, "%lld", field_int(&rows[i], &fields[j]));
            else if (isfinite(v)) fprintf(f, "%.6g", v);
            else fputs("null", f);
        }
        fputs("}", f);
    }
    fputs(n ? "\n]\n" : "]\n", f);
    return ferror(f) ? -1 : 0;
}

static void csv_text(FILE *f, const char *s)
{
    if (!strpbrk(s, ",\"\n\r")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

int bench_write_csv(FILE *f, const bench_row *rows, int n)
{
    for (int j = 0; j < N_FIELDS; j++) fprintf(f, "%s%s", j ? "," : "", fields[j].name);
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < N_FIELDS; j++) {
            const char *str;
            double v = field_value(&rows[i], &fields[j], &str);
            if (j) fputc(',', f);
            if (str) csv_text(f, str);
            else if (fields[j].kind == F_INT || fields[j].kind == F_I64) fprintf(f, "%lld", field_int(&rows[i], &fields[j]));
            else if (isfinite(v)) fprintf(f, "%.6g", v);
        }
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

/* ---- human table --------------------------------------------------------------------- */

/* "%*.*f" or a dash for NAN, into a small buffer. */
static const char *num(char *buf, size_t size, double v, int prec)
{
    if (isfinite(v)) snprintf(buf, size, "%.*f", prec, v);
    else snprintf(buf, size, "-");
    return buf;
}

static void table_attn(FILE *f, const bench_row *rows, int n)
{
    fprintf(f, "%-10s %4s %5s %3s %4s %4s %4s %8s %2s %4s %11s %21s %9s %9s %7s %5s %8s %8s\n", "policy",
            "r", "k", "B", "H", "kvh", "d", "S", "t", "kv", "median_us", "iqr_us", "MB/call", "MB/formula",
            "GB/s", "%bw", "speedup", "theory");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        if (r->kind != BENCH_ATTN) continue;
        char a[32], b[32], c[32], e[32], g[32], h[32], iqr[80];
        snprintf(iqr, sizeof iqr, "%s..%s", num(a, sizeof a, r->us.q1, 1), num(b, sizeof b, r->us.q3, 1));
        fprintf(f, "%-10s %4d %5d %3d %4d %4d %4d %8lld %2d %4s %11s %21s %9.3f %9.3f %7s %5s %8s %8s\n",
                r->policy, r->r, r->k, r->B, r->H, r->kv_heads, r->d, (long long)r->S, r->threads,
                bench_kv_name(r->kv_elem), num(c, sizeof c, r->us.median, 1), iqr, r->bytes_counted / 1e6,
                r->bytes_formula / 1e6, num(e, sizeof e, r->gbps, 2), num(g, sizeof g, r->pct_bw, 0),
                num(h, sizeof h, r->speedup_vs_dense, 2),
                num(a, sizeof a, r->theoretical_ratio > 0 ? 1.0 / r->theoretical_ratio : NAN, 2));
    }
}

static void table_membw(FILE *f, const bench_row *rows, int n)
{
    fprintf(f, "%-8s %7s %9s %12s %8s %17s\n", "kernel", "threads", "MiB", "median_us", "GB/s", "GB/s min..max");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        if (r->kind != BENCH_MEMBW) continue;
        char a[32], b[32], c[32], range[80];
        snprintf(range, sizeof range, "%s..%s", num(a, sizeof a, bench_gbps((double)r->bytes_counted, r->us.max), 2),
                 num(b, sizeof b, bench_gbps((double)r->bytes_counted, r->us.min), 2));
        fprintf(f, "%-8s %7d %9.0f %12s %8.2f %17s\n", r->policy, r->threads, r->bytes_counted / 1048576.0,
                num(c, sizeof c, r->us.median, 0), r->gbps, range);
    }
}

static void table_decode(FILE *f, const bench_row *rows, int n)
{
    /* np: sequences per step (tok/s is their sum; the ms columns are a step's) */
    fprintf(f, "%-22s %-8s %3s %5s %7s %3s %2s %4s %-7s %8s %8s %8s %8s %9s %8s %7s %8s %8s\n", "model", "policy",
            "r", "k", "depth", "np", "t", "kv", "fill", "tok/s", "ms/step", "ms_wts", "ms_attn", "attnMB/st", "speedup",
            "ratio", "RSS_MiB", "peak_MiB");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        if (r->kind != BENCH_DECODE) continue;
        char a[32], b[32], c[32], e[32], g[32], h[32];
        fprintf(f, "%-22.22s %-8s %3d %5d %7lld %3d %2d %4s %-7s %8s %8s %8s %8s %9.3f %8s %7s %8.0f %8.0f\n",
                r->model, r->policy, r->r, r->k, (long long)r->depth, r->B, r->threads, bench_kv_name(r->kv_elem),
                r->fill,
                num(a, sizeof a, r->tok_s, 2), num(b, sizeof b, r->us.median / 1e3, 3),
                num(c, sizeof c, r->ms_weights, 3), num(e, sizeof e, r->ms_attn, 3), r->bytes_counted / 1e6,
                num(g, sizeof g, r->speedup_vs_dense, 2), num(h, sizeof h, r->theoretical_ratio, 4),
                r->rss / 1048576.0, r->peak_rss / 1048576.0);
    }
}

void bench_print_table(FILE *f, const bench_row *rows, int n)
{
    int have[3] = { 0, 0, 0 };
    for (int i = 0; i < n; i++) have[rows[i].kind] = 1;
    int first = 1;
    if (have[BENCH_MEMBW]) { table_membw(f, rows, n); first = 0; }
    if (have[BENCH_ATTN]) { if (!first) fputc('\n', f); table_attn(f, rows, n); first = 0; }
    if (have[BENCH_DECODE]) { if (!first) fputc('\n', f); table_decode(f, rows, n); }
}

/* ---- plot ------------------------------------------------------------------------------ */

void bench_series_label(const bench_row *rows, int n, const bench_row *r, char *buf, size_t size)
{
    int vary_B = 0, vary_H = 0, vary_kv = 0, vary_d = 0, vary_t = 0, vary_e = 0, vary_q = 0;
    const bench_row *first = NULL;
    for (int i = 0; i < n; i++) {
        if (rows[i].kind != BENCH_ATTN) continue;
        if (!first) { first = &rows[i]; continue; }
        vary_B |= rows[i].B != first->B;
        vary_H |= rows[i].H != first->H;
        vary_kv |= rows[i].kv_heads != first->kv_heads;
        vary_d |= rows[i].d != first->d;
        vary_t |= rows[i].threads != first->threads;
        vary_e |= rows[i].kv_elem != first->kv_elem;
        vary_q |= rows[i].heavy_query != first->heavy_query;
    }
    size_t o = 0;
#define ADD(...) do { int w_ = snprintf(buf + o, o < size ? size - o : 0, __VA_ARGS__); \
                      if (w_ > 0) o += (size_t)w_; } while (0)
    ADD("%s", r->policy);
    if (strcmp(r->policy, "sparq") == 0) ADD(" r=%d k=%d", r->r, r->k);
    else if (strcmp(r->policy, "dense") != 0) ADD(" k=%d", r->k);
    if (vary_B) ADD(" B=%d", r->B);
    if (vary_H) ADD(" H=%d", r->H);
    if (vary_kv) ADD(" kv=%d", r->kv_heads);
    if (vary_d) ADD(" d=%d", r->d);
    if (vary_t) ADD(" t=%d", r->threads);
    if (vary_e) ADD(" %s", bench_kv_name(r->kv_elem));
    if (vary_q) ADD(" %s", r->heavy_query ? "heavy-q" : "normal-q");
#undef ADD
}

/* gnuplot single-quoted string: a quote is doubled. */
static void gp_quote(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        fputc(*s, f);
    }
    fputc('\'', f);
}

/* The series a label names, added if new; -1 when there are too many. */
static int series_index(char (*labels)[128], int *n_series, int max, const char *lab)
{
    int s = 0;
    while (s < *n_series && strcmp(labels[s], lab) != 0) s++;
    if (s < *n_series) return s;
    if (*n_series == max) return -1;
    snprintf(labels[*n_series], 128, "%s", lab);
    return (*n_series)++;
}

/* terminal, output and title lines every plot starts with */
static void gp_begin(FILE *f, const char *terminal, const char *png_path, const char *title)
{
    fprintf(f, "set terminal %s size 1000,650 noenhanced\nset output ", terminal);
    gp_quote(f, png_path);
    fputs("\nset title ", f);
    gp_quote(f, title);
}

int bench_write_gnuplot(FILE *f, const bench_row *rows, int n, const char *png_path,
                        const char *terminal, const char *title)
{
    enum { MAX_SERIES = 64 };
    char labels[MAX_SERIES][128];
    int n_series = 0;
    int *series_of = malloc((size_t)(n > 0 ? n : 1) * sizeof *series_of);
    if (!series_of) return -1;
    for (int i = 0; i < n; i++) {
        series_of[i] = -1;
        const bench_row *r = &rows[i];
        if (r->kind != BENCH_ATTN || strcmp(r->policy, "dense") == 0 || !isfinite(r->speedup_vs_dense))
            continue;
        char lab[128];
        bench_series_label(rows, n, r, lab, sizeof lab);
        series_of[i] = series_index(labels, &n_series, MAX_SERIES, lab);
    }
    if (n_series == 0) {
        free(series_of);
        return 0;
    }
    /* the default title says what was measured: shape, threads, cache type */
    const bench_row *r0 = NULL;
    int64_t s_min = INT64_MAX, s_max = 0;
    for (int i = 0; i < n; i++)
        if (series_of[i] >= 0) {
            if (!r0) r0 = &rows[i];
            s_min = rows[i].S < s_min ? rows[i].S : s_min;
            s_max = rows[i].S > s_max ? rows[i].S : s_max;
        }
    char auto_title[256];
    snprintf(auto_title, sizeof auto_title,
             "attention speed-up over dense (%d/%d heads, d %d, batch %d, %d threads, %s KV)",
             r0->H, r0->kv_heads, r0->d, r0->B, r0->threads, bench_kv_name(r0->kv_elem));
    gp_begin(f, terminal, png_path, title ? title : auto_title);
    fputs("\nset logscale x 2\nset logscale y 2\nset grid\nset key outside right top\n"
          "set xlabel 'context length S (positions)'\n"
          "set ylabel 'speed-up over dense (solid: measured, dashed: theoretical)'\n", f);
    /* one S alone would be a point on a degenerate axis: an octave each side */
    if (s_min == s_max) fprintf(f, "set xrange [%lld:%lld]\n", (long long)(s_min / 2 > 0 ? s_min / 2 : 1),
                                (long long)s_max * 2);
    for (int s = 0; s < n_series; s++) {
        fprintf(f, "$s%d << EOD\n", s);
        /* points in ascending S: selection over the series' rows */
        int64_t last = -1;
        for (;;) {
            int best = -1;
            for (int i = 0; i < n; i++)
                if (series_of[i] == s && rows[i].S > last && (best < 0 || rows[i].S < rows[best].S)) best = i;
            if (best < 0) break;
            const bench_row *r = &rows[best];
            double th = r->theoretical_ratio > 0 ? 1.0 / r->theoretical_ratio : NAN;
            fprintf(f, "%lld %.6g %.6g\n", (long long)r->S, r->speedup_vs_dense, th);
            last = r->S;
        }
        fputs("EOD\n", f);
    }
    fputs("plot 1 with lines lc rgb 'black' dt 3 title 'dense (1x)'", f);
    for (int s = 0; s < n_series; s++) {
        fprintf(f, ", \\\n  $s%d using 1:2 with linespoints lw 2 pt 7 lc %d title ", s, s + 1);
        gp_quote(f, labels[s]);
        /* points too, so a single S still shows its theoretical value */
        fprintf(f, ", \\\n  $s%d using 1:3 with linespoints dt 2 pt 6 lc %d title ", s, s + 1);
        char th[160];
        snprintf(th, sizeof th, "%.120s, theoretical", labels[s]);
        gp_quote(f, th);
    }
    fputs("\n", f);
    free(series_of);
    return ferror(f) ? -1 : n_series;
}

int bench_write_gnuplot_decode(FILE *f, const bench_row *rows, int n, const char *png_path,
                               const char *terminal, const char *title)
{
    enum { MAX_SERIES = 64 };
    char labels[MAX_SERIES][128];
    int n_series = 0;
    int *series_of = malloc((size_t)(n > 0 ? n : 1) * sizeof *series_of);
    if (!series_of) return -1;
    for (int i = 0; i < n; i++) {
        series_of[i] = -1;
        const bench_row *r = &rows[i];
        if (r->kind != BENCH_DECODE || !isfinite(r->tok_s)) continue;
        char lab[128];
        /* one curve per policy setting (and model, thread count, KV type when they vary) */
        snprintf(lab, sizeof lab, "%s", r->policy);
        if (strcmp(r->policy, "sparq") == 0) snprintf(lab + strlen(lab), sizeof lab - strlen(lab), " r=%d k=%d", r->r, r->k);
        else if (strcmp(r->policy, "dense") != 0) snprintf(lab + strlen(lab), sizeof lab - strlen(lab), " k=%d", r->k);
        for (int j = 0; j < n; j++) {
            if (rows[j].kind != BENCH_DECODE) continue;
            if (strcmp(rows[j].model, r->model) != 0) {
                snprintf(lab + strlen(lab), sizeof lab - strlen(lab), " %s", r->model);
                break;
            }
        }
        for (int j = 0; j < n; j++)
            if (rows[j].kind == BENCH_DECODE && rows[j].threads != r->threads) {
                snprintf(lab + strlen(lab), sizeof lab - strlen(lab), " t=%d", r->threads);
                break;
            }
        for (int j = 0; j < n; j++)
            if (rows[j].kind == BENCH_DECODE && rows[j].B != r->B) {
                snprintf(lab + strlen(lab), sizeof lab - strlen(lab), " np=%d", r->B);
                break;
            }
        for (int j = 0; j < n; j++)
            if (rows[j].kind == BENCH_DECODE && rows[j].kv_elem != r->kv_elem) {
                snprintf(lab + strlen(lab), sizeof lab - strlen(lab), " %s", bench_kv_name(r->kv_elem));
                break;
            }
        series_of[i] = series_index(labels, &n_series, MAX_SERIES, lab);
    }
    if (n_series == 0) {
        free(series_of);
        return 0;
    }
    const bench_row *d0 = NULL;
    for (int i = 0; i < n && !d0; i++)
        if (series_of[i] >= 0) d0 = &rows[i];
    char auto_title[256];
    snprintf(auto_title, sizeof auto_title, "decode tok/s vs depth (%s, %d threads, %s KV, %s fill)",
             d0->model, d0->threads, bench_kv_name(d0->kv_elem), d0->fill);
    gp_begin(f, terminal, png_path, title ? title : auto_title);
    /* depth 0 is a real point, so the x axis stays linear */
    fputs("\nset grid\nset key outside right top\nset yrange [0:*]\n"
          "set xlabel 'depth (positions in the cache)'\nset ylabel 'decode tokens/s'\n", f);
    for (int s = 0; s < n_series; s++) {
        fprintf(f, "$d%d << EOD\n", s);
        int64_t last = -1;
        for (;;) {
            int best = -1;
            for (int i = 0; i < n; i++)
                if (series_of[i] == s && rows[i].depth > last && (best < 0 || rows[i].depth < rows[best].depth)) best = i;
            if (best < 0) break;
            fprintf(f, "%lld %.6g\n", (long long)rows[best].depth, rows[best].tok_s);
            last = rows[best].depth;
        }
        fputs("EOD\n", f);
    }
    fputs("plot ", f);
    for (int s = 0; s < n_series; s++) {
        fprintf(f, "%s$d%d using 1:2 with linespoints lw 2 pt 7 lc %d title ", s ? ", \\\n  " : "", s, s + 1);
        gp_quote(f, labels[s]);
    }
    fputs("\n", f);
    free(series_of);
    return ferror(f) ? -1 : n_series;
}
