/* srv_config.h - what `sparq serve` is started with: the options the
 * command parses and every server module reads. A header of its own, below
 * server.h, so the server's shared state (srv_internal.h) can hold a copy
 * without building on the HTTP front's header. */
#ifndef SPARQ_SRV_CONFIG_H
#define SPARQ_SRV_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"

/* a --load-kv document (server/docs.h) */
typedef struct srv_doc srv_doc;

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

#endif
