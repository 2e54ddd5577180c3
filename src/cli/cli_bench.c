/* cli_bench.c - `sparq bench attn | membw | decode`: timing runs.
 *
 *   attn    the decode attention operation alone, as the SparQ paper's
 *           microbenchmarks (section 6, appendix F): a KV cache of B
 *           sequences (one cache "layer" per batch element) filled with
 *           N(0,1) keys and values (bench_fill_kv: stored as each
 *           --kv-type stores them, Q8_0 blocks included; byte columns in
 *           that type's bytes), one call = every (b, kv_head) pair
 *           through policy->attend, spread over threads with OpenMP as the
 *           model's decode step does; warm-up, then timed repetitions with
 *           a fresh random query each.
 *   membw   sequential read bandwidth (sum of a large f32 array), so the
 *           attention rows can be stated as a share of the roofline.
 *   decode  end-to-end tokens/s of the real decode path at context depths
 *           (as llama-bench -d), the cache filled by a real prefill of a
 *           synthetic token sequence or, with --fill random, by
 *           sparq_context_fill_random (timing only: outputs meaningless).
 *           Weights vs attention: the same policy's ms/token at depth 0 is
 *           the weights-only baseline, the rest is attributed to attention.
 *   prefill prompt processing tokens/s (pp N at depth D, as llama-bench
 *           -p N -d D) with the GFLOP/s it implies (bench_prefill_main).
 *   peak    the machine's measured int8 (vpdpbusd) and f32 (FMA) peak and
 *           the prefill GEMM tile's rate, the roofline for the prefill rows.
 *
 * stdout carries the table (or the JSON array / CSV); progress goes to stderr.
 * Arithmetic, statistics and formatting live in bench.c (tested there).
 */
#include "cli/cli.h"
#include "util/sysmem.h"
#include "bench/bench.h"
#include "core/kvcache.h"
#include "core/model.h"
#include "tensor/gemm.h"
#include "tensor/quant.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

enum { MAX_LIST = 64, MAX_CFG = 64, MAX_PARALLEL = 256 };

typedef struct bench_opts {
    /* attn shapes (comma lists) */
    const char *B, *H, *kv_heads, *d, *S, *threads, *kv_type;
    int heavy, flush, membw, skip_dense;
    /* policies */
    const char *attn, *r, *k, *attn_k, *ratio, *select;
    int l, no_realloc, n_sink;
    /* repetition */
    int reps, warmup, min_sample_us;
    uint64_t seed;
    /* membw */
    int64_t size_mib;
    const char *streams;
    /* decode */
    const char *model, *depth, *fill, *parallel;
    int n_tokens, n_batch;
    int use_mmap;            /* --mmap */
    int no_repack;           /* --no-repack */
    /* output */
    int json, csv;
    const char *plot, *title;
} bench_opts;

#define OFF(f) offsetof(bench_opts, f)
static const cli_opt shape_table[] = {
    { "--B", "--batch", OPT_STR, OFF(B), "LIST", "batch sizes (sequences), e.g. 1,4,16 (default 1)" },
    { "--H", "--heads", OPT_STR, OFF(H), "LIST", "query heads (default 32)" },
    { "--kv-heads", NULL, OPT_STR, OFF(kv_heads), "LIST", "KV heads (default 8)" },
    { "--d", "--head-dim", OPT_STR, OFF(d), "LIST", "head size (default 128)" },
    { "--S", "--ctx", OPT_STR, OFF(S), "LIST", "context lengths; k = x1024, M = x1048576 (default 1k,4k,16k,32k)" },
    { "--heavy-tailed-query", NULL, OPT_FLAG, OFF(heavy), NULL,
      "queries with a few dominant components (x exp(1.5 N(0,1)) per component) instead of N(0,1)" },
    { "--flush", NULL, OPT_FLAG, OFF(flush), NULL, "evict the caches (read 64 MiB) before every timed sample" },
    { "--skip-dense", NULL, OPT_FLAG, OFF(skip_dense), NULL,
      "do not run the dense reference (no speed-up column; for profiling one policy)" },
    { "--membw", NULL, OPT_FLAG, OFF(membw), NULL,
      "measure read bandwidth first (per thread count) and report % of it (column %bw)" },
    { 0 },
};

static const cli_opt common_table[] = {
    { "-t", "--threads", OPT_STR, OFF(threads), "LIST", "thread counts, e.g. 1,2 (default: all cores)" },
    { "--kv-type", NULL, OPT_STR, OFF(kv_type), "LIST", "KV element types f16,f32,q8_0 (default f16)" },
    { "--reps", NULL, OPT_INT, OFF(reps), "N", "timed samples (default 10; decode: see -n)" },
    { "--warmup", NULL, OPT_INT, OFF(warmup), "N", "untimed warm-up calls / tokens (default 2)" },
    { "--min-sample-us", NULL, OPT_INT, OFF(min_sample_us), "US",
      "attn: repeat short calls within one sample until it lasts this long (default 1000)" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "data seed (default 1)" },
    { 0 },
};

static const cli_opt policy_table[] = {
    { "--attn", NULL, OPT_STR, OFF(attn), "LIST",
      "policies: dense,sparq,oracle,flexgen,h2o,streaming (default dense,sparq; dense always runs)" },
    { "--sparq-r", NULL, OPT_STR, OFF(r), "LIST", "SparQ query components (default d/4)" },
    { "--sparq-k", NULL, OPT_STR, OFF(k), "LIST", "SparQ positions kept (default 128)" },
    { "--sparq-l", NULL, OPT_INT, OFF(l), "L", "SparQ local window (default k/4)" },
    { "--sparq-ratio", NULL, OPT_STR, OFF(ratio), "LIST",
      "SparQ r, k for transfer ratios at each S / depth, e.g. 1/8,1/16 (replaces -r/-k)" },
    { "--sparq-select", NULL, OPT_STR, OFF(select), "probs|logits", "SparQ selection score (default probs)" },
    { "--sparq-no-realloc", NULL, OPT_FLAG, OFF(no_realloc), NULL, "SparQ without mean-value reallocation" },
    { "--attn-k", NULL, OPT_STR, OFF(attn_k), "LIST", "positions kept by oracle/flexgen/h2o/streaming (default 128)" },
    { "--n-sink", NULL, OPT_INT, OFF(n_sink), "N", "streaming: sink positions (default 16)" },
    { 0 },
};

static const cli_opt membw_table[] = {
    { "--size", NULL, OPT_I64, OFF(size_mib), "MIB", "array size in MiB (default 1024)" },
    { "--streams", NULL, OPT_STR, OFF(streams), "LIST", "sequential streams per thread (default 1,4); "
      "the best row is the roofline" },
    { 0 },
};

static const cli_opt decode_table[] = {
    { "-m", "--model", OPT_STR, OFF(model), "FILE", "GGUF model (searched like `sparq run -m`)" },
    { "--depth", "-d", OPT_STR, OFF(depth), "LIST",
      "context depths, e.g. 0,8k,32k (default 0,4k; depth 0 is always run: the weights baseline)" },
    { "--fill", NULL, OPT_STR, OFF(fill), "prefill|random",
      "how the cache reaches the depth (default prefill; random = sparq_context_fill_random, timing only)" },
    { "-n", "--n-gen", OPT_INT, OFF(n_tokens), "N", "decode tokens timed per depth (default 32)" },
    { "-np", "--parallel", OPT_STR, OFF(parallel), "LIST",
      "sequences decoded together, one batched step for all (as the server's), each its own cache filled to "
      "the depth, e.g. 1,4,16 (default 1); tok/s is the aggregate" },
    { "-b", "--batch-size", OPT_INT, OFF(n_batch), "N", "prefill batch size (default 512)" },
    { "--mmap", NULL, OPT_FLAG, OFF(use_mmap), NULL, "map the model file instead of reading it into huge pages" },
    { "-nr", "--no-repack", OPT_FLAG, OFF(no_repack), NULL, "keep Q8_0 weights as stored (not repacked for the GEMM tiles)" },
    { 0 },
};

static const cli_opt out_table[] = {
    { "--json", NULL, OPT_FLAG, OFF(json), NULL, "stdout: a JSON array of rows (table goes to stderr)" },
    { "--csv", NULL, OPT_FLAG, OFF(csv), NULL, "stdout: CSV (table goes to stderr)" },
    { "--plot", NULL, OPT_STR, OFF(plot), "FILE.png",
      "draw with gnuplot (script kept as FILE.png.gp): attn, speed-up over dense vs S; decode, tok/s vs depth per policy" },
    { "--title", NULL, OPT_STR, OFF(title), "TEXT", "plot title" },
    { 0 },
};
#undef OFF

/* ---- small helpers ----------------------------------------------------------- */

typedef struct row_list { bench_row *v; int n, cap; } row_list;

