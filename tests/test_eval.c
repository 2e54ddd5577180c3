/* test_eval.c - the evaluation harness (src/eval.h) on stories260K.
 *
 * References: llama.cpp's greedy continuation (golden/llamacpp/stories260K),
 * a batched teacher-forced prefill (sparq_eval_all) for the decode-step NLL,
 * hand-computed KL for the fidelity arithmetic, identities (dense vs dense is
 * exactly KL 0; SparQ/oracle with k >= S is dense; SparQ's scores with
 * r = d are the exact ones), and independent re-tokenization for left
 * truncation. The `sparq eval` / `sparq stats` commands are run once each
 * and their JSON checked (skipped if build/sparq is absent), as are eval's
 * help pages, its refusals of bad options and its truncation note.
 */
#include "eval/eval.h"
#include "attn/attn.h"
#include "util/json.h"
#include "eval/metrics.h"
#include "util/paths.h"
#include "eval/tasks.h"
#include "test.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char model_path[4096];

static sparq_context *make_ctx(sparq_model *m, int64_t n_ctx, const char *policy, int k, int r)
{
    char err[256];
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = 1;
    cp.attn.policy = policy;
    cp.attn.k = k;
    cp.attn.r = r;
    sparq_context *c = NULL;
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) {
        CHECK(0, "context %s k=%d: %s", policy, k, err);
        return NULL;
    }
    return c;
}

/* ---- pure pieces ---------------------------------------------------------- */

static void test_truncate(void)
{
    int32_t a[8] = { 1, 10, 11, 12, 13, 14, 15, 16 };
    CHECK(eval_truncate_left(a, 8, 8, 1) == 8 && a[7] == 16, "fits: unchanged");
    CHECK(eval_truncate_left(a, 8, 20, 1) == 8 && a[0] == 1, "fits with room: unchanged");
    int64_t n = eval_truncate_left(a, 8, 4, 1);
    CHECK(n == 4 && a[0] == 1 && a[1] == 14 && a[2] == 15 && a[3] == 16, "keep BOS + last 3: %lld [%d %d %d %d]",
          (long long)n, a[0], a[1], a[2], a[3]);
    int32_t b[6] = { 1, 2, 3, 4, 5, 6 };
    n = eval_truncate_left(b, 6, 2, 0);
    CHECK(n == 2 && b[0] == 5 && b[1] == 6, "no BOS kept: last 2");
    int32_t c[4] = { 1, 2, 3, 4 };
    n = eval_truncate_left(c, 4, 1, 1);
    CHECK(n == 1 && c[0] == 4, "max 1 keeps the last token, not the BOS alone");
    int32_t d[3] = { 1, 2, 3 };
    n = eval_truncate_left(d, 3, 2, 1);
    CHECK(n == 2 && d[0] == 1 && d[1] == 3, "BOS + last");
}

static void test_fidelity_arithmetic(void)
{
    eval_fidelity f;
    memset(&f, 0, sizeof f);
    const float p[3] = { 0.5f, -1.0f, 2.0f };
    eval_fidelity_step(&f, p, p, 3);
    CHECK(f.n_steps == 1 && f.kl_sum == 0.0 && f.n_top1_agree == 1, "identical logits: KL exactly 0, agree");
    /* p = softmax(0, ln 3) = (1/4, 3/4), q = (1/2, 1/2) */
    const float lp[2] = { 0.0f, (float)log(3.0) }, lq[2] = { 0.0f, 0.0f };
    eval_fidelity_step(&f, lp, lq, 2);
    const double want = 0.25 * log(0.25 / 0.5) + 0.75 * log(0.75 / 0.5);
    CHECK_NEAR(f.kl_sum, want, 1e-7);
    CHECK_NEAR(f.kl_max, want, 1e-7);
    CHECK(f.n_steps == 2 && f.n_top1_agree == 1, "argmax 1 vs 0 (tie -> first) disagree: %lld",
          (long long)f.n_top1_agree);
}

/* ---- generation and stop rules ------------------------------------------------ */

