/* test_batch.c - batch invariance of sparq_decode_batch and chunked
 * prefill through sparq_eval_prefill.
 *
 * The reference is each sequence run alone through the one-sequence API
 * (sparq_eval of its whole prompt, then sparq_eval one token at a time).
 * The same sequences then run interleaved: prompts prefilled chunk by chunk
 * (sparq_eval_prefill, the context's n_batch per chunk) at staggered times,
 * and decode steps of random subsets in random order, batches of 1..16.
 * Every logit row must equal the lone run's bit for bit (memcmp), for every
 * attention policy and several weight types and architectures. */
#include "test.h"
#include "util/paths.h"
#include "sparq.h"

#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N_SEQ = 16, N_STEPS = 10, MAX_PROMPT = 25, N_BATCH = 8 };

static uint64_t rng_state;
/* threads per context: results must not depend on it; 1 for most models
 * because OpenMP barriers crawl on a loaded 2-core machine */
static int n_threads = 1;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

typedef struct seq {
    int32_t prompt[MAX_PROMPT];
    int n_prompt;
    int32_t next[N_STEPS];      /* tokens fed at the decode steps          */
    float *ref;                 /* [1 + N_STEPS][V]: prompt's last row, steps */
} seq;

static sparq_attn_params policy(const char *name)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = name;
    /* budgets well below the positions reached (up to ~34), so every
     * sparse policy really selects */
    if (!strcmp(name, "sparq")) { p.r = 4; p.k = 8; p.l = 2; }
    else if (!strcmp(name, "streaming")) { p.k = 12; p.n_sink = 4; }
    else if (strcmp(name, "dense") != 0) p.k = 8;
    return p;
}

static sparq_context *make_ctx_cap(sparq_model *m, const char *pol, int n_ctx)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = n_ctx;
    cp.n_threads = n_threads;
    cp.n_batch = N_BATCH;
    cp.attn = policy(pol);
    sparq_context *c = NULL;
    char err[256];
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) {
        CHECK(0, "context %s: %s", pol, err);
        return NULL;
    }
    return c;
}

static sparq_context *make_ctx(sparq_model *m, const char *pol)
{
    return make_ctx_cap(m, pol, 64);
}

