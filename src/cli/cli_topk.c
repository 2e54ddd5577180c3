/* cli_topk.c - `sparq bench-topk`: top-k attention over a synthetic prefix of
 * a real model shape, decoded from a KV cache file.
 *
 * For each index kind: writes an N-token prefix (every layer and KV head of
 * the shape) with that kind's indexes as a KV cache file, then decodes
 * `--tokens` steps from it in a fresh process (so its peak RSS is the
 * decode's alone): attention only, no weights. Reports seconds per token
 * (all layers' attention, the new token's K/V append included), peak RSS,
 * recall@k of the index against exact top-k on sampled (layer, head) pairs,
 * and whether every planted needle was retrieved. The file is written by
 * the library (kvf_write_heads: K, V and the index images of each head);
 * --reuse decodes a kept file only if its header matches --shape, --size
 * and the steps asked for. Where the index read is nominal (hnsw: Faiss
 * reports no visits) the output says so.
 *
 * Synthetic data, per (layer, KV head), all from --seed:
 *   scales    s_j = exp(aniso z_j), z ~ N(0, 1), mean square 1: a few
 *             dimensions dominate, as in real keys and queries;
 *   keys      C cluster centres s * N(0, I); positions come in runs of 64
 *             from one random cluster (topics), key = centre + spread * s *
 *             noise (noise: sum of 4 uniforms, unit variance);
 *   values    the same noise, unscaled;
 *   queries   per query head and step an independent random cluster j:
 *             q = 4 (c_j / |c_j| + 0.5 noise / sqrt(d)), so the g heads of a
 *             group look at different places (the union an index scans for
 *             a group is about g times one head's);
 *   needles   M needles at evenly spread depths, each in its own (layer,
 *             head, query head) slot: key = c_j + beta u + spread * s * noise,
 *             u a unit vector orthogonal to its cluster's centre c_j and beta
 *             8 standard deviations of u . k over the keys plus 2; the slot's
 *             query is 4 (0.5 c_j / |c_j| + u + 0.5 noise / sqrt(d)) at every
 *             step, so the needle is its exact top-1 by a wide margin while
 *             staying inside its cluster (an inverted file can find it).
 * Peak RSS counts the file's pages the decode mapped (page cache, shared
 * and reclaimable) as well as private memory; anon GiB is the private part
 * at the end of the run.
 */
#include "attn/attn.h"
#include "bench/bench.h"
#include "cli/cli.h"
#include "core/kvcache.h"
#include "io/kvfile.h"
#include "tensor/quant.h"
#include "util/rng.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct topk_shape {
    const char *name;
    int n_layer, n_head, n_kv_head, d;
} topk_shape;

static const topk_shape shapes[] = {
    { "llama-3.2-1b", 16, 32, 8, 64 },
    { "llama-3-8b", 32, 32, 8, 128 },
    { "smollm2-135m", 30, 9, 3, 64 },
    { "tiny", 2, 8, 2, 64 },
};

typedef struct topk_opts {
    const char *shape, *size, *index, *key_type, *file, *child;
    int         k, tokens, warmup, needles, clusters, nlist, nprobe, ef, threads, recall_heads;
    int         json, keep, reuse, result_fd;
    float       spread, aniso;
    uint64_t    seed, qseed;
} topk_opts;

#define OFF(f) offsetof(topk_opts, f)
static const cli_opt topk_table[] = {
    { "--shape", NULL, OPT_STR, OFF(shape), "NAME", "llama-3.2-1b | llama-3-8b | smollm2-135m | tiny (default llama-3.2-1b)" },
    { "--size", "-N", OPT_STR, OFF(size), "N", "prefix positions, k/M suffixes allowed (default 64k)" },
    { "--index", NULL, OPT_STR, OFF(index), "LIST", "index kinds: exact,ivf,hnsw,sparq (default exact,ivf,sparq)" },
    { "--topk-k", NULL, OPT_INT, OFF(k), "K", "positions per query head (default 100)" },
    { "--index-key-type", NULL, OPT_STR, OFF(key_type), "f16|bf16|i8", "exact/ivf key storage (default f16)" },
    { "--ivf-nlist", NULL, OPT_INT, OFF(nlist), "N", "ivf lists (default sqrt(N))" },
    { "--ivf-nprobe", NULL, OPT_INT, OFF(nprobe), "N", "ivf lists probed per query (default max(8, nlist/16))" },
    { "--hnsw-ef", NULL, OPT_INT, OFF(ef), "N", "hnsw efSearch (default 64)" },
    { "--tokens", "-n", OPT_INT, OFF(tokens), "T", "decode steps timed (default 8)" },
    { "--warmup", NULL, OPT_INT, OFF(warmup), "W", "untimed steps first (default 1)" },
    { "--needles", NULL, OPT_INT, OFF(needles), "M", "needles planted (default 16)" },
    { "--clusters", NULL, OPT_INT, OFF(clusters), "C", "key clusters per head (default 256)" },
    { "--spread", NULL, OPT_FLOAT, OFF(spread), "S", "key noise around its centre, per dimension (default 0.5)" },
    { "--aniso", NULL, OPT_FLOAT, OFF(aniso), "A", "per-dimension scales exp(A z) of keys and queries (default 0.5)" },
    { "--recall-heads", NULL, OPT_INT, OFF(recall_heads), "H", "(layer, head) pairs sampled for recall per step (default 8)" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "data seed (default 1)" },
    { "--query-seed", NULL, OPT_U64, OFF(qseed), "N",
      "seed of the decode steps' queries (default 0); a new one reaches rows no earlier run read" },
    { "--file", NULL, OPT_STR, OFF(file), "PATH", "KV cache file (default /tmp/sparq_bench_topk.kv; one per kind)" },
    { "--keep", NULL, OPT_FLAG, OFF(keep), NULL, "keep the KV file(s) (PATH.KIND)" },
    { "--reuse", NULL, OPT_FLAG, OFF(reuse), NULL,
      "decode an existing PATH.KIND kept by an earlier run with the same data options (implies --keep)" },
    { "--threads", "-t", OPT_INT, OFF(threads), "N", "threads (default all cores)" },
    { "--json", NULL, OPT_FLAG, OFF(json), NULL, "print a JSON array of rows on stdout" },
    { "--child-decode", NULL, OPT_STR, OFF(child), "FILE", "(internal) decode FILE and report on --result-fd" },
    { "--result-fd", NULL, OPT_INT, OFF(result_fd), "FD", "(internal)" },
    { 0 },
};
#undef OFF

