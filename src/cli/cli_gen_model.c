/* cli_gen_model.c - `sparq gen-model`: random-weight GGUFs of real shapes.
 *
 * No real large weights are available offline, so benchmarks run on files
 * with the exact tensor shapes of real models and seeded random weights.
 * The files are ordinary GGUFs that llama.cpp loads:
 *   llama shapes  a synthetic SentencePiece vocabulary of the real size:
 *                 <unk>, <s>, </s>, the 256 byte tokens, made-up pieces;
 *   qwen2 shapes  (Q/K/V biases) and qwen3 shapes (RMSNorm of each q and k
 *                 head, head size independent of n_embd): a synthetic
 *                 byte-level BPE vocabulary as Qwen's files have one
 *                 ("gpt2" model, "qwen2" pre-tokenizer): the 256 byte
 *                 tokens, made-up words with the merges that build them,
 *                 <|endoftext|> <|im_start|> <|im_end|>, then [PAD] rows up
 *                 to the embedding size; and a ChatML chat template;
 *   phi3 shapes   the llama vocabulary ending in Phi-3's added tokens
 *                 (<|endoftext|> ... <|end|> <|user|>, then [PAD] rows),
 *                 fused attn_qkv ([q; k; v] rows) and ffn_up ([gate; up],
 *                 2*n_ff rows) as Phi-3's files have them, the keys its
 *                 converter writes (sliding_window,
 *                 rope.scaling.original_context_length) and, for the 128k
 *                 shapes, longrope: rope_factors_short/long tables and
 *                 rope.scaling.attn_factor = sqrt(1 + ln(ctx/orig) / ln orig).
 *
 * Map:
 *   shapes[]                  the model shapes
 *   vocab_spm(_phi3) / _bpe   the synthetic vocabularies
 *   write_metadata            general.*, <arch>.* and tokenizer.* keys
 *   vocab_from_gguf           --vocab-from: another file's SentencePiece vocabulary
 *   read_weights              --weights: trained values (scripts/train_testmodel.py)
 *   add_weights               every tensor, with a seeded generator or from --weights
 *   cli_gen_model             options, then the above, one cleanup path
 */
#include "cli/cli.h"
#include "core/model.h"
#include "core/tokenizer.h"
#include "tensor/gguf.h"
#include "tensor/quant.h"
#include "util/err.h"
#include "util/rng.h"
#include "util/utf8.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct model_shape {
    const char *name;
    const char *arch;       /* general.architecture                       */
    int n_embd, n_layer, n_head, n_kv_head;
    int head_dim;           /* 0: n_embd / n_head (no key_length key)     */
    int n_ff, n_vocab;
    int64_t n_ctx;
    float rope_base, rms_eps;
    int tied;               /* output shares token_embd                    */
    int swa;                /* phi3: attention.sliding_window to record (0: none) */
    int64_t longrope_orig;  /* phi3 128k: original context; 0 = no longrope */
} model_shape;

static const model_shape shapes[] = {
    /* name             arch     embd  layers heads kv hd   ff     vocab   ctx     rope     eps    tied swa     longrope */
    { "smollm2-135m",   "llama",  576, 30,    9,    3, 0,   1536,  49152,  8192,   100000,  1e-5f, 1,   0,      0 },
    { "llama-3.2-1b",   "llama", 2048, 16,    32,   8, 0,   8192,  128256, 131072, 500000,  1e-5f, 1,   0,      0 },
    { "llama-3-8b",     "llama", 4096, 32,    32,   8, 0,   14336, 128256, 8192,   500000,  1e-5f, 0,   0,      0 },
    { "tiny",           "llama",  256, 2,     8,    2, 0,   768,   512,    4096,   10000,   1e-5f, 0,   0,      0 },
    { "qwen2.5-0.5b",   "qwen2",  896, 24,    14,   2, 0,   4864,  151936, 32768,  1000000, 1e-6f, 1,   0,      0 },
    { "qwen3-0.6b",     "qwen3", 1024, 28,    16,   8, 128, 3072,  151936, 40960,  1000000, 1e-6f, 1,   0,      0 },
    { "phi3-mini",      "phi3",  3072, 32,    32,  32, 0,   8192,  32064,  4096,   10000,   1e-5f, 0,   2047,   0 },
    { "phi3-mini-128k", "phi3",  3072, 32,    32,  32, 0,   8192,  32064,  131072, 10000,   1e-5f, 0,   262144, 4096 },
    /* small test models of the same architectures; tiny-qwen3 has
     * n_head * head_dim (512) != n_embd (256), as Qwen3 does; tiny-phi3
     * has Phi-3's head size 96 and GQA (as Phi-3-medium), and a sliding
     * window of 4 that llama.cpp ignores (see model.c), so a long prompt
     * shows whether it is ignored; tiny-phi3-128k has longrope beyond an
     * original 400, not a multiple of 256, so llama.cpp's rounding of the
     * context before choosing the table shows (model_rope_factors) */
    { "tiny-qwen2",     "qwen2",  256, 2,     4,    2, 0,   768,   1024,   4096,   1000000, 1e-6f, 1,   0,      0 },
    /* one layer: its cached keys and values depend only on token and
     * position, so after a context shift the cache must equal a fresh
     * prefill of the kept tokens (test_context_shift); NORM and NEOX RoPE */
    { "tiny-1l",        "llama",  128, 1,     4,    2, 0,   256,   512,    1024,   10000,   1e-5f, 0,   0,      0 },
    { "tiny-qwen2-1l",  "qwen2",  128, 1,     4,    2, 0,   256,   1024,   1024,   10000,   1e-6f, 1,   0,      0 },
    { "tiny-qwen3",     "qwen3",  256, 2,     8,    4, 64,  768,   1024,   4096,   1000000, 1e-6f, 1,   0,      0 },
    { "tiny-phi3",      "phi3",   384, 2,     4,    2, 0,   512,   512,    4096,   10000,   1e-5f, 0,   4,      0 },
    { "tiny-phi3-128k", "phi3",   384, 2,     4,    2, 0,   512,   512,    8192,   10000,   1e-5f, 0,   4,      400 },
    /* the trained test model (scripts/train_testmodel.py, models/README.md):
     * head size 64 and GQA as real models have, the stories260K vocabulary */
    { "tiny-d64",       "llama",  256, 4,     4,    2, 0,   768,   512,    2048,   10000,   1e-5f, 0,   0,      0 },
};
#define N_SHAPES (sizeof shapes / sizeof shapes[0])

