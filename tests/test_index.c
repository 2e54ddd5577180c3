/* test_index.c - the key index (src/index.h): kernels against their plain-C
 * twins, exact top-k against a brute-force sort written here, ivf against
 * exact, recall on clustered data, serialization round trips and hostile
 * images, hnsw (when Faiss is built in), parameter checks. */
#include "index/index.h"
#include "tensor/quant.h"
#include "test.h"

#include <stdint.h>

/* ---- data ----------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unif(uint64_t *s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

static float rng_gauss(uint64_t *s)
{
    double u = rng_unif(s), v = rng_unif(s);
    if (u < 1e-300) u = 1e-300;
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

static float *gauss_matrix(int64_t n, int d, uint64_t seed)
{
    float *x = malloc((size_t)n * d * sizeof(float));
    uint64_t s = seed;
    for (int64_t i = 0; i < n * d; i++) x[i] = rng_gauss(&s);
    return x;
}

/* n keys around nc Gaussian centres (sorted by cluster, so a sample taken
 * from the first keys only would miss the later clusters); queries near
 * centres. */
typedef struct clustered {
    int64_t n;
    int d, nc;
    float *keys, *centres;
} clustered;

static clustered make_clustered(int64_t n, int d, int nc, float spread, uint64_t seed)
{
    clustered c = { n, d, nc, malloc((size_t)n * d * sizeof(float)), gauss_matrix(nc, d, seed) };
    uint64_t s = seed ^ 0xabcdef;
    for (int64_t i = 0; i < n; i++) {
        int cl = (int)(i * nc / n);
        for (int j = 0; j < d; j++) c.keys[i * d + j] = c.centres[cl * d + j] + spread * rng_gauss(&s);
    }
    return c;
}

static void near_centres(const clustered *c, int g, uint64_t seed, float *q)
{
    uint64_t s = seed;
    for (int h = 0; h < g; h++) {
        int cl = (int)(rng_next(&s) % (uint64_t)c->nc);
        for (int j = 0; j < c->d; j++) q[h * c->d + j] = c->centres[cl * c->d + j] + 0.3f * rng_gauss(&s);
    }
}

/* ---- the reference written here ----------------------------------------------- */

/* Keys as the index stores them, back in f32 (this test's own rounding). */
static float *dequantised(const float *x, int64_t n, int d, int kt)
{
    float *y = malloc((size_t)n * d * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        const float *r = x + i * d;
        float *o = y + i * d;
        if (kt == IDX_I8) {
            float amax = 0;
            for (int j = 0; j < d; j++) amax = fabsf(r[j]) > amax ? fabsf(r[j]) : amax;
            float sc = amax / 127.0f;
            for (int j = 0; j < d; j++) o[j] = sc > 0 ? rintf(r[j] / sc) * sc : 0.0f;
        } else {
            for (int j = 0; j < d; j++)
                o[j] = kt == IDX_F16 ? fp16_to_fp32(fp32_to_fp16(r[j]))
                     : kt == IDX_BF16 ? bf16_to_fp32(fp32_to_bf16(r[j])) : r[j];
        }
    }
    return y;
}

typedef struct scored { double s; int32_t id; } scored;

