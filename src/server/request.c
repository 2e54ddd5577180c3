/* request.c - a request body to an srv_request (request.h): the JSON
 * fields of the OpenAI completions and chat endpoints plus sparq's
 * extensions, and the /tokenize and /detokenize bodies, each validated.
 *
 * Map:
 *   get_num / get_int / get_bool               one field, type and range
 *   parse_sampling / parse_attn                sampling, stop strings, logprobs; the "sparq" object
 *   parse_ids / tokenize_text / parse_prompt / parse_messages   the prompt as token ids
 *   srv_parse_request                          the body, per endpoint, with the limits
 */
#include "server/docs.h"
#include "server/request.h"
#include "attn/attn_params.h"
#include "core/grammar.h"
#include "util/err.h"
#include "util/json.h"
#include "util/names.h"
#include "util/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* A client's string for an error message: at most max bytes (not cutting
 * a UTF-8 character), control characters as \xNN, so the message stays one
 * line whatever the client sent. */
static const char *quote(char *dst, size_t dst_size, const char *s, size_t len, size_t max)
{
    if (len > max) len = utf8_char_start(s, max);
    size_t o = 0;
    for (size_t i = 0; i < len && o + 5 < dst_size; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(dst + o, dst_size - o, "\\x%02x", c);
        else dst[o++] = (char)c;
    }
    dst[o] = 0;
    return dst;
}

/* 1 if s[0..len) holds a NUL or another control character: never part of a
 * name, and a NUL would cut it short where it is compared as a C string. */
static int has_control(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 1;
    return 0;
}

/* Each getter: absent or null leaves *out alone and returns 0; a wrong type
 * or value returns -1 with the reason in err. */
static int get_num(const json_value *o, const char *key, double lo, double hi, double *out, char *err, size_t n)
{
    const json_value *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER || !isfinite(v->u.number) || v->u.number < lo || v->u.number > hi) {
        return err_set(err, n, "'%s' must be a number in [%g, %g]", key, lo, hi);
    }
    *out = v->u.number;
    return 0;
}

static int get_int(const json_value *o, const char *key, double lo, double hi, int64_t *out, char *err, size_t n)
{
    const json_value *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_NUMBER || v->u.number != floor(v->u.number) || v->u.number < lo || v->u.number > hi) {
        return err_set(err, n, "'%s' must be an integer in [%.0f, %.0f]", key, lo, hi);
    }
    *out = (int64_t)v->u.number;
    return 0;
}

static int get_bool(const json_value *o, const char *key, int *out, char *err, size_t n)
{
    const json_value *v = json_get(o, key);
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_BOOL) {
        return err_set(err, n, "'%s' must be true or false", key);
    }
    *out = v->u.boolean;
    return 0;
}

static int fgetf(const json_value *o, const char *key, double lo, double hi, float *out, char *err, size_t n)
{
    double d = *out;
    if (get_num(o, key, lo, hi, &d, err, n)) return -1;
    *out = (float)d;
    return 0;
}

/* Orders indexes into the ids array given as ctx (qsort_r), by id. */
static int bias_cmp(const void *a, const void *b, void *ctx)
{
    const int32_t *ids = ctx, x = ids[*(const int32_t *)a], y = ids[*(const int32_t *)b];
    return (x > y) - (x < y);
}

/* OpenAI's "logit_bias": {"<token id>": bias, ...}, bias in [-100, 100],
 * added to the logits before sampling (greedy included), as OpenAI and
 * llama-server do; -100 all but bans a token. Logprobs stay those of the
 * model (unbiased). */