/* One model, one policy: references alone, then the interleaved run. */
static void check_policy(sparq_model *m, const char *label, const char *pol, seq *seqs)
{
    const int V = sparq_model_n_vocab(m);
    sparq_context *ctx[N_SEQ] = { 0 };
    float *rows = malloc((size_t)N_SEQ * V * sizeof(float));
    CHECK(rows != NULL, "oom");
    if (!rows) return;
    /* alone */
    int ok = 1;
    for (int s = 0; s < N_SEQ && ok; s++) {
        sparq_context *c = make_ctx(m, pol);
        if (!c) { ok = 0; break; }
        ok = sparq_eval(c, seqs[s].prompt, seqs[s].n_prompt, seqs[s].ref) == 0;
        for (int t = 0; t < N_STEPS && ok; t++)
            ok = sparq_eval(c, &seqs[s].next[t], 1, seqs[s].ref + (size_t)(1 + t) * V) == 0;
        CHECK(ok, "%s %s: lone run of sequence %d: %s", label, pol, s, sparq_context_error(c));
        sparq_context_free(c);
    }
    for (int s = 0; s < N_SEQ && ok; s++) ctx[s] = make_ctx(m, pol), ok = ctx[s] != NULL;
    /* interleaved: state per sequence = prompt tokens fed, steps done */
    int fed[N_SEQ] = { 0 }, done[N_SEQ] = { 0 }, start[N_SEQ];
    for (int s = 0; s < N_SEQ; s++) start[s] = (int)(rnd() % 8); /* rounds before its prompt starts */
    int mismatches = 0, compared = 0, max_batch = 0, seen_size[N_SEQ + 1] = { 0 }, tails_batched = 0, multi_tails = 0;
    const int observes = !strcmp(pol, "h2o");
    for (int round = 0; ok && round < 200; round++) {
        /* one prefill chunk for some sequences whose prompt is pending; a
         * one-token last chunk (prompt lengths 9, 17, 25) goes through
         * sparq_eval_prefill_batch for odd s, held back to every 13th
         * round so that several go together (even s: alone) */
        sparq_context *tc[N_SEQ];
        int32_t ttok[N_SEQ];
        int ts[N_SEQ], nt = 0;
        for (int s = 0; s < N_SEQ && ok; s++) {
            if (round < start[s] || fed[s] >= seqs[s].n_prompt) continue;
            if (!observes && (s & 1) && seqs[s].n_prompt > 1 && seqs[s].n_prompt - fed[s] == 1) {
                if (round % 13 != 12) continue; /* waits for the others (all pending by round 12) */
                tc[nt] = ctx[s];
                ttok[nt] = seqs[s].prompt[fed[s]];
                ts[nt++] = s;
                continue;
            }
            int nb = seqs[s].n_prompt - fed[s] < N_BATCH ? seqs[s].n_prompt - fed[s] : N_BATCH;
            const int last = fed[s] + nb == seqs[s].n_prompt;
            /* a one-token prompt is a decode step alone too (sparq_eval) */
            ok = (seqs[s].n_prompt == 1 ? sparq_eval(ctx[s], seqs[s].prompt, 1, rows)
                                        : sparq_eval_prefill(ctx[s], seqs[s].prompt + fed[s], nb,
                                                             last ? rows : NULL)) == 0;
            CHECK(ok, "%s %s: prefill: %s", label, pol, sparq_context_error(ctx[s]));
            fed[s] += nb;
            if (ok && last) {
                compared++;
                if (memcmp(rows, seqs[s].ref, (size_t)V * sizeof(float)) != 0) mismatches++;
            }
        }
        if (ok && nt > 0) {
            if (nt > 1) multi_tails++;
            ok = sparq_eval_prefill_batch(tc, ttok, nt, rows) == 0;
            CHECK(ok, "%s %s: eval_prefill_batch of %d: %s", label, pol, nt, sparq_context_error(tc[0]));
            for (int i = 0; ok && i < nt; i++) {
                fed[ts[i]]++;
                compared++;
                tails_batched++;
                if (memcmp(rows + (size_t)i * V, seqs[ts[i]].ref, (size_t)V * sizeof(float)) != 0) mismatches++;
            }
        }
        /* one decode step for a random subset of the ready sequences, in
         * random order */
        int ready[N_SEQ], n_ready = 0;
        for (int s = 0; s < N_SEQ; s++)
            if (fed[s] == seqs[s].n_prompt && done[s] < N_STEPS) ready[n_ready++] = s;
        if (n_ready == 0) {
            int all = 1;
            for (int s = 0; s < N_SEQ; s++) all &= done[s] == N_STEPS;
            if (all) break;
            continue;
        }
        for (int i = n_ready - 1; i > 0; i--) { /* shuffle */
            int j = (int)(rnd() % (uint32_t)(i + 1)), t = ready[i];
            ready[i] = ready[j];
            ready[j] = t;
        }
        int nb = 1 + (int)(rnd() % (uint32_t)n_ready);
        if (round % 5 == 4) nb = n_ready; /* now and then everything at once */
        sparq_context *bc[N_SEQ];
        int32_t tok[N_SEQ];
        for (int i = 0; i < nb; i++) {
            bc[i] = ctx[ready[i]];
            tok[i] = seqs[ready[i]].next[done[ready[i]]];
        }
        ok = sparq_decode_batch(bc, tok, nb, rows) == 0;
        CHECK(ok, "%s %s: decode_batch of %d: %s", label, pol, nb, sparq_context_error(bc[0]));
        if (nb > max_batch) max_batch = nb;
        seen_size[nb] = 1;
        for (int i = 0; ok && i < nb; i++) {
            const int s = ready[i];
            done[s]++;
            compared++;
            if (memcmp(rows + (size_t)i * V, seqs[s].ref + (size_t)done[s] * V, (size_t)V * sizeof(float)))
                mismatches++;
        }
    }
    int all_done = 1;
    for (int s = 0; s < N_SEQ; s++) all_done &= done[s] == N_STEPS && fed[s] == seqs[s].n_prompt;
    CHECK(!ok || all_done, "%s %s: the interleaved run did not finish", label, pol);
    CHECK(mismatches == 0, "%s %s: %d of %d logit rows differ from the lone run", label, pol, mismatches,
          compared);
    CHECK(!ok || compared == N_SEQ * (1 + N_STEPS), "%s %s: compared %d rows", label, pol, compared);
    CHECK(!ok || max_batch >= 8, "%s %s: largest batch only %d", label, pol, max_batch);
    CHECK(!ok || observes || (tails_batched >= 2 && multi_tails >= 1),
          "%s %s: %d one-token last chunks went through eval_prefill_batch, %d calls with several", label, pol,
          tails_batched, multi_tails);
    if (observes && ok) { /* refused, nothing changed */
        const int32_t tk = 5;
        const int64_t pos = sparq_context_pos(ctx[0]);
        CHECK(sparq_eval_prefill_batch(&ctx[0], &tk, 1, rows) != 0 &&
                  strstr(sparq_context_error(ctx[0]), "observes the prefill") && sparq_context_pos(ctx[0]) == pos,
              "%s h2o: eval_prefill_batch refused (%s)", label, sparq_context_error(ctx[0]));
    }
    int sizes = 0;
    for (int i = 1; i <= N_SEQ; i++) sizes += seen_size[i];
    CHECK(!ok || sizes >= 4, "%s %s: only %d batch sizes exercised", label, pol, sizes);
    /* the step counters and attention accounting advanced per sequence */
    for (int s = 0; ok && s < N_SEQ; s++) {
        sparq_attn_stats st;
        sparq_context_attn_stats(ctx[s], &st);
        const int64_t want_steps = N_STEPS + (seqs[s].n_prompt == 1);
        CHECK(st.steps == want_steps, "%s %s: sequence %d counted %lld steps", label, pol, s, (long long)st.steps);
        CHECK(sparq_context_pos(ctx[s]) == seqs[s].n_prompt + N_STEPS, "%s %s: position", label, pol);
    }
    for (int s = 0; s < N_SEQ; s++) sparq_context_free(ctx[s]);
    free(rows);
}

