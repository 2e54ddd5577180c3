/* model.h - llama-family transformer: architecture table, weights, forward.
 *
 * The model (sparq_model) holds the mapped GGUF, hyper-parameters and
 * borrowed weight views; it is shareable and read-only after loading. The
 * context (sparq_context) holds one sequence's KV cache, scratch buffers and
 * attention-policy state.
 */
#ifndef SPARQ_MODEL_H
#define SPARQ_MODEL_H

#include <stdint.h>
#include "attn/attn.h"
#include "tensor/gguf.h"
#include "core/kvcache.h"
#include "sparq.h"
#include "core/tokenizer.h"

enum { ROPE_NORM = 0, ROPE_NEOX = 2 };

/* Where per-frequency RoPE divisors come from (optional in both cases):
 * FREQS     rope_freqs.weight, one table for every context (llama3);
 * LONGROPE  rope_factors_short.weight / rope_factors_long.weight, the long
 *           table for contexts beyond the original training length (Phi-3
 *           128k "longrope"), see model_rope_factors. */
enum { ROPE_FACTORS_FREQS = 0, ROPE_FACTORS_LONGROPE = 1 };

/* What distinguishes one architecture from another: one row per arch. */
typedef struct arch_desc {
    const char *name;        /* general.architecture                      */
    int rope_type;           /* ROPE_NORM: pairs (2i,2i+1); NEOX: (i,i+n/2) */
    int has_qkv_bias;        /* qwen2: attn_{q,k,v}.bias                   */
    int has_qk_norm;         /* qwen3: per-head RMSNorm on q and k         */
    int fused_qkv;           /* phi3: attn_qkv.weight = [q; k; v] rows     */
    int fused_gate_up;       /* phi3: ffn_up.weight = [gate; up], 2*n_ff rows */
    int rope_factors;        /* ROPE_FACTORS_*                             */
} arch_desc;

/* A weight matrix W [n_out][n_in] (GGUF ne = {n_in, n_out}), borrowed. */
typedef struct weight {
    const void *data;        /* the file's rows; NULL once repacked (the
                              * pages are released, model_repack.c)        */
    uint32_t    type;
    int64_t     n_in, n_out;
    size_t      row_bytes;
    const void *packed;      /* the rows repacked at load for the GEMM tiles
                              * (tensor/gemm.h layout, model_repack.c), or
                              * NULL: then every product reads data        */
    char        name[64];    /* for messages                              */
} weight;

/* Fused tensors (phi3's attn_qkv, ffn_up) are bound as row-range views,
 * so the forward pass sees the same separate matrices for every arch. */
typedef struct layer_weights {
    const float *attn_norm;  /* [n_embd]                                  */
    weight wq, wk, wv, wo;   /* [n_head*hd][n_embd] ... [n_embd][n_head*hd] */
    const float *bq, *bk, *bv;       /* biases or NULL                    */
    const float *q_norm, *k_norm;    /* [hd] or NULL                      */
    const float *ffn_norm;   /* [n_embd]                                  */
    weight w_gate, w_up, w_down;     /* [n_ff][n_embd], [n_embd][n_ff]    */
} layer_weights;

typedef struct model_hparams {
    int     n_vocab, n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff;
    int64_t n_ctx_train;
    float   rms_eps;
    float   rope_base;
    float   rope_freq_scale;     /* linear scaling: position multiplier     */
    float   rope_attn_factor;    /* cos/sin multiplier (longrope: sqrt(1 + ln s / ln n_orig)) */
    int     rope_dim;            /* rotated dims per head                   */
    int64_t n_ctx_orig;          /* rope.scaling.original_context_length    */
} model_hparams;

struct sparq_model {
    gguf_file       *file;
    const arch_desc *arch;
    model_hparams    hp;
    tokenizer       *tok;
    weight           tok_embd;   /* [n_vocab][n_embd]                       */
    const float     *output_norm;
    weight           output;     /* tied to tok_embd when absent            */
    const float     *rope_freqs; /* [rope_dim/2] llama3 frequency factors or NULL */
    const float     *rope_short, *rope_long; /* [rope_dim/2] longrope factors or NULL */
    layer_weights   *layers;     /* [n_layer]                               */
    void            *packed;     /* one mapping holding every weight.packed */
    size_t           packed_size;
    /* Each token's output bytes (tok_decode), decoded once at load so a
     * grammar can test a whole vocabulary per step without re-decoding:
     * token i is piece_blob[piece_off[i] .. piece_off[i+1]); piece_eog[i]
     * says it ends a generation. */
    char            *piece_blob;
    uint32_t        *piece_off;  /* [n_vocab + 1]                           */
    uint8_t         *piece_eog;  /* [n_vocab]                               */
};

