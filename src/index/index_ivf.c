/* index_ivf.c - the inverted-file index: k-means over a sample of the whole
 * prefix, one inverted list per centroid, probe-then-scan search.
 *
 * Map:
 *   assign kernels   idx_assign (its _ref in index_ref.c): nearest centroid of many rows
 *   k-means          uniform sample (selection sampling), k-means++ seeding,
 *                    Lloyd iterations with empty clusters re-seeded
 *   build            assign every key, lay the lists out block by block
 *   check            validation of a loaded image (lists, ids)
 *   search           rank lists by q . centroid, scan the union of probes
 *                    (counting the bytes read: centroids, bonuses, keys)
 *
 * Image: header, centroids f32 [ceil(nlist/16)][d][16], list_off i64
 * [nlist+1], list_n i64 [nlist], list_bonus f32 [nlist], ids i32
 * [n_blocks*16], then the key sections index_scan.c lays out (index.h).
 * Only implements the methods of idx_kind_ivf.
 *
 * Why L2 clustering for an inner-product search: max-inner-product
 * assignment collapses keys onto the few centroids of largest norm; L2
 * lists are compact, and q . centroid is then the mean score of a list,
 * which is what probing should rank by.
 */
#include "util/err.h"
#include "index/index.h"
#include "util/rng.h"

#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define ASSIGN_CHUNK 256  /* rows per parallel work item in assignment */

/* ---- assign kernels ------------------------------------------------------------ */


void idx_assign(const float *x, int64_t n, int d, const float *c, const float *hn, int nc,
                int32_t *label, float *best)
{
    idx_kernels_at(cpu_level_get())->assign(x, n, d, c, hn, nc, label, best);
}

/* Assigns rows [n][d] in parallel chunks. */
static void assign_par(const float *x, int64_t n, int d, const float *cb, const float *hn, int nc,
                       int32_t *label, float *best, int nt)
{
    int64_t nch = (n + ASSIGN_CHUNK - 1) / ASSIGN_CHUNK;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 4) if (nt > 1 && nch > 1)
    for (int64_t ch = 0; ch < nch; ch++) {
        int64_t i0 = ch * ASSIGN_CHUNK, len = n - i0 < ASSIGN_CHUNK ? n - i0 : ASSIGN_CHUNK;
        idx_assign(x + i0 * d, len, d, cb, hn, nc, label + i0, best + i0);
    }
}

/* ---- k-means ------------------------------------------------------------------------- */

