/* test_generate.c - the library's generation loop (sparq_generate): greedy
 * output equals llama.cpp's continuation, the streamed text equals the
 * collected text and never shows a stop string, stop strings are found
 * across piece boundaries, the abort flag stops a reply, and (with a
 * context shift) generation goes on past a full cache. */
#include "test.h"
#include "sparq.h"
#include "util/paths.h"
#include "util/textbuf.h"

#include <string.h>

static int collect(void *user, const char *s, size_t n)
{
    return text_append(user, s, n);
}

static sparq_context *make(sparq_model *m, int64_t n_ctx, volatile sig_atomic_t *flag)
{
    char err[256];
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 1;
    cp.abort_flag = flag;
    sparq_context *c = NULL;
    CHECK(sparq_context_create(m, &cp, &c, err, sizeof err) == 0, "context: %s", err);
    return c;
}

int main(void)
{
    char path[1024], err[256];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        test_skip("stories260K.gguf not found on the model path (reference data)");
        return test_summary("test_generate");
    }
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load: %s", err);
        return test_summary("test_generate");
    }
    const int V = sparq_model_n_vocab(m);
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t prompt[8];
    int n_prompt = sparq_tokenize(m, "Once upon a time", -1, 1, prompt, 8);
    static volatile sig_atomic_t flag;
    sparq_context *c = make(m, 256, &flag);
    /* what llama-completion prints for this prompt (as test_cli) */
    const char *gold = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw";

    CHECK(c && logits && sparq_eval(c, prompt, n_prompt, logits) == 0, "prefill");
    text_buf streamed = { 0 };
    sparq_generate_params p = sparq_generate_default_params();
    p.max_tokens = 32;
    p.on_text = collect;
    p.user = &streamed;
    sparq_generation g;
    CHECK(sparq_generate(c, logits, &p, &g) == 0, "generate: %s", sparq_context_error(c));
    CHECK(g.text && strcmp(g.text, gold) == 0, "greedy text: '%s'", g.text);
    CHECK(streamed.len == g.n_text && memcmp(streamed.data, g.text, g.n_text) == 0, "streamed = collected");
    CHECK(g.n_tokens == 32 && g.stop == SPARQ_STOP_MAX_TOKENS && g.pending == 1 && g.n_decoded == 31,
          "32 tokens, 31 decode steps, the last pending: %d %d %d", g.n_tokens, g.n_decoded, g.pending);
    CHECK(sparq_context_pos(c) == n_prompt + 31, "cache holds prompt + 31");
    sparq_generation_free(&g);

    /* stop strings: "Lily" spans pieces; the earliest of two stops wins;
     * nothing of the stop string is ever streamed */
    const char *stops[2] = { "the park", " Lily." };
    for (int k = 0; k < 2; k++) {
        sparq_context_reset(c);
        free(streamed.data);
        memset(&streamed, 0, sizeof streamed);
        sparq_eval(c, prompt, n_prompt, logits);
        p.stop = stops;
        p.n_stop = k + 1;
        CHECK(sparq_generate(c, logits, &p, &g) == 0, "generate");
        const char *want = k == 0 ? ", there was a little girl named Lily. She loved to play outside in "
                                  : ", there was a little girl named";
        CHECK(g.stop == SPARQ_STOP_STRING && strcmp(g.text, want) == 0, "stop %d: '%s'", k, g.text);
        CHECK(streamed.len == g.n_text && memcmp(streamed.data, want, streamed.len) == 0,
              "stop %d: streamed '%.*s'", k, (int)streamed.len, streamed.data ? streamed.data : "");
        sparq_generation_free(&g);
    }
    p.stop = NULL;
    p.n_stop = 0;

    /* the abort flag: no decode step after it is set */
    sparq_context_reset(c);
    sparq_eval(c, prompt, n_prompt, logits);
    flag = 1;
    CHECK(sparq_generate(c, logits, &p, &g) == 0 && g.stop == SPARQ_STOP_ABORTED && g.n_tokens == 1 &&
              g.n_decoded == 0, "aborted: %d tokens", g.n_tokens);
    flag = 0;
    sparq_generation_free(&g);

    /* a full cache stops without a context shift */
    sparq_context_free(c);
    c = make(m, n_prompt + 5, &flag);
    sparq_eval(c, prompt, n_prompt, logits);
    p.on_text = NULL;
    CHECK(sparq_generate(c, logits, &p, &g) == 0 && g.stop == SPARQ_STOP_CONTEXT_FULL && g.n_tokens == 6,
          "context full after %d tokens", g.n_tokens);
    sparq_generation_free(&g);
    CHECK(strcmp(sparq_stop_name(SPARQ_STOP_EOG), "end_of_generation") == 0, "stop names");

    free(streamed.data);
    free(logits);
    sparq_context_free(c);
    sparq_model_free(m);
    return test_summary("test_generate");
}
