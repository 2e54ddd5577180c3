/* test_import.c - llama.cpp sequence states into KV files
 * (sparq_import_llama_state, io/llama_state.h):
 *   - states written here from sparq's own cache, in every layout llama.cpp
 *     writes (V rows or V transposed; f32, f16, bf16; cells out of position
 *     order), import to a file that decodes exactly as the context whose
 *     cache they hold (f32: logits bit for bit);
 *   - files that llama.cpp itself wrote (tests/data/llamacpp/, made by
 *     scripts/llamacpp_state.sh with the llama.cpp build named in their
 *     README): after import, greedy continuations equal sparq's own prefill
 *     of the same tokens;
 *   - a truncated, foreign, older-format or inconsistent file is a one-line
 *     error, never a crash or a file claimed as written.
 */
#include "test.h"
#include "core/model.h"
#include "io/llama_state.h"
#include "tensor/quant.h"
#include "sparq.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- an independent writer of the state format ---------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *x, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, x, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }

static void put_elems(buf *b, int type, const float *x, int n)
{
    for (int i = 0; i < n; i++) {
        if (type == QT_F32) {
            put(b, &x[i], 4);
        } else {
            uint16_t h;
            quant_from_float((uint32_t)type, &x[i], &h, 1);
            put(b, &h, 2);
        }
    }
}

/* keys/values [n_layer][n][width] f32; cells stored in the order perm[] */
static buf write_state(const int32_t *tokens, int n, int n_layer, int width, const float *K, const float *V, int type,
                       int v_trans, const int *perm)
{
    buf b = { 0 };
    put_u32(&b, 0x67677371u);
    put_u32(&b, 2);
    put_u32(&b, (uint32_t)n);
    put(&b, tokens, (size_t)n * 4);
    put_u32(&b, 1); /* streams */
    put_u32(&b, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        put_u32(&b, (uint32_t)perm[i]);
        put_u32(&b, 1);
        put_u32(&b, 0);
    }
    put_u32(&b, (uint32_t)v_trans);
    put_u32(&b, (uint32_t)n_layer);
    const int es = type == QT_F32 ? 4 : 2;
    for (int l = 0; l < n_layer; l++) {
        put_u32(&b, (uint32_t)type);
        put_u64(&b, (uint64_t)width * es);
        for (int i = 0; i < n; i++) put_elems(&b, type, K + ((size_t)l * n + perm[i]) * width, width);
    }
    for (int l = 0; l < n_layer; l++) {
        put_u32(&b, (uint32_t)type);
        if (!v_trans) {
            put_u64(&b, (uint64_t)width * es);
            for (int i = 0; i < n; i++) put_elems(&b, type, V + ((size_t)l * n + perm[i]) * width, width);
        } else {
            put_u32(&b, (uint32_t)es);
            put_u32(&b, (uint32_t)width);
            for (int j = 0; j < width; j++)
                for (int i = 0; i < n; i++) put_elems(&b, type, V + ((size_t)l * n + perm[i]) * width + j, 1);
        }
    }
    return b;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    const int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* ---- helpers --------------------------------------------------------------- */

/* Greedy continuation of ctx for n_gen tokens from the logits `last`. */
static void greedy(sparq_context *c, float *last, int V, int n_gen, int32_t *out)
{
    for (int i = 0; i < n_gen; i++) {
        int best = 0;
        for (int j = 1; j < V; j++)
            if (last[j] > last[best]) best = j;
        out[i] = best;
        if (sparq_eval(c, &out[i], 1, last)) {
            for (int k = i + 1; k < n_gen; k++) out[k] = -1;
            return;
        }
    }
}

/* sparq's own prefill of tokens[0..n) and the first n_gen greedy tokens */
static int own_prefill(sparq_model *m, int kv_type, const int32_t *tok, int n, int n_gen, int32_t *gen,
                       sparq_context **keep)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n + n_gen + 8;
    cp.kv_type = kv_type;
    sparq_context *c = NULL;
    char err[256];
    const int V = sparq_model_n_vocab(m);
    float *logits = malloc((size_t)V * sizeof(float));
    int rc = -1;
    if (logits && sparq_context_create(m, &cp, &c, err, sizeof err) == 0 && sparq_eval(c, tok, n, logits) == 0) {
        if (gen) greedy(c, logits, V, n_gen, gen);
        rc = 0;
    }
    free(logits);
    if (keep && rc == 0) *keep = c;
    else sparq_context_free(c);
    return rc;
}