static bench_row *row_push(row_list *rl)
{
    if (rl->n == rl->cap) {
        int cap = rl->cap ? rl->cap * 2 : 32;
        bench_row *v = realloc(rl->v, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        rl->v = v;
        rl->cap = cap;
    }
    return &rl->v[rl->n++];
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts ascending and drops duplicates; returns the new count. */
static int sort_unique(int64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[i] != v[m - 1]) v[m++] = v[i];
    return m;
}

/* A list option with a default; every value must lie in [lo, hi]. */
static int int_list(const char *name, const char *s, const char *def, int64_t lo, int64_t hi,
                    int64_t *out, char *err, size_t err_size)
{
    char e[256];
    int n = bench_parse_list(s ? s : def, out, MAX_LIST, e, sizeof e);
    if (n < 0) {
        snprintf(err, err_size, "%s: %s", name, e);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (out[i] < lo || out[i] > hi) {
            snprintf(err, err_size, "%s: %lld is outside [%lld, %lld]", name, (long long)out[i],
                     (long long)lo, (long long)hi);
            return -1;
        }
    return n;
}

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    bytes = (bytes + 63) / 64 * 64;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

/* Resident set size now, bytes (/proc/self/statm); -1 if unknown. */
static int64_t rss_now(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return -1;
    long long size = 0, res = -1;
    int ok = fscanf(f, "%lld %lld", &size, &res) == 2;
    fclose(f);
    return ok ? (int64_t)res * sysconf(_SC_PAGESIZE) : -1;
}

/* Runs argv (no shell); returns its exit status or -1. */
static int run_quiet(char *const argv[], int quiet)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (quiet) {
            FILE *devnull = freopen("/dev/null", "w", stderr);
            (void)devnull;
            if (!freopen("/dev/null", "w", stdout)) _exit(127);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) < 0) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ---- policy configurations ------------------------------------------------------ */

/* One policy with one parameter choice; ratio != NULL: SparQ r, k picked
 * per context length (attn_opts_params). */
typedef struct pol_cfg {
    const attn_policy *pol;
    sparq_attn_params  p;
    const char        *ratio;
} pol_cfg;

static int build_cfgs(const bench_opts *o, pol_cfg *cfg, char *names_buf, size_t names_size,
                      char *ratio_buf, size_t ratio_size, char *err, size_t err_size)
{
    const char *names[MAX_CFG], *ratios[MAX_LIST];
    int64_t rs[MAX_LIST], ks[MAX_LIST], aks[MAX_LIST];
    int n_names = bench_split_names(o->attn ? o->attn : "dense,sparq", names_buf, names_size, names,
                                    MAX_CFG, err, err_size);
    if (n_names < 0) return -1;
    int n_r = int_list("--sparq-r", o->r, "0", 0, 4096, rs, err, err_size);
    int n_k = n_r < 0 ? -1 : int_list("--sparq-k", o->k, "128", 1, INT32_MAX, ks, err, err_size);
    int n_ak = n_k < 0 ? -1 : int_list("--attn-k", o->attn_k, "128", 1, INT32_MAX, aks, err, err_size);
    if (n_ak < 0) return -1;
    int n_ratio = 0;
    if (o->ratio && (n_ratio = bench_split_names(o->ratio, ratio_buf, ratio_size, ratios, MAX_LIST, err,
                                                 err_size)) < 0)
        return -1;
    int select_logits = 0;
    if (o->select) {
        if (strcmp(o->select, "logits") == 0) select_logits = 1;
        else if (strcmp(o->select, "probs") != 0) {
            snprintf(err, err_size, "--sparq-select must be probs or logits, not '%s'", o->select);
            return -1;
        }
    }
    int n = 0;
    /* dense first: every other row's speed-up is measured against it */
    cfg[n].pol = attn_policy_find("dense");
    cfg[n].p = sparq_attn_default_params();
    cfg[n].p.policy = "dense";
    cfg[n].ratio = NULL;
    n++;
    for (int i = 0; i < n_names; i++) {
        const attn_policy *pol = attn_policy_find(names[i]);
        if (!pol) {
            char known[ATTN_NAMES_MAX];
            snprintf(err, err_size, "--attn: unknown policy '%s' (known: %s)", names[i], attn_policy_names(known, sizeof known, ", "));
            return -1;
        }
        if (strcmp(pol->name, "dense") == 0) continue;
        sparq_attn_params base = sparq_attn_default_params();
        base.policy = pol->name;
        base.l = o->l;
        base.select_logits = select_logits;
        base.no_realloc = o->no_realloc;
        base.n_sink = o->n_sink;
        int is_sparq = strcmp(pol->name, "sparq") == 0;
        int n_a = is_sparq ? (n_ratio ? n_ratio : n_r) : n_ak;
        int n_b = is_sparq && !n_ratio ? n_k : 1;
        for (int a = 0; a < n_a; a++)
            for (int b = 0; b < n_b; b++) {
                if (n >= MAX_CFG) {
                    snprintf(err, err_size, "too many policy configurations (max %d)", MAX_CFG);
                    return -1;
                }
                cfg[n].pol = pol;
                cfg[n].p = base;
                cfg[n].ratio = NULL;
                if (is_sparq && n_ratio) cfg[n].ratio = ratios[a];
                else if (is_sparq) { cfg[n].p.r = (int)rs[a]; cfg[n].p.k = (int)ks[b]; }
                else cfg[n].p.k = (int)aks[a];
                n++;
            }
    }
    return n;
}

/* Parameters of cfg for context S and head size d, defaults filled. */
static int cfg_params(const pol_cfg *c, int64_t S, int d, sparq_attn_params *out, char *err, size_t err_size)
{
    *out = c->p;
    if (c->ratio) {
        attn_opts ao;
        attn_opts_init(&ao);
        ao.attn = "sparq";
        ao.ratio = c->ratio;
        ao.l = c->p.l;
        ao.no_realloc = c->p.no_realloc;
        ao.select = c->p.select_logits ? "logits" : "probs";
        if (attn_opts_params(&ao, S, d, out, err, err_size)) return -1;
    }
    return c->pol->resolve(out, d, err, err_size);
}

static int same_params(const sparq_attn_params *a, const sparq_attn_params *b)
{
    return a->r == b->r && a->k == b->k && a->l == b->l && a->select_logits == b->select_logits &&
           a->no_realloc == b->no_realloc && a->n_sink == b->n_sink;
}

/* Fills row's r, k, l with the parameters that mean something for the policy. */
static void row_params(bench_row *row, const attn_policy *pol, const sparq_attn_params *p)
{
    int sparq = strcmp(pol->name, "sparq") == 0, dense = strcmp(pol->name, "dense") == 0;
    row->r = sparq ? p->r : 0;
    row->k = dense ? 0 : p->k;
    row->l = (sparq || strcmp(pol->name, "h2o") == 0) && p->l > 0 ? p->l : 0;
}

/* The attn.h element types of --kv-type's names; -1 naming a bad one. */
static int kv_elem_list(const char *const *names, int n, int *out, char *err, size_t err_size)
{
    for (int i = 0; i < n; i++) {
        const int t = cli_kv_type(names[i]);
        if (t < 0) {
            snprintf(err, err_size, "--kv-type: '%s' is not f16, f32 or q8_0", names[i]);
            return -1;
        }
        out[i] = t == SPARQ_KV_F32 ? KV_F32 : t == SPARQ_KV_Q8_0 ? KV_Q8_0 : KV_F16;
    }
    return 0;
}

/* ---- membw ------------------------------------------------------------------------ */

/* Times `reps` sequential reads of `bytes` over `threads` threads, each
 * thread reading its share as `streams` interleaved sequential streams (4 KiB
 * from each in turn: more streams keep more prefetchers and DRAM banks busy).
 * The array sits in transparent huge pages, as the model's weights and the KV
 * cache do, so the TLB does not cap it below what decode reaches. */
static int measure_membw(int64_t bytes, int threads, int streams, int reps, int warmup,
                         bench_row *row, char *err, size_t err_size)
{
    const size_t huge = (size_t)2 << 20;
    const size_t n = (size_t)bytes / sizeof(float);
    float *x = NULL;
    const size_t alloc = (n * sizeof(float) + huge - 1) / huge * huge;
    if (posix_memalign((void **)&x, huge, alloc)) x = NULL;
    double *t = malloc((size_t)(reps > 0 ? reps : 1) * 2 * sizeof(double));
    if (!x || !t) {
        snprintf(err, err_size, "membw: cannot allocate %lld MiB", (long long)(bytes >> 20));
        free(x);
        free(t);
        return -1;
    }
    madvise(x, alloc, MADV_HUGEPAGE); /* advice only: without it the read still works */
    /* first touch with the threads that will read (page placement) */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 7);
    volatile float sink = 0;
    enum { BLOCK = 1024 }; /* floats per turn of a stream: 4 KiB */
    for (int rep = -warmup; rep < reps; rep++) {
        double t0 = cli_now();
        float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
        {
            const int nt = omp_get_num_threads(), id = omp_get_thread_num();
            const size_t chunk = (n / (size_t)nt + 15) / 16 * 16;
            size_t lo = (size_t)id * chunk, hi = lo + chunk < n ? lo + chunk : n;
            if (lo < hi) {
                const size_t len = hi - lo;
                const size_t part = (len / (size_t)streams + BLOCK - 1) / BLOCK * BLOCK;
                for (size_t off = 0; off < part; off += BLOCK)
                    for (int s = 0; s < streams; s++) {
                        const size_t a = (size_t)s * part + off;
                        if (a >= len) break;
                        const size_t m = len - a < BLOCK ? len - a : BLOCK;
                        total += bench_sum_f32(x + lo + a, m);
                    }
            }
        }
        double dt = cli_now() - t0;
        sink += total;
        if (rep >= 0) t[rep] = dt * 1e6;
    }
    (void)sink;
    bench_row_init(row, BENCH_MEMBW);
    if (streams == 1) snprintf(row->policy, sizeof row->policy, "read");
    else snprintf(row->policy, sizeof row->policy, "read-x%d", streams);
    row->threads = threads;
    row->kv_elem = KV_F32; /* the array read is f32 */
    bench_stats_of(t, reps, t + reps, &row->us);
    row->bytes_counted = (int64_t)(n * sizeof(float));
    row->gbps = bench_gbps((double)row->bytes_counted, row->us.median);
    free(x);
    free(t);
    return 0;
}

