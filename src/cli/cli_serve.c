/* cli_serve.c - `sparq serve`: options, signals, and the server's life
 * cycle (src/server/ does the work). */
#include "cli/cli.h"
#include "server/server.h"
#include "util/err.h"
#include "util/paths.h"

#include <errno.h>
#include <fcntl.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(SPARQ_NO_SERVER)
/* A build without libmicrohttpd (a cross build whose sysroot lacks it,
 * Makefile): the command works, only the server is missing. */
int cli_serve(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "sparq serve: this sparq was built without the server (no libmicrohttpd)\n");
    return 2;
}
#else

#define OFF(field) offsetof(serve_opts, field)

typedef struct serve_opts {
    const char *host;
    int         port, parallel, queue, max_prompt, prefix_mb;
    int64_t     max_body;
    float       timeout;
    const char *api_key, *api_key_file, *chat_template, *alias, *port_file;
    const char *kv_dir;
    int         kv_dir_mb;
    int         max_conns, max_conns_per_ip;
    float       read_timeout;
    cli_strs    docs;
    int         embedding, embd_normalize;
    const char *pooling;
    const char *slot_save_path;
    int         no_slots;
    int         kv_preload;
} serve_opts;

static const cli_opt serve_table[] = {
    { "--host", NULL, OPT_STR, OFF(host), "ADDR", "IPv4 address to listen on (default 127.0.0.1)" },
    { "--port", NULL, OPT_INT, OFF(port), "N", "port (default 8080; 0 = any free port, printed)" },
    { "-np", "--parallel", OPT_INT, OFF(parallel), "N", "sequences decoded together (default 4)" },
    { "--queue", NULL, OPT_INT, OFF(queue), "N", "requests waiting beyond them before 503 (default 64)" },
    { "--max-body", NULL, OPT_I64, OFF(max_body), "BYTES", "largest request body (default 4194304)" },
    { "--max-prompt", NULL, OPT_INT, OFF(max_prompt), "N", "longest prompt in tokens (default: context - 1)" },
    { "--timeout", NULL, OPT_FLOAT, OFF(timeout), "SEC", "per-request time limit (default 600)" },
    { "--api-key", NULL, OPT_STR, OFF(api_key), "KEY", "require Authorization: Bearer KEY" },
    { "--api-key-file", NULL, OPT_STR, OFF(api_key_file), "FILE", "the same, the key read from FILE" },
    { "--chat-template", NULL, OPT_STR, OFF(chat_template), "NAME",
      "chat template when the GGUF has none: llama3, chatml, phi3, mistral, gemma" },
    { "--alias", NULL, OPT_STR, OFF(alias), "NAME", "model id reported (default: the file name)" },
    { "--prefix-cache", NULL, OPT_INT, OFF(prefix_mb), "MIB",
      "memory for cached prompt prefixes (one shared copy each), reused by later and concurrent requests; "
      "a request may name its document: \"sparq\": {\"prefix_id\": ID} (default 256; 0 = off)" },
    { "--kv-dir", NULL, OPT_STR, OFF(kv_dir), "DIR",
      "also save cached prefixes as KV files in DIR and load other replicas' from it (a shared directory)" },
    { "--kv-dir-max", NULL, OPT_INT, OFF(kv_dir_mb), "MIB", "size budget of --kv-dir, least recently used files deleted (default 4096; 0 = none)" },
    { "--max-conns", NULL, OPT_INT, OFF(max_conns), "N",
      "open connections before a new request gets 503 (default: parallel + queue + 64)" },
    { "--max-conns-per-ip", NULL, OPT_INT, OFF(max_conns_per_ip), "N",
      "the same from one client address (default 0 = no limit; behind a proxy every client has its address)" },
    { "--read-timeout", NULL, OPT_FLOAT, OFF(read_timeout), "SEC",
      "a request's head and body must arrive within SEC of the connection opening, or of its previous "
      "answer (default 30)" },
    { "--load-kv", NULL, OPT_STRS, OFF(docs), "ID=PATH",
      "serve the document prefilled into the KV file PATH (sparq prefill --save-kv, sparq import) under the name ID: "
      "a request with \"sparq\": {\"prefix_id\": ID} continues it (its prompt is what follows the document); "
      "the file is mapped, not copied, however large (repeatable)" },
    { "--kv-preload", NULL, OPT_FLAG, OFF(kv_preload), NULL,
      "read each --load-kv file into memory at start, in one pass, when it fits (with progress): requests then "
      "read memory, not the disk at random" },
    { "--slot-save-path", NULL, OPT_STR, OFF(slot_save_path), "DIR",
      "POST /slots/ID?action=save|restore {\"filename\": NAME}: a slot's cache to and from the KV file DIR/NAME "
      "(as llama-server's; default: those answer 501)" },
    { "--no-slots", NULL, OPT_FLAG, OFF(no_slots), NULL, "GET /slots answers 501 (default: it lists the slots)" },
    { "--port-file", NULL, OPT_STR, OFF(port_file), "FILE", "write the bound port to FILE once listening" },
    { "--embedding", "--embeddings", OPT_FLAG, OFF(embedding), NULL,
      "answer /v1/embeddings (pooled final hidden states, as llama-server --embedding; without it a 501)" },
    { "--pooling", NULL, OPT_STR, OFF(pooling), "P", "embeddings: mean, cls or last (default mean)" },
    { "--embd-normalize", NULL, OPT_INT, OFF(embd_normalize), "N",
      "embeddings: -1 none, 0 max-abs int16, 1 taxicab, 2 euclidean (default), >2 p-norm; a request's "
      "\"embd_normalize\" overrides it" },
    { 0 },
};