/* Per-sequence scratch, allocated once at context creation. */
typedef struct run_state {
    int     n_batch;
    float  *x, *xn;             /* [n_batch][n_embd]                       */
    float  *q;                  /* [n_batch][n_head*hd]                    */
    float  *k, *v;              /* [n_batch][n_kv_head*hd]                 */
    float  *att;                /* [n_batch][n_head*hd]                    */
    float  *gate, *up;          /* [n_batch][n_ff]                         */
    float  *rope_cs;            /* [n_batch][rope_dim] cos,sin pairs       */
    void   *xq;                 /* activations in a weight's vec_dot type  */
    size_t  xq_row_bytes;       /* stride of xq rows                       */
    float  *logits;             /* [n_batch][n_vocab]                      */
    float  *attn_scratch;       /* [n_threads][scratch_floats]             */
    int32_t *attn_iscratch;     /* [n_threads][scratch_floats]             */
    size_t  scratch_floats;     /* per thread                              */
    float  *colsum;             /* [n_kv_head][n_ctx] for H2O, or NULL     */
    float  *attn_parts;         /* [n_kv_head][parts][g*hd + g] for a policy
                                 * that splits long steps (n_parts), or NULL */
    int     attn_max_parts;     /* parts it has room for (n_parts at n_ctx) */
    float  *attn_shared;        /* [n_kv_head][shared_floats] what a split
                                 * step's select leaves its parts, or NULL */
    size_t  shared_floats;      /* per KV head                             */
    int    *attn_selected;      /* [n_kv_head] its select: 0 pending, 1
                                 * running, 2 done (this layer's step)     */
} run_state;

struct sparq_context {
    sparq_model        *model;
    sparq_context_params params;
    const attn_policy  *policy;
    void               *policy_state;
    const float        *rope_factors;  /* [rope_dim/2] for this context size, or NULL */
    kv_cache            kv;
    run_state           rs;
    int                 n_threads;
    sparq_attn_stats    stats;
    struct attn_pf_sparse *pf;         /* sparse prefill state, or NULL (exact) */
    struct kvf_writer  *kvw;           /* the KV file the cache is built in, or NULL */
    int64_t             kvw_n;         /* positions it will hold                */
    uint32_t            kvw_crc;       /* CRC-32C of their token ids            */
    char                kvw_indexes[64];
    char                error[256];
};

/* The first index of the largest of x[0..n) (ties to the lowest; a NaN never
 * wins, except at index 0): greedy decoding, in the sampler and in
 * generate.c's loop without one (sampler.c). */
int32_t logits_argmax(const float *x, int n);

/* Looks up an architecture by name; NULL if unknown. */
const arch_desc *arch_find(const char *name);

/* The RoPE frequency divisors a context of n_ctx positions uses (NULL:
 * none): rope_freqs, or for longrope the long table when the context
 * exceeds the original training length, else the short one. */
const float *model_rope_factors(const sparq_model *m, int64_t n_ctx);

/* Repacks the matrices whose every product then runs through the GEMM
 * tiles, at any number of tokens (model_repack.c has which and why); 0, or
 * -1 with err set when memory is short. */
int model_repack(sparq_model *m, char *err, size_t err_size);
void model_repack_free(sparq_model *m);

/* Bytes per row of the activation scratch (run_state.xq and the batch's)
 * for any product of the model: a vec_dot row or a packed GEMM token
 * (model_repack.c, beside the packing it sizes for). */
size_t model_act_row_bytes(const model_hparams *hp);

/* The fingerprint a KV file must match (io/kvfile.h): FNV-1a 64 over every
 * tensor's name, type and dims, the first 4 KiB of its data (so two
 * fine-tunes of one shape differ), and the hyper-parameters that shape keys
 * (RoPE base, scaling, dims, norm eps). context.c. */
struct kvf_fingerprint;
void model_fingerprint(const sparq_model *m, struct kvf_fingerprint *out);

/* sparq_context_save_kv written under the name tmp (NULL: path.tmp), then
 * renamed to path: one rename, and tmp created exclusively (the server's
 * --kv-dir gives each writer its own temp name). context.c. */
int context_save_kv_as(sparq_context *c, const char *path, const char *tmp, const char *indexes,
                       const int32_t *tokens, int64_t n_tokens, char *err, size_t err_size);

#endif