static void test_generate_golden(sparq_model *m)
{
    char path[4096], err[256];
    if (path_find("golden/llamacpp/stories260K/once_upon_a_time.greedy.json", path, sizeof path)) {
        test_skip("golden once_upon_a_time.greedy.json not found");
        return;
    }
    size_t n;
    char *buf = test_read_file(path, &n);
    json_doc *doc = buf ? json_parse(buf, n, 0, err, sizeof err) : NULL;
    CHECK(doc != NULL, "parse %s", path);
    if (!doc) { free(buf); return; }
    const json_value *root = json_root(doc), *pt = json_get(root, "prompt_tokens"),
                     *gt = json_get(root, "greedy_tokens");
    const json_value *robust = json_get(json_get(root, "robust_prefix_len"), "0.01");
    size_t gtext_len = 0;
    const char *gtext = json_get_str(root, "greedy_text", &gtext_len);
    int n_prompt = (int)json_len(pt), n_gold = (int)json_len(gt);
    int n_cmp = robust && robust->type == JSON_NUMBER ? (int)robust->u.number : 16;
    if (n_cmp > n_gold) n_cmp = n_gold;
    int32_t prompt[64];
    CHECK(n_prompt > 0 && n_prompt <= 64 && n_gold > 0, "golden shape");
    for (int i = 0; i < n_prompt && i < 64; i++) prompt[i] = (int32_t)json_at(pt, (size_t)i)->u.number;

    sparq_context *c = make_ctx(m, 512, "dense", 0, 0);
    if (c) {
        eval_gen_params gp = { n_gold, 0, NULL };
        eval_generation g;
        CHECK(eval_generate(c, prompt, n_prompt, &gp, &g, err, sizeof err) == 0, "generate: %s", err);
        CHECK(g.n_tokens == n_gold && g.stop == EVAL_STOP_MAX_TOKENS, "n %d stop %s", g.n_tokens,
              eval_stop_name(g.stop));
        int same = 0;
        while (same < n_cmp && same < g.n_tokens && g.tokens[same] == (int32_t)json_at(gt, (size_t)same)->u.number)
            same++;
        CHECK(same == n_cmp, "greedy matches llama.cpp for %d robust tokens (matched %d)", n_cmp, same);
        if (n_cmp == n_gold)
            CHECK(g.n_text == gtext_len && memcmp(g.text, gtext, gtext_len) == 0, "text equals llama.cpp's");
        /* decode steps went through the policy and were counted */
        CHECK(g.attn.steps == g.n_tokens - 1, "decode steps %lld", (long long)g.attn.steps);

        /* stop string: cut before the first occurrence that appears */
        const char *stop = "Lily";
        const char *hit = strstr(g.text, stop);
        CHECK(hit != NULL, "the greedy text mentions %s", stop);
        if (hit) {
            eval_gen_params sp = { n_gold, 0, stop };
            eval_generation s;
            CHECK(eval_generate(c, prompt, n_prompt, &sp, &s, err, sizeof err) == 0, "generate: %s", err);
            CHECK(s.stop == EVAL_STOP_STRING, "stop %s", eval_stop_name(s.stop));
            CHECK(s.n_text == (size_t)(hit - g.text) && memcmp(s.text, g.text, s.n_text) == 0,
                  "text cut before '%s': %zu vs %td", stop, s.n_text, hit - g.text);
            CHECK(s.n_tokens < g.n_tokens && memcmp(s.tokens, g.tokens, (size_t)s.n_tokens * 4) == 0,
                  "tokens are a prefix");
            eval_generation_free(&s);
        }
        /* end of generation: if the free-running text has an EOG token, the
         * stopping run ends right there; otherwise nothing changes */
        int first_eog = -1;
        for (int i = 0; i < g.n_tokens && first_eog < 0; i++)
            if (sparq_token_is_eog(m, g.tokens[i])) first_eog = i;
        eval_gen_params ep = { n_gold, 1, NULL };
        eval_generation e;
        CHECK(eval_generate(c, prompt, n_prompt, &ep, &e, err, sizeof err) == 0, "generate: %s", err);
        if (first_eog >= 0)
            CHECK(e.n_tokens == first_eog + 1 && e.stop == EVAL_STOP_EOG, "stops at EOG %d", first_eog);
        else
            CHECK(e.n_tokens == g.n_tokens && e.stop == EVAL_STOP_MAX_TOKENS, "no EOG: unchanged");
        eval_generation_free(&e);

        /* max tokens 0: nothing generated, no decode step */
        eval_gen_params zp = { 0, 1, NULL };
        CHECK(eval_generate(c, prompt, n_prompt, &zp, &e, err, sizeof err) == 0 && e.n_tokens == 0 &&
                  e.n_text == 0 && e.stop == EVAL_STOP_MAX_TOKENS,
              "max_tokens 0");
        eval_generation_free(&e);
        eval_generation_free(&g);
        sparq_context_free(c);
    }
    /* a full context: prompt + 5 more positions give 6 tokens */
    c = make_ctx(m, n_prompt + 5, "dense", 0, 0);
    if (c) {
        eval_gen_params gp = { 20, 0, NULL };
        eval_generation g;
        CHECK(eval_generate(c, prompt, n_prompt, &gp, &g, err, sizeof err) == 0, "generate: %s", err);
        CHECK(g.n_tokens == 6 && g.stop == EVAL_STOP_CONTEXT_FULL, "context full after %d tokens (%s)", g.n_tokens,
              eval_stop_name(g.stop));
        for (int i = 0; i < g.n_tokens && i < n_cmp; i++)
            CHECK(g.tokens[i] == (int32_t)json_at(gt, (size_t)i)->u.number, "token %d", i);
        eval_generation_free(&g);
        sparq_context_free(c);
    }
    json_free(doc);
    free(buf);
}

/* ---- teacher forcing ----------------------------------------------------------- */