/* The first line of path; NULL with the reason in err. A FIFO or device
 * given as the key file is refused at once (the open cannot block). */
static char *read_key(const char *path, char *err, size_t err_size)
{
    const int fd = path_open_regular(path, O_RDONLY, err, err_size);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) {
            err_set(err, err_size, "'%s': %s", path, strerror(errno));
            close(fd);
        }
        return NULL;
    }
    char buf[512];
    char *line = fgets(buf, sizeof buf, f);
    fclose(f);
    buf[line ? strcspn(buf, "\r\n") : 0] = 0;
    if (!buf[0]) err_set(err, err_size, "'%s': no key on its first line", path);
    return buf[0] ? strdup(buf) : NULL;
}

/* The model is loaded on a thread that ends afterwards. Loading runs
 * OpenMP regions, and libgomp keeps a thread's worker pool for as long as
 * that thread lives; the main thread's pool beside the scheduler's makes
 * it count more OpenMP threads than cores, and then it cuts every
 * worker's spin at a barrier to a few hundred iterations: the decode
 * step's workers slept and were woken at nearly every parallel region
 * (~500 context switches a step, 1.35 of 2 cores busy). */
typedef struct load_job {
    const cli_model_opts *mo;
    char *path;
    size_t path_size;
    sparq_model *m;
} load_job;

static void *load_main(void *arg)
{
    load_job *j = arg;
    j->m = cli_load_model(j->mo, j->path, j->path_size);
    return NULL;
}

static sparq_model *load_model_on_own_thread(const cli_model_opts *mo, char *path, size_t path_size)
{
    load_job j = { mo, path, path_size, NULL };
    pthread_t t;
    if (pthread_create(&t, NULL, load_main, &j) != 0) return cli_load_model(mo, path, path_size);
    pthread_join(t, NULL);
    return j.m;
}

/* Everything the options say, parsed and checked. */
typedef struct serve_args {
    cli_model_opts  mo;
    cli_compat_opts co;
    attn_opts       ao;
    serve_opts      so;
    int pooling, kv_type;
} serve_args;

/* Parses and checks the options into *a. Returns -1 to go on, else the
 * exit status. */
