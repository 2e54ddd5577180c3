/* test_phi3.c - the phi3 architecture (Phi-3 style GGUFs): fused attn_qkv
 * and gate/up tensors, NEOX RoPE, longrope factor tables, and the sliding
 * window llama.cpp ignores. Runs `sparq gen-model` from $SPARQ_BUILD
 * (default build/) for tiny-phi3 / tiny-phi3-128k files in /tmp and loads
 * them with the public API.
 *
 * The reference is tests/naive_forward.h: a double-precision forward pass
 * from the GGUF tensors, splitting attn_qkv rows as [q; k; v] and ffn_up
 * rows as [gate; up] (gate through SiLU, llama.cpp's swiglu), attending over
 * every earlier position. tiny-phi3 records a sliding window of 4 and the
 * prompt is longer, so agreeing with the reference also shows the window is
 * ignored, as llama.cpp ignores it for phi3.
 *
 * The splits are pinned down by patched copies: swapping the gate and up
 * halves of every ffn_up, or the k and v blocks of every attn_qkv, moves
 * sparq's logits far away and onto the reference of the patched file.
 * longrope: a context above the original length (after llama.cpp's
 * rounding up to a multiple of 256) uses the long table, else the short
 * one, both with rope.scaling.attn_factor on cos and sin. Malformed variants fail to load
 * with a message naming the problem.
 */
#include "test.h"
#include "tensor/gguf.h"
#include "naive_forward.h"
#include "sparq.h"

#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

static char bin[1024];

enum { N_TOK = 7, VOCAB = 512, N_FF = 512, N_EMBD = 384, HD = 96 };

/* BOS, ordinary pieces, byte tokens and <|user|> <|end|> (ids 458, 455) */
static const int32_t prompt[N_TOK] = { 1, 300, 17, 458, 402, 455, 99 };

static int make_temp(char *path, size_t size, const char *stem)
{
    snprintf(path, size, "/tmp/%s_XXXXXX", stem);
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    return 0;
}

static int gen_model(const char *shape, const char *type, const char *path)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s gen-model --shape %s --type %s --seed 7 -o %s 2>/dev/null", bin, shape, type,
             path);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* sparq's logits [N_TOK][VOCAB] of the prompt in a context of n_ctx (see
 * nf_engine_logits). */
static float *sparq_logits(const char *path, int64_t n_ctx, int one_by_one)
{
    int v = 0;
    float *l = nf_engine_logits(path, prompt, N_TOK, n_ctx, one_by_one, &v);
    if (l && v != VOCAB) {
        CHECK(0, "%s: vocabulary %d, want %d", path, v, VOCAB);
        free(l);
        l = NULL;
    }
    return l;
}

/* ---- the reference, on a file ----------------------------------------------- */

/* reference logits [N_TOK][VOCAB]; NULL on failure */
static float *ref_logits(const nf_model *r)
{
    float *l = malloc((size_t)N_TOK * VOCAB * sizeof *l);
    if (!l || r->n_vocab != VOCAB || nf_forward(r, prompt, N_TOK, l)) {
        CHECK(0, "reference forward failed");
        free(l);
        return NULL;
    }
    return l;
}

static float *ref_logits_of(const char *path)
{
    nf_file rf;
    float *l = nf_file_open(&rf, path) ? NULL : ref_logits(&rf.r);
    nf_file_close(&rf);
    return l;
}

/* ---- patched copies ------------------------------------------------------------ */

/* Rows [a, a+n) and [b, b+n) of every tensor whose name ends in suffix
 * trade places. */
typedef struct row_swap {
    const char *suffix;
    int64_t a, b, n;
} row_swap;

static int swap_rows(const char *name, const gguf_tensor *t, float *d, void *user)
{
    const row_swap *s = user;
    const size_t nl = strlen(name), sl = strlen(s->suffix);
    if (nl < sl || strcmp(name + nl - sl, s->suffix) != 0) return 0;
    const int64_t w = t->ne[0];
    for (int64_t j = 0; j < s->n * w; j++) {
        float tmp = d[s->a * w + j];
        d[s->a * w + j] = d[s->b * w + j];
        d[s->b * w + j] = tmp;
    }
    return 1;
}