static int parse_logit_bias(const srv_parse_env *e, const json_value *b, srv_request *r, char *err, size_t n)
{
    if (!b || b->type == JSON_NULL) return 0;
    const int V = sparq_model_n_vocab(e->model);
    if (b->type != JSON_OBJECT || b->n > (size_t)V) {
        return err_set(err, n, "'logit_bias' must be an object of at most %d \"token id\": bias members", V);
    }
    if (b->n == 0) return 0;
    r->bias_ids = malloc(b->n * sizeof *r->bias_ids);
    r->bias = malloc(b->n * sizeof *r->bias);
    if (!r->bias_ids || !r->bias) {
        return err_set(err, n, "out of memory");
    }
    for (size_t i = 0; i < b->n; i++) {
        const json_member *m = &b->u.members[i];
        char *end = NULL;
        errno = 0;
        const long id = m->key_len && m->key_len < 12 && m->key[0] >= '0' && m->key[0] <= '9'
                        ? strtol(m->key, &end, 10) : -1;
        if (id < 0 || errno || !end || end != m->key + m->key_len || id >= V) {
            return err_set(err, n, "'logit_bias' keys must be token ids 0..%d written as decimal strings", V - 1);
        }
        if (m->value.type != JSON_NUMBER || !(m->value.u.number >= -100 && m->value.u.number <= 100)) {
            return err_set(err, n, "'logit_bias' values must be numbers in [-100, 100]");
        }
        r->bias_ids[i] = (int32_t)id;
        r->bias[i] = (float)m->value.u.number;
    }
    /* one entry per token id ("5" and "05" name the same one): the sum of
     * its biases, clamped to the documented range, so no id gets more than
     * +-100 however often it is written */
    int32_t *ord = malloc(b->n * sizeof *ord);
    if (!ord) {
        return err_set(err, n, "out of memory");
    }
    for (size_t i = 0; i < b->n; i++) ord[i] = (int32_t)i;
    qsort_r(ord, b->n, sizeof *ord, bias_cmp, r->bias_ids);
    int32_t *ids = malloc(b->n * sizeof *ids);
    float *val = malloc(b->n * sizeof *val);
    if (!ids || !val) {
        free(ord);
        free(ids);
        free(val);
        return err_set(err, n, "out of memory");
    }
    int m = 0;
    for (size_t i = 0; i < b->n;) {
        const int32_t id = r->bias_ids[ord[i]];
        double sum = 0;
        for (; i < b->n && r->bias_ids[ord[i]] == id; i++) sum += r->bias[ord[i]];
        ids[m] = id;
        val[m++] = (float)(sum > 100 ? 100 : sum < -100 ? -100 : sum);
    }
    free(ord);
    free(r->bias_ids);
    free(r->bias);
    r->bias_ids = ids;
    r->bias = val;
    r->n_bias = m;
    return 0;
}

/* 1 if key[0..len) is one of names (NULL-terminated). */
static int key_in(const char *key, size_t len, const char *const *names)
{
    if (memchr(key, 0, len)) return 0; /* "stop\u0000x" is not "stop" */
    for (int i = 0; names[i]; i++)
        if (!strcmp(key, names[i])) return 1;
    return 0;
}

/* Every top-level field of a body must be one this server acts on: a field
 * accepted and then ignored would let a client believe it got what it asked
 * for (JSON output, tool calls, a suffix). Null is the same as absent, as
 * for the fields read. The few values that ask for the default behaviour
 * pass: "response_format": {"type": "text"}, "tools": [],
 * "tool_choice": "none". Known fields that are not implemented are named as
 * such; anything else is an unknown field. */
static int check_fields(const json_value *o, srv_endpoint ep, char *err, size_t n)
{
    static const char *const generate[] = { "model", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                                            "min_p", "top_k", "frequency_penalty", "presence_penalty",
                                            "repetition_penalty", "repeat_penalty", "n", "seed", "stream",
                                            "ignore_eos", "stop", "logit_bias", "logprobs", "sparq", "user",
                                            "response_format", "grammar", "json_schema", NULL };
    static const char *const completions[] = { "prompt", "echo", NULL };
    static const char *const chat[] = { "messages", "top_logprobs", NULL };
    static const char *const tokenize[] = { "content", "add_special", NULL };
    static const char *const detokenize[] = { "tokens", NULL };
    /* OpenAI and llama-server fields this server does not implement */
    static const char *const unsupported[] = {
        "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls",
        "stream_options", "suffix", "best_of", "echo", "top_logprobs", "store", "metadata", "service_tier",
        "reasoning_effort", "modalities", "audio", "prediction", "web_search_options",
        "n_probs", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta", "n_predict", "cache_prompt",
        "samplers", "id_slot", "with_pieces", "prompt", "messages", NULL };
    const int gen = ep == SRV_EP_COMPLETIONS || ep == SRV_EP_CHAT;
    for (size_t i = 0; i < o->n; i++) {
        const json_member *m = &o->u.members[i];
        const json_value *v = &m->value;
        if (v->type == JSON_NULL) continue;
        if (gen ? key_in(m->key, m->key_len, generate) ||
                      key_in(m->key, m->key_len, ep == SRV_EP_CHAT ? chat : completions)
                : key_in(m->key, m->key_len, ep == SRV_EP_TOKENIZE ? tokenize : detokenize))
            continue;
        const char *hint = "";
        if (gen && key_in(m->key, m->key_len, (const char *const[]){ "tools", NULL })) {
            if (v->type == JSON_ARRAY && json_len(v) == 0) continue;
            hint = " (no tool calls; only an empty list)";
        } else if (gen && key_in(m->key, m->key_len, (const char *const[]){ "tool_choice", NULL })) {
            if (v->type == JSON_STRING && v->n == 4 && !memcmp(v->u.str, "none", 4)) continue;
            hint = " (no tool calls; only \"none\")";
        } else if (key_in(m->key, m->key_len, (const char *const[]){ "stream_options", NULL })) {
            hint = " (a stream's last chunk always carries the usage)";
        }
        char q[300];
        quote(q, sizeof q, m->key, m->key_len, 64);
        if (key_in(m->key, m->key_len, unsupported))
            err_set(err, n, "%s is not supported%s%s", q,
                    ep == SRV_EP_CHAT ? " on /v1/chat/completions" : ep == SRV_EP_COMPLETIONS ? " on /v1/completions" : "",
                    hint);
        else err_set(err, n, "unknown field '%s'", q);
        return -1;
    }
    return 0;
}