static void test_forced_nll(sparq_model *m)
{
    char err[256];
    const char *text = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
    int32_t *ids = NULL;
    int64_t n = eval_tokenize(m, text, strlen(text), 1, &ids, err, sizeof err);
    CHECK(n > 12, "tokens: %lld", (long long)n);
    if (n <= 12) { free(ids); return; }
    const int n_prompt = 6, n_target = (int)n - n_prompt;
    const int V = sparq_model_n_vocab(m);
    sparq_context *c = make_ctx(m, 128, "dense", 0, 0);
    float *all = malloc((size_t)n * V * sizeof *all);
    double *nll = malloc((size_t)n_target * sizeof *nll);
    if (c && all && nll) {
        sparq_attn_stats st;
        CHECK(eval_forced_nll(c, ids, n_prompt, ids + n_prompt, n_target, nll, &st, err, sizeof err) == 0, "%s",
              err);
        CHECK(st.steps == n_target - 1, "one decode step per target token after the first: %lld",
              (long long)st.steps);
        /* reference: one batched prefill of the whole text */
        sparq_context_reset(c);
        CHECK(sparq_eval_all(c, ids, (int)n, all) == 0, "eval_all");
        double sum = 0, ref_sum = 0;
        for (int i = 0; i < n_target; i++) {
            double ref = metrics_nll(all + (size_t)(n_prompt - 1 + i) * V, V, ids[n_prompt + i]);
            CHECK_NEAR(nll[i], ref, 2e-3 + 1e-3 * fabs(ref));
            sum += nll[i];
            ref_sum += ref;
        }
        CHECK(sum > 0, "positive NLL");
        CHECK_NEAR(sum, ref_sum, 1e-2);
        /* too long for the context */
        sparq_context *small = make_ctx(m, 8, "dense", 0, 0);
        if (small) {
            CHECK(eval_forced_nll(small, ids, n_prompt, ids + n_prompt, n_target, nll, NULL, err, sizeof err) == -1 &&
                      strstr(err, "context") != NULL,
                  "context overflow is an error: %s", err);
            sparq_context_free(small);
        }
    }
    free(all);
    free(nll);
    free(ids);
    sparq_context_free(c);
}

/* ---- fidelity ------------------------------------------------------------------- */

static void test_fidelity(sparq_model *m)
{
    char path[4096], err[256];
    if (path_find("data/text/tinyshakespeare_input.txt", path, sizeof path)) {
        test_skip("tinyshakespeare_input.txt not found");
        return;
    }
    char *text = NULL;
    size_t n_text = 0;
    CHECK(eval_read_file(path, &text, &n_text, err, sizeof err) == 0, "%s", err);
    if (!text) return;
    if (n_text > 4000) n_text = 4000;
    int32_t *ids = NULL;
    int64_t n = eval_tokenize(m, text, n_text, 1, &ids, err, sizeof err);
    const int P = test_quick() ? 64 : 128, F = test_quick() ? 32 : 96, G = 32, n_ctx = 256;
    CHECK(n >= P + F, "enough text tokens: %lld", (long long)n);
    if (n < P + F) { free(ids); free(text); return; }
    sparq_context *dense = make_ctx(m, n_ctx, "dense", 0, 0);
    eval_reference ref;
    memset(&ref, 0, sizeof ref);
    if (dense && eval_reference_run(dense, ids, P, ids + P, F, G, &ref, err, sizeof err) == 0) {
        CHECK(ref.n_forced == F && ref.n_gen == G, "reference shape %d %d", ref.n_forced, ref.n_gen);
        struct { const char *policy; int k, r; int same; } cases[] = {
            { "dense", 0, 0, 2 },          /* bit-identical */
            { "sparq", n_ctx, 0, 1 },      /* k >= S: dense up to rounding */
            { "sparq", n_ctx, 8, 1 },
            { "oracle", n_ctx, 0, 1 },
            { "streaming", 20, 0, 0 },     /* a real approximation: must differ */
            { "sparq", 8, 1, 0 },
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            sparq_context *c = make_ctx(m, n_ctx, cases[i].policy, cases[i].k, cases[i].r);
            if (!c) continue;
            eval_fidelity f;
            CHECK(eval_fidelity_run(c, &ref, ids, P, ids + P, &f, err, sizeof err) == 0, "%s", err);
            CHECK(f.n_steps == F && f.n_gen == G, "%s: %lld steps", cases[i].policy, (long long)f.n_steps);
            CHECK(f.attn.steps == F + G - 1, "%s: decode steps counted %lld", cases[i].policy,
                  (long long)f.attn.steps);
            if (cases[i].same == 2) {
                CHECK(f.kl_sum == 0.0 && f.kl_max == 0.0, "dense vs dense KL exactly 0: %g", f.kl_sum);
            } else if (cases[i].same == 1) {
                /* SparQ falls back to the dense kernel (bit-identical); the
                 * oracle sums its kept rows in selection order and
                 * renormalises in f32: rounding, about 1e-6 */
                const double tol = strcmp(cases[i].policy, "sparq") == 0 ? 1e-9 : 1e-5;
                CHECK(f.kl_max < tol, "%s k=%d r=%d: KL max %g", cases[i].policy, cases[i].k, cases[i].r, f.kl_max);
            } else {
                CHECK(f.kl_sum > 1e-4, "%s k=%d: a sparse policy differs from dense (KL %g)", cases[i].policy,
                      cases[i].k, f.kl_sum);
                CHECK(f.attn.elements < f.attn.dense_elements, "%s reads less than dense", cases[i].policy);
            }
            if (cases[i].same) {
                CHECK(f.n_top1_agree == f.n_steps, "%s: top-1 agreement %lld / %lld", cases[i].policy,
                      (long long)f.n_top1_agree, (long long)f.n_steps);
                CHECK(f.first_divergence == G, "%s: no greedy divergence (%lld)", cases[i].policy,
                      (long long)f.first_divergence);
            }
            sparq_context_free(c);
        }
    } else {
        CHECK(0, "reference run: %s", err);
    }
    eval_reference_free(&ref);
    sparq_context_free(dense);
    free(ids);
    free(text);
}

