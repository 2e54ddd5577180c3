/* cli_bench.c - `sparq bench attn | membw | decode | prefill | peak | topk`:
 * the options and the report. What each mode measures and how is in
 * src/bench/bench_run.h (one file per mode under src/bench/); this file
 * parses the options into bench_opts (or the prefill/peak options), loads
 * the model where a mode needs one, calls the run and prints its rows.
 *
 * stdout carries the table (or the JSON array / CSV); progress goes to stderr.
 */
#include "cli/cli.h"
#include "bench/bench_run.h"
#include "util/err.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    { "--rounds", NULL, OPT_INT, OFF(rounds), "R",
      "interleave the policies: all their contexts kept at once, R rounds of -n steps each in turn at every depth "
      "(default 1: one policy after another); a row's statistics cover its R x n steps" },
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

/* ---- helpers ----------------------------------------------------------------- */

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

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
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

/* A JSON number, or null when it is not finite (peak rows have no tok/s). */
static void pp_num(double x) { if (isfinite(x)) printf("%.10g", x); else printf("null"); }

static void pp_write(const bench_pp_row *r, int n, int json, int csv)
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
    if (o->reps < 1 || o->reps > BENCH_PP_MAX_REPS || o->warmup < 0 || o->iters < 1 || (o->json && o->csv)) {
        fprintf(stderr, "error: -r must be in [1, 64], --warmup >= 0, --iters >= 1, one of --json/--csv\n");
        return 2;
    }
    return -1;
}

/* `sparq bench prefill`: the lists, the model, bench_prefill_run, the rows
 * (also those measured before an error). */
static int bench_prefill_main(int argc, char **argv)
{
    prefill_opts o;
    int st = pp_parse(argc, argv, &o, 0);
    if (st >= 0) return st;
    enum { M = BENCH_MAX_LIST };
    int64_t ps[M], ds[M], ts[M];
    char err[512] = "", def_t[16], path[4096];
    snprintf(def_t, sizeof def_t, "%d", omp_get_num_procs());
    int np = bench_int_list("-p", o.prompt, "512", 1, (int64_t)1 << 30, ps, M, err, sizeof err);
    int nd = np < 0 ? -1 : bench_int_list("-d", o.depth, "0", 0, (int64_t)1 << 30, ds, M, err, sizeof err);
    int nt = nd < 0 ? -1 : bench_int_list("-t", o.threads, def_t, 1, 1024, ts, M, err, sizeof err);
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
    const bench_prefill_cfg cfg = { .prompts = ps, .depths = ds, .threads = ts, .n_prompts = np, .n_depths = nd,
                                    .n_threads = nt, .kv_type = kv, .n_batch = o.n_batch, .reps = o.reps,
                                    .warmup = o.warmup, .log = stderr };
    bench_pp_row *rows = calloc((size_t)np * nd * nt, sizeof *rows);
    int n_rows = 0, rc = 1;
    if (!rows) fprintf(stderr, "error: bench prefill: out of memory\n");
    else if (bench_prefill_run(&cfg, m, base_name(path), rows, &n_rows, err, sizeof err))
        fprintf(stderr, "error: %s\n", err);
    else
        rc = 0;
    if (n_rows > 0) pp_write(rows, n_rows, o.json, o.csv);
    free(rows);
    sparq_model_free(m);
    return rc;
}

/* `sparq bench peak`: the thread counts (default 1 and all), bench_peak_run,
 * the rows. */