/* What a decode child reports. */
typedef struct topk_result {
    int     ok;
    double  s_per_token, s_first, s_open;
    double  recall;
    int64_t recall_hits, recall_total;
    int     needles_found, needles_total;
    int64_t elements, dense_elements; /* per token, all layers and heads */
    int     nominal;                  /* elements include a nominal index
                                         figure (hnsw: Faiss counts nothing) */
    double  index_seconds;            /* binding the file's indexes        */
    int64_t rss_anon, rss_file;       /* at the end: private memory, mapped file pages */
    int64_t majflt, read_bytes;       /* over the timed steps: major faults, bytes from disk */
    int     verified;
    char    err[256];
} topk_result;

/* ---- synthetic data ---------------------------------------------------------- */

typedef struct synth {
    const topk_shape *sh;
    int64_t  P;
    int      C, M, g;
    float    spread, aniso;
    uint64_t seed, qseed;
} synth;

static uint64_t mix(uint64_t a, uint64_t b)
{
    return rng_mix64(a ^ (b + RNG_GOLDEN + (a << 6) + (a >> 2)));
}

static uint64_t head_seed(const synth *s, int l, int h, uint64_t what)
{
    return mix(mix(mix(s->seed, (uint64_t)l), (uint64_t)h), what);
}

/* Unit-variance noise: the sum of 4 uniforms from one 64-bit draw. */
static void fast_noise(bench_rng *r, float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t v = bench_rng_next(r);
        float a = 0;
        for (int j = 0; j < 4; j++, v >>= 16) a += (float)(v & 0xffff) * (1.0f / 65536.0f);
        x[i] = (a - 2.0f) * 1.7320508f * scale;
    }
}

/* Per-dimension scales of head (l, h): exp(aniso z), z ~ N(0, 1), scaled to
 * mean square 1, so a few dimensions dominate keys and queries as in real
 * models (what SparQ's component selection relies on). */
static void dim_scales(const synth *s, int l, int h, float *sc)
{
    const int d = s->sh->d;
    bench_rng r;
    bench_rng_seed(&r, head_seed(s, l, h, 6));
    bench_randn(&r, sc, (size_t)d);
    double ms = 0;
    for (int j = 0; j < d; j++) {
        sc[j] = expf(s->aniso * sc[j]);
        ms += (double)sc[j] * sc[j];
    }
    const float inv = (float)(1.0 / sqrt(ms / d));
    for (int j = 0; j < d; j++) sc[j] *= inv;
}

/* Cluster centres [C][d] of head (l, h), then the head's scales [d]. */
static void centres(const synth *s, int l, int h, float *c)
{
    const int d = s->sh->d;
    bench_rng r;
    bench_rng_seed(&r, head_seed(s, l, h, 1));
    bench_randn(&r, c, (size_t)s->C * d);
    float *sc = c + (size_t)s->C * d;
    dim_scales(s, l, h, sc);
    for (int i = 0; i < s->C; i++)
        for (int j = 0; j < d; j++) c[(size_t)i * d + j] *= sc[j];
}

static int cluster_of(const synth *s, int l, int h, int64_t p)
{
    return (int)(mix(head_seed(s, l, h, 2), (uint64_t)(p / 64)) % (uint64_t)s->C);
}

/* Needle i: its slot and position. */
typedef struct needle { int layer, head, qh; int64_t pos; } needle;

static needle needle_of(const synth *s, int i)
{
    needle n;
    const int pairs = s->sh->n_layer * s->sh->n_kv_head, slot = i % pairs;
    n.layer = slot % s->sh->n_layer;
    n.head = slot / s->sh->n_layer;
    n.qh = (i / pairs) % s->g;
    n.pos = (int64_t)((2.0 * i + 1.0) * (double)s->P / (2.0 * s->M));
    return n;
}