/* What a file of this architecture holds comes from the loader's own
 * arch_table, so a generated file has exactly what sparq expects; every
 * shape names an architecture of the table (checked in cli_gen_model). */
static int shape_has_bias(const model_shape *s) { return arch_find(s->arch)->has_qkv_bias; }
static int shape_has_qk_norm(const model_shape *s) { return arch_find(s->arch)->has_qk_norm; }
static int shape_is_bpe(const model_shape *s) { return strncmp(s->arch, "qwen", 4) == 0; }
static int shape_is_fused(const model_shape *s)
{
    const arch_desc *a = arch_find(s->arch);
    return a->fused_qkv && a->fused_gate_up; /* the generator writes both fusions or neither */
}
static int shape_head_dim(const model_shape *s) { return s->head_dim ? s->head_dim : s->n_embd / s->n_head; }

typedef struct gen_opts {
    const char *shape, *type, *out;
    const char *weights;    /* raw f32 weights instead of random ones      */
    const char *vocab_from; /* a GGUF whose SentencePiece vocabulary to use */
    const char *init;       /* plain | scaled                              */
    uint64_t seed;
    int64_t n_ctx;
} gen_opts;

#define OFF(f) offsetof(gen_opts, f)
static const cli_opt gen_table[] = {
    { "--shape", NULL, OPT_STR, OFF(shape), "NAME",
      "smollm2-135m | llama-3.2-1b | llama-3-8b | tiny | qwen2.5-0.5b | qwen3-0.6b | phi3-mini | "
      "phi3-mini-128k | tiny-qwen2 | tiny-qwen3 | tiny-phi3 | tiny-phi3-128k | tiny-1l | tiny-qwen2-1l | tiny-d64" },
    { "--type", NULL, OPT_STR, OFF(type), "TYPE",
      "F32 | F16 | Q8_0 | Q4_0 | Q4_K_M (default Q8_0); K-quant rows not a multiple of 256 "
      "fall back to Q4_0 / Q8_0" },
    { "-o", "--output", OPT_STR, OFF(out), "FILE", "output GGUF" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "weights seed (default 1)" },
    { "--init", NULL, OPT_STR, OFF(init), "plain|scaled",
      "random weights: plain (default; fixed scales, as every earlier benchmark file) or scaled (each matrix "
      "std max(1/sqrt(fan-in), 0.02), logits of std ~3, no weight nearer 0 than 2^-13: activations stay O(1) "
      "and no f16 block scale is subnormal, so softmax, SiLU and weights stay clear of subnormals)" },
    { "-c", "--ctx-size", OPT_I64, OFF(n_ctx), "N", "context_length to record (default: the model's)" },
    { "--weights", NULL, OPT_STR, OFF(weights), "FILE",
      "trained weights instead of random ones: raw little-endian f32, every tensor [rows][cols] in the order "
      "this command writes them (scripts/train_testmodel.py writes such a file)" },
    { "--vocab-from", NULL, OPT_STR, OFF(vocab_from), "GGUF",
      "take the SentencePiece vocabulary of this file (its size must be the shape's)" },
    { 0 },
};
#undef OFF

/* One tensor to generate: rows of n_in values ~ offset + scale * (approx.
 * normal, bounded by +-3.47). */
