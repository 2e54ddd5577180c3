/* test_topk.c - top-k attention over a key index (attn_topk.c).
 *
 * Against independent references written here: a naive top-k attention
 * (double sums, sort), SparQ's approximate selection, the ivf probe count
 * recomputed from the index image, the linear budget; identities: k >=
 * prefix equals dense (bit for bit, also greedy tokens in the model's decode
 * path), ivf with nprobe = nlist equals exact; counted transfers equal the
 * formula; prebuilt images from an index source are used (and a mismatching
 * one ignored); and the `sparq bench-topk` command finds every planted
 * needle at 64k positions. */
#include "test.h"
#include "attn/attn.h"
#include "index/index.h"
#include "util/paths.h"
#include "tensor/quant.h"
#include "sparq.h"
#include "sparq_attn.h"

#include <stdint.h>
#include <unistd.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

/* ---- budgets ---------------------------------------------------------------- */

static void test_schedule(void)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = "topk";
    const int ks[] = { 1, 7, 100, 128 }, Ls[] = { 1, 2, 5, 16, 32 };
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 5; b++) {
            p.k = ks[a];
            p.topk_schedule = SPARQ_TOPK_UNIFORM;
            int ok = 1;
            for (int l = 0; l < Ls[b]; l++) ok &= attn_topk_layer_k(&p, Ls[b], l) == ks[a];
            CHECK(ok, "uniform k");
            p.topk_schedule = SPARQ_TOPK_LINEAR;
            int64_t sum = 0, prev = 0, mono = 1, pos = 1;
            for (int l = 0; l < Ls[b]; l++) {
                int k = attn_topk_layer_k(&p, Ls[b], l);
                sum += k;
                mono &= k >= prev;
                pos &= k >= 1;
                prev = k;
            }
            CHECK(mono && pos, "linear ramp non-decreasing, >= 1 (k %d, L %d)", ks[a], Ls[b]);
            if (ks[a] * 2 >= Ls[b] + 1 || ks[a] == 1) /* a ramp can hold the total */
                CHECK(sum == (int64_t)ks[a] * Ls[b], "linear total %lld == %d x %d", (long long)sum,
                      ks[a], Ls[b]);
            /* the ramp is linear: k_l ~ 2k(l+1)/(L+1) within rounding */
            if (Ls[b] == 16 && ks[a] == 128) {
                CHECK(abs(attn_topk_layer_k(&p, 16, 0) - 15) <= 1, "first layer %d", attn_topk_layer_k(&p, 16, 0));
                CHECK(abs(attn_topk_layer_k(&p, 16, 15) - 241) <= 1, "last layer %d", attn_topk_layer_k(&p, 16, 15));
            }
        }
}

/* ---- the policy on a hand-made cache ----------------------------------------- */

enum { P = 3000, NS = 5, S = P + NS, G = 4, MAXD = 40 };

typedef struct fixture {
    int d, elem;
    void *K, *V;        /* [S][d] stored */
    float q[G * MAXD];
    attn_kv_view kv;
} fixture;

static float stored(const fixture *f, const void *base, int64_t at)
{
    return f->elem == KV_F16 ? fp16_to_fp32(((const uint16_t *)base)[at]) : ((const float *)base)[at];
}

static void fixture_init(fixture *f, int d, int elem)
{
    f->d = d;
    f->elem = elem;
    const size_t es = elem == KV_F16 ? 2 : 4;
    f->K = malloc((size_t)S * d * es);
    f->V = malloc((size_t)S * d * es);
    /* clustered keys, so the top-k is well defined and ivf has structure */
    float cen[16][MAXD];
    for (int c = 0; c < 16; c++)
        for (int j = 0; j < d; j++) cen[c][j] = 2.0f * urand();
    for (int64_t i = 0; i < S; i++)
        for (int j = 0; j < d; j++) {
            float kk = cen[(i / 37) % 16][j] + 0.6f * urand(), vv = urand();
            if (elem == KV_F16) {
                ((uint16_t *)f->K)[i * d + j] = fp32_to_fp16(kk);
                ((uint16_t *)f->V)[i * d + j] = fp32_to_fp16(vv);
            } else {
                ((float *)f->K)[i * d + j] = kk;
                ((float *)f->V)[i * d + j] = vv;
            }
        }
    for (int h = 0; h < G; h++)
        for (int j = 0; j < d; j++) f->q[h * d + j] = 1.5f * cen[(h * 5 + 3) % 16][j] + 0.5f * urand();
    attn_kv_view kv = { S, d, elem, f->K, f->V, NULL, S, NULL, NULL, NULL, 0, 0 };
    f->kv = kv;
}

static void fixture_free(fixture *f)
{
    free(f->K);
    free(f->V);
}

/* exact score of position i for head h, in double */
static double exact_score(const fixture *f, int h, int64_t i)
{
    double a = 0;
    for (int j = 0; j < f->d; j++) a += (double)f->q[h * f->d + j] * stored(f, f->K, i * f->d + j);
    return a;
}

static const double *sort_scores;
static int cmp_desc(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    double sx = sort_scores[x], sy = sort_scores[y];
    if (sx != sy) return sx > sy ? -1 : 1;
    return (x > y) - (x < y);
}