/* The unit direction u of needle i, orthogonal to its cluster's centre c;
 * returns the needle's strength beta: 8 standard deviations of u . k over
 * the head's keys (scales sc [d]) plus 2, so the needle is the exact top-1
 * of its query by a wide margin. */
static float needle_dir(const synth *s, int i, const float *c, const float *sc, float *u)
{
    const int d = s->sh->d;
    bench_rng r;
    bench_rng_seed(&r, mix(s->seed, 1000 + (uint64_t)i));
    bench_randn(&r, u, (size_t)d);
    double cc = 0, cu = 0, uu = 0, var = 0;
    for (int j = 0; j < d; j++) cc += (double)c[j] * c[j], cu += (double)c[j] * u[j];
    for (int j = 0; j < d; j++) u[j] -= (float)(cu / cc) * c[j];
    for (int j = 0; j < d; j++) uu += (double)u[j] * u[j];
    for (int j = 0; j < d; j++) {
        u[j] /= (float)sqrt(uu);
        var += (double)u[j] * u[j] * sc[j] * sc[j];
    }
    return (float)(8.0 * sqrt(var * (1.0 + (double)s->spread * s->spread)) + 2.0);
}

/* Keys [n][d] of positions p0.. of head (l, h) (needles included). */
static void gen_keys(const synth *s, int l, int h, const float *cen, int64_t p0, int64_t n, float *k)
{
    const int d = s->sh->d;
    const float *sc = cen + (size_t)s->C * d;
    bench_rng r;
    bench_rng_seed(&r, mix(head_seed(s, l, h, 3), (uint64_t)p0));
    fast_noise(&r, k, (size_t)n * d, s->spread);
    for (int64_t i = 0; i < n; i++) {
        const float *c = cen + (size_t)cluster_of(s, l, h, p0 + i) * d;
        for (int j = 0; j < d; j++) k[i * d + j] = k[i * d + j] * sc[j] + c[j];
    }
    float u[4096];
    for (int i = 0; i < s->M; i++) {
        needle nd = needle_of(s, i);
        if (nd.layer != l || nd.head != h || nd.pos < p0 || nd.pos >= p0 + n) continue;
        const float *c = cen + (size_t)cluster_of(s, l, h, nd.pos) * d;
        const float beta = needle_dir(s, i, c, sc, u);
        for (int j = 0; j < d; j++) k[(nd.pos - p0) * d + j] += beta * u[j];
    }
}

/* Queries of every head of layer l at decode step t: q [n_head][d]. */
static void gen_queries(const synth *s, int l, int64_t t, const float *cen_layer, float *q)
{
    const int d = s->sh->d, H = s->sh->n_kv_head, g = s->g;
    float u[4096];
    for (int h = 0; h < H; h++)
        for (int qh = 0; qh < g; qh++) {
            float *qq = q + ((size_t)h * g + qh) * d;
            const float *cen = cen_layer + (size_t)h * (s->C + 1) * d;
            bench_rng r;
            bench_rng_seed(&r, mix(mix(mix(head_seed(s, l, h, 4), (uint64_t)t), (uint64_t)qh), s->qseed));
            int nd_i = -1;
            for (int i = 0; i < s->M; i++) {
                needle nd = needle_of(s, i);
                if (nd.layer == l && nd.head == h && nd.qh == qh) nd_i = i;
            }
            const int j = nd_i >= 0 ? cluster_of(s, l, h, needle_of(s, nd_i).pos)
                                    : (int)(bench_rng_next(&r) % (uint64_t)s->C);
            const float *c = cen + (size_t)j * d;
            double cn = 0;
            for (int e = 0; e < d; e++) cn += (double)c[e] * c[e];
            const float inv = (float)(1.0 / sqrt(cn));
            fast_noise(&r, qq, (size_t)d, 0.5f / sqrtf((float)d));
            if (nd_i >= 0) {
                needle_dir(s, nd_i, c, cen + (size_t)s->C * d, u);
                for (int e = 0; e < d; e++) qq[e] = 4.0f * (0.5f * c[e] * inv + u[e] + qq[e]);
            } else {
                for (int e = 0; e < d; e++) qq[e] = 4.0f * (c[e] * inv + qq[e]);
            }
        }
}

/* ---- writing the file -------------------------------------------------------- */

static int key_type_of(const char *s)
{
    if (!s || strcmp(s, "f16") == 0) return SPARQ_KEY_F16;
    if (strcmp(s, "bf16") == 0) return SPARQ_KEY_BF16;
    if (strcmp(s, "i8") == 0 || strcmp(s, "int8") == 0) return SPARQ_KEY_I8;
    return -1;
}

static sparq_attn_params topk_params(const topk_opts *o, const char *kind)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = "topk";
    p.index = kind;
    p.k = o->k;
    p.index_key_type = key_type_of(o->key_type);
    p.ivf_nlist = o->nlist;
    p.ivf_nprobe = o->nprobe;
    p.hnsw_ef_search = o->ef;
    return p;
}

/* kvf_write_heads' rows: head (l, h) generated from the seed (f16 K and V
 * in one owned buffer). */