static double uniform01(uint64_t *s) { return (double)(rng_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }

/* Knuth's selection sampling: m of N rows, each subset equally likely, in
 * increasing order, one pass, no memory - and spread over the whole prefix
 * (the paper's code trained on the first 100k keys only). */
static void sample_rows(int64_t N, int64_t m, uint64_t *rng, int64_t *out)
{
    int64_t got = 0;
    for (int64_t i = 0; i < N && got < m; i++)
        if ((double)(N - i) * uniform01(rng) < (double)(m - got)) out[got++] = i;
}

/* Blocks row-major centroids [nc][d] into cb [ceil(nc/16)][d][16] with hn =
 * |c|^2/2 (+INF for padding slots so they never win). */
static void block_centroids(const float *c, int nc, int d, float *cb, float *hn)
{
    int64_t ncb = (nc + IDX_BLOCK - 1) / IDX_BLOCK;
    memset(cb, 0, (size_t)ncb * d * IDX_BLOCK * sizeof(float));
    idx_pack_rows(IDX_F32, c, nc, d, cb, NULL);
    for (int64_t k = 0; k < ncb * IDX_BLOCK; k++) {
        if (k >= nc) {
            hn[k] = INFINITY;
            continue;
        }
        double s = 0.0;
        for (int j = 0; j < d; j++) s += (double)c[k * d + j] * c[k * d + j];
        hn[k] = (float)(0.5 * s);
    }
}

typedef struct kmeans {
    int64_t nt;       /* sample rows                          */
    int     d, nc;
    float  *x;        /* [nt][d] sample                       */
    float  *xb;       /* [ceil(nt/16)][d][16] sample, blocked */
    float  *xn;       /* [nt] |x|^2                           */
    float  *dist;     /* [nt] squared distance to nearest     */
    float  *c;        /* [nc][d] centroids                    */
    float  *cb, *hn;  /* blocked centroids, |c|^2/2           */
    int32_t *lab;     /* [nt]                                 */
    float  *best;     /* [nt]                                 */
    double *sum;      /* [nc][d]                              */
    int64_t *cnt;     /* [nc]                                 */
    float  *ts;       /* [nt] selection scratch               */
    int32_t *ti;      /* [nt]                                 */
} kmeans;

/* dist[i] = min(dist[i], |x_i - c|^2) over the blocked sample. */
static void update_dist(kmeans *km, const float *c, int nt_thr)
{
    double cn = 0.0;
    for (int j = 0; j < km->d; j++) cn += (double)c[j] * c[j];
    int64_t nb = (km->nt + IDX_BLOCK - 1) / IDX_BLOCK;
#pragma omp parallel for num_threads(nt_thr) schedule(static) if (nt_thr > 1 && nb >= 1024)
    for (int64_t b = 0; b < nb; b++) {
        float dot[IDX_BLOCK];
        idx_block_scores(IDX_F32, km->xb + (size_t)b * km->d * IDX_BLOCK, NULL, km->d, c, 1, dot);
        for (int r = 0; r < IDX_BLOCK && b * IDX_BLOCK + r < km->nt; r++) {
            int64_t i = b * IDX_BLOCK + r;
            float e = km->xn[i] - 2.0f * dot[r] + (float)cn;
            if (e < 0.0f) e = 0.0f; /* cancellation */
            if (e < km->dist[i]) km->dist[i] = e;
        }
    }
}

/* k-means++: each next centroid is a sample row drawn with probability
 * proportional to its squared distance to the nearest centroid so far. */
static void kmeans_pp(kmeans *km, uint64_t *rng, int nt_thr)
{
    int64_t first = (int64_t)(rng_splitmix64(rng) % (uint64_t)km->nt);
    memcpy(km->c, km->x + first * km->d, (size_t)km->d * sizeof(float));
    for (int64_t i = 0; i < km->nt; i++) km->dist[i] = INFINITY;
    update_dist(km, km->c, nt_thr);
    for (int k = 1; k < km->nc; k++) {
        double total = 0.0;
        for (int64_t i = 0; i < km->nt; i++) total += km->dist[i];
        int64_t pick = km->nt - 1;
        if (total > 0.0) {
            double r = uniform01(rng) * total, acc = 0.0;
            for (int64_t i = 0; i < km->nt; i++) {
                acc += km->dist[i];
                if (acc > r) {
                    pick = i;
                    break;
                }
            }
        } else { /* every row already coincides with a centroid */
            pick = (int64_t)(rng_splitmix64(rng) % (uint64_t)km->nt);
        }
        float *ck = km->c + (size_t)k * km->d;
        memcpy(ck, km->x + pick * km->d, (size_t)km->d * sizeof(float));
        update_dist(km, ck, nt_thr);
    }
}

/* One Lloyd step: assign, then move each centroid to its rows' mean. The
 * empty clusters take the sample rows farthest from their centroids (the
 * E farthest for E empty clusters, found in one selection). */
static void lloyd_step(kmeans *km, int nt_thr)
{
    int d = km->d;
    block_centroids(km->c, km->nc, d, km->cb, km->hn);
    assign_par(km->x, km->nt, d, km->cb, km->hn, km->nc, km->lab, km->best, nt_thr);
    memset(km->sum, 0, (size_t)km->nc * d * sizeof(double));
    memset(km->cnt, 0, (size_t)km->nc * sizeof(int64_t));
    /* sequential sums: the same result for every thread count */
    for (int64_t i = 0; i < km->nt; i++) {
        int32_t l = km->lab[i];
        km->cnt[l]++;
        for (int j = 0; j < d; j++) km->sum[(size_t)l * d + j] += km->x[i * d + j];
    }
    int64_t n_empty = 0;
    for (int k = 0; k < km->nc; k++) {
        float *ck = km->c + (size_t)k * d;
        if (km->cnt[k] == 0) {
            n_empty++;
            continue;
        }
        for (int j = 0; j < d; j++) ck[j] = (float)(km->sum[(size_t)k * d + j] / (double)km->cnt[k]);
    }
    if (n_empty == 0) return;
    for (int64_t i = 0; i < km->nt; i++) {
        km->ts[i] = km->xn[i] - 2.0f * km->best[i]; /* |x - c|^2 */
        km->ti[i] = (int32_t)i;
    }
    idx_select(km->ts, km->ti, km->nt, n_empty);
    int64_t e = 0;
    for (int k = 0; k < km->nc; k++)
        if (km->cnt[k] == 0)
            memcpy(km->c + (size_t)k * d, km->x + (int64_t)km->ti[e++] * d, (size_t)d * sizeof(float));
}

static void kmeans_free(kmeans *km)
{
    free(km->x); free(km->xb); free(km->xn); free(km->dist); free(km->c);
    free(km->cb); free(km->hn); free(km->lab); free(km->best); free(km->sum); free(km->cnt);
    free(km->ts); free(km->ti);
}

/* Trains kp->nc centroids on kp->n_train rows sampled from keys [N][d]; leaves the
 * final blocked centroids in km->cb / km->hn. */
static int kmeans_train(kmeans *km, const float *keys, int64_t N, int d, const idx_kmeans_params *kp,
                        char *err, size_t err_size)
{
    const int nc = kp->nc, n_iter = kp->n_iter, nt_thr = kp->n_threads;
    const int64_t n_train = kp->n_train;
    memset(km, 0, sizeof *km);
    km->nt = n_train;
    km->d = d;
    km->nc = nc;
    int64_t nxb = (n_train + IDX_BLOCK - 1) / IDX_BLOCK * IDX_BLOCK;
    int64_t ncb = (nc + IDX_BLOCK - 1) / IDX_BLOCK * IDX_BLOCK;
    km->x = malloc((size_t)n_train * d * sizeof(float));
    km->xb = calloc((size_t)nxb * d, sizeof(float));
    km->xn = malloc((size_t)n_train * sizeof(float));
    km->dist = malloc((size_t)n_train * sizeof(float));
    km->c = malloc((size_t)nc * d * sizeof(float));
    km->cb = malloc((size_t)ncb * d * sizeof(float));
    km->hn = malloc((size_t)ncb * sizeof(float));
    km->lab = malloc((size_t)n_train * sizeof(int32_t));
    km->best = malloc((size_t)n_train * sizeof(float));
    km->sum = malloc((size_t)nc * d * sizeof(double));
    km->cnt = malloc((size_t)nc * sizeof(int64_t));
    km->ts = malloc((size_t)n_train * sizeof(float));
    km->ti = malloc((size_t)n_train * sizeof(int32_t));
    int64_t *rows = malloc((size_t)n_train * sizeof(int64_t));
    if (!km->x || !km->xb || !km->xn || !km->dist || !km->c || !km->cb || !km->hn || !km->lab ||
        !km->best || !km->sum || !km->cnt || !km->ts || !km->ti || !rows) {
        free(rows);
        return err_set(err, err_size, "idx_build: out of memory for k-means on %lld x %d keys",
                    (long long)n_train, d);
    }
    uint64_t rng = kp->seed;
    sample_rows(N, n_train, &rng, rows);
    for (int64_t i = 0; i < n_train; i++) {
        memcpy(km->x + i * d, keys + rows[i] * d, (size_t)d * sizeof(float));
        double s = 0.0;
        for (int j = 0; j < d; j++) s += (double)km->x[i * d + j] * km->x[i * d + j];
        km->xn[i] = (float)s;
    }
    free(rows);
    idx_pack_rows(IDX_F32, km->x, n_train, d, km->xb, NULL);
    kmeans_pp(km, &rng, nt_thr);
    for (int it = 0; it < n_iter; it++) lloyd_step(km, nt_thr);
    block_centroids(km->c, nc, d, km->cb, km->hn);
    return 0;
}

int idx_ivf_centroids(const float *keys, int64_t N, int d, const idx_kmeans_params *kp, float *cb, float *hn,
                      char *err, size_t err_size)
{
    const int nc = kp->nc;
    const int64_t n_train = kp->n_train;
    if (N < 1 || d < 1 || d > IDX_MAX_D || nc < 1 || nc > N || n_train < nc || n_train > N || kp->n_iter < 0)
        return err_set(err, err_size, "idx_ivf_centroids: bad sizes (%lld keys, %d lists, %lld samples)",
                       (long long)N, nc, (long long)n_train);
    idx_kmeans_params run = *kp;
    run.n_threads = idx_threads(kp->n_threads);
    kmeans km;
    int rc = kmeans_train(&km, keys, N, d, &run, err, err_size);
    if (rc == 0) {
        const int64_t ncb = (nc + IDX_BLOCK - 1) / IDX_BLOCK * IDX_BLOCK;
        memcpy(cb, km.cb, (size_t)ncb * d * sizeof(float));
        memcpy(hn, km.hn, (size_t)ncb * sizeof(float));
    }
    kmeans_free(&km);
    return rc;
}

/* ---- the image ----------------------------------------------------------------------- */

/* Section offsets: centroids, list_off, list_n, ids, list_bonus, keys,
 * scales (the order of the bytes: centroids, offsets, counts, bonuses,
 * ids, keys, scales); -1 on overflow. */
enum { S_CENT, S_LOFF, S_LN, S_IDS, S_BONUS, S_KEYS, S_SCALES, N_SECT };

static int ivf_layout(const idx_header *h, size_t off[N_SECT], size_t *total)
{
    size_t end = IDX_HEADER_BYTES;
    memset(off, 0, N_SECT * sizeof off[0]);
    if (h->nlist < 1 || h->d < 1 || h->d > IDX_MAX_D) return -1;
    const int64_t ncb = ((int64_t)h->nlist + 15) / 16;
    if (idx_section(&end, ncb, (size_t)h->d * IDX_BLOCK * 4, &off[S_CENT]) ||
        idx_section(&end, (int64_t)h->nlist + 1, 8, &off[S_LOFF]) ||
        idx_section(&end, h->nlist, 8, &off[S_LN]) ||
        idx_section(&end, h->nlist, 4, &off[S_BONUS]) ||
        idx_section(&end, h->n_blocks, IDX_BLOCK * 4, &off[S_IDS]) ||
        idx_keys_layout(h, &end, &off[S_KEYS], &off[S_SCALES]))
        return -1;
    return idx_image_end(end, total);
}

/* ---- build ------------------------------------------------------------------------------ */

/* bonus[l] = sigma_l * sqrt(2 ln(n_l + 1)): sigma_l^2 is the mean squared
 * distance to the centroid per dimension (|x - c|^2 = |x|^2 - 2 best, best
 * from the assignment), and sigma * sqrt(2 ln n) approximates how far the
 * largest of n Gaussian scores lies above their mean - per unit |q|. */
static int list_spread(const float *keys, int64_t N, int d, const int32_t *lab, const float *best,
                       const int64_t *cnt, int nlist, float *bonus)
{
    double *ss = calloc((size_t)nlist, sizeof(double));
    if (!ss) return -1;
    for (int64_t i = 0; i < N; i++) {
        double xn = 0.0;
        for (int j = 0; j < d; j++) xn += (double)keys[i * d + j] * keys[i * d + j];
        double e = xn - 2.0 * best[i];
        ss[lab[i]] += e > 0.0 ? e : 0.0;
    }
    for (int l = 0; l < nlist; l++) {
        double sigma = cnt[l] ? sqrt(ss[l] / ((double)cnt[l] * d)) : 0.0;
        bonus[l] = (float)(sigma * sqrt(2.0 * log((double)cnt[l] + 1.0)));
    }
    free(ss);
    return 0;
}

static int ivf_load(idx_index *ix, const idx_header *h, const uint8_t *img, size_t n, char *err,
                    size_t err_size);

static int ivf_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index *ix,
                  char *err, size_t err_size)
{
    int nlist = p->nlist > 0 ? p->nlist : (int)llround(sqrt((double)N));
    if (nlist < 1) nlist = 1;
    if (nlist > N) nlist = (int)N;
    int nprobe = p->nprobe > 0 ? p->nprobe : (nlist / 16 > 8 ? nlist / 16 : 8);
    if (nprobe > nlist) nprobe = nlist;
    int64_t n_train = p->n_train > 0 ? p->n_train : (40 * (int64_t)nlist < N ? 40 * (int64_t)nlist : N);
    int nt_thr = idx_threads(p->n_threads);

    kmeans km;
    int32_t *lab = malloc((size_t)N * sizeof(int32_t));
    float *best = malloc((size_t)N * sizeof(float));
    int64_t *fill = calloc((size_t)nlist, sizeof(int64_t));
    float *tmp = malloc((size_t)nt_thr * IDX_BLOCK * d * sizeof(float));
    uint8_t *img = NULL;
    int rc = -1;
    if (!lab || !best || !fill || !tmp) {
        err_set(err, err_size, "idx_build: out of memory for ivf assignment of %lld keys", (long long)N);
        memset(&km, 0, sizeof km);
        goto done;
    }
    const float *cent; /* row-major [nlist][d] */
    if (p->centroids && p->labels) { /* lists given: best = x . c - |c|^2 / 2, as the assignment's */
        memset(&km, 0, sizeof km);
        cent = p->centroids;
        for (int64_t i = 0; i < N; i++) {
            const int32_t l = p->labels[i];
            if (l < 0 || l >= nlist) {
                err_set(err, err_size, "idx_build: key %lld is in list %d of %d", (long long)i, l, nlist);
                goto done;
            }
            double dot = 0, cc = 0;
            for (int j = 0; j < d; j++) {
                dot += (double)keys[i * d + j] * cent[(int64_t)l * d + j];
                cc += (double)cent[(int64_t)l * d + j] * cent[(int64_t)l * d + j];
            }
            lab[i] = l;
            best[i] = (float)(dot - 0.5 * cc);
        }
    } else {
        const idx_kmeans_params kp = {
            .nc = nlist, .n_train = n_train, .n_iter = p->n_iter, .seed = p->seed, .n_threads = nt_thr};
        if (kmeans_train(&km, keys, N, d, &kp, err, err_size)) goto done;
        assign_par(keys, N, d, km.cb, km.hn, nlist, lab, best, nt_thr);
        cent = km.c;
    }

    /* lists: keys per list, then block offsets */
    for (int64_t i = 0; i < N; i++) fill[lab[i]]++;
    int64_t n_blocks = 0;
    for (int l = 0; l < nlist; l++) n_blocks += (fill[l] + IDX_BLOCK - 1) / IDX_BLOCK;
    idx_header h = { .kind = IDX_IVF, .key_type = (uint32_t)p->key_type, .d = (uint32_t)d, .n = N,
                     .n_blocks = n_blocks, .nlist = nlist, .nprobe = nprobe };
    size_t off[N_SECT], total;
    if (ivf_layout(&h, off, &total)) {
        err_set(err, err_size, "idx_build: index of %lld keys x %d does not fit in memory", (long long)N, d);
        goto done;
    }
    img = idx_image_alloc(&h, total, err, err_size);
    if (!img) goto done;
    int64_t *list_off = (int64_t *)(img + off[S_LOFF]), *list_n = (int64_t *)(img + off[S_LN]);
    int32_t *ids = (int32_t *)(img + off[S_IDS]);
    float *bonus = (float *)(img + off[S_BONUS]);
    if (list_spread(keys, N, d, lab, best, fill, nlist, bonus)) {
        err_set(err, err_size, "idx_build: out of memory for %d list statistics", nlist);
        goto done;
    }
    list_off[0] = 0;
    for (int l = 0; l < nlist; l++) {
        list_n[l] = fill[l];
        list_off[l + 1] = list_off[l] + (fill[l] + IDX_BLOCK - 1) / IDX_BLOCK;
        fill[l] = 0;
    }
    for (int64_t s = 0; s < n_blocks * IDX_BLOCK; s++) ids[s] = -1;
    for (int64_t i = 0; i < N; i++) { /* ascending positions within a list */
        int32_t l = lab[i];
        ids[list_off[l] * IDX_BLOCK + fill[l]++] = (int32_t)i;
    }
    idx_pack_rows(IDX_F32, cent, nlist, d, img + off[S_CENT], NULL);

    /* keys: gather each block's rows, then pack them in place */
    size_t bb = (size_t)d * IDX_BLOCK * idx_elt_bytes(p->key_type);
    float *scales = p->key_type == IDX_I8 ? (float *)(img + off[S_SCALES]) : NULL;
#pragma omp parallel for num_threads(nt_thr) schedule(static) if (nt_thr > 1)
    for (int64_t b = 0; b < n_blocks; b++) {
        float *t = tmp + (size_t)omp_get_thread_num() * IDX_BLOCK * d;
        int r = 0;
        for (; r < IDX_BLOCK && ids[b * IDX_BLOCK + r] >= 0; r++)
            memcpy(t + (size_t)r * d, keys + (int64_t)ids[b * IDX_BLOCK + r] * d, (size_t)d * sizeof(float));
        idx_pack_rows(p->key_type, t, r, d, img + off[S_KEYS] + (size_t)b * bb, scales ? scales + b * IDX_BLOCK : NULL);
    }
    ix->owned = img;
    ix->image = img;
    ix->image_bytes = total;
    img = NULL;
    rc = ivf_load(ix, &h, ix->owned, total, err, err_size);
done:
    kmeans_free(&km);
    free(lab);
    free(best);
    free(fill);
    free(tmp);
    free(img);
    return rc;
}

