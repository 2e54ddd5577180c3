/* sparq.h - public API of the sparq inference engine.
 *
 * sparq runs GGUF language models (llama-family) on the CPU and makes long-
 * context decoding fast by reading only the part of the KV cache that
 * matters (SparQ Attention; top-k attention over a key index).
 *
 * Usage (C or Python ctypes):
 *   sparq_model *m;   sparq_model_load("model.gguf", &m, err, sizeof err);
 *   sparq_context_params cp = sparq_context_default_params();
 *   sparq_context *c; sparq_context_create(m, &cp, &c, err, sizeof err);
 *   int n = sparq_tokenize(m, "Once upon a time", -1, 1, ids, 512);
 *   sparq_eval(c, ids, n, logits_last);          // prefill
 *   ... pick next id ..., sparq_eval(c, &id, 1, logits_last);   // decode
 *   sparq_context_free(c); sparq_model_free(m);
 *
 * Conventions: functions returning int return 0 (or a count) on success and
 * -1 on failure with a one-line message in err[err_size]. The library never
 * prints to stdout and never exits. x_free(NULL) is a no-op. A model may be
 * shared by several contexts; a context is used by one thread at a time
 * (it spreads its own work over n_threads).
 */
#ifndef SPARQ_H
#define SPARQ_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Every public function carries SPARQ_API: the library is compiled with
 * -fvisibility=hidden, so libsparq.so exports these and nothing else
 * (a declaration without it links statically but is missing from the .so;
 * tests/test_install.c checks every declared sparq_ function is exported). */
#ifndef SPARQ_API
#if defined(__GNUC__) || defined(__clang__)
#define SPARQ_API __attribute__((visibility("default")))
#else
#define SPARQ_API
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sparq_model   sparq_model;
typedef struct sparq_context sparq_context;

/* ---- attention policy parameters ------------------------------------- */

/* Which positions a decode step reads. Fields left at 0 (or -1 for l) take
 * the policy's defaults when the context is created (docs/ALGORITHMS.md):
 * SparQ r = d/4, k = 128, l = k/4. */
typedef struct sparq_attn_params {
    const char *policy;     /* "dense" (NULL = dense), "sparq", "oracle",
                               "flexgen", "h2o", "streaming", ...          */
    int r;                  /* SparQ: query components used for scoring   */
    int k;                  /* positions kept per step (all policies)     */
    int l;                  /* SparQ local window (-1 = k/4); H2O recent  */
    int select_logits;      /* SparQ: select by summed logits, not probs  */
    int no_realloc;         /* SparQ: alpha = 1 (no mean-value realloc)   */
    int n_sink;             /* streaming: sink positions (0 = 16)         */
    /* top-k attention over a key index ("topk"): the prefix (positions
     * before the first decode step, or before sparq_context_mark_prefix)
     * is searched in a per-(layer, KV head) index, the rest is dense. k is
     * the budget per query head; r the components of the "sparq" index.  */
    const char *index;      /* "exact" (NULL = exact), "ivf", "hnsw", "sparq" */
    int topk_schedule;      /* SPARQ_TOPK_UNIFORM: k in every layer;
                               SPARQ_TOPK_LINEAR: ramps up, same total     */
    int index_key_type;     /* exact/ivf keys: SPARQ_KEY_* (0 = f16)       */
    int ivf_nlist;          /* 0 = round(sqrt(prefix))                     */
    int ivf_nprobe;         /* 0 = max(8, nlist/16)                        */
    int hnsw_ef_search;     /* 0 = 64 (raised to k)                        */
    int topk_check;         /* count recall@k against exact top-k (slow)   */
    int select_always;      /* SparQ/oracle: select even when k >= S, where
                               they otherwise run dense attention; selecting
                               every position must equal dense (tests)     */
    /* SparQ, per-head adaptive k (off by default, docs/ALGORITHMS.md
     * "Per-head adaptive k"): each query head of a KV head's group gets its
     * own k_h, in proportion to the entropy of its approximate scores, the
     * group's total g*k kept, each k_h in [k_min, S]; each head selects by
     * its own scores and the group reads the union once.                   */
    int adaptive_k;         /* 1: on                                        */
    int k_min;              /* smallest k_h (0 = min(k, l + 1)); l <= k_min <= k */
} sparq_attn_params;

enum { SPARQ_TOPK_UNIFORM = 0, SPARQ_TOPK_LINEAR = 1 };
enum { SPARQ_KEY_DEFAULT = 0, SPARQ_KEY_F16 = 1, SPARQ_KEY_BF16 = 2, SPARQ_KEY_I8 = 3 };