static int synth_rows(void *user, int l, int h, kvf_head_rows *out, char *err, size_t err_size)
{
    const synth *s = user;
    const int d = s->sh->d;
    float *cen = malloc((size_t)(s->C + 1) * d * sizeof *cen);
    float *kf = malloc((size_t)s->P * d * sizeof *kf);
    uint16_t *k16 = malloc((size_t)s->P * d * 2 * 2), *v16 = k16 ? k16 + (size_t)s->P * d : NULL;
    if (!cen || !kf || !k16) {
        free(cen);
        free(kf);
        free(k16);
        snprintf(err, err_size, "out of memory generating %lld keys", (long long)s->P);
        return -1;
    }
    centres(s, l, h, cen);
    gen_keys(s, l, h, cen, 0, s->P, kf);
    fp32_to_fp16_row(kf, k16, s->P * d);
    bench_rng r;
    bench_rng_seed(&r, head_seed(s, l, h, 5));
    for (int64_t i = 0; i < s->P * d; i += 4096) { /* values: reuse kf as scratch */
        const int64_t m = s->P * d - i < 4096 ? s->P * d - i : 4096;
        fast_noise(&r, kf, (size_t)m, 1.0f);
        fp32_to_fp16_row(kf, v16 + i, m);
    }
    free(cen);
    free(kf);
    attn_kv_view view = { s->P, d, KV_F16, k16, v16, NULL, s->P, NULL, NULL, NULL, 0, 0 };
    out->view = view;
    out->owned = k16;
    return 0;
}

/* Writes the prefix and `kind`'s indexes; *build_s: index build seconds
 * summed over heads. */
static int write_file(const synth *s, const topk_opts *o, const char *kind, const char *path,
                      double *build_s, char *err, size_t err_size)
{
    const topk_shape *sh = s->sh;
    kvf_fingerprint fp;
    kvf_synthetic_fingerprint(&fp, sh->n_layer, sh->n_head, sh->n_kv_head, sh->d);
    const int64_t cap = s->P + o->warmup + o->tokens + 16;
    kvf_writer *w;
    if (kvf_writer_create(path, &fp, KV_F16, s->P, cap, 0, 0, kind, &w, err, err_size)) return -1;
    sparq_attn_params p = topk_params(o, kind);
    return kvf_write_heads(w, o->threads, &p, synth_rows, (void *)s, build_s, err, err_size);
}

/* ---- decoding (the child) ---------------------------------------------------- */

/* recall@k of one head's selection against exact top-k over the prefix;
 * needle check. */
static void score_head(const attn_kv_view *prefix, const float *q, int g, int k, const int32_t *ids,
                       float *sc, int32_t *ex, int32_t *work, int64_t *hits, int64_t *total)
{
    const int64_t P = prefix->S;
    attn_scores(prefix, q, g, NULL, P, sc);
    for (int h = 0; h < g; h++) {
        const float *x = sc + (size_t)h * P;
        attn_topk_indices(x, P, k, ex, work);
        float kth = INFINITY;
        for (int r = 0; r < k; r++) kth = x[ex[r]] < kth ? x[ex[r]] : kth;
        for (int r = 0; r < k; r++)
            if (ids[h * k + r] >= 0 && x[ids[h * k + r]] >= kth) (*hits)++;
        *total += k;
    }
}

/* Major page faults so far, and bytes this process caused to be read
 * from storage (/proc/self/io; -1 if unknown). */
static void io_counters(int64_t *majflt, int64_t *read_bytes)
{
    struct rusage ru;
    *majflt = getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_majflt : -1;
    *read_bytes = -1;
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return;
    char line[128];
    long long v;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "read_bytes: %lld", &v) == 1) *read_bytes = v;
    fclose(f);
}

/* RssAnon and RssFile of this process (bytes; -1 if unknown). */
static void read_rss(int64_t *anon, int64_t *file)
{
    *anon = *file = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long long v;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %lld kB", &v) == 1) *anon = v * 1024;
        if (sscanf(line, "RssFile: %lld kB", &v) == 1) *file = v * 1024;
    }
    fclose(f);
}