/* ---- validation of a loaded image --------------------------------------------------------- */

static int ivf_check_lists(const idx_index *ix, char *err, size_t err_size)
{
    const int64_t *lo = ix->list_off, *ln = ix->list_n;
    if (lo[0] != 0) return err_set(err, err_size, "idx_deserialize: ivf list 0 starts at block %lld", (long long)lo[0]);
    int64_t total = 0;
    for (int l = 0; l < ix->nlist; l++) {
        if (lo[l + 1] < lo[l] || lo[l + 1] > ix->n_blocks)
            return err_set(err, err_size, "idx_deserialize: ivf list %d spans blocks [%lld, %lld) of %lld", l,
                        (long long)lo[l], (long long)lo[l + 1], (long long)ix->n_blocks);
        if (ln[l] < 0 || ln[l] > ix->n || (ln[l] + IDX_BLOCK - 1) / IDX_BLOCK != lo[l + 1] - lo[l])
            return err_set(err, err_size, "idx_deserialize: ivf list %d has %lld keys in %lld blocks", l,
                        (long long)ln[l], (long long)(lo[l + 1] - lo[l]));
        total += ln[l];
    }
    if (lo[ix->nlist] != ix->n_blocks)
        return err_set(err, err_size, "idx_deserialize: ivf lists end at block %lld, index has %lld",
                    (long long)lo[ix->nlist], (long long)ix->n_blocks);
    if (total != ix->n)
        return err_set(err, err_size, "idx_deserialize: ivf lists hold %lld keys, index has %lld",
                    (long long)total, (long long)ix->n);
    for (int l = 0; l < ix->nlist; l++)
        if (!(ix->list_bonus[l] >= 0.0f && ix->list_bonus[l] < INFINITY))
            return err_set(err, err_size, "idx_deserialize: ivf list %d has probe bonus %g", l,
                        (double)ix->list_bonus[l]);
    /* every position exactly once, padding -1: the lists are a partition */
    uint8_t *seen = calloc((size_t)(ix->n + 7) / 8, 1);
    if (!seen) return err_set(err, err_size, "idx_deserialize: out of memory checking %lld ids", (long long)ix->n);
    int rc = 0;
    for (int l = 0; l < ix->nlist && rc == 0; l++)
        for (int64_t s = lo[l] * IDX_BLOCK; s < lo[l + 1] * IDX_BLOCK; s++) {
            int32_t id = ix->ids[s];
            int pad = s - lo[l] * IDX_BLOCK >= ln[l];
            if (pad ? id != -1 : (id < 0 || id >= ix->n || (seen[id >> 3] >> (id & 7) & 1))) {
                rc = err_set(err, err_size, "idx_deserialize: ivf slot %lld of list %d holds bad id %d",
                          (long long)s, l, id);
                break;
            }
            if (!pad) seen[id >> 3] |= (uint8_t)(1u << (id & 7));
        }
    free(seen);
    return rc;
}