static int parse_sampling(const srv_parse_env *e, const json_value *o, srv_request *r, int chat, char *err, size_t n)
{
    r->temp = 1.0f;
    r->top_p = 1.0f;
    r->rep_pen = 1.0f;
    if (fgetf(o, "temperature", 0, 100, &r->temp, err, n) || fgetf(o, "top_p", 0, 1, &r->top_p, err, n) ||
        fgetf(o, "min_p", 0, 1, &r->min_p, err, n) ||
        fgetf(o, "frequency_penalty", -2, 2, &r->freq_pen, err, n) ||
        fgetf(o, "presence_penalty", -2, 2, &r->pres_pen, err, n) ||
        fgetf(o, "repetition_penalty", 0.01, 100, &r->rep_pen, err, n) ||
        fgetf(o, "repeat_penalty", 0.01, 100, &r->rep_pen, err, n))
        return -1;
    if (r->top_p <= 0) {
        return err_set(err, n, "'top_p' must be in (0, 1]");
    }
    int64_t top_k = 0, nn = 1, seed = -1;
    if (get_int(o, "top_k", 0, 1e9, &top_k, err, n) || get_int(o, "n", 1, SRV_MAX_N, &nn, err, n) ||
        get_int(o, "seed", -9.2e18, 9.2e18, &seed, err, n))
        return -1;
    r->top_k = (int)top_k;
    r->n = (int)nn;
    if (json_get(o, "seed") && json_get(o, "seed")->type == JSON_NUMBER) {
        r->seed = (uint64_t)seed;
    } else { /* random when not given, as llama.cpp does */
        if (getrandom(&r->seed, sizeof r->seed, 0) != (ssize_t)sizeof r->seed) r->seed = (uint64_t)time(NULL);
    }
    if (get_bool(o, "stream", &r->stream, err, n) || get_bool(o, "ignore_eos", &r->ignore_eos, err, n))
        return -1;
    const json_value *st = json_get(o, "stop");
    if (st && st->type != JSON_NULL) {
        const int arr = st->type == JSON_ARRAY;
        const size_t cnt = arr ? json_len(st) : 1;
        if ((!arr && st->type != JSON_STRING) || cnt > SRV_MAX_STOPS) {
            return err_set(err, n, "'stop' must be a string or an array of at most %d strings", SRV_MAX_STOPS);
        }
        for (size_t i = 0; i < cnt; i++) {
            size_t len = 0;
            const char *sv = json_str(arr ? json_at(st, i) : st, &len);
            if (!sv || len == 0 || len > 256 || memchr(sv, 0, len)) {
                return err_set(err, n, "'stop' strings must be 1 to 256 bytes");
            }
            if (!(r->stops[r->n_stops] = strndup(sv, len))) {
                return err_set(err, n, "out of memory");
            }
            r->n_stops++;
        }
    }
    if (parse_logit_bias(e, json_get(o, "logit_bias"), r, err, n)) return -1;
    r->logprobs = -1;
    if (chat) {
        int lp = 0;
        int64_t top = 0;
        if (get_bool(o, "logprobs", &lp, err, n) || get_int(o, "top_logprobs", 0, SRV_MAX_TOP, &top, err, n))
            return -1;
        if (top > 0 && !lp) { /* alternatives without the tokens: OpenAI refuses it too */
            return err_set(err, n, "'top_logprobs' needs \"logprobs\": true");
        }
        if (lp) r->logprobs = (int)top;
    } else {
        int64_t lp = -1;
        if (get_int(o, "logprobs", 0, SRV_MAX_TOP, &lp, err, n) || get_bool(o, "echo", &r->echo, err, n))
            return -1;
        r->logprobs = (int)lp;
    }
    return 0;
}

/* The extension field "sparq": {"attn": "sparq", "ratio": "1/8", ...}: the
 * options of `sparq run`, turned into parameters by the same code. */
