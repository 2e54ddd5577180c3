/* request.h - parsing and validating the body of a server request
 * (request.c), apart from HTTP: server.c calls it on each connection's
 * thread; tests/test_request.c and fuzz/fuzz_request.c call it directly
 * with no daemon and no scheduler.
 *
 * The body is untrusted: strict JSON (util/json.c: RFC 8259, UTF-8 checked,
 * depth capped), every field type- and range-checked, every count bounded by
 * the limits in the environment. A failure leaves a one-line reason in err.
 */
#ifndef SPARQ_SRV_REQUEST_H
#define SPARQ_SRV_REQUEST_H

#include "server/srv_internal.h"

typedef enum srv_endpoint {
    SRV_EP_COMPLETIONS,         /* /v1/completions: "prompt"              */
    SRV_EP_CHAT,                /* /v1/chat/completions: "messages"       */
    SRV_EP_TOKENIZE,            /* /tokenize: "content", "add_special"    */
    SRV_EP_DETOKENIZE,          /* /detokenize: "tokens"                  */
} srv_endpoint;

/* What parsing needs and nothing more (the server fills it from its
 * srv_config after srv_start's defaults). */
typedef struct srv_parse_env {
    sparq_model      *model;         /* tokenizer, vocabulary, head size      */
    int64_t           n_ctx;         /* per-sequence context (> 0)            */
    int               max_prompt;    /* tokens (1 .. n_ctx - 1)               */
    sparq_attn_params attn;          /* the policy when "sparq" is absent     */
    const char       *chat_template; /* NULL: from the GGUF                   */
    const srv_doc    *docs;          /* --load-kv documents (prefix_id names) */
    int               n_docs;
} srv_parse_env;

/* Results of srv_parse_request; the server maps them to HTTP status and
 * error code (400 invalid_json / invalid_request / context_length_exceeded). */
enum { SRV_PARSE_OK = 0, SRV_PARSE_BAD_JSON = 1, SRV_PARSE_INVALID = 2, SRV_PARSE_TOO_LONG = 3 };

/* Parses body[0..len) for endpoint ep into r, which the caller zeroed.
 * Completions and chat fill every field "set by the HTTP thread" in
 * srv_request except deadline (prompt, sampling, stops, attention, limits);
 * tokenize and detokenize fill only prompt/n_prompt (the ids, possibly none).
 * What it allocates (prompt, stops) is freed by srv_request_release (or,
 * for the tokenize endpoints, free(r->prompt)), also after a failure, which
 * may leave them partly set. */
int srv_parse_request(const srv_parse_env *env, srv_endpoint ep, const char *body, size_t len, srv_request *r,
                      char *err, size_t err_size);

/* A copy of r, parsed and not yet submitted, for one more of its n choices:
 * its own prompt, stops and biases, and seed; NULL when out of memory. */
srv_request *srv_request_clone(const srv_request *r, uint64_t seed);

#endif