/* ---- task examples ------------------------------------------------------------------ */

static int64_t count_with_bos(void *ctx, const char *text, size_t n)
{
    return sparq_tokenize(ctx, text, (int)n, 1, NULL, 0);
}

static void test_tasks(sparq_model *m)
{
    const task_def *const kinds[] = { &task_def_squad, &task_def_triviaqa, &task_def_cnndm, &task_def_wikitext,
                                      &task_def_repetition, &task_def_niah, &task_def_kvret };
    const int64_t n_ctx = 192;
    eval_task_params ep = eval_task_default_params();
    for (size_t t = 0; t < sizeof kinds / sizeof kinds[0]; t++) {
        const char *name = kinds[t]->name;
        char err[512];
        task_params tp = task_default_params();
        const int64_t lengths[1] = { 150 };
        if (kinds[t] == &task_def_niah) {
            tp.niah_lengths = lengths;
            tp.n_niah_lengths = 1;
            tp.niah_depths = 2;
            tp.count_tokens = count_with_bos;
            tp.count_ctx = m;
        }
        task_set *ts = NULL;
        if (task_open(&ts, kinds[t], &tp, err, sizeof err)) {
            char msg[600];
            snprintf(msg, sizeof msg, "%s: %s", name, err);
            test_skip(msg);
            continue;
        }
        task_example ex;
        CHECK(task_get(ts, 0, &ex, err, sizeof err) == 0, "%s: %s", name, err);
        eval_prepared pr;
        if (eval_prepare(m, n_ctx, kinds[t], &ex, &ep, &pr, err, sizeof err)) {
            CHECK(0, "%s prepare: %s", name, err);
            task_example_free(&ex);
            task_close(ts);
            continue;
        }
        /* left truncation: BOS, then exactly the tail of the full encoding */
        int32_t *full = NULL;
        int64_t nf = eval_tokenize(m, ex.prompt, ex.n_prompt, 1, &full, err, sizeof err);
        CHECK(pr.prompt[0] == sparq_token_bos(m), "%s: BOS kept", name);
        if (kinds[t] == &task_def_wikitext) {
            CHECK(pr.n_target >= 1 && pr.n_target <= ep.bpc_max_tokens && pr.n_gen == 0, "%s: target %d", name,
                  pr.n_target);
            CHECK(pr.n_prompt + pr.n_target - 1 <= n_ctx, "%s: fits", name);
            CHECK(pr.n_target_chars > 0 && pr.n_target_chars <= (int64_t)strlen(ex.answers[0]) + 8,
                  "%s: %lld target characters", name, (long long)pr.n_target_chars);
        } else {
            CHECK(pr.n_gen >= 1 && pr.n_prompt + pr.n_gen - 1 <= n_ctx, "%s: %d + %d fits %lld", name, pr.n_prompt,
                  pr.n_gen, (long long)n_ctx);
            CHECK(pr.n_prompt + pr.n_dropped == nf, "%s: kept + dropped = all (%d + %lld vs %lld)", name,
                  pr.n_prompt, (long long)pr.n_dropped, (long long)nf);
            if (pr.n_dropped > 0 && nf > 0)
                CHECK(memcmp(pr.prompt + 1, full + nf - (pr.n_prompt - 1), (size_t)(pr.n_prompt - 1) * 4) == 0,
                      "%s: the kept tokens are the prompt's last ones", name);
        }
        if (kinds[t] != &task_def_triviaqa && kinds[t] != &task_def_niah) /* short prompts */
            CHECK(pr.n_dropped > 0, "%s: a long prompt was truncated (%lld dropped)", name, (long long)pr.n_dropped);
        sparq_context *c = make_ctx(m, n_ctx, "sparq", 16, 0);
        eval_result r;
        if (c && eval_run(c, &pr, &r, err, sizeof err) == 0) {
            if (kinds[t] == &task_def_wikitext) {
                CHECK(r.value > 0.3 && r.value < 20 && r.n_chars == pr.n_target_chars, "%s: bpc %g", name, r.value);
                CHECK_NEAR(r.value, r.nll_sum * 1.4426950408889634 / (double)r.n_chars, 1e-12);
                CHECK(r.attn.steps == pr.n_target - 1, "%s: decode steps", name);
            } else if (kinds[t] == &task_def_cnndm) {
                CHECK(r.value >= 0 && r.value <= 1, "%s: rouge %g", name, r.value);
            } else if (kinds[t] == &task_def_repetition) {
                CHECK(r.value >= 0 && r.value <= (double)strlen(ex.answers[0]), "%s: %g chars", name, r.value);
                CHECK(r.value == (double)metrics_match_length(r.output, r.n_output, ex.answers[0],
                                                              strlen(ex.answers[0])),
                      "%s: scored from its output", name);
            } else {
                CHECK(r.value == 0 || r.value == 1, "%s: %g", name, r.value);
            }
            if (kinds[t] != &task_def_wikitext) {
                CHECK(r.n_generated >= 1 && r.n_generated <= pr.n_gen, "%s: generated %d", name, r.n_generated);
                CHECK(r.attn.steps == r.n_generated - 1, "%s: decode steps %lld", name, (long long)r.attn.steps);
                CHECK(r.attn.elements < r.attn.dense_elements || r.attn.steps == 0, "%s: sparq read less", name);
            }
            eval_result_free(&r);
        } else {
            CHECK(0, "%s run: %s", name, err);
        }
        sparq_context_free(c);
        free(full);
        eval_prepared_free(&pr);
        task_example_free(&ex);
        task_close(ts);
    }
}