/* The naive reference: per head, the k best prefix positions by exact
 * score (sel [G][k], *gap: smallest k-th/(k+1)-th score gap over heads),
 * softmax over them and the suffix, weighted values. */
static void naive_topk(const fixture *f, int k, int32_t *sel, double *gap, float *out)
{
    const int d = f->d;
    double *sc = malloc((size_t)S * sizeof *sc);
    int32_t *ord = malloc((size_t)P * sizeof *ord);
    *gap = INFINITY;
    for (int h = 0; h < G; h++) {
        for (int64_t i = 0; i < S; i++) sc[i] = exact_score(f, h, i) / sqrt((double)d);
        for (int i = 0; i < P; i++) ord[i] = i;
        sort_scores = sc;
        qsort(ord, P, sizeof *ord, cmp_desc);
        if (k < P && sc[ord[k - 1]] - sc[ord[k]] < *gap) *gap = sc[ord[k - 1]] - sc[ord[k]];
        memcpy(sel + h * k, ord, (size_t)k * sizeof *ord);
        double mx = -INFINITY, sum = 0, acc[MAXD] = { 0 };
        for (int r = 0; r < k; r++) mx = fmax(mx, sc[ord[r]]);
        for (int64_t i = P; i < S; i++) mx = fmax(mx, sc[i]);
        for (int r = 0; r < k + NS; r++) {
            const int64_t i = r < k ? ord[r] : P + (r - k);
            const double w = exp(sc[i] - mx);
            sum += w;
            for (int j = 0; j < d; j++) acc[j] += w * stored(f, f->V, i * d + j);
        }
        for (int j = 0; j < d; j++) out[h * d + j] = (float)(acc[j] / sum);
    }
    free(sc);
    free(ord);
}

static int set_equal(const int32_t *a, const int32_t *b, int k)
{
    int32_t *x = malloc((size_t)k * 4), *y = malloc((size_t)k * 4);
    memcpy(x, a, (size_t)k * 4);
    memcpy(y, b, (size_t)k * 4);
    sort_scores = NULL;
    for (int i = 0; i < k; i++) /* insertion sort: k is small */
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) { int32_t t = x[j]; x[j] = x[j - 1]; x[j - 1] = t; }
    for (int i = 0; i < k; i++)
        for (int j = i; j > 0 && y[j] < y[j - 1]; j--) { int32_t t = y[j]; y[j] = y[j - 1]; y[j - 1] = t; }
    int eq = memcmp(x, y, (size_t)k * 4) == 0;
    free(x);
    free(y);
    return eq;
}

typedef struct polrun {
    const attn_policy *pol;
    sparq_attn_params p;
    void *state;
    attn_scratch scr;
    float *sf;
    int32_t *si;
} polrun;

static int polrun_init(polrun *r, const fixture *f, const char *index, int k, int key_type, int nprobe)
{
    r->pol = attn_policy_find("topk");
    r->p = sparq_attn_default_params();
    r->p.policy = "topk";
    r->p.index = index;
    r->p.k = k;
    r->p.index_key_type = key_type;
    r->p.ivf_nprobe = nprobe;
    char err[256];
    if (!r->pol || r->pol->resolve(&r->p, f->d, err, sizeof err)) return -1;
    attn_shape shape = { 1, 1, G, f->d, S };
    if (r->pol->state_create(&r->p, &shape, &r->state)) return -1;
    r->pol->set_prefix(r->state, &r->p, P, NULL); /* the last NS positions are the suffix */
    size_t n = attn_pad16(r->pol->scratch_floats(&r->p, S, f->d, G));
    r->sf = aligned_alloc(64, n * 4);
    r->si = aligned_alloc(64, n * 4);
    attn_scratch s = { r->sf, n, r->si, NULL, 0 };
    r->scr = s;
    return 0;
}

static void polrun_free(polrun *r)
{
    r->pol->state_free(r->state);
    free(r->sf);
    free(r->si);
}

/* One step; returns counted elements, checks them against the formula. */
static int64_t polrun_step(polrun *r, const fixture *f, float *out, attn_trace *tr, int check_formula)
{
    attn_counts c = { 0, 0 };
    CHECK(r->pol->attend(r->state, &r->p, &(attn_step){ 0, 0, &f->kv, f->q, G, out, &r->scr, &c, tr }) == 0,
          "%s: attend failed", r->p.index);
    const int64_t want = r->pol->transfer_formula_state(r->state, &r->p, 0, S, f->d, G);
    if (check_formula)
        CHECK(c.read + c.written == want, "%s: counted %lld, formula %lld", r->p.index,
              (long long)(c.read + c.written), (long long)want);
    return c.read + c.written;
}

/* ivf: the keys a search of q probes, from the image (independent of the
 * policy's count): lists ranked by q . c_l + |q| bonus_l, the best nprobe
 * per query, their union. Returns the step's index bytes. */
