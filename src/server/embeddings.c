/* embeddings.c - POST /v1/embeddings (and /embeddings): OpenAI's request
 * and response shapes, computed by sparq_embed with the server's pooling
 * and normalisation (sparq serve --embedding --pooling P --embd-normalize
 * N), as llama-server answers it. Each request gets its own context, sized
 * to its longest input, on its connection's thread: the scheduler's
 * sequences are not touched. One thread per request: libgomp keeps an
 * OpenMP pool per thread that runs a wider parallel region, and pools on
 * the connection threads beside the scheduler's would make libgomp cut the
 * decode workers' spin at every barrier (cli_serve.c says more). */
#include "server/srv_internal.h"
#include "util/err.h"
#include "util/json.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* inputs a request may embed at once (each a context of its own, in turn) */
enum { SRV_MAX_EMBED_INPUTS = 256 };

static int bad(char *err, size_t n, const char *fmt, const char *what)
{
    err_set(err, n, fmt, what);
    return 400;
}

/* One input's tokens (BOS as the model asks, like llama-server); 0, or the
 * status with the message. */
static int tokenize_input(const srv_server *s, const json_value *v, size_t i, int32_t **ids, int *n, char *err,
                          size_t en)
{
    char what[48];
    snprintf(what, sizeof what, "input %zu", i);
    if (!v || v->type != JSON_STRING) return bad(err, en, "'input' must be a string or an array of strings (%s is not)", what);
    if (v->n == 0) return bad(err, en, "%s is an empty string", what);
    const int max = s->cfg.max_prompt;
    if (v->n > (size_t)max * 64) { /* no token is 64 bytes: over the limit for sure */
        err_set(err, en, "input %zu of %zu bytes exceeds the limit of %d tokens", i, v->n, max);
        return 400;
    }
    const int cnt = sparq_tokenize(s->model, v->u.str, (int)v->n, 1, NULL, 0);
    if (cnt > max) {
        err_set(err, en, "input %zu has %d tokens; the limit is %d", i, cnt, max);
        return 400;
    }
    *ids = cnt > 0 ? malloc((size_t)cnt * sizeof **ids) : NULL;
    if (!*ids || sparq_tokenize(s->model, v->u.str, (int)v->n, 1, *ids, cnt) != cnt) {
        free(*ids);
        *ids = NULL;
        err_set(err, en, "cannot tokenize input %zu", i);
        return 400;
    }
    *n = cnt;
    return 0;
}

/* x[0..n) as base64 of its little-endian float32 bytes, quoted: what
 * OpenAI's clients ask for by default ("encoding_format": "base64") and
 * decode themselves. */
static void write_base64(FILE *f, const float *x, int n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const size_t len = (size_t)n * 4;
    uint8_t b[3];
    size_t k = 0;
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        uint32_t u;
        memcpy(&u, &x[i / 4], 4);
        b[k++] = (uint8_t)(u >> (8 * (i % 4))); /* little-endian whatever the host */
        if (k == 3 || i + 1 == len) {
            const uint32_t v = (uint32_t)b[0] << 16 | (k > 1 ? (uint32_t)b[1] << 8 : 0) | (k > 2 ? b[2] : 0);
            fputc(tab[v >> 18 & 63], f);
            fputc(tab[v >> 12 & 63], f);
            fputc(k > 1 ? tab[v >> 6 & 63] : '=', f);
            fputc(k > 2 ? tab[v & 63] : '=', f);
            k = 0;
        }
    }
    fputc('"', f);
}

/* Top-level fields: what is acted on, and nothing else (as request.c). */
static int check_fields(const json_value *o, int *norm, int *b64, char *err, size_t en)
{
    static const char *const known[] = { "input", "model", "encoding_format", "embd_normalize", "user", NULL };
    for (size_t i = 0; i < o->n; i++) {
        const json_member *m = &o->u.members[i];
        int ok = 0;
        for (int k = 0; known[k] && !ok; k++) ok = strlen(known[k]) == m->key_len && !memcmp(known[k], m->key, m->key_len);
        if (!ok) {
            char q[80];
            snprintf(q, sizeof q, "%.*s", (int)(m->key_len < 60 ? m->key_len : 60), m->key);
            for (char *p = q; *p; p++)
                if ((unsigned char)*p < 0x20) *p = '?';
            err_set(err, en, "%s '%s' on /v1/embeddings",
                    !strcmp(q, "dimensions") ? "unsupported field" : "unknown field", q);
            return 400;
        }
    }
    const json_value *ef = json_get(o, "encoding_format");
    if (ef && ef->type != JSON_NULL) {
        *b64 = ef->type == JSON_STRING && ef->n == 6 && !memcmp(ef->u.str, "base64", 6);
        if (!*b64 && !(ef->type == JSON_STRING && ef->n == 5 && !memcmp(ef->u.str, "float", 5)))
            return bad(err, en, "%s", "'encoding_format' must be \"float\" or \"base64\"");
    }
    const json_value *u = json_get(o, "user");
    if (u && u->type != JSON_NULL && u->type != JSON_STRING) return bad(err, en, "%s", "'user' must be a string");
    const json_value *nv = json_get(o, "embd_normalize");
    if (nv && nv->type != JSON_NULL) {
        if (nv->type != JSON_NUMBER || nv->u.number != (double)(int)nv->u.number || nv->u.number < -1 ||
            nv->u.number > 64)
            return bad(err, en, "%s", "'embd_normalize' must be an integer in [-1, 64]");
        *norm = (int)nv->u.number;
    }
    return 0;
}