/* ---- attn ------------------------------------------------------------------------- */

typedef struct attn_job {
    const attn_policy *pol;
    void *state;
    const sparq_attn_params *p;
    const kv_cache *kv;
    int B, kvh, g, threads;
    int64_t S;
    const float *q;       /* [B][kvh][g][d] */
    float *out;           /* [B][kvh][g][d] */
    float *sf;            /* [threads][n_scratch] */
    int32_t *si;          /* [threads][n_scratch] */
    size_t n_scratch;
    attn_counts *counts;  /* [B * kvh] */
    char err[256];        /* the first failing call's message */
} attn_job;

/* One benchmark call: every (b, kv_head) pair through the policy, pairs
 * spread over the threads as the model's decode step spreads KV heads.
 * Returns 0, or -1 with the first failure's message in j->err. */
static int attn_call(attn_job *j)
{
    const int pairs = j->B * j->kvh, d = j->kv->d;
    int failed = 0;
#pragma omp parallel num_threads(j->threads)
    {
        const int tid = omp_get_thread_num();
        char e[256] = "";
        attn_scratch s = { .f = j->sf + (size_t)tid * j->n_scratch, .n_f = j->n_scratch,
                           .i = j->si + (size_t)tid * j->n_scratch, .err = e, .err_size = sizeof e };
#pragma omp for schedule(static)
        for (int i = 0; i < pairs; i++) {
            const int b = i / j->kvh, h = i % j->kvh;
            attn_kv_view v;
            kv_view(j->kv, b, h, j->S, &v);
            const size_t off = (size_t)i * j->g * d;
            j->counts[i].read = j->counts[i].written = 0;
            const attn_step step = { .layer = b, .kv_head = h, .kv = &v, .q = j->q + off, .g = j->g,
                                     .out = j->out + off, .scratch = &s, .counts = &j->counts[i] };
            if (j->pol->attend(j->state, j->p, &step)) {
#pragma omp critical(attn_call_error)
                if (!failed) {
                    failed = 1;
                    snprintf(j->err, sizeof j->err, "%s", e[0] ? e : "failed");
                }
            }
        }
    }
    return failed ? -1 : 0;
}

typedef struct attn_point {
    int B, H, kvh, d, threads, kv_elem;
    int64_t S;
} attn_point;

/* Times one policy configuration at one point; fills row (without the
 * speed-up, which the caller sets against its dense row). */
static int measure_attn(const bench_opts *o, const kv_cache *kv, const attn_policy *pol,
                        const sparq_attn_params *p, const attn_point *pt, float *flush_buf,
                        size_t flush_n, bench_row *row, char *err, size_t err_size)
{
    const int g = pt->H / pt->kvh, d = pt->d, pairs = pt->B * pt->kvh;
    const size_t nq = (size_t)pt->B * pt->H * d;
    size_t n_scratch = attn_pad16(pol->scratch_floats(p, pt->S, d, g));
    attn_job j = { .pol = pol, .p = p, .kv = kv, .B = pt->B, .kvh = pt->kvh, .g = g,
                   .threads = pt->threads, .S = pt->S, .n_scratch = n_scratch };
    float *q = alloc64(nq * sizeof(float)), *out = alloc64(nq * sizeof(float));
    j.sf = alloc64((size_t)pt->threads * n_scratch * sizeof(float));
    j.si = alloc64((size_t)pt->threads * n_scratch * sizeof(int32_t));
    j.counts = malloc((size_t)pairs * sizeof *j.counts);
    double *t = malloc((size_t)o->reps * 2 * sizeof(double));
    int rc = -1;
    if (!q || !out || !j.sf || !j.si || !j.counts || !t) {
        snprintf(err, err_size, "attn: out of memory (scratch %zu floats x %d threads)", n_scratch, pt->threads);
        goto done;
    }
    if (pol->state_create) {
        attn_shape shape = { pt->B, pt->kvh, g, d, kv->cap };
        if (pol->state_create(p, &shape, &j.state)) {
            snprintf(err, err_size, "attn: cannot create %s state for %lld positions", pol->name,
                     (long long)kv->cap);
            goto done;
        }
    }
    j.q = q;
    j.out = out;
    bench_rng rng;
    bench_rng_seed(&rng, o->seed * 0x9E3779B97F4A7C15ull + 12345);

    /* warm-up: the first call's counts are the bytes a call moves; the
     * last one's time sets how many calls make one sample */
    double t_call = 0;
    int64_t counted = 0;
    for (int w = 0; w < (o->warmup > 0 ? o->warmup : 1); w++) {
        bench_query(&rng, q, pt->B * pt->H, d, o->heavy);
        double t0 = cli_now();
        if (attn_call(&j)) {
            snprintf(err, err_size, "attn: %s: %s", pol->name, j.err);
            goto done;
        }
        t_call = (cli_now() - t0) * 1e6;
        if (w == 0) counted = bench_counted_bytes(j.counts, pairs, pt->kv_elem);
    }
    int inner = t_call > 0 ? (int)ceil(o->min_sample_us / t_call) : 1;
    if (inner < 1 || o->flush) inner = 1;
    if (inner > 10000) inner = 10000;
    volatile float sink = 0;
    int call_failed = 0;
    for (int rep = 0; rep < o->reps; rep++) {
        bench_query(&rng, q, pt->B * pt->H, d, o->heavy);
        if (flush_buf) sink += bench_sum_f32(flush_buf, flush_n);
        double t0 = cli_now();
        for (int i = 0; i < inner; i++) call_failed |= attn_call(&j);
        t[rep] = (cli_now() - t0) * 1e6 / inner;
        sink += out[0];
    }
    (void)sink;
    if (call_failed) {
        snprintf(err, err_size, "attn: %s: %s", pol->name, j.err);
        goto done;
    }

    bench_row_init(row, BENCH_ATTN);
    snprintf(row->policy, sizeof row->policy, "%s", pol->name);
    row->B = pt->B;
    row->H = pt->H;
    row->kv_heads = pt->kvh;
    row->d = d;
    row->S = pt->S;
    row_params(row, pol, p);
    row->threads = pt->threads;
    row->kv_elem = pt->kv_elem;
    row->heavy_query = o->heavy;
    row->inner = inner;
    bench_stats_of(t, o->reps, t + o->reps, &row->us);
    row->bytes_counted = counted;
    row->bytes_formula = bench_formula_bytes(pol, p, pt->S, d, g, pairs, pt->kv_elem);
    row->bytes_dense = bench_formula_bytes(attn_policy_find("dense"), p, pt->S, d, g, pairs, pt->kv_elem);
    row->gbps = bench_gbps((double)counted, row->us.median);
    row->theoretical_ratio = bench_ratio((double)row->bytes_formula, (double)row->bytes_dense);
    rc = 0;
done:
    if (j.state && pol->state_free) pol->state_free(j.state);
    free(q);
    free(out);
    free(j.sf);
    free(j.si);
    free(j.counts);
    free(t);
    return rc;
}

typedef struct bw_ref { int threads; double gbps; } bw_ref;

static double bw_for(const bw_ref *bw, int n_bw, int threads)
{
    for (int i = 0; i < n_bw; i++)
        if (bw[i].threads == threads) return bw[i].gbps;
    return NAN;
}

/* What every shape of an attn sweep shares. */
typedef struct attn_sweep {
    const bench_opts *o;
    const int64_t *S;      /* ascending */
    int n_S;
    const int64_t *threads;
    int n_threads;
    const pol_cfg *cfg;    /* cfg[0] is dense */
    int n_cfg;
    unsigned needs;        /* union of the policies' cache needs */
    const bw_ref *bw;
    int n_bw;
    float *flush;          /* NULL unless --flush */
    size_t flush_n;
} attn_sweep;

