/* server.h - `sparq serve`: an OpenAI-compatible HTTP server over one model
 * with continuous batching (server.c: HTTP and JSON; sched.c: the
 * scheduler thread that prefills and decodes the running sequences).
 *
 * One scheduler thread owns every context. An HTTP request is parsed and
 * validated on its connection's thread, becomes an srv_request in a bounded
 * queue, and waits for what the scheduler publishes under the server lock
 * (text so far, token log-probabilities, the finish reason). Each admitted
 * request gets its own context (KV cache, attention policy with its own
 * parameters) over the shared model; its prompt is prefilled one n_batch
 * chunk per scheduler round, interleaved with one batched decode step of
 * every running sequence (sparq_decode_batch, batch-invariant), so a
 * request's tokens do not depend on what else the server is doing.
 */
#ifndef SPARQ_SERVER_H
#define SPARQ_SERVER_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "sparq.h"
#include "server/docs.h"

typedef struct srv_config {
    const char *host;           /* listen address (default 127.0.0.1)         */
    int         port;           /* 0: pick a free one (printed on stderr)      */
    int         parallel;       /* sequences decoded together (slots)          */
    int         queue;          /* requests waiting beyond the slots           */
    int64_t     n_ctx;          /* per-sequence context                        */
    int         n_threads, n_batch, kv_type;
    sparq_attn_params attn;     /* default attention policy                    */
    const char *api_key;        /* NULL: open                                  */
    const char *model_id;       /* the "model" name reported                   */
    const char *chat_template;  /* NULL: from the GGUF                         */
    int         chat_template_fallback; /* 1: the GGUF has none; chat_template
                                 * is the default chosen for it (chatml)      */
    const char *model_path;     /* the GGUF as opened (/props)                 */
    const char *build_info;     /* "VERSION (commit ...)" (/props)             */
    size_t      max_body;       /* bytes                                       */
    int         max_prompt;     /* tokens                                      */
    double      timeout;        /* seconds per request                         */
    const char *port_file;      /* write the bound port here (tests)           */
    size_t      prefix_cache_bytes; /* 0: no prefix cache                     */
    const char *kv_dir;         /* NULL: prefixes are not saved as KV files    */
    size_t      kv_dir_bytes;   /* the directory's budget (0: unlimited)       */
    int         max_conns;      /* open connections before 503 (0: parallel + queue + 64) */
    int         max_conns_per_ip; /* from one address before 503 (0: no limit) */
    double      read_timeout;   /* seconds for a request's head and body (0: 30) */
    const char *slot_save_path; /* POST /slots/ID?action=save|restore: its
                                 * directory; NULL: those answer 501       */
    int         no_slots;       /* 1: GET /slots answers 501 (--no-slots)      */
    int         embedding;      /* 1: /v1/embeddings answers (else 501)        */
    int         pooling;        /* its SPARQ_POOLING_*                         */
    int         embd_normalize; /* its default norm (sparq_embed; 2 = L2)      */
    const srv_doc *docs;        /* --load-kv: documents continued by name      */
    int         n_docs;
    const char *prefill_gate;   /* tests only (SPARQ_TEST_PREFILL_GATE): a FIFO;
                                 * while a writer holds it open, every prefill
                                 * chunk and decode step waits for one byte
                                 * from it, so a test can hold a request
                                 * mid-prefill or mid-stream without racing
                                 * the clock; no writer: no wait; NULL: none.
                                 * A server held at the gate cannot stop:
                                 * the writer must close first            */
} srv_config;

typedef struct srv_server srv_server;

/* Starts the scheduler and the HTTP daemon; returns NULL with a message. */
srv_server *srv_start(sparq_model *m, const srv_config *cfg, char *err, size_t err_size);
int  srv_port(const srv_server *s);
/* Stops accepting work, waits up to grace seconds for running requests,
 * cancels the rest, and frees everything. */
void srv_stop(srv_server *s, double grace);

#endif