SPARQ_API sparq_attn_params sparq_attn_default_params(void);
/* SparQ at a transfer ratio: ratio ("1/8", "0.125", "1": a fraction in
 * (0, 1]) of dense attention's bytes per decode step at context length
 * n_ctx and head size head_dim, split as the SparQ paper does (the
 * formulas of docs/ALGORITHMS.md "Transfer formulas", S*r + 2*k*d + 4*d
 * against dense's 2*S*d + 2*d): r = max(1, round(head_dim * ratio)), then the largest k <= n_ctx within the
 * budget. Sets p->r and p->k, and p->l = k/4 when p->l < 0; p->policy must
 * be "sparq". `what` names the ratio in messages (an option name such as
 * "--sparq-ratio"; NULL: "ratio"). Returns 0, or -1 with a message (not a
 * fraction, another policy, or not even k = 1 fits), p unchanged. The
 * command's --sparq-ratio and the server's "ratio" use it. */
SPARQ_API int sparq_attn_params_from_ratio(sparq_attn_params *p, const char *ratio, int64_t n_ctx, int head_dim,
                                           const char *what, char *err, size_t err_size);
/* The registered policies, in registry order: name i (NULL past the end)
 * and its one-line summary, for help text, validation and metrics. */
SPARQ_API int         sparq_attn_policy_count(void);
SPARQ_API const char *sparq_attn_policy_name(int i);
SPARQ_API const char *sparq_attn_policy_summary(int i);
/* 1 if policy i observes the prefill (its state comes from the prompt's
 * attention, e.g. h2o): such a context cannot start from a copied or shared
 * prefix. 0 otherwise, -1 past the end. */
SPARQ_API int         sparq_attn_policy_observes_prefill(int i);

/* ---- model ----------------------------------------------------------- */

/* Loads a GGUF file and validates it (architecture, tensors, tokenizer).
 * The file is read into anonymous memory backed by huge pages when it
 * takes at most half of the machine's RAM (decode reads every weight once
 * per token and runs faster from huge pages), else memory-mapped. */
/* A path without a '/' is also looked up on the model search path:
 * $SPARQ_MODEL_PATH, then models/ and share/sparq/models/ beside the
 * library's directory (where `make install` puts the default model). */
SPARQ_API int  sparq_model_load(const char *path, sparq_model **out, char *err, size_t err_size);

typedef struct sparq_model_params {
    int use_mmap; /* 1: always map the file (less memory, slower decode);
                     0: the default rule of sparq_model_load */
    int no_repack; /* 1: keep Q8_0 matrices as stored; 0 (default):
                      repack them at load for the GEMM tiles (same bytes;
                      the file's copy is released), which every product
                      then reads: faster prefill and batched decode, and
                      results identical alone or in any batch */
} sparq_model_params;
SPARQ_API sparq_model_params sparq_model_default_params(void);
SPARQ_API int  sparq_model_load_params(const char *path, const sparq_model_params *p, sparq_model **out,
                             char *err, size_t err_size);
SPARQ_API void sparq_model_free(sparq_model *m);

SPARQ_API int     sparq_model_n_vocab(const sparq_model *m);
SPARQ_API int     sparq_model_n_layer(const sparq_model *m);
SPARQ_API int     sparq_model_n_head(const sparq_model *m);
SPARQ_API int     sparq_model_n_kv_head(const sparq_model *m);
SPARQ_API int     sparq_model_head_dim(const sparq_model *m);
SPARQ_API int64_t sparq_model_n_ctx_train(const sparq_model *m);
SPARQ_API const char *sparq_model_arch(const sparq_model *m);
SPARQ_API int     sparq_model_n_embd(const sparq_model *m); /* hidden size: an embedding's length */

/* Tokenizes text (len < 0: NUL-terminated). add_special: BOS/EOS as the
 * vocabulary asks. Returns the number of ids of the full encoding (which
 * may exceed max_ids; only max_ids are written), or -1. */
SPARQ_API int sparq_tokenize(const sparq_model *m, const char *text, int len, int add_special,
                   int32_t *ids, int max_ids);
/* Bytes of one token as printed (no NUL); returns full length or -1. */
SPARQ_API int sparq_token_to_piece(const sparq_model *m, int32_t id, char *buf, int buf_size);
SPARQ_API int sparq_token_bos(const sparq_model *m);
SPARQ_API int sparq_token_eos(const sparq_model *m);
SPARQ_API int sparq_token_is_eog(const sparq_model *m, int32_t id);

/* Chat prompts. tmpl: "llama3", "chatml", "mistral", "gemma", or NULL to
 * detect it from the model's tokenizer.chat_template. Renders the messages
 * (plus the opening of the assistant's reply if add_assistant) and
 * tokenizes them with the template's special tokens. Returns the id count
 * (may exceed max_ids), or -1 with a message (unknown template). */
typedef struct sparq_chat_msg { const char *role, *content; } sparq_chat_msg;
SPARQ_API int sparq_chat_tokenize(const sparq_model *m, const char *tmpl, const sparq_chat_msg *msgs,
                        int n_msgs, int add_assistant, int32_t *ids, int max_ids,
                        char *err, size_t err_size);
/* The template family read from the model's tokenizer.chat_template
 * ("llama3", "chatml", ...), or NULL when it has none sparq recognises:
 * base models, stories260K. Front ends that fall back to a default (as
 * llama-cli and llama-server fall back to chatml) ask this first. */