/* ---- attention statistics --------------------------------------------------------------- */

static void test_stats(sparq_model *m)
{
    char err[256];
    const char *text =
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
        "One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily's mom "
        "said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do.";
    int32_t *ids = NULL;
    int64_t n = eval_tokenize(m, text, strlen(text), 1, &ids, err, sizeof err);
    sparq_context *c = make_ctx(m, 128, "dense", 0, 0);
    if (!c || n < 40) {
        CHECK(0, "setup: %lld tokens", (long long)n);
        free(ids);
        sparq_context_free(c);
        return;
    }
    const int d = sparq_model_head_dim(m);
    eval_stats_params sp = eval_stats_default_params();
    sp.n_query = 16;
    sp.k = 8;
    eval_stats st;
    CHECK(eval_attn_stats(c, ids, (int)n, &sp, &st, err, sizeof err) == 0, "%s", err);
    CHECK(st.n_layer == sparq_model_n_layer(m) && st.n_head == sparq_model_n_head(m) && st.d == d, "shape");
    CHECK(st.n_r >= 2 && st.r[st.n_r - 1] == d && st.alpha_r == (d / 4 ? d / 4 : 1), "default r list ends at d");
    CHECK(st.s_first == n - 15 && st.s_last == n, "steps S=%lld..%lld", (long long)st.s_first, (long long)st.s_last);
    for (int i = 0; i < st.n_layer * st.n_head; i++) {
        const eval_head_stats *h = &st.heads[i];
        CHECK(h->n == 16, "steps per head %lld", (long long)h->n);
        /* r = d: the approximate scores are the exact ones */
        CHECK(h->agreement[st.n_r - 1] > 0.99, "head %d: agreement at r=d %g", i, h->agreement[st.n_r - 1]);
        CHECK(h->topk_mass > 0 && h->topk_mass <= 1 + 1e-6 && h->alpha > 0 && h->alpha <= 1 + 1e-6,
              "head %d: masses %g %g", i, h->topk_mass, h->alpha);
        CHECK(h->keys75 >= 1 && h->keys75 <= (double)st.s_last && h->entropy >= 0 &&
                  h->entropy <= log((double)st.s_last) + 1e-6,
              "head %d: keys75 %g entropy %g", i, h->keys75, h->entropy);
        CHECK(h->kurtosis >= -2.0 - 1e-9 && h->kurtosis <= d - 3.0 + 1e-9, "head %d: Fisher kurtosis bound %g", i,
              h->kurtosis);
    }
    eval_stats_free(&st);
    /* k >= S: every top-k is everything */
    sp.k = 1000;
    CHECK(eval_attn_stats(c, ids, (int)n, &sp, &st, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < st.n_layer * st.n_head; i++)
        CHECK(fabs(st.heads[i].topk_mass - 1) < 1e-5 && fabs(st.heads[i].alpha - 1) < 1e-5 &&
                  st.heads[i].agreement[0] == 1.0,
              "head %d: k >= S gives mass 1", i);
    eval_stats_free(&st);
    /* the context's own policy is back: generation equals a fresh context's */
    sparq_context *fresh = make_ctx(m, 128, "dense", 0, 0);
    if (fresh) {
        eval_gen_params gp = { 24, 0, NULL };
        eval_generation a, b;
        CHECK(eval_generate(c, ids, 10, &gp, &a, err, sizeof err) == 0 &&
                  eval_generate(fresh, ids, 10, &gp, &b, err, sizeof err) == 0,
              "%s", err);
        CHECK(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, (size_t)a.n_tokens * 4) == 0,
              "policy restored after stats");
        eval_generation_free(&a);
        eval_generation_free(&b);
        sparq_context_free(fresh);
    }
    /* bad arguments */
    sp.n_query = (int)n;
    CHECK(eval_attn_stats(c, ids, (int)n, &sp, &st, err, sizeof err) == -1, "n_query >= n is an error");
    sparq_context_free(c);
    free(ids);
}

/* ---- the commands ------------------------------------------------------------------------- */