static int swap_rows_copy(const char *src, const char *dst, const char *suffix, int64_t a, int64_t b, int64_t n)
{
    row_swap s = { suffix, a, b, n };
    return nf_edit_copy(src, dst, swap_rows, &s);
}

/* Copies src to dst with the tensor-info entry of `name` edited: renamed
 * to `rename` (same length) and/or its ne[1] set to `ne1` (> 0). */
static int edit_info_copy(const char *src, const char *dst, const char *name, const char *rename, int64_t ne1)
{
    size_t size;
    uint8_t *buf = test_read_file(src, &size);
    const size_t len = strlen(name);
    uint8_t *at = buf ? memmem(buf, size, name, len) : NULL;
    int rc = -1;
    if (at && (!rename || strlen(rename) == len)) {
        if (rename) memcpy(at, rename, len);
        if (ne1 > 0) {
            uint64_t v = (uint64_t)ne1; /* name | u32 n_dims | u64 ne[0] | u64 ne[1] */
            memcpy(at + len + 4 + 8, &v, 8);
        }
        FILE *o = fopen(dst, "wb");
        rc = o && fwrite(buf, 1, size, o) == size ? 0 : -1;
        if (o) fclose(o);
    }
    free(buf);
    return rc;
}

/* ---- the tests ------------------------------------------------------------------- */

static void test_api(const char *f32)
{
    char err[512];
    sparq_model *m = NULL;
    if (sparq_model_load(f32, &m, err, sizeof err)) {
        CHECK(0, "%s", err);
        return;
    }
    CHECK(strcmp(sparq_model_arch(m), "phi3") == 0, "arch %s", sparq_model_arch(m));
    CHECK(sparq_model_n_layer(m) == 2 && sparq_model_n_head(m) == 4 && sparq_model_n_kv_head(m) == 2 &&
          sparq_model_head_dim(m) == HD && sparq_model_n_vocab(m) == VOCAB && sparq_model_n_ctx_train(m) == 4096,
          "hparams: layers %d heads %d/%d hd %d vocab %d ctx %lld", sparq_model_n_layer(m), sparq_model_n_head(m),
          sparq_model_n_kv_head(m), sparq_model_head_dim(m), sparq_model_n_vocab(m),
          (long long)sparq_model_n_ctx_train(m));
    /* Phi-3's tail: <|endoftext|> (EOS) at 448 and <|end|> at 455 end a
     * generation, <|user|> at 458 does not */
    CHECK(sparq_token_bos(m) == 1 && sparq_token_eos(m) == 448 && sparq_token_is_eog(m, 448) &&
          sparq_token_is_eog(m, 455) && !sparq_token_is_eog(m, 458), "specials: bos %d eos %d",
          sparq_token_bos(m), sparq_token_eos(m));
    char piece[32];
    int n = sparq_token_to_piece(m, 455, piece, sizeof piece);
    CHECK(n >= 0, "piece of <|end|>");
    sparq_model_free(m);
}