static int ivf_load(idx_index *ix, const idx_header *h, const uint8_t *img, size_t n, char *err,
                    size_t err_size)
{
    size_t off[N_SECT], total = 0;
    if (idx_keys_check(h, err, err_size)) return -1;
    const int64_t min_blocks = (h->n + IDX_BLOCK - 1) / IDX_BLOCK;
    if (h->nlist < 1 || h->nlist > h->n)
        return err_set(err, err_size, "idx_deserialize: nlist %d outside [1, %lld]", h->nlist, (long long)h->n);
    if (h->nprobe < 1 || h->nprobe > h->nlist)
        return err_set(err, err_size, "idx_deserialize: nprobe %d outside [1, %d]", h->nprobe, h->nlist);
    if (h->n_blocks < min_blocks || h->n_blocks > min_blocks + h->nlist)
        return err_set(err, err_size, "idx_deserialize: %lld blocks for %lld keys in %d lists",
                       (long long)h->n_blocks, (long long)h->n, h->nlist);
    if (ivf_layout(h, off, &total) != 0 || total != n)
        return err_set(err, err_size, "idx_deserialize: sections need %zu bytes, buffer has %zu", total, n);
    idx_keys_bind(ix, h, img, off[S_KEYS], off[S_SCALES]);
    ix->nlist = h->nlist;
    ix->nprobe = h->nprobe;
    ix->centroids = (const float *)(img + off[S_CENT]);
    ix->list_off = (const int64_t *)(img + off[S_LOFF]);
    ix->list_n = (const int64_t *)(img + off[S_LN]);
    ix->ids = (const int32_t *)(img + off[S_IDS]);
    ix->list_bonus = (const float *)(img + off[S_BONUS]);
    return ivf_check_lists(ix, err, err_size);
}