/* Every policy at every thread count on one cache, S ascending. */
static int sweep_S(const attn_sweep *w, kv_cache *kv, attn_point pt, int n_fit, const char *kv_name,
                   row_list *rl, char *err, size_t err_size)
{
    int64_t filled = 0;
    for (int iS = 0; iS < n_fit; iS++) {
        pt.S = w->S[iS];
        double t0 = cli_now();
        if (bench_fill_kv(kv, filled, pt.S, w->o->seed, omp_get_num_procs())) {
            snprintf(err, err_size, "attn: out of memory filling the cache");
            return -1;
        }
        if (pt.S - filled > 65536)
            fprintf(stderr, "attn: filled %lld positions in %.1f s\n", (long long)(pt.S - filled), cli_now() - t0);
        filled = pt.S;
        for (int it = 0; it < w->n_threads; it++) {
            pt.threads = (int)w->threads[it];
            double dense_us = NAN;
            for (int c = w->o->skip_dense ? 1 : 0; c < w->n_cfg; c++) {
                sparq_attn_params p;
                char e[256];
                if (cfg_params(&w->cfg[c], pt.S, pt.d, &p, e, sizeof e)) {
                    fprintf(stderr, "attn: skipping %s at S=%lld d=%d: %s\n", w->cfg[c].pol->name,
                            (long long)pt.S, pt.d, e);
                    continue;
                }
                bench_row *row = row_push(rl);
                if (!row) {
                    snprintf(err, err_size, "out of memory");
                    return -1;
                }
                if (measure_attn(w->o, kv, w->cfg[c].pol, &p, &pt, w->flush, w->flush_n, row, err, err_size))
                    return -1;
                if (c == 0) dense_us = row->us.median;
                row->speedup_vs_dense = bench_speedup(dense_us, row->us.median);
                double ref = bw_for(w->bw, w->n_bw, pt.threads);
                if (ref > 0) row->pct_bw = 100.0 * row->gbps / ref;
                fprintf(stderr, "attn: %-9s r=%-3d k=%-5d B=%d H=%d kv=%d d=%d S=%-7lld t=%d %s: %10.1f us  "
                        "%6.2f GB/s  x%.2f (theory x%.2f)\n", row->policy, row->r, row->k, pt.B, pt.H, pt.kvh,
                        pt.d, (long long)pt.S, pt.threads, kv_name, row->us.median, row->gbps,
                        row->speedup_vs_dense, 1.0 / row->theoretical_ratio);
            }
        }
    }
    return 0;
}

/* One shape (B, H, KV heads, d, element type): a cache for the largest S
 * that fits in memory, then the S sweep on it. */
static int sweep_shape(const attn_sweep *w, attn_point pt, const char *kv_name, row_list *rl, char *err,
                       size_t err_size)
{
    if (pt.H % pt.kvh != 0) {
        fprintf(stderr, "attn: skipping H=%d kv-heads=%d (H must be a multiple of the KV heads)\n", pt.H, pt.kvh);
        return 0;
    }
    /* K, V (and K^T) of every sequence, keeping 30% of the available
     * memory for everything else */
    const int with_kt = !!(w->needs & ATTN_NEEDS_KT);
    const double per_pos = (double)pt.B * pt.kvh * (double)attn_kv_row_bytes(pt.kv_elem, pt.d) * (2 + with_kt);
    const int64_t avail = sysmem_available();
    int n_fit = w->n_S;
    if (avail > 0)
        while (n_fit > 0 && per_pos * (double)w->S[n_fit - 1] > 0.7 * (double)avail) n_fit--;
    for (int i = n_fit; i < w->n_S; i++)
        fprintf(stderr, "attn: skipping S=%lld for B=%d kv-heads=%d d=%d %s: needs %.1f GiB, %.1f GiB available\n",
                (long long)w->S[i], pt.B, pt.kvh, pt.d, kv_name, per_pos * (double)w->S[i] / (1 << 30),
                (double)avail / (1 << 30));
    if (n_fit == 0) return 0;
    kv_cache kv;
    if (kv_create(&kv, pt.B, pt.kvh, pt.d, w->S[n_fit - 1], pt.kv_elem, with_kt,
                  !!(w->needs & ATTN_NEEDS_VSUM), err, err_size))
        return -1;
    int rc = sweep_S(w, &kv, pt, n_fit, kv_name, rl, err, err_size);
    kv_free(&kv);
    return rc;
}

static int bench_attn(const bench_opts *o, row_list *rl, char *err, size_t err_size)
{
    int64_t Bs[MAX_LIST], Hs[MAX_LIST], KVs[MAX_LIST], ds[MAX_LIST], Ss[MAX_LIST], ts[MAX_LIST];
    const char *kv_names[4];
    char kv_buf[64], names_buf[512], ratio_buf[256];
    char def_t[16];
    snprintf(def_t, sizeof def_t, "%d", omp_get_num_procs());
    int nB = int_list("--B", o->B, "1", 1, 4096, Bs, err, err_size);
    int nH = nB < 0 ? -1 : int_list("--H", o->H, "32", 1, 4096, Hs, err, err_size);
    int nKV = nH < 0 ? -1 : int_list("--kv-heads", o->kv_heads, "8", 1, 4096, KVs, err, err_size);
    int nd = nKV < 0 ? -1 : int_list("--d", o->d, "128", 1, 1024, ds, err, err_size);
    int nS = nd < 0 ? -1 : int_list("--S", o->S, "1k,4k,16k,32k", 1, (int64_t)1 << 31, Ss, err, err_size);
    int nt = nS < 0 ? -1 : int_list("-t", o->threads, def_t, 1, 1024, ts, err, err_size);
    if (nt < 0) return -1;
    nS = sort_unique(Ss, nS);
    int nkv = bench_split_names(o->kv_type ? o->kv_type : "f16", kv_buf, sizeof kv_buf, kv_names, 4, err, err_size);
    if (nkv < 0) return -1;
    int kv_elems[4];
    if (kv_elem_list(kv_names, nkv, kv_elems, err, err_size)) return -1;
    pol_cfg cfg[MAX_CFG];
    int ncfg = build_cfgs(o, cfg, names_buf, sizeof names_buf, ratio_buf, sizeof ratio_buf, err, err_size);
    if (ncfg < 0) return -1;
    bw_ref bw[MAX_LIST];
    attn_sweep w = { .o = o, .S = Ss, .n_S = nS, .threads = ts, .n_threads = nt, .cfg = cfg, .n_cfg = ncfg,
                     .bw = bw, .flush_n = (size_t)64 << 20 >> 2 };
    for (int c = 0; c < ncfg; c++) w.needs |= cfg[c].pol->needs;

    if (o->membw) /* the roofline: the best of one and four streams per thread */
        for (int i = 0; i < nt; i++) {
            bw[w.n_bw].threads = (int)ts[i];
            bw[w.n_bw].gbps = 0;
            for (int streams = 1; streams <= 4; streams += 3) {
                bench_row *row = row_push(rl);
                if (!row || measure_membw((int64_t)512 << 20, (int)ts[i], streams, 5, 1, row, err, err_size))
                    return -1;
                if (row->gbps > bw[w.n_bw].gbps) bw[w.n_bw].gbps = row->gbps;
                fprintf(stderr, "membw: %d thread(s), %d stream(s): %.2f GB/s\n", (int)ts[i], streams,
                        row->gbps);
            }
            w.n_bw++;
        }
    if (o->flush) {
        if (!(w.flush = alloc64(w.flush_n * sizeof(float)))) {
            snprintf(err, err_size, "--flush: cannot allocate 64 MiB");
            return -1;
        }
        memset(w.flush, 0, w.flush_n * sizeof(float));
    }
    int rc = 0;
    for (int ie = 0; ie < nkv && rc == 0; ie++)
        for (int iB = 0; iB < nB && rc == 0; iB++)
            for (int iH = 0; iH < nH && rc == 0; iH++)
                for (int iK = 0; iK < nKV && rc == 0; iK++)
                    for (int id = 0; id < nd && rc == 0; id++) {
                        attn_point pt = { (int)Bs[iB], (int)Hs[iH], (int)KVs[iK], (int)ds[id], 0,
                                          kv_elems[ie], 0 };
                        rc = sweep_shape(&w, pt, kv_names[ie], rl, err, err_size);
                    }
    free(w.flush);
    return rc;
}

/* ---- decode ----------------------------------------------------------------------- */

/* Brings the context to `depth` positions: a real prefill of synthetic
 * tokens, or random keys and values (timing only). */