static int serve_parse(int argc, char **argv, serve_args *a)
{
    memset(a, 0, sizeof *a);
    attn_opts_init(&a->ao);
    a->so = (serve_opts){ .host = "127.0.0.1", .port = 8080, .parallel = 4, .queue = 64, .prefix_mb = 256,
                          .max_body = 4 << 20, .timeout = 600, .kv_dir_mb = 4096, .read_timeout = 30,
                          .embd_normalize = 2 };
    cli_group groups[] = {
        { "model", cli_model_table, &a->mo },
        { "server", serve_table, &a->so },
        { "default attention (a request may choose its own: \"sparq\": {\"attn\": ..., \"ratio\": ...})",
          cli_attn_table, &a->ao },
        { "llama-server options accepted (docs/CLI.md)", cli_compat_table, &a->co },
    };
    int rc = cli_parse_command(groups, 4, argc, argv, "usage: sparq serve [-m MODEL] [--port N] [options]", NULL, 0, NULL);
    if (rc >= 0) return rc;
    const serve_opts *so = &a->so;
    if (so->port < 0 || so->port > 65535 || so->parallel < 1 || so->parallel > 256 || so->queue < 0 ||
        so->queue > 100000 || so->max_body < 1024 || !(so->timeout > 0) || so->prefix_mb < 0) {
        fprintf(stderr, "error: serve: --port 0..65535, --parallel 1..256, --queue 0..100000, --max-body >= 1024 "
                        "and --timeout > 0\n");
        return 2;
    }
    if (so->max_conns < 0 || so->max_conns > 100000 || so->max_conns_per_ip < 0 || so->max_conns_per_ip > 100000 ||
        !(so->read_timeout > 0)) {
        fprintf(stderr, "error: serve: --max-conns and --max-conns-per-ip 0..100000, --read-timeout > 0\n");
        return 2;
    }
    if (so->kv_dir_mb < 0 || (so->kv_dir && access(so->kv_dir, W_OK | X_OK) != 0)) {
        fprintf(stderr, "error: serve: --kv-dir must be a writable directory and --kv-dir-max >= 0\n");
        return 2;
    }
    if (so->slot_save_path && access(so->slot_save_path, W_OK | X_OK) != 0) {
        fprintf(stderr, "error: serve: --slot-save-path must be a writable directory\n");
        return 2;
    }
    a->pooling = so->pooling ? sparq_pooling_find(so->pooling) : SPARQ_POOLING_MEAN;
    if (a->pooling <= 0 || so->embd_normalize < -1 || so->embd_normalize > 64) {
        fprintf(stderr, "error: serve: --pooling mean|cls|last (OpenAI's shape has one vector an input) and "
                        "--embd-normalize -1..64\n");
        return 2;
    }
    char err[512];
    if ((a->kv_type = cli_model_kv_type(&a->mo, err, sizeof err)) < 0) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    cli_compat_apply(&a->co, &a->mo);
    return -1;
}

/* The server's configuration from the options and the loaded model (the
 * default attention sized for its context). 0, or -1 with a message. */
static int serve_config(const serve_args *a, const sparq_model *m, const char *path, const char *key,
                        srv_config *cfg, char *err, size_t err_size)
{
    const serve_opts *so = &a->so;
    memset(cfg, 0, sizeof *cfg);
    cfg->host = so->host;
    cfg->port = so->port;
    cfg->parallel = so->parallel;
    cfg->queue = so->queue;
    /* per-sequence context: -c, else the model's, at most 4096 by default
     * (each running request holds one) */
    cfg->n_ctx = a->mo.n_ctx > 0 ? a->mo.n_ctx
                 : sparq_model_n_ctx_train(m) < 4096 ? sparq_model_n_ctx_train(m) : 4096;
    cfg->n_threads = a->mo.n_threads;
    cfg->n_batch = a->mo.n_batch;
    cfg->kv_type = a->kv_type;
    cfg->api_key = key;
    const char *base = strrchr(path, '/');
    cfg->model_id = so->alias ? so->alias : base ? base + 1 : path;
    cfg->chat_template = cli_chat_template(m, so->chat_template);
    cfg->chat_template_fallback = !so->chat_template && !sparq_model_chat_template(m);
    cfg->model_path = path;
    cfg->build_info = cli_build_info();
    cfg->max_body = (size_t)so->max_body;
    cfg->max_prompt = so->max_prompt;
    cfg->timeout = so->timeout;
    cfg->prefix_cache_bytes = (size_t)so->prefix_mb << 20;
    cfg->kv_dir = so->kv_dir;
    cfg->kv_dir_bytes = (size_t)so->kv_dir_mb << 20;
    cfg->slot_save_path = so->slot_save_path;
    cfg->no_slots = so->no_slots;
    cfg->max_conns = so->max_conns;
    cfg->max_conns_per_ip = so->max_conns_per_ip;
    cfg->read_timeout = so->read_timeout;
    cfg->embedding = so->embedding;
    cfg->pooling = a->pooling;
    cfg->embd_normalize = so->embd_normalize;
    cfg->prefill_gate = getenv("SPARQ_TEST_PREFILL_GATE"); /* tests only (server.h) */
    return attn_opts_params(&a->ao, cfg->n_ctx, sparq_model_head_dim(m), &cfg->attn, err, err_size) ? -1 : 0;
}

/* The --load-kv documents: opened, each with the default policy sized for
 * its context (a ratio is a fraction of it), read in with --kv-preload.
 * 0, or the exit status with the error printed (*docs then freed). */