static int ivf_check(const idx_params *p, int64_t N, char *err, size_t err_size)
{
    if (idx_keys_param_check(p, err, err_size)) return -1;
    if (p->nlist < 0 || p->nlist > N)
        return err_set(err, err_size, "idx_build: nlist %d outside [0, %lld]", p->nlist, (long long)N);
    if (p->nprobe < 0) return err_set(err, err_size, "idx_build: nprobe %d is negative", p->nprobe);
    if (!p->centroids != !p->labels || (p->centroids && p->nlist < 1))
        return err_set(err, err_size, "idx_build: given lists need centroids, labels and nlist");
    if (p->n_iter < 0 || p->n_iter > 1000)
        return err_set(err, err_size, "idx_build: n_iter %d outside [0, 1000]", p->n_iter);
    if (p->n_train < 0 || p->n_train > N)
        return err_set(err, err_size, "idx_build: n_train %lld outside [0, %lld]",
                       (long long)p->n_train, (long long)N);
    if (p->n_train > 0 && p->n_train < p->nlist)
        return err_set(err, err_size, "idx_build: n_train %lld is below nlist %d",
                       (long long)p->n_train, p->nlist);
    return 0;
}

/* ---- search ------------------------------------------------------------------------------- */

/* Range u of a search: the u-th list of the probed union (ctx: list ids). */
static void ivf_range(const idx_index *ix, const void *ctx, int64_t u, int64_t *b0, int64_t *b1,
                      int64_t *n_rows)
{
    const int l = ((const int32_t *)ctx)[u];
    *b0 = ix->list_off[l];
    *b1 = ix->list_off[l + 1];
    *n_rows = ix->list_n[l];
}

