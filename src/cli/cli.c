/* cli.c - option parsing and helpers shared by the subcommands (main.c: the entry point). */
#include "cli/cli.h"
#include "core/chat.h"
#include "io/kvfile.h"
#include "util/err.h"
#include "util/json.h"
#include "util/paths.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define OFF(type, field) offsetof(type, field)

const cli_opt cli_model_table[] = {
    { "-m", "--model", OPT_STR, OFF(cli_model_opts, model), "FILE",
      "GGUF model (searched as given, in $SPARQ_MODEL_PATH, then models/ beside the binary; default stories260K.gguf)" },
    { "-c", "--ctx-size", OPT_I64_0, OFF(cli_model_opts, n_ctx), "N", "context size in tokens (0 = the model's, the default; the KV cache is reserved lazily, "
      "a context whose attention scratch exceeds the RAM is refused at once)" },
    { "-t", "--threads", OPT_INT0, OFF(cli_model_opts, n_threads), "N",
      "threads (0 = the physical cores, the default, as llama.cpp counts them: SMT siblings once)" },
    { "-b", "--batch-size", OPT_INT0, OFF(cli_model_opts, n_batch), "N", "prefill batch size (0 = 512, the default)" },
    { "--kv-type", NULL, OPT_STR, OFF(cli_model_opts, kv_type), "f16|f32|q8_0",
      "KV cache element type (default f16; q8_0: blocks of 32 with a scale, about half of f16's bytes)" },
    { "-ctk", "--cache-type-k", OPT_STR, OFF(cli_model_opts, cache_type_k), "TYPE",
      "llama.cpp's K cache type: the same as --kv-type (K and V share one type here)" },
    { "-ctv", "--cache-type-v", OPT_STR, OFF(cli_model_opts, cache_type_v), "TYPE",
      "llama.cpp's V cache type: the same as --kv-type (K and V share one type here)" },
    { "--json", NULL, OPT_FLAG, OFF(cli_model_opts, json), NULL, "print one JSON object on stdout" },
    { "--mmap", NULL, OPT_FLAG, OFF(cli_model_opts, use_mmap), NULL,
      "map the model file instead of reading it into huge pages (less memory, slower decode)" },
    { "--no-mmap", NULL, OPT_FLAG, OFF(cli_model_opts, no_mmap), NULL,
      "read the model into memory (the default when it fits in half the RAM)" },
    { "-nr", "--no-repack", OPT_FLAG, OFF(cli_model_opts, no_repack), NULL,
      "keep Q8_0 weights as stored (default: repacked at load into the GEMM tiles' layout, same size, "
      "which decode, batched decode and prefill then read)" },
    { 0 },
};

const cli_opt cli_prefill_table[] = {
    { "--prefill-attn", NULL, OPT_STR, OFF(cli_prefill_opts, mode), "exact|window|topk|policy",
      "prefill attention (default exact): window = the sinks and a window before each query block; "
      "topk = also the top-k older positions through a key index grown during the prefill; policy = each "
      "prompt token one decode step through --attn (a question after --load-kv of a long cache)" },
    { "--prefill-window", NULL, OPT_INT1, OFF(cli_prefill_opts, window), "N",
      "window|topk: positions before each query block (default 1024)" },
    { "--prefill-sink", NULL, OPT_INT1, OFF(cli_prefill_opts, n_sink), "N",
      "window|topk: first positions every query sees (default 16)" },
    { "--prefill-k", NULL, OPT_INT1, OFF(cli_prefill_opts, k), "K",
      "topk: older positions per query head and block (default 256)" },
    { "--prefill-nlist", NULL, OPT_INT1, OFF(cli_prefill_opts, nlist), "N",
      "topk: inverted lists of the key index (default 2 sqrt(ctx), within [16, 4096])" },
    { "--prefill-nprobe", NULL, OPT_INT1, OFF(cli_prefill_opts, nprobe), "N",
      "topk: lists probed per query block (default 16)" },
    { 0 },
};