static void test_logits(const char *f32, const char *q8, const char *patched)
{
    const size_t nl = (size_t)N_TOK * VOCAB;
    nf_file rf;
    if (nf_file_open(&rf, f32)) {
        nf_file_close(&rf);
        return;
    }
    int64_t swa = 0;
    CHECK(gguf_get_int(rf.gf, "phi3.attention.sliding_window", &swa) == 1 && swa > 0 && swa < N_TOK,
          "the prompt (%d) is longer than the recorded window (%lld)", N_TOK, (long long)swa);
    CHECK(rf.r.neox && rf.r.n_ff == N_FF && rf.r.rope_dim == HD && gguf_find_tensor(rf.gf, "blk.0.attn_qkv.weight") &&
          !gguf_find_tensor(rf.gf, "blk.0.ffn_gate.weight"), "a fused phi3 file");
    float *ref = ref_logits(&rf.r);
    float *got = sparq_logits(f32, 64, 0), *dec = sparq_logits(f32, 64, 1), *got_q8 = sparq_logits(q8, 64, 0);
    if (ref && got && dec && got_q8) {
        const double scale = nf_rms(ref, NULL, nl);
        double d = nf_max_diff(got, ref, nl);
        CHECK(d < 1e-4 && scale > 0.1, "F32 prefill logits vs naive forward: max |diff| %.3g (logit rms %.3g)", d,
              scale);
        d = nf_max_diff(dec, ref, nl);
        CHECK(d < 1e-4, "F32 token-by-token decode logits vs naive forward: max |diff| %.3g", d);
        int finite = 1;
        for (size_t i = 0; i < nl; i++) finite &= isfinite(got_q8[i]);
        d = nf_rms(got_q8, got, nl);
        CHECK(finite && d < 0.1 * scale, "Q8_0 vs F32: rms diff %.3g, logit rms %.3g", d, scale);
    }

    /* gate/up halves swapped: [up; gate] in every ffn_up */
    int changed = swap_rows_copy(f32, patched, "ffn_up.weight", 0, N_FF, N_FF);
    CHECK(changed == 2, "swapped gate/up in %d tensors", changed);
    float *got_s = changed > 0 ? sparq_logits(patched, 64, 0) : NULL, *ref_s = ref_logits_of(patched);
    if (got && got_s && ref_s) {
        CHECK(nf_max_diff(got_s, got, nl) > 0.05, "swapping gate and up moves the logits (%.3g)",
              nf_max_diff(got_s, got, nl));
        CHECK(nf_max_diff(got_s, ref_s, nl) < 1e-4, "swapped file vs its reference: %.3g", nf_max_diff(got_s, ref_s, nl));
    }
    free(got_s);
    free(ref_s);

    /* k and v blocks swapped in every attn_qkv: rows [q_dim, +kv) <-> [q_dim + kv, +kv) */
    const int64_t q_dim = 4 * HD, kv_dim = 2 * HD;
    changed = swap_rows_copy(f32, patched, "attn_qkv.weight", q_dim, q_dim + kv_dim, kv_dim);
    CHECK(changed == 2, "swapped k/v in %d tensors", changed);
    got_s = changed > 0 ? sparq_logits(patched, 64, 0) : NULL;
    ref_s = ref_logits_of(patched);
    if (got && got_s && ref_s) {
        CHECK(nf_max_diff(got_s, got, nl) > 0.05, "swapping k and v moves the logits (%.3g)", nf_max_diff(got_s, got, nl));
        CHECK(nf_max_diff(got_s, ref_s, nl) < 1e-4, "k/v-swapped file vs its reference: %.3g",
              nf_max_diff(got_s, ref_s, nl));
    }
    free(got_s);
    free(ref_s);
    free(ref); free(got); free(dec); free(got_q8);
    nf_file_close(&rf);
}

static void test_longrope(const char *lr)
{
    const size_t nl = (size_t)N_TOK * VOCAB;
    nf_file rf;
    if (nf_file_open(&rf, lr)) {
        nf_file_close(&rf);
        return;
    }
    const int n_fac = HD / 2;
    const float *shrt = nf_tensor(&rf.r, "rope_factors_short.weight", n_fac);
    const float *lng = nf_tensor(&rf.r, "rope_factors_long.weight", n_fac);
    int64_t orig = 0;
    CHECK(shrt && lng && gguf_get_int(rf.gf, "phi3.rope.scaling.original_context_length", &orig) == 1 && orig == 400,
          "longrope tables and original length %lld", (long long)orig);
    /* sqrt(1 + ln(8192 / 400) / ln 400), as Phi-3's converter computes it */
    CHECK_NEAR(rf.r.attn_factor, sqrt(1.0 + log(8192.0 / 400.0) / log(400.0)), 1e-6);
    if (!shrt || !lng) {
        nf_file_close(&rf);
        return;
    }
    rf.r.rope_factors = shrt;
    float *ref_short = ref_logits(&rf.r);
    rf.r.rope_factors = lng;
    float *ref_long = ref_logits(&rf.r);
    const double af = rf.r.attn_factor;
    rf.r.attn_factor = 1.0;
    float *ref_long_af1 = ref_logits(&rf.r);
    rf.r.attn_factor = af;
    /* llama.cpp's rule: long when the context rounded up to a multiple of
     * 256 exceeds the original 400, so 256 is short but 257 (-> 512) and
     * 300 are long although below 400 */
    static const struct { int64_t n_ctx; int is_long; } ctxs[] = {
        { 64, 0 }, { 256, 0 }, { 257, 1 }, { 300, 1 }, { 1024, 1 },
    };
    for (size_t i = 0; i < sizeof ctxs / sizeof ctxs[0] && ref_short && ref_long && ref_long_af1; i++) {
        float *got = sparq_logits(lr, ctxs[i].n_ctx, (int)(i % 2));
        const float *want = ctxs[i].is_long ? ref_long : ref_short;
        if (got)
            CHECK(nf_max_diff(got, want, nl) < 1e-4, "context %lld (%s factors): max |diff| %.3g",
                  (long long)ctxs[i].n_ctx, ctxs[i].is_long ? "long" : "short", nf_max_diff(got, want, nl));
        free(got);
    }
    if (ref_short && ref_long && ref_long_af1) {
        CHECK(nf_max_diff(ref_short, ref_long, nl) > 0.05, "the tables differ in effect (%.3g)",
              nf_max_diff(ref_short, ref_long, nl));
        CHECK(nf_max_diff(ref_long_af1, ref_long, nl) > 0.05, "the attention factor matters (%.3g)",
              nf_max_diff(ref_long_af1, ref_long, nl));
    }
    free(ref_short); free(ref_long); free(ref_long_af1);
    nf_file_close(&rf);
}