static int decode_fill(sparq_context *c, int64_t depth, int random_fill, int n_vocab, uint64_t seed,
                       char *err, size_t err_size)
{
    int64_t pos = sparq_context_pos(c);
    if (depth <= pos) return 0;
    if (random_fill) {
        if (sparq_context_fill_random(c, depth - pos, seed + (uint64_t)pos)) goto fail;
        return 0;
    }
    enum { CHUNK = 4096 };
    int32_t *ids = malloc(CHUNK * sizeof *ids);
    if (!ids) {
        snprintf(err, err_size, "decode: out of memory");
        return -1;
    }
    while (pos < depth) {
        int n = depth - pos < CHUNK ? (int)(depth - pos) : CHUNK;
        /* a fixed pseudo-random token sequence (no BOS: timing only) */
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(((uint64_t)(pos + i) * 2654435761u + seed) % (uint64_t)n_vocab);
        if (sparq_eval(c, ids, n, NULL)) {
            free(ids);
            goto fail;
        }
        pos += n;
    }
    free(ids);
    return 0;
fail:
    snprintf(err, err_size, "decode: fill to depth %lld: %s", (long long)depth, sparq_context_error(c));
    return -1;
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Decodes warm-up then n timed steps from the contexts' current position
 * (the depth): one token each (sparq_eval), or, with nb > 1 sequences, one
 * sparq_decode_batch step for all of them, as the server decodes. Fills the
 * row's timing (a step), per-step transfer in bytes of the cache's element
 * type kv_elem summed over the sequences (counted: the contexts' own byte
 * counters; formula and dense: their element counts in the same bytes),
 * the aggregate tokens/s and memory. logits: nb x n_vocab. */
static int decode_point(sparq_context **ctxs, int nb, const sparq_model *m, const bench_opts *o, int64_t depth,
                        int kv_elem, double *t, float *logits, bench_row *row, char *err, size_t err_size)
{
    const int n_vocab = sparq_model_n_vocab(m), n = o->n_tokens;
    int32_t tok[MAX_PARALLEL];
    for (int b = 0; b < nb; b++) tok[b] = (int32_t)((depth * 31 + 7 + 101 * b) % n_vocab);
    for (int w = 0; w < o->warmup; w++)
        if (nb == 1 ? sparq_eval(ctxs[0], tok, 1, logits) : sparq_decode_batch(ctxs, tok, nb, logits)) goto fail;
    sparq_attn_stats s0 = { 0 }, s1 = { 0 }, x;
    for (int b = 0; b < nb; b++) {
        sparq_context_attn_stats(ctxs[b], &x);
        s0.bytes += x.bytes, s0.formula_elements += x.formula_elements, s0.dense_elements += x.dense_elements;
    }
    double total = 0;
    for (int i = 0; i < n; i++) {
        for (int b = 0; b < nb; b++) tok[b] = (int32_t)((tok[b] * 1103515245u + 12345u) % (uint32_t)n_vocab);
        double t1 = cli_now();
        if (nb == 1 ? sparq_eval(ctxs[0], tok, 1, logits) : sparq_decode_batch(ctxs, tok, nb, logits)) goto fail;
        t[i] = (cli_now() - t1) * 1e6;
        total += t[i];
    }
    for (int b = 0; b < nb; b++) {
        sparq_context_attn_stats(ctxs[b], &x);
        s1.bytes += x.bytes, s1.formula_elements += x.formula_elements, s1.dense_elements += x.dense_elements;
    }
    bench_row_init(row, BENCH_DECODE);
    row->B = nb;
    row->H = sparq_model_n_head(m);
    row->kv_heads = sparq_model_n_kv_head(m);
    row->d = sparq_model_head_dim(m);
    row->S = row->depth = depth;
    row->inner = 1;
    bench_stats_of(t, n, t + n, &row->us);
    row->kv_elem = kv_elem;
    row->bytes_counted = (s1.bytes - s0.bytes) / n;
    row->bytes_formula = bench_kv_bytes(kv_elem, s1.formula_elements - s0.formula_elements) / n;
    row->bytes_dense = bench_kv_bytes(kv_elem, s1.dense_elements - s0.dense_elements) / n;
    row->theoretical_ratio = bench_ratio((double)row->bytes_formula, (double)row->bytes_dense);
    row->tok_s = nb * 1e6 / row->us.median;
    row->tok_s_mean = total > 0 ? (double)nb * n * 1e6 / total : NAN;
    row->rss = rss_now();
    row->peak_rss = cli_peak_rss();
    return 0;
fail:
    for (int b = 0; b < nb; b++)
        if (sparq_context_error(ctxs[b])[0]) {
            snprintf(err, err_size, "decode at depth %lld: %s", (long long)depth, sparq_context_error(ctxs[b]));
            return -1;
        }
    snprintf(err, err_size, "decode at depth %lld: the step failed", (long long)depth);
    return -1;
}

static void free_contexts(sparq_context **ctxs, int n)
{
    for (int b = 0; b < n; b++) {
        sparq_context_free(ctxs[b]);
        ctxs[b] = NULL;
    }
}

static int bench_decode(const bench_opts *o, row_list *rl, char *err, size_t err_size)
{
    int64_t depths[MAX_LIST + 1], ts[MAX_LIST], nps[MAX_LIST];
    const char *kv_names[4];
    char kv_buf[64], names_buf[512], ratio_buf[256], def_t[16], path[4096];
    snprintf(def_t, sizeof def_t, "%d", omp_get_num_procs());
    int n_depth = int_list("--depth", o->depth, "0,4k", 0, (int64_t)1 << 31, depths, err, err_size);
    int nt = n_depth < 0 ? -1 : int_list("-t", o->threads, def_t, 1, 1024, ts, err, err_size);
    if (nt < 0) return -1;
    const int n_np = int_list("-np", o->parallel, "1", 1, MAX_PARALLEL, nps, err, err_size);
    if (n_np < 0) return -1;
    int64_t max_np = 1;
    for (int i = 0; i < n_np; i++) max_np = nps[i] > max_np ? nps[i] : max_np;
    depths[n_depth++] = 0; /* the weights-only baseline */
    n_depth = sort_unique(depths, n_depth);
    const int64_t max_depth = depths[n_depth - 1];
    int nkv = bench_split_names(o->kv_type ? o->kv_type : "f16", kv_buf, sizeof kv_buf, kv_names, 4, err, err_size);
    if (nkv < 0) return -1;
    int kv_elems[4];
    if (kv_elem_list(kv_names, nkv, kv_elems, err, err_size)) return -1;
    int random_fill = 0;
    if (o->fill && strcmp(o->fill, "random") == 0) random_fill = 1;
    else if (o->fill && strcmp(o->fill, "prefill") != 0) {
        snprintf(err, err_size, "--fill must be prefill or random, not '%s'", o->fill);
        return -1;
    }
    if (o->n_tokens < 1) {
        snprintf(err, err_size, "-n must be >= 1");
        return -1;
    }
    pol_cfg cfg[MAX_CFG];
    int ncfg = build_cfgs(o, cfg, names_buf, sizeof names_buf, ratio_buf, sizeof ratio_buf, err, err_size);
    if (ncfg < 0) return -1;

    cli_model_opts mo = { 0 };
    mo.model = o->model;
    mo.use_mmap = o->use_mmap;
    mo.no_repack = o->no_repack;
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) {
        snprintf(err, err_size, "cannot load the model");
        return -1;
    }
    const int n_vocab = sparq_model_n_vocab(m), d = sparq_model_head_dim(m);
    const int warm = o->warmup > 0 ? o->warmup : 0;
    const int64_t n_ctx = max_depth + warm + o->n_tokens + 8;
    float *logits = malloc((size_t)max_np * n_vocab * sizeof(float));
    double *t = malloc((size_t)o->n_tokens * 2 * sizeof(double));
    double dense_tok_s[MAX_LIST + 1];
    int rc = -1;
    if (!logits || !t) {
        snprintf(err, err_size, "decode: out of memory");
        goto done;
    }
    for (int ie = 0; ie < nkv; ie++)
    for (int it = 0; it < nt; it++)
    for (int inp = 0; inp < n_np; inp++)
    for (int c = 0; c < ncfg; c++) {
        const int nb = (int)nps[inp];
        sparq_context *ctxs[MAX_PARALLEL] = { 0 };
        sparq_attn_params cur;
        double ms_weights = NAN;
        for (int id = 0; id < n_depth; id++) {
            const int64_t depth = depths[id];
            sparq_attn_params p;
            char e[256];
            /* a ratio is aimed at the context the measured tokens see; where it
             * cannot be met (tiny depths) the largest depth's choice is used */
            if (cfg_params(&cfg[c], depth + warm + o->n_tokens, d, &p, e, sizeof e) &&
                cfg_params(&cfg[c], max_depth + warm + o->n_tokens, d, &p, e, sizeof e)) {
                snprintf(err, err_size, "%s: %s", cfg[c].pol->name, e);
                free_contexts(ctxs, nb);
                goto done;
            }
            if (ctxs[0] && (!same_params(&p, &cur) || sparq_context_pos(ctxs[0]) > depth)) free_contexts(ctxs, nb);
            if (!ctxs[0]) {
                sparq_context_params cp = sparq_context_default_params();
                cp.n_ctx = n_ctx;
                cp.n_threads = (int)ts[it];
                cp.n_batch = o->n_batch;
                cp.kv_type = cli_kv_type(kv_names[ie]);
                cp.attn = p;
                for (int b = 0; b < nb; b++)
                    if (sparq_context_create(m, &cp, &ctxs[b], err, err_size)) {
                        free_contexts(ctxs, nb);
                        goto done;
                    }
                cur = p;
            }
            double t0 = cli_now();
            /* each sequence its own tokens: caches that differ, as clients' do */
            for (int b = 0; b < nb; b++)
                if (decode_fill(ctxs[b], depth, random_fill, n_vocab, o->seed + 7919 * (uint64_t)b, err, err_size)) {
                    free_contexts(ctxs, nb);
                    goto done;
                }
            if (depth > 0)
                fprintf(stderr, "decode: %s fill of %d sequence(s) to depth %lld: %.1f s\n",
                        random_fill ? "random" : "prefill", nb, (long long)depth, cli_now() - t0);
            bench_row *row = row_push(rl);
            if (!row) snprintf(err, err_size, "out of memory");
            if (!row || decode_point(ctxs, nb, m, o, depth, kv_elems[ie], t, logits, row, err, err_size)) {
                free_contexts(ctxs, nb);
                goto done;
            }
            snprintf(row->policy, sizeof row->policy, "%s", cfg[c].pol->name);
            snprintf(row->model, sizeof row->model, "%.63s", base_name(path));
            snprintf(row->fill, sizeof row->fill, "%s", random_fill ? "random" : "prefill");
            row_params(row, cfg[c].pol, &p);
            row->threads = (int)ts[it];
            if (depth == 0) ms_weights = row->us.median / 1e3;
            row->ms_weights = ms_weights;
            row->ms_attn = row->us.median / 1e3 - ms_weights;
            if (row->ms_attn > 0) row->gbps = bench_gbps((double)row->bytes_counted, row->ms_attn * 1e3);
            if (c == 0) dense_tok_s[id] = row->tok_s;
            row->speedup_vs_dense = dense_tok_s[id] > 0 ? row->tok_s / dense_tok_s[id] : NAN;
            fprintf(stderr, "decode: %-9s r=%-3d k=%-5d np=%-3d depth=%-7lld t=%d %s: %8.2f tok/s  %7.3f ms/step "
                    "(attn %.3f)  x%.2f\n", row->policy, row->r, row->k, nb, (long long)depth, row->threads,
                    kv_names[ie], row->tok_s, row->us.median / 1e3, row->ms_attn, row->speedup_vs_dense);
        }
        free_contexts(ctxs, nb);
    }
    rc = 0;
done:
    free(logits);
    free(t);
    sparq_model_free(m);
    return rc;
}