/* import path into kv, load it, and continue greedily */
static int import_and_continue(sparq_model *m, const char *state, const char *kv, int kv_type, int n_gen,
                               int32_t *gen, int64_t *n_out, float *first_logits, char *err, size_t err_size)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 0;
    if (sparq_import_llama_state(m, &cp, state, kv, "ivf", kv_type, n_out, err, err_size)) return -1;
    sparq_context *c = NULL;
    cp.n_ctx = 0;
    if (sparq_context_load_kv(m, &cp, kv, SPARQ_VERIFY_ALWAYS, &c, err, err_size)) return -1;
    const int V = sparq_model_n_vocab(m);
    /* the file holds the prompt's keys; the next logits come from feeding
     * the last prompt token again would be wrong: the import's tokens are
     * the cache's, so the continuation starts from a fresh eval of the
     * first generated token, which the caller passes in gen[0] */
    float *logits = malloc((size_t)V * sizeof(float));
    int rc = -1;
    if (logits && sparq_eval(c, &gen[0], 1, logits) == 0) {
        if (first_logits) memcpy(first_logits, logits, (size_t)V * sizeof(float));
        greedy(c, logits, V, n_gen - 1, gen + 1);
        rc = 0;
    }
    free(logits);
    sparq_context_free(c);
    return rc;
}

/* ---- states written here --------------------------------------------------- */

