/* test_request.c - the server's request parsing (server/request.h) called
 * directly, without HTTP: valid bodies of every endpoint give the request
 * the scheduler expects, hostile ones a specific one-line error.
 *
 *  - a text prompt becomes the ids llama.cpp made for the same text
 *    (../shared/golden/llamacpp/stories260K/NAME.tokens.i32, BOS included);
 *    one longer than the limit is refused as too long with its true count;
 *  - token ids, a one-element prompt array, stop strings, logprobs, echo,
 *    sampling fields, chat messages (developer = system, text parts joined
 *    = one string), the "sparq" extension, /tokenize and /detokenize;
 *  - the bodies scripts/fuzz.sh seeds fuzz_request with are all accepted;
 *  - refused: broken or non-object JSON, invalid UTF-8, lone surrogates,
 *    nesting past the cap, wrong types, out-of-range and huge numbers,
 *    negative or fractional max_tokens, ids outside the vocabulary, too many
 *    ids or bytes, empty prompts, bad messages and extension fields; each with
 *    the message a client would read; every field not implemented
 *    (tools, suffix, ...) or unknown is
 *    refused by name; n is 1 to 16 and a clone owns its own copies.
 *    Every allocation is freed through
 *    srv_request_release (make test-asan checks for leaks).
 */
#include "test.h"
#include "attn/attn_params.h"
#include "server/request.h"
#include "util/json.h"
#include "util/paths.h"
#include "util/textbuf.h"

static srv_parse_env ENV;
static int n_vocab;

/* Parses body (NUL-terminated) for ep; returns the result code, the
 * request in *out (caller releases) and the message in err. */
static int parse(srv_endpoint ep, const char *body, srv_request **out, char *err, size_t n)
{
    srv_request *r = calloc(1, sizeof *r);
    if (!r) abort();
    r->refs = 1;
    err[0] = 0;
    const int rc = srv_parse_request(&ENV, ep, body, strlen(body), r, err, n);
    *out = r;
    return rc;
}

static const char *ep_name(srv_endpoint ep)
{
    static const char *const names[] = { "completions", "chat", "tokenize", "detokenize" };
    return names[ep];
}

/* The body must be refused with code rc and a one-line message containing
 * want. */
static void refused(srv_endpoint ep, const char *body, int rc, const char *want)
{
    srv_request *r;
    char err[512];
    const int got = parse(ep, body, &r, err, sizeof err);
    CHECK(got == rc, "%s %.80s: result %d, want %d (%s)", ep_name(ep), body, got, rc, err);
    CHECK(strstr(err, want) != NULL, "%s %.80s: error '%s' lacks '%s'", ep_name(ep), body, err, want);
    CHECK(!strchr(err, '\n'), "%s: error '%s' is not one line", ep_name(ep), err);
    srv_request_release(r);
}

/* The body must be accepted; returns the request (caller releases). */
static srv_request *accepted(srv_endpoint ep, const char *body)
{
    srv_request *r;
    char err[512];
    const int rc = parse(ep, body, &r, err, sizeof err);
    CHECK(rc == SRV_PARSE_OK, "%s %.100s: refused: %s", ep_name(ep), body, err);
    return r;
}

static int ids_equal(const srv_request *r, const int32_t *ids, int n)
{
    return r->n_prompt == n && (n == 0 || (r->prompt && memcmp(r->prompt, ids, (size_t)n * sizeof *ids) == 0));
}

/* before + TEXT as a JSON string (escaped by the library's writer) + after */
static char *body_with(const char *before, const char *text, size_t len, const char *after)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) abort();
    fputs(before, f);
    json_write_str(f, text, len);
    fputs(after, f);
    fclose(f);
    if (!buf) abort();
    return buf;
}

/* A golden prompt: its text and llama.cpp's ids; 0 if absent. */
static int golden(const char *name, char **text, size_t *text_len, int32_t **ids, int *n_ids)
{
    char rel[256], path[1024];
    snprintf(rel, sizeof rel, "golden/llamacpp/stories260K/%s.prompt.txt", name);
    if (path_find(rel, path, sizeof path)) return 0;
    *text = test_read_file(path, text_len);
    snprintf(rel, sizeof rel, "golden/llamacpp/stories260K/%s.tokens.i32", name);
    size_t nb = 0;
    *ids = path_find(rel, path, sizeof path) ? NULL : test_read_file(path, &nb);
    *n_ids = (int)(nb / 4);
    if (!*text || !*ids) {
        free(*text);
        free(*ids);
        return 0;
    }
    return 1;
}