static int parse_attn(const srv_parse_env *e, const json_value *o, srv_request *r, char *err, size_t n)
{
    r->attn = e->attn;
    const json_value *x = json_get(o, "sparq");
    if (!x || x->type == JSON_NULL) goto copy;
    if (x->type != JSON_OBJECT) {
        return err_set(err, n, "'sparq' must be an object such as {\"attn\": \"sparq\", \"ratio\": \"1/8\"}");
    }
    static const char *const str_keys[] = { "attn", "ratio", "select", "index", "schedule", "key_type", NULL };
    static const char *const int_keys[] = { "r", "k", "l", "attn_k", "n_sink", "topk_k", "ivf_nlist",
                                            "ivf_nprobe", "hnsw_ef", "k_min", NULL };
    for (size_t i = 0; i < x->n; i++) {
        const char *key = x->u.members[i].key;
        const size_t key_len = x->u.members[i].key_len;
        /* a NUL would let "attn\u0000x" pass as "attn" here, then be ignored */
        int known = !memchr(key, 0, key_len) &&
                    (!strcmp(key, "no_realloc") || !strcmp(key, "adaptive_k") || !strcmp(key, "prefix_id"));
        for (int j = 0; str_keys[j]; j++) known |= !memchr(key, 0, key_len) && !strcmp(key, str_keys[j]);
        for (int j = 0; int_keys[j]; j++) known |= !memchr(key, 0, key_len) && !strcmp(key, int_keys[j]);
        if (!known) {
            char q[300];
            return err_set(err, n, "'sparq' has an unknown field '%s' (known: attn ratio r k l attn_k select "
                                   "no_realloc adaptive_k k_min n_sink index topk_k schedule ivf_nlist ivf_nprobe hnsw_ef "
                                   "key_type prefix_id)",
                           quote(q, sizeof q, key, key_len, 64));
        }
    }
    /* the document's name: the prefix cache and --kv-dir find it by it */
    const json_value *pid = json_get(x, "prefix_id");
    if (pid && pid->type != JSON_NULL) {
        int ok = pid->type == JSON_STRING && pid->n >= 1 && pid->n <= SRV_MAX_PREFIX_ID;
        for (size_t i = 0; ok && i < pid->n; i++) ok = pid->u.str[i] >= 0x20 && pid->u.str[i] < 0x7f;
        if (!ok) {
            return err_set(err, n, "'sparq.prefix_id' must be a string of 1 to %d printable ASCII characters",
                           SRV_MAX_PREFIX_ID);
        }
        memcpy(r->prefix_id, pid->u.str, pid->n);
        r->prefix_id[pid->n] = 0;
        /* a --load-kv document: its capacity is the context the policy
         * (and a ratio) is for */
        r->doc = srv_doc_find(e->docs, e->n_docs, r->prefix_id);
        if (r->doc >= 0) r->attn = e->docs[r->doc].attn;
        if (x->n == 1) goto copy; /* only the name: the server's attention */
    }
    attn_opts ao;
    attn_opts_init(&ao);
    const char **sdst[] = { &ao.attn, &ao.ratio, &ao.select, &ao.index, &ao.schedule, &ao.key_type };
    for (int j = 0; str_keys[j]; j++) {
        const json_value *v = json_get(x, str_keys[j]);
        if (!v || v->type == JSON_NULL) continue;
        if (v->type != JSON_STRING || v->n > 64 || has_control(v->u.str, v->n)) { /* quoted in messages below */
            return err_set(err, n, "'sparq.%s' must be a short string of printable characters", str_keys[j]);
        }
        *sdst[j] = v->u.str;
    }
    int *idst[] = { &ao.r, &ao.k, &ao.l, &ao.attn_k, &ao.n_sink, &ao.topk_k, &ao.ivf_nlist, &ao.ivf_nprobe, &ao.hnsw_ef,
                    &ao.k_min };
    for (int j = 0; int_keys[j]; j++) {
        int64_t v = *idst[j];
        if (get_int(x, int_keys[j], j == 2 ? -1 : 0, 1 << 24, &v, err, n)) return -1;
        *idst[j] = (int)v;
    }
    if (get_bool(x, "no_realloc", &ao.no_realloc, err, n) || get_bool(x, "adaptive_k", &ao.adaptive_k, err, n))
        return -1;
    const int64_t S = r->doc >= 0 ? e->docs[r->doc].n_ctx : e->n_ctx;
    if (attn_opts_params(&ao, S, sparq_model_head_dim(e->model), &r->attn, err, n)) return -1;
copy:
    /* the request owns its strings: the document is freed before decoding */
    snprintf(r->policy, sizeof r->policy, "%s", r->attn.policy ? r->attn.policy : "dense");
    r->attn.policy = r->policy;
    if (r->attn.index) {
        snprintf(r->index, sizeof r->index, "%s", r->attn.index);
        r->attn.index = r->index;
    }
    int known = 0;
    for (int i = 0; sparq_attn_policy_name(i); i++) known |= !strcmp(sparq_attn_policy_name(i), r->policy);
    if (!known) {
        char names[256];
        names_join(names, sizeof names, " ", sparq_attn_policy_count(), sparq_attn_policy_name);
        return err_set(err, n, "unknown attention policy '%.32s' (known: %s)", r->policy, names);
    }
    return 0;
}

