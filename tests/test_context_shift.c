/* test_context_shift.c - sparq_context_shift: after dropping positions
 * [keep, keep + discard) the cache serves decoding as a fresh prefill of
 * the kept tokens would, for every attention policy and both KV types.
 *
 * The models have one layer (gen-model tiny-1l: NORM RoPE; tiny-qwen2-1l:
 * NEOX RoPE, q/k/v biases), so a cached key or value depends only on its
 * token and position and the fresh prefill is an exact reference: the
 * shifted keys differ from it only by the f16 rounding of the rotation.
 * Policies that select positions read K^T (SparQ) or indexes (topk)
 * rebuilt after the shift, and V sums updated for the dropped rows; H2O's
 * scores restart at a shift (documented), so it runs with k >= S here,
 * where it must equal dense. Also: a shift inside sparq_generate keeps
 * generating past a full cache.
 *
 * Two-layer models (tiny: NORM RoPE; tiny-qwen2: NEOX, biases; F32
 * weights) are held against a naive double-precision decoder that keeps
 * each key before RoPE with the position it is rotated to and applies the
 * shift by its definition (check_layers): logits within 1e-4 (f32 KV) or
 * 1e-2 (f16), greedy tokens equal; a shift without re-rotation and the
 * fresh prefill of the kept tokens are both far from it (the comparison
 * can fail; a shift that rotated only the first layer fails it). */
#include "test.h"
#include "naive_forward.h"
#include "sparq.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static char bin[1024];

static sparq_context *make(sparq_model *m, int kv_type, sparq_attn_params ap)
{
    char err[256];
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 128;
    cp.n_threads = 1;
    cp.n_batch = 32;
    cp.kv_type = kv_type;
    cp.attn = ap;
    sparq_context *c = NULL;
    CHECK(sparq_context_create(m, &cp, &c, err, sizeof err) == 0, "context (%s): %s", ap.policy, err);
    return c;
}

/* max |a - b| / max |b| over the logits */
static double rel_diff(const float *a, const float *b, int n)
{
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs((double)b[i]));
    }
    return s > 0 ? d / s : d;
}