static int bench_peak_main(int argc, char **argv)
{
    prefill_opts o;
    int st = pp_parse(argc, argv, &o, 1);
    if (st >= 0) return st;
    int64_t ts[BENCH_MAX_LIST];
    char err[256] = "", def_t[32];
    snprintf(def_t, sizeof def_t, "1,%d", omp_get_num_procs());
    int nt = bench_int_list("-t", o.threads, def_t, 1, 1024, ts, BENCH_MAX_LIST, err, sizeof err);
    if (nt < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    nt = bench_sort_unique(ts, nt);
    fprintf(stderr, "bench peak: cpu %s\n", sparq_cpu_level());
    bench_pp_row rows[3 * BENCH_MAX_LIST];
    int n_rows = 0;
    if (bench_peak_run(ts, nt, o.reps, o.warmup, o.iters, stderr, rows, &n_rows, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    pp_write(rows, n_rows, o.json, o.csv);
    return 0;
}

/* ---- output ----------------------------------------------------------------------- */

static int write_plot(const bench_opts *o, const bench_rows *rl)
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

/* The option groups and usage line of an attn / membw / decode mode into
 * groups (room for 5); their count, or 0 for an unknown mode. */
static int mode_groups(const char *mode, bench_opts *o, cli_group *groups, const char **usage)
{
    int ng = 0;
    if (strcmp(mode, "attn") == 0) {
        groups[ng++] = (cli_group){ "shape", shape_table, o };
        groups[ng++] = (cli_group){ "attention policies (comma lists sweep)", policy_table, o };
        *usage = "usage: sparq bench attn [--S LIST] [--B LIST] [--attn LIST] [options]";
    } else if (strcmp(mode, "membw") == 0) {
        groups[ng++] = (cli_group){ "membw", membw_table, o };
        *usage = "usage: sparq bench membw [--size MIB] [-t LIST] [options]";
    } else if (strcmp(mode, "decode") == 0) {
        groups[ng++] = (cli_group){ "decode", decode_table, o };
        groups[ng++] = (cli_group){ "attention policies (comma lists sweep)", policy_table, o };
        *usage = "usage: sparq bench decode -m MODEL [--depth LIST] [--attn LIST] [--fill prefill|random] [options]";
    } else {
        return 0;
    }
    groups[ng++] = (cli_group){ "runs", common_table, o };
    groups[ng++] = (cli_group){ "output", out_table, o };
    return ng;
}

/* Parses and checks the options of an attn / membw / decode mode. Returns
 * -1 to go on, else the exit status. */
static int parse_mode(const char *mode, int argc, char **argv, bench_opts *o)
{
    bench_opts_init(o);
    cli_group groups[5];
    const char *usage = NULL;
    const int ng = mode_groups(mode, o, groups, &usage);
    if (ng == 0) {
        fprintf(stderr, "error: unknown bench mode '%s'\n", mode);
        usage_all(stderr);
        return 2;
    }
    const int parsed = cli_parse_command(groups, ng, argc, argv, usage, NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    if (o->reps < 1 || o->warmup < 0 || o->min_sample_us < 0 || o->size_mib < 1 || o->size_mib > (1 << 20)) {
        fprintf(stderr, "error: --reps must be >= 1, --warmup and --min-sample-us >= 0, --size in [1, 1048576]\n");
        return 2;
    }
    if (o->json && o->csv) {
        fprintf(stderr, "error: give only one of --json and --csv\n");
        return 2;
    }
    return -1;
}

/* bench decode: the options checked before the model is loaded, then the
 * run on it. */
static int run_decode(const bench_opts *o, bench_rows *rl, char *err, size_t err_size)
{
    bench_decode_plan *plan = NULL;
    if (bench_decode_prepare(o, &plan, err, err_size)) return -1;
    cli_model_opts mo = { 0 };
    mo.model = o->model;
    mo.use_mmap = o->use_mmap;
    mo.no_repack = o->no_repack;
    char path[4096];
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    int rc = -1;
    if (!m) err_set(err, err_size, "cannot load the model");
    else rc = bench_decode_run(plan, m, base_name(path), rl, err, err_size);
    sparq_model_free(m);
    bench_decode_plan_free(plan);
    return rc;
}

/* The rows: the table on stdout, or JSON / CSV there and the table on
 * stderr; then the plot. Returns -1 when the plot failed. */
static int report(const bench_opts *o, const bench_rows *rl)
{
    if (o->json) bench_write_json(stdout, rl->v, rl->n);
    else if (o->csv) bench_write_csv(stdout, rl->v, rl->n);
    bench_print_table(o->json || o->csv ? stderr : stdout, rl->v, rl->n);
    fflush(stdout);
    return o->plot ? write_plot(o, rl) : 0;
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
    const int st = parse_mode(mode, argc - 1, argv + 1, &o);
    if (st >= 0) return st;
    bench_rows rl = { 0 };
    char err[512] = "";
    int rc = strcmp(mode, "attn") == 0    ? bench_attn_run(&o, &rl, err, sizeof err)
             : strcmp(mode, "membw") == 0 ? bench_membw_run(&o, &rl, err, sizeof err)
                                          : run_decode(&o, &rl, err, sizeof err);
    if (rc != 0) fprintf(stderr, "error: %s\n", err);
    /* what was measured is reported even after an error */
    if (rl.n > 0 && report(&o, &rl) != 0 && rc == 0) rc = -1;
    bench_rows_free(&rl);
    return rc == 0 ? 0 : 1;
}