static int by_score(const void *a, const void *b)
{
    const scored *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* All n scores of one query, in double, and the sorted order. */
static void brute(const float *keys, int64_t n, int d, const float *q, double *all, scored *sorted)
{
    for (int64_t i = 0; i < n; i++) {
        double acc = 0;
        for (int j = 0; j < d; j++) acc += (double)q[j] * keys[i * d + j];
        all[i] = acc;
        sorted[i].s = acc;
        sorted[i].id = (int32_t)i;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, by_score);
}

/* A result is right if rank by rank its ids are distinct keys whose true
 * scores match the true sorted scores (within tol: float vs double sums),
 * its reported scores match too, and ranks past n are padding. Returns the
 * number of bad ranks. */
static int check_topk(const int32_t *ids, const float *sc, int k, const double *all, const scored *sorted,
                      int64_t n, double tol, const char *what)
{
    int bad = 0;
    char *seen = calloc((size_t)n, 1);
    for (int r = 0; r < k; r++) {
        if (r >= n) {
            if (ids[r] != -1 || sc[r] != -INFINITY) bad++;
            continue;
        }
        int32_t id = ids[r];
        if (id < 0 || id >= n || seen[id]) {
            bad++;
            continue;
        }
        seen[id] = 1;
        double t = tol * (1.0 + fabs(sorted[r].s));
        if (fabs(all[id] - sorted[r].s) > t || fabs(sc[r] - sorted[r].s) > t) bad++;
        if (r > 0 && sc[r] > sc[r - 1]) bad++;
    }
    free(seen);
    if (bad) fprintf(stderr, "  %s: %d bad ranks of %d\n", what, bad, k);
    return bad;
}

static double recall(const int32_t *ids, int k, const scored *sorted)
{
    int hit = 0;
    for (int r = 0; r < k; r++)
        for (int t = 0; t < k; t++)
            if (ids[r] == sorted[t].id) {
                hit++;
                break;
            }
    return (double)hit / k;
}

/* ---- kernels ------------------------------------------------------------------- */

static void test_block_kernels(void)
{
    const int types[4] = { IDX_F32, IDX_F16, IDX_BF16, IDX_I8 };
    const int ds[] = { 1, 2, 3, 17, 64, 128, 131 };
    const int gs[] = { 1, 2, 3, 4, 7, 8, 9, 13 };
    uint64_t s = 7;
    int bad = 0, bad_ref = 0;
    for (int t = 0; t < 4; t++)
        for (size_t di = 0; di < sizeof ds / sizeof ds[0]; di++)
            for (size_t gi = 0; gi < sizeof gs / sizeof gs[0]; gi++) {
                int d = ds[di], g = gs[gi], kt = types[t];
                size_t elt = idx_elt_bytes(kt);
                uint8_t *blk = malloc((size_t)d * 16 * elt);
                float q[13 * 131], sc[16], o1[13 * 16], o2[13 * 16];
                for (int i = 0; i < g * d; i++) q[i] = rng_gauss(&s);
                for (int r = 0; r < 16; r++) sc[r] = 0.01f + (float)rng_unif(&s);
                for (int i = 0; i < d * 16; i++) {
                    float v = rng_gauss(&s);
                    if (kt == IDX_F32) ((float *)blk)[i] = v;
                    else if (kt == IDX_F16) ((uint16_t *)blk)[i] = fp32_to_fp16(v);
                    else if (kt == IDX_BF16) ((uint16_t *)blk)[i] = fp32_to_bf16(v);
                    else ((int8_t *)blk)[i] = (int8_t)(rng_next(&s) % 255 - 127);
                }
                idx_block_scores(kt, blk, sc, d, q, g, o1);
                idx_block_scores_ref(kt, blk, sc, d, q, g, o2);
                for (int h = 0; h < g; h++)
                    for (int r = 0; r < 16; r++) {
                        /* independent double sum and the magnitude it is made of */
                        double acc = 0, mag = 0;
                        for (int j = 0; j < d; j++) {
                            int64_t e = (int64_t)j * 16 + r;
                            double kv = kt == IDX_F32 ? ((float *)blk)[e]
                                      : kt == IDX_F16 ? fp16_to_fp32(((uint16_t *)blk)[e])
                                      : kt == IDX_BF16 ? bf16_to_fp32(((uint16_t *)blk)[e])
                                                       : ((int8_t *)blk)[e];
                            acc += q[h * d + j] * kv;
                            mag += fabs(q[h * d + j] * kv);
                        }
                        if (kt == IDX_I8) acc *= sc[r], mag *= sc[r];
                        /* tolerance: a few float roundings per term */
                        double tol = 4e-7 * d * mag + 1e-30;
                        if (fabs(o1[h * 16 + r] - o2[h * 16 + r]) > tol) bad++;
                        if (fabs(o2[h * 16 + r] - acc) > tol) bad_ref++;
                    }
                free(blk);
            }
    CHECK(bad == 0, "block scores SIMD vs ref: %d lanes differ", bad);
    CHECK(bad_ref == 0, "block scores ref vs double: %d lanes differ", bad_ref);
}

static void test_push16(void)
{
    /* a stream pushed through the SIMD and the plain version keeps the same
     * top-k (order: score desc, id asc) */
    uint64_t s = 11;
    int bad = 0;
    for (int trial = 0; trial < 40; trial++) {
        int k = 1 + (int)(rng_next(&s) % 100), cap = 2 * k + 32, nblk = 1 + (int)(rng_next(&s) % 60);
        float *b1 = malloc((size_t)cap * 4), *b2 = malloc((size_t)cap * 4);
        int32_t *i1 = malloc((size_t)cap * 4), *i2 = malloc((size_t)cap * 4);
        idx_topk t1, t2;
        idx_topk_init(&t1, b1, i1, cap, k);
        idx_topk_init(&t2, b2, i2, cap, k);
        for (int b = 0; b < nblk; b++) {
            float sc[16];
            int32_t ids[16];
            for (int r = 0; r < 16; r++) {
                /* few distinct values: plenty of equal scores to order by id */
                sc[r] = (float)(rng_next(&s) % 50) - 25.0f;
                if (rng_next(&s) % 97 == 0) sc[r] = NAN;
                ids[r] = b * 16 + r;
            }
            uint32_t valid = (uint32_t)(rng_next(&s) & 0xffff);
            int use_ids = trial & 1;
            idx_topk_push16(&t1, sc, use_ids ? ids : NULL, b * 16, valid);
            idx_topk_push16_ref(&t2, sc, use_ids ? ids : NULL, b * 16, valid);
        }
        int32_t o1[100], o2[100];
        float s1[100], s2[100];
        idx_topk_finish(&t1, k, o1, s1);
        idx_topk_finish(&t2, k, o2, s2);
        for (int r = 0; r < k; r++)
            if (o1[r] != o2[r] || !(s1[r] == s2[r]) || (r && (s1[r] > s1[r - 1] ||
                                                              (s1[r] == s1[r - 1] && o1[r] < o1[r - 1] && o1[r] >= 0))))
                bad++;
        free(b1); free(b2); free(i1); free(i2);
    }
    CHECK(bad == 0, "top-k push SIMD vs ref: %d ranks differ", bad);
}

static void test_assign_kernel(void)
{
    const int ds[] = { 1, 5, 64, 67 };
    const int ncs[] = { 1, 15, 16, 17, 70, 141 };
    const int64_t ns[] = { 1, 3, 4, 9 };
    uint64_t s = 3;
    int bad = 0;
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 6; b++)
            for (size_t c = 0; c < 4; c++) {
                int d = ds[a], nc = ncs[b];
                int64_t n = ns[c], ncb = (nc + 15) / 16;
                float *x = gauss_matrix(n, d, rng_next(&s));
                float *cr = gauss_matrix(nc, d, rng_next(&s));
                float *cb = calloc((size_t)ncb * 16 * d, 4), *hn = malloc((size_t)ncb * 16 * 4);
                for (int k = 0; k < ncb * 16; k++) {
                    double t = 0;
                    for (int j = 0; j < d && k < nc; j++) {
                        cb[(size_t)(k / 16) * d * 16 + (size_t)j * 16 + k % 16] = cr[k * d + j];
                        t += (double)cr[k * d + j] * cr[k * d + j];
                    }
                    hn[k] = k < nc ? (float)(t / 2) : INFINITY;
                }
                int32_t l1[9], l2[9];
                float b1[9], b2[9];
                idx_assign(x, n, d, cb, hn, nc, l1, b1);
                idx_assign_ref(x, n, d, cb, hn, nc, l2, b2);
                for (int64_t i = 0; i < n; i++) {
                    /* the true nearest centroid, in double */
                    int bi = 0;
                    double bd = INFINITY;
                    for (int k = 0; k < nc; k++) {
                        double dd = 0;
                        for (int j = 0; j < d; j++) dd += pow((double)x[i * d + j] - cr[k * d + j], 2);
                        if (dd < bd) bd = dd, bi = k;
                    }
                    if (fabs(b1[i] - b2[i]) > 1e-4 * (1 + fabs(b2[i]))) bad++;
                    if (l1[i] != l2[i] || l2[i] != bi) bad++;
                }
                free(x); free(cr); free(cb); free(hn);
            }
    CHECK(bad == 0, "assign SIMD vs ref vs double: %d mismatches", bad);
}