static void check_model(const char *path)
{
    char err[256];
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load %s: %s", path, err);
        return;
    }
    const int V = sparq_model_n_vocab(m);
    enum { N = 96, KEEP = 8, DISCARD = 40, STEPS = 4 };
    int32_t toks[N], kept[N], next[STEPS];
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    for (int i = 0; i < STEPS; i++) next[i] = toks[(7 * i + 3) % N];
    int n_kept = 0;
    for (int i = 0; i < KEEP; i++) kept[n_kept++] = toks[i];
    for (int i = KEEP + DISCARD; i < N; i++) kept[n_kept++] = toks[i];
    float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);

    static const struct { const char *policy; int k, r; const char *index; } pols[] = {
        { "dense", 0, 0, NULL },  { "sparq", 16, 8, NULL }, { "oracle", 16, 0, NULL },
        { "flexgen", 16, 0, NULL }, { "h2o", 128, 0, NULL }, { "streaming", 16, 0, NULL },
        { "topk", 16, 0, "exact" },
    };
    for (int kvt = 0; kvt < 2; kvt++) {
        const int kv_type = kvt ? SPARQ_KV_F32 : SPARQ_KV_F16;
        /* f16: the re-rotated key is rounded twice (seen: <= 9e-4); f32:
         * the forward pass's float angles at position ~100 (seen: <= 4e-4) */
        const double tol = kv_type == SPARQ_KV_F16 ? 3e-3 : 1e-3;
        for (size_t p = 0; p < sizeof pols / sizeof pols[0]; p++) {
            sparq_attn_params ap = sparq_attn_default_params();
            ap.policy = pols[p].policy;
            ap.k = pols[p].k;
            ap.r = pols[p].r;
            ap.index = pols[p].index;
            if (strcmp(ap.policy, "streaming") == 0) ap.n_sink = 4;
            sparq_context *a = make(m, kv_type, ap), *b = make(m, kv_type, ap);
            if (!a || !b) {
                sparq_context_free(a);
                sparq_context_free(b);
                continue;
            }
            CHECK(sparq_eval(a, toks, N, la) == 0, "prefill a");
            CHECK(sparq_context_shift(a, KEEP, DISCARD) == 0, "shift: %s", sparq_context_error(a));
            CHECK(sparq_context_pos(a) == N - DISCARD, "positions after the shift: %lld",
                  (long long)sparq_context_pos(a));
            CHECK(sparq_eval(b, kept, n_kept, lb) == 0, "prefill b");
            double worst = 0;
            for (int s = 0; s < STEPS; s++) {
                CHECK(sparq_eval(a, &next[s], 1, la) == 0, "decode a: %s", sparq_context_error(a));
                CHECK(sparq_eval(b, &next[s], 1, lb) == 0, "decode b: %s", sparq_context_error(b));
                worst = fmax(worst, rel_diff(la, lb, V));
                if (getenv("SHIFT_VERBOSE")) fprintf(stderr, "  step %d: %g %g\n", s, la[0], lb[0]);
            }
            if (getenv("SHIFT_VERBOSE")) fprintf(stderr, "%s %s %s %.2e\n", path, ap.policy, kvt ? "f32" : "f16", worst);
            CHECK(worst <= tol, "%s %s kv %s: shifted vs fresh logits differ by %.2e (tol %.0e)", path, ap.policy,
                  kvt ? "f32" : "f16", worst, tol);
            sparq_context_free(a);
            sparq_context_free(b);
        }
    }

    /* a shift that would not discard the right positions is detectable:
     * without re-rotation (discard = 0 then a manual mismatch) the logits
     * differ - the comparison above can fail */
    for (int w = 0; w < 2; w++) {
        sparq_attn_params ap = sparq_attn_default_params();
        if (w) { ap.policy = "sparq"; ap.k = 16; ap.r = 8; }
        sparq_context *a = make(m, SPARQ_KV_F32, ap), *b = make(m, SPARQ_KV_F32, ap);
        int32_t wrong[N];
        int n_wrong = 0;
        for (int i = 0; i < KEEP; i++) wrong[n_wrong++] = toks[i];
        for (int i = KEEP + DISCARD - 1; i < N - 1; i++) wrong[n_wrong++] = toks[i]; /* off by one */
        sparq_eval(a, toks, N, la);
        sparq_context_shift(a, KEEP, DISCARD);
        sparq_eval(b, wrong, n_wrong, lb);
        sparq_eval(a, &next[0], 1, la);
        sparq_eval(b, &next[0], 1, lb);
        CHECK(rel_diff(la, lb, V) > 1e-2, "%s: a different kept set gives different logits (the check can fail)",
              ap.policy);
        sparq_context_free(a);
        sparq_context_free(b);
    }

    /* bad arguments leave the cache unchanged */
    sparq_context *c = make(m, SPARQ_KV_F16, sparq_attn_default_params());
    sparq_eval(c, toks, 10, la);
    CHECK(sparq_context_shift(c, 4, 7) == -1 && sparq_context_pos(c) == 10 && sparq_context_error(c)[0],
          "keep + discard > cached is an error");
    CHECK(sparq_context_shift(c, -1, 2) == -1, "negative keep is an error");

    /* sparq_generate with context_shift runs past a full cache */
    sparq_context_reset(c);
    sparq_eval(c, toks, 90, la);
    sparq_generate_params gp = sparq_generate_default_params();
    gp.max_tokens = 80;
    gp.ignore_eog = 1;
    gp.context_shift = 1;
    gp.n_keep = 4;
    sparq_generation g;
    CHECK(sparq_generate(c, la, &gp, &g) == 0 && g.n_tokens == 80 && g.n_shifts >= 1 &&
              g.stop == SPARQ_STOP_MAX_TOKENS,
          "generate with shifts: %d tokens, %d shifts, %s", g.n_tokens, g.n_shifts, sparq_context_error(c));
    sparq_generation_free(&g);
    sparq_context_free(c);
    free(la);
    free(lb);
    sparq_model_free(m);
}

/* ---- several layers: the shifted cache against a naive reference ------------
 * With more than one layer a cached key or value of layer >= 1 depends on
 * every earlier token, the dropped ones included, so a fresh prefill of the
 * kept tokens is no reference (shown below). The reference here is a naive
 * double-precision decoder (naive_forward.h's weights and steps) whose
 * cache holds each key before RoPE with the position it is to be rotated
 * by: a shift drops entries and lowers the moved ones' positions, and each
 * step rotates every key afresh - the definition of the shift, without
 * rotating a rotated key as kv_shift does. A shift that missed a layer,
 * moved rows of the wrong layer or head, or rotated by the wrong angle
 * would leave the engine's logits away from it. */

