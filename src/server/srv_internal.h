/* srv_internal.h - what the server's files share: the request record
 * and the server state, between server.c (HTTP) and the scheduler thread
 * (sched.c, seq.c, prefix_cache.c, kv_writer.c). Every field marked
 * [lock] is read and written only under srv_server.lock. */
#ifndef SPARQ_SRV_INTERNAL_H
#define SPARQ_SRV_INTERNAL_H

#include "server/srv_config.h"
#include "server/srv_clock.h"
#include "util/textbuf.h"

#include <pthread.h>
#include <signal.h>

typedef struct srv_server srv_server;

enum { SRV_MAX_STOPS = 8, SRV_MAX_TOP = 20, SRV_MAX_POLICIES = 32, SRV_MAX_PREFIX_ID = 128 };
/* choices per request ("n"): each is a sequence of its own */
enum { SRV_MAX_N = 16 };
enum { REQ_QUEUED = 0, REQ_RUNNING = 1, REQ_DONE = 2 };

/* One generated (or, with echo, prompt) token as the client sees it. */
typedef struct srv_token {
    int32_t id;
    float   logprob;            /* NAN: none (the first prompt token)       */
    size_t  text_off;           /* where its piece starts in the text       */
    int     n_top;
    int32_t top_id[SRV_MAX_TOP];
    float   top_lp[SRV_MAX_TOP];
} srv_token;

typedef struct srv_request {
    /* set by the HTTP thread before submission, then read-only */
    int      chat, stream, echo;
    int32_t *prompt;
    int      n_prompt;
    int      max_tokens;
    sparq_attn_params attn;
    char     policy[32], index[16];   /* storage for attn.policy / attn.index */
    float    temp, top_p, min_p, rep_pen, freq_pen, pres_pen;
    int      top_k, ignore_eos;
    uint64_t seed;
    int      n;                 /* choices asked for ("n", 1..SRV_MAX_N)    */
    char    *stops[SRV_MAX_STOPS];
    int      n_stops;
    int      logprobs;          /* -1: none; else top alternatives per token */
    int32_t *bias_ids;          /* "logit_bias": [n_bias] ids and biases     */
    float   *bias;
    int      n_bias;
    /* "grammar" / "json_schema" / "response_format" json_object or
     * json_schema: the constraint as GBNF text and compiled (each clone
     * compiles its own copy); NULL: free text */
    char    *gbnf;
    sparq_grammar *grammar;
    double   deadline;          /* monotonic seconds                        */
    int      waited;            /* [sched] counted once in prefix_waits      */
    char     prefix_id[SRV_MAX_PREFIX_ID + 1]; /* "sparq.prefix_id", or ""  */
    int      doc;               /* the --load-kv document prefix_id names,
                                 * which the prompt continues; -1: none     */
    /* [lock] progress published by the scheduler */
    int      state;
    int      cancelled;         /* client gone, timeout or shutdown          */
    text_buf text;              /* the reply so far (echoed prompt first)   */
    size_t   text_ok;           /* bytes of text that are final             */
    srv_token *toks;
    int      n_toks, cap_toks;
    int      n_ok_toks;         /* tokens whose text is final               */
    int      n_gen;             /* generated tokens                         */
    int      n_prompt_tokens;   /* for usage                                */
    int      n_cached;          /* prompt tokens mapped from a cached prefix */
    double   t_admit, t_prefilled, t_done; /* monotonic seconds (0: not yet) */
    int64_t  kv_read, kv_dense; /* decode attention's KV elements read, and
                                 * what dense attention reads for the same
                                 * steps (sparq_attn_stats), when done      */
    const char *finish;         /* "stop" / "length" when done              */
    int      err_status;        /* non-zero: failed with this HTTP status   */
    char     error[512];
    int      refs;              /* HTTP thread + scheduler                  */
    struct srv_request *next;   /* queue link                               */
} srv_request;

typedef struct srv_metrics {
    int64_t requests, errors, rejected, cancelled;
    int64_t prefill_tokens, decode_tokens;
    double  prefill_seconds, decode_seconds;
    int64_t prefix_hits, prefix_tokens;
    int64_t prefix_waits;       /* requests that waited for an in-flight prefill */
    int64_t tails_batched;      /* one-token last chunks prefilled together  */
    int64_t contexts_reused;    /* requests run in their slot's last context */
    int64_t prefix_entries, prefix_bytes, prefix_users; /* gauges: the cache now */
    int64_t kv_dir_hits, kv_dir_tokens, kv_dir_writes, kv_dir_evictions, kv_dir_errors;
    int64_t kv_dir_skipped;     /* writes not queued: the writer's queue was full */
    int64_t kv_dir_pending;     /* gauge: writes queued or being written now   */
    int64_t attn_bytes[SRV_MAX_POLICIES]; /* by policy, in registry order */
} srv_metrics;