static int64_t ivf_probe_bytes(const idx_index *ix, const float *q, int nprobe)
{
    const int d = ix->d, nl = ix->nlist;
    char *mark = calloc((size_t)nl, 1);
    double *sc = malloc((size_t)nl * sizeof *sc);
    int32_t *ord = malloc((size_t)nl * sizeof *ord);
    for (int h = 0; h < G; h++) {
        double qn = 0;
        for (int j = 0; j < d; j++) qn += (double)q[h * d + j] * q[h * d + j];
        for (int l = 0; l < nl; l++) {
            double a = 0;
            for (int j = 0; j < d; j++) /* centroids are blocked [nl/16][d][16] */
                a += (double)q[h * d + j] * ix->centroids[((size_t)(l / 16) * d + j) * 16 + l % 16];
            sc[l] = a + sqrt(qn) * ix->list_bonus[l];
            ord[l] = l;
        }
        sort_scores = sc;
        qsort(ord, (size_t)nl, sizeof *ord, cmp_desc);
        for (int r = 0; r < nprobe && r < nl; r++) mark[ord[r]] = 1;
    }
    int64_t keys = 0;
    for (int l = 0; l < nl; l++)
        if (mark[l]) keys += ix->list_n[l];
    free(mark);
    free(sc);
    free(ord);
    const int64_t row = (int64_t)d * (ix->key_type == IDX_I8 ? 1 : 2) + (ix->key_type == IDX_I8 ? 4 : 0) + 4;
    return (int64_t)nl * (4 * d + 4) + keys * row;
}

/* A source offering one image for (0, 0). */
typedef struct one_image { const char *kind; const void *img; size_t bytes; } one_image;
static const void *one_find(const void *user, int layer, int head, const char *kind, size_t *bytes)
{
    const one_image *o = user;
    if (layer || head || strcmp(kind, o->kind) != 0) return NULL;
    *bytes = o->bytes;
    return o->img;
}