SPARQ_API const char *sparq_model_chat_template(const sparq_model *m);

/* ---- context: KV cache + scratch for one sequence --------------------- */

/* SPARQ_KV_Q8_0: K, V (and SparQ's K^T) as Q8_0 blocks of 32 with f16
 * scales, 1.0625 bytes an element; not yet storable in KV files. */
enum { SPARQ_KV_F32 = 0, SPARQ_KV_F16 = 1, SPARQ_KV_Q8_0 = 2 };

/* Attention during a prefill (sparq_eval with n > 1, sparq_eval_prefill).
 * Exact attention over N tokens costs O(N^2); for a cache of a million
 * tokens the sparse modes bound each query's work (docs/ALGORITHMS.md "Sparse prefill"):
 *   SPARQ_PREFILL_EXACT   every earlier position (the default)
 *   SPARQ_PREFILL_WINDOW  the n_sink first positions and a window of at
 *                         least `window` positions before each query block
 *   SPARQ_PREFILL_TOPK    those, plus the k older positions that score
 *                         highest for the block's queries (per query head,
 *                         the block's mean query; the union over the
 *                         group's heads), found through an inverted file of
 *                         the older keys grown as the chunks go.
 *   SPARQ_PREFILL_POLICY  every token one decode step through the
 *                         context's attention policy: for a short prompt
 *                         after a long cached prefix (a question about a
 *                         loaded book), whose exact prefill would read the
 *                         whole cache per token; a topk policy reads the
 *                         prefix's stored index instead.
 * A window reaching position 0, or k at least the older positions, gives
 * the exact prefill bit for bit. */
enum { SPARQ_PREFILL_EXACT = 0, SPARQ_PREFILL_WINDOW = 1, SPARQ_PREFILL_TOPK = 2, SPARQ_PREFILL_POLICY = 3 };
typedef struct sparq_prefill_params {
    int mode;     /* SPARQ_PREFILL_*                                         */
    int window;   /* positions before a query block (0 = 1024)               */
    int n_sink;   /* first positions every query sees (0 = 16)               */
    int k;        /* topk: older positions per query head and block (0 = 256) */
    int nlist;    /* topk: inverted lists (0 = 2 sqrt(n_ctx), in [16, 4096])  */
    int nprobe;   /* topk: lists probed per block (0 = 16)                   */
} sparq_prefill_params;

/* Name of mode i ("exact", "window", "topk", "policy"; NULL past the end), and the
 * mode named `name` (-1 if none): the one list help text and parsers use. */
SPARQ_API const char *sparq_prefill_mode_name(int i);
SPARQ_API int         sparq_prefill_mode_find(const char *name);
/* p with its zero fields replaced by the defaults for a context of n_ctx
 * positions (what a context created with p uses). */
SPARQ_API sparq_prefill_params sparq_prefill_resolve(const sparq_prefill_params *p, int64_t n_ctx);

typedef struct sparq_context_params {
    int64_t n_ctx;          /* KV capacity in tokens (0 = model's trained);
                               the cache is address space committed as
                               tokens arrive, but the attention scratch
                               (threads x n_ctx) is allocated at creation:
                               more than the RAM is refused there        */
    int     n_threads;      /* 0 = the physical cores (as llama.cpp)        */
    int     n_batch;        /* prefill tokens per batch (0 = 512)           */
    int     kv_type;        /* SPARQ_KV_F16 (default), _F32 or _Q8_0        */
    sparq_attn_params attn; /* decode attention policy                      */
    /* Optional progress callback for prefills (tokens done, total); not
     * called for single-token decode steps. */
    void  (*progress)(void *user, int64_t done, int64_t total);
    void   *progress_user;
    /* Optional: checked between batches; non-zero aborts the eval. */
    volatile sig_atomic_t *abort_flag;
    sparq_prefill_params prefill; /* prefill attention (exact by default)  */
} sparq_context_params;

SPARQ_API sparq_context_params sparq_context_default_params(void);

SPARQ_API int  sparq_context_create(sparq_model *m, const sparq_context_params *p,
                          sparq_context **out, char *err, size_t err_size);

/* A context whose KV cache is built in place in the KV cache file `path`
 * (docs/KVFILE.md) that will hold the document tokens[0..n_prefix) with
 * the index kinds `indexes`: what the prefill stores goes to the file's
 * pages, written back by the kernel, so private memory stays about
 * constant however long the context (a million tokens of smollm2 are
 * ~12 GB of q8_0 cache). The free disk space is checked first. Until it
 * is finished the file is path.tmp, and after every batch it records how
 * far the prefill got. It is finished (checksums, indexes and header
 * written, renamed to path) by sparq_context_save_kv(c, path, indexes,
 * tokens, n_prefix) once the cache holds the document; the context then
 * goes on over a private mapping of it.
 * flags: SPARQ_IN_FILE_KEEP: freed unfinished, path.tmp stays (else it is
 * removed); SPARQ_IN_FILE_RESUME: continue the partial path.tmp of the
 * same model, document, shape and indexes, its positions already cached
 * (sparq_context_pos says how many; evaluate the rest). Returns 0, -1 on
 * errors, or with RESUME 1 when there is nothing to continue (err says
 * why; the partial file is left as it was). A sparse prefill's index is
 * rebuilt from the cached keys on resume, so the rest of its selections
 * may differ from an uninterrupted run's; an exact prefill's do not. */
