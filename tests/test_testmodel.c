/* test_testmodel.c - the committed trained model, models/tiny-d64.gguf
 * (models/README.md).
 *
 *  1. It has the geometry it was made for: head size 64, 4 query heads
 *     sharing 2 KV heads, 4 layers, context 2048, the tok512 vocabulary.
 *  2. It is trained: on held-out Shakespeare (the last 10% of the file,
 *     never trained on) its teacher-forced loss is far below a uniform
 *     guess (ln 512 = 6.24 nats); training ended near 3.15 (manifest.json).
 *  3. At d = 64 the policy identities hold: SparQ and the exact top-k with
 *     k >= S read every position, so a decode step's logits equal dense
 *     attention's (to float summation order), token for token. Both
 *     policies shortcut k >= S to the dense kernel, so the identity is also
 *     checked through their selecting code (select_always: top-k of all S
 *     positions, gathered, SparQ's alpha); and, so that the comparison can
 *     fail, selecting k = S/2 through the same path must differ from dense.
 * The file is part of the repository, so a missing file is a failure; the
 * held-out text comes from ../shared and is skipped (said so) without it. */
#include "test.h"
#include "sparq.h"
#include "util/paths.h"

#define MODEL "models/tiny-d64.gguf"

static int tokens_of_heldout(sparq_model *m, int32_t *ids, int cap)
{
    char path[1024];
    size_t n = 0;
    if (path_find("data/text/tinyshakespeare_input.txt", path, sizeof path)) return -1;
    char *s = test_read_file(path, &n);
    if (!s) return -1;
    /* the cut of scripts/train_testmodel.py: after the last blank line before 90% */
    size_t cut = 0;
    for (size_t i = 0; i + 1 < (size_t)(n * 0.9); i++)
        if (s[i] == '\n' && s[i + 1] == '\n') cut = i + 2;
    char *text = s + cut;
    const size_t len = n - cut < 20000 ? n - cut : 20000; /* enough for cap tokens */
    int k = sparq_tokenize(m, text, (int)len, 1, ids, cap);
    free(s);
    return k;
}

static int decode_run(sparq_model *m, const char *policy, int k, int select_always, const int32_t *ids, int n_prompt,
                      int n_steps, float *logits /* [n_steps][V] */)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 2048;
    cp.n_threads = 2;
    cp.kv_type = SPARQ_KV_F32;
    cp.attn.policy = policy;
    cp.attn.k = k;
    cp.attn.select_always = select_always;
    if (policy && !strcmp(policy, "sparq")) cp.attn.r = 16;
    sparq_context *c = NULL;
    char err[256];
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "context %s: %s\n", policy, err);
        return -1;
    }
    const int V = sparq_model_n_vocab(m);
    int rc = sparq_eval(c, ids, n_prompt, NULL);
    for (int i = 0; rc == 0 && i < n_steps; i++) rc = sparq_eval(c, ids + n_prompt + i, 1, logits + (size_t)i * V);
    if (rc) fprintf(stderr, "%s: %s\n", policy, sparq_context_error(c));
    sparq_context_free(c);
    return rc;
}