static void test_policy(int d, int elem)
{
    fixture f;
    fixture_init(&f, d, elem);
    const int es = elem == KV_F16 ? 2 : 4;
    float out[G * MAXD], ref[G * MAXD], dense[G * MAXD], out2[G * MAXD];
    float *scratch = malloc((size_t)G * S * sizeof(float));
    attn_dense_group(&f.kv, f.q, G, dense, scratch);
    const int k = 24;
    /* f16 index keys of an f16 cache score exactly: only V rows are read */
    const int64_t gath16 = (elem == KV_F16 ? 1LL : 2LL) * G * k * d;
    int32_t sel[G * 24], ids[G * 24];
    double gap;
    naive_topk(&f, k, sel, &gap, ref);
    printf("d %d elem %d: smallest k-th / (k+1)-th score gap %.3g%s\n", d, elem, gap,
           gap > 1e-4 && elem == KV_F16 ? "" : " (selection compared only when > 1e-4 and f16)");

    /* exact: the naive reference's selection and output */
    polrun r;
    CHECK(polrun_init(&r, &f, "exact", k, elem == KV_F16 ? 0 : SPARQ_KEY_F16, 0) == 0, "init exact");
    int32_t trsel[S];
    attn_trace tr = { trsel, 0, NULL, 0, NULL };
    const int64_t counted = polrun_step(&r, &f, out, &tr, 1);
    CHECK(attn_topk_select(r.state, &r.p, 0, 0, &f.kv, f.q, G, ids, &r.scr) == k, "select k");
    if (gap > 1e-4 && elem == KV_F16) { /* f16 keys: the index scores what the cache holds */
        for (int h = 0; h < G; h++)
            CHECK(set_equal(ids + h * k, sel + h * k, k), "d %d: exact selection of head %d = brute force", d, h);
        double md = 0;
        for (int i = 0; i < G * d; i++) md = fmax(md, fabs(out[i] - ref[i]));
        CHECK(md < 2e-5, "d %d elem %d: exact top-k output vs naive: max diff %g", d, elem, md);
    }
    /* formula by hand: P*d f16 index elements (x2/es), g*2kd, suffix */
    CHECK(counted == (int64_t)P * d * 2 / es + gath16 + 2LL * NS * d + 2 * d,
          "exact count by hand: %lld", (long long)counted);
    /* trace: the heads' union plus the whole suffix, no duplicates */
    int dup = 0, has_suffix = 0;
    for (int64_t i = 0; i < tr.n_sel; i++) {
        has_suffix += trsel[i] >= P;
        if (i && trsel[i] <= trsel[i - 1] && trsel[i] < P) dup++;
    }
    CHECK(tr.n_sel <= S && has_suffix == NS && dup == 0, "trace: %lld positions", (long long)tr.n_sel);
    polrun_free(&r);

    /* topk_check: the exact index has recall 1 */
    CHECK(polrun_init(&r, &f, "exact", k, 0, 0) == 0, "init");
    r.p.topk_check = 1;
    polrun_step(&r, &f, out2, NULL, 1);
    sparq_attn_stats st;
    memset(&st, 0, sizeof st);
    r.pol->stats(r.state, &st);
    CHECK(st.recall_total == (int64_t)G * k && st.recall_hits == st.recall_total, "exact recall %lld/%lld",
          (long long)st.recall_hits, (long long)st.recall_total);
    polrun_free(&r);

    /* k >= P: dense, bit for bit, for every kind */
    const char *kinds[] = { "exact", "ivf", "sparq", "hnsw" };
    for (int i = 0; i < 4; i++) {
#ifndef SPARQ_HAVE_FAISS
        if (i == 3) continue;
#endif
        CHECK(polrun_init(&r, &f, kinds[i], P, 0, 0) == 0, "init %s", kinds[i]);
        const int64_t c = polrun_step(&r, &f, out2, NULL, 1);
        CHECK(memcmp(out2, dense, (size_t)G * d * sizeof(float)) == 0, "%s with k = P equals dense", kinds[i]);
        CHECK(c == 2LL * S * d + 2 * d, "%s with k = P counts as dense", kinds[i]);
        polrun_free(&r);
    }

    /* ivf, nprobe = nlist: the exact search over the same keys */
    float ex[G * MAXD];
    CHECK(polrun_init(&r, &f, "exact", k, 0, 0) == 0, "init");
    polrun_step(&r, &f, ex, NULL, 1);
    polrun_free(&r);
    CHECK(polrun_init(&r, &f, "ivf", k, 0, 100000) == 0, "init ivf");
    polrun_step(&r, &f, out2, NULL, 1);
    CHECK(memcmp(out2, ex, (size_t)G * d * sizeof(float)) == 0, "ivf nprobe = nlist equals exact");
    polrun_free(&r);

    /* ivf at default nprobe: counted = the probe union recounted here */
    CHECK(polrun_init(&r, &f, "ivf", k, 0, 0) == 0, "init ivf");
    const int64_t c_ivf = polrun_step(&r, &f, out2, NULL, 0);
    void *img = NULL;
    size_t bytes = 0;
    char err[256];
    CHECK(attn_topk_index_image(&r.p, "ivf", &f.kv, P, 1, &img, &bytes, err, sizeof err) == 0, "%s", err);
    idx_index *ix = NULL;
    CHECK(idx_deserialize(img, bytes, &ix, err, sizeof err) == 0, "%s", err);
    if (ix) {
        const int64_t want = ivf_probe_bytes(ix, f.q, ix->nprobe);
        CHECK(c_ivf == (want + es - 1) / es + gath16 + 2LL * NS * d + 2 * d,
              "ivf count %lld vs recount %lld", (long long)c_ivf, (long long)((want + es - 1) / es));
        idx_free(ix);
    }
    free(img);
    polrun_free(&r);

    /* int8 keys: the formula follows the key type */
    CHECK(polrun_init(&r, &f, "exact", k, SPARQ_KEY_I8, 0) == 0, "init i8");
    CHECK(polrun_step(&r, &f, out2, NULL, 1) ==
              ((int64_t)P * (d + 4) + es - 1) / es + 2LL * G * k * d + 2LL * NS * d + 2 * d,
          "i8 count");
    polrun_free(&r);

    /* sparq: SparQ's approximate scores, top k per head */
    CHECK(polrun_init(&r, &f, "sparq", k, 0, 0) == 0, "init sparq");
    CHECK(polrun_step(&r, &f, out2, NULL, 1) == (int64_t)P * r.p.r + 2LL * G * k * d + 2LL * NS * d + 2 * d,
          "sparq count: P*r + gathers + suffix");
    CHECK(attn_topk_select(r.state, &r.p, 0, 0, &f.kv, f.q, G, ids, &r.scr) == k, "sparq select");
    {
        const int rr = r.p.r;
        double absq[MAXD];
        int comp[MAXD];
        for (int j = 0; j < d; j++) {
            absq[j] = 0;
            for (int h = 0; h < G; h++) absq[j] += fabs(f.q[h * d + j]);
            comp[j] = j;
        }
        for (int a = 0; a < d; a++) /* the r largest |q| components */
            for (int b = a + 1; b < d; b++)
                if (absq[comp[b]] > absq[comp[a]]) { int t = comp[a]; comp[a] = comp[b]; comp[b] = t; }
        double *sc = malloc((size_t)P * sizeof *sc);
        int32_t *ord = malloc((size_t)P * sizeof *ord);
        for (int h = 0; h < G; h++) {
            for (int64_t i = 0; i < P; i++) {
                double a = 0;
                for (int c = 0; c < rr; c++) a += (double)f.q[h * d + comp[c]] * stored(&f, f.K, i * d + comp[c]);
                sc[i] = a;
                ord[i] = (int32_t)i;
            }
            sort_scores = sc;
            qsort(ord, P, sizeof *ord, cmp_desc);
            if (sc[ord[k - 1]] - sc[ord[k]] > 1e-4)
                CHECK(set_equal(ids + h * k, ord, k), "sparq selection of head %d = SparQ's approximate top-k", h);
        }
        free(sc);
        free(ord);
    }
    polrun_free(&r);

    /* an index source: a matching image is used, a mismatching one ignored */
    fixture neg = f; /* keys negated: its top-k are the true bottom-k */
    const size_t es2 = (size_t)es;
    neg.K = malloc((size_t)S * d * es2);
    for (int64_t i = 0; i < (int64_t)S * d; i++) {
        if (elem == KV_F16) ((uint16_t *)neg.K)[i] = ((uint16_t *)f.K)[i] ^ 0x8000u;
        else ((float *)neg.K)[i] = -((float *)f.K)[i];
    }
    neg.kv.K = neg.K;
    CHECK(polrun_init(&r, &f, "exact", k, 0, 0) == 0, "init");
    CHECK(attn_topk_index_image(&r.p, "exact", &neg.kv, P, 1, &img, &bytes, err, sizeof err) == 0, "%s", err);
    one_image oi = { "exact", img, bytes };
    attn_index_source src = { one_find, &oi };
    r.pol->set_prefix(r.state, &r.p, P, &src);
    CHECK(attn_topk_select(r.state, &r.p, 0, 0, &f.kv, f.q, G, ids, &r.scr) == k, "select");
    int worst = 1;
    for (int h = 0; h < G; h++) /* every id chosen by the negated index scores below the true k-th */
        for (int i = 0; i < k; i++) worst &= exact_score(&f, h, ids[h * k + i]) < exact_score(&f, h, sel[h * k + k - 1]);
    CHECK(worst, "the source's image was used");
    free(img);
    /* an image of P - 1 keys does not fit the prefix: rebuilt from the cache */
    CHECK(attn_topk_index_image(&r.p, "exact", &neg.kv, P - 1, 1, &img, &bytes, err, sizeof err) == 0, "%s", err);
    oi.img = img;
    oi.bytes = bytes;
    r.pol->set_prefix(r.state, &r.p, P, &src);
    CHECK(attn_topk_select(r.state, &r.p, 0, 0, &f.kv, f.q, G, ids, &r.scr) == k, "select");
    if (gap > 1e-4 && elem == KV_F16)
        for (int h = 0; h < G; h++) CHECK(set_equal(ids + h * k, sel + h * k, k), "mismatching image ignored");
    free(img);
    /* a prefix boundary below S - 1: positions after it are suffix */
    r.pol->set_prefix(r.state, &r.p, P - 100, NULL);
    CHECK(polrun_step(&r, &f, out2, NULL, 1) ==
              (int64_t)(P - 100) * d * 2 / es + gath16 + 2LL * (NS + 100) * d + 2 * d,
          "marked prefix P - 100");
    polrun_free(&r);
    free(neg.K);

#ifdef SPARQ_HAVE_FAISS
    CHECK(polrun_init(&r, &f, "hnsw", k, 0, 0) == 0, "init hnsw");
    polrun_step(&r, &f, out2, NULL, 1);
    polrun_free(&r);
#endif
    free(scratch);
    fixture_free(&f);
}

