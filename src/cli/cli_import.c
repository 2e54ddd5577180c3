/* cli_import.c - `sparq import`: a llama.cpp sequence state (a cache
 * prefilled by llama.cpp, on any backend) becomes a sparq KV file that
 * `sparq run --load-kv` and `sparq serve` read (docs/KVFILE.md). The
 * conversion is the library's (sparq_import_llama_state).
 *
 * stdout: nothing, or one JSON object with --json.
 */
#include "cli/cli.h"

#include <string.h>
#include <sys/stat.h>

typedef struct import_opts {
    const char *state, *save, *index;
} import_opts;

#define OFF(f) offsetof(import_opts, f)
static const cli_opt import_table[] = {
    { "--llama-state", NULL, OPT_STR, OFF(state), "FILE",
      "llama.cpp sequence state to read (llama-server /slots/ID?action=save; llama.cpp b5913 or later)" },
    { "--save-kv", NULL, OPT_STR, OFF(save), "FILE", "KV cache file to write (required)" },
    { "--index", NULL, OPT_STR, OFF(index), "LIST",
      "top-k indexes to build and store: comma list of exact|ivf|hnsw|sparq, or none (default ivf)" },
    { 0 },
};
#undef OFF

int cli_import(int argc, char **argv)
{
    cli_model_opts mo = { 0 };
    import_opts io = { 0 };
    cli_group groups[] = {
        { "import", import_table, &io },
        { "model", cli_model_table, &mo },
    };
    char err[512], path[4096];
    const int parsed = cli_parse_command(groups, 2, argc, argv,
                                         "usage: sparq import [-m MODEL] --llama-state FILE --save-kv OUT [--index LIST]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    if (!io.state || !io.save) {
        fprintf(stderr, "error: --llama-state FILE and --save-kv FILE are required\n");
        return 2;
    }
    /* the cache keeps the state's type unless one is asked for */
    int kv_type = -1;
    if (mo.kv_type || mo.cache_type_k || mo.cache_type_v) {
        kv_type = cli_model_kv_type(&mo, err, sizeof err);
        if (kv_type < 0) {
            fprintf(stderr, "error: %s\n", err);
            return 2;
        }
    }
    const char *indexes;
    if (cli_kv_output(io.index, io.save, &indexes)) return 2;
    sparq_model *m = cli_load_model(&mo, path, sizeof path);
    if (!m) return 1;
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = mo.n_ctx;
    cp.n_threads = mo.n_threads;
    const double t0 = cli_now();
    int64_t n = 0;
    const int rc = sparq_import_llama_state(m, &cp, io.state, io.save, indexes, kv_type, &n, err, sizeof err);
    const double t = cli_now() - t0;
    sparq_model_free(m);
    if (rc) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    struct stat st;
    const long long bytes = stat(io.save, &st) == 0 ? (long long)st.st_size : -1;
    fprintf(stderr, "imported %s: %lld positions into %s (%.1f MiB, indexes [%s]) in %.2f s\n", io.state,
            (long long)n, io.save, bytes / 1048576.0, indexes, t);
    if (mo.json) {
        printf("{\"model\":");
        cli_json_str(stdout, path, strlen(path));
        printf(",\"state\":");
        cli_json_str(stdout, io.state, strlen(io.state));
        printf(",\"file\":");
        cli_json_str(stdout, io.save, strlen(io.save));
        printf(",\"tokens\":%lld,\"indexes\":", (long long)n);
        cli_json_str(stdout, indexes, strlen(indexes));
        printf(",\"import_s\":%.4f,\"file_bytes\":%lld}\n", t, bytes);
    }
    return 0;
}