/* A private directory for the commands' output (mkdtemp: suites may run at
 * once); removed by main. */
static char tmp_dir[] = "/tmp/sparq_test_eval_XXXXXX";
static int have_tmp;

/* Runs cmd with stdout and stderr captured; returns stdout (never NULL
 * unless out of memory), *err_out (if not NULL) stderr; *status = the exit
 * code (128 if it did not exit). */
static char *run_cmd_err(const char *cmd, int *status, char **err_out)
{
    char full[4096], out[128], errf[128];
    snprintf(out, sizeof out, "%s/out", tmp_dir);
    snprintf(errf, sizeof errf, "%s/err", tmp_dir);
    snprintf(full, sizeof full, "%s > %s 2> %s", cmd, out, errf);
    const int st = system(full);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    size_t n;
    char *s = test_read_file(out, &n), *e = test_read_file(errf, &n);
    unlink(out);
    unlink(errf);
    if (!s) s = calloc(1, 1);
    if (err_out) *err_out = e ? e : calloc(1, 1);
    else free(e);
    return s;
}

static char *run_cmd(const char *cmd, int *status)
{
    return run_cmd_err(cmd, status, NULL);
}

static double num(const json_value *obj, const char *key)
{
    const json_value *v = json_get(obj, key);
    return v && v->type == JSON_NUMBER ? v->u.number : NAN;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* `sparq eval ARGS` is refused: exit 2, one line on stderr naming `needle`,
 * nothing on stdout (it never ran). */
static void expect_refused(const char *bin, const char *args, const char *needle)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s eval %s", bin, args);
    int st;
    char *err = NULL, *out = run_cmd_err(cmd, &st, &err);
    CHECK(st == 2, "`eval %s`: exit %d, want 2", args, st);
    CHECK(out && out[0] == 0, "`eval %s`: nothing on stdout", args);
    CHECK(err && strncmp(err, "error: ", 7) == 0 && count_lines(err) == 1 && strstr(err, needle),
          "`eval %s`: one error line naming '%s': %s", args, needle, err ? err : "");
    free(out);
    free(err);
}

/* `eval --help` and `eval TASK --help`: the generic page lists every task
 * and every task's options; a task's page its own options and no other
 * task's; the policy list comes from the attention registry. */
static void test_help(const char *bin)
{
    char cmd[2048];
    int st;
    snprintf(cmd, sizeof cmd, "%s eval --help", bin);
    char *all = run_cmd(cmd, &st);
    CHECK(st == 0 && all, "eval --help: exit %d", st);
    if (!all) return;
    char in_all[512] = "--attn all = ";
    size_t n = strlen(in_all);
    for (int i = 0; i < attn_policy_count(); i++) {
        const attn_policy *p = attn_policy_at(i);
        if (p->in_all) n += (size_t)snprintf(in_all + n, sizeof in_all - n, "%s%s", n > 13 ? "," : "", p->name);
        CHECK(strstr(all, p->summary) != NULL, "eval --help shows policy %s's summary", p->name);
    }
    CHECK(strstr(all, in_all) != NULL, "eval --help: '%s' from the registry", in_all);
    for (int i = 0; i < task_def_count(); i++) {
        const task_def *t = task_def_at(i);
        CHECK(strstr(all, t->summary) != NULL, "eval --help lists task %s", t->name);
        snprintf(cmd, sizeof cmd, "%s eval %s --help", bin, t->name);
        char *page = run_cmd(cmd, &st);
        CHECK(st == 0 && page && strstr(page, t->summary), "eval %s --help: exit %d", t->name, st);
        for (int j = 0; page && j < task_def_count(); j++)
            for (const task_option *o = task_def_at(j)->options; o && o->name; o++) {
                CHECK(strstr(all, o->name) != NULL, "eval --help shows %s", o->name);
                const int own = task_option_find(t, o->name) != NULL;
                CHECK(own == (strstr(page, o->name) != NULL), "eval %s --help %s %s", t->name,
                      own ? "shows its option" : "does not show", o->name);
            }
        CHECK(page && strstr(page, "--limit") && strstr(page, "--attn"), "eval %s --help has the common options",
              t->name);
        free(page);
    }
    free(all);
    snprintf(cmd, sizeof cmd, "%s eval squad --help", bin);
    char *page = run_cmd(cmd, &st);
    CHECK(page && strstr(page, "squad options:\n  --squad-confusion N") && !strstr(page, "--kvret-keys") &&
              !strstr(page, "--fid-tokens"),
          "eval squad --help: squad's options only:\n%s", page ? page : "");
    free(page);
}

/* Options that are zero, negative or for another task are refused before
 * anything runs: `-n 0` never means "all 10,570 examples". */