/* A prefix copied from another context (sparq_context_copy_prefix, cut at
 * a multiple of n_batch), then the rest of the prompt and decode steps:
 * the logits equal the lone run's bit for bit. The source runs another
 * policy than the copy: prefill keys and values do not depend on it. */
static void check_copy_prefix(sparq_model *m, const char *label, const char *pol, const seq *sq)
{
    const int V = sparq_model_n_vocab(m);
    float *row = malloc((size_t)V * sizeof(float));
    sparq_context *src = make_ctx(m, strcmp(pol, "dense") ? "dense" : "sparq"), *dst = make_ctx(m, pol);
    char err[256] = "";
    int ok = row && src && dst && sparq_eval(src, sq->prompt, sq->n_prompt, NULL) == 0;
    const int P = (sq->n_prompt - 1) / N_BATCH * N_BATCH;
    int rc = ok ? sparq_context_copy_prefix(dst, src, P, err, sizeof err) : -1;
    if (!strcmp(pol, "h2o")) {
        CHECK(rc == -1 && strstr(err, "observes the prefill"), "%s: copy_prefix into h2o: %s", label, err);
    } else {
        CHECK(rc == 0 && sparq_context_pos(dst) == P, "%s %s: copy_prefix: %s", label, pol, err);
        int diff = 0;
        for (int at = P; rc == 0 && at < sq->n_prompt; at += N_BATCH) {
            const int nb = sq->n_prompt - at < N_BATCH ? sq->n_prompt - at : N_BATCH;
            rc = sparq_eval_prefill(dst, sq->prompt + at, nb, row);
        }
        diff += rc == 0 && memcmp(row, sq->ref, (size_t)V * sizeof(float)) != 0;
        for (int t = 0; rc == 0 && t < N_STEPS; t++) {
            rc = sparq_decode_batch(&dst, &sq->next[t], 1, row);
            diff += rc == 0 && memcmp(row, sq->ref + (size_t)(1 + t) * V, (size_t)V * sizeof(float)) != 0;
        }
        CHECK(rc == 0 && diff == 0, "%s %s: after a copied prefix of %d, %d rows differ (%s)", label, pol, P, diff,
              dst ? sparq_context_error(dst) : "");
    }
    sparq_context_free(src);
    sparq_context_free(dst);
    free(row);
}

/* W sequences, each with its policy, capacity and a random prompt of
 * plen[i] (1..ALONE_PROMPT) tokens, then `steps` decode steps of all W at
 * once: every row equals the sequence's lone run bit for bit. */