static void test_text_prompts(void)
{
    char *text;
    size_t len;
    int32_t *ids;
    int n;
    if (!golden("lily_tom_park", &text, &len, &ids, &n)) {
        test_skip("golden/llamacpp/stories260K/lily_tom_park not found (reference data)");
    } else {
        static const struct { srv_endpoint ep; const char *before, *after; int bos; } forms[] = {
            { SRV_EP_COMPLETIONS, "{\"prompt\":", ",\"max_tokens\":3}", 1 },
            { SRV_EP_COMPLETIONS, "{\"prompt\":[", "]}", 1 }, /* a one-element array */
            { SRV_EP_TOKENIZE, "{\"content\":", ",\"add_special\":true}", 1 },
            { SRV_EP_TOKENIZE, "{\"add_special\":false,\"content\":", "}", 0 },
            { SRV_EP_TOKENIZE, "{\"content\":", "}", 0 },
        };
        for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
            char *body = body_with(forms[i].before, text, len, forms[i].after);
            srv_request *r = accepted(forms[i].ep, body);
            /* llama.cpp's ids include BOS (id 1); without specials, none */
            const int32_t *want = forms[i].bos ? ids : ids + 1;
            CHECK(ids[0] == 1 && ids_equal(r, want, n - !forms[i].bos), "%s: %d ids, llama.cpp %d",
                  body, r->n_prompt, n - !forms[i].bos);
            if (i == 0) CHECK(r->max_tokens == 3 && r->chat == 0, "max_tokens %d chat %d", r->max_tokens, r->chat);
            srv_request_release(r);
            free(body);
        }
        free(text);
        free(ids);
    }
    if (!golden("boy_cat_story", &text, &len, &ids, &n)) {
        test_skip("golden/llamacpp/stories260K/boy_cat_story not found (reference data)");
        return;
    }
    /* 636 bytes, 314 tokens: under the byte bound, over the token limit */
    CHECK(n > ENV.max_prompt && len < (size_t)ENV.max_prompt * 64, "boy_cat_story: %d tokens %zu bytes", n, len);
    char *body = body_with("{\"prompt\":", text, len, "}"), want[128];
    snprintf(want, sizeof want, "the prompt has %d tokens; the limit is %d (context %lld)", n, ENV.max_prompt,
             (long long)ENV.n_ctx);
    refused(SRV_EP_COMPLETIONS, body, SRV_PARSE_TOO_LONG, want);
    free(body);
    free(text);
    free(ids);
}