typedef struct tensor_gen {
    const float *src;       /* [n_rows][n_in] trained values, or NULL: random */
    uint64_t seed;
    float    scale;         /* std of the values                          */
    float    offset;        /* mean: 0 matrices, 1 norms, > 3.47 * scale positive */
    float    floor;         /* > 0: values nearer 0 than this move out to it */
    uint32_t type;
    int64_t  n_in, n_rows;
} tensor_gen;

/* Sum of four uniforms (Irwin-Hall), centred and scaled to unit variance:
 * close enough to normal for benchmark weights and much cheaper. */
static float approx_normal(uint64_t *state)
{
    uint64_t r = rng_splitmix64(state);
    float s = 0;
    for (int i = 0; i < 4; i++, r >>= 16) s += (float)(r & 0xffff) * (1.0f / 65536.0f);
    return (s - 2.0f) * 1.7320508f;
}

static int fill_tensor(void *user, void *dst, size_t nbytes)
{
    const tensor_gen *tg = user;
    size_t row_bytes;
    if (quant_row_bytes(tg->type, tg->n_in, &row_bytes) || row_bytes * (size_t)tg->n_rows != nbytes) return -1;
    int failed = 0;
#pragma omp parallel
    {
        float *row = malloc((size_t)tg->n_in * sizeof(float));
        if (!row) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (int64_t r = 0; r < tg->n_rows; r++) {
            if (!row) continue;
            uint64_t st = tg->seed ^ ((uint64_t)r * 0xD1B54A32D192ED03ull);
            if (tg->src)
                memcpy(row, tg->src + r * tg->n_in, (size_t)tg->n_in * sizeof(float));
            else
                for (int64_t i = 0; i < tg->n_in; i++) {
                    float v = tg->offset + tg->scale * approx_normal(&st);
                    if (fabsf(v) < tg->floor) v = copysignf(tg->floor, v);
                    row[i] = v;
                }
            if (quant_from_float(tg->type, row, (uint8_t *)dst + (size_t)r * row_bytes, tg->n_in)) {
#pragma omp atomic write
                failed = 1;
            }
        }
        free(row);
    }
    return failed ? -1 : 0;
}

static uint64_t name_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

/* llama.cpp's Q4_K_M recipe: Q6_K for the output, and for attn_v/ffn_down
 * in the first and last eighth of the layers and every third in between. */