static int decode_child(const synth *s, const topk_opts *o, const char *path, const char *kind,
                        topk_result *res)
{
    const topk_shape *sh = s->sh;
    const int d = sh->d, H = sh->n_kv_head, g = s->g, L = sh->n_layer;
    char err[256];
    double t0 = cli_now();
    kvf_file *f = NULL;
    /* a file kept by an earlier run (--reuse) must be of this shape, size
     * and room for the steps: the cache below is sized from the shape */
    kvf_fingerprint fp;
    kvf_synthetic_fingerprint(&fp, L, sh->n_head, H, d);
    if (kvf_open(path, &fp, KVF_VERIFY_AUTO, &f, err, sizeof err)) {
        snprintf(res->err, sizeof res->err, "%s", err);
        return -1;
    }
    const int64_t need = s->P + o->warmup + o->tokens;
    if (f->n != s->P || f->cap < need || f->elem != KV_F16) {
        snprintf(res->err, sizeof res->err,
                 "kvfile '%s' holds %lld f%d positions of room %lld; --size %lld with %lld steps needs %lld "
                 "f16 positions of room %lld",
                 path, (long long)f->n, f->elem == KV_F16 ? 16 : 32, (long long)f->cap, (long long)s->P,
                 (long long)(o->warmup + o->tokens), (long long)s->P, (long long)need);
        kvf_close(f);
        return -1;
    }
    res->verified = f->verified;
    kv_cache kv;
    const kv_borrow b = { .n_layer = L, .n_kv_head = H, .d = d, .cap = f->cap, .elem = f->elem, .k = f->k,
                          .v = f->v, .n = f->n };
    if (kv_create_borrowed(&kv, &b, err, sizeof err)) {
        snprintf(res->err, sizeof res->err, "%s", err);
        kvf_close(f);
        return -1;
    }
    sparq_attn_params p = topk_params(o, kind);
    const attn_policy *pol = attn_policy_find("topk");
    if (pol->resolve(&p, d, err, sizeof err)) {
        snprintf(res->err, sizeof res->err, "%s", err);
        kv_free(&kv);
        kvf_close(f);
        return -1;
    }
    attn_shape shape = { L, H, g, d, f->cap };
    void *state = NULL;
    const int nt = o->threads;
    const size_t sf = attn_pad16(pol->scratch_floats(&p, f->cap, d, g));
    float *sfl = aligned_alloc(64, (size_t)nt * sf * sizeof(float));
    int32_t *sint = aligned_alloc(64, (size_t)nt * sf * sizeof(int32_t));
    float *q = malloc((size_t)L * sh->n_head * d * sizeof *q), *out = malloc((size_t)sh->n_head * d * sizeof *out);
    float *knew = malloc((size_t)H * d * 2 * sizeof *knew);
    float *cen = malloc((size_t)L * H * (s->C + 1) * d * sizeof *cen);
    const int k = p.k;
    int32_t *ids = malloc((size_t)g * k * sizeof *ids), *ex = malloc((size_t)k * sizeof *ex);
    float *sc = malloc((size_t)g * s->P * sizeof *sc);
    int32_t *work = malloc((size_t)s->P * sizeof *work);
    uint8_t *found = malloc((size_t)s->M + 1);
    char step_err[320] = "";
    int rc = -1;
    if (!sfl || !sint || !q || !out || !knew || !cen || !ids || !ex || !sc || !work || !found ||
        pol->state_create(&p, &shape, &state)) {
        snprintf(res->err, sizeof res->err, "out of memory for decoding");
        goto done;
    }
    memset(found, 1, (size_t)s->M + 1);
    pol->set_prefix(state, &p, f->n, &f->source);
    kvf_advise_random(f);
    res->s_open = cli_now() - t0;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) centres(s, l, h, cen + ((size_t)l * H + h) * (s->C + 1) * d);

    /* which (layer, head) pairs recall samples: spread over the model */
    const int pairs = L * H, n_rh = o->recall_heads < pairs ? o->recall_heads : pairs;
    double t_sum = 0;
    int64_t elems = 0;
    const int steps = o->warmup + o->tokens;
    int64_t mf0 = 0, rb0 = 0;
    for (int t = 0; t < steps; t++) {
        const int64_t pos = kv.n;
        if (t == o->warmup) io_counters(&mf0, &rb0);
        double t_step = 0;
        int64_t step_elems = 0;
        for (int l = 0; l < L; l++) {
            float *ql = q + (size_t)l * sh->n_head * d;
            gen_queries(s, l, t, cen + (size_t)l * H * (s->C + 1) * d, ql);
            for (int h = 0; h < H; h++) /* the new token: a key of its own cluster run */
                gen_keys(s, l, h, cen + ((size_t)l * H + h) * (s->C + 1) * d, pos, 1, knew + (size_t)h * d);
            bench_rng r;
            bench_rng_seed(&r, mix(s->seed, (uint64_t)(pos * 131 + l)));
            fast_noise(&r, knew + (size_t)H * d, (size_t)H * d, 1.0f);
            const double ts = cli_now();
            kv_write(&kv, l, pos, knew, knew + (size_t)H * d);
            int64_t rd = 0, wr = 0;
            int step_failed = 0;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) reduction(+ : rd, wr)
            for (int h = 0; h < H; h++) {
                const int tid = omp_get_thread_num();
                char e[256] = "";
                attn_scratch scr = { sfl + (size_t)tid * sf, sf, sint + (size_t)tid * sf, e, sizeof e };
                attn_kv_view view;
                kv_view(&kv, l, h, pos + 1, &view);
                attn_counts cnt = { 0, 0 };
                const attn_step step = { .layer = l, .kv_head = h, .kv = &view, .q = ql + (size_t)h * g * d,
                                         .g = g, .out = out + (size_t)h * g * d, .scratch = &scr,
                                         .counts = &cnt };
                if (pol->attend(state, &p, &step)) {
#pragma omp critical(topk_step_error)
                    if (!step_failed) {
                        step_failed = 1;
                        snprintf(step_err, sizeof step_err, "layer %d, kv head %d: %s", l, h,
                                 e[0] ? e : "failed");
                    }
                }
                rd += cnt.read;
                wr += cnt.written;
            }
            if (step_failed) goto step_error;
            t_step += cli_now() - ts;
            step_elems += rd + wr;
        }
        /* untimed, after the step: recall on sampled heads, needles */
        for (int hh = 0; hh < pairs && t >= o->warmup; hh++) {
            const int l = hh % L, h = hh / L;
            const float *qh = q + ((size_t)l * sh->n_head + (size_t)h * g) * d;
            attn_scratch scr = { sfl, sf, sint, NULL, 0 };
            int sampled = 0, has_needle = 0;
            for (int i = 0; i < n_rh; i++) sampled |= (int)((int64_t)i * pairs / n_rh) == hh;
            for (int i = 0; i < s->M; i++) {
                needle nd = needle_of(s, i);
                has_needle |= nd.layer == l && nd.head == h;
            }
            if (!sampled && !has_needle) continue;
            attn_kv_view view;
            kv_view(&kv, l, h, pos + 1, &view);
            if (attn_topk_select(state, &p, l, h, &view, qh, g, ids, &scr) != k) {
                snprintf(res->err, sizeof res->err, "layer %d head %d: no index selection", l, h);
                goto done;
            }
            if (sampled) {
                attn_kv_view pre;
                kv_view(&kv, l, h, s->P, &pre);
                score_head(&pre, qh, g, k, ids, sc, ex, work, &res->recall_hits, &res->recall_total);
            }
            for (int i = 0; i < s->M; i++) {
                needle nd = needle_of(s, i);
                if (nd.layer != l || nd.head != h) continue;
                int hit = 0;
                for (int j = 0; j < k; j++) hit |= ids[nd.qh * k + j] == (int32_t)nd.pos;
                found[i] &= (uint8_t)hit;
            }
        }
        kv.n++;
        if (t == 0) res->s_first = t_step;
        if (t >= o->warmup) {
            t_sum += t_step;
            elems = step_elems;
        }
    }
    io_counters(&res->majflt, &res->read_bytes);
    res->majflt -= mf0;
    res->read_bytes -= rb0;
    res->s_per_token = o->tokens > 0 ? t_sum / o->tokens : NAN;
    res->recall = res->recall_total ? (double)res->recall_hits / res->recall_total : NAN;
    res->needles_total = s->M;
    for (int i = 0; i < s->M; i++) res->needles_found += found[i];
    res->elements = elems;
    res->dense_elements = (int64_t)L * H * (2 * (s->P + steps) * d + 2 * (int64_t)d);
    sparq_attn_stats st;
    memset(&st, 0, sizeof st);
    pol->stats(state, &st);
    res->index_seconds = st.index_seconds;
    res->nominal = st.nominal_elements > 0;
    read_rss(&res->rss_anon, &res->rss_file);
    res->ok = 1;
    rc = 0;
    goto done;
