/* test_gen_model.c - `sparq gen-model --weights --vocab-from`, the export
 * path of the trained test model (scripts/train_testmodel.py).
 *
 * A weights file with a known value at every position goes in; the GGUF
 * that comes out must hold each tensor at the place this test expects. The
 * tensor order below is written here from the layout (llama.cpp's
 * tensor names, [rows][cols] row-major), not taken from cli_gen_model.c, so
 * a tensor written in the wrong order, transposed or shifted shows. The
 * vocabulary must be stories260K's, token for token. Bad files fail with one
 * line. Runs the binary from $SPARQ_BUILD (default build/). */
#include "test.h"
#include "tensor/gguf.h"
#include "tensor/quant.h"
#include "util/paths.h"
#include "sparq.h"
#include <math.h>
#include <sys/wait.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <unistd.h>

static char bin[1024], tmp[256];

static int run(const char *args, char **err)
{
    char cmd[4096], e[512];
    snprintf(e, sizeof e, "%s/err.txt", tmp);
    snprintf(cmd, sizeof cmd, "timeout 120 %s %s >/dev/null 2>%s", bin, args, e);
    int st = system(cmd);
    size_t n;
    *err = test_read_file(e, &n);
    if (!*err) *err = calloc(1, 1);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* tiny-d64: n_embd 256, 4 layers, 4 heads of 64, 2 KV heads, n_ff 768, vocab 512 */
enum { E = 256, NL = 4, QD = 256, KVD = 128, FF = 768, V = 512 };

typedef struct tdesc { char name[64]; int64_t rows, cols; } tdesc;

static int tensor_list(tdesc *t)
{
    int n = 0;
#define T(r, c, ...) (snprintf(t[n].name, sizeof t[n].name, __VA_ARGS__), t[n].rows = (r), t[n].cols = (c), n++)
    T(V, E, "token_embd.weight");
    T(1, E, "output_norm.weight");
    T(V, E, "output.weight");
    for (int l = 0; l < NL; l++) {
        T(1, E, "blk.%d.attn_norm.weight", l);
        T(QD, E, "blk.%d.attn_q.weight", l);
        T(KVD, E, "blk.%d.attn_k.weight", l);
        T(KVD, E, "blk.%d.attn_v.weight", l);
        T(E, QD, "blk.%d.attn_output.weight", l);
        T(1, E, "blk.%d.ffn_norm.weight", l);
        T(FF, E, "blk.%d.ffn_gate.weight", l);
        T(FF, E, "blk.%d.ffn_up.weight", l);
        T(E, FF, "blk.%d.ffn_down.weight", l);
    }
#undef T
    return n;
}

/* The value at flat position i: distinct per position and exact in F32. */
static float value_at(int64_t i) { return (float)(i % 1000003) * 1e-6f - 0.5f; }

static int write_weights(const char *path, int64_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    for (int64_t i = 0; i < n; i++) {
        float x = value_at(i);
        if (fwrite(&x, sizeof x, 1, f) != 1) { fclose(f); return -1; }
    }
    return fclose(f);
}

/* gen-model --init scaled on smollm2-135m's shapes (Q8_0): each matrix's
 * values have the std max(1 / sqrt(fan-in), 0.02) (token_embd and output
 * 3 / sqrt(n_embd)), every Q8_0 block scale is 0 or a normal f16, and on
 * x86 sparq decoding it takes no subnormal operand (MXCSR's sticky DE
 * flag), with a control showing a subnormal operand does set the flag. */
static void test_init_scaled(void)
{
    char out[512], args[1024], *err, m[256];
    snprintf(out, sizeof out, "%s/scaled.gguf", tmp);
    snprintf(args, sizeof args, "gen-model --shape smollm2-135m --init scaled --type Q8_0 -o %s", out);
    int rc = run(args, &err);
    CHECK(rc == 0, "gen-model --init scaled: exit %d: %s", rc, err);
    free(err);
    snprintf(args, sizeof args, "gen-model --shape tiny --init fanin -o %s.x", out);
    rc = run(args, &err);
    CHECK(rc == 2 && strstr(err, "--init must be plain or scaled"), "--init fanin: exit %d: %s", rc, err);
    free(err);
    gguf_file *g = NULL;
    if (rc == 0 || gguf_open(out, &g, m, sizeof m) != 0) {
        CHECK(0, "cannot open %s: %s", out, m);
        return;
    }
    const int64_t n_embd = 576;
    int n_mat = 0, n_subnormal = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *x = &g->tensors[i];
        if (x->n_dims != 2 || x->type != QT_Q8_0) continue;
        const char *name = x->name.data;
        const int64_t fan_in = x->ne[0], n = x->ne[0] * x->ne[1], nblk = n / 32;
        double want = strncmp(name, "token_embd", 10) == 0 || strncmp(name, "output.", 7) == 0
                          ? 3.0 / sqrt((double)n_embd)
                          : fmax(1.0 / sqrt((double)fan_in), 0.02);
        double sum = 0, sum2 = 0;
        for (int64_t b = 0; b < nblk; b++) {
            const uint8_t *blk = (const uint8_t *)x->data + 34 * b;
            uint16_t h;
            memcpy(&h, blk, 2);
            const int exp = (h >> 10) & 31;
            n_subnormal += exp == 0 && (h & 0x3ff) != 0;
            const float d = fp16_to_fp32(h);
            for (int j = 0; j < 32; j++) {
                const double v = d * (int8_t)blk[2 + j];
                sum += v, sum2 += v * v;
            }
        }
        const double mean = sum / (double)n, sd = sqrt(sum2 / (double)n - mean * mean);
        CHECK(fabs(sd / want - 1) < 0.05, "%s: std %.5f, want %.5f", name, sd, want);
        n_mat++;
    }
    CHECK(n_mat == 2 + 7 * 30 - 1, "smollm2-135m has %d Q8_0 matrices (tied output)", n_mat);
    CHECK(n_subnormal == 0, "%d Q8_0 block scales are subnormal f16", n_subnormal);
    gguf_close(g);

#if defined(__x86_64__)
    sparq_model *model = NULL;
    sparq_context *c = NULL;
    CHECK(sparq_model_load(out, &model, m, sizeof m) == 0, "%s", m);
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 1; /* MXCSR is per thread: all of the work on this one */
    if (model && sparq_context_create(model, &cp, &c, m, sizeof m) == 0) {
        const int nv = sparq_model_n_vocab(model);
        int32_t ids[160];
        for (int i = 0; i < 160; i++) ids[i] = (i * 7919 + 13) % nv;
        _mm_setcsr(_mm_getcsr() & ~0x3fu);
        CHECK(sparq_eval(c, ids, 128, NULL) == 0, "prefill");
        for (int i = 128; i < 160; i++) CHECK(sparq_eval(c, &ids[i], 1, NULL) == 0, "decode");
        CHECK(!(_mm_getcsr() & 2), "a prefill and 32 decode steps took a subnormal operand");
        volatile float tiny = 1e-40f, two = 2.0f;
        volatile float y = tiny * two;
        (void)y;
        CHECK(_mm_getcsr() & 2, "control: a subnormal operand sets MXCSR.DE");
    } else {
        CHECK(0, "model or context: %s", m);
    }
    sparq_context_free(c);
    sparq_model_free(model);
#endif
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    char vocab[1024];
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_gen_model");
    }
    if (path_find("stories260K.gguf", vocab, sizeof vocab)) {
        test_skip("stories260K.gguf not found (the vocabulary to copy)");
        return test_summary("test_gen_model");
    }
    snprintf(tmp, sizeof tmp, "/tmp/sparq_genmodel_XXXXXX");
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp failed");
        return test_summary("test_gen_model");
    }
    tdesc t[3 + 9 * NL];
    const int nt = tensor_list(t);
    int64_t total = 0;
    for (int i = 0; i < nt; i++) total += t[i].rows * t[i].cols;

    char w[512], wshort[512], wnan[512], out[512], args[4096], *err;
    snprintf(w, sizeof w, "%s/w.f32", tmp);
    snprintf(wshort, sizeof wshort, "%s/short.f32", tmp);
    snprintf(wnan, sizeof wnan, "%s/nan.f32", tmp);
    snprintf(out, sizeof out, "%s/m.gguf", tmp);
    CHECK(write_weights(w, total) == 0 && write_weights(wshort, total - 1) == 0, "writing weights");

    /* the export: every tensor where the order above puts it, exactly (F32) */
    snprintf(args, sizeof args, "gen-model --shape tiny-d64 --weights %s --vocab-from %s --type F32 -o %s", w, vocab,
             out);
    int rc = run(args, &err);
    CHECK(rc == 0, "gen-model exit %d: %s", rc, err);
    free(err);
    gguf_file *g = NULL, *sv = NULL;
    char m[256];
    if (rc == 0 && gguf_open(out, &g, m, sizeof m) == 0 && gguf_open(vocab, &sv, m, sizeof m) == 0) {
        int64_t off = 0, bad = 0;
        CHECK(g->n_tensors == (uint64_t)nt, "%llu tensors, expected %d", (unsigned long long)g->n_tensors, nt);
        for (int i = 0; i < nt; i++) {
            const gguf_tensor *x = gguf_find_tensor(g, t[i].name);
            CHECK(x && x->type == QT_F32 && x->ne[0] == t[i].cols && x->ne[1] == t[i].rows, "%s: shape", t[i].name);
            for (int64_t j = 0; x && x->type == QT_F32 && j < t[i].rows * t[i].cols; j++) {
                float y;
                memcpy(&y, (const char *)x->data + 4 * j, 4);
                bad += y != value_at(off + j);
            }
            off += t[i].rows * t[i].cols;
        }
        CHECK(bad == 0, "%lld values not where the tensor order puts them", (long long)bad);
        const gguf_kv *a = gguf_find_kv(g, "tokenizer.ggml.tokens"), *e = gguf_find_kv(sv, "tokenizer.ggml.tokens");
        int same = a && e && a->n == e->n && a->strs && e->strs;
        for (uint64_t i = 0; same && i < a->n; i++)
            same = a->strs[i].len == e->strs[i].len && memcmp(a->strs[i].data, e->strs[i].data, a->strs[i].len) == 0;
        CHECK(same, "the vocabulary is stories260K's, token for token");
        const gguf_kv *sa = gguf_find_kv(g, "tokenizer.ggml.scores"), *se = gguf_find_kv(sv, "tokenizer.ggml.scores");
        CHECK(sa && se && sa->n == se->n && gguf_arr_float(sa, 300) == gguf_arr_float(se, 300), "scores copied");
        int64_t hd = 0, ctx = 0;
        CHECK(gguf_get_int(g, "llama.rope.dimension_count", &hd) == 1 && hd == 64, "head size 64: %lld",
              (long long)hd);
        CHECK(gguf_get_int(g, "llama.context_length", &ctx) == 1 && ctx == 2048, "context 2048: %lld",
              (long long)ctx);
    } else {
        CHECK(0, "cannot open the written model or the vocabulary: %s", m);
    }
    gguf_close(g);
    gguf_close(sv);

    /* the model runs: greedy decoding of a few tokens succeeds */
    snprintf(args, sizeof args, "run -m %s -p 'Once upon a time' -n 4 --temp 0 -t 1", out);
    rc = run(args, &err);
    CHECK(rc == 0, "run on the exported model: exit %d: %s", rc, err);
    free(err);

    /* bad input: one line, non-zero exit, no file left behind */
    struct { const char *args_fmt, *needle; } bad[] = {
        { "gen-model --shape tiny-d64 --weights %s --vocab-from %s --type F16 -o %s.x", "needs 3410176" },
        { "gen-model --shape tiny-d64 --weights %s.none --vocab-from %s --type F16 -o %s.x", "--weights" },
        { "gen-model --shape tiny-qwen2 --weights %s --vocab-from %s --type F16 -o %s.x", "--vocab-from" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, bad[i].args_fmt, i == 0 ? wshort : w, vocab, out);
        rc = run(args, &err);
        CHECK(rc != 0 && strstr(err, "error") && strstr(err, bad[i].needle), "`%s`: exit %d, '%s'", args, rc, err);
        free(err);
        snprintf(args, sizeof args, "%s.x", out);
        CHECK(access(args, F_OK) != 0, "no output after a failure");
    }
    /* a NaN weight is refused */
    FILE *f = fopen(wnan, "wb");
    for (int64_t i = 0; f && i < total; i++) {
        float x = i == 12345 ? NAN : 0.0f;
        fwrite(&x, sizeof x, 1, f);
    }
    if (f) fclose(f);
    snprintf(args, sizeof args, "gen-model --shape tiny-d64 --weights %s --type F16 -o %s.x", wnan, out);
    rc = run(args, &err);
    CHECK(rc != 0 && strstr(err, "not finite"), "NaN weight: exit %d, '%s'", rc, err);
    free(err);
    /* a vocabulary of the wrong size */
    snprintf(args, sizeof args, "gen-model --shape tiny --weights %s --vocab-from %s --type F16 -o %s.x", w, out, out);
    rc = run(args, &err);
    CHECK(rc != 0 && strstr(err, "error"), "weights of another shape: exit %d, '%s'", rc, err);
    free(err);

    test_init_scaled();

    snprintf(args, sizeof args, "rm -rf %s", tmp);
    if (system(args) != 0) fprintf(stderr, "note: could not remove %s\n", tmp);
    return test_summary("test_gen_model");
}