static void own_states(sparq_model *m)
{
    const model_hparams *hp = &m->hp;
    const int L = hp->n_layer, width = hp->n_kv_head * hp->head_dim, V = sparq_model_n_vocab(m);
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
    int32_t tok[128];
    const int n = sparq_tokenize(m, text, (int)strlen(text), 1, tok, 128);
    CHECK(n > 8 && n < 128, "prompt tokens: %d", n);
    if (n <= 8 || n >= 128) return;
    enum { NGEN = 24 };
    sparq_context *c = NULL;
    int32_t ref[NGEN];
    CHECK(own_prefill(m, SPARQ_KV_F32, tok, n, NGEN, ref, &c) == 0, "own f32 prefill");
    if (!c) return;
    /* the prompt's keys and values as llama.cpp lays them out: heads side by side */
    float *K = malloc((size_t)L * n * width * sizeof(float)), *Vv = malloc((size_t)L * n * width * sizeof(float));
    for (int l = 0; l < L; l++)
        for (int h = 0; h < hp->n_kv_head; h++) {
            const float *k = kv_k(&c->kv, l, h), *v = kv_v(&c->kv, l, h);
            for (int p = 0; p < n; p++)
                for (int e = 0; e < hp->head_dim; e++) {
                    K[((size_t)l * n + p) * width + h * hp->head_dim + e] = k[(size_t)p * hp->head_dim + e];
                    Vv[((size_t)l * n + p) * width + h * hp->head_dim + e] = v[(size_t)p * hp->head_dim + e];
                }
        }
    /* the logits after the first generated token, from the original cache */
    sparq_context_free(c);
    c = NULL;
    float *want = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    CHECK(own_prefill(m, SPARQ_KV_F32, tok, n, 0, NULL, &c) == 0 && sparq_eval(c, &ref[0], 1, want) == 0,
          "reference logits");
    sparq_context_free(c);

    int *perm = malloc((size_t)n * sizeof(int));
    char state[64], kv[64], err[512];
    snprintf(state, sizeof state, "/tmp/sparq-test-import-%d.state", (int)getpid());
    snprintf(kv, sizeof kv, "/tmp/sparq-test-import-%d.kv", (int)getpid());
    const struct { int type, v_trans, shuffle; const char *name; } cases[] = {
        { QT_F32, 0, 0, "f32, V rows" },
        { QT_F32, 1, 1, "f32, V transposed, cells shuffled" },
        { QT_F16, 0, 1, "f16, V rows, cells shuffled" },
        { QT_F16, 1, 0, "f16, V transposed" },
        { QT_BF16, 0, 0, "bf16, V rows" },
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        for (int i = 0; i < n; i++) perm[i] = i;
        if (cases[ci].shuffle) /* a fixed derangement-ish order: reversed pairs */
            for (int i = 0; i + 1 < n; i += 2) {
                const int t = perm[i];
                perm[i] = perm[n - 1 - i];
                perm[n - 1 - i] = t;
            }
        buf b = write_state(tok, n, L, width, K, Vv, cases[ci].type, cases[ci].v_trans, perm);
        CHECK(write_file(state, b.p, b.n) == 0, "write %s", state);
        int32_t gen[NGEN];
        gen[0] = ref[0];
        int64_t got_n = 0;
        const int rc = import_and_continue(m, state, kv, -1, NGEN, gen, &got_n, got, err, sizeof err);
        CHECK(rc == 0 && got_n == n, "%s: imported %lld of %d positions: %s", cases[ci].name, (long long)got_n, n,
              rc ? err : "ok");
        if (rc == 0) {
            if (cases[ci].type == QT_F32) {
                CHECK(memcmp(want, got, (size_t)V * sizeof(float)) == 0, "%s: logits bit for bit", cases[ci].name);
            }
            int same = 1;
            for (int i = 0; i < NGEN; i++) same &= gen[i] == ref[i];
            /* f16/bf16 round the cache: the continuation is checked, not bits */
            CHECK(same, "%s: greedy continuation equals the original cache's", cases[ci].name);
        }
        /* every truncation of a small state is an error, and no file appears */
        if (ci == 0) {
            int bad = 0, claimed = 0;
            for (size_t cut = 0; cut < b.n; cut += (cut < 64 ? 1 : 97)) {
                unlink(kv);
                if (write_file(state, b.p, cut)) break;
                sparq_context_params cp = sparq_context_default_params();
                if (sparq_import_llama_state(m, &cp, state, kv, "ivf", -1, NULL, err, sizeof err) == 0) bad++;
                if (access(kv, F_OK) == 0) claimed++;
            }
            CHECK(bad == 0 && claimed == 0, "truncated states: %d imported, %d files left", bad, claimed);
        }
        /* hostile edits of the same file, each refused with its reason */
        if (ci == 0) {
            const struct { size_t off; uint32_t val; const char *want; } edits[] = {
                { 0, 0x6767736eu, "whole-context session" },
                { 0, 0x46554747u, "not a sequence state" },
                { 4, 1, "version 1" },
                { 8, 0xffffffffu, "truncated" },
                { 12 + 4 * (size_t)n, 0, "streams" },
                { 12 + 4 * (size_t)n + 4, 0xfffffff0u, "cannot fit" },
                { 12 + 4 * (size_t)n + 8 + 12, 0, "position 0" }, /* the second cell repeats position 0 */
                { 12 + 4 * (size_t)n + 8 + 12 * (size_t)n, 7, "V layout 7" },
                { 12 + 4 * (size_t)n + 8 + 12 * (size_t)n + 4, (uint32_t)L + 1, "truncated" },
                { 12 + 4 * (size_t)n + 8 + 12 * (size_t)n + 8, QT_Q4_0, "Q4_0" },
                { 12, 1u << 30, "outside" }, /* a token id beyond the vocabulary */
                /* the first key of layer 0 is not what this model computes */
                { 12 + 4 * (size_t)n + 8 + 12 * (size_t)n + 8 + 12, 0x447a0000u, "differ from this model's" },
            };
            for (size_t e = 0; e < sizeof edits / sizeof edits[0]; e++) {
                uint8_t *p = malloc(b.n);
                memcpy(p, b.p, b.n);
                memcpy(p + edits[e].off, &edits[e].val, 4);
                unlink(kv);
                write_file(state, p, b.n);
                free(p);
                sparq_context_params cp = sparq_context_default_params();
                err[0] = 0;
                const int r = sparq_import_llama_state(m, &cp, state, kv, "ivf", -1, NULL, err, sizeof err);
                CHECK(r != 0 && strstr(err, edits[e].want) && access(kv, F_OK) != 0,
                      "edit %zu (offset %zu = %u): refused with '%s': %s", e, edits[e].off, edits[e].val,
                      edits[e].want, err);
            }
            /* bytes after the cache: not this format */
            buf t = b;
            uint8_t *p = malloc(b.n + 4);
            memcpy(p, b.p, b.n);
            memset(p + b.n, 0, 4);
            write_file(state, p, b.n + 4);
            free(p);
            (void)t;
            sparq_context_params cp = sparq_context_default_params();
            CHECK(sparq_import_llama_state(m, &cp, state, kv, "ivf", -1, NULL, err, sizeof err) != 0 &&
                      strstr(err, "after the cache"),
                  "trailing bytes: %s", err);
            /* a state of another shape (one layer fewer) is not this model's */
            buf o = write_state(tok, n, L - 1 > 0 ? L - 1 : 2, width, K, Vv, QT_F32, 0, perm);
            write_file(state, o.p, o.n);
            free(o.p);
            CHECK(sparq_import_llama_state(m, &cp, state, kv, "ivf", -1, NULL, err, sizeof err) != 0 &&
                      strstr(err, "another model"),
                  "another model's state: %s", err);
        }
        free(b.p);
    }
    unlink(state);
    unlink(kv);
    free(perm);
    free(want);
    free(got);
    free(K);
    free(Vv);
}