/* ---- prefill and peak ------------------------------------------------------------ */

typedef struct prefill_opts {
    const char *model, *prompt, *depth, *threads, *kv_type;
    int reps, warmup, n_batch, use_mmap, no_repack, json, csv;
    int64_t iters;
} prefill_opts;

#define POFF(f) offsetof(prefill_opts, f)
static const cli_opt prefill_table[] = {
    { "-m", "--model", OPT_STR, POFF(model), "FILE", "GGUF model (searched like `sparq run -m`)" },
    { "-p", "--n-prompt", OPT_STR, POFF(prompt), "LIST", "prompt lengths, e.g. 512,4096 (default 512)" },
    { "-d", "--depth", OPT_STR, POFF(depth), "LIST", "tokens already in the cache (default 0)" },
    { "-b", "--batch-size", OPT_INT, POFF(n_batch), "N", "prefill batch size (default 512)" },
    { "--kv-type", NULL, OPT_STR, POFF(kv_type), "f16|f32", "KV element type (default f16)" },
    { "--mmap", NULL, OPT_FLAG, POFF(use_mmap), NULL, "map the model file instead of reading it" },
    { "-nr", "--no-repack", OPT_FLAG, POFF(no_repack), NULL, "keep Q8_0 weights as stored (not repacked for the GEMM tiles)" },
    { 0 },
};
static const cli_opt peak_table[] = {
    { "--iters", NULL, OPT_I64, POFF(iters), "N", "rounds per timed loop (default 2000000)" },
    { 0 },
};
static const cli_opt prefill_run_table[] = {
    { "-t", "--threads", OPT_STR, POFF(threads), "LIST", "thread counts (default: all cores; peak: 1,all)" },
    { "-r", "--reps", OPT_INT, POFF(reps), "N", "timed repetitions (default 3)" },
    { "--warmup", NULL, OPT_INT, POFF(warmup), "N", "untimed runs before each point (default 1)" },
    { "--json", NULL, OPT_FLAG, POFF(json), NULL, "stdout: a JSON array of rows (table goes to stderr)" },
    { "--csv", NULL, OPT_FLAG, POFF(csv), NULL, "stdout: CSV (table goes to stderr)" },
    { 0 },
};
#undef POFF

/* One result line of `bench prefill` or `bench peak`. */
typedef struct pp_row {
    char   test[32];     /* "pp512" / "int8-vnni" ...                  */
    char   model[64];
    char   type[16];     /* weight type of the FFN down matrix, or "-"  */
    int64_t n_prompt, depth;
    int    threads, reps;
    double ms, ms_min, ms_max;   /* per prompt (prefill) or per loop     */
    double tok_s, gflop, gflop_s;
} pp_row;

/* A JSON number, or null when it is not finite (peak rows have no tok/s). */
static void pp_num(double x) { if (isfinite(x)) printf("%.10g", x); else printf("null"); }

static void pp_write(const pp_row *r, int n, int json, int csv)
{
    FILE *tf = json || csv ? stderr : stdout;
    if (json) {
        printf("[\n");
        for (int i = 0; i < n; i++) {
            printf("  {\"test\": \"%s\", \"model\": ", r[i].test);
            cli_json_str(stdout, r[i].model, strlen(r[i].model));
            printf(", \"type\": \"%s\", \"n_prompt\": %lld, \"n_depth\": %lld, \"threads\": %d, \"reps\": %d, ",
                   r[i].type, (long long)r[i].n_prompt, (long long)r[i].depth, r[i].threads, r[i].reps);
            const char *keys[] = { "ms", "ms_min", "ms_max", "tok_s", "gflop", "gflop_s" };
            const double vals[] = { r[i].ms, r[i].ms_min, r[i].ms_max, r[i].tok_s, r[i].gflop, r[i].gflop_s };
            for (int k = 0; k < 6; k++) {
                printf("%s\"%s\": ", k ? ", " : "", keys[k]);
                pp_num(vals[k]);
            }
            printf("}%s\n", i + 1 < n ? "," : "");
        }
        printf("]\n");
    } else if (csv) {
        printf("test,model,type,n_prompt,n_depth,threads,reps,ms,ms_min,ms_max,tok_s,gflop,gflop_s\n");
        for (int i = 0; i < n; i++)
            printf("%s,%s,%s,%lld,%lld,%d,%d,%.4f,%.4f,%.4f,%.4f,%.10g,%.4f\n", r[i].test, r[i].model, r[i].type,
                   (long long)r[i].n_prompt, (long long)r[i].depth, r[i].threads, r[i].reps, r[i].ms,
                   r[i].ms_min, r[i].ms_max, r[i].tok_s, r[i].gflop, r[i].gflop_s);
    }
    fprintf(tf, "| %-14s | %-24s | %-5s | %7s | %5s | %9s | %10s | %9s |\n", "test", "model", "type", "depth",
            "t", "ms", "tok/s", "GFLOP/s");
    for (int i = 0; i < n; i++)
        fprintf(tf, "| %-14s | %-24.24s | %-5s | %7lld | %5d | %9.2f | %10.2f | %9.2f |\n", r[i].test, r[i].model,
                r[i].type, (long long)r[i].depth, r[i].threads, r[i].ms, r[i].tok_s, r[i].gflop_s);
    fflush(stdout);
}

/* Arithmetic of one prompt of n tokens after `depth`: 2 flops per weight
 * and token for the layer matrices, the LM head once (the last token's
 * logits, as llama-bench), and causal attention's q.k and p.v (2 x 2 x
 * head_dim flops per query head and visible key). */
static double prefill_gflop(const sparq_model *m, int64_t n, int64_t depth)
{
    const model_hparams *hp = &m->hp;
    double w = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const layer_weights *L = &m->layers[il];
        const weight *ws[7] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (int i = 0; i < 7; i++) w += (double)ws[i]->n_in * (double)ws[i]->n_out;
    }
    const double keys = (double)n * (double)depth + (double)n * (double)(n + 1) / 2;
    const double attn = 4.0 * hp->head_dim * hp->n_head * hp->n_layer * keys;
    const double head = 2.0 * (double)m->output.n_in * (double)m->output.n_out;
    return (2.0 * w * (double)n + attn + head) / 1e9;
}

static void pp_stats(pp_row *row, const double *ms, int n)
{
    double sorted[64];
    memcpy(sorted, ms, (size_t)n * sizeof *ms);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of samples */
        for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
            double x = sorted[j];
            sorted[j] = sorted[j - 1];
            sorted[j - 1] = x;
        }
    row->ms = bench_quantile_sorted(sorted, n, 0.5);
    row->ms_min = sorted[0];
    row->ms_max = sorted[n - 1];
    row->reps = n;
}