static int more_bits(int il, int n_layer)
{
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

/* ---- vocabularies ------------------------------------------------------- */

typedef struct vocab {
    int      n;
    char   **toks;          /* [n]                                         */
    float   *scores;        /* [n] (SPM) or NULL                            */
    int32_t *types;         /* [n] llama.cpp token types: 1 normal, 2 unknown,
                               3 control, 5 unused, 6 byte                  */
    char   **merges;        /* [n_merges] "left right" (BPE) or NULL        */
    int      n_merges;
    int      bos, eos, unk; /* -1: none                                     */
} vocab;

static void vocab_free(vocab *v)
{
    for (int i = 0; v->toks && i < v->n; i++) free(v->toks[i]);
    for (int i = 0; v->merges && i < v->n_merges; i++) free(v->merges[i]);
    free(v->toks);
    free(v->scores);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

static const char *spm_piece(int i, char *buf, size_t n)
{
    if (i == 0) return "<unk>";
    if (i == 1) return "<s>";
    if (i == 2) return "</s>";
    if (i < 3 + 256) {
        snprintf(buf, n, "<0x%02X>", i - 3);
        return buf;
    }
    /* made-up pieces: "▁" + a base-26 word, unique per id */
    int v = i - 259, len = 0;
    char word[16];
    do { word[len++] = (char)('a' + v % 26); v /= 26; } while (v && len < 15);
    snprintf(buf, n, "\xe2\x96\x81%.*s", len, word);
    return buf;
}

static int vocab_spm(vocab *v, int n)
{
    v->n = n;
    v->toks = calloc((size_t)n, sizeof *v->toks);
    v->scores = malloc((size_t)n * sizeof *v->scores);
    v->types = malloc((size_t)n * sizeof *v->types);
    if (!v->toks || !v->scores || !v->types) return -1;
    for (int i = 0; i < n; i++) {
        char buf[32];
        if (!(v->toks[i] = strdup(spm_piece(i, buf, sizeof buf)))) return -1;
        v->scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
        v->types[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    v->unk = 0, v->bos = 1, v->eos = 2;
    return 0;
}

/* Phi-3's layout: 32000 SentencePiece pieces, its 11 added tokens, then
 * [PAD<id>] rows (unused) up to 32064; smaller shapes keep the last 64
 * ids for the same tail. llama.cpp looks <|endoftext|> up by name in any
 * model whose general.name mentions phi3, so the file needs it. */
static const char *const phi3_added[] = {
    "<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
    "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>",
};
enum { PHI3_N_TAIL = 64 };

static int vocab_spm_phi3(vocab *v, int n)
{
    const int base = n - PHI3_N_TAIL, n_added = (int)(sizeof phi3_added / sizeof phi3_added[0]);
    if (base < 259 + 26 || vocab_spm(v, n)) return -1;
    for (int i = base; i < n; i++) {
        char buf[32];
        const int k = i - base;
        if (k < n_added) snprintf(buf, sizeof buf, "%s", phi3_added[k]);
        else snprintf(buf, sizeof buf, "[PAD%d]", i);
        free(v->toks[i]);
        if (!(v->toks[i] = strdup(buf))) return -1;
        v->scores[i] = k < n_added ? -1000.0f : -10000.0f; /* as the converter scores them */
        v->types[i] = k < n_added ? 3 : 5;
    }
    v->eos = base; /* <|endoftext|>, as in Microsoft's Phi-3-mini GGUFs; <|end|> is EOT by name */
    return 0;
}

/* Writes the UTF-8 of the character standing for byte b in GPT-2's
 * byte-level alphabet (the tokenizer's); returns its length. */
static int byte_char(int b, char *out)
{
    return (int)utf8_encode(tok_byte_to_cp((uint8_t)b), out);
}

/* The k-th made-up word, in order of length L = 2, 3, ...: first "Ġ" (the
 * byte-level space) + L-1 letters, then L letters. Each word is the merge
 * of itself minus its last letter (a shorter word or a byte token) with
 * that letter, so every merge joins two existing tokens. *cut = bytes of
 * the left part. */
static void bpe_word(int64_t k, char *word, size_t *cut)
{
    for (int L = 2;; L++) {
        for (int spaced = 1; spaced >= 0; spaced--) {
            int n_letters = spaced ? L - 1 : L;
            int64_t count = 1;
            for (int i = 0; i < n_letters; i++) count *= 26;
            if (k < count) {
                size_t len = 0;
                if (spaced) memcpy(word, "\xc4\xa0", 2), len = 2;
                for (int i = n_letters - 1; i >= 0; i--, k /= 26) word[len + (size_t)i] = (char)('a' + k % 26);
                len += (size_t)n_letters;
                word[len] = 0;
                *cut = len - 1;
                return;
            }
            k -= count;
        }
    }
}

/* Qwen's layout: regular tokens up to 151643, then the three specials,
 * then [PAD<id>] rows (unused) up to the embedding size. */
enum { QWEN_N_REGULAR = 151643 };

static int vocab_bpe(vocab *v, int n)
{
    const int n_regular = n - 3 < QWEN_N_REGULAR ? n - 3 : QWEN_N_REGULAR;
    if (n_regular < 256 + 26) return -1; /* shapes[] never asks for this */
    v->n = n;
    v->n_merges = n_regular - 256;
    v->toks = calloc((size_t)n, sizeof *v->toks);
    v->types = malloc((size_t)n * sizeof *v->types);
    v->merges = calloc((size_t)v->n_merges, sizeof *v->merges);
    if (!v->toks || !v->types || !v->merges) return -1;
    for (int i = 0; i < n; i++) {
        char buf[32];
        size_t cut = 0;
        v->types[i] = 1;
        if (i < 256) {
            buf[byte_char(i, buf)] = 0;
        } else if (i < n_regular) {
            bpe_word(i - 256, buf, &cut);
            char merge[40];
            snprintf(merge, sizeof merge, "%.*s %s", (int)cut, buf, buf + cut);
            if (!(v->merges[i - 256] = strdup(merge))) return -1;
        } else if (i < n_regular + 3) {
            static const char *const specials[3] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>" };
            snprintf(buf, sizeof buf, "%s", specials[i - n_regular]);
            v->types[i] = 3;
        } else {
            snprintf(buf, sizeof buf, "[PAD%d]", i);
            v->types[i] = 5;
        }
        if (!(v->toks[i] = strdup(buf))) return -1;
    }
    v->unk = -1, v->bos = n_regular, v->eos = n_regular + 2;
    return 0;
}

/* ChatML, as Qwen's templates render a conversation without tools. */
static const char chatml_jinja[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* ---- metadata --------------------------------------------------------- */

static int set_arch_u32(gguf_writer *w, const char *arch, const char *key, uint32_t v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return gguf_writer_set_u32(w, k, v);
}

static int set_arch_f32(gguf_writer *w, const char *arch, const char *key, float v)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return gguf_writer_set_f32(w, k, v);
}

static int write_metadata(gguf_writer *w, const model_shape *sh, const vocab *v, int64_t n_ctx,
                          uint32_t file_type, const char *name)
{
    const char *a = sh->arch;
    const int bpe = shape_is_bpe(sh), hd = shape_head_dim(sh);
    int bad = gguf_writer_set_str(w, "general.architecture", a) ||
              gguf_writer_set_str(w, "general.name", name) ||
              gguf_writer_set_u32(w, "general.file_type", file_type) ||
              set_arch_u32(w, a, "context_length", (uint32_t)n_ctx) ||
              set_arch_u32(w, a, "embedding_length", (uint32_t)sh->n_embd) ||
              set_arch_u32(w, a, "block_count", (uint32_t)sh->n_layer) ||
              set_arch_u32(w, a, "feed_forward_length", (uint32_t)sh->n_ff) ||
              set_arch_u32(w, a, "attention.head_count", (uint32_t)sh->n_head) ||
              set_arch_u32(w, a, "attention.head_count_kv", (uint32_t)sh->n_kv_head) ||
              set_arch_u32(w, a, "rope.dimension_count", (uint32_t)hd) ||
              set_arch_f32(w, a, "rope.freq_base", sh->rope_base) ||
              set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", sh->rms_eps) ||
              set_arch_u32(w, a, "vocab_size", (uint32_t)sh->n_vocab);
    if (shape_is_fused(sh)) { /* what Phi-3's converter records */
        int64_t orig = sh->longrope_orig ? sh->longrope_orig : n_ctx;
        bad = bad || set_arch_u32(w, a, "rope.scaling.original_context_length", (uint32_t)orig) ||
              set_arch_u32(w, a, "attention.sliding_window", (uint32_t)sh->swa);
        if (sh->longrope_orig && n_ctx > orig) {
            double f = sqrt(1.0 + log((double)n_ctx / (double)orig) / log((double)orig));
            bad = bad || set_arch_f32(w, a, "rope.scaling.attn_factor", (float)f);
        }
    }
    if (sh->head_dim) /* only where it differs from n_embd / n_head, as in Qwen3's files */
        bad = bad || set_arch_u32(w, a, "attention.key_length", (uint32_t)hd) ||
              set_arch_u32(w, a, "attention.value_length", (uint32_t)hd);
    bad = bad || gguf_writer_set_str(w, "tokenizer.ggml.model", bpe ? "gpt2" : "llama") ||
          (bpe && gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2")) ||
          gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->toks, (uint64_t)v->n) ||
          (v->scores && gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v->scores, (uint64_t)v->n)) ||
          gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->types, (uint64_t)v->n) ||
          (v->merges && gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges,
                                                (uint64_t)v->n_merges)) ||
          (v->unk >= 0 && gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk)) ||
          gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos) ||
          gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos) ||
          (bpe && gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v->bos)) ||
          gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", !bpe) ||
          (bpe && gguf_writer_set_str(w, "tokenizer.chat_template", chatml_jinja));
    return bad ? -1 : 0;
}