static void test_fields(void)
{
    srv_request *r = accepted(SRV_EP_COMPLETIONS,
                              "{\"model\":\"m\",\"prompt\":[1,400,29,7],\"max_tokens\":4,\"stop\":[\"\\n\",\"The end\"],"
                              "\"logprobs\":3,\"echo\":true,\"stream\":true,\"temperature\":0.25,\"top_p\":0.5,"
                              "\"top_k\":40,\"min_p\":0.05,\"seed\":12345,\"repeat_penalty\":1.5,"
                              "\"frequency_penalty\":-1,\"presence_penalty\":2,\"ignore_eos\":true}");
    CHECK(ids_equal(r, (const int32_t[]){ 1, 400, 29, 7 }, 4), "ids: %d", r->n_prompt);
    CHECK(r->max_tokens == 4 && r->logprobs == 3 && r->echo == 1 && r->stream == 1 && r->ignore_eos == 1,
          "max_tokens %d logprobs %d echo %d stream %d", r->max_tokens, r->logprobs, r->echo, r->stream);
    CHECK(r->n_stops == 2 && !strcmp(r->stops[0], "\n") && !strcmp(r->stops[1], "The end"), "stops %d", r->n_stops);
    CHECK(r->temp == 0.25f && r->top_p == 0.5f && r->top_k == 40 && r->min_p == 0.05f && r->seed == 12345,
          "sampling %g %g %d %g %llu", r->temp, r->top_p, r->top_k, r->min_p, (unsigned long long)r->seed);
    CHECK(r->rep_pen == 1.5f && r->freq_pen == -1.0f && r->pres_pen == 2.0f, "penalties");
    CHECK(!strcmp(r->attn.policy, "dense") && r->attn.policy == r->policy, "default policy '%s'", r->attn.policy);
    srv_request_release(r);

    /* defaults: completions 16 tokens, no logprobs; one stop string */
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1,2],\"stop\":\"x\",\"seed\":null,\"logprobs\":null}");
    CHECK(r->max_tokens == 16 && r->logprobs == -1 && r->n_stops == 1 && r->temp == 1.0f && r->top_p == 1.0f,
          "defaults: max_tokens %d logprobs %d stops %d", r->max_tokens, r->logprobs, r->n_stops);
    srv_request_release(r);
    /* max_tokens past the context: what is left of it */
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1,2,3],\"max_tokens\":1000000}");
    CHECK(r->max_tokens == ENV.n_ctx - 3, "max_tokens %d, want %lld", r->max_tokens, (long long)ENV.n_ctx - 3);
    srv_request_release(r);

    /* chat: default max_tokens is the rest of the context; logprobs need
     * "logprobs": true, top_logprobs is how many alternatives */
    const char *chat = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":\"ab\"}],\"logprobs\":true,\"top_logprobs\":2}";
    r = accepted(SRV_EP_CHAT, chat);
    const sparq_chat_msg msgs[] = { { "system", "Be brief." }, { "user", "ab" } };
    int32_t want[256];
    char err[256];
    const int nw = sparq_chat_tokenize(ENV.model, ENV.chat_template, msgs, 2, 1, want, 256, err, sizeof err);
    CHECK(nw > 0 && ids_equal(r, want, nw), "chat ids: %d, direct %d (%s)", r->n_prompt, nw, err);
    CHECK(r->chat == 1 && r->logprobs == 2 && r->max_tokens == ENV.n_ctx - r->n_prompt, "chat logprobs %d max %d",
          r->logprobs, r->max_tokens);
    srv_request_release(r);
    /* developer is system; text parts are joined */
    r = accepted(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"Be \"},"
                              "{\"type\":\"text\",\"text\":\"brief.\"}]},{\"role\":\"user\",\"content\":[{\"type\":"
                              "\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}");
    CHECK(nw > 0 && ids_equal(r, want, nw), "chat parts: %d ids, want %d", r->n_prompt, nw);
    CHECK(r->logprobs == -1, "chat without logprobs: %d", r->logprobs);
    srv_request_release(r);

    /* the "sparq" extension: same parameters as `sparq run`'s options */
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"attn\":\"topk\",\"index\":\"exact\",\"topk_k\":64,"
                                     "\"schedule\":\"linear\",\"key_type\":\"bf16\"}}");
    CHECK(!strcmp(r->attn.policy, "topk") && r->attn.policy == r->policy && r->attn.k == 64 &&
              r->attn.index == r->index && !strcmp(r->index, "exact") && r->attn.topk_schedule == SPARQ_TOPK_LINEAR &&
              r->attn.index_key_type == SPARQ_KEY_BF16,
          "topk: policy %s k %d index %s", r->attn.policy, r->attn.k, r->attn.index ? r->attn.index : "-");
    srv_request_release(r);
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"attn\":\"sparq\",\"r\":4,\"k\":32,\"l\":8,"
                                     "\"select\":\"logits\",\"no_realloc\":true}}");
    CHECK(!strcmp(r->attn.policy, "sparq") && r->attn.r == 4 && r->attn.k == 32 && r->attn.l == 8 &&
              r->attn.select_logits == 1 && r->attn.no_realloc == 1,
          "sparq: r %d k %d l %d", r->attn.r, r->attn.k, r->attn.l);
    srv_request_release(r);
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"attn\":\"sparq\",\"k\":32,\"adaptive_k\":true,"
                                     "\"k_min\":12}}");
    CHECK(r->attn.adaptive_k == 1 && r->attn.k_min == 12 && r->attn.k == 32, "adaptive k: %d k_min %d",
          r->attn.adaptive_k, r->attn.k_min);
    srv_request_release(r);

    /* prefix_id: the document's name, alone (server's attention) or with a policy */
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"prefix_id\":\"doc-42\"}}");
    CHECK(!strcmp(r->prefix_id, "doc-42") && !strcmp(r->policy, "dense"), "prefix_id '%s' policy %s", r->prefix_id,
          r->policy);
    srv_request_release(r);
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"prefix_id\":\"d\",\"attn\":\"sparq\"}}");
    CHECK(!strcmp(r->prefix_id, "d") && !strcmp(r->policy, "sparq"), "prefix_id with a policy: %s", r->policy);
    srv_request_release(r);
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"prefix_id\":\"\"}}", SRV_PARSE_INVALID, "prefix_id");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"prefix_id\":\"a\\nb\"}}", SRV_PARSE_INVALID,
            "printable ASCII");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"prefix_id\":7}}", SRV_PARSE_INVALID, "prefix_id");
    {
        char big[400];
        snprintf(big, sizeof big, "{\"prompt\":[1],\"sparq\":{\"prefix_id\":\"%0129d\"}}", 0);
        refused(SRV_EP_COMPLETIONS, big, SRV_PARSE_INVALID, "1 to 128");
    }

    /* logit_bias: OpenAI's object of "id": bias, one entry per id (in id order) */
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"3\":-100,\"511\":2.5,\"0\":100}}");
    CHECK(r->n_bias == 3 && r->bias_ids[0] == 0 && r->bias[0] == 100.0f && r->bias_ids[1] == 3 &&
              r->bias[1] == -100.0f && r->bias_ids[2] == 511 && r->bias[2] == 2.5f,
          "logit_bias: %d entries", r->n_bias);
    srv_request_release(r);
    /* one id under several spellings: its biases add up, clamped to
     * [-100, 100] (three times +60 is +100, not +180) */
    r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"5\":60,\"05\":60,\"7\":-60,\"005\":60,"
                                     "\"07\":-60}}");
    CHECK(r->n_bias == 2 && r->bias_ids[0] == 5 && r->bias[0] == 100.0f && r->bias_ids[1] == 7 &&
              r->bias[1] == -100.0f,
          "logit_bias of one id spelt three ways: %d entries, first %d: %g", r->n_bias, r->n_bias ? r->bias_ids[0] : -1,
          r->n_bias ? (double)r->bias[0] : 0.0);
    srv_request_release(r);
    r = accepted(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logit_bias\":{}}");
    CHECK(r->n_bias == 0, "empty logit_bias: %d", r->n_bias);
    srv_request_release(r);
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"512\":1}}", SRV_PARSE_INVALID, "token ids 0..511");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"-1\":1}}", SRV_PARSE_INVALID, "token ids");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"7x\":1}}", SRV_PARSE_INVALID, "token ids");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"\":1}}", SRV_PARSE_INVALID, "token ids");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"99999999999999999999\":1}}", SRV_PARSE_INVALID,
            "token ids");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"5\":101}}", SRV_PARSE_INVALID, "[-100, 100]");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":{\"5\":\"-100\"}}", SRV_PARSE_INVALID, "[-100, 100]");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"logit_bias\":[[5,-100]]}", SRV_PARSE_INVALID, "must be an object");

    /* a key twice in any object of the body: refused, naming the key
     * (parsers disagree on which value counts) */
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"max_tokens\":1,\"max_tokens\":500}", SRV_PARSE_INVALID,
            "duplicate key \"max_tokens\"");
    refused(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"sparq\":{\"attn\":\"sparq\",\"attn\":\"dense\"}}",
            SRV_PARSE_INVALID, "duplicate key \"attn\"");
    refused(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"role\":\"system\"}]}",
            SRV_PARSE_INVALID, "duplicate key \"role\"");
    refused(SRV_EP_TOKENIZE, "{\"content\":\"a\",\"content\":\"b\"}", SRV_PARSE_INVALID, "duplicate key \"content\"");
    {
        /* 512 times "5": 1 (the sorted check of a large object) */
        text_buf t = { 0 };
        text_append(&t, "{\"prompt\":[1],\"logit_bias\":{", 28);
        for (int i = 0; i < 512; i++) text_append(&t, i ? ",\"5\":1" : "\"5\":1", i ? 6 : 5);
        text_append(&t, "}}", 2);
        CHECK(t.data != NULL, "out of memory");
        if (t.data) refused(SRV_EP_COMPLETIONS, t.data, SRV_PARSE_INVALID, "duplicate key \"5\"");
        free(t.data);
    }

    /* /detokenize: the ids as given; /tokenize of "" without specials: none */
    r = accepted(SRV_EP_DETOKENIZE, "{\"tokens\":[0,511,3]}");
    CHECK(ids_equal(r, (const int32_t[]){ 0, 511, 3 }, 3), "detokenize ids %d", r->n_prompt);
    srv_request_release(r);
    r = accepted(SRV_EP_TOKENIZE, "{\"content\":\"\"}");
    CHECK(r->n_prompt == 0, "tokenize \"\": %d ids", r->n_prompt);
    srv_request_release(r);
}