static void test_pack(void)
{
    /* SIMD and plain packing round the same way: identical bytes */
    const int types[4] = { IDX_F32, IDX_F16, IDX_BF16, IDX_I8 };
    const int ds[] = { 1, 3, 64, 67 };
    const int64_t ns[] = { 1, 15, 16, 17, 40 };
    uint64_t s = 5;
    int bad = 0;
    for (int t = 0; t < 4; t++)
        for (int a = 0; a < 4; a++)
            for (int b = 0; b < 5; b++) {
                int d = ds[a];
                int64_t n = ns[b], nb = (n + 15) / 16;
                size_t bytes = (size_t)nb * 16 * d * idx_elt_bytes(types[t]);
                float *v = malloc((size_t)n * d * 4);
                for (int64_t i = 0; i < n * d; i++) {
                    /* normal values, f16 subnormals, f16 overflow, zeros, a zero row */
                    double u = rng_unif(&s);
                    v[i] = u < 0.1 ? 3e-6f * rng_gauss(&s) : u < 0.15 ? 7e4f * rng_gauss(&s)
                         : u < 0.2 ? 0.0f : rng_gauss(&s);
                    if (i / d == 2) v[i] = 0.0f;
                }
                uint8_t *o1 = calloc(bytes, 1), *o2 = calloc(bytes, 1);
                float sc1[48] = { 0 }, sc2[48] = { 0 };
                idx_pack_rows(types[t], v, n, d, o1, sc1);
                idx_pack_rows_ref(types[t], v, n, d, o2, sc2);
                if (memcmp(o1, o2, bytes) || memcmp(sc1, sc2, sizeof sc1)) bad++;
                free(v); free(o1); free(o2);
            }
    CHECK(bad == 0, "pack SIMD vs ref: %d layouts differ", bad);
}

/* ---- exact ---------------------------------------------------------------------- */

static void test_exact(void)
{
    const int64_t N = test_quick() ? 1203 : 5003;
    const int d = 64, g = 4;
    const int ks[] = { 1, 100, (int)N, (int)N + 7 };
    const int kts[] = { IDX_F16, IDX_BF16, IDX_I8 };
    float *keys = gauss_matrix(N, d, 101), *q = gauss_matrix(g, d, 202);
    double *all = malloc((size_t)N * sizeof(double));
    scored *sorted = malloc((size_t)N * sizeof(scored));
    int32_t *ids = malloc((size_t)g * (N + 7) * 4), *ids2 = malloc((size_t)g * (N + 7) * 4);
    float *sc = malloc((size_t)g * (N + 7) * 4), *sc2 = malloc((size_t)g * (N + 7) * 4);
    char err[256];
    for (int t = 0; t < 3; t++) {
        idx_params p = idx_default_params();
        p.key_type = kts[t];
        p.n_threads = 2;
        idx_index *ix = NULL;
        int rc = idx_build(&p, keys, N, d, &ix, err, sizeof err);
        CHECK(rc == 0, "exact build type %d: %s", kts[t], err);
        if (rc) continue;
        float *dq = dequantised(keys, N, d, kts[t]);
        idx_scratch *s = idx_scratch_create();
        for (int ki = 0; ki < 4; ki++) {
            int k = ks[ki];
            idx_search_params sp1 = { .n_threads = 1 }, sp2 = { .n_threads = 2 };
            rc = idx_search(ix, q, g, k, &sp1, s, ids, sc, err, sizeof err);
            CHECK(rc == 0, "exact search: %s", err);
            rc = idx_search(ix, q, g, k, &sp2, s, ids2, sc2, err, sizeof err);
            CHECK(rc == 0, "exact search 2 threads: %s", err);
            CHECK(memcmp(ids, ids2, (size_t)g * k * 4) == 0 && memcmp(sc, sc2, (size_t)g * k * 4) == 0,
                  "exact type %d k %d: 1 and 2 threads differ", kts[t], k);
            for (int h = 0; h < g; h++) {
                brute(dq, N, d, q + h * d, all, sorted);
                int bad = check_topk(ids + (size_t)h * k, sc + (size_t)h * k, k, all, sorted, N, 2e-5, "exact");
                CHECK(bad == 0, "exact type %d k %d query %d: %d bad ranks", kts[t], k, h, bad);
            }
        }
        /* k > N also without a caller scratch */
        rc = idx_search(ix, q, 1, (int)N + 7, NULL, NULL, ids, sc, err, sizeof err);
        CHECK(rc == 0 && ids[N] == -1 && ids[N + 6] == -1 && sc[N + 6] == -INFINITY && ids[N - 1] >= 0,
              "exact k > N pads with -1 / -inf");
        idx_scratch_free(s);
        free(dq);
        idx_free(ix);
    }
    free(keys); free(q); free(all); free(sorted); free(ids); free(ids2); free(sc); free(sc2);
}

/* ---- ivf ---------------------------------------------------------------------------- */