/* ---- an index that cannot be had is an error, never a silent dense step ------ */

/* One step of topk/kind on f with the source src (may be NULL); returns
 * attend's result and its message in err. */
static int step_with(const fixture *f, const char *kind, const attn_index_source *src, char *err,
                     size_t err_size)
{
    polrun r;
    if (polrun_init(&r, f, kind, 24, 0, 0)) return 99;
    r.pol->set_prefix(r.state, &r.p, P, src);
    r.scr.err = err;
    r.scr.err_size = err_size;
    err[0] = 0;
    float out[G * MAXD];
    attn_counts c = { 0, 0 };
    int rc = r.pol->attend(r.state, &r.p, &(attn_step){ 0, 0, &f->kv, f->q, G, out, &r.scr, &c, NULL });
    /* the next step of the same head fails too, with the same reason */
    char err2[512] = "";
    r.scr.err = err2;
    r.scr.err_size = sizeof err2;
    int rc2 = r.pol->attend(r.state, &r.p, &(attn_step){ 0, 0, &f->kv, f->q, G, out, &r.scr, &c, NULL });
    CHECK(rc2 == rc && strcmp(err, err2) == 0, "%s: second step: %d '%s'", kind, rc2, err2);
    int32_t ids[G * 24];
    CHECK(attn_topk_select(r.state, &r.p, 0, 0, &f->kv, f->q, G, ids, &r.scr) == (rc ? -1 : 24),
          "%s: select agrees with attend", kind);
    polrun_free(&r);
    return rc;
}

static void test_index_failures(void)
{
    fixture f;
    fixture_init(&f, 32, KV_F32);
    char err[512];
    /* a corrupt stored image: the reserved header bytes must be zero */
    polrun r;
    CHECK(polrun_init(&r, &f, "exact", 24, 0, 0) == 0, "init");
    void *img = NULL;
    size_t bytes = 0;
    CHECK(attn_topk_index_image(&r.p, "exact", &f.kv, P, 1, &img, &bytes, err, sizeof err) == 0, "%s", err);
    polrun_free(&r);
    one_image oi = { "exact", img, bytes };
    attn_index_source src = { one_find, &oi };
    CHECK(img && step_with(&f, "exact", &src, err, sizeof err) == 0, "the intact image works: %s", err);
    if (img) ((uint8_t *)img)[100] = 1;
    CHECK(step_with(&f, "exact", &src, err, sizeof err) == -1, "corrupt exact image: attend fails");
    CHECK(strstr(err, "layer 0 head 0") && strstr(err, "cannot load the stored exact index") &&
              strstr(err, "reserved header byte 100"),
          "corrupt image message: '%s'", err);
    free(img);

    /* a corrupt sparq image (K^T): bad magic */
    uint8_t *bad = aligned_alloc(64, 4096);
    memset(bad, 0, 4096);
    memcpy(bad, "SPQKTIX0", 8);
    one_image ob = { "sparq", bad, 4096 };
    attn_index_source sb = { one_find, &ob };
    CHECK(step_with(&f, "sparq", &sb, err, sizeof err) == -1 && strstr(err, "sparq index image: bad magic"),
          "corrupt sparq image: '%s'", err);
    free(bad);

    /* a prefix whose index cannot be built: a key that is not finite */
    ((float *)f.K)[(int64_t)(P / 2) * f.d + 3] = NAN;
    f.kv.K = f.K;
    CHECK(step_with(&f, "exact", NULL, err, sizeof err) == -1, "NaN key: attend fails");
    CHECK(strstr(err, "cannot build the exact index of 3000 keys") && strstr(err, "is not finite"),
          "NaN key message: '%s'", err);
    CHECK(step_with(&f, "ivf", NULL, err, sizeof err) == -1 && strstr(err, "not finite"), "ivf NaN key: '%s'", err);
    fixture_free(&f);
}