/* Token ids from a JSON array of integers; -1 with the reason. */
static int parse_ids(const srv_parse_env *e, const json_value *a, int32_t **out, char *err, size_t n)
{
    const size_t cnt = json_len(a);
    if (cnt > (size_t)e->max_prompt) {
        return err_set(err, n, "the prompt has %zu tokens; the limit is %d", cnt, e->max_prompt);
    }
    int32_t *ids = malloc((cnt + 1) * sizeof *ids);
    if (!ids) {
        return err_set(err, n, "out of memory");
    }
    const int n_vocab = sparq_model_n_vocab(e->model);
    for (size_t i = 0; i < cnt; i++) {
        const json_value *v = json_at(a, i);
        if (v->type != JSON_NUMBER || v->u.number != floor(v->u.number) || v->u.number < 0 ||
            v->u.number >= n_vocab) {
            err_set(err, n, "token %zu is not an id in [0, %d)", i, n_vocab);
            free(ids);
            return -1;
        }
        ids[i] = (int32_t)v->u.number;
    }
    *out = ids;
    return (int)cnt;
}

static int tokenize_text(const srv_parse_env *e, const char *text, size_t len, int add_special, int32_t **out, char *err,
                         size_t n)
{
    if (len > (size_t)e->max_prompt * 64) { /* no token is 64 bytes: over the limit for sure */
        return err_set(err, n, "the prompt of %zu bytes exceeds the limit of %d tokens", len, e->max_prompt);
    }
    int cnt = sparq_tokenize(e->model, text, (int)len, add_special, NULL, 0);
    int32_t *ids = cnt >= 0 ? malloc(((size_t)cnt + 1) * sizeof *ids) : NULL;
    if (!ids || sparq_tokenize(e->model, text, (int)len, add_special, ids, cnt) != cnt) {
        free(ids);
        return err_set(err, n, "cannot tokenize the prompt");
    }
    *out = ids;
    return cnt;
}

/* prompt: a string, token ids, or a one-element array of either. */
static int parse_prompt(const srv_parse_env *e, const json_value *o, srv_request *r, char *err, size_t n)
{
    const json_value *p = json_get(o, "prompt");
    if (p && p->type == JSON_ARRAY && json_len(p) >= 1 && json_at(p, 0)->type != JSON_NUMBER) {
        if (json_len(p) > 1) {
            return err_set(err, n, "'prompt' with several prompts is not supported: send one request each");
        }
        p = json_at(p, 0);
    }
    int cnt;
    /* after a document no BOS: the document began the sequence */
    if (p && p->type == JSON_STRING) cnt = tokenize_text(e, p->u.str, p->n, r->doc < 0, &r->prompt, err, n);
    else if (p && p->type == JSON_ARRAY) cnt = parse_ids(e, p, &r->prompt, err, n);
    else {
        return err_set(err, n, "'prompt' must be a string or an array of token ids");
    }
    r->n_prompt = cnt;
    return cnt < 0 ? -1 : 0;
}