/* The SentencePiece vocabulary of another GGUF (e.g. stories260K's tok512
 * for a model trained on its token ids). Only "llama" (SPM) vocabularies:
 * the shapes that take one write tokenizer.ggml.model "llama". */
static int vocab_from_gguf(vocab *v, const char *path, int n_want, char *err, size_t n_err)
{
    gguf_file *f = NULL;
    char m[256];
    if (gguf_open(path, &f, m, sizeof m)) {
        return err_set(err, n_err, "--vocab-from: %s", m);
    }
    int rc = -1;
    gguf_str model;
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *scores = gguf_find_kv(f, "tokenizer.ggml.scores");
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    int64_t bos, eos, unk;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model) != 1 || !gguf_str_eq(model, "llama")) {
        err_set(err, n_err, "--vocab-from %s: not a SentencePiece (\"llama\") vocabulary", path);
        goto done;
    }
    if (!toks || !toks->strs || toks->n != (uint64_t)n_want) {
        err_set(err, n_err, "--vocab-from %s: %llu tokens, the shape needs %d", path,
                toks ? (unsigned long long)toks->n : 0ull, n_want);
        goto done;
    }
    if (!scores || scores->type != GGUF_ARR || scores->n != toks->n || !types || types->type != GGUF_ARR ||
        types->n != toks->n || gguf_get_int(f, "tokenizer.ggml.bos_token_id", &bos) != 1 ||
        gguf_get_int(f, "tokenizer.ggml.eos_token_id", &eos) != 1 || bos < 0 || bos >= n_want || eos < 0 ||
        eos >= n_want) {
        err_set(err, n_err, "--vocab-from %s: scores, token types or BOS/EOS ids missing or out of range", path);
        goto done;
    }
    if (gguf_get_int(f, "tokenizer.ggml.unknown_token_id", &unk) != 1 || unk < 0 || unk >= n_want) unk = -1;
    v->n = n_want;
    v->toks = calloc((size_t)n_want, sizeof *v->toks);
    v->scores = malloc((size_t)n_want * sizeof *v->scores);
    v->types = malloc((size_t)n_want * sizeof *v->types);
    if (!v->toks || !v->scores || !v->types) {
        err_set(err, n_err, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_want; i++) {
        const gguf_str t = toks->strs[i];
        if (memchr(t.data, 0, t.len)) {
            err_set(err, n_err, "--vocab-from %s: token %d holds a NUL byte", path, i);
            goto done;
        }
        if (!(v->toks[i] = strndup(t.data, t.len))) {
            err_set(err, n_err, "out of memory");
            goto done;
        }
        v->scores[i] = (float)gguf_arr_float(scores, (uint64_t)i);
        v->types[i] = (int32_t)gguf_arr_int(types, (uint64_t)i);
    }
    v->bos = (int)bos, v->eos = (int)eos, v->unk = (int)unk;
    rc = 0;
done:
    gguf_close(f);
    return rc;
}

