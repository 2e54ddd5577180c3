/* bench_topk.c - `bench-topk`'s synthetic prefix, its file, the decode
 * that reads it and the fresh process that decode runs in (bench_topk.h).
 */
#include "bench/bench_topk.h"
#include "attn/attn.h"
#include "bench/bench.h"
#include "core/kvcache.h"
#include "io/kvfile.h"
#include "tensor/quant.h"
#include "util/err.h"
#include "util/rng.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const bench_topk_shape shapes[] = {
    { "llama-3.2-1b", 16, 32, 8, 64 },
    { "llama-3-8b", 32, 32, 8, 128 },
    { "smollm2-135m", 30, 9, 3, 64 },
    { "tiny", 2, 8, 2, 64 },
};

const bench_topk_shape *bench_topk_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(name, shapes[i].name) == 0) return &shapes[i];
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- synthetic data ---------------------------------------------------------- */

typedef struct synth {
    const bench_topk_shape *sh;
    int64_t  P;
    int      C, M, g;
    float    spread, aniso;
    uint64_t seed, qseed;
} synth;

static synth synth_of(const bench_topk_params *p)
{
    const bench_topk_shape *sh = p->shape;
    synth s = { sh, p->P, p->clusters, p->needles, sh->n_head / sh->n_kv_head, p->spread, p->aniso, p->seed,
                p->qseed };
    return s;
}

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

int bench_topk_key_type(const char *s)
{
    if (!s || strcmp(s, "f16") == 0) return SPARQ_KEY_F16;
    if (strcmp(s, "bf16") == 0) return SPARQ_KEY_BF16;
    if (strcmp(s, "i8") == 0 || strcmp(s, "int8") == 0) return SPARQ_KEY_I8;
    return -1;
}

sparq_attn_params bench_topk_attn_params(const bench_topk_params *o, const char *kind)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = "topk";
    p.index = kind;
    p.k = o->k;
    p.index_key_type = o->key_type;
    p.ivf_nlist = o->nlist;
    p.ivf_nprobe = o->nprobe;
    p.hnsw_ef_search = o->ef;
    return p;
}