/* Every field is acted on or refused by name: none is accepted and then
 * ignored (a client asking for JSON output or tool calls must not get a
 * plain 200). The values that ask for the default pass. */
static void test_unsupported_fields(void)
{
    const srv_endpoint C = SRV_EP_COMPLETIONS, H = SRV_EP_CHAT, T = SRV_EP_TOKENIZE, D = SRV_EP_DETOKENIZE;
    const int I = SRV_PARSE_INVALID;
#define MSGS "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
    /* structured output: a bad constraint is refused with what is wrong in it */
    refused(H, MSGS "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}}", I,
            "needs {\"json_schema\": {\"schema\"");
    refused(H, MSGS "\"response_format\":{\"type\":\"text\",\"x\":1}}", I, "unknown field 'x'");
    refused(H, MSGS "\"response_format\":\"text\"}", I, "'response_format' must be an object");
    refused(H, MSGS "\"response_format\":{\"type\":\"yaml\"}}", I, "not one of text, json_object, json_schema");
    refused(H, MSGS "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
                    "{\"type\":\"string\",\"format\":\"date\"}}}}", I, "unsupported keyword 'format'");
    refused(C, "{\"prompt\":[1],\"json_schema\":{\"type\":\"object\",\"patternProperties\":{}}}", I,
            "unsupported keyword 'patternProperties'");
    refused(C, "{\"prompt\":[1],\"grammar\":\"root ::= x\"}", I, "undefined rule 'x'");
    refused(C, "{\"prompt\":[1],\"grammar\":\"root ::= (\\\"a\\\"\"}", I, "grammar: line 1, column");
    refused(C, "{\"prompt\":[1],\"grammar\":3}", I, "'grammar' must be a string");
    refused(C, "{\"prompt\":[1],\"grammar\":\"root ::= .\",\"json_schema\":{}}", I, "at most one of");
    {
        srv_request *r = accepted(C, "{\"prompt\":[1],\"response_format\":{\"type\":\"json_object\"}}");
        CHECK(r && r->grammar && r->gbnf, "json_object compiles a grammar");
        srv_request *c = r ? srv_request_clone(r, 7) : NULL;
        CHECK(c && c->grammar && c->grammar != r->grammar && !strcmp(c->gbnf, r->gbnf), "a clone has its own grammar");
        srv_request_release(c);
        srv_request_release(r);
        r = accepted(H, MSGS "\"grammar\":\"root ::= [a-z]+\"}");
        CHECK(r && r->grammar, "grammar compiled");
        srv_request_release(r);
        r = accepted(H, MSGS "\"response_format\":{\"type\":\"text\"}}");
        CHECK(r && !r->grammar, "text: no grammar");
        srv_request_release(r);
    }
    refused(H, MSGS "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", I, "tools is not supported");
    refused(H, MSGS "\"tool_choice\":\"auto\"}", I, "tool_choice is not supported");
    refused(H, MSGS "\"tool_choice\":\"required\"}", I, "tool_choice is not supported");
    refused(H, MSGS "\"functions\":[{\"name\":\"f\"}]}", I, "functions is not supported");
    refused(H, MSGS "\"function_call\":\"auto\"}", I, "function_call is not supported");
    refused(H, MSGS "\"parallel_tool_calls\":false}", I, "parallel_tool_calls is not supported");
    refused(H, MSGS "\"stream\":true,\"stream_options\":{\"include_usage\":true}}", I,
            "stream_options is not supported");
    refused(H, MSGS "\"echo\":true}", I, "echo is not supported on /v1/chat/completions");
    refused(H, MSGS "\"top_logprobs\":2}", I, "'top_logprobs' needs \"logprobs\": true");
    refused(C, "{\"prompt\":[1],\"top_logprobs\":2}", I, "top_logprobs is not supported on /v1/completions");
    refused(C, "{\"prompt\":[1],\"suffix\":\"end\"}", I, "suffix is not supported");
    refused(C, "{\"prompt\":[1],\"best_of\":3}", I, "best_of is not supported");
    refused(C, "{\"prompt\":[1],\"messages\":[]}", I, "messages is not supported on /v1/completions");
    refused(C, "{\"prompt\":[1],\"temprature\":0}", I, "unknown field 'temprature'");
    refused(C, "{\"prompt\":[1],\"stop\\u0000x\":\"a\"}", I, "unknown field 'stop\\x00x'");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\",\"name\":\"bob\"}]}", I,
            "messages[0].name is not supported");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\",\"x\":1}]}]}", I,
            "messages[0].content parts must be");
    refused(T, "{\"content\":\"a\",\"with_pieces\":true}", I, "with_pieces is not supported");
    refused(T, "{\"content\":\"a\",\"tokens\":[1]}", I, "unknown field 'tokens'");
    refused(D, "{\"tokens\":[1],\"content\":\"a\"}", I, "unknown field 'content'");
    /* the defaults, and null for absent */
    srv_request_release(accepted(H, MSGS "\"response_format\":{\"type\":\"text\"},\"tools\":[],\"tool_choice\":\"none\","
                                        "\"user\":\"u1\",\"suffix\":null,\"stream_options\":null}"));
    srv_request_release(accepted(C, "{\"prompt\":[1],\"response_format\":{\"type\":\"text\"},\"model\":\"m\","
                                    "\"max_completion_tokens\":3}"));
    srv_request_release(accepted(H, MSGS "\"logprobs\":false,\"top_logprobs\":0}"));