enum { ALONE_MAX_W = 64, ALONE_MAX_STEPS = 4, ALONE_PROMPT = 6 };
static void check_batch_equals_alone(sparq_model *m, const char *label, const char *what, int W, int steps,
                                     const char *const *pols, const int *caps, const int *plen)
{
    const int V = sparq_model_n_vocab(m);
    sparq_context *ctx[ALONE_MAX_W] = { 0 };
    int32_t prompt[ALONE_MAX_W][ALONE_PROMPT], tok[ALONE_MAX_STEPS][ALONE_MAX_W];
    float *ref = malloc((size_t)W * steps * V * sizeof(float)), *rows = malloc((size_t)W * V * sizeof(float));
    int ok = ref && rows && W <= ALONE_MAX_W && steps <= ALONE_MAX_STEPS;
    for (int i = 0; ok && i < W; i++) ok = plen[i] >= 1 && plen[i] <= ALONE_PROMPT;
    for (int i = 0; ok && i < W; i++) {
        for (int j = 0; j < ALONE_PROMPT; j++) prompt[i][j] = (int32_t)(rnd() % (uint32_t)V);
        for (int t = 0; t < steps; t++) tok[t][i] = (int32_t)(rnd() % (uint32_t)V);
    }
    for (int i = 0; ok && i < W; i++) { /* alone */
        sparq_context *c = make_ctx_cap(m, pols[i], caps[i]);
        ok = c && sparq_eval(c, prompt[i], plen[i], NULL) == 0;
        for (int t = 0; ok && t < steps; t++) ok = sparq_eval(c, &tok[t][i], 1, ref + ((size_t)t * W + i) * V) == 0;
        sparq_context_free(c);
    }
    for (int i = 0; ok && i < W; i++)
        ok = (ctx[i] = make_ctx_cap(m, pols[i], caps[i])) && sparq_eval(ctx[i], prompt[i], plen[i], NULL) == 0;
    int diff = 0;
    for (int t = 0; ok && t < steps; t++) {
        ok = sparq_decode_batch(ctx, tok[t], W, rows) == 0;
        for (int i = 0; ok && i < W; i++) diff += memcmp(rows + (size_t)i * V, ref + ((size_t)t * W + i) * V, (size_t)V * sizeof(float)) != 0;
    }
    CHECK(ok && diff == 0, "%s: %s of %d: %d rows differ (%s)", label, what, W, diff, ctx[0] ? sparq_context_error(ctx[0]) : "");
    for (int i = 0; i < W; i++) sparq_context_free(ctx[i]);
    free(ref);
    free(rows);
}

/* 64 sequences in every step (the width a server runs), SparQ. */
static void check_wide(sparq_model *m, const char *label)
{
    const char *pols[ALONE_MAX_W];
    int caps[ALONE_MAX_W], plen[ALONE_MAX_W];
    for (int i = 0; i < ALONE_MAX_W; i++) pols[i] = "sparq", caps[i] = 64, plen[i] = 2 + i % 5;
    check_batch_equals_alone(m, label, "batch", ALONE_MAX_W, 3, pols, caps, plen);
}

/* Contexts of different policies and capacities in one batch: a step's
 * attention tasks all work in the scratch of the batch's largest context,
 * which sits in the middle here (sized for 1024 positions; the others'
 * would be too small for it). */
static void check_mixed(sparq_model *m, const char *label)
{
    static const char *const pols[] = { "dense", "sparq", "sparq", "streaming", "oracle" };
    static const int caps[] = { 32, 48, 1024, 64, 40 },
                     plen[] = { ALONE_PROMPT, ALONE_PROMPT, ALONE_PROMPT, ALONE_PROMPT, ALONE_PROMPT };
    check_batch_equals_alone(m, label, "mixed batch", 5, 4, pols, caps, plen);
}