int main(void)
{
    sparq_model *m = NULL;
    char err[256];
    if (sparq_model_load(MODEL, &m, err, sizeof err)) {
        CHECK(0, "%s does not load: %s", MODEL, err);
        return test_summary("test_testmodel");
    }
    CHECK(sparq_model_head_dim(m) == 64 && sparq_model_n_head(m) == 4 && sparq_model_n_kv_head(m) == 2 &&
              sparq_model_n_layer(m) == 4 && sparq_model_n_ctx_train(m) == 2048 && sparq_model_n_vocab(m) == 512 &&
              !strcmp(sparq_model_arch(m), "llama"),
          "geometry: d %d heads %d/%d layers %d ctx %lld vocab %d", sparq_model_head_dim(m), sparq_model_n_head(m),
          sparq_model_n_kv_head(m), sparq_model_n_layer(m), (long long)sparq_model_n_ctx_train(m),
          sparq_model_n_vocab(m));

    /* the sanitizer run (test_quick) scores and decodes fewer tokens */
    const int N = test_quick() ? 512 : 1024, P = test_quick() ? 400 : 900, STEPS = test_quick() ? 16 : 48;
    static int32_t ids[8192];
    const int n = tokens_of_heldout(m, ids, 8192);
    if (n < 0) {
        test_skip("data/text/tinyshakespeare_input.txt not found (../shared): held-out loss and identities");
        sparq_model_free(m);
        return test_summary("test_testmodel");
    }
    CHECK(n >= N, "held-out text gives %d tokens", n);
    const int V = sparq_model_n_vocab(m);
    float *all = malloc((size_t)N * V * sizeof(float));
    float *dense = malloc((size_t)STEPS * V * sizeof(float)), *other = malloc((size_t)STEPS * V * sizeof(float));
    if (!all || !dense || !other || n < N) abort();

    /* 2. teacher-forced loss on 1023 held-out tokens */
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 2048;
    cp.n_threads = 2;
    sparq_context *c = NULL;
    CHECK(sparq_context_create(m, &cp, &c, err, sizeof err) == 0, "context: %s", err);
    if (c && sparq_eval_all(c, ids, N, all) == 0) {
        double nll = 0;
        for (int i = 0; i + 1 < N; i++) {
            const float *l = all + (size_t)i * V;
            double mx = l[0], z = 0;
            for (int j = 1; j < V; j++) mx = l[j] > mx ? l[j] : mx;
            for (int j = 0; j < V; j++) z += exp(l[j] - mx);
            nll += mx + log(z) - l[ids[i + 1]];
        }
        nll /= N - 1;
        printf("held-out Shakespeare: %.4f nats/token over %d tokens (uniform: %.4f)\n", nll, N - 1, log(V));
        CHECK(nll < 3.6, "held-out loss %.4f nats: not a trained model", nll);
    } else {
        CHECK(0, "eval_all failed");
    }
    sparq_context_free(c);

    /* 3. k >= S: sparq and oracle equal dense at every decode step */
    CHECK(decode_run(m, "dense", 0, 0, ids, P, STEPS, dense) == 0, "dense decode");
    const char *pols[] = { "sparq", "oracle" };
    /* k = 2048 >= S at every step: the dense shortcut, then the selecting
       path (select_always); k = P/2 through that path is the control */
    const struct { int k, select_always, equal; } runs[] = { { 2048, 0, 1 }, { 2048, 1, 1 }, { P / 2, 1, 0 } };
    for (int p = 0; p < 2; p++)
        for (int r = 0; r < 3; r++) {
            const int k = runs[r].k, sa = runs[r].select_always;
            CHECK(decode_run(m, pols[p], k, sa, ids, P, STEPS, other) == 0, "%s decode", pols[p]);
            double maxd = 0;
            int same_top = 1;
            for (int s = 0; s < STEPS; s++) {
                const float *a = dense + (size_t)s * V, *b = other + (size_t)s * V;
                int ia = 0, ib = 0;
                for (int j = 0; j < V; j++) {
                    maxd = fmax(maxd, fabs(a[j] - b[j]));
                    if (a[j] > a[ia]) ia = j;
                    if (b[j] > b[ib]) ib = j;
                }
                same_top &= ia == ib;
            }
            if (runs[r].equal)
                CHECK(maxd < 1e-3 && same_top, "%s k=%d%s vs dense: max |logit diff| %.3g, same argmax %d", pols[p],
                      k, sa ? " (selecting)" : "", maxd, same_top);
            else /* negative control: the comparison sees a dropped half */
                CHECK(maxd > 1e-2, "%s k=%d (selecting) vs dense: max |logit diff| only %.3g", pols[p], k, maxd);
        }
    free(all);
    free(dense);
    free(other);
    sparq_model_free(m);
    return test_summary("test_testmodel");
}