static int pp_parse(int argc, char **argv, prefill_opts *o, int peak)
{
    memset(o, 0, sizeof *o);
    o->reps = 3;
    o->warmup = 1;
    o->iters = 2000000;
    cli_group groups[2];
    groups[0] = peak ? (cli_group){ "peak", peak_table, o } : (cli_group){ "prefill", prefill_table, o };
    groups[1] = (cli_group){ "runs and output", prefill_run_table, o };
    int parsed = cli_parse_command(groups, 2, argc, argv,
                                   peak ? "usage: sparq bench peak [-t LIST] [--iters N] [--json|--csv]"
                                        : "usage: sparq bench prefill -m MODEL [-p LIST] [-d LIST] [-t LIST] [-r N] "
                                          "[--json|--csv]",
                                   NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    if (o->reps < 1 || o->reps > 64 || o->warmup < 0 || o->iters < 1 || (o->json && o->csv)) {
        fprintf(stderr, "error: -r must be in [1, 64], --warmup >= 0, --iters >= 1, one of --json/--csv\n");
        return 2;
    }
    return -1;
}

/* `sparq bench prefill`: for every thread count, depth and prompt length,
 * warm-up then timed prompts; before each run the cache is reset and
 * refilled to the depth (untimed), as llama-bench -d does. */
static int bench_prefill_main(int argc, char **argv)
{
    prefill_opts o;
    int st = pp_parse(argc, argv, &o, 0);
    if (st >= 0) return st;
    int64_t ps[MAX_LIST], ds[MAX_LIST], ts[MAX_LIST];
    char err[512] = "", def_t[16], path[4096];
    snprintf(def_t, sizeof def_t, "%d", omp_get_num_procs());
    int np = int_list("-p", o.prompt, "512", 1, (int64_t)1 << 30, ps, err, sizeof err);
    int nd = np < 0 ? -1 : int_list("-d", o.depth, "0", 0, (int64_t)1 << 30, ds, err, sizeof err);
    int nt = nd < 0 ? -1 : int_list("-t", o.threads, def_t, 1, 1024, ts, err, sizeof err);
    int kv = cli_kv_type(o.kv_type ? o.kv_type : "f16");
    if (nt < 0 || kv < 0 || kv == SPARQ_KV_Q8_0) {
        fprintf(stderr, "error: %s\n", kv < 0 || kv == SPARQ_KV_Q8_0 ? "--kv-type must be f16 or f32" : err);
        return 2;
    }
    cli_model_opts mo = { 0 };
    mo.model = o.model;
    mo.use_mmap = o.use_mmap;
    mo.no_repack = o.no_repack;
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) return 1;
    const int n_vocab = sparq_model_n_vocab(m);
    int64_t max_p = 0;
    for (int i = 0; i < np; i++) max_p = ps[i] > max_p ? ps[i] : max_p;
    int32_t *ids = malloc((size_t)max_p * sizeof *ids);
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    pp_row *rows = calloc((size_t)np * nd * nt, sizeof *rows);
    int n_rows = 0, rc = 1;
    if (!ids || !logits || !rows) {
        fprintf(stderr, "error: bench prefill: out of memory\n");
        goto done;
    }
    for (int it = 0; it < nt; it++)
        for (int id = 0; id < nd; id++)
            for (int ip = 0; ip < np; ip++) {
                const int64_t n = ps[ip], depth = ds[id];
                sparq_context_params cp = sparq_context_default_params();
                cp.n_ctx = depth + n + 8;
                cp.n_threads = (int)ts[it];
                cp.n_batch = o.n_batch;
                cp.kv_type = kv;
                sparq_context *ctx = NULL;
                if (sparq_context_create(m, &cp, &ctx, err, sizeof err)) {
                    fprintf(stderr, "error: %s\n", err);
                    goto done;
                }
                for (int64_t i = 0; i < n; i++) /* fixed pseudo-random tokens (no BOS: timing only) */
                    ids[i] = (int32_t)(((uint64_t)(depth + i) * 2654435761u + 17) % (uint64_t)n_vocab);
                double ms[64];
                for (int r = 0; r < o.warmup + o.reps; r++) {
                    sparq_context_reset(ctx);
                    if (decode_fill(ctx, depth, 0, n_vocab, 1, err, sizeof err)) {
                        fprintf(stderr, "error: %s\n", err);
                        sparq_context_free(ctx);
                        goto done;
                    }
                    double t0 = cli_now();
                    if (sparq_eval(ctx, ids, (int)n, logits)) {
                        fprintf(stderr, "error: prefill: %s\n", sparq_context_error(ctx));
                        sparq_context_free(ctx);
                        goto done;
                    }
                    if (r >= o.warmup) ms[r - o.warmup] = (cli_now() - t0) * 1e3;
                }
                sparq_context_free(ctx);
                pp_row *row = &rows[n_rows++];
                snprintf(row->test, sizeof row->test, "pp%lld", (long long)n);
                snprintf(row->model, sizeof row->model, "%.63s", base_name(path));
                const quant_traits *qt = quant_traits_of(m->layers[0].w_down.type);
                snprintf(row->type, sizeof row->type, "%s", qt && qt->name ? qt->name : "?");
                row->n_prompt = n;
                row->depth = depth;
                row->threads = (int)ts[it];
                pp_stats(row, ms, o.reps);
                row->tok_s = (double)n / (row->ms / 1e3);
                row->gflop = prefill_gflop(m, n, depth);
                row->gflop_s = row->gflop / (row->ms / 1e3);
                fprintf(stderr, "prefill: pp%lld depth %lld t=%d: %.2f tok/s, %.1f GFLOP/s\n", (long long)n,
                        (long long)depth, row->threads, row->tok_s, row->gflop_s);
            }
    rc = 0;
done:
    if (n_rows > 0) pp_write(rows, n_rows, o.json, o.csv);
    free(ids);
    free(logits);
    free(rows);
    sparq_model_free(m);
    return rc;
}

/* `sparq bench peak`: the int8 and f32 peak of every thread count (each
 * thread its own register loop), and one prefill GEMM tile loop (Q8_0, a
 * 64-row panel against 64 tokens of 2048) per thread, kernel only. */
static int bench_peak_main(int argc, char **argv)
{
    prefill_opts o;
    int st = pp_parse(argc, argv, &o, 1);
    if (st >= 0) return st;
    int64_t ts[MAX_LIST];
    char err[256] = "", def_t[32];
    snprintf(def_t, sizeof def_t, "1,%d", omp_get_num_procs());
    int nt = int_list("-t", o.threads, def_t, 1, 1024, ts, err, sizeof err);
    if (nt < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    nt = sort_unique(ts, nt);
    fprintf(stderr, "bench peak: cpu %s\n", sparq_cpu_level());
    enum { PR = 64, PT = 64, PN = 2048 };
    const size_t rb = gemm_row_bytes(QT_Q8_0, PN), ab = gemm_act_bytes(QT_Q8_0, PN), wrb = (size_t)PN / 32 * 34;
    pp_row rows[3 * MAX_LIST];
    int n_rows = 0;
    for (int it = 0; it < nt; it++)
        for (int kind = 0; kind < 3; kind++) {
            const int threads = (int)ts[it];
            double ms[64], ops = 0;
            int failed = 0;
            for (int r = 0; r < o.warmup + o.reps; r++) {
                double t0 = cli_now(), sum_ops = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum_ops, failed)
                {
                    float sink = 0;
                    if (kind == 0) sum_ops += gemm_peak_int8(o.iters, &sink);
                    else if (kind == 1) sum_ops += gemm_peak_f32(o.iters, &sink);
                    else if (gemm_supported(QT_Q8_0)) { /* what a prefill would run; none: 0 ops */
                        uint8_t *w = calloc(PR, wrb), *pw = aligned_alloc(64, (PR * rb + 63) / 64 * 64),
                                *pa = aligned_alloc(64, PT * ab);
                        float *x = malloc(PN * sizeof(float)), *out = malloc(PR * PT * sizeof(float));
                        if (w && pw && pa && x && out) {
                            for (int i = 0; i < PN; i++) x[i] = (float)((i * 37) % 11) - 5.0f;
                            for (int i = 0; i < PR * (int)wrb; i++) w[i] = (uint8_t)(i * 13);
                            for (int i = 0; i < PR * (int)wrb; i += 34) w[i + 1] = 0x20; /* f16 scale 2^-7ish */
                            gemm_pack_rows(QT_Q8_0, w, wrb, PR, PN, pw);
                            for (int t = 0; t < PT; t++) gemm_pack_act(QT_Q8_0, x, PN, pa + t * ab);
                            const int64_t loops = o.iters / 20000 + 1;
                            for (int64_t l = 0; l < loops; l++) gemm_panel(QT_Q8_0, pw, PR, pa, PT, PN, out, PR);
                            sink = out[0];
                            sum_ops += 2.0 * PR * PT * PN * (double)loops;
                        } else {
                            failed++;
                        }
                        free(w); free(pw); free(pa); free(x); free(out);
                    }
                    if (sink == 12345.678f) sum_ops += 1; /* keeps sink live */
                }
                if (r >= o.warmup) ms[r - o.warmup] = (cli_now() - t0) * 1e3;
                ops = sum_ops;
            }
            if (failed) {
                fprintf(stderr, "error: bench peak: out of memory\n");
                return 1;
            }
            if (ops == 0) {
                fprintf(stderr, "bench peak: %s: this build has no such %s; skipped\n",
                        kind == 0 ? "int8-vnni" : kind == 1 ? "f32-fma" : "gemm-q8_0",
                        kind == 2 ? "prefill GEMM" : "AVX-512 loop");
                continue;
            }
            pp_row *row = &rows[n_rows++];
            memset(row, 0, sizeof *row);
            snprintf(row->test, sizeof row->test, "%s", kind == 0 ? "int8-vnni" : kind == 1 ? "f32-fma" : "gemm-q8_0");
            snprintf(row->model, sizeof row->model, "-");
            snprintf(row->type, sizeof row->type, "%s", kind == 1 ? "F32" : "Q8_0");
            row->threads = (int)ts[it];
            pp_stats(row, ms, o.reps);
            row->gflop = ops / 1e9;
            row->gflop_s = row->gflop / (row->ms / 1e3);
            row->tok_s = NAN;
            fprintf(stderr, "peak: %s t=%d: %.1f GOP/s\n", row->test, row->threads, row->gflop_s);
        }
    pp_write(rows, n_rows, o.json, o.csv);
    return 0;
}

