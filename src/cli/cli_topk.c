/* cli_topk.c - `sparq bench-topk` (also `sparq bench topk`): top-k
 * attention over a synthetic prefix of a real model shape, decoded from a
 * KV cache file. What is written, decoded and measured, and the synthetic
 * data, are src/bench/bench_topk.h's; this file parses the options, runs
 * each index kind (write the file, decode it in a fresh process: this
 * program again with --child-decode) and prints the rows.
 *
 * --reuse decodes a kept file only if its header matches --shape, --size
 * and the steps asked for. Where the index read is nominal (hnsw: Faiss
 * reports no visits) the output says so.
 */
#include "bench/bench.h"
#include "bench/bench_topk.h"
#include "cli/cli.h"
#include "io/kvfile.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

typedef struct topk_row {
    char        index[8];
    int64_t     N;
    double      build_s, write_s;
    int64_t     file_bytes, peak_rss;
    bench_topk_result r;
} topk_row;

/* The decode child's command line: this program's bench-topk with
 * --child-decode and every data option, the result on fd. */
typedef struct child_cmd {
    const topk_opts *o;
    const char *path, *kind;
    char a[24][64];          /* the numbers' text */
} child_cmd;

static void child_args(void *user, int fd, const char **args)
{
    child_cmd *c = user;
    const topk_opts *o = c->o;
    int n = 0;
    args[n++] = "/proc/self/exe";
    args[n++] = "bench-topk";
    args[n++] = "--child-decode";
    args[n++] = c->path;
    args[n++] = "--index";
    args[n++] = c->kind;
    args[n++] = "--shape";
    args[n++] = o->shape;
    args[n++] = "--size";
    args[n++] = o->size;
    if (o->key_type) { args[n++] = "--index-key-type"; args[n++] = o->key_type; }
    static const char *names[] = { "--topk-k", "--tokens", "--warmup", "--needles", "--clusters",
                                   "--ivf-nlist", "--ivf-nprobe", "--hnsw-ef", "--threads",
                                   "--recall-heads", "--result-fd" };
    const int vals[] = { o->k, o->tokens, o->warmup, o->needles, o->clusters, o->nlist, o->nprobe,
                         o->ef, o->threads, o->recall_heads, fd };
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        snprintf(c->a[i], sizeof c->a[i], "%d", vals[i]);
        args[n++] = names[i];
        args[n++] = c->a[i];
    }
    snprintf(c->a[20], sizeof c->a[20], "%.9g", o->spread);
    args[n++] = "--spread";
    args[n++] = c->a[20];
    snprintf(c->a[22], sizeof c->a[22], "%.9g", o->aniso);
    args[n++] = "--aniso";
    args[n++] = c->a[22];
    snprintf(c->a[21], sizeof c->a[21], "%llu", (unsigned long long)o->seed);
    args[n++] = "--seed";
    args[n++] = c->a[21];
    snprintf(c->a[23], sizeof c->a[23], "%llu", (unsigned long long)o->qseed);
    args[n++] = "--query-seed";
    args[n++] = c->a[23];
    args[n] = NULL;
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

static void opts_default(topk_opts *o)
{
    memset(o, 0, sizeof *o);
    o->shape = "llama-3.2-1b";
    o->size = "64k";
    o->index = "exact,ivf,sparq";
    o->k = 100;
    o->tokens = 8;
    o->warmup = 1;
    o->needles = 16;
    o->clusters = 256;
    o->spread = 0.5f;
    o->aniso = 0.5f;
    o->recall_heads = 8;
    o->seed = 1;
    o->file = "/tmp/sparq_bench_topk.kv";
    o->result_fd = -1;
}

/* Checks the options into the library's parameters (threads 0: all
 * cores, also in o, which the child's command line repeats). Returns -1
 * to go on, else the exit status (2, the error printed). */