typedef struct {
    const nf_model *r;
    int n, cap;
    double *kraw, *v; /* [n_layer][cap][n_kv * hd]: keys before RoPE, values */
    int *kpos;        /* [cap]: the position each key is rotated to */
} ncache;

static int ncache_init(ncache *c, const nf_model *r, int cap)
{
    const size_t per = (size_t)r->n_layer * cap * r->n_kv * r->hd;
    c->r = r;
    c->n = 0;
    c->cap = cap;
    c->kraw = malloc(per * sizeof *c->kraw);
    c->v = malloc(per * sizeof *c->v);
    c->kpos = malloc((size_t)cap * sizeof *c->kpos);
    return c->kraw && c->v && c->kpos ? 0 : -1;
}

static void ncache_free(ncache *c)
{
    free(c->kraw);
    free(c->v);
    free(c->kpos);
}

/* Drops entries [keep, keep + discard); the moved keys' positions drop by
 * discard unless rerotate is 0 (the negative control). */
static void ncache_shift(ncache *c, int keep, int discard, int rerotate)
{
    const int kvd = c->r->n_kv * c->r->hd, n_move = c->n - keep - discard;
    for (int l = 0; l < c->r->n_layer; l++) {
        double *k = c->kraw + (size_t)l * c->cap * kvd, *v = c->v + (size_t)l * c->cap * kvd;
        memmove(k + (size_t)keep * kvd, k + (size_t)(keep + discard) * kvd, (size_t)n_move * kvd * sizeof *k);
        memmove(v + (size_t)keep * kvd, v + (size_t)(keep + discard) * kvd, (size_t)n_move * kvd * sizeof *v);
    }
    for (int s = keep; s < keep + n_move; s++) c->kpos[s] = c->kpos[s + discard] - (rerotate ? discard : 0);
    c->n -= discard;
}

/* One token at position pos through every layer: appends its keys and
 * values, writes logits[n_vocab]. 0, or -1 (missing tensor, no memory). */
static int naive_step(ncache *c, int32_t tok, int pos, float *logits)
{
    const nf_model *r = c->r;
    const int E = r->n_embd, hd = r->hd, qd = r->n_head * hd, kvd = r->n_kv * hd, F = r->n_ff;
    const int big = E > F ? (E > r->n_vocab ? E : r->n_vocab) : (F > r->n_vocab ? F : r->n_vocab);
    double *x = malloc((size_t)E * sizeof *x), *xn = malloc((size_t)big * sizeof *xn);
    double *q = malloc((size_t)qd * sizeof *q), *att = malloc((size_t)qd * sizeof *att);
    double *g = malloc((size_t)F * sizeof *g), *u = malloc((size_t)F * sizeof *u);
    double *y = malloc((size_t)big * sizeof *y), *p = malloc((size_t)(c->n + 1) * sizeof *p);
    double *kr = malloc((size_t)hd * sizeof *kr);
    const float *emb = nf_tensor(r, "token_embd.weight", (int64_t)E * r->n_vocab);
    const float *out_w = nf_tensor(r, "output.weight", (int64_t)E * r->n_vocab);
    const float *out_norm = nf_tensor(r, "output_norm.weight", E);
    int rc = -1;
    if (!x || !xn || !q || !att || !g || !u || !y || !p || !kr || !emb || !out_norm || c->n >= c->cap) goto done;
    if (!out_w) out_w = emb;
    const int t = c->n;
    c->kpos[t] = pos;
    for (int i = 0; i < E; i++) x[i] = emb[(size_t)tok * E + i];
    for (int il = 0; il < r->n_layer; il++) {
        nf_layer_w w;
        if (nf_layer_weights(r, il, &w)) goto done;
        double *K = c->kraw + (size_t)il * c->cap * kvd, *Vv = c->v + (size_t)il * c->cap * kvd;
        nf_rmsnorm(xn, x, w.an, E, r->eps);
        nf_matvec(q, w.wq, w.bq, xn, qd, E);
        nf_matvec(K + (size_t)t * kvd, w.wk, w.bk, xn, kvd, E);
        nf_matvec(Vv + (size_t)t * kvd, w.wv, w.bv, xn, kvd, E);
        for (int h = 0; h < r->n_head; h++) {
            if (w.qn) nf_rmsnorm(q + h * hd, q + h * hd, w.qn, hd, r->eps);
            nf_rope(r, q + h * hd, pos);
        }
        for (int h = 0; w.kn && h < r->n_kv; h++)
            nf_rmsnorm(K + (size_t)t * kvd + h * hd, K + (size_t)t * kvd + h * hd, w.kn, hd, r->eps);
        for (int h = 0; h < r->n_head; h++) {
            const int kh = h / (r->n_head / r->n_kv);
            double mx = -INFINITY, sum = 0;
            for (int s = 0; s <= t; s++) {
                memcpy(kr, K + (size_t)s * kvd + kh * hd, (size_t)hd * sizeof *kr);
                nf_rope(r, kr, c->kpos[s]);
                double d = 0;
                for (int i = 0; i < hd; i++) d += q[h * hd + i] * kr[i];
                p[s] = d / sqrt((double)hd);
                mx = fmax(mx, p[s]);
            }
            for (int s = 0; s <= t; s++) sum += (p[s] = exp(p[s] - mx));
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int s = 0; s <= t; s++) a += p[s] / sum * Vv[(size_t)s * kvd + kh * hd + i];
                att[h * hd + i] = a;
            }
        }
        nf_matvec(y, w.wo, NULL, att, E, qd);
        for (int i = 0; i < E; i++) x[i] += y[i];
        nf_rmsnorm(xn, x, w.fn, E, r->eps);
        nf_matvec(g, w.wg, NULL, xn, F, E);
        nf_matvec(u, w.wu, NULL, xn, F, E);
        for (int i = 0; i < F; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        nf_matvec(y, w.wd, NULL, g, E, F);
        for (int i = 0; i < E; i++) x[i] += y[i];
    }
    nf_rmsnorm(xn, x, out_norm, E, r->eps);
    nf_matvec(y, out_w, NULL, xn, r->n_vocab, E);
    for (int i = 0; i < r->n_vocab; i++) logits[i] = (float)y[i];
    c->n++;
    rc = 0;