/* ---- output ----------------------------------------------------------------------- */

static int write_plot(const bench_opts *o, const row_list *rl)
{
    size_t len = strlen(o->plot);
    char *script = malloc(len + 4);
    if (!script) return -1;
    snprintf(script, len + 4, "%s.gp", o->plot);
    char *check[] = { "gnuplot", "-e", "set terminal pngcairo", NULL };
    int have = run_quiet(check, 1);
    if (have == 127 || have < 0) {
        fprintf(stderr, "error: --plot needs gnuplot (scripts/setup.sh installs gnuplot-nox)\n");
        free(script);
        return -1;
    }
    const char *term = have == 0 ? "pngcairo" : "png";
    FILE *f = fopen(script, "w");
    if (!f) {
        fprintf(stderr, "error: cannot write '%s'\n", script);
        free(script);
        return -1;
    }
    /* attn rows: speed-up against S; otherwise decode rows: tok/s against depth */
    int n = bench_write_gnuplot(f, rl->v, rl->n, o->plot, term, o->title);
    if (n == 0) n = bench_write_gnuplot_decode(f, rl->v, rl->n, o->plot, term, o->title);
    if (fclose(f) != 0 || n < 0) {
        fprintf(stderr, "error: writing '%s' failed\n", script);
        free(script);
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "warning: --plot: no attn rows with a speed-up and no decode rows to draw\n");
        free(script);
        return 0;
    }
    char *argv[] = { "gnuplot", script, NULL };
    int st = run_quiet(argv, 0);
    if (st != 0) fprintf(stderr, "error: gnuplot %s failed (status %d)\n", script, st);
    else fprintf(stderr, "plot: %s (%s terminal; script %s)\n", o->plot, term, script);
    free(script);
    return st == 0 ? 0 : -1;
}

static void usage_all(FILE *f)
{
    fprintf(f,
            "usage: sparq bench MODE [options]   (sparq bench MODE --help for its options)\n\n"
            "modes:\n"
            "  attn     the decode attention operation alone (SparQ paper section 6 microbenchmark)\n"
            "  membw    sequential read bandwidth (the roofline for the attn rows)\n"
            "  decode   end-to-end decode tokens/s at context depths (like llama-bench -d)\n"
            "  topk     top-k attention over a key index at up to 1M tokens (= sparq bench-topk)\n"
            "  prefill  prompt processing tokens/s and GFLOP/s at depths (like llama-bench -p N -d D)\n"
            "  peak     measured int8 (VNNI) and f32 (FMA) peak GOP/s and the prefill GEMM tile's rate\n");
}

int cli_bench(int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "-h") == 0 || strcmp(argv[0], "--help") == 0) {
        usage_all(argc < 1 ? stderr : stdout);
        return argc < 1 ? 2 : 0;
    }
    const char *mode = argv[0];
    if (strcmp(mode, "topk") == 0) return cli_topk(argc - 1, argv + 1); /* its own options and report */
    if (strcmp(mode, "prefill") == 0) return bench_prefill_main(argc - 1, argv + 1);
    if (strcmp(mode, "peak") == 0) return bench_peak_main(argc - 1, argv + 1);
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.l = -1;
    o.reps = 10;
    o.warmup = 2;
    o.min_sample_us = 1000;
    o.seed = 1;
    o.size_mib = 1024;
    o.n_tokens = 32;
    cli_group groups[5];
    int ng = 0;
    const char *usage;
    if (strcmp(mode, "attn") == 0) {
        groups[ng++] = (cli_group){ "shape", shape_table, &o };
        groups[ng++] = (cli_group){ "attention policies (comma lists sweep)", policy_table, &o };
        usage = "usage: sparq bench attn [--S LIST] [--B LIST] [--attn LIST] [options]";
    } else if (strcmp(mode, "membw") == 0) {
        groups[ng++] = (cli_group){ "membw", membw_table, &o };
        usage = "usage: sparq bench membw [--size MIB] [-t LIST] [options]";
    } else if (strcmp(mode, "decode") == 0) {
        groups[ng++] = (cli_group){ "decode", decode_table, &o };
        groups[ng++] = (cli_group){ "attention policies (comma lists sweep)", policy_table, &o };
        usage = "usage: sparq bench decode -m MODEL [--depth LIST] [--attn LIST] [--fill prefill|random] [options]";
    } else {
        fprintf(stderr, "error: unknown bench mode '%s'\n", mode);
        usage_all(stderr);
        return 2;
    }
    groups[ng++] = (cli_group){ "runs", common_table, &o };
    groups[ng++] = (cli_group){ "output", out_table, &o };
    char err[512];
    const int parsed = cli_parse_command(groups, ng, argc - 1, argv + 1,
                                         usage,
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    if (o.reps < 1 || o.warmup < 0 || o.min_sample_us < 0 || o.size_mib < 1 || o.size_mib > (1 << 20)) {
        fprintf(stderr, "error: --reps must be >= 1, --warmup and --min-sample-us >= 0, --size in [1, 1048576]\n");
        return 2;
    }
    if (o.json && o.csv) {
        fprintf(stderr, "error: give only one of --json and --csv\n");
        return 2;
    }

    row_list rl = { 0 };
    int rc = 0;
    err[0] = 0;
    if (strcmp(mode, "attn") == 0) {
        rc = bench_attn(&o, &rl, err, sizeof err);
    } else if (strcmp(mode, "membw") == 0) {
        int64_t ts[MAX_LIST];
        char def_t[32];
        snprintf(def_t, sizeof def_t, "1,%d", omp_get_num_procs());
        int nt = int_list("-t", o.threads, def_t, 1, 1024, ts, err, sizeof err);
        rc = nt < 0 ? -1 : 0;
        if (nt > 0) nt = sort_unique(ts, nt);
        int64_t ss[MAX_LIST];
        int ns = nt < 0 ? 0 : int_list("--streams", o.streams, "1,4", 1, 64, ss, err, sizeof err);
        if (ns < 0) rc = -1;
        for (int i = 0; rc == 0 && i < nt; i++)
            for (int j = 0; rc == 0 && j < ns; j++) {
                bench_row *row = row_push(&rl);
                if (!row) { snprintf(err, sizeof err, "out of memory"); rc = -1; break; }
                rc = measure_membw(o.size_mib << 20, (int)ts[i], (int)ss[j], o.reps, o.warmup, row, err,
                                   sizeof err);
                if (rc == 0)
                    fprintf(stderr, "membw: %d thread(s), %d stream(s): %.2f GB/s\n", (int)ts[i],
                            (int)ss[j], row->gbps);
            }
    } else {
        rc = bench_decode(&o, &rl, err, sizeof err);
    }
    if (rc != 0) fprintf(stderr, "error: %s\n", err);
    if (rl.n > 0) { /* what was measured is reported even after an error */
        if (o.json) bench_write_json(stdout, rl.v, rl.n);
        else if (o.csv) bench_write_csv(stdout, rl.v, rl.n);
        bench_print_table(o.json || o.csv ? stderr : stdout, rl.v, rl.n);
        fflush(stdout);
        if (o.plot && write_plot(&o, &rl) != 0 && rc == 0) rc = -1;
    }
    free(rl.v);
    return rc == 0 ? 0 : 1;
}