/* The whole --weights file (a few MB for the shapes trained here). */
static float *read_weights(const char *path, int64_t *n_out, char *err, size_t n_err)
{
    FILE *fp = fopen(path, "rb");
    struct stat st;
    if (!fp || fstat(fileno(fp), &st) || !S_ISREG(st.st_mode)) {
        err_set(err, n_err, "--weights %s: %s", path, !fp ? strerror(errno) : "not a regular file");
        if (fp) fclose(fp);
        return NULL;
    }
    if (st.st_size <= 0 || st.st_size % 4 || (uint64_t)st.st_size > SIZE_MAX / 2) {
        err_set(err, n_err, "--weights %s: %lld bytes is not a whole number of f32 values", path,
                (long long)st.st_size);
        fclose(fp);
        return NULL;
    }
    float *w = malloc((size_t)st.st_size);
    if (!w || fread(w, 1, (size_t)st.st_size, fp) != (size_t)st.st_size) {
        err_set(err, n_err, "--weights %s: %s", path, w ? "short read" : "out of memory");
        free(w);
        w = NULL;
    }
    fclose(fp);
    for (int64_t i = 0; w && i < st.st_size / 4; i++)
        if (!isfinite(w[i])) {
            err_set(err, n_err, "--weights %s: value %lld is not finite", path, (long long)i);
            free(w);
            w = NULL;
        }
    *n_out = st.st_size / 4;
    return w;
}

/* ---- weights ---------------------------------------------------------- */

typedef struct weight_plan {
    gguf_writer *w;
    const float *src;       /* --weights: the file's floats, or NULL      */
    int64_t      src_n, src_used;
    tensor_gen  *gens;      /* [max] generators, alive until the write    */
    int          n, max;
    uint64_t     seed;
    int          scaled;    /* --init scaled: scales from fan-in (add_weights) */
    int          n_fallback;/* K-quant tensors written as Q4_0 / Q8_0      */
    int          bad;
} weight_plan;

/* A K-quant needs rows that are whole 256-blocks; llama.cpp then falls
 * back to Q5_0 / Q8_0. sparq cannot write Q5_0, so Q4_K takes Q4_0 (the
 * nearest size it can write) and Q6_K takes Q8_0. */
static uint32_t fit_type(weight_plan *p, uint32_t type, int64_t n_in)
{
    size_t rb;
    if (quant_row_bytes(type, n_in, &rb) == 0) return type;
    p->n_fallback++;
    return type == QT_Q4_K ? QT_Q4_0 : QT_Q8_0;
}

/* Declares one tensor [n_rows][n_in] (1-D when n_dims == 1). Scales follow
 * the golden random models (attention sharper than N(0, 0.02) would make
 * it, see the golden README); norms are 1 + N(0, scale) (offset 1). */
static void add(weight_plan *p, const char *name, uint32_t type, int n_dims, int64_t n_in, int64_t n_rows,
                float scale, float offset)
{
    if (p->n == p->max) { p->bad = 1; return; }
    tensor_gen *tg = &p->gens[p->n++];
    tg->seed = p->seed ^ name_hash(name);
    tg->scale = scale;
    tg->offset = offset;
    /* far from f16's subnormals (< 2^-14) whatever the file's type */
    tg->floor = p->scaled && offset == 0 ? 1.0f / 8192 : 0;
    tg->type = n_dims == 1 ? QT_F32 : fit_type(p, type, n_in);
    tg->n_in = n_in;
    tg->n_rows = n_rows;
    if (p->src) { /* the next n_in x n_rows floats of the file; sizes checked after the plan */
        const int64_t n = n_in * n_rows;
        tg->src = p->src_used + n <= p->src_n ? p->src + p->src_used : NULL;
        p->src_used += n;
        if (!tg->src) tg->src = p->src; /* never read: the size check fails first */
    }
    int64_t ne[2] = { n_in, n_rows };
    p->bad |= gguf_writer_add_tensor(p->w, name, tg->type, (uint32_t)n_dims, ne, fill_tensor, tg) != 0;
}

/* --init scaled: the scales a trained model's weights have at the orders of
 * magnitude that matter. A matrix of std 1 / sqrt(fan-in) maps unit
 * activations to unit activations, so after every RMSNorm the queries and
 * keys are O(1) and attention scores q.k / sqrt(d) have std ~1, and the
 * residual stream grows additively (each block's input is normalised); the
 * logits have std ~3 (trained models' are a few units). Then the exponent
 * of every softmax term and every SiLU stays within a few tens of 0, far
 * from the ~-87 where f32 results turn subnormal. No matrix is narrower
 * than std 0.02 (trained models' smallest are about that): a narrower one's
 * Q8_0 / K-quant block scales, stored as f16, would fall below f16's
 * smallest normal (2^-14 ~ 6.1e-5) and be subnormals themselves.
 * plain: the fixed scales of the earlier benchmark files. */