int cli_prefill_params(const cli_prefill_opts *o, sparq_prefill_params *out, char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const char *name = o->mode ? o->mode : "exact";
    out->mode = sparq_prefill_mode_find(name);
    if (out->mode < 0)
        return err_set(err, err_size, "--prefill-attn must be exact, window, topk or policy, not '%s'", name);
    const char *stray = (out->mode == SPARQ_PREFILL_EXACT || out->mode == SPARQ_PREFILL_POLICY) &&
                                (o->window || o->n_sink) ? "--prefill-window/-sink"
                        : out->mode != SPARQ_PREFILL_TOPK && (o->k || o->nlist || o->nprobe)
                            ? "--prefill-k/-nlist/-nprobe" : NULL;
    if (stray) return err_set(err, err_size, "%s does not apply to --prefill-attn %s", stray, name);
    out->window = o->window;
    out->n_sink = o->n_sink;
    out->k = o->k;
    out->nlist = o->nlist;
    out->nprobe = o->nprobe;
    return 0;
}

const cli_opt cli_compat_table[] = {
    { "-ngl", "--n-gpu-layers", OPT_STR, OFF(cli_compat_opts, ngl), "N", "accepted; nothing (CPU only)" },
    { "-fa", "--flash-attn", OPT_ONOFF, OFF(cli_compat_opts, flash_attn), "[on|off|auto]",
      "accepted; nothing (sparq's own CPU attention kernels always run)" },
    { "--mlock", NULL, OPT_FLAG, OFF(cli_compat_opts, mlock), NULL,
      "accepted; nothing (the model is read into memory, not mapped, unless --mmap)" },
    { "--no-warmup", NULL, OPT_FLAG, OFF(cli_compat_opts, no_warmup), NULL, "accepted; nothing (sparq runs no warm-up)" },
    { "--color", NULL, OPT_FLAG, OFF(cli_compat_opts, color), NULL, "accepted; nothing (output is never coloured)" },
    { "-ub", "--ubatch-size", OPT_INT1, OFF(cli_compat_opts, ubatch), "N",
      "sparq has one batch, the prefill's: -ub sets it as -b does (the smaller of the two when both are given)" },
    { "-v", "--verbose", OPT_FLAG, OFF(cli_compat_opts, verbose), NULL,
      "print the resolved settings (model file, context, threads, batch, KV type, template) on stderr" },
    { 0 },
};

void cli_compat_apply(const cli_compat_opts *c, cli_model_opts *mo)
{
    if (c->ngl) fprintf(stderr, "note: -ngl %s: ignored, sparq runs on the CPU only\n", c->ngl);
    if (c->flash_attn)
        fprintf(stderr, "note: --flash-attn %s: ignored, sparq's own CPU attention kernels always run\n", c->flash_attn);
    if (c->mlock) fprintf(stderr, "note: --mlock: ignored, the model is read into memory (not mapped) unless --mmap\n");
    if (c->no_warmup) fprintf(stderr, "note: --no-warmup: ignored, sparq runs no warm-up\n");
    if (c->color) fprintf(stderr, "note: --color: ignored, sparq's output is not coloured\n");
    if (c->ubatch > 0 && (mo->n_batch <= 0 || c->ubatch < mo->n_batch)) mo->n_batch = c->ubatch;
}