int bench_topk_check(const bench_topk_params *p, const char *kind, char *err, size_t err_size)
{
    sparq_attn_params ap = bench_topk_attn_params(p, kind);
    return attn_policy_find("topk")->resolve(&ap, p->shape->d, err, err_size) ? -1 : 0;
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
        return err_set(err, err_size, "out of memory generating %lld keys", (long long)s->P);
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

int bench_topk_write(const bench_topk_params *o, const char *kind, const char *path, double *build_s, char *err,
                     size_t err_size)
{
    const synth s = synth_of(o);
    const bench_topk_shape *sh = s.sh;
    kvf_fingerprint fp;
    kvf_synthetic_fingerprint(&fp, sh->n_layer, sh->n_head, sh->n_kv_head, sh->d);
    const int64_t cap = s.P + o->warmup + o->tokens + 16;
    kvf_writer *w;
    const kvf_shape shape = {.elem = KV_F16, .n = s.P, .cap = cap, .with_kt = 0, .n_tokens = 0, .kinds = kind};
    if (kvf_writer_create(path, &fp, &shape, &w, err, err_size)) return -1;
    sparq_attn_params p = bench_topk_attn_params(o, kind);
    return kvf_write_heads(w, o->threads, &p, synth_rows, (void *)&s, build_s, err, err_size);
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

/* One decode's file, cache, policy and buffers. */
typedef struct topk_dec {
    const synth *s;
    const bench_topk_params *o;
    kvf_file *f;
    kv_cache kv;
    int kv_made;
    sparq_attn_params p;
    const attn_policy *pol;
    void *state;
    size_t sf;                 /* scratch floats per thread                    */
    float *sfl;                /* [threads][sf]                                */
    int32_t *sint;             /* [threads][sf]                                */
    float *q;                  /* [n_layer][n_head][d]: one step's queries      */
    float *out;                /* [n_head][d]                                  */
    float *knew;               /* [2][n_kv_head][d]: the new token's K, V       */
    float *cen;                /* [n_layer][n_kv_head][C + 1][d]: centres, scales */
    int32_t *ids, *ex;         /* [g][k] the index's choice; [k] exact top-k    */
    float *sc;                 /* [g][P] scores                                */
    int32_t *work;             /* attn_topk_work(P)                            */
    uint8_t *found;            /* [M + 1] needle retrieved at every step        */
} topk_dec;

static void dec_free(topk_dec *D)
{
    if (D->state) D->pol->state_free(D->state);
    free(D->sfl); free(D->sint); free(D->q); free(D->out); free(D->knew); free(D->cen);
    free(D->ids); free(D->ex); free(D->sc); free(D->work); free(D->found);
    if (D->kv_made) kv_free(&D->kv);
    kvf_close(D->f);
}

/* Opens the file (of this shape, size and room for the steps: a file kept
 * by an earlier run may be another's) and borrows its K and V as the
 * cache; resolves the policy's parameters. */
static int dec_open(topk_dec *D, const char *path, const char *kind, bench_topk_result *res)
{
    const synth *s = D->s;
    const bench_topk_shape *sh = s->sh;
    char err[256];
    kvf_fingerprint fp;
    kvf_synthetic_fingerprint(&fp, sh->n_layer, sh->n_head, sh->n_kv_head, sh->d);
    if (kvf_open(path, &fp, KVF_VERIFY_AUTO, &D->f, err, sizeof err)) {
        return err_set(res->err, sizeof res->err, "%s", err);
    }
    const kvf_file *f = D->f;
    const int64_t need = s->P + D->o->warmup + D->o->tokens;
    if (f->n != s->P || f->cap < need || f->elem != KV_F16) {
        return err_set(res->err, sizeof res->err,
                       "kvfile '%s' holds %lld f%d positions of room %lld; --size %lld with %lld steps needs %lld "
                       "f16 positions of room %lld",
                       path, (long long)f->n, f->elem == KV_F16 ? 16 : 32, (long long)f->cap, (long long)s->P,
                       (long long)(D->o->warmup + D->o->tokens), (long long)s->P, (long long)need);
    }
    res->verified = f->verified;
    const kv_borrow b = { .n_layer = sh->n_layer, .n_kv_head = sh->n_kv_head, .d = sh->d, .cap = f->cap,
                          .elem = f->elem, .k = f->k, .v = f->v, .n = f->n };
    if (kv_create_borrowed(&D->kv, &b, err, sizeof err)) {
        return err_set(res->err, sizeof res->err, "%s", err);
    }
    D->kv_made = 1;
    D->p = bench_topk_attn_params(D->o, kind);
    D->pol = attn_policy_find("topk");
    if (D->pol->resolve(&D->p, sh->d, err, sizeof err)) {
        return err_set(res->err, sizeof res->err, "%s", err);
    }
    return 0;
}

/* The buffers and the policy's state bound to the file's prefix and
 * indexes; the centres of every head. */
static int dec_prepare(topk_dec *D, bench_topk_result *res)
{
    const synth *s = D->s;
    const bench_topk_shape *sh = s->sh;
    const int d = sh->d, H = sh->n_kv_head, g = s->g, L = sh->n_layer, nt = D->o->threads;
    const int64_t cap = D->f->cap;
    attn_shape shape = { L, H, g, d, cap };
    D->sf = attn_pad16(D->pol->scratch_floats(&D->p, cap, d, g));
    D->sfl = aligned_alloc(64, (size_t)nt * D->sf * sizeof(float));
    D->sint = aligned_alloc(64, (size_t)nt * D->sf * sizeof(int32_t));
    D->q = malloc((size_t)L * sh->n_head * d * sizeof *D->q);
    D->out = malloc((size_t)sh->n_head * d * sizeof *D->out);
    D->knew = malloc((size_t)H * d * 2 * sizeof *D->knew);
    D->cen = malloc((size_t)L * H * (s->C + 1) * d * sizeof *D->cen);
    const int k = D->p.k;
    D->ids = malloc((size_t)g * k * sizeof *D->ids);
    D->ex = malloc((size_t)k * sizeof *D->ex);
    D->sc = malloc((size_t)g * s->P * sizeof *D->sc);
    D->work = malloc(attn_topk_work((size_t)s->P) * sizeof *D->work);
    D->found = malloc((size_t)s->M + 1);
    if (!D->sfl || !D->sint || !D->q || !D->out || !D->knew || !D->cen || !D->ids || !D->ex || !D->sc ||
        !D->work || !D->found || D->pol->state_create(&D->p, &shape, &D->state)) {
        return err_set(res->err, sizeof res->err, "out of memory for decoding");
    }
    memset(D->found, 1, (size_t)s->M + 1);
    D->pol->set_prefix(D->state, &D->p, D->f->n, &D->f->source);
    kvf_advise_random(D->f);
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) centres(s, l, h, D->cen + ((size_t)l * H + h) * (s->C + 1) * d);
    return 0;
}

/* Layer l of decode step t at position pos: the step's queries and new
 * token, then (timed) its append and every KV head's attention. Adds the
 * elements moved to *elems and the seconds to *secs. 0, or -1 with a
 * message in err. */
static int dec_layer(topk_dec *D, int l, int t, int64_t pos, int64_t *elems, double *secs, char *err,
                     size_t err_size)
{
    const synth *s = D->s;
    const bench_topk_shape *sh = s->sh;
    const int d = sh->d, H = sh->n_kv_head, g = s->g;
    const size_t sf = D->sf;
    float *ql = D->q + (size_t)l * sh->n_head * d;
    gen_queries(s, l, t, D->cen + (size_t)l * H * (s->C + 1) * d, ql);
    for (int h = 0; h < H; h++) /* the new token: a key of its own cluster run */
        gen_keys(s, l, h, D->cen + ((size_t)l * H + h) * (s->C + 1) * d, pos, 1, D->knew + (size_t)h * d);
    bench_rng r;
    bench_rng_seed(&r, mix(s->seed, (uint64_t)(pos * 131 + l)));
    fast_noise(&r, D->knew + (size_t)H * d, (size_t)H * d, 1.0f);
    const double ts = now_s();
    kv_write(&D->kv, l, pos, D->knew, D->knew + (size_t)H * d);
    int64_t rd = 0, wr = 0;
    int failed = 0;
#pragma omp parallel for num_threads(D->o->threads) schedule(dynamic, 1) reduction(+ : rd, wr)
    for (int h = 0; h < H; h++) {
        const int tid = omp_get_thread_num();
        char e[256] = "";
        attn_scratch scr = { D->sfl + (size_t)tid * sf, sf, D->sint + (size_t)tid * sf, e, sizeof e };
        attn_kv_view view;
        kv_view(&D->kv, l, h, pos + 1, &view);
        attn_counts cnt = { 0, 0 };
        const attn_step step = { .layer = l, .kv_head = h, .kv = &view, .q = ql + (size_t)h * g * d, .g = g,
                                 .out = D->out + (size_t)h * g * d, .scratch = &scr, .counts = &cnt };
        if (D->pol->attend(D->state, &D->p, &step)) {
#pragma omp critical(topk_step_error)
            if (!failed) {
                failed = 1;
                err_set(err, err_size, "layer %d, kv head %d: %s", l, h, e[0] ? e : "failed");
            }
        }
        rd += cnt.read;
        wr += cnt.written;
    }
    if (failed) return -1;
    *secs += now_s() - ts;
    *elems += rd + wr;
    return 0;
}

/* Untimed, after a step at position pos: recall@k on the sampled heads
 * (n_rh of the pairs, spread over the model) and the needles' retrieval. */
static int dec_check(topk_dec *D, int64_t pos, int n_rh, bench_topk_result *res)
{
    const synth *s = D->s;
    const bench_topk_shape *sh = s->sh;
    const int d = sh->d, g = s->g, L = sh->n_layer, pairs = L * sh->n_kv_head, k = D->p.k;
    for (int hh = 0; hh < pairs; hh++) {
        const int l = hh % L, h = hh / L;
        const float *qh = D->q + ((size_t)l * sh->n_head + (size_t)h * g) * d;
        attn_scratch scr = { D->sfl, D->sf, D->sint, NULL, 0 };
        int sampled = 0, has_needle = 0;
        for (int i = 0; i < n_rh; i++) sampled |= (int)((int64_t)i * pairs / n_rh) == hh;
        for (int i = 0; i < s->M; i++) {
            needle nd = needle_of(s, i);
            has_needle |= nd.layer == l && nd.head == h;
        }
        if (!sampled && !has_needle) continue;
        attn_kv_view view;
        kv_view(&D->kv, l, h, pos + 1, &view);
        if (attn_topk_select(D->state, &D->p, l, h, &view, qh, g, D->ids, &scr) != k) {
            return err_set(res->err, sizeof res->err, "layer %d head %d: no index selection", l, h);
        }
        if (sampled) {
            attn_kv_view pre;
            kv_view(&D->kv, l, h, s->P, &pre);
            score_head(&pre, qh, g, k, D->ids, D->sc, D->ex, D->work, &res->recall_hits, &res->recall_total);
        }
        for (int i = 0; i < s->M; i++) {
            needle nd = needle_of(s, i);
            if (nd.layer != l || nd.head != h) continue;
            int hit = 0;
            for (int j = 0; j < k; j++) hit |= D->ids[nd.qh * k + j] == (int32_t)nd.pos;
            D->found[i] &= (uint8_t)hit;
        }
    }
    return 0;
}

/* The figures of the finished decode: times, recall, needles, transfer,
 * the policy's index statistics and memory. */
static void dec_result(topk_dec *D, double t_sum, int64_t elems, bench_topk_result *res)
{
    const synth *s = D->s;
    const bench_topk_shape *sh = s->sh;
    const int steps = D->o->warmup + D->o->tokens;
    res->s_per_token = D->o->tokens > 0 ? t_sum / D->o->tokens : NAN;
    res->recall = res->recall_total ? (double)res->recall_hits / res->recall_total : NAN;
    res->needles_total = s->M;
    for (int i = 0; i < s->M; i++) res->needles_found += D->found[i];
    res->elements = elems;
    res->dense_elements = (int64_t)sh->n_layer * sh->n_kv_head * (2 * (s->P + steps) * sh->d + 2 * (int64_t)sh->d);
    sparq_attn_stats st;
    memset(&st, 0, sizeof st);
    D->pol->stats(D->state, &st);
    res->index_seconds = st.index_seconds;
    res->nominal = st.nominal_elements > 0;
    read_rss(&res->rss_anon, &res->rss_file);
    res->ok = 1;
}

int bench_topk_decode(const bench_topk_params *o, const char *path, const char *kind, bench_topk_result *res)
{
    const synth s = synth_of(o);
    topk_dec D;
    memset(&D, 0, sizeof D);
    D.s = &s;
    D.o = o;
    const double t0 = now_s();
    int rc = -1;
    if (dec_open(&D, path, kind, res) || dec_prepare(&D, res)) goto done;
    res->s_open = now_s() - t0;
    const int pairs = s.sh->n_layer * s.sh->n_kv_head;
    const int n_rh = o->recall_heads < pairs ? o->recall_heads : pairs;
    const int steps = o->warmup + o->tokens;
    double t_sum = 0;
    int64_t elems = 0, mf0 = 0, rb0 = 0;
    for (int t = 0; t < steps; t++) {
        const int64_t pos = D.kv.n;
        if (t == o->warmup) io_counters(&mf0, &rb0);
        double t_step = 0;
        int64_t step_elems = 0;
        char step_err[320] = "";
        for (int l = 0; l < s.sh->n_layer; l++)
            if (dec_layer(&D, l, t, pos, &step_elems, &t_step, step_err, sizeof step_err)) {
                err_set(res->err, sizeof res->err, "decode step: %.200s", step_err);
                goto done;
            }
        if (t >= o->warmup && dec_check(&D, pos, n_rh, res)) goto done;
        D.kv.n++;
        if (t == 0) res->s_first = t_step;
        if (t >= o->warmup) {
            t_sum += t_step;
            elems = step_elems;
        }
    }
    io_counters(&res->majflt, &res->read_bytes);
    res->majflt -= mf0;
    res->read_bytes -= rb0;
    dec_result(&D, t_sum, elems, res);
    rc = 0;
done:
    dec_free(&D);
    return rc;
}

/* ---- the fresh process ---------------------------------------------------------- */

int bench_topk_spawn(bench_topk_child_args build, void *user, const char *kind, bench_topk_result *res,
                     int64_t *peak_rss, char *err, size_t err_size)
{
    int fds[2];
    if (pipe(fds) != 0) {
        return err_set(err, err_size, "pipe: %s", strerror(errno));
    }
    const char *args[BENCH_TOPK_MAX_ARGS + 1];
    memset(args, 0, sizeof args);
    build(user, fds[1], args);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        err_set(err, err_size, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    close(fds[1]);
    memset(res, 0, sizeof *res);
    size_t got = 0;
    while (got < sizeof *res) {
        ssize_t r = read(fds[0], (char *)res + got, sizeof *res - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fds[0]);
    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
    *peak_rss = (int64_t)ru.ru_maxrss * 1024;
    if (got != sizeof *res || !res->ok) {
        return err_set(err, err_size, "decode of %s failed: %s", kind, got == sizeof *res ? res->err : "the child died");
    }
    return 0;
}
