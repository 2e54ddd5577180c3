/* test_sparq_adaptive.c - SparQ's per-head adaptive k (docs/ALGORITHMS.md
 * "Per-head adaptive k") against references written here:
 *
 * - the entropy of attn_kt_exp's scores against a double softmax of the
 *   same logits, and exactly 0 / log n for a one-hot / uniform row;
 * - the allotment against an exact solver (the proportionality factor from
 *   the breakpoints of the clamped sum, not by bisection) with the same
 *   rounding rule: sums to the budget, stays in [lo, hi], equal entropies
 *   give every head the fixed k, a one-hot head gets less than a uniform
 *   one, bad arguments refused;
 * - whole steps (sparq_attn_run, f32 and f16) against a naive adaptive
 *   SparQ in double: per-head selections, union read once, alpha, output,
 *   the measured transfer and its bound;
 * - k >= S through the selecting path (select_always), adaptive or not,
 *   equal to dense attention bit for bit with alpha exactly 1, a uniform
 *   head's alpha showing the larger k it was given, and on the trained test
 *   model (f32, f16 and q8_0 caches) the same logits, with a small k as the
 *   control that the comparison can fail;
 * - bad option values: one-line errors from the library and attn_opts.
 */
#include "test.h"
#include "attn/attn.h"
#include "attn/attn_adaptive.h"
#include "attn/attn_params.h"
#include "tensor/quant.h"
#include "sparq.h"
#include "sparq_attn.h"