static void test_ivf_full_probe_is_exact(void)
{
    const int64_t N = 4001;
    const int d = 48, g = 3, k = 50;
    float *keys = gauss_matrix(N, d, 303), *q = gauss_matrix(g, d, 404);
    char err[256];
    const int kts[] = { IDX_F16, IDX_I8 };
    for (int t = 0; t < 2; t++) {
        idx_params pe = idx_default_params(), pi = idx_default_params();
        pe.key_type = pi.key_type = kts[t];
        pi.kind = "ivf";
        pi.nlist = 37;
        idx_index *ex = NULL, *iv = NULL;
        CHECK(idx_build(&pe, keys, N, d, &ex, err, sizeof err) == 0, "exact: %s", err);
        CHECK(idx_build(&pi, keys, N, d, &iv, err, sizeof err) == 0, "ivf: %s", err);
        if (!ex || !iv) {
            idx_free(ex);
            idx_free(iv);
            continue;
        }
        CHECK(idx_nlist(iv) == 37, "nlist %d", idx_nlist(iv));
        int32_t i1[g * k], i2[g * k];
        float s1[g * k], s2[g * k];
        idx_search_params sp = { .nprobe = 37, .n_threads = 2 };
        CHECK(idx_search(ex, q, g, k, NULL, NULL, i1, s1, err, sizeof err) == 0, "%s", err);
        CHECK(idx_search(iv, q, g, k, &sp, NULL, i2, s2, err, sizeof err) == 0, "%s", err);
        /* same stored values, same per-row kernel: bit-identical */
        CHECK(memcmp(i1, i2, sizeof i1) == 0 && memcmp(s1, s2, sizeof s1) == 0,
              "ivf nprobe = nlist differs from exact (type %d)", kts[t]);
        sp.nprobe = 1000; /* clamped to nlist */
        CHECK(idx_search(iv, q, g, k, &sp, NULL, i2, s2, err, sizeof err) == 0 &&
                  memcmp(i1, i2, sizeof i1) == 0, "ivf nprobe > nlist is clamped");
        idx_free(ex);
        idx_free(iv);
    }
    free(keys);
    free(q);
}

static void test_ivf_recall_and_determinism(const clustered *c, idx_index **keep)
{
    const int g = 4, k = 100, n_q = 64;
    char err[256];
    idx_params p = idx_default_params();
    p.kind = "ivf";
    p.n_threads = 2;
    idx_index *ix = NULL;
    int rc = idx_build(&p, c->keys, c->n, c->d, &ix, err, sizeof err);
    CHECK(rc == 0, "ivf build: %s", err);
    if (rc) return;
    CHECK(idx_nlist(ix) == (int)llround(sqrt((double)c->n)), "default nlist %d", idx_nlist(ix));

    /* the k-means sample spans the whole prefix: with keys sorted by cluster,
     * every cluster gets centroids, so no list swallows several clusters */
    int64_t per = c->n / c->nc, biggest = 0;
    for (int l = 0; l < ix->nlist; l++) biggest = ix->list_n[l] > biggest ? ix->list_n[l] : biggest;
    CHECK(biggest <= 2 * per, "largest ivf list %lld keys, clusters have %lld", (long long)biggest, (long long)per);

    /* deterministic for any thread count */
    p.n_threads = 1;
    idx_index *ix1 = NULL;
    CHECK(idx_build(&p, c->keys, c->n, c->d, &ix1, err, sizeof err) == 0, "%s", err);
    CHECK(ix1 && idx_serialized_size(ix1) == idx_serialized_size(ix) &&
              memcmp(ix1->image, ix->image, idx_serialized_size(ix)) == 0,
          "ivf build differs between 1 and 2 threads");
    idx_free(ix1);

    float *dq = dequantised(c->keys, c->n, c->d, IDX_F16);
    double *all = malloc((size_t)c->n * sizeof(double));
    scored *sorted = malloc((size_t)c->n * sizeof(scored));
    float q[4 * 64], sc[4 * 100];
    int32_t ids[4 * 100], one[100];
    float one_s[100];
    double rec = 0, rec1 = 0;
    for (int t = 0; t < n_q / g; t++) {
        near_centres(c, g, 1000 + t, q);
        CHECK(idx_search(ix, q, g, k, NULL, NULL, ids, sc, err, sizeof err) == 0, "%s", err);
        for (int h = 0; h < g; h++) {
            brute(dq, c->n, c->d, q + h * c->d, all, sorted);
            rec += recall(ids + h * k, k, sorted);
            /* one query alone: no help from the group's other probes */
            CHECK(idx_search(ix, q + h * c->d, 1, k, NULL, NULL, one, one_s, err, sizeof err) == 0, "%s", err);
            rec1 += recall(one, k, sorted);
            /* whatever is returned carries its true score */
            int bad = 0;
            for (int r = 0; r < k; r++)
                if (fabs(sc[h * k + r] - all[ids[h * k + r]]) > 2e-5 * (1 + fabs(all[ids[h * k + r]]))) bad++;
            CHECK(bad == 0, "ivf scores are not the keys' scores (%d)", bad);
        }
    }
    rec /= n_q;
    rec1 /= n_q;
    fprintf(stderr, "  ivf default (nlist %d, nprobe %d): recall@%d %.3f (groups of %d), %.3f (single)\n",
            ix->nlist, ix->nprobe, k, rec, g, rec1);
    CHECK(rec >= 0.9, "ivf recall@%d %.3f < 0.9", k, rec);
    CHECK(rec1 >= 0.9, "ivf single-query recall@%d %.3f < 0.9", k, rec1);
    free(dq);
    free(all);
    free(sorted);
    *keep = ix;
}

/* ---- serialization ------------------------------------------------------------------- */

/* Serializes ix, loads it aligned (zero-copy) and misaligned (copied), and
 * compares searches. Returns the image (caller frees) for the corruption
 * tests. */