static int parse_messages(const srv_parse_env *e, const json_value *o, srv_request *r, char *err, size_t n)
{
    const json_value *ms = json_get(o, "messages");
    if (!ms || ms->type != JSON_ARRAY || json_len(ms) == 0 || json_len(ms) > 1024) {
        return err_set(err, n, "'messages' must be a non-empty array of {role, content}");
    }
    const size_t cnt = json_len(ms);
    sparq_chat_msg *msgs = calloc(cnt, sizeof *msgs);
    char **owned = calloc(cnt, sizeof *owned);
    int rc = -1;
    if (!msgs || !owned) {
        err_set(err, n, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < cnt; i++) {
        const json_value *m = json_at(ms, i);
        size_t rl = 0;
        const char *role = json_get_str(m, "role", &rl);
        const json_value *c = json_get(m, "content");
        for (size_t j = 0; m->type == JSON_OBJECT && j < m->n; j++) { /* name, tool_calls, ...: not acted on */
            const json_member *f = &m->u.members[j];
            if (f->value.type == JSON_NULL || key_in(f->key, f->key_len, (const char *const[]){ "role", "content", NULL }))
                continue;
            char q[300];
            err_set(err, n, "messages[%zu].%s is not supported", i, quote(q, sizeof q, f->key, f->key_len, 64));
            goto done;
        }
        if (!role || has_control(role, rl) || (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") &&
                      strcmp(role, "developer"))) {
            err_set(err, n, "messages[%zu].role must be system, user or assistant", i);
            goto done;
        }
        msgs[i].role = strcmp(role, "developer") ? role : "system";
        if (c && c->type == JSON_STRING) {
            if (memchr(c->u.str, 0, c->n)) {
                err_set(err, n, "messages[%zu].content holds a NUL character", i);
                goto done;
            }
            msgs[i].content = c->u.str;
        } else if (c && c->type == JSON_ARRAY) { /* [{"type":"text","text":...}] parts, joined */
            text_buf t = { 0 };
            for (size_t j = 0; j < json_len(c); j++) {
                size_t tl = 0;
                const char *type = json_get_str(json_at(c, j), "type", NULL);
                const char *tx = json_get_str(json_at(c, j), "text", &tl);
                const json_value *part = json_at(c, j);
                const int extra = part->type == JSON_OBJECT && part->n != 2;
                if (!type || strcmp(type, "text") || !tx || memchr(tx, 0, tl) || extra) {
                    err_set(err, n, "messages[%zu].content parts must be {\"type\": \"text\", \"text\": ...}", i);
                    free(t.data);
                    goto done;
                }
                if (text_append(&t, tx, tl)) {
                    free(t.data);
                    err_set(err, n, "out of memory");
                    goto done;
                }
            }
            owned[i] = t.data ? t.data : strdup("");
            msgs[i].content = owned[i];
            if (!owned[i]) goto done;
        } else {
            err_set(err, n, "messages[%zu].content must be a string or an array of text parts", i);
            goto done;
        }
    }
    size_t total = 0;
    for (size_t i = 0; i < cnt; i++) total += strlen(msgs[i].content);
    if (total > (size_t)e->max_prompt * 64) {
        err_set(err, n, "the messages (%zu bytes) exceed the limit of %d tokens", total, e->max_prompt);
        goto done;
    }
    int k = sparq_chat_tokenize(e->model, e->chat_template, msgs, (int)cnt, 1, NULL, 0, err, n);
    if (k < 0) goto done;
    if (!(r->prompt = malloc(((size_t)k + 1) * sizeof *r->prompt)) ||
        sparq_chat_tokenize(e->model, e->chat_template, msgs, (int)cnt, 1, r->prompt, k, err, n) != k) {
        err_set(err, n, "cannot tokenize the messages");
        goto done;
    }
    r->n_prompt = k;
    rc = 0;
done:
    for (size_t i = 0; owned && i < cnt; i++) free(owned[i]);
    free(owned);
    free(msgs);
    return rc;
}

/* A document loaded with --load-kv is text the prompt continues, not the
 * start of a conversation a chat template could render. */
static int doc_not_chat(const srv_parse_env *e, const srv_request *r, char *err, size_t n)
{
    return err_set(err, n, "the document '%s' (--load-kv) is continued through /v1/completions, not chat", e->docs[r->doc].id);
}

/* Structured output: llama-server's "grammar" (GBNF text) and
 * "json_schema" (a schema), and OpenAI's "response_format": {"type":
 * "text"} (free text), {"type": "json_object"} (any JSON object; a
 * "schema" member, as llama-server takes it, narrows it) or {"type":
 * "json_schema", "json_schema": {"schema": {...}, "name", "strict",
 * "description"}}. At most one of the three; the grammar is compiled here,
 * so a bad one is this request's 400 with the parser's message. */
static int parse_grammar(const json_value *o, srv_request *r, char *err, size_t n)
{
    const json_value *gr = json_get(o, "grammar"), *js = json_get(o, "json_schema"),
                     *rf = json_get(o, "response_format"), *schema = NULL;
    if (gr && gr->type == JSON_NULL) gr = NULL;
    if (js && js->type == JSON_NULL) js = NULL;
    if (rf && rf->type == JSON_NULL) rf = NULL;
    int json_mode = 0;
    if (rf) {
        const json_value *t = json_get(rf, "type");
        if (rf->type != JSON_OBJECT || !t || t->type != JSON_STRING) {
            return err_set(err, n, "'response_format' must be an object with a string 'type'");
        }
        for (size_t i = 0; i < rf->n; i++)
            if (!key_in(rf->u.members[i].key, rf->u.members[i].key_len,
                        (const char *const[]){ "type", "json_schema", "schema", NULL })) {
                return err_set(err, n, "'response_format' has an unknown field '%.40s'", rf->u.members[i].key);
            }
        if (!strcmp(t->u.str, "text")) rf = NULL;
        else if (!strcmp(t->u.str, "json_object")) {
            json_mode = 1;
            schema = json_get(rf, "schema");
        } else if (!strcmp(t->u.str, "json_schema")) {
            const json_value *w = json_get(rf, "json_schema");
            schema = w && w->type == JSON_OBJECT ? json_get(w, "schema") : NULL;
            if (!schema) {
                return err_set(err, n, "'response_format' json_schema needs {\"json_schema\": {\"schema\": {...}}}");
            }
            for (size_t i = 0; i < w->n; i++)
                if (!key_in(w->u.members[i].key, w->u.members[i].key_len,
                            (const char *const[]){ "schema", "name", "strict", "description", NULL })) {
                    return err_set(err, n, "'response_format.json_schema' has an unknown field '%.40s'", w->u.members[i].key);
                }
        } else {
            return err_set(err, n, "'response_format' type '%.32s' is not one of text, json_object, json_schema", t->u.str);
        }
    }
    if ((gr != NULL) + (js != NULL) + (rf != NULL) > 1) {
        return err_set(err, n, "give at most one of 'grammar', 'json_schema' and 'response_format'");
    }
    if (js) schema = js;
    char gerr[256] = "";
    if (gr) {
        if (gr->type != JSON_STRING || strlen(gr->u.str) != gr->n) {
            return err_set(err, n, "'grammar' must be a string of GBNF rules");
        }
        if (!(r->gbnf = strdup(gr->u.str))) {
            return err_set(err, n, "out of memory");
        }
    } else if (schema || json_mode) {
        static const char any_object[] = "{\"type\":\"object\"}";
        if (schema) r->gbnf = json_schema_value_to_gbnf(schema, gerr, sizeof gerr);
        else r->gbnf = json_schema_to_gbnf(any_object, sizeof any_object - 1, gerr, sizeof gerr);
        if (!r->gbnf) {
            return err_set(err, n, "%s", gerr);
        }
    } else {
        return 0;
    }
    r->grammar = sparq_grammar_parse(r->gbnf, gerr, sizeof gerr);
    if (!r->grammar) {
        return err_set(err, n, "%s", gerr);
    }
    return 0;
}

static int parse_generate(const srv_parse_env *e, const json_value *o, int chat, srv_request *r, char *err, size_t n)
{
    r->chat = chat;
    r->doc = -1;
    int64_t max_tokens = chat ? -1 : 16;
    if (o->type != JSON_OBJECT) {
        err_set(err, n, "the body must be a JSON object");
        return SRV_PARSE_INVALID;
    }
    if (check_fields(o, chat ? SRV_EP_CHAT : SRV_EP_COMPLETIONS, err, n)) return SRV_PARSE_INVALID;
    const json_value *model = json_get(o, "model");
    if (model && model->type != JSON_STRING && model->type != JSON_NULL) {
        err_set(err, n, "'model' must be a string");
        return SRV_PARSE_INVALID;
    }
    if (parse_sampling(e, o, r, chat, err, n) || parse_attn(e, o, r, err, n) || parse_grammar(o, r, err, n) ||
        get_int(o, "max_tokens", 0, 1e9, &max_tokens, err, n) ||
        get_int(o, "max_completion_tokens", 0, 1e9, &max_tokens, err, n) ||
        (chat && r->doc >= 0 && doc_not_chat(e, r, err, n)) ||
        (chat ? parse_messages(e, o, r, err, n) : parse_prompt(e, o, r, err, n)))
        return SRV_PARSE_INVALID;
    if (r->n_prompt == 0) {
        err_set(err, n, "the prompt is empty");
        return SRV_PARSE_INVALID;
    }
    /* after a --load-kv document, what is left of its file's capacity */
    const int64_t room = r->doc >= 0 ? e->docs[r->doc].n_ctx - e->docs[r->doc].n_pos : e->n_ctx;
    if (r->n_prompt > e->max_prompt || r->n_prompt >= room) {
        err_set(err, n, "the prompt has %d tokens; the limit is %d (context %lld%s)", r->n_prompt,
                e->max_prompt < room - 1 ? e->max_prompt : (int)(room - 1), (long long)room,
                r->doc >= 0 ? " after the document" : "");
        return SRV_PARSE_TOO_LONG;
    }
    const int n_vocab = sparq_model_n_vocab(e->model);
    /* each of the n choices echoes the prompt with its own log-probabilities */
    if (r->echo && r->logprobs >= 0 && (double)r->n_prompt * n_vocab * 4 * r->n > 512.0 * 1024 * 1024) {
        err_set(err, n, "echo with logprobs is limited to %d prompt tokens (over all n choices)",
                (int)(512.0 * 1024 * 1024 / 4 / n_vocab / r->n));
        return SRV_PARSE_INVALID;
    }
    if (max_tokens < 0 || max_tokens > room - r->n_prompt) max_tokens = room - r->n_prompt;
    r->max_tokens = (int)max_tokens;
    return SRV_PARSE_OK;
}

/* /tokenize {"content": "...", "add_special": false} and /detokenize
 * {"tokens": [ids]}: the ids in r->prompt. */
static int parse_tokens(const srv_parse_env *e, const json_value *o, int detok, srv_request *r, char *err, size_t n)
{
    int cnt = -1;
    if (o->type != JSON_OBJECT) {
        err_set(err, n, detok ? "'tokens' must be an array of token ids" : "'content' must be a string");
        return SRV_PARSE_INVALID;
    }
    if (check_fields(o, detok ? SRV_EP_DETOKENIZE : SRV_EP_TOKENIZE, err, n)) return SRV_PARSE_INVALID;
    if (!detok) {
        size_t tl = 0;
        const char *text = json_get_str(o, "content", &tl);
        int add = 0;
        if (!text) err_set(err, n, "'content' must be a string");
        else if (!get_bool(o, "add_special", &add, err, n)) cnt = tokenize_text(e, text, tl, add, &r->prompt, err, n);
    } else {
        const json_value *t = json_get(o, "tokens");
        if (!t || t->type != JSON_ARRAY) err_set(err, n, "'tokens' must be an array of token ids");
        else cnt = parse_ids(e, t, &r->prompt, err, n);
    }
    if (cnt < 0) return SRV_PARSE_INVALID;
    r->n_prompt = cnt;
    return SRV_PARSE_OK;
}

int srv_parse_request(const srv_parse_env *env, srv_endpoint ep, const char *body, size_t len, srv_request *r,
                      char *err, size_t err_size)
{
    json_doc *d = json_parse(body ? body : "", body ? len : 0, 64, err, err_size);
    if (!d) return SRV_PARSE_BAD_JSON;
    const json_value *o = json_root(d);
    /* which of two values counts differs between parsers (a proxy that
     * checked the last "max_tokens" would pass a first one it never saw):
     * a request says each field once */
    const json_member *dup = NULL;
    const int drc = json_find_duplicate(o, &dup);
    if (drc) {
        char q[300];
        if (drc > 0) err_set(err, err_size, "duplicate key \"%s\"", quote(q, sizeof q, dup->key, dup->key_len, 64));
        else err_set(err, err_size, "out of memory");
        json_free(d);
        return SRV_PARSE_INVALID;
    }
    int rc;
    switch (ep) {
    case SRV_EP_COMPLETIONS: rc = parse_generate(env, o, 0, r, err, err_size); break;
    case SRV_EP_CHAT: rc = parse_generate(env, o, 1, r, err, err_size); break;
    case SRV_EP_TOKENIZE: rc = parse_tokens(env, o, 0, r, err, err_size); break;
    case SRV_EP_DETOKENIZE: rc = parse_tokens(env, o, 1, r, err, err_size); break;
    default:
        err_set(err, err_size, "unknown endpoint %d", (int)ep);
        rc = SRV_PARSE_INVALID;
    }
    json_free(d); /* the request owns copies of what it keeps */
    return rc;
}

void srv_request_release(srv_request *r)
{
    if (!r || --r->refs > 0) return;
    free(r->prompt);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->bias_ids);
    free(r->bias);
    free(r->gbnf);
    sparq_grammar_free(r->grammar);
    free(r->text.data);
    free(r->toks);
    free(r);
}