/* Malformed phi3 variants: each load fails with a message naming it. */
static void test_refusals(const char *f32, const char *lr, const char *patched)
{
    static const struct {
        int lr;
        const char *name, *rename;
        int64_t ne1;
        const char *want;
    } cases[] = {
        /* one longrope table without the other */
        { 1, "rope_factors_short.weight", "rope_factors_shorx.weight", 0, "both rope_factors_short" },
        /* ffn_up with n_ff rows (an unfused file labelled phi3) */
        { 0, "blk.1.ffn_up.weight", NULL, N_FF, "blk.1.ffn_up.weight' has shape [384, 512], expected [384, 1024]" },
        /* attn_qkv with too few rows */
        { 0, "blk.0.attn_qkv.weight", NULL, 4 * HD + 2 * HD, "blk.0.attn_qkv.weight' has shape" },
        /* neither fused nor separate Q/K/V */
        { 0, "blk.1.attn_qkv.weight", "blk.1.attn_qkx.weight", 0, "block 1 has neither attn_qkv.weight nor attn_q/k/v.weight" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (edit_info_copy(cases[i].lr ? lr : f32, patched, cases[i].name, cases[i].rename, cases[i].ne1)) {
            CHECK(0, "cannot patch %s", cases[i].name);
            continue;
        }
        char err[512] = "";
        sparq_model *m = NULL;
        int rc = sparq_model_load(patched, &m, err, sizeof err);
        CHECK(rc != 0 && m == NULL && strstr(err, cases[i].want) && !strchr(err, '\n'), "case %zu: rc %d: '%s'", i,
              rc, err);
        sparq_model_free(m);
    }
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_phi3");
    }
    char f32[64], q8[64], lr[64], patched[64];
    if (make_temp(f32, sizeof f32, "sparq_phi3") || make_temp(q8, sizeof q8, "sparq_phi3") ||
        make_temp(lr, sizeof lr, "sparq_phi3") || make_temp(patched, sizeof patched, "sparq_phi3")) {
        CHECK(0, "mkstemp");
        return test_summary("test_phi3");
    }
    int rc1 = gen_model("tiny-phi3", "F32", f32), rc2 = gen_model("tiny-phi3", "Q8_0", q8);
    int rc3 = gen_model("tiny-phi3-128k", "F32", lr);
    CHECK(rc1 == 0 && rc2 == 0 && rc3 == 0, "gen-model exits %d %d %d", rc1, rc2, rc3);
    if (rc1 == 0 && rc2 == 0 && rc3 == 0) {
        test_api(f32);
        test_logits(f32, q8, patched);
        test_longrope(lr);
        test_refusals(f32, lr, patched);
    }
    unlink(f32);
    unlink(q8);
    unlink(lr);
    unlink(patched);
    return test_summary("test_phi3");
}