done:
    free(x); free(xn); free(q); free(att); free(g); free(u); free(y); free(p); free(kr);
    return rc;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

static void check_layers(const char *path)
{
    nf_file nf;
    if (nf_file_open(&nf, path)) {
        nf_file_close(&nf);
        return;
    }
    char err[256];
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load %s: %s", path, err);
        nf_file_close(&nf);
        return;
    }
    const int V = sparq_model_n_vocab(m);
    CHECK(nf.r.n_layer >= 2 && V == nf.r.n_vocab, "%s: %d layers, vocab %d", path, nf.r.n_layer, V);
    enum { N = 80, KEEP = 6, DISCARD = 33, STEPS = 4 };
    int32_t toks[N + STEPS];
    uint64_t x = 777;
    for (int i = 0; i < N + STEPS; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)((x >> 33) % (uint64_t)V);
    }
    float *le = malloc((size_t)V * STEPS * sizeof *le), *ln = malloc((size_t)V * STEPS * sizeof *ln);
    float *lw = malloc((size_t)V * STEPS * sizeof *lw), *lf = malloc((size_t)V * sizeof *lf);
    ncache ref, wrong;
    if (!le || !ln || !lw || !lf || ncache_init(&ref, &nf.r, N + STEPS) || ncache_init(&wrong, &nf.r, N + STEPS)) {
        CHECK(0, "out of memory");
        goto out;
    }
    /* the reference: N tokens, the shift, STEPS more (and, the control,
     * the same shift leaving the moved keys at their old positions) */
    int ok = 1;
    for (int i = 0; i < N && ok; i++) ok = !naive_step(&ref, toks[i], i, lf) && !naive_step(&wrong, toks[i], i, lf);
    CHECK(ok, "%s: the naive reference reads the F32 weights", path);
    ncache_shift(&ref, KEEP, DISCARD, 1);
    ncache_shift(&wrong, KEEP, DISCARD, 0);
    for (int s = 0; s < STEPS && ok; s++)
        ok = !naive_step(&ref, toks[N + s], N - DISCARD + s, ln + (size_t)s * V) &&
             !naive_step(&wrong, toks[N + s], N - DISCARD + s, lw + (size_t)s * V);
    for (int kvt = 0; kvt < 2 && ok; kvt++) {
        const int kv_type = kvt ? SPARQ_KV_F32 : SPARQ_KV_F16;
        /* f32: float sums against double (seen: 2e-6); f16: each cached
         * value rounded, the moved keys twice (seen: 1.6e-3) */
        const double tol = kv_type == SPARQ_KV_F16 ? 1e-2 : 1e-4;
        sparq_context *c = make(m, kv_type, sparq_attn_default_params());
        if (!c) continue;
        CHECK(sparq_eval(c, toks, N, lf) == 0, "prefill");
        CHECK(sparq_context_shift(c, KEEP, DISCARD) == 0, "shift: %s", sparq_context_error(c));
        double worst = 0, worst_wrong = 0;
        int same_greedy = 0;
        for (int s = 0; s < STEPS; s++) {
            CHECK(sparq_eval(c, &toks[N + s], 1, le + (size_t)s * V) == 0, "decode: %s", sparq_context_error(c));
            worst = fmax(worst, rel_diff(le + (size_t)s * V, ln + (size_t)s * V, V));
            worst_wrong = fmax(worst_wrong, rel_diff(lw + (size_t)s * V, ln + (size_t)s * V, V));
            same_greedy += argmax(le + (size_t)s * V, V) == argmax(ln + (size_t)s * V, V);
        }
        if (getenv("SHIFT_VERBOSE"))
            fprintf(stderr, "%s layers kv %s: %.2e (not re-rotated: %.2e)\n", path, kvt ? "f32" : "f16", worst, worst_wrong);
        CHECK(worst <= tol, "%s kv %s, %d layers: shifted logits vs the naive reference differ by %.2e (tol %.0e)",
              path, kvt ? "f32" : "f16", nf.r.n_layer, worst, tol);
        CHECK(same_greedy == STEPS, "%s kv %s: greedy tokens after the shift agree with the reference at %d/%d steps",
              path, kvt ? "f32" : "f16", same_greedy, STEPS);
        /* the control: keys left unrotated are far outside the tolerance */
        CHECK(worst_wrong > 10 * tol, "%s: a shift without re-rotation is detected (%.2e, tol %.0e)", path,
              worst_wrong, tol);
        /* and a fresh prefill of the kept tokens is no reference here: the
         * kept positions' layer >= 1 entries saw the dropped tokens */
        if (kvt == 1) {
            sparq_context *b = make(m, kv_type, sparq_attn_default_params());
            int32_t kept[N + STEPS];
            int nk = 0;
            for (int i = 0; i < KEEP; i++) kept[nk++] = toks[i];
            for (int i = KEEP + DISCARD; i < N + STEPS; i++) kept[nk++] = toks[i];
            CHECK(b && sparq_eval(b, kept, nk, lf) == 0, "fresh prefill");
            const double fresh = rel_diff(lf, ln + (size_t)(STEPS - 1) * V, V);
            CHECK(fresh > 10 * tol, "%s: with %d layers the shift is not a fresh prefill (%.2e)", path,
                  nf.r.n_layer, fresh);
            sparq_context_free(b);
        }
        sparq_context_free(c);
    }