srv_request *srv_request_clone(const srv_request *r, uint64_t seed)
{
    srv_request *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *r;
    /* what it owns is its own; what the scheduler publishes starts empty */
    c->prompt = NULL;
    c->n_stops = 0;
    c->bias_ids = NULL;
    c->bias = NULL;
    c->gbnf = NULL;
    c->grammar = NULL;
    memset(&c->text, 0, sizeof c->text);
    c->toks = NULL;
    c->n_toks = c->cap_toks = 0;
    c->refs = 1;
    c->next = NULL;
    c->seed = seed;
    c->attn.policy = c->policy; /* they pointed into r */
    if (r->attn.index == r->index) c->attn.index = c->index;
    const size_t np = ((size_t)r->n_prompt + 1) * sizeof *r->prompt;
    const size_t nb = (size_t)r->n_bias;
    int ok = (c->prompt = malloc(np)) != NULL;
    if (ok) memcpy(c->prompt, r->prompt, np - sizeof *r->prompt);
    for (int i = 0; ok && i < r->n_stops; i++) {
        if (!(c->stops[i] = strdup(r->stops[i]))) ok = 0;
        else c->n_stops++;
    }
    if (ok && nb) {
        c->bias_ids = malloc(nb * sizeof *c->bias_ids);
        c->bias = malloc(nb * sizeof *c->bias);
        ok = c->bias_ids && c->bias;
        if (ok) {
            memcpy(c->bias_ids, r->bias_ids, nb * sizeof *c->bias_ids);
            memcpy(c->bias, r->bias, nb * sizeof *c->bias);
        }
    }
    if (ok && r->gbnf) {
        char gerr[64];
        ok = (c->gbnf = strdup(r->gbnf)) != NULL && (c->grammar = sparq_grammar_parse(c->gbnf, gerr, sizeof gerr));
    }
    if (!ok) {
        srv_request_release(c);
        return NULL;
    }
    return c;
}