#undef MSGS
}

/* n: how many choices, 1 to 16; the default 1. */
static void test_n(void)
{
    srv_request *r = accepted(SRV_EP_COMPLETIONS, "{\"prompt\":[1],\"n\":16,\"seed\":5,\"stop\":[\"a\",\"b\"],"
                                                  "\"logit_bias\":{\"3\":1},\"sparq\":{\"attn\":\"topk\",\"index\":\"exact\"}}");
    CHECK(r->n == 16, "n %d", r->n);
    srv_request *c = srv_request_clone(r, 6);
    CHECK(c && c->seed == 6 && c->n_prompt == 1 && c->prompt != r->prompt && c->prompt[0] == 1 && c->n_stops == 2 &&
              c->stops[1] != r->stops[1] && !strcmp(c->stops[1], "b") && c->n_bias == 1 && c->bias_ids != r->bias_ids &&
              c->bias_ids[0] == 3 && c->attn.policy == c->policy && !strcmp(c->policy, "topk") &&
              c->attn.index == c->index && c->refs == 1,
          "clone of a request");
    srv_request_release(c);
    srv_request_release(r);
    r = accepted(SRV_EP_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}");
    CHECK(r->n == 1, "default n %d", r->n);
    srv_request_release(r);
}

/* The seeds of fuzz_request (scripts/fuzz.sh), each for its endpoint. */
static void test_fuzz_seeds(void)
{
    static const struct { srv_endpoint ep; const char *body; } seeds[] = {
        { SRV_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0.7,"
                              "\"top_p\":0.9,\"top_k\":40,\"seed\":7}" },
        { SRV_EP_COMPLETIONS, "{\"prompt\":[1,400,29,7],\"max_tokens\":4,\"stop\":[\"\\n\",\".\"],\"logprobs\":3,"
                              "\"echo\":true,\"stream\":true}" },
        { SRV_EP_COMPLETIONS, "{\"prompt\":[\"Lily \\u00e9\\ud83d\\ude00\"],\"stop\":\"end\",\"min_p\":0.05,"
                              "\"repeat_penalty\":1.1,\"presence_penalty\":0.5,\"ignore_eos\":true}" },
        { SRV_EP_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
                       "\"Tell a story.\"}],\"logprobs\":true,\"top_logprobs\":2,\"max_completion_tokens\":16}" },
        { SRV_EP_CHAT, "{\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":\"c\"}],\"n\":1}" },
        { SRV_EP_COMPLETIONS, "{\"prompt\":\"x\",\"sparq\":{\"attn\":\"sparq\",\"ratio\":\"1/8\",\"select\":\"logits\","
                              "\"no_realloc\":true,\"l\":4}}" },
        { SRV_EP_COMPLETIONS, "{\"prompt\":\"x\",\"sparq\":{\"attn\":\"topk\",\"index\":\"ivf\",\"topk_k\":32,"
                              "\"schedule\":\"linear\",\"ivf_nlist\":4,\"ivf_nprobe\":2,\"key_type\":\"i8\"}}" },
        { SRV_EP_COMPLETIONS, "{\"prompt\":\"x\",\"sparq\":{\"attn\":\"streaming\",\"attn_k\":64,\"n_sink\":4}}" },
        { SRV_EP_TOKENIZE, "{\"content\":\"Once upon a time\",\"add_special\":true}" },
        { SRV_EP_DETOKENIZE, "{\"tokens\":[1,2,3]}" },
    };
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) srv_request_release(accepted(seeds[i].ep, seeds[i].body));
}

