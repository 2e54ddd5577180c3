/* cli_gen_model.c - `sparq gen-model`: random-weight GGUFs of real shapes.
 *
 * No real large weights are available offline, so benchmarks run on files
 * with the exact tensor shapes of real models and seeded random weights.
 * The files are ordinary llama-architecture GGUFs (llama.cpp loads them),
 * with a synthetic SentencePiece vocabulary of the real size: <unk>, <s>,
 * </s>, the 256 byte tokens, then made-up pieces.
 */
#include "cli.h"
#include "gguf.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct model_shape {
    const char *name;
    int n_embd, n_layer, n_head, n_kv_head, n_ff, n_vocab;
    int64_t n_ctx;
    float rope_base;
    int tied;               /* output shares token_embd                    */
} model_shape;

static const model_shape shapes[] = {
    /* name            embd  layers heads kv  ff     vocab   ctx     rope     tied */
    { "smollm2-135m",   576, 30,    9,    3,  1536,  49152,  8192,   100000,  1 },
    { "llama-3.2-1b",  2048, 16,    32,   8,  8192,  128256, 131072, 500000,  1 },
    { "llama-3-8b",    4096, 32,    32,   8,  14336, 128256, 8192,   500000,  0 },
    { "tiny",           256, 2,     8,    2,  768,   512,    4096,   10000,   0 },
};

typedef struct gen_opts {
    const char *shape, *type, *out;
    uint64_t seed;
    int64_t n_ctx;
} gen_opts;

#define OFF(f) offsetof(gen_opts, f)
static const cli_opt gen_table[] = {
    { "--shape", NULL, OPT_STR, OFF(shape), "NAME", "smollm2-135m | llama-3.2-1b | llama-3-8b | tiny" },
    { "--type", NULL, OPT_STR, OFF(type), "TYPE", "F32 | F16 | Q8_0 | Q4_0 | Q4_K_M (default Q8_0)" },
    { "-o", "--output", OPT_STR, OFF(out), "FILE", "output GGUF" },
    { "--seed", NULL, OPT_U64, OFF(seed), "N", "weights seed (default 1)" },
    { "-c", "--ctx-size", OPT_I64, OFF(n_ctx), "N", "context_length to record (default: the model's)" },
    { 0 },
};
#undef OFF

/* One tensor to generate: rows of n_in values ~ scale * (approx. normal). */
typedef struct tensor_gen {
    uint64_t seed;
    float    scale;         /* std of the values; norms: 1 + N(0, scale) */
    int      is_norm;
    uint32_t type;
    int64_t  n_in, n_rows;
} tensor_gen;

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Sum of four uniforms (Irwin-Hall), centred and scaled to unit variance:
 * close enough to normal for benchmark weights and much cheaper. */
static float approx_normal(uint64_t *state)
{
    uint64_t r = splitmix64(state);
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
            for (int64_t i = 0; i < tg->n_in; i++)
                row[i] = (tg->is_norm ? 1.0f : 0.0f) + tg->scale * approx_normal(&st);
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

static const char *vocab_piece(int i, char *buf, size_t n)
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

int cli_gen_model(int argc, char **argv)
{
    gen_opts o = { NULL, "Q8_0", NULL, 1, 0 };
    cli_group groups[] = { { "gen-model", gen_table, &o } };
    char err[512];
    char *pos[1];
    int n_pos, help;
    if (cli_parse(groups, 1, argc, argv, pos, 0, &n_pos, &help, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        return 2;
    }
    if (help) {
        cli_print_help(stdout, "usage: sparq gen-model --shape NAME --type TYPE -o FILE", groups, 1);
        return 0;
    }
    const model_shape *sh = NULL;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (o.shape && strcmp(o.shape, shapes[i].name) == 0) sh = &shapes[i];
    if (!sh || !o.out) {
        fprintf(stderr, "error: %s\n", !sh ? "--shape must be one of smollm2-135m, llama-3.2-1b, llama-3-8b, tiny"
                                            : "-o FILE is required");
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
    const int hd = sh->n_embd / sh->n_head;
    const int64_t q_dim = (int64_t)sh->n_head * hd, kv_dim = (int64_t)sh->n_kv_head * hd;

    int rc = 1;
    gguf_writer *w = gguf_writer_create();
    const int n_tensors_max = 4 + 9 * sh->n_layer;
    tensor_gen *gens = calloc((size_t)n_tensors_max, sizeof *gens);
    char **toks = calloc((size_t)sh->n_vocab, sizeof *toks);
    float *scores = malloc((size_t)sh->n_vocab * sizeof *scores);
    int32_t *ttypes = malloc((size_t)sh->n_vocab * sizeof *ttypes);
    if (!w || !gens || !toks || !scores || !ttypes) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    for (int i = 0; i < sh->n_vocab; i++) {
        char buf[32];
        toks[i] = strdup(vocab_piece(i, buf, sizeof buf));
        if (!toks[i]) { fprintf(stderr, "error: out of memory\n"); goto done; }
        scores[i] = i < 259 ? 0.0f : -(float)(i - 259);
        ttypes[i] = i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1;
    }
    int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : sh->n_ctx;
    char name[96];
    snprintf(name, sizeof name, "sparq random %s %s", sh->name, o.type);
    int bad = gguf_writer_set_str(w, "general.architecture", "llama") ||
              gguf_writer_set_str(w, "general.name", name) ||
              gguf_writer_set_u32(w, "general.file_type", file_type) ||
              gguf_writer_set_u32(w, "llama.context_length", (uint32_t)n_ctx) ||
              gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)sh->n_embd) ||
              gguf_writer_set_u32(w, "llama.block_count", (uint32_t)sh->n_layer) ||
              gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)sh->n_ff) ||
              gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)sh->n_head) ||
              gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)sh->n_kv_head) ||
              gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)hd) ||
              gguf_writer_set_f32(w, "llama.rope.freq_base", sh->rope_base) ||
              gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f) ||
              gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)sh->n_vocab) ||
              gguf_writer_set_str(w, "tokenizer.ggml.model", "llama") ||
              gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, (uint64_t)sh->n_vocab) ||
              gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, (uint64_t)sh->n_vocab) ||
              gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", ttypes, (uint64_t)sh->n_vocab) ||
              gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0) ||
              gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1) ||
              gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2) ||
              gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);

    int nt = 0;
    /* Adds one tensor; scales follow the golden random models (attention
     * sharper than N(0, 0.02) would make it, see golden README). */
