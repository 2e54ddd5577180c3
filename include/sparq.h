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
 * the policy's defaults when the context is created (SPEC.md):
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
} sparq_attn_params;

enum { SPARQ_TOPK_UNIFORM = 0, SPARQ_TOPK_LINEAR = 1 };
enum { SPARQ_KEY_DEFAULT = 0, SPARQ_KEY_F16 = 1, SPARQ_KEY_BF16 = 2, SPARQ_KEY_I8 = 3 };

SPARQ_API sparq_attn_params sparq_attn_default_params(void);

/* ---- model ----------------------------------------------------------- */

/* Loads a GGUF file and validates it (architecture, tensors, tokenizer).
 * The file is read into anonymous memory backed by huge pages when it
 * takes at most half of the machine's RAM (decode reads every weight once
 * per token and runs faster from huge pages), else memory-mapped. */
SPARQ_API int  sparq_model_load(const char *path, sparq_model **out, char *err, size_t err_size);

typedef struct sparq_model_params {
    int use_mmap; /* 1: always map the file (less memory, slower decode);
                     0: the default rule of sparq_model_load */
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

/* ---- context: KV cache + scratch for one sequence --------------------- */

enum { SPARQ_KV_F32 = 0, SPARQ_KV_F16 = 1 };

typedef struct sparq_context_params {
    int64_t n_ctx;          /* KV capacity in tokens (0 = model's trained) */
    int     n_threads;      /* 0 = all cores                                */
    int     n_batch;        /* prefill tokens per batch (0 = 512)           */
    int     kv_type;        /* SPARQ_KV_F16 (default) or SPARQ_KV_F32       */
    sparq_attn_params attn; /* decode attention policy                      */
    /* Optional progress callback for prefills (tokens done, total); not
     * called for single-token decode steps. */
    void  (*progress)(void *user, int64_t done, int64_t total);
    void   *progress_user;
    /* Optional: checked between batches; non-zero aborts the eval. */
    volatile sig_atomic_t *abort_flag;
} sparq_context_params;

SPARQ_API sparq_context_params sparq_context_default_params(void);

SPARQ_API int  sparq_context_create(sparq_model *m, const sparq_context_params *p,
                          sparq_context **out, char *err, size_t err_size);
SPARQ_API void sparq_context_free(sparq_context *c);

/* Appends n tokens at the current position and runs the model. n > 1 is a
 * prefill (exact dense attention, batched); n == 1 is a decode step through
 * the attention policy. logits: [n_vocab] for the last token, or NULL.
 * Returns 0, or -1 (context full, bad token id, aborted). */
SPARQ_API int sparq_eval(sparq_context *c, const int32_t *tokens, int n, float *logits);
/* The same, writing logits for every token: logits_all[n][n_vocab]. */
SPARQ_API int sparq_eval_all(sparq_context *c, const int32_t *tokens, int n, float *logits_all);

SPARQ_API int64_t sparq_context_pos(const sparq_context *c);   /* tokens in cache   */
SPARQ_API int64_t sparq_context_n_ctx(const sparq_context *c);
SPARQ_API const char *sparq_context_error(const sparq_context *c); /* last error    */
/* Timing only: appends n positions of random keys and values (about
 * N(0,1), seeded) to every layer's cache without running the model, so a
 * benchmark can decode at depth 1M without a 1M-token prefill. The model's
 * outputs after this are meaningless. Returns 0 or -1 (context full). */
SPARQ_API int sparq_context_fill_random(sparq_context *c, int64_t n, uint64_t seed);

/* Drops every cached token (the sequence starts again at position 0). */
SPARQ_API void sparq_context_reset(sparq_context *c);

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

enum { SPARQ_VERIFY_AUTO = 0, SPARQ_VERIFY_ALWAYS = 1 };
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

/* Attention transfer accounting, summed over all decode steps so far:
 * elements the policy read/wrote and what dense attention would have. */
typedef struct sparq_attn_stats {
    int64_t elements;        /* read + written by the policy                */
    int64_t dense_elements;  /* the same steps under dense attention        */
    int64_t formula_elements;/* the policy's SPEC.md formula for those steps */
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

typedef struct sparq_sampler_params {
    float    temp;          /* 0 = greedy (argmax, ties to lowest id)       */
    int      top_k;         /* 0 = off                                      */
    float    top_p;         /* 1 = off                                      */
    uint64_t seed;
} sparq_sampler_params;

typedef struct sparq_sampler sparq_sampler;
SPARQ_API sparq_sampler_params sparq_sampler_default_params(void);
SPARQ_API sparq_sampler *sparq_sampler_create(const sparq_sampler_params *p, int n_vocab);
SPARQ_API void    sparq_sampler_free(sparq_sampler *s);
SPARQ_API int32_t sparq_sample(sparq_sampler *s, const float *logits);

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

#ifdef __cplusplus
}
#endif
#endif