/* ---- states llama.cpp wrote ------------------------------------------------- */

static void llamacpp_states(void)
{
    /* name, model, the cache type sparq's own prefill compares with */
    const struct { const char *file, *model; int kv_type; } fx[] = {
        { "tests/data/llamacpp/stories260K-f16.state", "stories260K.gguf", SPARQ_KV_F16 },
        { "tests/data/llamacpp/stories260K-f16-fa.state", "stories260K.gguf", SPARQ_KV_F16 },
        { "tests/data/llamacpp/tiny-d64-q8_0-fa.state", "tiny-d64.gguf", SPARQ_KV_Q8_0 },     /* rotated */
        { "tests/data/llamacpp/tiny-d64-q8_0-norot.state", "tiny-d64.gguf", SPARQ_KV_Q8_0 },  /* not rotated */
    };
    char err[512], kv[64];
    snprintf(kv, sizeof kv, "/tmp/sparq-test-import-ll-%d.kv", (int)getpid());
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        if (access(fx[i].file, R_OK) != 0) {
            char why[256];
            snprintf(why, sizeof why, "%s absent (scripts/llamacpp_state.sh makes it)", fx[i].file);
            test_skip(why);
            continue;
        }
        sparq_model *m = NULL;
        if (sparq_model_load(fx[i].model, &m, err, sizeof err)) {
            char why[600];
            snprintf(why, sizeof why, "%s: %s", fx[i].model, err);
            test_skip(why);
            continue;
        }
        llst_file f;
        CHECK(llst_open(fx[i].file, &f, err, sizeof err) == 0, "%s parses: %s", fx[i].file, err);
        if (!f.map) {
            sparq_model_free(m);
            continue;
        }
        const int n = (int)f.n_cells;
        int32_t *tok = malloc((size_t)n * sizeof *tok);
        memcpy(tok, f.tokens, (size_t)n * sizeof *tok);
        llst_close(&f);
        enum { NGEN = 32 };
        int32_t ref[NGEN], gen[NGEN];
        CHECK(own_prefill(m, fx[i].kv_type, tok, n, NGEN, ref, NULL) == 0, "own prefill of the state's tokens");
        gen[0] = ref[0];
        int64_t got = 0;
        const int rc = import_and_continue(m, fx[i].file, kv, -1, NGEN, gen, &got, NULL, err, sizeof err);
        CHECK(rc == 0 && got == n, "%s: import: %s", fx[i].file, rc ? err : "ok");
        int same = 0;
        while (same < NGEN && gen[same] == ref[same]) same++;
        CHECK(rc == 0 && same == NGEN, "%s: greedy continuation after import equals sparq's own prefill (%d of %d)",
              fx[i].file, same, NGEN);
        unlink(kv);
        free(tok);
        sparq_model_free(m);
    }
    /* a state of another model is refused, and leaves no file */
    sparq_model *m = NULL;
    if (access(fx[2].file, R_OK) == 0 && sparq_model_load("stories260K.gguf", &m, err, sizeof err) == 0) {
        sparq_context_params cp = sparq_context_default_params();
        CHECK(sparq_import_llama_state(m, &cp, fx[2].file, kv, "ivf", -1, NULL, err, sizeof err) != 0 &&
                  strstr(err, "another model") && access(kv, F_OK) != 0,
              "tiny-d64's state with stories260K: %s", err);
        sparq_model_free(m);
    }
}