static uint8_t *roundtrip(const idx_index *ix, const float *q, int g, int k, size_t *n_out, const char *what)
{
    char err[256];
    size_t n = idx_serialized_size(ix);
    uint8_t *buf = aligned_alloc(64, (n + 64 + 63) / 64 * 64);
    *n_out = n;
    CHECK(idx_serialize(ix, buf, n - 1, err, sizeof err) != 0, "%s: short destination accepted", what);
    CHECK(idx_serialize(ix, buf, n, err, sizeof err) == 0, "%s: serialize: %s", what, err);
    int32_t *i0 = malloc((size_t)g * k * 4), *i1 = malloc((size_t)g * k * 4);
    float *s0 = malloc((size_t)g * k * 4), *s1 = malloc((size_t)g * k * 4);
    idx_search_params sp = { .n_threads = 1 };
    CHECK(idx_search(ix, q, g, k, &sp, NULL, i0, s0, err, sizeof err) == 0, "%s", err);
    for (int shift = 0; shift < 2; shift++) {
        uint8_t *src = buf;
        if (shift) { /* misaligned copy */
            src = malloc(n + 1) ;
            memcpy(src + 1, buf, n);
            src += 1;
        }
        idx_index *back = NULL;
        int rc = idx_deserialize(src, n, &back, err, sizeof err);
        CHECK(rc == 0, "%s: deserialize (shift %d): %s", what, shift, err);
        if (rc == 0) {
            CHECK(idx_search(back, q, g, k, &sp, NULL, i1, s1, err, sizeof err) == 0, "%s", err);
            CHECK(memcmp(i0, i1, (size_t)g * k * 4) == 0 && memcmp(s0, s1, (size_t)g * k * 4) == 0,
                  "%s: search after round trip differs (shift %d)", what, shift);
            CHECK(idx_kind(back) == idx_kind(ix) && idx_count(back) == idx_count(ix) && idx_dim(back) == idx_dim(ix),
                  "%s: metadata after round trip", what);
            /* and it serializes back to the same bytes */
            uint8_t *again = malloc(n);
            CHECK(idx_serialized_size(back) == n && idx_serialize(back, again, n, err, sizeof err) == 0 &&
                      memcmp(again, buf, n) == 0, "%s: re-serialized bytes differ", what);
            free(again);
        }
        idx_free(back);
        if (shift) free(src - 1);
    }
    free(i0); free(i1); free(s0); free(s1);
    return buf;
}

static int loads(const uint8_t *img, size_t n)
{
    char err[256];
    idx_index *ix = NULL;
    uint8_t *b = aligned_alloc(64, (n + 63) / 64 * 64 + 64);
    memcpy(b, img, n);
    int rc = idx_deserialize(b, n, &ix, err, sizeof err);
    if (rc == 0) { /* accepted: it must still search without crashing */
        int32_t ids[8];
        float sc[8];
        float q[IDX_MAX_D] = { 0 };
        for (int j = 0; j < idx_dim(ix); j++) q[j] = 0.5f - (float)(j % 3);
        (void)idx_search(ix, q, 1, 8, NULL, NULL, ids, sc, err, sizeof err);
    } else {
        rc = err[0] ? -1 : -2; /* an error must come with a message */
    }
    idx_free(ix);
    free(b);
    return rc;
}

/* Overwrites 4 or 8 bytes at off in a copy and reports whether it loads. */
static int loads_with(const uint8_t *img, size_t n, size_t off, const void *val, size_t len)
{
    uint8_t *c = malloc(n);
    memcpy(c, img, n);
    memcpy(c + off, val, len);
    int rc = loads(c, n);
    free(c);
    return rc;
}

static void test_hostile_common(const uint8_t *img, size_t n, int n_flip, const char *what)
{
    /* truncations, including inside the header */
    const size_t cuts[] = { 0, 1, 8, 64, 127, 128, 129, n / 2, n - 64, n - 1 };
    int accepted = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        if (cuts[i] < n && loads(img, cuts[i]) == 0) accepted++;
    CHECK(accepted == 0, "%s: %d truncated images accepted", what, accepted);
    CHECK(loads(img, n) == 0, "%s: the intact image is rejected", what);
    /* header fields */
    uint32_t v32;
    uint64_t v64;
    v32 = 2; CHECK(loads_with(img, n, 8, &v32, 4) == -1, "%s: version 2 accepted", what);
    v32 = 9; CHECK(loads_with(img, n, 12, &v32, 4) == -1, "%s: kind 9 accepted", what);
    v32 = 7; CHECK(loads_with(img, n, 16, &v32, 4) == -1, "%s: key type 7 accepted", what);
    v32 = 0; CHECK(loads_with(img, n, 20, &v32, 4) == -1, "%s: d 0 accepted", what);
    v32 = 1u << 30; CHECK(loads_with(img, n, 20, &v32, 4) == -1, "%s: huge d accepted", what);
    v64 = 0; CHECK(loads_with(img, n, 24, &v64, 8) == -1, "%s: n 0 accepted", what);
    v64 = 1ull << 62; CHECK(loads_with(img, n, 24, &v64, 8) == -1, "%s: huge n accepted", what);
    v64 = n + 64; CHECK(loads_with(img, n, 32, &v64, 8) == -1, "%s: wrong total accepted", what);
    v64 = 1ull << 61; CHECK(loads_with(img, n, 40, &v64, 8) == -1, "%s: huge block count accepted", what);
    CHECK(loads_with(img, n, 0, "XPQINDX1", 8) == -1, "%s: bad magic accepted", what);
    v32 = 1; CHECK(loads_with(img, n, 100, &v32, 4) == -1, "%s: reserved byte accepted", what);
    v32 = 3; CHECK(loads_with(img, n, strstr(what, "hnsw") ? 48 : 56, &v32, 4) == -1,
                   "%s: another kind's field accepted", what);
    /* random byte flips anywhere: rejected or harmless, never a crash */
    uint64_t s = 99;
    int silent = 0;
    if (test_quick()) n_flip /= 4;
    for (int i = 0; i < n_flip; i++) {
        size_t off = rng_next(&s) % (i < n_flip / 2 ? (n < 512 ? n : 512) : n);
        uint8_t c = (uint8_t)(1u << (rng_next(&s) % 8));
        uint8_t byte = img[off] ^ c;
        if (loads_with(img, n, off, &byte, 1) == -2) silent++;
    }
    CHECK(silent == 0, "%s: %d rejections without a message", what, silent);
}