int srv_embeddings(srv_server *s, const char *body, size_t len, char **out, size_t *out_len, char *err,
                   size_t en)
{
    *out = NULL;
    *out_len = 0;
    if (!s->cfg.embedding) {
        err_set(err, en, "This server does not support embeddings. Start it with `--embeddings`");
        return 501;
    }
    json_doc *d = json_parse(body ? body : "", body ? len : 0, 16, err, en);
    if (!d) return 400;
    int status = 0, norm = s->cfg.embd_normalize, b64 = 0, n_in = 0, max_n = 0, total = 0;
    int32_t **ids = NULL;
    int *n_ids = NULL;
    float *vec = NULL;
    sparq_context *c = NULL;
    const json_value *o = json_root(d), *in = json_get(o, "input");
    const json_member *dup = NULL;
    if (o->type != JSON_OBJECT) status = bad(err, en, "%s", "the body must be a JSON object");
    else if (json_find_duplicate(o, &dup)) status = bad(err, en, "%s", "a field is given twice (or out of memory)");
    else status = check_fields(o, &norm, &b64, err, en);
    if (!status && (!in || in->type == JSON_NULL)) status = bad(err, en, "%s", "'input' is required");
    if (!status) {
        n_in = in->type == JSON_ARRAY ? (int)(json_len(in) < SRV_MAX_EMBED_INPUTS + 1 ? json_len(in) : SRV_MAX_EMBED_INPUTS + 1) : 1;
        if (in->type == JSON_ARRAY && n_in == 0) status = bad(err, en, "%s", "'input' is an empty array");
        else if (n_in > SRV_MAX_EMBED_INPUTS) {
            err_set(err, en, "'input' has more than %d strings; send several requests", SRV_MAX_EMBED_INPUTS);
            status = 400;
        }
    }
    if (!status) {
        ids = calloc((size_t)n_in, sizeof *ids);
        n_ids = calloc((size_t)n_in, sizeof *n_ids);
        if (!ids || !n_ids) {
            err_set(err, en, "out of memory");
            status = 500;
        }
    }
    for (int i = 0; !status && i < n_in; i++) {
        status = tokenize_input(s, in->type == JSON_ARRAY ? json_at(in, (size_t)i) : in, (size_t)i, &ids[i], &n_ids[i],
                                err, en);
        if (!status && n_ids[i] > max_n) max_n = n_ids[i];
        total += status ? 0 : n_ids[i];
    }
    const int E = sparq_model_n_embd(s->model);
    if (!status) {
        sparq_context_params cp = sparq_context_default_params();
        cp.n_ctx = max_n;
        cp.n_threads = 1; /* see the top of the file */
        cp.n_batch = s->cfg.n_batch;
        cp.kv_type = s->cfg.kv_type;
        if (!(vec = malloc((size_t)E * sizeof *vec)) || sparq_context_create(s->model, &cp, &c, err, en)) {
            if (!vec) err_set(err, en, "out of memory");
            status = 500;
        }
    }
    FILE *f = NULL;
    if (!status && !(f = open_memstream(out, out_len))) {
        err_set(err, en, "out of memory");
        status = 500;
    }
    if (!status) {
        fputs("{\"object\":\"list\",\"data\":[", f);
        for (int i = 0; i < n_in && !status; i++) {
            if (sparq_embed(c, ids[i], n_ids[i], s->cfg.pooling, norm, vec)) {
                err_set(err, en, "input %d: %s", i, sparq_context_error(c));
                status = 500;
                break;
            }
            fprintf(f, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
            if (b64) {
                write_base64(f, vec, E);
                fputs(",\"encoding_format\":\"base64\"}", f);
                continue;
            }
            fputc('[', f);
            for (int j = 0; j < E; j++) fprintf(f, "%s%.9g", j ? "," : "", (double)vec[j]);
            fputs("]}", f);
        }
        fputs("],\"model\":", f);
        json_write_str(f, s->cfg.model_id, strlen(s->cfg.model_id));
        fprintf(f, ",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", total, total);
        fclose(f);
        if (status) {
            free(*out);
            *out = NULL;
            *out_len = 0;
        }
    }
    sparq_context_free(c);
    free(vec);
    for (int i = 0; ids && i < n_in; i++) free(ids[i]);
    free(ids);
    free(n_ids);
    json_free(d);
    return status ? status : 200;
}