/* llst_hadamard against the matrix built by its recursive definition
 * H_2s = [[H_s, H_s], [H_s, -H_s]] / sqrt(2), and H H = I */
static void hadamard(void)
{
    enum { N = 128 };
    static float H[N][N];
    H[0][0] = 1;
    for (int s = 1; s < N; s *= 2)
        for (int i = 0; i < s; i++)
            for (int j = 0; j < s; j++) {
                H[i + s][j] = H[i][j + s] = H[i][j];
                H[i + s][j + s] = -H[i][j];
            }
    float x[2 * N], y[2 * N], z[2 * N];
    for (int i = 0; i < 2 * N; i++) x[i] = y[i] = z[i] = (float)((i * 37) % 19) - 9.0f;
    llst_hadamard(y, 2 * N, N);
    double worst = 0;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < N; i++) {
            double r = 0;
            for (int j = 0; j < N; j++) r += H[i][j] * x[c * N + j];
            worst = fmax(worst, fabs(r / sqrt((double)N) - y[c * N + i]));
        }
    CHECK(worst < 1e-4, "hadamard chunks of 128 vs the matrix: %g", worst);
    llst_hadamard(z, 2 * N, 64);
    llst_hadamard(z, 2 * N, 64);
    worst = 0;
    for (int i = 0; i < 2 * N; i++) worst = fmax(worst, fabs(z[i] - x[i]));
    CHECK(worst < 1e-4, "hadamard of 64 is its own inverse: %g", worst);
    CHECK(llst_k_rot(QT_Q8_0, 64) == 64 && llst_k_rot(QT_Q8_0, 128) == 128 && llst_k_rot(QT_Q8_0, 192) == 64 &&
              llst_k_rot(QT_F16, 128) == 0 && llst_k_rot(QT_Q8_0, 8) == 0 && llst_v_rot(QT_Q8_0, 128) == 64,
          "rotation chunks as llama.cpp picks them");
}

int main(void)
{
    hadamard();
    char err[512];
    sparq_model *m = NULL;
    if (sparq_model_load("stories260K.gguf", &m, err, sizeof err) == 0) {
        own_states(m);
        sparq_model_free(m);
    } else {
        test_skip("stories260K.gguf not found");
    }
    llamacpp_states();
    return test_summary("test_import");
}