static void check_model(const char *path, const char *label)
{
    char err[512];
    sparq_model *m = NULL;
    CHECK(sparq_model_load(path, &m, err, sizeof err) == 0, "%s: %s", label, err);
    if (!m) return;
    const int V = sparq_model_n_vocab(m);
    seq seqs[N_SEQ];
    rng_state = 0x1234567ull;
    for (int s = 0; s < N_SEQ; s++) {
        /* lengths cover one token, chunk-sized (8, 16) and a one-token last chunk (9, 17, 25) */
        static const int lens[N_SEQ] = { 1, 2, 5, 8, 9, 12, 16, 17, 20, 24, 3, 7, 11, 15, 19, 25 };
        seqs[s].n_prompt = lens[s];
        for (int i = 0; i < lens[s]; i++) seqs[s].prompt[i] = (int32_t)(rnd() % (uint32_t)V);
        for (int t = 0; t < N_STEPS; t++) seqs[s].next[t] = (int32_t)(rnd() % (uint32_t)V);
        seqs[s].ref = malloc((size_t)(1 + N_STEPS) * V * sizeof(float));
        CHECK(seqs[s].ref != NULL, "oom");
        if (!seqs[s].ref) return;
    }
    static const char *pols[] = { "dense", "sparq", "oracle", "flexgen", "h2o", "streaming", "topk" };
    for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++) {
        check_policy(m, label, pols[p], seqs);
        check_copy_prefix(m, label, pols[p], &seqs[9]); /* 24 tokens: a prefix of 16 */
        check_copy_prefix(m, label, pols[p], &seqs[7]); /* 17 tokens: the rest is one token */
    }

    check_wide(m, label);
    check_mixed(m, label);

    /* the API's errors: same context twice, bad id, full context */
    sparq_context *a = make_ctx(m, "dense"), *b = make_ctx(m, "dense");
    if (a && b) {
        int32_t t2[2] = { 1, 2 };
        sparq_context *same[2] = { a, a };
        CHECK(sparq_decode_batch(same, t2, 2, NULL) == -1, "duplicate context accepted");
        CHECK(strstr(sparq_context_error(a), "same sequence") != NULL, "%s", sparq_context_error(a));
        sparq_context *ab[2] = { a, b };
        int32_t bad[2] = { 1, V };
        CHECK(sparq_decode_batch(ab, bad, 2, NULL) == -1, "token id %d accepted", V);
        CHECK(sparq_context_pos(a) == 0 && sparq_context_pos(b) == 0, "a failed step moved a context");
        int full = 0;
        while (sparq_context_pos(b) < sparq_context_n_ctx(b) && !full) full = sparq_decode_batch(ab, t2, 2, NULL) != 0;
        CHECK(sparq_decode_batch(ab, t2, 2, NULL) == -1 && strstr(sparq_context_error(a), "context full"),
              "full context: %s", sparq_context_error(a));
    }
    sparq_context_free(a);
    sparq_context_free(b);
    for (int s = 0; s < N_SEQ; s++) free(seqs[s].ref);
    sparq_model_free(m);
}

/* Writes a random-weight model with `sparq gen-model`; 0 on success. */
/* Long dense decode steps run in parts (attn.h, ATTN_PART) that the model
 * spreads over threads (alone and in a batch step), while SparQ with
 * k >= S runs the same parts one after the other inside attn_dense_group:
 * a step at depth >= 2 ATTN_PART must give the same bits on 1 or 2 threads,
 * alone or in a batch, and as that SparQ, for f16 and q8_0 caches
 * (head size 64: the q8_0 integer kernels; F32 weights, so that an ulp
 * of attention reaches the logits instead of vanishing in a Q8_0
 * activation's rounding). With sparq_k, SparQ with that
 * k instead: alone, the model runs its step in stages (one select a head,
 * then the gathers in parts on every thread); in a batch of four, each
 * head whole (attend, the parts in turn): the same bits either way, on 1
 * or 2 threads. The caches hold seeded random keys and values
 * (sparq_context_fill_random): no prefill of 9k tokens. */