enum { SPARQ_IN_FILE_KEEP = 1, SPARQ_IN_FILE_RESUME = 2 };
SPARQ_API int  sparq_context_create_in_file(sparq_model *m, const sparq_context_params *p, const char *path,
                                  const int32_t *tokens, int64_t n_prefix, const char *indexes, int flags,
                                  sparq_context **out, char *err, size_t err_size);SPARQ_API void sparq_context_free(sparq_context *c);

/* Appends n tokens at the current position and runs the model. n > 1 is a
 * prefill (exact dense attention, batched); n == 1 is a decode step through
 * the attention policy. logits: [n_vocab] for the last token, or NULL.
 * Returns 0, or -1 (context full, bad token id, aborted). */
SPARQ_API int sparq_eval(sparq_context *c, const int32_t *tokens, int n, float *logits);
/* The same, writing logits for every token: logits_all[n][n_vocab]. */
SPARQ_API int sparq_eval_all(sparq_context *c, const int32_t *tokens, int n, float *logits_all);

/* ---- embeddings ----------------------------------------------------------
 * A text's embedding as llama.cpp computes it (llama-embedding and
 * llama-server with --embedding --pooling P --embd-normalize N): the final
 * hidden state of each token after the output norm (what the LM head
 * reads), with the model's causal attention, pooled over the tokens (mean:
 * their average; cls: the first token's; last: the last token's; none:
 * every token's, one row each), then each row divided by its norm: -1 none, 0 max |x| / 32760 (int16 range), 1 sum of
 * |x|, 2 euclidean (llama.cpp's default), p > 2 the p-norm. Tokenize with
 * add_special = 1 for llama.cpp's tokens (BOS as the model asks).
 * Numbering as llama.cpp's enum llama_pooling_type. */
enum { SPARQ_POOLING_NONE = 0, SPARQ_POOLING_MEAN = 1, SPARQ_POOLING_CLS = 2, SPARQ_POOLING_LAST = 3 };
/* "none", "mean", "cls", "last"; NULL for anything else. */
SPARQ_API const char *sparq_pooling_name(int pooling);
/* The SPARQ_POOLING_* named name, or -1. */
SPARQ_API int         sparq_pooling_find(const char *name);
/* Resets c, prefills tokens[0..n) (its prefill attention, exact by
 * default; n <= its context size) and writes the pooled, normalised
 * embedding to out[n_embd] (pooling none: out[n][n_embd]). The tokens
 * stay cached. 0, or -1 with the message in sparq_context_error. */
SPARQ_API int sparq_embed(sparq_context *c, const int32_t *tokens, int n, int pooling, int normalize, float *out);

/* ---- batched decoding (server) ------------------------------------------
 * A server runs many sequences, one context each, over one model.
 *
 * sparq_eval_prefill is sparq_eval for one chunk of a prompt: attention is
 * exact even when the chunk is a single token. A prompt fed in chunks of
 * the context's n_batch (the last one shorter) through it gives the same
 * cache and logits as one sparq_eval of the whole prompt (n > 1), so
 * prefills interleaved with other work stay reproducible. The _all form
 * writes every token's logits (logits_all[n][n_vocab]); its last row is
 * bit-identical to sparq_eval_prefill's.
 *
 * sparq_decode_batch is one decode step for n sequences: tokens[i] is
 * appended to ctxs[i] (n distinct contexts of one model, each with room for
 * one more token) and runs through ctxs[i]'s own attention policy and
 * parameters at its own position. The weights are read once for the whole
 * batch. logits: [n][n_vocab] (row i for ctxs[i]) or NULL. Batch
 * invariance: row i is bit-identical to what sparq_eval(ctxs[i],
 * &tokens[i], 1, ...) would give, whatever the other sequences, n or i
 * (each weight row meets each sequence's activations through the same
 * kernel a lone decode uses: for repacked Q8_0 matrices the GEMM tiles,
 * which compute every (row, token) alike at any batch size; the attention
 * tasks of all sequences share the threads but each computes alone).
 * Threads: ctxs[0]'s n_threads. Returns 0, or -1
 * with the message in every context's sparq_context_error (a full context
 * or bad id changes nothing; an attention failure leaves the step undone
 * in every context, as sparq_eval does). */