/* The public one-step API: topk with k >= S - 1 is dense. */
static void test_attn_run(void)
{
    enum { SS = 300, D = 16, GG = 2 };
    float q[GG * D], K[SS * D], V[SS * D], o1[GG * D], o2[GG * D];
    for (int i = 0; i < SS * D; i++) K[i] = urand(), V[i] = urand();
    for (int i = 0; i < GG * D; i++) q[i] = urand();
    sparq_attn_params p = sparq_attn_default_params();
    char err[256];
    int64_t e1 = 0, e2 = 0;
    p.policy = "dense";
    sparq_attn_io io1 = { .kv_type = SPARQ_KV_F16, .S = SS, .d = D, .g = GG, .q = q, .K = K, .V = V,
                          .out = o1 };
    sparq_attn_io io2 = io1;
    io2.out = o2;
    CHECK(sparq_attn_run(&p, &io1, err, sizeof err) == 0, "%s", err);
    e1 = io1.elements;
    p.policy = "topk";
    p.k = SS;
    CHECK(sparq_attn_run(&p, &io2, err, sizeof err) == 0, "%s", err);
    e2 = io2.elements;
    CHECK(memcmp(o1, o2, sizeof o1) == 0 && e1 == e2, "topk k >= S through sparq_attn_run = dense");
    p.k = 20;
    CHECK(sparq_attn_run(&p, &io2, err, sizeof err) == 0, "%s", err);
    e2 = io2.elements;
    CHECK(e2 == sparq_attn_formula(&p, SS, D, GG, err, sizeof err), "sparq_attn_run count = formula");
    p.index = "nope";
    CHECK(sparq_attn_formula(&p, SS, D, GG, err, sizeof err) == -1 && strstr(err, "unknown index"),
          "bad index kind: %s", err);
}

/* ---- in the model's decode path ---------------------------------------------- */

static sparq_model *model;

static int greedy(const sparq_attn_params *ap, const int32_t *prompt, int n_prompt, int mark_at,
                  int n, int32_t *out, sparq_attn_stats *st)
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
    int ok = logits != NULL;
    if (mark_at > 0) { /* prefix, then the rest of the prompt as suffix */
        ok = ok && sparq_eval(c, prompt, mark_at, NULL) == 0;
        sparq_context_mark_prefix(c);
        ok = ok && sparq_eval(c, prompt + mark_at, n_prompt - mark_at, logits) == 0;
    } else {
        ok = ok && sparq_eval(c, prompt, n_prompt, logits) == 0;
    }
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