/* GET /slots: what each slot shows; sched.c publishes it, slots.c writes
 * it. [lock] */
typedef struct srv_slot_pub {
    const srv_request *r;       /* the request running there, or NULL       */
    int      used;              /* a request ran there: the fields below are
                                 * its (the last one's when idle)          */
    uint64_t id_task;           /* its admission number                     */
    float    temp, top_p, min_p, rep_pen, pres_pen, freq_pen;
    int      top_k, max_tokens, ignore_eos, stream, n_probs, n_decoded;
    uint64_t seed;
    int      n_cache;           /* positions the slot's cache holds (kept
                                 * after a request with --slot-save-path)  */
} srv_slot_pub;

/* POST /slots/ID?action=save|restore|erase: made by the HTTP thread (which
 * owns it and waits), queued for the scheduler, which owns the caches and
 * runs it once the slot is idle (a busy slot's action waits, as
 * llama-server defers it). */
enum { SLOT_SAVE, SLOT_RESTORE, SLOT_ERASE };
typedef struct srv_slot_action {
    int      kind, slot;
    char     path[4352];        /* --slot-save-path/filename               */
    /* [lock] */
    int      started, done, status; /* status: the HTTP status once done   */
    char     error[320];
    int64_t  n_tokens, bytes;   /* positions saved/restored/erased; file size */
    double   ms;
    struct srv_slot_action *next;
} srv_slot_action;

struct srv_server {
    sparq_model    *model;
    srv_config      cfg;
    struct MHD_Daemon *daemon;
    pthread_t       sched;
    int             sched_started;
    pthread_mutex_t lock;
    pthread_cond_t  wake_sched;  /* new work or stop                       */
    pthread_cond_t  progress;    /* broadcast after every scheduler round  */
    srv_request    *queue_head, *queue_tail;   /* [lock] */
    int             n_queued, n_active;        /* [lock] */
    int             n_attached;  /* [lock] requests whose connection is open */
    int             stopping;    /* [lock] 1: no new work; 2: cancel all   */
    srv_metrics     metrics;     /* [lock] */
    unsigned long long n_requests; /* [lock] HTTP requests seen (the log's ids) */
    struct srv_sock *socks;      /* [lock] open connections (server.c)      */
    int             n_socks;     /* [lock]                                  */
    pthread_t       watchdog;    /* cuts connections past the read deadline */
    int             watchdog_started;
    pthread_cond_t  wake_watchdog;
    int             port;
    double          t_start;
    int             n_vocab;
    srv_slot_pub   *slot_pub;    /* [lock] [cfg.parallel]                   */
    srv_slot_action *actions;    /* [lock] slot actions waiting or running  */
};


/* Drops one reference (frees at zero; request.c, beside what allocates
 * it). Call with the lock held. */
void srv_request_release(srv_request *r);
/* Queues r (refs taken for the scheduler); returns 0, or -1 if the queue is
 * full or the server is stopping. Lock held. */
int  srv_submit(srv_server *s, srv_request *r);
void *srv_sched_main(void *arg);
/* GET /props (props.c): the body, malloc'ed, *len bytes; NULL when out of
 * memory. Reads only what srv_start fixed, so no lock is needed. */
char *srv_props_json(const srv_server *s, size_t *len);
/* GET /slots (slots.c): the body, malloc'ed; NULL when out of memory. */
char *srv_slots_json(srv_server *s, size_t *len);
/* POST /slots/ID?action=A (slots.c): id and action as the URL gave them,
 * the body {"filename": NAME}; the HTTP status, 200 with the response in
 * *out, else the reason in err (and in *code an OpenAI error type). */
int  srv_slot_request(srv_server *s, const char *id, const char *action, const char *body, size_t len, char **out,
                      size_t *out_len, const char **code, char *err, size_t err_size);
/* The scheduler's side (sched.c calls it, lock not held): loads the KV file
 * of a restore, with its token ids (malloc'ed, *n of them), as a context
 * of its own in memory; NULL with the reason (and *status 400 or 404). */
sparq_context *srv_slot_load(srv_server *s, const char *path, int32_t **ids, int *n, int *status, char *err,
                             size_t err_size);

/* POST /v1/embeddings (embeddings.c): the HTTP status; 200 with the
 * malloc'ed response in *out (*out_len bytes), else the one-line reason in
 * err (501: the server was started without --embedding). */
int srv_embeddings(srv_server *s, const char *body, size_t len, char **out, size_t *out_len, char *err,
                   size_t err_size);

#endif