static void test_serialization(const clustered *c, idx_index *ivf)
{
    char err[256];
    float q[4 * 128];
    near_centres(c, 4, 77, q);
    size_t n;
    /* exact, every key type */
    const int kts[] = { IDX_F16, IDX_BF16, IDX_I8 };
    for (int t = 0; t < 3; t++) {
        idx_params p = idx_default_params();
        p.key_type = kts[t];
        idx_index *ix = NULL;
        CHECK(idx_build(&p, c->keys, 1000, c->d, &ix, err, sizeof err) == 0, "%s", err);
        if (!ix) continue;
        uint8_t *img = roundtrip(ix, q, 4, 50, &n, "exact");
        if (t == 2) test_hostile_common(img, n, 300, "exact i8");
        free(img);
        idx_free(ix);
    }
    /* ivf */
    uint8_t *img = roundtrip(ivf, q, 4, 100, &n, "ivf");
    test_hostile_common(img, n, 300, "ivf");
    /* ivf structure: lists, counts and ids must form a partition */
    size_t lo = (size_t)((const uint8_t *)ivf->list_off - ivf->image);
    size_t ln = (size_t)((const uint8_t *)ivf->list_n - ivf->image);
    size_t io = (size_t)((const uint8_t *)ivf->ids - ivf->image);
    int64_t v;
    int32_t id;
    v = 1; CHECK(loads_with(img, n, lo, &v, 8) == -1, "ivf: list 0 not at 0 accepted");
    v = ivf->list_off[1] + 1; CHECK(loads_with(img, n, lo + 8, &v, 8) == -1, "ivf: shifted list accepted");
    v = -5; CHECK(loads_with(img, n, lo + 16, &v, 8) == -1, "ivf: negative offset accepted");
    v = ivf->list_n[0] + 16; CHECK(loads_with(img, n, ln, &v, 8) == -1, "ivf: list count beyond blocks accepted");
    v = -1; CHECK(loads_with(img, n, ln + 8, &v, 8) == -1, "ivf: negative list count accepted");
    id = ivf->ids[1]; CHECK(loads_with(img, n, io, &id, 4) == -1, "ivf: duplicate id accepted");
    id = (int32_t)c->n; CHECK(loads_with(img, n, io, &id, 4) == -1, "ivf: id out of range accepted");
    id = -7; CHECK(loads_with(img, n, io, &id, 4) == -1, "ivf: negative id accepted");
    {   /* a padding slot that claims a key */
        int l = 0;
        while (l < ivf->nlist && ivf->list_n[l] % 16 == 0) l++;
        if (l < ivf->nlist) {
            id = 0;
            CHECK(loads_with(img, n, io + (size_t)(ivf->list_off[l] * 16 + ivf->list_n[l]) * 4, &id, 4) == -1,
                  "ivf: filled padding slot accepted");
        }
    }
    size_t bo = (size_t)((const uint8_t *)ivf->list_bonus - ivf->image);
    float fb = NAN; CHECK(loads_with(img, n, bo + 4, &fb, 4) == -1, "ivf: NaN probe bonus accepted");
    fb = -1.0f; CHECK(loads_with(img, n, bo, &fb, 4) == -1, "ivf: negative probe bonus accepted");
    fb = INFINITY; CHECK(loads_with(img, n, bo, &fb, 4) == -1, "ivf: infinite probe bonus accepted");
    int32_t np = 0; CHECK(loads_with(img, n, 52, &np, 4) == -1, "ivf: nprobe 0 accepted");
    np = ivf->nlist + 1; CHECK(loads_with(img, n, 48, &np, 4) == -1, "ivf: nlist changed accepted");
    free(img);
}

/* ---- hnsw ------------------------------------------------------------------------------ */

