/* cli_embed.c - `sparq embed`: text embeddings as llama.cpp's llama-embedding
 * computes them (the library's sparq_embed: final hidden states pooled
 * mean|cls|last|none, normalised by --embd-normalize). The prompt (-p, or
 * the file -f) is split at --embd-separator (a newline by default, as
 * llama-embedding's) into the texts embedded, one at a time.
 *
 * stdout: one line per embedding (pooling none: one per token), its
 * components separated by spaces; with --json OpenAI's embeddings response
 * ({"object":"list","data":[{"object":"embedding","index":i,"embedding":
 * [...]}],"model":...,"usage":{...}}), which `sparq serve`'s
 * /v1/embeddings returns for the same texts.
 */
#include "cli/cli.h"
#include "util/textbuf.h"

#include <stdlib.h>
#include <string.h>

typedef struct embed_opts {
    const char *prompt, *file, *pooling, *separator;
    int normalize;
} embed_opts;

#define OFF(f) offsetof(embed_opts, f)
static const cli_opt embed_table[] = {
    { "-p", "--prompt", OPT_STR, OFF(prompt), "TEXT", "the texts to embed, split at --embd-separator" },
    { "-f", "--file", OPT_STR, OFF(file), "FILE", "read the texts from FILE (instead of -p)" },
    { "--pooling", NULL, OPT_STR, OFF(pooling), "mean|cls|last|none",
      "how token states become one vector (default mean; none: one vector per token)" },
    { "--embd-normalize", NULL, OPT_INT, OFF(normalize), "N",
      "divide by a norm: -1 none, 0 max |x| to 32760 (int16), 1 taxicab, 2 euclidean (default), p > 2 p-norm" },
    { "--embd-separator", NULL, OPT_STR, OFF(separator), "STR", "what separates the texts (default a newline)" },
    { 0 },
};
#undef OFF

/* The texts of buf (NUL-terminated), split in place at sep; a separator
 * at the very end ends the last text (a file's last newline). Returns the
 * count (the pointers go to *out, malloc'ed), or -1 with a message. */
static int split_texts(char *buf, const char *sep, char ***out)
{
    const size_t sl = strlen(sep);
    int n = 0, cap = 8;
    char **v = malloc((size_t)cap * sizeof *v);
    if (!v) return -1;
    for (char *p = buf; *p;) {
        char *e = sl ? strstr(p, sep) : NULL;
        if (e) *e = 0;
        if (n == cap) {
            char **w = realloc(v, (size_t)(cap *= 2) * sizeof *w);
            if (!w) { free(v); return -1; }
            v = w;
        }
        v[n++] = p;
        if (!e) break;
        p = e + sl;
    }
    *out = v;
    return n;
}

static void print_vec(const float *v, int n, int json)
{
    for (int i = 0; i < n; i++) printf(json ? (i ? ",%.9g" : "%.9g") : (i ? " %.9g" : "%.9g"), (double)v[i]);
}

/* Everything the options say, parsed and checked. */
typedef struct embed_args {
    cli_model_opts mo;
    embed_opts     eo;
    int            pooling;   /* SPARQ_POOLING_*                          */
} embed_args;

