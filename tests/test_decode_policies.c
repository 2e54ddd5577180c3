/* test_decode_policies.c - attention policies inside the model's decode
 * path: identities against dense decoding, and transfer accounting (the
 * elements the code touched equal docs/ALGORITHMS.md's formula, recomputed here). */
#include "test.h"
#include "util/paths.h"
#include "sparq.h"

static sparq_model *model;

/* Greedy-decodes n tokens after prompt with the given policy. */
static int greedy(const sparq_attn_params *ap, const int32_t *prompt, int n_prompt, int n,
                  int32_t *out, sparq_attn_stats *st)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 512;
    cp.n_threads = 2;
    cp.attn = *ap;
    sparq_context *c = NULL;
    char err[256];
    if (sparq_context_create(model, &cp, &c, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    const int V = sparq_model_n_vocab(model);
    float *logits = malloc((size_t)V * sizeof(float));
    int ok = logits && sparq_eval(c, prompt, n_prompt, logits) == 0;
    for (int i = 0; ok && i < n; i++) {
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        out[i] = best;
        if (i + 1 < n) ok = sparq_eval(c, &best, 1, logits) == 0;
    }
    if (st) sparq_context_attn_stats(c, st);
    free(logits);
    sparq_context_free(c);
    return ok ? 0 : -1;
}

static sparq_attn_params params(const char *policy, int r, int k)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = policy;
    p.r = r;
    p.k = k;
    return p;
}

int main(void)
{
    char path[1024], err[512];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_decode_policies");
    }
    CHECK(sparq_model_load(path, &model, err, sizeof err) == 0, "%s", err);
    if (!model) return test_summary("test_decode_policies");
    const int n_layer = sparq_model_n_layer(model), n_kv = sparq_model_n_kv_head(model);
    const int d = sparq_model_head_dim(model);

    /* identities: with k >= S every policy reads everything = dense */
    int32_t prompt[512];
    int n_prompt = sparq_tokenize(model, "Once upon a time", -1, 1, prompt, 512);
    enum { N_GEN = 96 };
    int32_t dense[N_GEN], other[N_GEN];
    sparq_attn_params dp = params("dense", 0, 0);
    CHECK(greedy(&dp, prompt, n_prompt, N_GEN, dense, NULL) == 0, "dense decode");
    const char *full[] = { "sparq", "oracle", "h2o", "streaming", "flexgen", "topk" };
    for (size_t i = 0; i < sizeof full / sizeof full[0]; i++) {
        sparq_attn_params p = params(full[i], full[i][0] == 's' && full[i][1] == 'p' ? 2 : 0, 512);
        CHECK(greedy(&p, prompt, n_prompt, N_GEN, other, NULL) == 0, "%s decode", full[i]);
        CHECK(memcmp(dense, other, sizeof dense) == 0, "%s with k=512 >= S decodes like dense", full[i]);
    }

    /* a 400-token prompt: SparQ r=2 k=32 runs and its transfers match the
     * formula S*r + 2*k*d + 4*d per layer and KV head (dense: 2*S*d + 2*d) */
    char rel[] = "golden/llamacpp/stories260K/boy_cat_story.tokens.i32";
    size_t nb;
    int32_t *story = path_find(rel, path, sizeof path) == 0 ? test_read_file(path, &nb) : NULL;
    if (!story) {
        test_skip("boy_cat_story tokens missing");
    } else {
        int n_story = (int)(nb / 4), n = 0;
        while (n < 400) prompt[n] = story[n % n_story], n++;
        enum { STEPS = 16 };
        int32_t gen[STEPS];
        sparq_attn_stats st;
        const int r = 2, k = 32;
        sparq_attn_params p = params("sparq", r, k);
        CHECK(greedy(&p, prompt, 400, STEPS, gen, &st) == 0, "sparq r=2 k=32 decode");
        int64_t want = 0, want_dense = 0;
        for (int64_t S = 401; S < 401 + STEPS - 1; S++) { /* STEPS-1 decode forward passes */
            want += (int64_t)n_layer * n_kv * (S * r + 2 * k * d + 4 * d);
            want_dense += (int64_t)n_layer * n_kv * (2 * S * d + 2 * d);
        }
        CHECK(st.steps == STEPS - 1, "steps %lld", (long long)st.steps);
        CHECK(st.formula_elements == want, "formula %lld, expected %lld", (long long)st.formula_elements,
              (long long)want);
        CHECK(st.elements == want, "counted %lld, formula %lld", (long long)st.elements, (long long)want);
        CHECK(st.dense_elements == want_dense, "dense %lld vs %lld", (long long)st.dense_elements,
              (long long)want_dense);
        CHECK(st.bytes == 2 * st.elements, "f16 cache: 2 bytes an element");
        printf("sparq r=2 k=32 at S~400: transfer ratio %.4f (formula %.4f)\n",
               (double)st.elements / st.dense_elements, (double)want / want_dense);

        /* every policy's counted elements equal its formula on this run */
        const char *all[] = { "dense", "sparq", "oracle", "flexgen", "h2o", "streaming", "topk" };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            sparq_attn_params q = params(all[i], all[i][0] == 's' && all[i][1] == 'p' ? 2 : 0, 64);
            CHECK(greedy(&q, prompt, 400, 8, gen, &st) == 0, "%s decode", all[i]);
            CHECK(st.elements == st.formula_elements && st.elements > 0, "%s: counted %lld, formula %lld",
                  all[i], (long long)st.elements, (long long)st.formula_elements);
            CHECK(i == 0 ? st.elements == st.dense_elements : st.elements < st.dense_elements,
                  "%s reads %s than dense", all[i], i == 0 ? "the same" : "less");
        }
        free(story);
    }
    sparq_model_free(model);
    return test_summary("test_decode_policies");
}