static void test_refused(const char *bin)
{
    char cmd0_stats[2048];
    expect_refused(bin, "squad -n 0", "--limit");
    expect_refused(bin, "squad --limit 0", "--limit");
    expect_refused(bin, "squad --limit -3", "--limit");
    expect_refused(bin, "squad --limit 2x", "--limit");
    expect_refused(bin, "fidelity -n 0", "--limit");
    expect_refused(bin, "wikitext --sweep ratio=1/4 --attn sparq --ratio-len 0", "--ratio-len");
    expect_refused(bin, "wikitext --sweep ratio=1/4 --attn sparq --ratio-len -64", "--ratio-len");
    expect_refused(bin, "wikitext --attn sparq --ratio-len 64", "--ratio-len applies");
    expect_refused(bin, "wikitext --attn sparq,h2o --match k", "--match applies");
    expect_refused(bin, "squad --sweep ratio=1/4", "non-dense");
    expect_refused(bin, "squad --squad-confusion -1", "--squad-confusion");
    expect_refused(bin, "niah --niah-depths 0", "--niah-depths");
    expect_refused(bin, "niah --niah-depths -2", "--niah-depths");
    expect_refused(bin, "wikitext --context-chars 0", "--context-chars");
    expect_refused(bin, "repetition --context-chars -5", "--context-chars");
    expect_refused(bin, "kvret --kvret-gold -1", "--kvret-gold");
    expect_refused(bin, "kvret --kvret-keys 0", "--kvret-keys");
    expect_refused(bin, "fidelity --fid-tokens 0", "--fid-tokens");
    expect_refused(bin, "fidelity --fid-prompt 1", "--fid-prompt");
    expect_refused(bin, "fidelity --fid-gen -1", "--fid-gen");
    expect_refused(bin, "squad --kvret-keys 140", "not an option of task squad");
    expect_refused(bin, "triviaqa --context-chars 500", "not an option of task triviaqa");
    expect_refused(bin, "squad --sweep k=0", "positive");
    expect_refused(bin, "squad --attn dense,nosuch", "nosuch");

    /* stats: counts of zero or less are refused, not replaced by defaults */
    const char *const stats_bad[] = { "--n-query 0", "--n-query -4", "--stats-k 0", "--alpha-r -1" };
    for (int i = 0; i < 4; i++) {
        snprintf(cmd0_stats, sizeof cmd0_stats, "%s stats %s", bin, stats_bad[i]);
        int st0;
        char *e0 = NULL, *o0 = run_cmd_err(cmd0_stats, &st0, &e0);
        char opt[32];
        snprintf(opt, sizeof opt, "%.*s", (int)strcspn(stats_bad[i], " "), stats_bad[i]);
        CHECK(st0 == 2 && o0[0] == 0 && count_lines(e0) == 1 && strstr(e0, opt), "`stats %s`: exit %d: %s",
              stats_bad[i], st0, e0);
        free(o0);
        free(e0);
    }

    /* a FIFO as data would block forever: refused, not read (timeout: a
     * regression fails instead of hanging the suite) */
    char fifo[256], cmd0[2048];
    snprintf(fifo, sizeof fifo, "%s/fifo", tmp_dir);
    if (mkfifo(fifo, 0600) == 0) {
        const char *const uses[] = { "eval fidelity -f", "eval repetition --data", "stats -f" };
        for (int i = 0; i < 3; i++) {
            snprintf(cmd0, sizeof cmd0, "timeout 20 %s %s %s -c 128", bin, uses[i], fifo);
            int st0;
            char *e0 = NULL, *o0 = run_cmd_err(cmd0, &st0, &e0);
            CHECK(st0 == 1 && o0[0] == 0 && count_lines(e0) == 1 && strstr(e0, "not a regular file"),
                  "`%s FIFO`: exit %d: %s", uses[i], st0, e0);
            free(o0);
            free(e0);
        }
        unlink(fifo);
    } else {
        CHECK(0, "mkfifo %s", fifo);
    }

    /* errors found only once the data is read: still one line, non-zero */
    char cmd[2048];
    int st;
    snprintf(cmd, sizeof cmd, "%s eval niah -t 1 -c 256 --niah-lengths 0", bin);
    char *err = NULL, *out = run_cmd_err(cmd, &st, &err);
    CHECK(st != 0 && out[0] == 0 && count_lines(err) == 1 && strstr(err, "--niah-lengths"),
          "niah lengths 0: exit %d: %s", st, err);
    free(out);
    free(err);
}

/* eval truncates long prompts to the context and says so on stderr without
 * -v; the count equals the sum of what -v reports per example. */