static void test_hnsw(const clustered *c)
{
    char err[256];
    idx_params p = idx_default_params();
    p.kind = "hnsw";
    idx_index *ix = NULL;
    int rc = idx_build(&p, c->keys, c->n, c->d, &ix, err, sizeof err);
#ifndef SPARQ_HAVE_FAISS
    CHECK(rc != 0 && strstr(err, "Faiss not available"), "hnsw without Faiss: %s", err);
    test_skip("hnsw: Faiss not built in");
    idx_free(ix);
    return;
#endif
    CHECK(rc == 0, "hnsw build: %s", err);
    if (rc) return;
    const int g = 4, k = 100, n_q = 32;
    double *all = malloc((size_t)c->n * sizeof(double));
    scored *sorted = malloc((size_t)c->n * sizeof(scored));
    float q[4 * 64], sc[4 * 100];
    int32_t ids[4 * 100];
    double rec = 0;
    for (int t = 0; t < n_q / g; t++) {
        near_centres(c, g, 5000 + t, q);
        CHECK(idx_search(ix, q, g, k, NULL, NULL, ids, sc, err, sizeof err) == 0, "%s", err);
        for (int h = 0; h < g; h++) {
            brute(c->keys, c->n, c->d, q + h * c->d, all, sorted);
            rec += recall(ids + h * k, k, sorted);
            int bad = 0;
            for (int r = 0; r < k; r++)
                if (ids[h * k + r] < 0 || fabs(sc[h * k + r] - all[ids[h * k + r]]) > 1e-4 * (1 + fabs(all[ids[h * k + r]])) ||
                    (r && sc[h * k + r] > sc[h * k + r - 1]))
                    bad++;
            CHECK(bad == 0, "hnsw results carry wrong scores or order (%d)", bad);
        }
    }
    rec /= n_q;
    fprintf(stderr, "  hnsw (M 16, efSearch %d): recall@%d %.3f\n", p.ef_search < k ? k : p.ef_search, k, rec);
    CHECK(rec >= 0.9, "hnsw recall@%d %.3f < 0.9", k, rec);

    size_t n;
    near_centres(c, g, 6000, q);
    uint8_t *img = roundtrip(ix, q, g, k, &n, "hnsw");
    test_hostile_common(img, n, 40, "hnsw");
    /* graph fields: offsets, levels, links, entry point */
    size_t off_keys = 128, off_lev = (off_keys + (size_t)c->n * c->d * 4 + 63) / 64 * 64;
    size_t off_off = (off_lev + (size_t)c->n * 4 + 63) / 64 * 64;
    size_t off_nb = (off_off + (size_t)(c->n + 1) * 8 + 63) / 64 * 64;
    int32_t v32;
    uint64_t v64;
    v32 = 0; CHECK(loads_with(img, n, off_lev + 8, &v32, 4) == -1, "hnsw: level 0 accepted");
    v32 = 99; CHECK(loads_with(img, n, off_lev + 8, &v32, 4) == -1, "hnsw: level 99 accepted");
    v64 = 3; CHECK(loads_with(img, n, off_off + 8, &v64, 8) == -1, "hnsw: bad offset accepted");
    v32 = (int32_t)c->n; CHECK(loads_with(img, n, off_nb + 4, &v32, 4) == -1, "hnsw: link out of range accepted");
    v32 = -3; CHECK(loads_with(img, n, off_nb + 4, &v32, 4) == -1, "hnsw: negative link accepted");
    v32 = (int32_t)c->n; CHECK(loads_with(img, n, 48 + 24, &v32, 4) == -1, "hnsw: entry point out of range accepted");
    v32 = 30; CHECK(loads_with(img, n, 48 + 20, &v32, 4) == -1, "hnsw: max level 30 accepted");
    float nan = NAN; CHECK(loads_with(img, n, off_keys + 12, &nan, 4) == -1, "hnsw: NaN key accepted");
    {   /* a level-0-only node linked from a level-1 list */
        int top = -1, low = -1;
        const int32_t *lev = (const int32_t *)(img + off_lev);
        for (int64_t i = 0; i < c->n && (top < 0 || low < 0); i++) {
            if (lev[i] >= 2 && top < 0) top = (int)i;
            if (lev[i] == 1 && low < 0) low = (int)i;
        }
        if (top >= 0 && low >= 0) {
            const uint64_t *offs = (const uint64_t *)(img + off_off);
            /* level 1 links start after the 2*M level-0 links */
            v32 = low;
            CHECK(loads_with(img, n, off_nb + (offs[top] + 2 * 16) * 4, &v32, 4) == -1,
                  "hnsw: level-1 link to a level-0 node accepted");
        }
    }
    free(img);
    free(all);
    free(sorted);
    idx_free(ix);
}

/* ---- parameters -------------------------------------------------------------------------- */

static void test_bad_params(void)
{
    char err[256];
    float keys[40 * 8];
    for (int i = 0; i < 40 * 8; i++) keys[i] = (float)((i * 7) % 13) - 6.0f;
    idx_index *ix = (idx_index *)1;
    idx_params p = idx_default_params();
#define REJECT(expr, what)                                                     \
    do {                                                                       \
        err[0] = 0;                                                            \
        ix = (idx_index *)1;                                                   \
        int rc_ = (expr);                                                      \
        CHECK(rc_ == -1 && ix == NULL && err[0], "%s accepted", what);         \
    } while (0)
    REJECT(idx_build(NULL, keys, 40, 8, &ix, err, sizeof err), "NULL params");
    REJECT(idx_build(&p, NULL, 40, 8, &ix, err, sizeof err), "NULL keys");
    REJECT(idx_build(&p, keys, 0, 8, &ix, err, sizeof err), "N = 0");
    REJECT(idx_build(&p, keys, 40, 0, &ix, err, sizeof err), "d = 0");
    REJECT(idx_build(&p, keys, 40, IDX_MAX_D + 1, &ix, err, sizeof err), "d too large");
    p.kind = "lsh";
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "kind lsh");
    p = idx_default_params();
    p.key_type = IDX_F32;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "exact f32 keys");
    p = idx_default_params();
    p.kind = "ivf";
    p.nlist = 41;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "nlist > N");
    p.nlist = 8;
    p.n_train = 4;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "n_train < nlist");
    p.n_train = 0;
    p.n_iter = -1;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "n_iter -1");
    p = idx_default_params();
    p.kind = "hnsw";
    p.hnsw_m = 1;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "hnsw_m 1");
    p = idx_default_params();
    p.n_threads = -2;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "n_threads -2");
    p = idx_default_params();
    keys[17] = INFINITY;
    REJECT(idx_build(&p, keys, 40, 8, &ix, err, sizeof err), "infinite key");
    keys[17] = 1.0f;
    REJECT(idx_deserialize(keys, sizeof keys, &ix, err, sizeof err), "garbage image");
    idx_index *ok = NULL;
    CHECK(idx_build(&p, keys, 40, 8, &ok, err, sizeof err) == 0, "%s", err);
    int32_t ids[70 * 4];
    float sc[70 * 4];
    CHECK(idx_search(ok, keys, 0, 5, NULL, NULL, ids, sc, err, sizeof err) == -1, "g = 0 accepted");
    CHECK(idx_search(ok, keys, IDX_MAX_G + 1, 1, NULL, NULL, ids, sc, err, sizeof err) == -1, "g too large accepted");
    CHECK(idx_search(ok, keys, 1, 0, NULL, NULL, ids, sc, err, sizeof err) == -1, "k = 0 accepted");
    CHECK(idx_search(ok, NULL, 1, 5, NULL, NULL, ids, sc, err, sizeof err) == -1, "NULL q accepted");
    idx_search_params bad = { .nprobe = -1 };
    CHECK(idx_search(ok, keys, 1, 5, &bad, NULL, ids, sc, err, sizeof err) == -1, "negative nprobe accepted");
    /* a NaN query scores nothing: all padding, no crash */
    float qn[8] = { NAN, 0, 0, 0, 0, 0, 0, 0 };
    CHECK(idx_search(ok, qn, 1, 5, NULL, NULL, ids, sc, err, sizeof err) == 0 && ids[0] == -1 && ids[4] == -1,
          "NaN query returns padding");
    idx_free(ok);
    idx_free(NULL);
    idx_scratch_free(NULL);