const cli_opt cli_attn_table[] = {
    { "--attn", NULL, OPT_STR, OFF(attn_opts, attn), "NAME",
      "decode attention: dense|sparq|oracle|flexgen|h2o|streaming|topk (default dense)" },
    { "--sparq-r", NULL, OPT_INT1, OFF(attn_opts, r), "R", "SparQ query components (default d/4)" },
    { "--sparq-k", NULL, OPT_INT1, OFF(attn_opts, k), "K", "SparQ positions kept (default 128)" },
    { "--sparq-l", NULL, OPT_INT, OFF(attn_opts, l), "L", "SparQ local window (default k/4)" },
    { "--sparq-select", NULL, OPT_STR, OFF(attn_opts, select), "probs|logits",
      "SparQ selection score (default probs)" },
    { "--sparq-no-realloc", NULL, OPT_FLAG, OFF(attn_opts, no_realloc), NULL,
      "SparQ without mean-value reallocation (alpha = 1)" },
    { "--sparq-adaptive-k", NULL, OPT_FLAG, OFF(attn_opts, adaptive_k), NULL,
      "SparQ: each query head its own k, by the entropy of its scores (the group's total g*k kept)" },
    { "--sparq-k-min", NULL, OPT_INT1, OFF(attn_opts, k_min), "K",
      "SparQ adaptive k: the smallest k of a head (default l + 1)" },
    { "--sparq-ratio", NULL, OPT_STR, OFF(attn_opts, ratio), "1/N",
      "pick SparQ r and k for this transfer ratio at the context length" },
    { "--attn-k", NULL, OPT_INT1, OFF(attn_opts, attn_k), "K", "positions kept by the baselines (default 128)" },
    { "--n-sink", NULL, OPT_INT0, OFF(attn_opts, n_sink), "N", "streaming: sink positions (0 = 16, the default)" },
    { "--index", NULL, OPT_STR, OFF(attn_opts, index), "KIND",
      "topk: prefix key index exact|ivf|hnsw|sparq (default exact)" },
    { "--topk-k", NULL, OPT_INT1, OFF(attn_opts, topk_k), "K", "topk: prefix positions per query head (default 128)" },
    { "--topk-schedule", NULL, OPT_STR, OFF(attn_opts, schedule), "uniform|linear",
      "topk: k in every layer, or ramped up from first to last layer, same total" },
    { "--ivf-nlist", NULL, OPT_INT0, OFF(attn_opts, ivf_nlist), "N", "topk ivf: lists (0 = sqrt(prefix), the default)" },
    { "--ivf-nprobe", NULL, OPT_INT0, OFF(attn_opts, ivf_nprobe), "N", "topk ivf: lists probed (0 = max(8, nlist/16), the default)" },
    { "--hnsw-ef", NULL, OPT_INT0, OFF(attn_opts, hnsw_ef), "N", "topk hnsw: efSearch (0 = 64, the default)" },
    { "--index-key-type", NULL, OPT_STR, OFF(attn_opts, key_type), "f16|bf16|i8",
      "topk exact/ivf: key storage (default f16)" },
    { "--topk-check", NULL, OPT_FLAG, OFF(attn_opts, topk_check), NULL,
      "topk: also compute exact top-k each step and report recall@k (slow)" },
    { 0 },
};

static int range_error(const cli_opt *o, long long v, const char *val, char *err, size_t err_size)
{
    if (o->kind == OPT_INT1 && v < 1)
        return err_set(err, err_size, "option %s: '%s' must be at least 1", o->name, val);
    if ((o->kind == OPT_INT0 || o->kind == OPT_I64_0) && v < 0)
        return err_set(err, err_size, "option %s: '%s' must be >= 0 (0 = the default)", o->name, val);
    return 0;
}

static int parse_number(const cli_opt *o, const char *val, void *dst, char *err, size_t err_size)
{
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case OPT_STR: *(const char **)dst = val; return 0;
    case OPT_FLOAT: {
        double v = strtod(val, &end);
        if (end == val || *end || errno || !isfinite(v) || !isfinite((float)v)) break;
        *(float *)dst = (float)v;
        return 0;
    }
    case OPT_STRS: {
        cli_strs *l = dst;
        if (l->n >= CLI_STRS_MAX) {
            return err_set(err, err_size, "option %s: at most %d given", o->name, CLI_STRS_MAX);
        }
        l->v[l->n++] = val;
        return 0;
    }
    case OPT_INT:
    case OPT_INT0:
    case OPT_INT1: {
        long long v = strtoll(val, &end, 10);
        if (end == val || *end || errno || v < -2147483647LL || v > 2147483647LL) break;
        if (range_error(o, v, val, err, err_size)) return -1;
        *(int *)dst = (int)v;
        return 0;
    }
    case OPT_I64:
    case OPT_I64_0: {
        long long v = strtoll(val, &end, 10);
        if (end == val || *end || errno) break;
        if (range_error(o, v, val, err, err_size)) return -1;
        *(int64_t *)dst = v;
        return 0;
    }
    case OPT_U64: {
        unsigned long long v = strtoull(val, &end, 10);
        if (end == val || *end || errno || val[0] == '-') break;
        *(uint64_t *)dst = v;
        return 0;
    }
    case OPT_FLAG: *(int *)dst = 1; return 0;
    case OPT_ONOFF: *(const char **)dst = val; return 0; /* checked by cli_parse */
    }
    return err_set(err, err_size, "option %s: '%s' is not a valid %s", o->name, val,
                   o->kind == OPT_FLOAT ? "finite number" : o->kind == OPT_U64 ? "non-negative integer" : "integer");
}