static void test_truncation_note(const char *bin)
{
    char cmd[2048];
    if (path_find("data/qa/squad/dev-v1.1.json", cmd, sizeof cmd) &&
        path_find("data/qa/squad/dev-v1.1.part1of2.json", cmd, sizeof cmd)) {
        test_skip("SQuAD data not found: truncation note not checked");
        return;
    }
    int st;
    snprintf(cmd, sizeof cmd, "%s eval squad -t 1 -c 256 -n 3", bin);
    char *err = NULL, *out = run_cmd_err(cmd, &st, &err);
    long long dropped = -1;
    const char *note = strstr(err, "note: 3 of 3 prompts were truncated from the left to fit the context of 256");
    CHECK(st == 0 && note, "squad at 256 tokens: truncation noted without -v: %s", err);
    const char *paren = note ? strstr(note, "(") : NULL;
    if (paren) dropped = strtoll(paren + 1, NULL, 10);
    free(out);
    free(err);
    /* -v: "[id] dense -: prompt 255 (-N) value ..." per example */
    snprintf(cmd, sizeof cmd, "%s eval squad -t 1 -c 256 -n 3 -v", bin);
    out = run_cmd_err(cmd, &st, &err);
    long long sum = 0;
    int lines = 0;
    for (const char *p = strstr(err, " (-"); p; p = strstr(p + 3, " (-")) {
        sum += strtoll(p + 3, NULL, 10);
        lines++;
    }
    CHECK(st == 0 && lines == 3 && sum == dropped && dropped > 0, "dropped %lld = sum of -v's %lld over %d lines",
          dropped, sum, lines);
    free(out);
    free(err);
    /* a prompt that fits: no note */
    snprintf(cmd, sizeof cmd, "%s eval squad -t 1 -c 4096 -n 1 --squad-confusion 0", bin);
    out = run_cmd_err(cmd, &st, &err);
    CHECK(st == 0 && !strstr(err, "truncated"), "a prompt that fits is not reported: %s", err);
    free(out);
    free(err);
}

static void test_commands(void)
{
    const char *b = getenv("SPARQ_BUILD");
    char bin[1024], cmd[2048], err[256];
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        test_skip("build/sparq not built: eval/stats command checks skipped");
        return;
    }
    if (path_find("data/text/tinyshakespeare_input.txt", cmd, sizeof cmd)) {
        test_skip("tinyshakespeare_input.txt not found");
        return;
    }
    int st;
    snprintf(cmd, sizeof cmd,
             "%s eval fidelity -t 1 -c 256 --limit 1 --fid-tokens 64 --fid-gen 16 --attn dense,sparq,streaming "
             "--sweep ratio=1/4 --json",
             bin);
    char *out = run_cmd(cmd, &st);
    json_doc *doc = out ? json_parse(out, strlen(out), 0, err, sizeof err) : NULL;
    CHECK(st == 0 && doc != NULL, "eval fidelity --json: status %d, %s", st, doc ? "" : err);
    if (doc) {
        const json_value *rows = json_get(json_root(doc), "rows");
        CHECK(json_len(rows) == 3, "3 rows: %zu", json_len(rows));
        for (size_t i = 0; i < json_len(rows); i++) {
            const json_value *r = json_at(rows, i);
            const char *pol = json_get_str(r, "policy", NULL);
            const char *keys[] = { "task", "policy", "params", "metric", "value", "stderr", "transfer_ratio", "n",
                                   "kl_mean", "top1_agreement", "first_divergence" };
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                CHECK(json_get(r, keys[k]) != NULL, "row %zu has %s", i, keys[k]);
            CHECK(num(r, "n") == 1, "one window");
            if (pol && strcmp(pol, "dense") == 0) {
                CHECK(num(r, "kl_mean") == 0 && num(r, "value") == 1 && num(r, "first_divergence") == 16 &&
                          num(r, "transfer_ratio") == 1,
                      "dense row is exact");
            } else {
                const double tr = num(r, "transfer_ratio");
                CHECK(tr > 0.25 * 0.85 && tr < 0.25 * 1.15, "%s measured transfer %g near 1/4", pol ? pol : "?", tr);
            }
        }
    }
    json_free(doc);
    free(out);

    snprintf(cmd, sizeof cmd, "%s stats -t 1 -c 160 --n-query 8 --json", bin);
    out = run_cmd(cmd, &st);
    doc = out ? json_parse(out, strlen(out), 0, err, sizeof err) : NULL;
    CHECK(st == 0 && doc != NULL, "stats --json: status %d", st);
    if (doc) {
        const json_value *heads = json_get(json_root(doc), "heads");
        CHECK(json_len(heads) == 5 * 8, "stories260K: 5 layers x 8 heads: %zu", json_len(heads));
        CHECK(num(json_root(doc), "s_last") == 160, "measured up to S=160");
    }
    json_free(doc);
    free(out);

    snprintf(cmd, sizeof cmd, "%s eval nosuchtask", bin);
    out = run_cmd(cmd, &st);
    CHECK(st != 0 && out && out[0] == 0, "unknown task: non-zero exit, nothing on stdout");
    free(out);

    test_help(bin);
    test_refused(bin);
    test_truncation_note(bin);
}

int main(void)
{
    test_truncate();
    test_fidelity_arithmetic();
    if (path_find("stories260K.gguf", model_path, sizeof model_path)) {
        test_skip("stories260K.gguf not found");
        return test_summary("test_eval");
    }
    char err[256];
    sparq_model *m = NULL;
    if (sparq_model_load(model_path, &m, err, sizeof err)) {
        CHECK(0, "load %s: %s", model_path, err);
        return test_summary("test_eval");
    }
    test_generate_golden(m);
    test_forced_nll(m);
    test_fidelity(m);
    test_tasks(m);
    test_stats(m);
    sparq_model_free(m);
    have_tmp = mkdtemp(tmp_dir) != NULL;
    CHECK(have_tmp, "mkdtemp %s", tmp_dir);
    if (have_tmp) {
        test_commands();
        rmdir(tmp_dir);
    }
    return test_summary("test_eval");
}