#undef REJECT
}

/* What a search reports it read, against sizes computed here from the
 * image's shape: every key of an exact index once (its row: d key values,
 * the int8 scale); for ivf with nprobe = nlist every centroid and bonus and
 * every key with its id; hnsw's figure is flagged as nominal. */
static void test_search_cost(void)
{
    const int d = 24, g = 3, k = 10;
    const int64_t n = 1000 + 7; /* a partial last block: padding is not counted */
    float *keys = gauss_matrix(n, d, 77), *q = gauss_matrix(g, d, 78);
    int32_t ids[3 * 10];
    float sc[3 * 10];
    char err[256];
    idx_scratch *s = idx_scratch_create();
    uint64_t bytes;
    int nominal;
    idx_scratch_cost(s, &bytes, &nominal);
    CHECK(bytes == 0 && nominal == 0, "no search yet: cost 0");
    const int kts[] = { IDX_F16, IDX_BF16, IDX_I8 };
    for (int i = 0; i < 3; i++) {
        idx_params p = idx_default_params();
        p.key_type = kts[i];
        idx_index *ix = NULL;
        CHECK(idx_build(&p, keys, n, d, &ix, err, sizeof err) == 0, "%s", err);
        if (!ix) continue;
        CHECK(idx_search(ix, q, g, k, NULL, s, ids, sc, err, sizeof err) == 0, "%s", err);
        idx_scratch_cost(s, &bytes, &nominal);
        const uint64_t row = (uint64_t)d * (kts[i] == IDX_I8 ? 1 : 2) + (kts[i] == IDX_I8 ? 4 : 0);
        CHECK(bytes == (uint64_t)n * row && !nominal, "exact kt %d: %llu bytes, expected %llu", kts[i],
              (unsigned long long)bytes, (unsigned long long)(n * row));
        idx_free(ix);

        p.kind = "ivf";
        p.nlist = 20;
        CHECK(idx_build(&p, keys, n, d, &ix, err, sizeof err) == 0, "%s", err);
        if (!ix) continue;
        idx_search_params sp = { 20, 0, 0 };
        CHECK(idx_search(ix, q, g, k, &sp, s, ids, sc, err, sizeof err) == 0, "%s", err);
        idx_scratch_cost(s, &bytes, &nominal);
        const uint64_t want = 20ull * (4 * d + 4) + (uint64_t)n * (row + 4);
        CHECK(bytes == want && !nominal, "ivf kt %d, all lists: %llu bytes, expected %llu", kts[i],
              (unsigned long long)bytes, (unsigned long long)want);
        /* one probe per query: between one list and g lists' keys */
        sp.nprobe = 1;
        CHECK(idx_search(ix, q, 1, k, &sp, s, ids, sc, err, sizeof err) == 0, "%s", err);
        idx_scratch_cost(s, &bytes, &nominal);
        int64_t biggest = 0;
        for (int l = 0; l < ix->nlist; l++) biggest = ix->list_n[l] > biggest ? ix->list_n[l] : biggest;
        CHECK(bytes > 20ull * (4 * d + 4) && bytes <= 20ull * (4 * d + 4) + (uint64_t)biggest * (row + 4),
              "ivf one probe: %llu bytes", (unsigned long long)bytes);
        idx_free(ix);
    }
#ifdef SPARQ_HAVE_FAISS
    idx_params p = idx_default_params();
    p.kind = "hnsw";
    idx_index *ix = NULL;
    CHECK(idx_build(&p, keys, n, d, &ix, err, sizeof err) == 0, "%s", err);
    if (ix) {
        CHECK(idx_search(ix, q, g, k, NULL, s, ids, sc, err, sizeof err) == 0, "%s", err);
        idx_scratch_cost(s, &bytes, &nominal);
        CHECK(nominal == 1 && bytes == (uint64_t)g * 64 * 2 * 16 * (4 * d + 4), "hnsw: nominal %d, %llu bytes",
              nominal, (unsigned long long)bytes);
    }
    idx_free(ix);
#endif
    idx_scratch_free(s);
    free(keys);
    free(q);
}

/* The registry: names, lookup, and that every listed kind builds or says
 * why it cannot. */
static void test_registry(void)
{
    char names[128];
    CHECK(strcmp(idx_kind_names(names, sizeof names, ","), "exact,ivf,hnsw") == 0, "names: %s", names);
    CHECK(idx_kind_count() == 3, "three kinds");
    for (int i = 0; i < idx_kind_count(); i++) {
        const idx_kind_ops *k = idx_kind_at(i);
        CHECK(k && idx_kind_find(k->name) == k, "find %s", k ? k->name : "?");
    }
    CHECK(idx_kind_at(3) == NULL && idx_kind_find("sparq") == NULL && idx_kind_find(NULL) == NULL, "unknown kinds");
    float keys[4 * 8] = { 0 };
    idx_params p = idx_default_params();
    p.kind = "nope";
    idx_index *ix = NULL;
    char err[256];
    CHECK(idx_build(&p, keys, 4, 8, &ix, err, sizeof err) == -1 && strstr(err, "unknown index kind 'nope' (exact|ivf|hnsw)"),
          "unknown kind message: %s", err);
}

int main(void)
{
    test_block_kernels();
    test_push16();
    test_assign_kernel();
    test_pack();
    test_exact();
    test_ivf_full_probe_is_exact();
    clustered c = make_clustered(test_quick() ? 10000 : 20000, 64, 64, 1.0f, 4242);
    idx_index *ivf = NULL;
    test_ivf_recall_and_determinism(&c, &ivf);
    if (ivf) test_serialization(&c, ivf);
    idx_free(ivf);
    test_hnsw(&c);
    test_bad_params();
    test_search_cost();
    test_registry();
    free(c.keys);
    free(c.centres);
    return test_summary("test_index");
}