static int is_onoff(const char *v)
{
    return strcmp(v, "on") == 0 || strcmp(v, "off") == 0 || strcmp(v, "auto") == 0;
}

int cli_parse(const cli_group *groups, int n_groups, int argc, char **argv,
              char **pos, int max_pos, int *n_pos, int *help, char *err, size_t err_size)
{
    *n_pos = 0;
    *help = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            *help = 1;
            continue;
        }
        if (arg[0] != '-' || arg[1] == 0) {
            if (*n_pos >= max_pos) {
                return err_set(err, err_size, "unexpected argument '%s'", arg);
            }
            pos[(*n_pos)++] = argv[i];
            continue;
        }
        /* --name=value is accepted as well as --name value */
        const char *eq = strncmp(arg, "--", 2) == 0 ? strchr(arg, '=') : NULL;
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const cli_opt *found = NULL;
        void *base = NULL;
        for (int g = 0; g < n_groups && !found; g++)
            for (const cli_opt *o = groups[g].opts; o->name && !found; o++)
                if ((strlen(o->name) == name_len && strncmp(o->name, arg, name_len) == 0) ||
                    (o->alias && strlen(o->alias) == name_len && strncmp(o->alias, arg, name_len) == 0)) {
                    found = o;
                    base = groups[g].base;
                }
        if (!found) {
            return err_set(err, err_size, "unknown option '%.*s' (see --help)", (int)name_len, arg);
        }
        void *dst = (char *)base + found->offset;
        if (found->kind == OPT_FLAG) {
            if (eq) {
                return err_set(err, err_size, "option %s takes no value", found->name);
            }
            *(int *)dst = 1;
            continue;
        }
        if (found->kind == OPT_ONOFF) {
            const char *v = eq ? eq + 1 : i + 1 < argc && is_onoff(argv[i + 1]) ? argv[++i] : "on";
            if (!is_onoff(v)) {
                return err_set(err, err_size, "option %s: '%s' must be on, off or auto", found->name, v);
            }
            *(const char **)dst = v;
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            return err_set(err, err_size, "option %s needs a value (%s)", found->name, found->metavar);
        }
        if (parse_number(found, val, dst, err, err_size)) return -1;
    }
    return 0;
}

