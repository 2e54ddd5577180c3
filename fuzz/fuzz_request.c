/* fuzz_request.c - libFuzzer harness for the server's request parsing
 * (server/request.h: srv_parse_request; scripts/fuzz.sh).
 *
 * The stories260K model (on the search path, util/paths.h) is loaded once;
 * every input is given as the body to each endpoint's parser: completions,
 * chat (with the GGUF's template or one of the named ones, picked by the
 * input's length), tokenize and detokenize. A refusal must say why in one
 * line; an accepted request must hold what the scheduler relies on (token
 * ids in the vocabulary, a prompt within the limits, max_tokens within the
 * context, the policy name owned by the request). Everything is freed by
 * the server's own srv_request_release, so a leak is a failure.
 */
#include "attn/attn_params.h"
#include "server/request.h"
#include "util/paths.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Loaded once by LLVMFuzzerInitialize and read-only afterwards: libFuzzer
 * gives a harness no other place to keep what every input shares. */
static sparq_model *model;
static srv_parse_env env;
static int n_vocab;

static const char *const templates[] = { NULL, "chatml", "llama3", "phi3", "mistral", "gemma" };

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    char path[1024], err[512];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        fprintf(stderr, "fuzz_request: stories260K.gguf not found (%s)\n", path_search_description());
        abort();
    }
    if (sparq_model_load(path, &model, err, sizeof err)) {
        fprintf(stderr, "fuzz_request: %s: %s\n", path, err);
        abort();
    }
    n_vocab = sparq_model_n_vocab(model);
    /* the server's defaults for this model, as `sparq serve` sets them */
    env.model = model;
    env.n_ctx = 256;
    env.max_prompt = 200; /* 200 * 64 bytes > max_len: long texts reach the tokenizer */
    attn_opts ao;
    attn_opts_init(&ao);
    if (attn_opts_params(&ao, env.n_ctx, sparq_model_head_dim(model), &env.attn, err, sizeof err)) {
        fprintf(stderr, "fuzz_request: %s\n", err);
        abort();
    }
    return 0;
}

static void check_error(const char *err)
{
    const size_t n = strnlen(err, 512);
    if (n == 0 || n == 512 || memchr(err, '\n', n)) abort(); /* one line, and something said */
}

static void check_ids(const srv_request *r, int max)
{
    if (r->n_prompt < 0 || r->n_prompt > max || (r->n_prompt > 0 && !r->prompt)) abort();
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= n_vocab) abort();
}

static void check_generate(const srv_request *r, int chat)
{
    check_ids(r, env.max_prompt);
    if (r->n_prompt < 1 || r->n_prompt >= env.n_ctx || r->chat != chat) abort();
    if (r->max_tokens < 0 || r->max_tokens > env.n_ctx - r->n_prompt) abort();
    if (r->n_stops < 0 || r->n_stops > SRV_MAX_STOPS) abort();
    for (int i = 0; i < r->n_stops; i++)
        if (!r->stops[i] || !r->stops[i][0] || strlen(r->stops[i]) > 256) abort();
    if (r->logprobs < -1 || r->logprobs > SRV_MAX_TOP) abort();
    if (!(r->temp >= 0 && r->temp <= 100) || !(r->top_p > 0 && r->top_p <= 1) || r->top_k < 0) abort();
    /* the document is freed: the policy strings must live in the request */
    if (r->attn.policy != r->policy || (r->attn.index && r->attn.index != r->index)) abort();
    if (!memchr(r->policy, 0, sizeof r->policy)) abort();
    if (r->n < 1 || r->n > SRV_MAX_N) abort();
    /* another of its n choices: its own copies, freed apart from r */
    srv_request *c = srv_request_clone(r, r->seed + 1);
    if (c && (c->prompt == r->prompt || c->n_prompt != r->n_prompt || c->attn.policy != c->policy ||
              c->n_stops != r->n_stops || c->n_bias != r->n_bias))
        abort();
    srv_request_release(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192) return 0;
    const char *body = (const char *)data;
    static const srv_endpoint eps[] = { SRV_EP_COMPLETIONS, SRV_EP_CHAT, SRV_EP_TOKENIZE, SRV_EP_DETOKENIZE };
    for (size_t i = 0; i < sizeof eps / sizeof eps[0]; i++) {
        srv_parse_env e = env;
        if (eps[i] == SRV_EP_CHAT) e.chat_template = templates[size % (sizeof templates / sizeof templates[0])];
        srv_request *r = calloc(1, sizeof *r);
        if (!r) abort();
        r->refs = 1;
        char err[512];
        err[0] = 0;
        const int rc = srv_parse_request(&e, eps[i], body, size, r, err, sizeof err);
        if (rc != SRV_PARSE_OK) {
            if (rc != SRV_PARSE_BAD_JSON && rc != SRV_PARSE_INVALID && rc != SRV_PARSE_TOO_LONG) abort();
            check_error(err);
        } else if (eps[i] == SRV_EP_COMPLETIONS || eps[i] == SRV_EP_CHAT) {
            check_generate(r, eps[i] == SRV_EP_CHAT);
        } else {
            /* tokenize's limit is in bytes (64 a token), not tokens */
            check_ids(r, eps[i] == SRV_EP_TOKENIZE ? 64 * env.max_prompt + 2 : env.max_prompt);
        }
        srv_request_release(r);
    }
    return 0;
}