static void test_hostile(void)
{
    const srv_endpoint C = SRV_EP_COMPLETIONS, H = SRV_EP_CHAT, T = SRV_EP_TOKENIZE, D = SRV_EP_DETOKENIZE;
    const int J = SRV_PARSE_BAD_JSON, I = SRV_PARSE_INVALID;
    /* not JSON, or not an object */
    for (int ep = 0; ep < 4; ep++) {
        refused((srv_endpoint)ep, "", J, "json: byte 0: unexpected end of input");
        refused((srv_endpoint)ep, "{\"prompt\":", J, "unexpected end of input");
        refused((srv_endpoint)ep, "{\"prompt\":\"a\"} x", J, "trailing characters after the JSON value");
        refused((srv_endpoint)ep, "{\"prompt\":\"\xc3\x28\"}", J, "invalid UTF-8 in string");
        refused((srv_endpoint)ep, "{\"prompt\":\"\xed\xa0\x80\"}", J, "invalid UTF-8 in string"); /* CESU surrogate */
        refused((srv_endpoint)ep, "{\"prompt\":\"\\ud800\"}", J, "high surrogate \\uD800 not followed by a low surrogate");
        refused((srv_endpoint)ep, "{\"prompt\":\"\\udc00\"}", J, "lone low surrogate \\uDC00");
        refused((srv_endpoint)ep, "{\"prompt\":1e999}", J, "number out of range");
        refused((srv_endpoint)ep, "{\"prompt\":NaN}", J, "unexpected character 'N'");
    }
    /* nesting past the cap of 64 */
    char deep[300] = "{\"prompt\":";
    for (int i = 0; i < 100; i++) strcat(deep, "[");
    refused(C, deep, J, "nesting deeper than 64");
    refused(D, deep, J, "nesting deeper than 64");
    refused(C, "[1,2]", I, "the body must be a JSON object");
    refused(H, "\"hi\"", I, "the body must be a JSON object");
    refused(T, "[\"content\"]", I, "'content' must be a string");
    refused(D, "null", I, "'tokens' must be an array of token ids");

    /* wrong types and values */
    refused(C, "{\"prompt\":[1],\"model\":5}", I, "'model' must be a string");
    refused(C, "{\"prompt\":[1],\"temperature\":\"hot\"}", I, "'temperature' must be a number in [0, 100]");
    refused(C, "{\"prompt\":[1],\"temperature\":-0.5}", I, "'temperature' must be a number in [0, 100]");
    refused(C, "{\"prompt\":[1],\"temperature\":1e308}", I, "'temperature' must be a number in [0, 100]");
    refused(C, "{\"prompt\":[1],\"top_p\":0}", I, "'top_p' must be in (0, 1]");
    refused(C, "{\"prompt\":[1],\"top_p\":1.5}", I, "'top_p' must be a number in [0, 1]");
    refused(C, "{\"prompt\":[1],\"repeat_penalty\":0}", I, "'repeat_penalty' must be a number in [0.01, 100]");
    refused(C, "{\"prompt\":[1],\"top_k\":-1}", I, "'top_k' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"top_k\":2.5}", I, "'top_k' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"seed\":1e19}", I, "'seed' must be an integer in [-9200000000000000000, 9200000000000000000]");
    refused(C, "{\"prompt\":[1],\"seed\":\"7\"}", I, "'seed' must be an integer");
    refused(C, "{\"prompt\":[1],\"n\":0}", I, "'n' must be an integer in [1, 16]");
    refused(C, "{\"prompt\":[1],\"n\":17}", I, "'n' must be an integer in [1, 16]");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":1.5}", I, "'n' must be an integer");
    refused(C, "{\"prompt\":[1],\"max_tokens\":-1}", I, "'max_tokens' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"max_tokens\":-1e300}", I, "'max_tokens' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"max_tokens\":1e300}", I, "'max_tokens' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"max_tokens\":2.5}", I, "'max_tokens' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"max_tokens\":\"8\"}", I, "'max_tokens' must be an integer in [0, 1000000000]");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_completion_tokens\":-5}", I,
            "'max_completion_tokens' must be an integer in [0, 1000000000]");
    refused(C, "{\"prompt\":[1],\"stream\":\"yes\"}", I, "'stream' must be true or false");
    refused(C, "{\"prompt\":[1],\"echo\":1}", I, "'echo' must be true or false");
    refused(C, "{\"prompt\":[1],\"logprobs\":21}", I, "'logprobs' must be an integer in [0, 20]");
    refused(C, "{\"prompt\":[1],\"logprobs\":true}", I, "'logprobs' must be an integer in [0, 20]");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":3}", I, "'logprobs' must be true or false");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logprobs\":true,\"top_logprobs\":21}", I,
            "'top_logprobs' must be an integer in [0, 20]");
    refused(C, "{\"prompt\":[1],\"stop\":7}", I, "'stop' must be a string or an array of at most 8 strings");
    refused(C, "{\"prompt\":[1],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"]}", I,
            "'stop' must be a string or an array of at most 8 strings");
    refused(C, "{\"prompt\":[1],\"stop\":[\"a\",\"\"]}", I, "'stop' strings must be 1 to 256 bytes");
    refused(C, "{\"prompt\":[1],\"stop\":[\"a\",3]}", I, "'stop' strings must be 1 to 256 bytes");
    refused(C, "{\"prompt\":[1],\"stop\":\"a\\u0000b\"}", I, "'stop' strings must be 1 to 256 bytes");
    char longstop[400] = "{\"prompt\":[1],\"stop\":\"";
    for (int i = 0; i < 257; i++) strcat(longstop, "s");
    strcat(longstop, "\"}");
    refused(C, longstop, I, "'stop' strings must be 1 to 256 bytes");

    /* prompts */
    refused(C, "{}", I, "'prompt' must be a string or an array of token ids");
    refused(C, "{\"prompt\":{\"text\":\"a\"}}", I, "'prompt' must be a string or an array of token ids");
    refused(C, "{\"prompt\":[]}", I, "the prompt is empty");
    refused(C, "{\"prompt\":[[]]}", I, "the prompt is empty");
    refused(C, "{\"prompt\":[\"a\",\"b\"]}", I, "'prompt' with several prompts is not supported: send one request each");
    refused(C, "{\"prompt\":[1,512]}", I, "token 1 is not an id in [0, 512)");
    refused(C, "{\"prompt\":[-1]}", I, "token 0 is not an id in [0, 512)");
    refused(C, "{\"prompt\":[1.5]}", I, "token 0 is not an id in [0, 512)");
    refused(C, "{\"prompt\":[1,\"2\"]}", I, "token 1 is not an id in [0, 512)");
    refused(C, "{\"prompt\":[1,1e300]}", I, "token 1 is not an id in [0, 512)");
    refused(C, "{\"prompt\":[1,4294967297]}", I, "token 1 is not an id in [0, 512)"); /* 2^32 + 1: no wrap to 1 */
    refused(D, "{\"tokens\":[5,9,100000]}", I, "token 2 is not an id in [0, 512)");
    refused(D, "{\"tokens\":\"1 2\"}", I, "'tokens' must be an array of token ids");
    /* too many ids, too many bytes */
    char *many = malloc(16 + 2 * (size_t)ENV.max_prompt + 8);
    strcpy(many, "{\"prompt\":[");
    for (int i = 0; i <= ENV.max_prompt; i++) strcat(many, i ? ",1" : "1");
    strcat(many, "]}");
    char want[160];
    snprintf(want, sizeof want, "the prompt has %d tokens; the limit is %d", ENV.max_prompt + 1, ENV.max_prompt);
    refused(C, many, I, want);
    memcpy(many, "{\"tokens\":[", 11); /* same length as {"prompt":[ */
    refused(D, many, I, want);
    free(many);
    /* a text of more bytes than max_prompt tokens can hold (64 a token) */
    const size_t big = (size_t)ENV.max_prompt * 64 + 1;
    char *text = malloc(big);
    memset(text, 'a', big);
    snprintf(want, sizeof want, "the prompt of %zu bytes exceeds the limit of %d tokens", big, ENV.max_prompt);
    char *huge = body_with("{\"prompt\":", text, big, "}");
    refused(C, huge, I, want);
    free(huge);
    huge = body_with("{\"content\":", text, big, "}");
    refused(T, huge, I, want);
    free(huge);
    /* one byte less is tokenized: /tokenize has no token limit of its own */
    huge = body_with("{\"content\":", text, big - 1, "}");
    srv_request_release(accepted(T, huge));
    free(huge);
    free(text);
    refused(T, "{\"content\":\"a\",\"add_special\":\"yes\"}", I, "'add_special' must be true or false");
    refused(T, "{\"content\":7}", I, "'content' must be a string");

    /* chat messages */
    refused(H, "{\"prompt\":\"a\"}", I, "prompt is not supported on /v1/chat/completions");
    refused(H, "{\"messages\":[]}", I, "'messages' must be a non-empty array of {role, content}");
    refused(H, "{\"messages\":{\"role\":\"user\"}}", I, "'messages' must be a non-empty array of {role, content}");
    refused(H, "{\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}", I,
            "messages[0].role must be system, user or assistant");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"b\"}]}", I,
            "messages[1].role must be system, user or assistant");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", I,
            "messages[0].content must be a string or an array of text parts");
    refused(H, "{\"messages\":[{\"role\":\"user\"}]}", I, "messages[0].content must be a string or an array of text parts");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", I, "messages[0].content holds a NUL character");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":\"x\"}]}]}", I,
            "messages[0].content parts must be {\"type\": \"text\", \"text\": ...}");
    refused(H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\\u0000\"}]}]}", I,
            "messages[0].content parts must be");
    refused(H, "{\"messages\":[\"hello\"]}", I, "messages[0].role must be system, user or assistant");
    refused(H, "{\"messages\":[{\"role\":\"user\\u0000x\",\"content\":\"a\"}]}", I,
            "messages[0].role must be system, user or assistant");
    /* 1025 messages: over the cap */
    {
        char *b = malloc(1025 * 40 + 64);
        strcpy(b, "{\"messages\":[");
        for (int i = 0; i < 1025; i++) strcat(b, i ? ",{\"role\":\"user\",\"content\":\"a\"}" : "{\"role\":\"user\",\"content\":\"a\"}");
        strcat(b, "]}");
        refused(H, b, I, "'messages' must be a non-empty array of {role, content}");
        free(b);
    }

    /* the "sparq" extension */
    refused(C, "{\"prompt\":[1],\"sparq\":\"sparq\"}", I, "'sparq' must be an object such as");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"bogus\":1}}", I, "'sparq' has an unknown field 'bogus'");
    /* client bytes in a message are escaped: one line, no NUL cutting it */
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\\u0000x\":\"sparq\"}}", I,
            "'sparq' has an unknown field 'attn\\x00x' (known: attn");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"a\\nb\\u001b[31m\":1}}", I, "'sparq' has an unknown field 'a\\x0ab\\x1b[31m'");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"nope\\n\"}}", I, "'sparq.attn' must be a short string of printable");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"topk\",\"schedule\":\"x\\ny\"}}", I,
            "'sparq.schedule' must be a short string of printable characters");
    char longkey[300] = "{\"prompt\":[1],\"sparq\":{\"";
    for (int i = 0; i < 63; i++) strcat(longkey, "k");
    strcat(longkey, "\u00e9\":1}}"); /* a 2-byte character across the 64-byte cut: left out whole */
    char want_key[128] = "unknown field '";
    for (int i = 0; i < 63; i++) strcat(want_key, "k");
    strcat(want_key, "' (known");
    refused(C, longkey, I, want_key);
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"nope\"}}", I, "unknown attention policy 'nope' (known: dense");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":5}}", I, "'sparq.attn' must be a short string");
    /* a NUL would end the name early: "sparq\0x" is not "sparq" */
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"sparq\\u0000x\"}}", I, "'sparq.attn' must be a short string");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"topk\",\"index\":\"exact\\u0000\"}}", I,
            "'sparq.index' must be a short string");
    char longname[200] = "{\"prompt\":[1],\"sparq\":{\"attn\":\"";
    for (int i = 0; i < 65; i++) strcat(longname, "d");
    strcat(longname, "\"}}");
    refused(C, longname, I, "'sparq.attn' must be a short string");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"k\":-5}}", I, "'k' must be an integer in [0, 16777216]");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"l\":-2}}", I, "'l' must be an integer in [-1, 16777216]");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"topk_k\":1e12}}", I, "'topk_k' must be an integer in [0, 16777216]");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"no_realloc\":\"yes\"}}", I, "'no_realloc' must be true or false");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"adaptive_k\":1}}", I, "'adaptive_k' must be true or false");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"k_min\":-1}}", I, "'k_min' must be an integer in [0, 16777216]");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"sparq\",\"k_min\":4}}", I,
            "--sparq-k-min applies only with --sparq-adaptive-k");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"sparq\",\"ratio\":\"abc\"}}", I,
            "--sparq-ratio 'abc' must be a fraction in (0, 1]");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"topk\",\"schedule\":\"fast\"}}", I,
            "--topk-schedule must be uniform or linear, not 'fast'");
    refused(C, "{\"prompt\":[1],\"sparq\":{\"attn\":\"streaming\",\"attn_k\":8,\"n_sink\":8}}", I,
            "--n-sink 8 must be smaller than the positions kept (--attn-k 8)");
}

int main(void)
{
    char path[1024], err[512];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        test_skip("stories260K.gguf not found on the model path (reference data)");
        return test_summary("test_request");
    }
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load %s: %s", path, err);
        return test_summary("test_request");
    }
    n_vocab = sparq_model_n_vocab(m);
    CHECK(n_vocab == 512, "stories260K has %d tokens, the messages below say 512", n_vocab);
    /* as `sparq serve -c 256 --max-prompt 200` sets it up */
    ENV.model = m;
    ENV.n_ctx = 256;
    ENV.max_prompt = 200;
    ENV.chat_template = "chatml";
    attn_opts ao;
    attn_opts_init(&ao);
    CHECK(attn_opts_params(&ao, ENV.n_ctx, sparq_model_head_dim(m), &ENV.attn, err, sizeof err) == 0, "%s", err);

    test_text_prompts();
    test_fields();
    test_fuzz_seeds();
    test_unsupported_fields();
    test_n();
    test_hostile();

    sparq_model_free(m);
    return test_summary("test_request");
}