int cli_parse_command(const cli_group *groups, int n_groups, int argc, char **argv, const char *usage,
                      char **pos, int max_pos, int *n_pos)
{
    char err[512], *none[1];
    int n = 0, help = 0;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--version") == 0) {
            cli_print_version(stdout);
            return 0;
        }
    if (cli_parse(groups, n_groups, argc, argv, pos ? pos : none, max_pos, &n, &help, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (n_pos) *n_pos = n;
    if (help) {
        cli_print_help(stdout, usage, groups, n_groups);
        return 0;
    }
    return -1;
}

void cli_print_help(FILE *f, const char *usage, const cli_group *groups, int n_groups)
{
    fprintf(f, "%s\n", usage);
    for (int g = 0; g < n_groups; g++) {
        fprintf(f, "\n%s:\n", groups[g].title);
        for (const cli_opt *o = groups[g].opts; o->name; o++) {
            char left[64];
            snprintf(left, sizeof left, "%s%s%s %s", o->name, o->alias ? ", " : "",
                     o->alias ? o->alias : "", o->metavar ? o->metavar : "");
            fprintf(f, "  %-28s %s\n", left, o->help);
        }
    }
}

#ifndef SPARQ_GIT_COMMIT
#define SPARQ_GIT_COMMIT "unknown"
#endif
#ifndef SPARQ_VERSION
#define SPARQ_VERSION "unknown"
#endif

void cli_print_version(FILE *f)
{
    /* the kernels' level is chosen at run time (SPARQ_CPU may force one) */
    fprintf(f, "sparq %s (commit %s, cpu %s)\n", sparq_version(), SPARQ_GIT_COMMIT, sparq_cpu_level());
}

const char *cli_build_info(void) { return SPARQ_VERSION " (commit " SPARQ_GIT_COMMIT ")"; }

int cli_model_kv_type(const cli_model_opts *o, char *err, size_t err_size)
{
    const char *given[3] = { o->kv_type, o->cache_type_k, o->cache_type_v };
    static const char *const opt[3] = { "--kv-type", "-ctk", "-ctv" };
    const char *name = NULL;
    int first = -1;
    for (int i = 0; i < 3; i++) {
        if (!given[i]) continue;
        if (cli_kv_type(given[i]) < 0) {
            return err_set(err, err_size, "%s must be f16, f32 or q8_0, not '%s'", opt[i], given[i]);
        }
        if (name && strcmp(name, given[i]) != 0) {
            return err_set(err, err_size, "%s %s and %s %s differ: the K and V caches have one type here "
                           "(give both the same, or --kv-type)", opt[first], name, opt[i], given[i]);
        }
        if (!name) { name = given[i]; first = i; }
    }
    return cli_kv_type(name);
}

int cli_check_regular(const char *path)
{
    char err[512];
    if (path_check_regular(path, err, sizeof err) == 0) return 0;
    fprintf(stderr, "error: %s\n", err);
    return -1;
}

int cli_kv_type(const char *name)
{
    if (!name || strcmp(name, "f16") == 0) return SPARQ_KV_F16;
    if (strcmp(name, "f32") == 0) return SPARQ_KV_F32;
    if (strcmp(name, "q8_0") == 0) return SPARQ_KV_Q8_0;
    return -1;
}

int cli_attn_check_policy(const attn_opts *o, char *err, size_t err_size)
{
    const char *p = o->attn;
    struct { int given; const char *opt, *policies; } g[] = {
        { o->r != 0, "--sparq-r", "sparq,topk" },  /* topk: the sparq index's r */
        { o->k != 0, "--sparq-k", "sparq" },
        { o->l != -1, "--sparq-l", "sparq,h2o" },
        { o->select != NULL, "--sparq-select", "sparq" },
        { o->no_realloc != 0, "--sparq-no-realloc", "sparq" },
        { o->adaptive_k != 0, "--sparq-adaptive-k", "sparq" },
        { o->k_min != 0, "--sparq-k-min", "sparq" },
        { o->ratio != NULL, "--sparq-ratio", "sparq" },
        { o->attn_k != 0, "--attn-k", "oracle,flexgen,h2o,streaming" },
        { o->n_sink != 0, "--n-sink", "streaming" },
        { o->index != NULL, "--index", "topk" },
        { o->topk_k != 0, "--topk-k", "topk" },
        { o->schedule != NULL, "--topk-schedule", "topk" },
        { o->ivf_nlist != 0, "--ivf-nlist", "topk" },
        { o->ivf_nprobe != 0, "--ivf-nprobe", "topk" },
        { o->hnsw_ef != 0, "--hnsw-ef", "topk" },
        { o->key_type != NULL, "--index-key-type", "topk" },
        { o->topk_check != 0, "--topk-check", "topk" },
    };
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        if (!g[i].given) continue;
        const char *s = g[i].policies;
        size_t n = strlen(p);
        int ok = 0;
        for (const char *q = s; *q; q = strchr(q, ',') ? strchr(q, ',') + 1 : q + strlen(q))
            if (strncmp(q, p, n) == 0 && (q[n] == ',' || q[n] == 0)) ok = 1;
        if (!ok) {
            return err_set(err, err_size, "%s is an option of --attn %s, not of --attn %s", g[i].opt, s, p);
        }
    }
    return 0;
}