static void test_model(void)
{
    char path[1024], err[256];
    if (path_find("stories260K.gguf", path, sizeof path)) {
        test_skip("stories260K.gguf not found");
        return;
    }
    CHECK(sparq_model_load(path, &model, err, sizeof err) == 0, "%s", err);
    if (!model) return;
    int32_t prompt[512];
    int n_prompt = sparq_tokenize(model, "Once upon a time, there was a little girl named Lily.", -1, 1, prompt, 512);
    enum { N_GEN = 80 };
    int32_t dense[N_GEN], other[N_GEN];
    sparq_attn_params dp = sparq_attn_default_params();
    CHECK(greedy(&dp, prompt, n_prompt, 0, N_GEN, dense, NULL) == 0, "dense");
    const char *kinds[] = { "exact", "ivf", "sparq", "hnsw" };
    for (int i = 0; i < 4; i++) {
#ifndef SPARQ_HAVE_FAISS
        if (i == 3) continue;
#endif
        sparq_attn_params p = sparq_attn_default_params();
        p.policy = "topk";
        p.index = kinds[i];
        p.k = 512;
        CHECK(greedy(&p, prompt, n_prompt, 0, N_GEN, other, NULL) == 0, "topk %s", kinds[i]);
        CHECK(memcmp(dense, other, sizeof dense) == 0, "topk/%s with k >= prefix: greedy tokens = dense", kinds[i]);
        p.topk_schedule = SPARQ_TOPK_LINEAR;
        p.k = 400; /* every layer's budget >= the prefix */
        CHECK(greedy(&p, prompt, n_prompt, 0, N_GEN, other, NULL) == 0, "topk %s", kinds[i]);
        CHECK(memcmp(dense, other, sizeof dense) == 0, "topk/%s linear, k_l >= prefix = dense", kinds[i]);
    }

    /* a 380-token prompt, k = 16: counted transfers = the formula */
    size_t nb;
    int32_t *story = path_find("golden/llamacpp/stories260K/boy_cat_story.tokens.i32", path, sizeof path) == 0
                         ? test_read_file(path, &nb) : NULL;
    if (!story) {
        test_skip("boy_cat_story tokens missing");
        return;
    }
    int n = 0, n_story = (int)(nb / 4);
    while (n < 380) prompt[n] = story[n % n_story], n++;
    free(story);
    struct { const char *index; int nprobe, sched, mark, check; } cases[] = {
        { "exact", 0, 0, 0, 1 }, { "sparq", 0, 0, 0, 0 }, { "ivf", 100000, 0, 0, 0 },
        { "exact", 0, 1, 0, 0 }, { "exact", 0, 0, 300, 0 }, { "hnsw", 0, 0, 0, 0 },
    };
    int32_t gen[12];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
#ifndef SPARQ_HAVE_FAISS
        if (strcmp(cases[i].index, "hnsw") == 0) continue;
#endif
        sparq_attn_params p = sparq_attn_default_params();
        p.policy = "topk";
        p.index = cases[i].index;
        p.k = 16;
        p.ivf_nprobe = cases[i].nprobe;
        p.topk_schedule = cases[i].sched;
        p.topk_check = cases[i].check;
        sparq_attn_stats st;
        CHECK(greedy(&p, prompt, 380, cases[i].mark, 12, gen, &st) == 0, "decode %s", cases[i].index);
        CHECK(st.elements == st.formula_elements && st.elements > 0, "%s (sched %d, mark %d): counted %lld, formula %lld",
              cases[i].index, cases[i].sched, cases[i].mark, (long long)st.elements, (long long)st.formula_elements);
        if (strcmp(cases[i].index, "hnsw") != 0) /* hnsw's graph walk costs more than d = 8 rows */
            CHECK(st.elements < st.dense_elements, "%s reads less than dense", cases[i].index);
        if (cases[i].check)
            CHECK(st.recall_total > 0 && st.recall_hits == st.recall_total, "exact recall in the model: %lld/%lld",
                  (long long)st.recall_hits, (long long)st.recall_total);
        /* only Faiss's graph walk is estimated; every other read is counted */
        if (strcmp(cases[i].index, "hnsw") == 0)
            CHECK(st.nominal_elements > 0 && st.nominal_elements < st.elements, "hnsw: %lld of %lld elements nominal",
                  (long long)st.nominal_elements, (long long)st.elements);
        else
            CHECK(st.nominal_elements == 0, "%s: %lld elements nominal", cases[i].index, (long long)st.nominal_elements);
    }
    sparq_model_free(model);
}

/* `sparq run --json` says whether the transfer it reports was counted:
 * false only where an hnsw search's reads are estimated. */
static void test_run_nominal(void)
{
    const char *b = getenv("SPARQ_BUILD");
    char bin[1024], gguf[1024], cmd[4096], dir[] = "/tmp/test_topk_run_XXXXXX";
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (path_find("stories260K.gguf", gguf, sizeof gguf)) {
        test_skip("stories260K.gguf not found: run --json transfer_counted not checked");
        return;
    }
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return;
    }
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    const char *kinds[] = { "exact", "hnsw" };
    for (int i = 0; i < 2; i++) {
#ifndef SPARQ_HAVE_FAISS
        if (i == 1) continue;
#endif
        snprintf(cmd, sizeof cmd,
                 "%s run -m %s -p 'Once upon a time, there was a little girl named Lily.' -n 4 --temp 0 -t 1 "
                 "--attn topk --index %s --topk-k 4 --json >%s/out 2>%s/err",
                 bin, gguf, kinds[i], dir, dir);
        CHECK(system(cmd) == 0, "run --attn topk --index %s", kinds[i]);
        char op[256];
        snprintf(op, sizeof op, "%s/out", dir);
        size_t n = 0;
        char *js = test_read_file(op, &n);
        const char *want = i == 0 ? "\"transfer_counted\":true" : "\"transfer_counted\":false";
        CHECK(js && strstr(js, want) && strstr(js, "\"nominal_elements\":"), "%s: want %s in %s", kinds[i], want,
              js ? js : "(none)");
        free(js);
        snprintf(op, sizeof op, "%s/err", dir);
        js = test_read_file(op, &n);
        CHECK(js && (strstr(js, "are nominal") != NULL) == (i == 1), "%s: stderr note: %s", kinds[i], js ? js : "(none)");
        free(js);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

/* ---- the benchmark command, small: every needle found ------------------------- */

static void test_bench_needles(void)
{
    const char *b = getenv("SPARQ_BUILD");
    char bin[1024], cmd[2048];
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        test_skip("sparq binary not built: bench-topk needle test skipped");
        return;
    }
    char out[256];
    snprintf(out, sizeof out, "/tmp/test_topk_bench_%d.json", (int)getpid());
    /* 64k positions (16k under sanitizers), 8 needles in 4 (layer, head) pairs */
    snprintf(cmd, sizeof cmd,
             "%s bench-topk --shape tiny --size %s --index exact,ivf --needles 8 --tokens 2 --threads 2 "
             "--file /tmp/test_topk_bench_%d.kv --json > %s 2>/dev/null",
             bin, test_quick() ? "16k" : "64k", (int)getpid(), out);
    int rc = system(cmd);
    CHECK(rc == 0, "bench-topk exit %d", rc);
    size_t n;
    char *js = test_read_file(out, &n);
    CHECK(js != NULL, "bench output");
    if (js) {
        const char *kinds[] = { "\"exact\"", "\"ivf\"" };
        for (int i = 0; i < 2; i++) {
            const char *row = strstr(js, kinds[i]);
            CHECK(row != NULL, "row %s", kinds[i]);
            if (!row) continue;
            const char *nf = strstr(row, "\"needles_found\":"), *nt = strstr(row, "\"needles_total\":");
            const char *rk = strstr(row, "\"recall_at_k\":");
            CHECK(nf && nt && rk, "fields");
            if (!nf || !nt || !rk) continue;
            int found = atoi(nf + 16), total = atoi(nt + 16);
            double recall = atof(rk + 14);
            CHECK(total == 8 && found == total, "%s: needles %d/%d", kinds[i], found, total);
            CHECK(i == 0 ? recall == 1.0 : recall >= 0.9, "%s: recall@k %.4f", kinds[i], recall);
            CHECK(strstr(row, "\"elements_nominal\":false") != NULL, "%s: elements counted, not nominal", kinds[i]);
        }
    }
    free(js);
    unlink(out);
}