SPARQ_API int sparq_eval_prefill(sparq_context *c, const int32_t *tokens, int n, float *logits);
SPARQ_API int sparq_eval_prefill_all(sparq_context *c, const int32_t *tokens, int n, float *logits_all);
SPARQ_API int sparq_decode_batch(sparq_context **ctxs, const int32_t *tokens, int n, float *logits);
/* sparq_eval_prefill of a one-token chunk for n sequences at once (a
 * prompt's last token, e.g. after a cached prefix): as sparq_decode_batch,
 * but attention is exact whatever each context's policy, as in a prefill,
 * and the step counts as no decode step. Row i is bit-identical to
 * sparq_eval_prefill(ctxs[i], &tokens[i], 1, ...)'s logits. */
SPARQ_API int sparq_eval_prefill_batch(sparq_context **ctxs, const int32_t *tokens, int n, float *logits);

/* Copies the first n cached positions of src into the empty context dst
 * (same model and KV type; dst's capacity >= n), as if dst had prefilled
 * them: a prefix cache. Prefill is exact attention whatever the policy, so
 * the keys and values depend only on the tokens; a copy cut at a multiple
 * of n_batch, followed by the rest of the prompt in n_batch chunks, gives
 * bit-identical logits to prefilling the whole prompt. Refused (-1) when
 * dst's policy observes the prefill (h2o). */
SPARQ_API int sparq_context_copy_prefix(sparq_context *dst, const sparq_context *src, int64_t n, char *err,
                              size_t err_size);

/* A shared prefix: one read-only copy of a context's first n cached
 * positions (K, V, and K^T once a context that needs it attaches; V sums)
 * that any number of contexts start from without copying it. Its memory is
 * a memfd; each attached context maps it privately, so the prefix's pages
 * exist once however many contexts use it, and only the pages a context
 * writes after the prefix become its own (copy on write).
 *
 * sparq_prefix_create copies src's first n positions (n <= its position)
 * laid out for contexts of capacity n_ctx (0: src's; n <= n_ctx): only
 * contexts of exactly that capacity and src's KV type can attach.
 * sparq_context_attach_prefix makes the empty context dst hold the first
 * n <= sparq_prefix_pos(p) positions of p, with the guarantees of
 * sparq_context_copy_prefix (bit-identical logits when n is a multiple of
 * the prefill chunk; for Q8_0 caches n must also be a multiple of 32, and
 * a policy reading K^T (sparq) needs a src that had K^T: else K^T is
 * quantized from K's rounded rows, as when a KV file is loaded); refused
 * for a policy that observes the prefill (h2o). A context that was reset
 * after holding at least n positions gets a copy in its own (already
 * committed) memory instead of a mapping: no page faults, which on some
 * virtual machines cost more than the copy. What is per context: V sums (copied), policy
 * state and top-k indexes (built by the context at its first decode step,
 * as after a copy). Reference counted: sparq_prefix_free drops the
 * caller's reference, and the memory goes when the last attached context
 * is freed too. _bytes: the data held (K and V rows, K^T once built);
 * _users: contexts attached now. Thread-safe for attaching from several
 * threads; one context is still used by one thread at a time. */
typedef struct sparq_prefix sparq_prefix;
SPARQ_API int     sparq_prefix_create(const sparq_context *src, int64_t n, int64_t n_ctx, sparq_prefix **out,
                                      char *err, size_t err_size);
SPARQ_API void    sparq_prefix_free(sparq_prefix *p);
SPARQ_API int64_t sparq_prefix_pos(const sparq_prefix *p);
SPARQ_API int64_t sparq_prefix_n_ctx(const sparq_prefix *p);
SPARQ_API size_t  sparq_prefix_bytes(const sparq_prefix *p);
SPARQ_API int     sparq_prefix_users(const sparq_prefix *p);
SPARQ_API int     sparq_context_attach_prefix(sparq_context *dst, const sparq_prefix *p, int64_t n, char *err,
                                              size_t err_size);

SPARQ_API int64_t sparq_context_pos(const sparq_context *c);   /* tokens in cache   */
SPARQ_API int64_t sparq_context_n_ctx(const sparq_context *c);
SPARQ_API int     sparq_context_n_threads(const sparq_context *c); /* resolved: 0 -> physical cores */
SPARQ_API int     sparq_context_n_batch(const sparq_context *c);   /* resolved: 0 -> 512  */
SPARQ_API const char *sparq_context_error(const sparq_context *c); /* last error    */
/* Timing only: appends n positions of random keys and values (about
 * N(0,1), seeded) to every layer's cache without running the model, so a
 * benchmark can decode at depth 1M without a 1M-token prefill. The model's
 * outputs after this are meaningless. Returns 0 or -1 (context full). */
SPARQ_API int sparq_context_fill_random(sparq_context *c, int64_t n, uint64_t seed);

/* Drops every cached token (the sequence starts again at position 0). */
SPARQ_API void sparq_context_reset(sparq_context *c);

/* For a server that keeps a finished sequence's context for the next: 1
 * when c was made by sparq_context_create with parameters equal to p's
 * (capacity, threads, batch, KV type, attention) and holds its own memory
 * (not a KV file's, not a shared prefix's mapping); c is then reset and
 * ready, its committed pages kept. p NULL: any parameters (a context
 * set aside to be checked against a request later). 0 otherwise (free c). */