static float mat_scale(const weight_plan *p, float plain, double gain, int64_t fan_in)
{
    if (!p->scaled) return plain;
    const double sd = gain / sqrt((double)fan_in);
    return (float)(sd > 0.02 ? sd : 0.02);
}

static void add_weights(weight_plan *p, const model_shape *sh, uint32_t mat_type, uint32_t big_type)
{
    const int64_t hd = shape_head_dim(sh);
    const int64_t q_dim = sh->n_head * hd, kv_dim = sh->n_kv_head * hd;
    char name[96];
    const float norm_sd = p->scaled ? 0.02f : 0.1f, bias_sd = p->scaled ? 0.02f : 0.1f;
#define in_sd(plain) mat_scale(p, plain, 1.0, sh->n_embd)
#define out_sd(fan_in) mat_scale(p, 0.05f, 1.0, fan_in)
    add(p, "token_embd.weight", sh->tied ? big_type : mat_type, 2, sh->n_embd, sh->n_vocab,
        mat_scale(p, 0.1f, 3.0, sh->n_embd), 0);
    add(p, "output_norm.weight", QT_F32, 1, sh->n_embd, 1, norm_sd, 1);
    if (!sh->tied)
        add(p, "output.weight", big_type, 2, sh->n_embd, sh->n_vocab, mat_scale(p, 0.1f, 3.0, sh->n_embd), 0);
    if (sh->longrope_orig) {
        /* positive divisors: short ones near 1, long ones stretching */
        add(p, "rope_factors_short.weight", QT_F32, 1, hd / 2, 1, 0.2f, 1);
        add(p, "rope_factors_long.weight", QT_F32, 1, hd / 2, 1, 1.0f, 4);
    }
    for (int il = 0; il < sh->n_layer; il++) {
        uint32_t vt = more_bits(il, sh->n_layer) ? big_type : mat_type;
#define L(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)
        add(p, L("attn_norm.weight"), QT_F32, 1, sh->n_embd, 1, norm_sd, 1);
        if (shape_is_fused(sh)) {
            add(p, L("attn_qkv.weight"), mat_type, 2, sh->n_embd, q_dim + 2 * kv_dim, in_sd(0.1f), 0);
            add(p, L("attn_output.weight"), mat_type, 2, q_dim, sh->n_embd, out_sd(q_dim), 0);
            add(p, L("ffn_norm.weight"), QT_F32, 1, sh->n_embd, 1, norm_sd, 1);
            add(p, L("ffn_up.weight"), mat_type, 2, sh->n_embd, 2 * (int64_t)sh->n_ff, in_sd(0.05f), 0);
            add(p, L("ffn_down.weight"), vt, 2, sh->n_ff, sh->n_embd, out_sd(sh->n_ff), 0);
            continue;
        }
        add(p, L("attn_q.weight"), mat_type, 2, sh->n_embd, q_dim, in_sd(0.1f), 0);
        add(p, L("attn_k.weight"), mat_type, 2, sh->n_embd, kv_dim, in_sd(0.1f), 0);
        add(p, L("attn_v.weight"), vt, 2, sh->n_embd, kv_dim, in_sd(0.05f), 0);
        if (shape_has_bias(sh)) {
            add(p, L("attn_q.bias"), QT_F32, 1, q_dim, 1, bias_sd, 0);
            add(p, L("attn_k.bias"), QT_F32, 1, kv_dim, 1, bias_sd, 0);
            add(p, L("attn_v.bias"), QT_F32, 1, kv_dim, 1, bias_sd, 0);
        }
        if (shape_has_qk_norm(sh)) {
            add(p, L("attn_q_norm.weight"), QT_F32, 1, hd, 1, norm_sd, 1);
            add(p, L("attn_k_norm.weight"), QT_F32, 1, hd, 1, norm_sd, 1);
        }
        add(p, L("attn_output.weight"), mat_type, 2, q_dim, sh->n_embd, out_sd(q_dim), 0);
        add(p, L("ffn_norm.weight"), QT_F32, 1, sh->n_embd, 1, norm_sd, 1);
        add(p, L("ffn_gate.weight"), mat_type, 2, sh->n_embd, sh->n_ff, in_sd(0.05f), 0);
        add(p, L("ffn_up.weight"), mat_type, 2, sh->n_embd, sh->n_ff, in_sd(0.05f), 0);
        add(p, L("ffn_down.weight"), vt, 2, sh->n_ff, sh->n_embd, out_sd(sh->n_ff), 0);
#undef L
    }
#undef in_sd
#undef out_sd
}

/* ---- the command ------------------------------------------------------- */