/* `bench-topk --reuse` with a kept file of another shape, size or room must
 * refuse with one line (it wrote out of bounds: the cache was sized from
 * --shape, the rows came from the file). */
static void test_bench_reuse_mismatch(void)
{
    const char *b = getenv("SPARQ_BUILD");
    char bin[1024], cmd[4096], dir[] = "/tmp/test_topk_reuse_XXXXXX";
    snprintf(bin, sizeof bin, "%s/sparq", b ? b : "build");
    if (access(bin, X_OK) != 0) {
        CHECK(0, "%s not built", bin);
        return;
    }
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp");
        return;
    }
    const char *common = "bench-topk --index exact --needles 0 --tokens 1 --warmup 0 --threads 2 --recall-heads 1";
    snprintf(cmd, sizeof cmd, "%s %s --shape tiny --size 2k --file %s/f --keep >/dev/null 2>%s/err0", bin, common,
             dir, dir);
    CHECK(system(cmd) == 0, "bench-topk --keep");
    struct { const char *args, *want; } cases[] = {
        { "--shape smollm2-135m --size 2k", "made by another model" },
        { "--shape tiny --size 1k", "holds 2048 f16 positions" },
        { "--shape tiny --size 2k --tokens 64", "needs 2048 f16 positions of room 2112" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s %s %s --reuse --file %s/f >/dev/null 2>%s/err", bin, common, cases[i].args,
                 dir, dir);
        const int rc = system(cmd);
        char path[256];
        snprintf(path, sizeof path, "%s/err", dir);
        size_t n = 0;
        char *e = test_read_file(path, &n);
        const char *line = e ? strstr(e, "error: ") : NULL;
        CHECK(rc != 0 && line && strstr(line, cases[i].want) && strchr(line, '\n') == line + strlen(line) - 1,
              "--reuse %s: exit %d, '%s'", cases[i].args, rc, line ? line : "(no error line)");
        free(e);
    }
#ifdef SPARQ_HAVE_FAISS
    /* hnsw's index read is nominal, and the output says so */
    snprintf(cmd, sizeof cmd, "%s %s --shape tiny --size 2k --index hnsw --file %s/h --json >%s/out 2>/dev/null", bin,
             common, dir, dir);
    CHECK(system(cmd) == 0, "bench-topk hnsw");
    char op[256];
    snprintf(op, sizeof op, "%s/out", dir);
    size_t on = 0;
    char *js = test_read_file(op, &on);
    CHECK(js && strstr(js, "\"index\":\"hnsw\"") && strstr(js, "\"elements_nominal\":true"), "hnsw row nominal: %s",
          js ? js : "(none)");
    free(js);
    snprintf(cmd, sizeof cmd, "%s %s --shape tiny --size 2k --index hnsw --file %s/h >%s/out 2>/dev/null", bin, common,
             dir, dir);
    CHECK(system(cmd) == 0, "bench-topk hnsw (table)");
    js = test_read_file(op, &on);
    CHECK(js && strstr(js, "hnsw: \"of dense\" uses a nominal index read"), "table says nominal: %s", js ? js : "(none)");
    free(js);
#endif
    /* the same shape still decodes */
    snprintf(cmd, sizeof cmd, "%s %s --shape tiny --size 2k --reuse --file %s/f >/dev/null 2>/dev/null", bin, common, dir);
    CHECK(system(cmd) == 0, "--reuse with the same shape");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

int main(void)
{
    test_schedule();
    test_policy(32, KV_F16);
    test_policy(24, KV_F32);
    test_policy(MAXD - 3, KV_F16); /* odd head size */
    test_attn_run();
    test_index_failures();
    test_model();
    test_bench_needles();
    test_bench_reuse_mismatch();
    test_run_nominal();
    return test_summary("test_topk");
}