SPARQ_API int sparq_context_reuse(sparq_context *c, const sparq_context_params *p);

/* Context shift (llama.cpp's): drops cached positions [n_keep, n_keep +
 * n_discard) and moves the later ones down by n_discard, re-rotating
 * their keys (RoPE) to the new positions, so decoding goes on in a full
 * cache as if the kept tokens had been prefilled at their new positions
 * (to f16 rounding). Every policy's state follows (SparQ's K^T and V sums,
 * H2O's scores, top-k indexes: the prefix becomes dense until marked
 * again). Returns 0, or -1 with the message in sparq_context_error. */
SPARQ_API int sparq_context_shift(sparq_context *c, int64_t n_keep, int64_t n_discard);

/* ---- KV cache files (docs/KVFILE.md) ----------------------------------- */

/* Makes the tokens cached so far the prefix: policies that index a prefix
 * ("topk") index positions [0, pos) and attend densely to what follows.
 * Without a call, the prefix is everything before the first decode step. */
SPARQ_API void sparq_context_mark_prefix(sparq_context *c);

/* Writes the cache (every position so far: the prefix) to path, with its
 * capacity, the model's fingerprint, the prefix's token ids if given
 * (tokens[n_tokens], n_tokens = positions cached; NULL = none) and, for
 * each kind in `indexes` (comma list of exact, ivf, hnsw, sparq; NULL or
 * "" = none), one prebuilt index per layer and KV head, built with the
 * context's attn parameters (index_key_type, ivf_nlist). Written to
 * path.tmp, then renamed. */
SPARQ_API int sparq_context_save_kv(sparq_context *c, const char *path, const char *indexes,
                          const int32_t *tokens, int64_t n_tokens, char *err, size_t err_size);

/* A cache prefilled by llama.cpp, elsewhere: converts the sequence state
 * that llama-server's /slots/ID?action=save or llama_state_seq_save_file
 * wrote (llama.cpp b5913 and later; others are refused, saying so) for the
 * same GGUF into the KV cache file kv_path, with the index kinds `indexes`
 * (as sparq_context_save_kv), built in place as a sparse prefill's is.
 * kv_type is the file's SPARQ_KV_* or -1 for the state's own (bf16 becomes
 * f32). The state names no model: its layer count and row widths are
 * checked against m, its token ids against the vocabulary. p gives the
 * capacity (n_ctx; 0: the model's training context, or the state's
 * positions + 4096 if that is more) and threads. *n_out (may be NULL) gets the positions. 0, or -1 with a
 * message (llama_state.h lists the format and what is refused). */
SPARQ_API int sparq_import_llama_state(sparq_model *m, const sparq_context_params *p, const char *state_path,
                                       const char *kv_path, const char *indexes, int kv_type, int64_t *n_out,
                                       char *err, size_t err_size);

/* SPARQ_VERIFY_META: the header and metadata checksums only, for a file
 * whose data was checked when it was first opened (sparq serve checks a
 * --load-kv document at start, then maps it once per request). */
enum { SPARQ_VERIFY_AUTO = 0, SPARQ_VERIFY_ALWAYS = 1, SPARQ_VERIFY_META = 2 };
/* Creates a context whose KV cache is the file at path, mapped privately
 * (pages are read from disk on demand; later tokens go to private memory).
 * Its capacity and KV type are the file's (p->n_ctx must be 0 or equal);
 * the loaded positions are the prefix (sparq_context_mark_prefix) and the
 * file's indexes serve a "topk" policy. The header and metadata checksums
 * are always verified; the data checksums too unless verify is AUTO and
 * the data exceeds 1 GiB. A file of another model, another format version,
 * truncated or corrupt is an error. */
SPARQ_API int sparq_context_load_kv(sparq_model *m, const sparq_context_params *p, const char *path,
                          int verify, sparq_context **out, char *err, size_t err_size);

/* Reads the KV cache file at path into the page cache, in one sequential
 * pass, so that loading it (sparq_context_load_kv) and asking it questions
 * read memory, not the disk at random: on a million-token file and a
 * common disk, the difference between seconds and minutes a question.
 * progress (may be NULL) gets bytes done and total. Returns 0 when read;
 * 1 when the file is larger than the memory available (err says so,
 * nothing was read, loading still works page by page); -1 on error. */
SPARQ_API int sparq_kv_preload(const char *path, void (*progress)(void *user, int64_t done, int64_t total),
                               void *user, char *err, size_t err_size);

/* Attention transfer accounting, summed over all decode steps so far:
 * elements the policy read/wrote and what dense attention would have. */