#define ADD(NAME, TYPE, N_IN, N_ROWS, SCALE, NORM)                                         \
    do {                                                                                   \
        tensor_gen *tg = &gens[nt++];                                                      \
        tg->seed = o.seed ^ name_hash(NAME);                                               \
        tg->scale = (SCALE);                                                               \
        tg->is_norm = (NORM);                                                              \
        tg->type = (TYPE);                                                                 \
        tg->n_in = (N_IN);                                                                 \
        tg->n_rows = (N_ROWS);                                                             \
        int64_t ne_[2] = { (N_IN), (N_ROWS) };                                             \
        bad |= gguf_writer_add_tensor(w, NAME, (TYPE), (NORM) ? 1 : 2, ne_, fill_tensor, tg); \
    } while (0)
    ADD("token_embd.weight", sh->tied ? big_type : mat_type, sh->n_embd, sh->n_vocab, 0.1f, 0);
    ADD("output_norm.weight", QT_F32, sh->n_embd, 1, 0.1f, 1);
    if (!sh->tied) ADD("output.weight", big_type, sh->n_embd, sh->n_vocab, 0.1f, 0);
    for (int il = 0; il < sh->n_layer; il++) {
        uint32_t vt = more_bits(il, sh->n_layer) ? big_type : mat_type;
#define L(s) (snprintf(name, sizeof name, "blk.%d." s, il), name)
        ADD(L("attn_norm.weight"), QT_F32, sh->n_embd, 1, 0.1f, 1);
        ADD(L("attn_q.weight"), mat_type, sh->n_embd, q_dim, 0.1f, 0);
        ADD(L("attn_k.weight"), mat_type, sh->n_embd, kv_dim, 0.1f, 0);
        ADD(L("attn_v.weight"), vt, sh->n_embd, kv_dim, 0.05f, 0);
        ADD(L("attn_output.weight"), mat_type, q_dim, sh->n_embd, 0.05f, 0);
        ADD(L("ffn_norm.weight"), QT_F32, sh->n_embd, 1, 0.1f, 1);
        ADD(L("ffn_gate.weight"), mat_type, sh->n_embd, sh->n_ff, 0.05f, 0);
        ADD(L("ffn_up.weight"), mat_type, sh->n_embd, sh->n_ff, 0.05f, 0);
        ADD(L("ffn_down.weight"), vt, sh->n_ff, sh->n_embd, 0.05f, 0);
#undef L
    }
#undef ADD
    if (bad) {
        fprintf(stderr, "error: cannot describe the model (out of memory?)\n");
        goto done;
    }
    if (gguf_writer_write(w, o.out, err, sizeof err)) {
        fprintf(stderr, "error: %s\n", err);
        goto done;
    }
    fprintf(stderr, "wrote %s: %s, %s, %d tensors\n", o.out, sh->name, o.type, nt);
    rc = 0;
done:
    if (toks)
        for (int i = 0; i < sh->n_vocab; i++) free(toks[i]);
    free(toks);
    free(scores);
    free(ttypes);
    free(gens);
    gguf_writer_free(w);
    return rc;
}