static int serve_docs(const serve_args *a, const sparq_model *m, srv_doc **docs)
{
    const serve_opts *so = &a->so;
    char err[512];
    *docs = NULL;
    if (srv_docs_open(m, so->docs.v, so->docs.n, docs, err, sizeof err)) {
        fprintf(stderr, "error: serve: %s\n", err);
        return 1;
    }
    srv_doc *d = *docs;
    for (int i = 0; i < so->docs.n; i++) {
        if (attn_opts_params(&a->ao, d[i].n_ctx, sparq_model_head_dim(m), &d[i].attn, err, sizeof err)) {
            fprintf(stderr, "error: serve: --load-kv %s: %s\n", d[i].id, err);
            srv_docs_free(d, so->docs.n);
            return 2;
        }
        fprintf(stderr, "serve: document '%s': %lld positions, capacity %lld (%s)\n", d[i].id,
                (long long)d[i].n_pos, (long long)d[i].n_ctx, d[i].path);
        if (!so->kv_preload) continue;
        cli_progress rp;
        cli_progress_start(&rp);
        const double t0 = cli_now();
        const int pr = sparq_kv_preload(d[i].path, cli_read_progress, &rp, err, sizeof err);
        if (pr < 0) {
            fprintf(stderr, "error: serve: --kv-preload %s: %s\n", d[i].id, err);
            srv_docs_free(d, so->docs.n);
            return 1;
        }
        if (pr > 0) fprintf(stderr, "warning: serve: --kv-preload %s: %s\n", d[i].id, err);
        else fprintf(stderr, "serve: document '%s' read into memory (%.2f s)\n", d[i].id, cli_now() - t0);
    }
    return 0;
}

/* Starts the server, says where, writes --port-file, and serves until
 * SIGTERM or SIGINT. Returns the exit status. */
static int serve_run(const serve_args *a, sparq_model *m, const srv_config *cfg, const char *path)
{
    char err[512];
    /* SIGTERM/SIGINT are taken by this thread only: the others never see them */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    srv_server *s = srv_start(m, cfg, err, sizeof err);
    if (!s) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    fprintf(stderr, "serve: %s on http://%s:%d (%d parallel, context %lld, attention %s)\n", cfg->model_id, cfg->host,
            srv_port(s), cfg->parallel, (long long)cfg->n_ctx, cfg->attn.policy ? cfg->attn.policy : "dense");
    if (a->co.verbose)
        fprintf(stderr, "verbose: model %s | context %lld a sequence | threads %d (0 = physical cores) | batch %d | "
                "KV %s | chat template %s\n", path, (long long)cfg->n_ctx, cfg->n_threads, cfg->n_batch,
                a->kv_type == SPARQ_KV_F32 ? "f32" : a->kv_type == SPARQ_KV_Q8_0 ? "q8_0" : "f16",
                cfg->chat_template ? cfg->chat_template : "the model's");
    const char *port_file = a->so.port_file;
    if (port_file) {
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", srv_port(s)) < 0 || fclose(f) != 0 || rename(tmp, port_file) != 0)
            fprintf(stderr, "warning: cannot write the port to '%s'\n", port_file);
    }
    sigset_t wait_set;
    sigemptyset(&wait_set);
    sigaddset(&wait_set, SIGTERM);
    sigaddset(&wait_set, SIGINT);
    int sig = 0;
    sigwait(&wait_set, &sig);
    fprintf(stderr, "serve: signal %d: finishing the running requests (up to 5 s), then exiting\n", sig);
    srv_stop(s, 5.0);
    return 0;
}

int cli_serve(int argc, char **argv)
{
    serve_args a;
    int rc = serve_parse(argc, argv, &a);
    if (rc >= 0) return rc;
    const serve_opts *so = &a.so;
    char kerr[512] = "out of memory";
    char *key = so->api_key ? strdup(so->api_key) : so->api_key_file ? read_key(so->api_key_file, kerr, sizeof kerr)
                                                                     : NULL;
    if ((so->api_key || so->api_key_file) && !key) {
        fprintf(stderr, "error: serve: cannot read an API key: %s\n", so->api_key_file ? kerr : "--api-key: out of memory");
        return 2;
    }
    char path[1024], err[512];
    sparq_model *m = load_model_on_own_thread(&a.mo, path, sizeof path);
    srv_config cfg;
    srv_doc *docs = NULL;
    if (!m) {
        rc = 1;
    } else if (serve_config(&a, m, path, key, &cfg, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        rc = 2;
    } else if ((rc = serve_docs(&a, m, &docs)) == 0) {
        cfg.docs = docs;
        cfg.n_docs = so->docs.n;
        rc = serve_run(&a, m, &cfg, path);
        srv_docs_free(docs, so->docs.n);
    }
    sparq_model_free(m);
    free(key);
    if (rc == 0) fprintf(stderr, "serve: stopped\n");
    return rc;
}
#endif /* SPARQ_NO_SERVER */