static int ivf_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
                      int n_thr, idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    (void)err; (void)err_size;
    int d = ix->d, nlist = ix->nlist;
    int nprobe = sp->nprobe ? sp->nprobe : ix->nprobe;
    if (nprobe > nlist) nprobe = nlist;
    int64_t ncb = (nlist + IDX_BLOCK - 1) / IDX_BLOCK, nl = ncb * IDX_BLOCK;
    /* read, counted by the loops: each centroid once for the group (the
     * padding slots of the last block excluded, as for keys), each list's
     * bonus once (the first query's pass; the others find it in cache) */
    uint64_t n_cent = 0, n_bonus = 0;
    for (int64_t b = 0; b < ncb; b++) {
        idx_block_scores(IDX_F32, ix->centroids + (size_t)b * d * IDX_BLOCK, NULL, d, q, g, s->blk);
        for (int h = 0; h < g; h++)
            memcpy(s->cs + h * nl + b * IDX_BLOCK, s->blk + h * IDX_BLOCK, IDX_BLOCK * sizeof(float));
        n_cent += (uint64_t)(nlist - b * IDX_BLOCK < IDX_BLOCK ? nlist - b * IDX_BLOCK : IDX_BLOCK);
    }
    /* each query's best nprobe lists; the group scans their union once */
    memset(s->lmark, 0, (size_t)nlist);
    for (int h = 0; h < g; h++) {
        double qq = 0.0;
        for (int j = 0; j < d; j++) qq += (double)q[h * d + j] * q[h * d + j];
        float qn = (float)sqrt(qq);
        int l;
        for (l = 0; l < nlist; l++) {
            s->ls[l] = s->cs[h * nl + l] + qn * ix->list_bonus[l];
            s->li[l] = l;
        }
        if (h == 0) n_bonus = (uint64_t)l;
        idx_select(s->ls, s->li, nlist, nprobe);
        for (int r = 0; r < nprobe; r++) s->lmark[s->li[r]] = 1;
    }
    int nu = 0;
    for (int l = 0; l < nlist; l++)
        if (s->lmark[l]) s->li[nu++] = l;
    s->cost_bytes = n_cent * 4 * (uint64_t)d + n_bonus * 4;
    const idx_ranges lists = {.n = nu, .at = ivf_range, .ctx = s->li};
    idx_scan_ranges(ix, q, g, k, &lists, n_thr, s, ids, scores);
    return 0;
}

const idx_kind_ops idx_kind_ivf = {
    .name = "ivf",
    .id = IDX_IVF,
    .in_place = 1,
    .check = ivf_check,
    .build = ivf_build,
    .load = ivf_load,
    .serialized_size = NULL, /* the image itself */
    .serialize = NULL,
    .reserve = idx_blocked_reserve,
    .search = ivf_search,
    .release = NULL,
};