static uint64_t rs = 0x2545f4914f6cdd1dull;
static double unif01(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) * (1.0 / 9007199254740992.0);
}
static float normal(void)
{
    const double u = unif01() + 1e-12, v = unif01();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* ---- reference allotment ------------------------------------------------------------- */

static double clamp_d(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

static double ref_sum(const double *H, int g, double lam, double lo, double hi)
{
    double s = 0;
    for (int h = 0; h < g; h++) s += clamp_d(lam * H[h], lo, hi);
    return s;
}

/* The same contract as attn_adaptive_allot, solved exactly: the clamped sum
 * is linear between consecutive breakpoints lo/H_h, hi/H_h. */
static void ref_allot(const double *H, int g, int64_t total, int64_t lo, int64_t hi, int64_t *k)
{
    double x[64], bp[128];
    int n0 = 0, nb = 0;
    for (int h = 0; h < g; h++) {
        if (H[h] == 0) n0++;
        else {
            bp[nb++] = (double)lo / H[h];
            bp[nb++] = (double)hi / H[h];
        }
    }
    const double T = (double)total;
    if (n0 * (double)lo + (g - n0) * (double)hi <= T) {
        for (int h = 0; h < g; h++) x[h] = H[h] > 0 ? (double)hi : (T - (g - n0) * (double)hi) / n0;
    } else {
        for (int i = 1; i < nb; i++) /* insertion sort */
            for (int j = i; j > 0 && bp[j - 1] > bp[j]; j--) {
                const double t = bp[j]; bp[j] = bp[j - 1]; bp[j - 1] = t;
            }
        double a = 0, fa = ref_sum(H, g, 0, (double)lo, (double)hi), lam = 0;
        for (int i = 0; i < nb; i++) {
            const double fb = ref_sum(H, g, bp[i], (double)lo, (double)hi);
            if (fb >= T) {
                lam = fb > fa ? a + (T - fa) * (bp[i] - a) / (fb - fa) : bp[i];
                break;
            }
            a = bp[i];
            fa = fb;
        }
        for (int h = 0; h < g; h++) x[h] = clamp_d(lam * H[h], (double)lo, (double)hi);
    }
    int64_t sum = 0;
    double fr[64];
    for (int h = 0; h < g; h++) {
        k[h] = (int64_t)floor(x[h]);
        fr[h] = x[h] - (double)k[h];
        sum += k[h];
    }
    /* heads by fractional part, largest first, lower head first on ties */
    int ord[64];
    for (int h = 0; h < g; h++) ord[h] = h;
    for (int i = 1; i < g; i++)
        for (int j = i; j > 0 && fr[ord[j]] > fr[ord[j - 1]]; j--) {
            const int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
        }
    for (int i = 0; sum < total && i < g; i++)
        if (k[ord[i]] < hi) k[ord[i]]++, sum++;
}

static void test_allot(void)
{
    int64_t k[64], kr[64];
    double H[64], w[64];
    int bad_sum = 0, bad_ref = 0, n = 0;
    for (int it = 0; it < 4000; it++) {
        const int g = 1 + (int)(unif01() * 12);
        const int64_t hi = 2 + (int64_t)(unif01() * 3000);
        const int64_t lo = 1 + (int64_t)(unif01() * (double)(hi - 1));
        const int64_t total = g * lo + (int64_t)(unif01() * (double)(g * (hi - lo) + 1));
        for (int h = 0; h < g; h++) H[h] = unif01() < 0.15 ? 0 : 8 * unif01();
        if (attn_adaptive_allot(H, g, total, lo, hi, k, w)) {
            CHECK(0, "allot refused g=%d total=%lld lo=%lld hi=%lld", g, (long long)total, (long long)lo,
                  (long long)hi);
            continue;
        }
        ref_allot(H, g, total, lo, hi, kr);
        int64_t s = 0;
        int in = 1, same = 1;
        for (int h = 0; h < g; h++) {
            s += k[h];
            in &= k[h] >= lo && k[h] <= hi;
            same &= k[h] == kr[h];
        }
        bad_sum += s != total || !in;
        bad_ref += !same;
        n++;
    }
    CHECK(bad_sum == 0, "%d of %d allotments miss the budget or the bounds", bad_sum, n);
    CHECK(bad_ref == 0, "%d of %d allotments differ from the exact reference", bad_ref, n);

    /* proportional where no bound binds: 3 heads, entropies 1:2:3, 600 */
    const double h3[] = { 1, 2, 3 };
    CHECK(attn_adaptive_allot(h3, 3, 600, 1, 1000, k, w) == 0 && k[0] == 100 && k[1] == 200 && k[2] == 300,
          "1:2:3 of 600 -> %lld %lld %lld", (long long)k[0], (long long)k[1], (long long)k[2]);
    /* a bound binds: the rest is shared in proportion (lo 150: 150, 180, 270) */
    CHECK(attn_adaptive_allot(h3, 3, 600, 150, 1000, k, w) == 0 && k[0] == 150 && k[1] == 180 && k[2] == 270,
          "1:2:3 of 600, lo 150 -> %lld %lld %lld", (long long)k[0], (long long)k[1], (long long)k[2]);

    /* equal entropies (zero included): every head the fixed k */
    for (int g = 1; g <= 8; g++)
        for (int kk = 1; kk <= 300; kk += 37) {
            const double vals[] = { 0, 1e-9, 0.5, 5.3, 7.6 };
            for (int v = 0; v < 5; v++) {
                for (int h = 0; h < g; h++) H[h] = vals[v];
                int ok = attn_adaptive_allot(H, g, (int64_t)g * kk, 1, 400, k, w) == 0;
                for (int h = 0; h < g; h++) ok &= k[h] == kk;
                CHECK(ok, "g=%d equal entropies %g: k=%d not given to every head", g, vals[v], kk);
            }
        }

    /* a one-hot head (H = 0) against a uniform one (H = log S) */
    const int64_t S = 2000;
    const double oh[] = { 0, log((double)S) }, oh4[] = { log((double)S), 0, 3.0, log((double)S) };
    CHECK(attn_adaptive_allot(oh, 2, 2 * 128, 33, S, k, w) == 0 && k[0] == 33 && k[1] == 2 * 128 - 33,
          "one-hot vs uniform: %lld %lld", (long long)k[0], (long long)k[1]);
    CHECK(attn_adaptive_allot(oh4, 4, 4 * 64, 17, S, k, w) == 0 && k[1] == 17 && k[1] < k[2] && k[2] < k[0] &&
              k[0] == k[3] && k[0] + k[1] + k[2] + k[3] == 256,
          "4 heads: %lld %lld %lld %lld", (long long)k[0], (long long)k[1], (long long)k[2], (long long)k[3]);
    /* zero-entropy heads take what the others cannot (all others at hi) */
    const double z2[] = { 0, 1 };
    CHECK(attn_adaptive_allot(z2, 2, 150, 1, 100, k, w) == 0 && k[0] == 50 && k[1] == 100,
          "capped: %lld %lld", (long long)k[0], (long long)k[1]);

    /* refused */
    const double nan2[] = { NAN, 1 }, neg2[] = { -1, 1 };
    CHECK(attn_adaptive_allot(h3, 3, 2, 1, 10, k, w) == -1, "total below g*lo accepted");
    CHECK(attn_adaptive_allot(h3, 3, 31, 1, 10, k, w) == -1, "total above g*hi accepted");
    CHECK(attn_adaptive_allot(h3, 3, 6, 0, 10, k, w) == -1, "lo 0 accepted");
    CHECK(attn_adaptive_allot(h3, 0, 6, 1, 10, k, w) == -1, "g 0 accepted");
    CHECK(attn_adaptive_allot(nan2, 2, 6, 1, 10, k, w) == -1, "NaN entropy accepted");
    CHECK(attn_adaptive_allot(neg2, 2, 6, 1, 10, k, w) == -1, "negative entropy accepted");
}

/* ---- entropy ---------------------------------------------------------------------- */

static void test_entropy(void)
{
    /* attn_kt_exp's blocks of a real K^T pass against a double softmax */
    const int64_t Ss[] = { 1, 7, 255, 256, 257, 1000, 3001 };
    const int g = 3, r = 5;
    for (size_t a = 0; a < sizeof Ss / sizeof Ss[0]; a++) {
        const int64_t S = Ss[a], nb = (S + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
        float *KT = malloc((size_t)r * S * sizeof *KT), *e = malloc((size_t)g * S * sizeof *e),
              *sc = malloc((size_t)g * nb * sizeof *sc), qs[3 * 5];
        double *lg = malloc((size_t)S * sizeof *lg);
        int32_t comp[5] = { 0, 1, 2, 3, 4 };
        for (int64_t i = 0; i < r * S; i++) KT[i] = normal();
        for (int i = 0; i < g * r; i++) qs[i] = normal() * (float)(1 + 3 * a % 4); /* sharper and flatter */
        attn_kv_view kv = { S, r, KV_F32, NULL, NULL, KT, S, NULL, NULL, NULL, 0, 0 };
        attn_kt_exp_ref(&kv, qs, comp, r, g, S, e, sc, NULL);
        for (int h = 0; h < g; h++) {
            double mx = -INFINITY, z = 0, want = 0;
            for (int64_t i = 0; i < S; i++) {
                double x = 0;
                for (int c = 0; c < r; c++) x += (double)qs[h * r + c] * KT[c * S + i];
                lg[i] = x;
                mx = x > mx ? x : mx;
            }
            for (int64_t i = 0; i < S; i++) z += exp(lg[i] - mx);
            for (int64_t i = 0; i < S; i++) {
                const double p = exp(lg[i] - mx) / z;
                if (p > 0) want -= p * log(p);
            }
            const double got = attn_scores_entropy(e + h * S, sc + h * nb, S);
            CHECK(fabs(got - want) <= 1e-5 * (1 + want), "S=%lld head %d: entropy %.9g, want %.9g", (long long)S,
                  h, got, want);
        }
        free(KT); free(e); free(sc); free(lg);
    }
    /* one-hot: 0; uniform over n: log n */
    const int64_t n = 700, nb = (n + ATTN_EXP_BLOCK - 1) / ATTN_EXP_BLOCK;
    float *e = calloc((size_t)n, sizeof *e), sc[3];
    e[413] = 1;
    for (int b = 0; b < nb; b++) sc[b] = b == 413 / ATTN_EXP_BLOCK ? 1.0f : 0.0f;
    CHECK(attn_scores_entropy(e, sc, n) == 0, "one-hot entropy %g", attn_scores_entropy(e, sc, n));
    for (int64_t i = 0; i < n; i++) e[i] = 1;
    for (int b = 0; b < nb; b++) sc[b] = 1.0f / (float)n;
    CHECK_NEAR(attn_scores_entropy(e, sc, n), log((double)n), 1e-5);
    free(e);
}

/* ---- whole steps against a naive adaptive SparQ -------------------------------------- */

typedef struct naive_out {
    double y[8 * 96], alpha[8];
    char *sel;      /* [S] union */
    int64_t kh[8];
    double margin;  /* smallest relative gap at a ranking boundary */
    int fragile;    /* the allotment moves under a 1e-5 change of the entropies */
} naive_out;

static double rel_gap(double a, double b) { return fabs(a - b) / (fabs(a) + fabs(b) + 1e-30); }

/* Sorts idx[0..n) by x descending (ties: lower index first). */
static void order_desc(const double *x, int64_t n, int32_t *idx)
{
    for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)i;
    for (int64_t i = 1; i < n; i++) { /* insertion sort: small cases only */
        const int32_t v = idx[i];
        int64_t j = i;
        for (; j > 0 && (x[idx[j - 1]] < x[v] || (x[idx[j - 1]] == x[v] && idx[j - 1] > v)); j--) idx[j] = idx[j - 1];
        idx[j] = v;
    }
}

static void naive_adaptive(const float *q, const float *K, const float *V, int64_t S, int d, int g, int r, int k,
                           int l, int k_min, naive_out *o)
{
    double absq[96] = { 0 }, *P = malloc((size_t)g * S * sizeof *P), H[8], Hp[8];
    int32_t *ord = malloc((size_t)(S > d ? S : d) * sizeof *ord), i1[96];
    char *hs = malloc((size_t)S);
    o->margin = 1;
    for (int h = 0; h < g; h++)
        for (int j = 0; j < d; j++) absq[j] += fabs(q[h * d + j]);
    order_desc(absq, d, ord);
    if (r < d) o->margin = rel_gap(absq[ord[r - 1]], absq[ord[r]]);
    for (int c = 0; c < r; c++) i1[c] = ord[c];
    for (int h = 0; h < g; h++) {
        double l1 = 0, l1s = 0, mx = -INFINITY, z = 0;
        for (int j = 0; j < d; j++) l1 += fabs(q[h * d + j]);
        for (int c = 0; c < r; c++) l1s += fabs(q[h * d + i1[c]]);
        const double tau = sqrt(d * l1s / l1);
        double *p = P + (size_t)h * S;
        for (int64_t i = 0; i < S; i++) {
            double a = 0;
            for (int c = 0; c < r; c++) a += (double)q[h * d + i1[c]] * K[i * d + i1[c]];
            p[i] = a / tau;
            mx = p[i] > mx ? p[i] : mx;
        }
        for (int64_t i = 0; i < S; i++) z += (p[i] = exp(p[i] - mx));
        H[h] = 0;
        for (int64_t i = 0; i < S; i++) {
            p[i] /= z;
            if (p[i] > 0) H[h] -= p[i] * log(p[i]);
        }
    }
    const int64_t kk = k < S ? k : S, ll = l < kk ? l : kk, lo = k_min < S ? k_min : S;
    ref_allot(H, g, g * kk, lo > ll ? lo : ll, S, o->kh);
    /* the allotment of slightly different entropies: equal, or the case is too close to call */
    o->fragile = 0;
    for (int s = -1; s <= 1; s += 2) {
        int64_t k2[8];
        for (int h = 0; h < g; h++) Hp[h] = H[h] * (1 + s * 1e-5 * (h % 2 ? 1 : -1));
        ref_allot(Hp, g, g * kk, lo > ll ? lo : ll, S, k2);
        for (int h = 0; h < g; h++) o->fragile |= k2[h] != o->kh[h];
    }
    memset(o->sel, 0, (size_t)S);
    for (int h = 0; h < g; h++) {
        const double *p = P + (size_t)h * S;
        memset(hs, 0, (size_t)S);
        for (int64_t i = S - ll; i < S; i++) hs[i] = 1;
        const int64_t top = o->kh[h] - ll;
        order_desc(p, S - ll, ord);
        for (int64_t j = 0; j < top; j++) hs[ord[j]] = 1;
        if (top > 0 && top < S - ll && rel_gap(p[ord[top - 1]], p[ord[top]]) < o->margin)
            o->margin = rel_gap(p[ord[top - 1]], p[ord[top]]);
        /* exact softmax over the head's own selection */
        double mx = -INFINITY, z = 0, a = 0, sc[4096];
        for (int64_t i = 0; i < S; i++) {
            if (!hs[i]) continue;
            double x = 0;
            for (int j = 0; j < d; j++) x += (double)q[h * d + j] * K[i * d + j];
            sc[i] = x / sqrt((double)d);
            mx = sc[i] > mx ? sc[i] : mx;
        }
        for (int j = 0; j < d; j++) o->y[h * d + j] = 0;
        for (int64_t i = 0; i < S; i++)
            if (hs[i]) z += exp(sc[i] - mx);
        for (int64_t i = 0; i < S; i++) {
            if (!hs[i]) continue;
            const double wgt = exp(sc[i] - mx) / z;
            for (int j = 0; j < d; j++) o->y[h * d + j] += wgt * V[i * d + j];
            a += p[i];
            o->sel[i] = 1;
        }
        o->alpha[h] = a;
        for (int j = 0; j < d; j++) {
            double vm = 0;
            for (int64_t i = 0; i < S; i++) vm += V[i * d + j];
            vm /= (double)S;
            o->y[h * d + j] = a * o->y[h * d + j] + (1 - a) * vm;
        }
    }
    free(P); free(ord); free(hs);
}

/* The one call into the kernel API (its parameter list may change). */
static int run_step(const sparq_attn_params *p, int f16, const float *q, const float *K, const float *V, int64_t S,
                    int d, int g, float *out, int32_t *sel, int64_t *n_sel, float *alpha, int64_t *elements,
                    char *err, size_t err_size)
{
    sparq_attn_io io = { .kv_type = f16 ? SPARQ_KV_F16 : SPARQ_KV_F32, .S = S, .d = d, .g = g, .q = q,
                         .K = K, .V = V, .out = out, .sel = sel, .alpha = alpha };
    int rc = sparq_attn_run(p, &io, err, err_size);
    if (n_sel) *n_sel = io.n_sel;
    if (elements) *elements = io.elements;
    return rc;
}

static sparq_attn_params adaptive_params(int r, int k, int l, int k_min)
{
    sparq_attn_params p = sparq_attn_default_params();
    p.policy = "sparq";
    p.r = r;
    p.k = k;
    p.l = l;
    p.adaptive_k = 1;
    p.k_min = k_min;
    return p;
}

static void test_steps(void)
{
    const int64_t Ss[] = { 40, 257, 600, 1500 };
    const int ds[] = { 16, 64, 33 }, gs[] = { 1, 2, 4, 3 };
    int n = 0, skipped = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 3; b++)
            for (int f16 = 0; f16 < 2; f16++) {
                const int64_t S = Ss[a];
                const int d = ds[b], g = gs[(a + b + f16) % 4];
                const int r = 1 + (int)((a * 7 + b * 3) % (size_t)d), k = (int)(S / (3 + a)), l = k / 4;
                const int k_min = (a + b) % 2 ? 0 : l + (k - l) / 3;
                float *q = malloc((size_t)g * d * sizeof *q), *K = malloc((size_t)S * d * sizeof *K),
                      *V = malloc((size_t)S * d * sizeof *V), y[8 * 96], alpha[8];
                int32_t *sel = malloc((size_t)S * sizeof *sel);
                naive_out o;
                o.sel = malloc((size_t)S);
                /* heads of different sharpness, so the allotment is uneven */
                for (int h = 0; h < g; h++)
                    for (int j = 0; j < d; j++) q[h * d + j] = normal() * (0.3f + 1.7f * (float)h);
                for (int64_t i = 0; i < S * d; i++) {
                    K[i] = normal();
                    V[i] = normal();
                    if (f16) {
                        K[i] = fp16_to_fp32(fp32_to_fp16(K[i]));
                        V[i] = fp16_to_fp32(fp32_to_fp16(V[i]));
                    }
                }
                sparq_attn_params p = adaptive_params(r, k, l, k_min);
                int64_t n_sel = 0, el = 0;
                char err[256] = "";
                const int rc = run_step(&p, f16, q, K, V, S, d, g, y, sel, &n_sel, alpha, &el, err, sizeof err);
                CHECK(rc == 0, "S=%lld d=%d g=%d: %s", (long long)S, d, g, err);
                naive_adaptive(q, K, V, S, d, g, r, k, l, k_min ? k_min : l + 1, &o);
                if (rc == 0 && (o.margin < 1e-4 || o.fragile)) {
                    skipped++;
                } else if (rc == 0) {
                    double e = 0, ea = 0;
                    for (int i = 0; i < g * d; i++) e = fmax(e, fabs(y[i] - o.y[i]));
                    for (int h = 0; h < g; h++) ea = fmax(ea, fabs(alpha[h] - o.alpha[h]));
                    int64_t nu = 0, in = 1;
                    for (int64_t i = 0; i < S; i++) nu += o.sel[i];
                    for (int64_t j = 0; j < n_sel; j++) in &= sel[j] >= 0 && sel[j] < S && o.sel[sel[j]];
                    CHECK(e <= 2e-5 && ea <= 2e-5, "S=%lld d=%d g=%d r=%d k=%d f16=%d: output err %g, alpha err %g",
                          (long long)S, d, g, r, k, f16, e, ea);
                    CHECK(nu == n_sel && in, "S=%lld d=%d g=%d: union of %lld read, want %lld", (long long)S, d, g,
                          (long long)n_sel, (long long)nu);
                    /* measured: S*r + 2*|U|*d + 4*d (reads and writes), within the formula's bound */
                    const int64_t f = sparq_attn_formula(&p, S, d, g, err, sizeof err);
                    const int64_t uu = (int64_t)g * k < S ? (int64_t)g * k : S;
                    CHECK(el == S * r + 2 * n_sel * d + 4 * d && f == S * r + 2 * uu * d + 4 * d && el <= f,
                          "S=%lld d=%d g=%d: elements %lld, formula %lld", (long long)S, d, g, (long long)el,
                          (long long)f);
                    int64_t tot = 0;
                    for (int h = 0; h < g; h++) tot += o.kh[h];
                    CHECK(tot == (int64_t)g * k, "reference allotment sums to %lld", (long long)tot);
                    n++;
                }
                free(q); free(K); free(V); free(sel); free(o.sel);
            }
    CHECK(n >= 18, "only %d of %d cases compared (%d too close to call)", n, n + skipped, skipped);
    fprintf(stderr, "adaptive steps: %d compared with the naive reference, %d too close to call\n", n, skipped);
}

/* k >= S through the adaptive path equals dense attention; a uniform head
 * shows through alpha the larger k it was given. */
static void test_dense_identity(void)
{
    const int64_t S = 300;
    const int d = 32, g = 2;
    float *K = malloc((size_t)S * d * sizeof *K), *V = malloc((size_t)S * d * sizeof *V), q[2 * 32], y[2 * 32],
          alpha[2];
    int32_t *sel = malloc((size_t)S * sizeof *sel);
    for (int64_t i = 0; i < S * d; i++) {
        K[i] = normal();
        V[i] = normal();
    }
    for (int i = 0; i < g * d; i++) q[i] = normal();
    double want[2 * 32];
    for (int h = 0; h < g; h++) { /* dense, in double */
        double mx = -INFINITY, z = 0, s[300];
        for (int64_t i = 0; i < S; i++) {
            double x = 0;
            for (int j = 0; j < d; j++) x += (double)q[h * d + j] * K[i * d + j];
            s[i] = x / sqrt((double)d);
            mx = s[i] > mx ? s[i] : mx;
        }
        for (int64_t i = 0; i < S; i++) z += exp(s[i] - mx);
        for (int j = 0; j < d; j++) {
            double a = 0;
            for (int64_t i = 0; i < S; i++) a += exp(s[i] - mx) / z * V[i * d + j];
            want[h * d + j] = a;
        }
    }
    const int ks[] = { 300, 301, 1000 };
    for (int sa = 0; sa < 2; sa++)
            for (int t = 0; t < 3; t++) {
                sparq_attn_params p = adaptive_params(d / 2, ks[t], -1, 0);
                p.select_always = sa;
                int64_t n_sel = 0, el = 0;
                char err[256] = "";
                CHECK(run_step(&p, 0, q, K, V, S, d, g, y, sel, &n_sel, alpha, &el, err, sizeof err) == 0, "%s", err);
                double e = 0;
                for (int i = 0; i < g * d; i++) e = fmax(e, fabs(y[i] - want[i]));
                CHECK(e <= 2e-5 && n_sel == S, "k=%d select_always=%d: err %g vs dense, %lld read", ks[t], sa, e,
                      (long long)n_sel);
            }
    /* The selecting path with k >= S is dense attention bit for bit, plain
     * or adaptive: every position selected in cache order (the kernels of
     * dense attention, same order), and alpha exactly 1 - its sum over the
     * selection in float is 1 only up to rounding (|alpha - 1| ~ 6e-7 here),
     * which mixed v_mean into every step and, amplified by the model's f16
     * rounding of activations, moved tiny-d64's logits by up to 1.5e-2
     * (test_model below). */
    for (int ad = 0; ad < 2; ad++)
        for (int t = 0; t < 3; t++) {
            float y0[2 * 32], y1[2 * 32], a1[2];
            sparq_attn_params p = adaptive_params(d / 4, ks[t], -1, 0);
            p.adaptive_k = ad;
            int64_t n_sel = 0, el = 0;
            char err[256] = "";
            int ok = run_step(&p, 0, q, K, V, S, d, g, y0, sel, &n_sel, alpha, &el, err, sizeof err) == 0;
            p.select_always = 1;
            ok &= run_step(&p, 0, q, K, V, S, d, g, y1, sel, &n_sel, a1, &el, err, sizeof err) == 0;
            CHECK(ok && n_sel == S && a1[0] == 1.0f && a1[1] == 1.0f && !memcmp(y0, y1, sizeof y0),
                  "adaptive=%d k=%d: selecting path alpha %.9g %.9g, output %s the dense shortcut's (%s)", ad,
                  ks[t], a1[0], a1[1], memcmp(y0, y1, sizeof y0) ? "differs from" : "equals", err);
        }

    /* the control: k = 40 through the same path is not dense */
    sparq_attn_params p = adaptive_params(d / 2, 40, -1, 0);
    int64_t n_sel = 0, el = 0;
    char err[256] = "";
    CHECK(run_step(&p, 0, q, K, V, S, d, g, y, sel, &n_sel, alpha, &el, err, sizeof err) == 0, "%s", err);
    double e = 0;
    for (int i = 0; i < g * d; i++) e = fmax(e, fabs(y[i] - want[i]));
    CHECK(e > 1e-3, "k=40 equals dense (err %g): the identity above cannot fail", e);

    /* head 0 sharp (its query along one key), head 1 zero (uniform scores,
     * entropy log S): head 1 gets 2k - k_min positions, so its alpha (the
     * uniform mass it selected) is (2k - k_min) / S; fixed k would give k / S */
    for (int j = 0; j < d; j++) {
        q[j] = 40.0f * K[123 * d + j];
        q[d + j] = 0;
    }
    const int k = 64, l = 16, k_min = 20;
    p = adaptive_params(d, k, l, k_min);
    CHECK(run_step(&p, 0, q, K, V, S, d, g, y, sel, &n_sel, alpha, &el, err, sizeof err) == 0, "%s", err);
    CHECK_NEAR(alpha[1], (double)(2 * k - k_min) / S, 1e-5);
    CHECK(alpha[0] > 0.99, "the sharp head's alpha %g: its peak not selected", alpha[0]);
    p.adaptive_k = 0;
    p.k_min = 0;
    CHECK(run_step(&p, 0, q, K, V, S, d, g, y, sel, &n_sel, alpha, &el, err, sizeof err) == 0, "%s", err);
    CHECK_NEAR(alpha[1], (double)k / S, 1e-5);
    free(K); free(V); free(sel);
}

/* ---- options ----------------------------------------------------------------------- */

static void check_error(const sparq_attn_params *p, const char *want)
{
    char err[256] = "";
    const int64_t f = sparq_attn_formula(p, 1000, 64, 2, err, sizeof err);
    CHECK(f < 0 && strstr(err, want) && !strchr(err, '\n'), "formula %lld, message '%s', want '%s'", (long long)f,
          err, want);
}

static void test_options(void)
{
    sparq_attn_params p = adaptive_params(16, 100, 10, 0);
    char err[256] = "";
    CHECK(sparq_attn_formula(&p, 1000, 64, 2, err, sizeof err) == 1000 * 16 + 2 * 200 * 64 + 4 * 64, "%s", err);
    p.adaptive_k = 2;
    check_error(&p, "adaptive_k=2 must be 0 (off) or 1 (on)");
    p = adaptive_params(16, 100, 10, 5);
    check_error(&p, "k_min=5 must be between max(1, l)=10 and k=100");
    p.k_min = 101;
    check_error(&p, "k_min=101 must be between max(1, l)=10 and k=100");
    p.k_min = -3;
    check_error(&p, "k_min=-3 must be between");
    p.k_min = 0;
    p.select_logits = 1;
    check_error(&p, "select_logits does not apply");
    p = adaptive_params(16, 100, 10, 20);
    p.adaptive_k = 0;
    check_error(&p, "k_min=20 applies only with adaptive_k");

    /* the command's and the server's options */
    attn_opts o;
    attn_opts_init(&o);
    o.attn = "sparq";
    o.k_min = 8;
    sparq_attn_params out;
    CHECK(attn_opts_params(&o, 1000, 64, &out, err, sizeof err) == -1 &&
              !strcmp(err, "--sparq-k-min applies only with --sparq-adaptive-k"),
          "k-min alone: '%s'", err);
    o.adaptive_k = 1;
    CHECK(attn_opts_params(&o, 1000, 64, &out, err, sizeof err) == 0 && out.adaptive_k == 1 && out.k_min == 8,
          "adaptive options: %s", err);
    o.k_min = 0;
    o.ratio = "1/8";
    CHECK(attn_opts_params(&o, 2048, 64, &out, err, sizeof err) == 0 && out.adaptive_k == 1 && out.k > 1 &&
              sparq_attn_formula(&out, 2048, 64, 2, err, sizeof err) > 0,
          "adaptive with a ratio: %s", err);
}

/* ---- the trained model ----------------------------------------------------------------- */

static sparq_context *ctx(sparq_model *m, int kv_type, int sparq, int adaptive, int k, int select_always)
{
    sparq_context_params cp = sparq_context_default_params();
    cp.n_ctx = 256;
    cp.n_threads = 1;
    cp.kv_type = kv_type;
    if (sparq) {
        cp.attn = adaptive_params(0, k, -1, 0);
        cp.attn.adaptive_k = adaptive;
        cp.attn.select_always = select_always;
    }
    sparq_context *c = NULL;
    char err[256];
    if (sparq_context_create(m, &cp, &c, err, sizeof err)) fprintf(stderr, "context: %s\n", err);
    return c;
}

/* 150 tokens prefilled, then 50 forced steps (tokens spread over the
 * vocabulary): the largest logit difference of the steps, or -1. */
static double steps_vs_dense(sparq_model *m, int kv_type, int adaptive, int k, int select_always, float *la,
                             float *lb)
{
    const int V = sparq_model_n_vocab(m);
    int32_t ids[200];
    for (int i = 0; i < 200; i++) ids[i] = 1 + (int)((unsigned)(i * 2654435761u) % (unsigned)(V - 1));
    sparq_context *d = ctx(m, kv_type, 0, 0, 0, 0), *a = ctx(m, kv_type, 1, adaptive, k, select_always);
    double e = -1;
    if (d && a && sparq_eval(d, ids, 150, la) == 0 && sparq_eval(a, ids, 150, lb) == 0) {
        e = 0;
        for (int i = 150; e >= 0 && i < 200; i++) {
            if (sparq_eval(d, ids + i, 1, la) || sparq_eval(a, ids + i, 1, lb)) e = -1;
            for (int v = 0; e >= 0 && v < V; v++) e = fmax(e, fabs(la[v] - lb[v]));
        }
    }
    sparq_context_free(d);
    sparq_context_free(a);
    return e;
}

/* k >= S through the selecting path, adaptive and plain, gives dense
 * attention's logits exactly: each step is dense's bits (test_dense_identity),
 * and nothing less than bits would do - the matrix products round their
 * input to f16 (the weights' dot type), so an ulp of difference in one
 * step's attention flips roundings that the cache carries on (alpha as a
 * float sum over the selection gave 1.9e-3 (f32), 5.5e-3 (f16) and 1.5e-2
 * (q8_0 cache) here). The control: k = 8 is far from dense. */
static void test_model(void)
{
    char path[4096], err[256];
    if (path_find("tiny-d64.gguf", path, sizeof path)) {
        test_skip("tiny-d64.gguf not found");
        return;
    }
    sparq_model *m = NULL;
    if (sparq_model_load(path, &m, err, sizeof err)) {
        CHECK(0, "load: %s", err);
        return;
    }
    const int V = sparq_model_n_vocab(m);
    float *la = malloc((size_t)V * sizeof *la), *lb = malloc((size_t)V * sizeof *lb);
    const int kvs[] = { SPARQ_KV_F32, SPARQ_KV_F16, SPARQ_KV_Q8_0 };
    for (int t = 0; t < 3; t++) {
        for (int ad = 0; ad < 2; ad++) {
            const double e = steps_vs_dense(m, kvs[t], ad, 256, 1, la, lb);
            CHECK(e == 0, "kv %d: SparQ (adaptive=%d) with k >= S differs from dense by %g", kvs[t], ad, e);
        }
        const double e = steps_vs_dense(m, kvs[t], 1, 8, 0, la, lb);
        CHECK(e > 1e-2, "kv %d: adaptive k = 8 equals dense (%g): the identity cannot fail", kvs[t], e);
    }
    free(la);
    free(lb);
    sparq_model_free(m);
}

int main(void)
{
    test_allot();
    test_entropy();
    test_steps();
    test_dense_identity();
    test_options();
    test_model();
    return test_summary("test_sparq_adaptive");
}