out:
    ncache_free(&ref);
    ncache_free(&wrong);
    free(le);
    free(ln);
    free(lw);
    free(lf);
    sparq_model_free(m);
    nf_file_close(&nf);
}

int main(void)
{
    const char *b = getenv("SPARQ_BUILD");
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    char dir[] = "/tmp/sparq_shift_XXXXXX";
    if (access(bin, X_OK) != 0 || !mkdtemp(dir)) {
        CHECK(0, "%s not built, or no temp directory", bin);
        return test_summary("test_context_shift");
    }
    static const char *const shapes[] = { "tiny-1l", "tiny-qwen2-1l" };
    for (int i = 0; i < 2; i++) {
        char path[512], cmd[2048];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, shapes[i]);
        snprintf(cmd, sizeof cmd, "%s gen-model --shape %s --type F16 -o %s >/dev/null 2>&1", bin, shapes[i], path);
        CHECK(system(cmd) == 0, "gen-model %s", shapes[i]);
        check_model(path);
        unlink(path);
    }
    static const char *const multi[] = { "tiny", "tiny-qwen2" }; /* 2 layers: NORM RoPE; NEOX with biases */
    for (int i = 0; i < 2; i++) {
        char path[512], cmd[2048];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, multi[i]);
        snprintf(cmd, sizeof cmd, "%s gen-model --shape %s --type F32 -o %s >/dev/null 2>&1", bin, multi[i], path);
        CHECK(system(cmd) == 0, "gen-model %s", multi[i]);
        check_layers(path);
        unlink(path);
    }
    rmdir(dir);
    return test_summary("test_context_shift");
}