/* Parses and checks the options. Returns -1 to go on, else the exit status. */
static int embed_parse(int argc, char **argv, embed_args *a)
{
    memset(a, 0, sizeof *a);
    a->eo.normalize = 2;
    cli_group groups[] = {
        { "embed", embed_table, &a->eo },
        { "model", cli_model_table, &a->mo },
    };
    const int parsed = cli_parse_command(groups, 2, argc, argv,
                                         "usage: sparq embed [-m MODEL] (-p TEXT | -f FILE) [--pooling mean|cls|last|none] "
                                         "[--embd-normalize N] [--json]",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    const embed_opts *eo = &a->eo;
    if (!eo->prompt == !eo->file) {
        fprintf(stderr, "error: give the texts with -p TEXT or -f FILE (one of them)\n");
        return 2;
    }
    a->pooling = sparq_pooling_find(eo->pooling ? eo->pooling : "mean");
    if (a->pooling < 0) {
        fprintf(stderr, "error: --pooling must be mean, cls, last or none, not '%s'\n", eo->pooling);
        return 2;
    }
    if (eo->file && cli_check_regular(eo->file)) return 2;
    return -1;
}

/* The texts to embed, split out of *text (-p, or -f's contents) into
 * *texts[*n]. Returns -1 to go on, else the exit status (the error
 * printed; what was allocated stays in *text / *texts for the caller). */
static int embed_texts(const embed_opts *eo, char **text, char ***texts, int *n)
{
    size_t len = 0;
    *text = eo->file ? text_read_file(eo->file, &len) : strdup(eo->prompt);
    if (!*text) {
        fprintf(stderr, eo->file ? "error: cannot read '%s'\n" : "error: out of memory%.0s\n", eo->file);
        return 1;
    }
    *n = split_texts(*text, eo->separator ? eo->separator : "\n", texts);
    if (*n < 0) {
        fprintf(stderr, "error: out of memory\n");
        return 1;
    }
    for (int i = 0; i < *n; i++)
        if (!(*texts)[i][0]) {
            fprintf(stderr, "error: text %d is empty (nothing to embed)\n", i);
            return 2;
        }
    if (*n == 0) {
        fprintf(stderr, "error: no text to embed\n");
        return 2;
    }
    return -1;
}

/* One embedding: rows vectors of E components (pooling none: one a
 * token), a line each, or one element of --json's "data". */
static void print_embedding(const float *vec, int rows, int E, int pooling, int json, int i)
{
    if (!json) {
        for (int r = 0; r < rows; r++) {
            print_vec(vec + (size_t)r * E, E, 0);
            printf("\n");
        }
        return;
    }
    printf("%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
    for (int r = 0; r < rows; r++) {
        printf(rows > 1 || pooling == SPARQ_POOLING_NONE ? (r ? ",[" : "[[") : "[");
        print_vec(vec + (size_t)r * E, E, 1);
        printf("]");
    }
    printf("%s}", pooling == SPARQ_POOLING_NONE ? "]" : "");
}

/* Embeds texts[n] one at a time in a context that holds the longest (no
 * more memory than it needs) and prints them. Returns the exit status. */
static int embed_all(const embed_args *a, sparq_model *m, const char *path, char **texts, int n_texts)
{
    const cli_model_opts *mo = &a->mo;
    int max_n = 0, total = 0;
    for (int i = 0; i < n_texts; i++) {
        const int n = sparq_tokenize(m, texts[i], -1, 1, NULL, 0);
        if (n < 0) {
            fprintf(stderr, "error: cannot tokenize text %d\n", i);
            return 1;
        }
        max_n = n > max_n ? n : max_n;
        total += n;
    }
    if (mo->n_ctx > 0 && max_n > mo->n_ctx) {
        fprintf(stderr, "error: a text has %d tokens, more than the context size %lld (-c)\n", max_n,
                (long long)mo->n_ctx);
        return 1;
    }
    const int E = sparq_model_n_embd(m), pooling = a->pooling;
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = mo->n_ctx > 0 ? mo->n_ctx : max_n;
    cp.n_threads = mo->n_threads;
    cp.n_batch = mo->n_batch;
    int32_t *ids = malloc((size_t)max_n * sizeof *ids);
    float *vec = malloc((size_t)(pooling == SPARQ_POOLING_NONE ? max_n : 1) * E * sizeof *vec);
    sparq_context *c = NULL;
    char err[512];
    int rc = 1;
    if (!ids || !vec) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (mo->json) printf("{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < n_texts; i++) {
        const int n = sparq_tokenize(m, texts[i], -1, 1, ids, max_n);
        if (sparq_embed(c, ids, n, pooling, a->eo.normalize, vec)) {
            fprintf(stderr, "error: text %d: %s\n", i, sparq_context_error(c));
            if (mo->json) printf("]}\n");
            goto done;
        }
        print_embedding(vec, pooling == SPARQ_POOLING_NONE ? n : 1, E, pooling, mo->json, i);
    }
    if (mo->json) {
        printf("],\"model\":");
        cli_json_str(stdout, path, strlen(path));
        printf(",\"pooling\":\"%s\",\"normalize\":%d,\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}\n",
               sparq_pooling_name(pooling), a->eo.normalize, total, total);
    }
    rc = 0;
done:
    sparq_context_free(c);
    free(vec);
    free(ids);
    return rc;
}

int cli_embed(int argc, char **argv)
{
    embed_args a;
    int rc = embed_parse(argc, argv, &a);
    if (rc >= 0) return rc;
    char *text = NULL, **texts = NULL, path[4096];
    int n_texts = 0;
    rc = embed_texts(&a.eo, &text, &texts, &n_texts);
    if (rc < 0) {
        sparq_model *m = cli_load_model(&a.mo, path, sizeof path);
        rc = m ? embed_all(&a, m, path, texts, n_texts) : 1;
        sparq_model_free(m);
    }
    free(texts);
    free(text);
    return rc;
}