typedef struct sparq_attn_stats {
    int64_t elements;        /* read + written by the policy                */
    int64_t dense_elements;  /* the same steps under dense attention        */
    int64_t formula_elements;/* the policy's formula for those steps */
    int64_t bytes;           /* elements x KV element size                  */
    int64_t steps;           /* decode steps counted                        */
    /* topk with topk_check: over every query head of every indexed step,
     * selected prefix positions that are in the exact top-k, and k.      */
    int64_t recall_hits, recall_total;
    double  index_seconds;   /* topk: building or loading prefix indexes    */
    int64_t nominal_elements;/* part of elements estimated, not counted
                              * (topk hnsw: Faiss reports no visits)       */
} sparq_attn_stats;
SPARQ_API void sparq_context_attn_stats(const sparq_context *c, sparq_attn_stats *out);

/* ---- sampling --------------------------------------------------------- */

/* The one home of the sampling defaults: sparq_sampler_default_params().
 * Order of a draw (as llama.cpp's default chain): the logit bias
 * (sparq_sampler_set_logit_bias); repetition penalties on the logits;
 * temp <= 0: argmax; else min-p (on the untempered logits), softmax at
 * temp, top-k, top-p, draw. Fields left at 0 by a positional
 * initialiser switch their stage off. */
#define SPARQ_SEED_RANDOM UINT64_MAX /* seed: draw one from the OS            */
typedef struct sparq_sampler_params {
    float    temp;          /* 0 = greedy (argmax, ties to lowest id)       */
    int      top_k;         /* 0 = off                                      */
    float    top_p;         /* 1 (or 0) = off                               */
    uint64_t seed;          /* SPARQ_SEED_RANDOM: a fresh one each sampler  */
    float    min_p;         /* keep p >= min_p * p_max; 0 = off             */
    float    repeat_penalty;   /* logit / rp if > 0 else * rp, for ids in
                                  the window; 1 (or 0) = off              */
    float    presence_penalty; /* minus this once per id in the window     */
    float    frequency_penalty;/* minus this times the id's count          */
    int      penalty_last_n;   /* window: last n accepted ids (0 = no
                                  penalties, -1 = every id accepted)      */
} sparq_sampler_params;

typedef struct sparq_sampler sparq_sampler;
SPARQ_API sparq_sampler_params sparq_sampler_default_params(void);
/* NULL if a parameter is out of range (NaN or negative temp, top_k < 0,
 * top_p/min_p outside [0, 1], NaN or negative penalties, last_n < -1),
 * n_vocab <= 0 or out of memory; sparq_sampler_check says which. */
SPARQ_API sparq_sampler *sparq_sampler_create(const sparq_sampler_params *p, int n_vocab);
SPARQ_API int     sparq_sampler_check(const sparq_sampler_params *p, char *err, size_t err_size);
SPARQ_API void    sparq_sampler_free(sparq_sampler *s);
/* Draws the next id from logits[n_vocab] (not modified) and accepts it. */
SPARQ_API int32_t sparq_sample(sparq_sampler *s, const float *logits);
/* Adds an id to the penalty window without drawing (e.g. prompt ids). */
SPARQ_API void    sparq_sampler_accept(sparq_sampler *s, int32_t id);
SPARQ_API uint64_t sparq_sampler_seed(const sparq_sampler *s); /* the seed in use   */
/* Logit bias (OpenAI's and llama.cpp's logit_bias): replaces the sampler's
 * list with bias[i] added to the logit of ids[i] (i < n; n = 0 clears it;
 * the arrays are copied). Added before every other stage (penalties,
 * greedy argmax, min-p, top-k, top-p); a repeated id gets the sum. ids
 * must be in [0, n_vocab); a bias must be finite or -INFINITY, a ban: a
 * banned id is never drawn, greedy included (a list banning every id is
 * refused). Returns 0, or -1 with a one-line message and the sampler
 * unchanged. */
SPARQ_API int     sparq_sampler_set_logit_bias(sparq_sampler *s, const int32_t *ids, const float *bias, int n,
                                               char *err, size_t err_size);

/* ---- grammars (structured output) ------------------------------------ */

/* A compiled grammar: immutable, shareable by any number of samplers.
 * sparq_grammar_parse reads llama.cpp's GBNF (rules `name ::= ...`,
 * "literals", [classes], ., ( ), * + ? {m,n}, # comments; the start rule is
 * `root`; left recursion is refused). sparq_grammar_from_json_schema takes
 * a JSON Schema (the text of one): type, properties, required,
 * additionalProperties (false, or alone), items, minItems, maxItems,
 * minLength, maxLength, enum, const, anyOf, oneOf, nested; annotations
 * (title, description, ...) are ignored and any other keyword is an error
 * naming it. `{"type":"object"}` is OpenAI's json_object. Both return NULL
 * with a one-line message (GBNF: with line and column). */
typedef struct sparq_grammar sparq_grammar;
SPARQ_API sparq_grammar *sparq_grammar_parse(const char *gbnf, char *err, size_t err_size);
SPARQ_API sparq_grammar *sparq_grammar_from_json_schema(const char *schema, char *err, size_t err_size);
SPARQ_API void sparq_grammar_free(sparq_grammar *g);
/* Constrains s's draws to g (NULL: removes the constraint): each draw
 * then picks only among tokens of m whose bytes extend the text drawn so
 * far (since this call) within g, and an end-of-generation token only once
 * that text is a whole sentence of g; the logit bias, penalties and
 * min-p / top-k / top-p apply to the allowed tokens. Greedy checks tokens
 * in descending logit order and stops at the first allowed. m and g must
 * outlive s. Returns 0, or -1 with a message (s unchanged). */