int cli_gen_model(int argc, char **argv)
{
    gen_opts o = { .type = "Q8_0", .init = "plain", .seed = 1 };
    cli_group groups[] = { { "gen-model", gen_table, &o } };
    char err[512];
    const int parsed = cli_parse_command(groups, 1, argc, argv,
                                         "usage: sparq gen-model --shape NAME --type TYPE -o FILE",
                                         NULL, 0, NULL);
    if (parsed >= 0) return parsed;
    const model_shape *sh = NULL;
    for (size_t i = 0; i < N_SHAPES; i++)
        if (o.shape && strcmp(o.shape, shapes[i].name) == 0) sh = &shapes[i];
    if (!sh) {
        char names[256] = "";
        for (size_t i = 0; i < N_SHAPES; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", shapes[i].name);
        fprintf(stderr, "error: --shape must be one of %s\n", names);
        return 2;
    }
    if (!arch_find(sh->arch)) { /* a shape table entry the loader would refuse */
        fprintf(stderr, "error: shape %s: architecture '%s' is not in the model table\n", sh->name, sh->arch);
        return 1;
    }
    if (!o.out) {
        fprintf(stderr, "error: -o FILE is required\n");
        return 2;
    }
    uint32_t mat_type, big_type, file_type;
    if (strcmp(o.type, "F32") == 0) mat_type = big_type = QT_F32, file_type = 0;
    else if (strcmp(o.type, "F16") == 0) mat_type = big_type = QT_F16, file_type = 1;
    else if (strcmp(o.type, "Q8_0") == 0) mat_type = big_type = QT_Q8_0, file_type = 7;
    else if (strcmp(o.type, "Q4_0") == 0) mat_type = QT_Q4_0, big_type = QT_Q6_K, file_type = 2;
    else if (strcmp(o.type, "Q4_K_M") == 0) mat_type = QT_Q4_K, big_type = QT_Q6_K, file_type = 15;
    else {
        fprintf(stderr, "error: --type must be F32, F16, Q8_0, Q4_0 or Q4_K_M, not '%s'\n", o.type);
        return 2;
    }
    if (strcmp(o.init, "plain") != 0 && strcmp(o.init, "scaled") != 0) {
        fprintf(stderr, "error: --init must be plain or scaled, not '%s'\n", o.init);
        return 2;
    }

    int rc = 1;
    float *weights = NULL;
    vocab v = { 0 };
    weight_plan p = { 0 };
    p.w = gguf_writer_create();
    p.max = 5 + 14 * sh->n_layer;
    p.seed = o.seed;
    p.scaled = strcmp(o.init, "scaled") == 0;
    p.gens = calloc((size_t)p.max, sizeof *p.gens);
    if (o.vocab_from && (shape_is_bpe(sh) || shape_is_fused(sh))) {
        fprintf(stderr, "error: --vocab-from takes a SentencePiece vocabulary; shape %s has its own\n", sh->name);
        goto done;
    }
    if (o.vocab_from ? vocab_from_gguf(&v, o.vocab_from, sh->n_vocab, err, sizeof err) : 0) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    if (o.weights && !(weights = read_weights(o.weights, &p.src_n, err, sizeof err))) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    p.src = weights;
    int vbad = o.vocab_from ? 0
               : shape_is_bpe(sh) ? vocab_bpe(&v, sh->n_vocab)
               : shape_is_fused(sh) ? vocab_spm_phi3(&v, sh->n_vocab) : vocab_spm(&v, sh->n_vocab);
    if (!p.w || !p.gens || vbad) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    char name[96];
    snprintf(name, sizeof name, "sparq %s %s %s", weights ? "trained" : p.scaled ? "random-scaled" : "random",
             sh->name, o.type);
    int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : sh->n_ctx;
    if (n_ctx > UINT32_MAX) {
        fprintf(stderr, "error: -c %lld does not fit the u32 context_length key\n", (long long)n_ctx);
        goto done;
    }
    int bad = write_metadata(p.w, sh, &v, n_ctx, file_type, name);
    add_weights(&p, sh, mat_type, big_type);
    if (weights && p.src_used != p.src_n) {
        fprintf(stderr, "error: --weights %s holds %lld values; shape %s needs %lld\n", o.weights,
                (long long)p.src_n, sh->name, (long long)p.src_used);
        goto done;
    }
    if (bad || p.bad) {
        const char *why = gguf_writer_error(p.w);
        fprintf(stderr, "error: cannot describe the model: %s\n", why && *why ? why : "out of memory");
        goto done;
    }
    if (gguf_writer_write(p.w, o.out, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    fprintf(stderr, "wrote %s: %s (%s), %s, %d tensors\n", o.out, sh->name, sh->arch, o.type, p.n);
    if (p.n_fallback)
        fprintf(stderr, "note: %d tensors have rows that are not whole K-quant blocks; they are Q4_0 / Q8_0\n",
                p.n_fallback);
    rc = 0;
done:
    vocab_free(&v);
    free(weights);
    free(p.gens);
    gguf_writer_free(p.w);
    return rc;
}