step_error:
    snprintf(res->err, sizeof res->err, "decode step: %.200s", step_err);
done:
    if (state) pol->state_free(state);
    free(sfl); free(sint); free(q); free(out); free(knew); free(cen);
    free(ids); free(ex); free(sc); free(work); free(found);
    kv_free(&kv);
    kvf_close(f);
    return rc;
}

/* ---- the parent ----------------------------------------------------------------- */

typedef struct topk_row {
    char        index[8];
    int64_t     N;
    double      build_s, write_s;
    int64_t     file_bytes, peak_rss;
    topk_result r;
} topk_row;

/* Runs this binary again as a decode child; fills row->r and peak RSS. */
static int spawn_decode(char **argv0, const topk_opts *o, const char *path, const char *kind,
                        topk_row *row, char *err, size_t err_size)
{
    int fds[2];
    if (pipe(fds) != 0) {
        snprintf(err, err_size, "pipe: %s", strerror(errno));
        return -1;
    }
    char a[24][64];
    const char *args[48];
    int n = 0;
    args[n++] = "/proc/self/exe";
    args[n++] = "bench-topk";
    args[n++] = "--child-decode";
    args[n++] = path;
    args[n++] = "--index";
    args[n++] = kind;
    args[n++] = "--shape";
    args[n++] = o->shape;
    args[n++] = "--size";
    args[n++] = o->size;
    if (o->key_type) { args[n++] = "--index-key-type"; args[n++] = o->key_type; }
    (void)argv0;
    {
        static const char *names[] = { "--topk-k", "--tokens", "--warmup", "--needles", "--clusters",
                                       "--ivf-nlist", "--ivf-nprobe", "--hnsw-ef", "--threads",
                                       "--recall-heads", "--result-fd" };
        const int vals[] = { o->k, o->tokens, o->warmup, o->needles, o->clusters, o->nlist, o->nprobe,
                             o->ef, o->threads, o->recall_heads, fds[1] };
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
            snprintf(a[i], sizeof a[i], "%d", vals[i]);
            args[n++] = names[i];
            args[n++] = a[i];
        }
        snprintf(a[20], sizeof a[20], "%.9g", o->spread);
        args[n++] = "--spread";
        args[n++] = a[20];
        snprintf(a[22], sizeof a[22], "%.9g", o->aniso);
        args[n++] = "--aniso";
        args[n++] = a[22];
        snprintf(a[21], sizeof a[21], "%llu", (unsigned long long)o->seed);
        args[n++] = "--seed";
        args[n++] = a[21];
        snprintf(a[23], sizeof a[23], "%llu", (unsigned long long)o->qseed);
        args[n++] = "--query-seed";
        args[n++] = a[23];
    }
    args[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(err, err_size, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        execv("/proc/self/exe", (char *const *)args);
        _exit(127);
    }
    close(fds[1]);
    memset(&row->r, 0, sizeof row->r);
    size_t got = 0;
    while (got < sizeof row->r) {
        ssize_t r = read(fds[0], (char *)&row->r + got, sizeof row->r - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fds[0]);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
    row->peak_rss = (int64_t)ru.ru_maxrss * 1024;
    if (got != sizeof row->r || !row->r.ok) {
        snprintf(err, err_size, "decode of %s failed: %s", kind,
                 got == sizeof row->r ? row->r.err : "the child died");
        return -1;
    }
    return 0;
}

/* v formatted into buf[32], or "null" when it is NAN (not measured). */
static const char *jnum(char *buf, double v, const char *fmt)
{
    if (v == v) snprintf(buf, 32, fmt, v);
    else snprintf(buf, 32, "null");
    return buf;
}

static void print_rows(FILE *f, const topk_row *rows, int n, const topk_opts *o, int json)
{
    if (json) { /* NAN (not measured) is written as null */
        fprintf(f, "[");
        for (int i = 0; i < n; i++) {
            const topk_row *r = &rows[i];
            char nb[6][32];
            fprintf(f, "%s\n{\"index\":\"%s\",\"N\":%lld,\"shape\":\"%s\",\"k\":%d,\"key_type\":\"%s\","
                       "\"tokens\":%d,\"s_per_token\":%s,\"s_first_token\":%s,\"s_open\":%.6f,"
                       "\"peak_rss_bytes\":%lld,\"recall_at_k\":%s,\"recall_hits\":%lld,"
                       "\"recall_total\":%lld,\"needles_found\":%d,\"needles_total\":%d,"
                       "\"index_build_s\":%s,\"file_write_s\":%s,\"file_bytes\":%lld,"
                       "\"elements_per_token\":%lld,\"elements_nominal\":%s,\"dense_elements_per_token\":%lld,"
                       "\"data_verified\":%d,\"threads\":%d,\"rss_anon_end_bytes\":%lld,"
                       "\"rss_file_end_bytes\":%lld,\"spread\":%.3f,\"aniso\":%.3f,\"clusters\":%d,"
                       "\"ivf_nprobe\":%d,\"query_seed\":%llu,\"major_faults_per_token\":%.1f,\"disk_read_bytes_per_token\":%.0f}",
                    i ? "," : "", r->index, (long long)r->N, o->shape, o->k,
                    o->key_type ? o->key_type : "f16", o->tokens, jnum(nb[0], r->r.s_per_token, "%.6f"),
                    jnum(nb[1], r->r.s_first, "%.6f"), r->r.s_open, (long long)r->peak_rss,
                    jnum(nb[2], r->r.recall, "%.6f"),
                    (long long)r->r.recall_hits, (long long)r->r.recall_total, r->r.needles_found,
                    r->r.needles_total, jnum(nb[3], r->build_s, "%.3f"), jnum(nb[4], r->write_s, "%.3f"),
                    (long long)r->file_bytes, (long long)r->r.elements, r->r.nominal ? "true" : "false",
                    (long long)r->r.dense_elements,
                    r->r.verified, o->threads, (long long)r->r.rss_anon, (long long)r->r.rss_file, o->spread,
                    o->aniso, o->clusters, o->nprobe, (unsigned long long)o->qseed, (double)r->r.majflt / o->tokens,
                    (double)r->r.read_bytes / o->tokens);
        }
        fprintf(f, "\n]\n");
        return;
    }
    fprintf(f, "%-6s %9s %10s %10s %9s %9s %9s %8s %10s %10s %9s %8s %10s\n", "index", "N", "s/token", "first s",
            "peak GiB", "anon GiB", "recall@k", "needles", "build s", "write s", "file GiB", "of dense",
            "disk MB/t");
    for (int i = 0; i < n; i++) {
        const topk_row *r = &rows[i];
        fprintf(f, "%-6s %9lld %10.4f %10.4f %9.2f %9.2f %9.4f %4d/%-3d %10.1f %10.1f %9.2f %8.4f %10.1f\n", r->index,
                (long long)r->N, r->r.s_per_token, r->r.s_first, r->peak_rss / 1073741824.0,
                r->r.rss_anon / 1073741824.0, r->r.recall, r->r.needles_found, r->r.needles_total, r->build_s,
                r->write_s, r->file_bytes / 1073741824.0,
                r->r.dense_elements ? (double)r->r.elements / (double)r->r.dense_elements : NAN,
                r->r.read_bytes / 1e6 / o->tokens);
    }
    for (int i = 0; i < n; i++)
        if (rows[i].r.nominal)
            fprintf(f, "%s: \"of dense\" uses a nominal index read (g * ef * 2M * (4d + 4) bytes per head): "
                       "Faiss does not report what a search visits\n", rows[i].index);
}

int cli_topk(int argc, char **argv)
{
    topk_opts o;
    memset(&o, 0, sizeof o);
    o.shape = "llama-3.2-1b";
    o.size = "64k";
    o.index = "exact,ivf,sparq";
    o.k = 100;
    o.tokens = 8;
    o.warmup = 1;
    o.needles = 16;
    o.clusters = 256;
    o.spread = 0.5f;
    o.aniso = 0.5f;
    o.recall_heads = 8;
    o.seed = 1;
    o.file = "/tmp/sparq_bench_topk.kv";
    o.result_fd = -1;
    cli_group groups[] = { { "bench-topk", topk_table, &o } };
    char err[512];
    const int parsed = cli_parse_command(groups, 1, argc, argv,
                                         "usage: sparq bench-topk [--shape NAME] [--size N] [--index LIST] [options]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    const topk_shape *sh = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(o.shape, shapes[i].name) == 0) sh = &shapes[i];
    int64_t N = 0;
    if (!sh) {
        fprintf(stderr, "error: --shape must be llama-3.2-1b, llama-3-8b, smollm2-135m or tiny, not '%s'\n", o.shape);
        return 2;
    }
    if (bench_parse_list(o.size, &N, 1, err, sizeof err) != 1 || N < 2 || N > INT32_MAX) {
        fprintf(stderr, "error: --size must be one count in [2, 2^31), e.g. 64k or 1M\n");
        return 2;
    }
    if (o.k < 1 || o.tokens < 1 || o.warmup < 0 || o.needles < 0 || o.clusters < 1 || o.recall_heads < 0 ||
        !(o.spread >= 0) || !(o.aniso >= 0 && o.aniso <= 4) || key_type_of(o.key_type) < 0) {
        fprintf(stderr, "error: bad option value (k, tokens, clusters >= 1; warmup, needles, recall-heads >= 0; "
                        "key type f16|bf16|i8)\n");
        return 2;
    }
    if (o.needles > sh->n_layer * sh->n_kv_head * (sh->n_head / sh->n_kv_head)) {
        fprintf(stderr, "error: --needles %d exceeds the %d (layer, query head) slots of %s\n", o.needles,
                sh->n_layer * sh->n_head, sh->name);
        return 2;
    }
    if (o.threads <= 0) o.threads = omp_get_num_procs();
    synth s = { sh, N, o.clusters, o.needles, sh->n_head / sh->n_kv_head, o.spread, o.aniso, o.seed, o.qseed };

    if (o.child) { /* decode child: one kind, result on the pipe */
        topk_result res;
        memset(&res, 0, sizeof res);
        decode_child(&s, &o, o.child, o.index, &res);
        if (o.result_fd >= 0) {
            ssize_t w = write(o.result_fd, &res, sizeof res);
            (void)w;
        }
        return res.ok ? 0 : 1;
    }

    const char *kinds[KVF_MAX_KINDS];
    int nk = kvf_parse_kinds(o.index, kinds, err, sizeof err);
    if (nk <= 0) {
        fprintf(stderr, "error: --index: %s\n", nk == 0 ? "no index kind given" : err);
        return 2;
    }
    for (int i = 0; i < nk; i++) {
        sparq_attn_params p = topk_params(&o, kinds[i]);
        if (attn_policy_find("topk")->resolve(&p, sh->d, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return 2;
        }
    }
    topk_row rows[KVF_MAX_KINDS];
    memset(rows, 0, sizeof rows);
    int rc = 0;
    for (int i = 0; i < nk; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s.%s", o.file, kinds[i]);
        topk_row *row = &rows[i];
        snprintf(row->index, sizeof row->index, "%s", kinds[i]);
        row->N = N;
        struct stat st;
        if (o.reuse && stat(path, &st) == 0) {
            fprintf(stderr, "bench-topk: reusing %s (build and write times not measured)\n", path);
            row->build_s = row->write_s = NAN;
        } else {
            fprintf(stderr, "bench-topk: %s, %lld positions, index %s: writing %s\n", sh->name, (long long)N,
                    kinds[i], path);
            const double t0 = cli_now();
            if (write_file(&s, &o, kinds[i], path, &row->build_s, err, sizeof err)) {
                fprintf(stderr, "error: %s\n", err);
                rc = 1;
                break;
            }
            row->write_s = cli_now() - t0;
        }
        if (stat(path, &st) == 0) row->file_bytes = st.st_size;
        fprintf(stderr, "bench-topk: wrote %.2f GiB in %.1f s (index build %.1f s summed over heads); decoding\n",
                row->file_bytes / 1073741824.0, row->write_s, row->build_s);
        int drc = spawn_decode(argv, &o, path, kinds[i], row, err, sizeof err);
        if (!o.keep && !o.reuse) unlink(path);
        if (drc) {
            fprintf(stderr, "error: %s\n", err);
            rc = 1;
            break;
        }
        fprintf(stderr, "bench-topk: %s: %.4f s/token, recall@%d %.4f, needles %d/%d, peak RSS %.2f GiB\n",
                kinds[i], row->r.s_per_token, o.k, row->r.recall, row->r.needles_found,
                row->r.needles_total, row->peak_rss / 1073741824.0);
    }
    if (rc == 0) print_rows(stdout, rows, nk, &o, o.json);
    return rc;
}