static void check_long_parts(const char *path, int sparq_k)
{
    char err[256];
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load %s: %s", path, err);
        return;
    }
    const int V = sparq_model_n_vocab(m);
    const int64_t depth = 3 * 4096 + 777; /* three parts: merge order matters */
    /* 0: alone, its parts on 2 threads; 1: on 1 thread; 2..2+nb: a batch
     * (SparQ: of four, whose 8 KV heads on 2 threads take one task each,
     * where one sequence's 2 are staged); dense only, last: SparQ with
     * k >= S, which runs the parts one after the other inside
     * attn_dense_group (so the threads' merge is checked against the plain
     * one, not only against itself) */
    enum { MAX_CTX = 7 };
    const int nb = sparq_k ? 4 : 2, n_ctx = 2 + nb + (sparq_k ? 0 : 1);
    for (int kt = 0; kt < 2; kt++) {
        sparq_context *c[MAX_CTX] = { 0 };
        int ok = 1;
        for (int i = 0; i < n_ctx && ok; i++) {
            sparq_context_params cp = sparq_context_default_params();
            cp.n_ctx = 16384;
            cp.n_threads = i == 1 ? 1 : 2;
            cp.kv_type = kt ? SPARQ_KV_Q8_0 : SPARQ_KV_F16;
            if (sparq_k) { /* SparQ's staged step: one select a head, then its gathers in parts */
                cp.attn.policy = "sparq";
                cp.attn.k = sparq_k;
            } else if (i == 2 + nb) {
                cp.attn.policy = "sparq";
                cp.attn.k = 1 << 20;
            }
            /* the batch's others at other depths */
            const int64_t dp = i > 2 && i < 2 + nb ? depth + 100 * (i - 2) : depth;
            ok = sparq_context_create(m, &cp, &c[i], err, sizeof err) == 0 &&
                 sparq_context_fill_random(c[i], dp, 11 + (i > 2 && i < 2 + nb ? i : 0)) == 0;
            CHECK(ok, "long context %d: %s", i, err);
        }
        float *a = malloc((size_t)V * sizeof *a), *b = malloc((size_t)V * sizeof *b);
        float *bt = malloc((size_t)nb * V * sizeof *bt);
        if (ok && a && b && bt) {
            int same_threads = 1, same_batch = 1, same_sparq = 1;
            for (int step = 0; step < 3; step++) {
                const int32_t tok = 5 + 7 * step, toks[4] = { tok, 9, 11, 13 };
                if (sparq_eval(c[0], &tok, 1, a) || sparq_eval(c[1], &tok, 1, b) ||
                    sparq_decode_batch(c + 2, toks, nb, bt)) {
                    CHECK(0, "long decode step %d failed", step);
                    break;
                }
                same_threads &= memcmp(a, b, (size_t)V * sizeof *a) == 0;
                same_batch &= memcmp(a, bt, (size_t)V * sizeof *a) == 0;
                if (sparq_k) continue;
                if (sparq_eval(c[2 + nb], &tok, 1, b)) {
                    CHECK(0, "long SparQ step %d failed", step);
                    break;
                }
                same_sparq &= memcmp(a, b, (size_t)V * sizeof *a) == 0;
            }
            const char *what = sparq_k ? "SparQ" : "dense";
            if (!sparq_k)
                CHECK(same_sparq, "%s cache, depth %lld: dense in parts on threads = SparQ k >= S (parts in turn)",
                      kt ? "q8_0" : "f16", (long long)depth);
            CHECK(same_threads, "%s %s cache, depth %lld: same logits on 1 and 2 threads", what,
                  kt ? "q8_0" : "f16", (long long)depth);
            CHECK(same_batch, "%s %s cache, depth %lld: same logits alone and in a batch of %d", what,
                  kt ? "q8_0" : "f16", (long long)depth, nb);
        }
        free(a); free(b); free(bt);
        for (int i = 0; i < MAX_CTX; i++) sparq_context_free(c[i]);
    }
    sparq_model_free(m);
}

static int gen_model(const char *bin, const char *shape, const char *type, char *path, size_t size)
{
    snprintf(path, size, "/tmp/sparq_test_batch_%s_%s_%d.gguf", shape, type, (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%.900s gen-model --shape %s --type %s --seed 3 -c 4096 -o %.900s >/dev/null 2>&1", bin,
             shape, type, path);
    int st = system(cmd);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

int main(void)
{
    char path[1024];
    if (path_find("stories260K.gguf", path, sizeof path)) test_skip("stories260K.gguf not found");
    else {
        n_threads = 2;
        check_model(path, "stories260K");
        n_threads = 1;
    }

    const char *b = getenv("SPARQ_BUILD");
    char bin[1024];
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return test_summary("test_batch");
    }
    /* the long-step parts, on a model whose head size takes the q8_0 integer kernels */
    snprintf(path, sizeof path, "/tmp/sparq_test_batch_long_%d.gguf", (int)getpid());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%.900s gen-model --shape tiny-d64 --type F32 --seed 3 -c 16384 -o %.900s >/dev/null 2>&1",
             bin, path);
    const int st = system(cmd);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "gen-model tiny-d64");
    check_long_parts(path, 0);
    check_long_parts(path, 1024);
    unlink(path);

    static const struct { const char *shape, *type; } gens[] = {
        { "tiny", "Q8_0" }, { "tiny", "Q4_0" }, { "tiny", "F16" }, { "tiny", "Q4_K_M" },
        { "tiny-qwen3", "F32" }, { "tiny-phi3", "Q8_0" },
    };
    const size_t n_gens = test_quick() ? 2 : sizeof gens / sizeof gens[0];
    for (size_t i = 0; i < n_gens; i++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", gens[i].shape, gens[i].type);
        CHECK(gen_model(bin, gens[i].shape, gens[i].type, path, sizeof path) == 0, "gen-model %s", label);
        check_model(path, label);
        unlink(path);
    }
    return test_summary("test_batch");
}