static int check_opts(topk_opts *o, bench_topk_params *p)
{
    char err[512];
    const bench_topk_shape *sh = bench_topk_shape_find(o->shape);
    int64_t N = 0;
    if (!sh) {
        fprintf(stderr, "error: --shape must be llama-3.2-1b, llama-3-8b, smollm2-135m or tiny, not '%s'\n", o->shape);
        return 2;
    }
    if (bench_parse_list(o->size, &N, 1, err, sizeof err) != 1 || N < 2 || N > INT32_MAX) {
        fprintf(stderr, "error: --size must be one count in [2, 2^31), e.g. 64k or 1M\n");
        return 2;
    }
    if (o->k < 1 || o->tokens < 1 || o->warmup < 0 || o->needles < 0 || o->clusters < 1 || o->recall_heads < 0 ||
        !(o->spread >= 0) || !(o->aniso >= 0 && o->aniso <= 4) || bench_topk_key_type(o->key_type) < 0) {
        fprintf(stderr, "error: bad option value (k, tokens, clusters >= 1; warmup, needles, recall-heads >= 0; "
                        "key type f16|bf16|i8)\n");
        return 2;
    }
    if (o->needles > sh->n_layer * sh->n_kv_head * (sh->n_head / sh->n_kv_head)) {
        fprintf(stderr, "error: --needles %d exceeds the %d (layer, query head) slots of %s\n", o->needles,
                sh->n_layer * sh->n_head, sh->name);
        return 2;
    }
    if (o->threads <= 0) o->threads = omp_get_num_procs();
    *p = (bench_topk_params){ .shape = sh, .P = N, .clusters = o->clusters, .needles = o->needles,
                              .spread = o->spread, .aniso = o->aniso, .seed = o->seed, .qseed = o->qseed,
                              .k = o->k, .key_type = bench_topk_key_type(o->key_type), .nlist = o->nlist,
                              .nprobe = o->nprobe, .ef = o->ef, .tokens = o->tokens, .warmup = o->warmup,
                              .threads = o->threads, .recall_heads = o->recall_heads };
    return -1;
}

/* One index kind: the file (written, or kept by an earlier run with
 * --reuse), then its decode in a fresh process. 0, or 1 with the error
 * printed. */
static int run_kind(const topk_opts *o, const bench_topk_params *p, const char *kind, topk_row *row)
{
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s.%s", o->file, kind);
    snprintf(row->index, sizeof row->index, "%s", kind);
    row->N = p->P;
    struct stat st;
    if (o->reuse && stat(path, &st) == 0) {
        fprintf(stderr, "bench-topk: reusing %s (build and write times not measured)\n", path);
        row->build_s = row->write_s = NAN;
    } else {
        fprintf(stderr, "bench-topk: %s, %lld positions, index %s: writing %s\n", p->shape->name, (long long)p->P,
                kind, path);
        const double t0 = cli_now();
        if (bench_topk_write(p, kind, path, &row->build_s, err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return 1;
        }
        row->write_s = cli_now() - t0;
    }
    if (stat(path, &st) == 0) row->file_bytes = st.st_size;
    fprintf(stderr, "bench-topk: wrote %.2f GiB in %.1f s (index build %.1f s summed over heads); decoding\n",
            row->file_bytes / 1073741824.0, row->write_s, row->build_s);
    child_cmd cmd = { .o = o, .path = path, .kind = kind };
    int drc = bench_topk_spawn(child_args, &cmd, kind, &row->r, &row->peak_rss, err, sizeof err);
    if (!o->keep && !o->reuse) unlink(path);
    if (drc) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    fprintf(stderr, "bench-topk: %s: %.4f s/token, recall@%d %.4f, needles %d/%d, peak RSS %.2f GiB\n", kind,
            row->r.s_per_token, o->k, row->r.recall, row->r.needles_found, row->r.needles_total,
            row->peak_rss / 1073741824.0);
    return 0;
}

int cli_topk(int argc, char **argv)
{
    topk_opts o;
    opts_default(&o);
    cli_group groups[] = { { "bench-topk", topk_table, &o } };
    const int parsed = cli_parse_command(groups, 1, argc, argv,
                                         "usage: sparq bench-topk [--shape NAME] [--size N] [--index LIST] [options]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    bench_topk_params p;
    const int st = check_opts(&o, &p);
    if (st >= 0) return st;

    if (o.child) { /* decode child: one kind, result on the pipe */
        bench_topk_result res;
        memset(&res, 0, sizeof res);
        bench_topk_decode(&p, o.child, o.index, &res);
        if (o.result_fd >= 0) {
            ssize_t w = write(o.result_fd, &res, sizeof res);
            (void)w;
        }
        return res.ok ? 0 : 1;
    }

    char err[512];
    const char *kinds[KVF_MAX_KINDS];
    int nk = kvf_parse_kinds(o.index, kinds, err, sizeof err);
    if (nk <= 0) {
        fprintf(stderr, "error: --index: %s\n", nk == 0 ? "no index kind given" : err);
        return 2;
    }
    for (int i = 0; i < nk; i++)
        if (bench_topk_check(&p, kinds[i], err, sizeof err)) {
            fprintf(stderr, "error: %s\n", err);
            return 2;
        }
    topk_row rows[KVF_MAX_KINDS];
    memset(rows, 0, sizeof rows);
    for (int i = 0; i < nk; i++)
        if (run_kind(&o, &p, kinds[i], &rows[i])) return 1;
    print_rows(stdout, rows, nk, &o, o.json);
    return 0;
}