SPARQ_API int     sparq_sampler_set_grammar(sparq_sampler *s, const sparq_model *m, const sparq_grammar *g,
                                            char *err, size_t err_size);
/* 1 if the sampler has a grammar and the tokens drawn so far complete it. */
SPARQ_API int     sparq_sampler_grammar_done(const sparq_sampler *s);

/* ---- generation --------------------------------------------------------- */

enum {
    SPARQ_STOP_MAX_TOKENS = 0,  /* max_tokens reached                      */
    SPARQ_STOP_EOG,             /* an end-of-generation token              */
    SPARQ_STOP_STRING,          /* a stop string appeared in the text      */
    SPARQ_STOP_CONTEXT_FULL,    /* no room left (and no context shift)     */
    SPARQ_STOP_ABORTED,         /* the context's abort_flag was set        */
    SPARQ_STOP_CALLBACK,        /* on_text returned non-zero               */
};
SPARQ_API const char *sparq_stop_name(int stop); /* "max_tokens", "end_of_generation", ... */

typedef struct sparq_generate_params {
    int max_tokens;             /* tokens to sample at most (>= 0)         */
    int ignore_eog;             /* 0: stop at an end-of-generation token
                                   (kept in tokens, its piece not in text) */
    const char *const *stop;    /* stop strings [n_stop]; text is cut
                                   before the first one that appears      */
    int n_stop;
    sparq_sampler *sampler;     /* NULL = greedy                           */
    /* When the cache is full: 0 stops (SPARQ_STOP_CONTEXT_FULL); 1 drops
     * the oldest half of the positions after the first n_keep
     * (sparq_context_shift) and goes on. */
    int context_shift;
    int64_t n_keep;
    /* Optional: called with text as it becomes final (the bytes that may
     * begin a stop string, or that begin a UTF-8 character a later piece
     * finishes, are held back until they cannot); non-zero stops the
     * generation (SPARQ_STOP_CALLBACK). */
    int (*on_text)(void *user, const char *text, size_t n);
    /* Optional: called with the logits of every decode step; non-zero is
     * an error (the message is the callback's to report). */
    int (*on_logits)(void *user, const float *logits, int n_vocab);
    void *user;
} sparq_generate_params;

typedef struct sparq_generation {
    int32_t *tokens;            /* [n_tokens] sampled ids, malloc'ed       */
    int      n_tokens;
    char    *text;              /* NUL-terminated pieces, cut at a stop    */
    size_t   n_text;
    int      stop;              /* SPARQ_STOP_*                            */
    int      pending;           /* 1: tokens[n_tokens-1] is not in the
                                   cache (the last one needs no forward
                                   pass); feed it before the next prompt  */
    int      n_decoded;         /* decode steps run                        */
    int      n_shifts;          /* context shifts done                     */
} sparq_generation;

SPARQ_API sparq_generate_params sparq_generate_default_params(void);
/* Samples up to max_tokens ids, the first from logits[n_vocab] (the last
 * evaluated position's, e.g. after a prefill), then feeding each sampled
 * id through a decode step to get the next logits (written to logits).
 * Returns 0 (out filled; free with sparq_generation_free), or -1 with the
 * message in sparq_context_error (out is then empty). */
SPARQ_API int  sparq_generate(sparq_context *c, float *logits, const sparq_generate_params *p,
                    sparq_generation *out);
SPARQ_API void sparq_generation_free(sparq_generation *g);

/* ---- ABI check ------------------------------------------------------- */

/* The layout of the public structs as this library was compiled (src/core/abi.c), so a
 * binding that mirrors them (python/sparq's ctypes structs) can refuse to
 * run against a library whose structs differ. sparq_abi_sizeof("sparq_attn_params")
 * is sizeof(sparq_attn_params), 0 for an unknown name; sparq_abi_offsetof(
 * "sparq_attn_params", "k") is offsetof(...), -1 for an unknown name. */
SPARQ_API size_t  sparq_abi_sizeof(const char *type);
SPARQ_API int64_t sparq_abi_offsetof(const char *type, const char *field);
/* The name of the struct's i-th field (0-based, in declaration order), NULL
 * past the last: a binding compares its field list with the library's. */
SPARQ_API const char *sparq_abi_field(const char *type, int i);
/* The library's version, "MAJOR.MINOR.PATCH" (MAJOR is the soname's). */
SPARQ_API const char *sparq_version(void);
/* The SIMD kernel level running: "avx512", "avx2" or "ref" (the best this
 * CPU has, or the one the SPARQ_CPU environment variable forces; chosen
 * once, on first use). */
SPARQ_API const char *sparq_cpu_level(void);

#ifdef __cplusplus
}
#endif
#endif