sparq_model *cli_load_model(const cli_model_opts *o, char *path, size_t path_size)
{
    const char *name = o->model ? o->model : "stories260K.gguf";
    char err[512];
    if (path_find(name, path, path_size) != 0) {
        fprintf(stderr,
                "error: model '%s' not found (searched %s)\n"
                "  download a GGUF model and pass it with -m FILE or put it on SPARQ_MODEL_PATH, e.g.\n"
                "  curl -LO https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf\n",
                name, path_search_description());
        return NULL;
    }
    if (cli_check_regular(path)) return NULL; /* a FIFO would block the loader */
    sparq_model *m = NULL;
    sparq_model_params mp = sparq_model_default_params();
    mp.use_mmap = o->use_mmap && !o->no_mmap;
    mp.no_repack = o->no_repack;
    if (sparq_model_load_params(path, &mp, &m, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s: %s\n", path, err);
        return NULL;
    }
    return m;
}

const char *cli_chat_template(const sparq_model *m, const char *given)
{
    if (given || sparq_model_chat_template(m)) return given;
    fprintf(stderr, "note: the model has no chat template; using chatml (--chat-template NAME to choose: %s)\n",
            chat_template_names());
    return "chatml";
}

void cli_progress_start(cli_progress *p)
{
    p->tty = isatty(2);
    p->interval = 5.0;
    const char *e = getenv("SPARQ_PROGRESS_SECONDS");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (*end == 0 && v >= 0 && v < 1e9) p->interval = v; /* anything else: the default */
    }
    p->t0 = p->t_last = cli_now();
    p->lines = 0;
}

void cli_prefill_progress(void *user, int64_t done, int64_t total)
{
    cli_progress *p = user;
    const double now = cli_now(), dt = now - p->t0;
    const int end = done >= total;
    /* the first line says at once that the prefill has started */
    if (!p->tty && !end && p->lines > 0 && now - p->t_last < p->interval) return;
    p->t_last = now;
    p->lines++;
    const double rate = dt > 0 ? (double)done / dt : 0.0;
    const double eta = rate > 0 ? (double)(total - done) / rate : 0.0;
    fprintf(stderr, "%sprefill: %lld / %lld tokens, %.1f tok/s, ETA %.0f s%s", p->tty ? "\r" : "",
            (long long)done, (long long)total, rate, eta, p->tty && !end ? "   " : "\n");
    fflush(stderr);
}

void cli_read_progress(void *user, int64_t done, int64_t total)
{
    cli_progress *p = user;
    const double now = cli_now(), dt = now - p->t0;
    const int end = done >= total;
    if (!p->tty && !end && p->lines > 0 && now - p->t_last < p->interval) return;
    p->t_last = now;
    p->lines++;
    const double rate = dt > 0 ? (double)done / dt : 0.0;
    const double eta = rate > 0 ? (double)(total - done) / rate : 0.0;
    fprintf(stderr, "%sreading: %.2f / %.2f GiB, %.0f MB/s, ETA %.0f s%s", p->tty ? "\r" : "",
            (double)done / 1073741824.0, (double)total / 1073741824.0, rate / 1e6, eta,
            p->tty && !end ? "   " : "\n");
    fflush(stderr);
}

int64_t cli_rss_anon(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "RssAnon: %lld kB", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

int64_t cli_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1;
    return (int64_t)ru.ru_maxrss * 1024; /* Linux reports KiB */
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_json_str(FILE *f, const char *s, size_t n)
{
    json_write_str(f, s, n);
}

int cli_kv_output(const char *index, const char *save, const char **indexes)
{
    char err[512];
    *indexes = index ? index : "ivf";
    if (strcmp(*indexes, "none") == 0) *indexes = "";
    const char *kinds[KVF_MAX_KINDS];
    if (kvf_parse_kinds(*indexes, kinds, err, sizeof err) < 0) {
        fprintf(stderr, "error: --index: %s\n", err);
        return 2;
    }
    if (kvf_check_writable(save, err, sizeof err)) {
        fprintf(stderr, "error: --save-kv: %s\n", err);
        return 2;
    }
    return 0;
}
