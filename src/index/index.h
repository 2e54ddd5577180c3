/* index.h - top-k maximum-inner-product search over the keys of ONE
 * (layer, kv_head) prefix (docs/ALGORITHMS.md "Top-k attention over a key index").
 *
 * An index holds its own copy of N keys of dimension d (built from f32 keys
 * [N][d]) and answers, for g query vectors at once (one GQA group), the k
 * positions i with the largest q_h . k_i and those scores. One pass over the
 * keys serves the whole group, so a key's bytes are read once per group and
 * not once per query head.
 *
 * Files: index.c (the kinds' registry, the entry points below, the image
 * reader, scratch), index_common.c (what every kind calls: the image
 * framing, threads, scratch growth), index_scan.c (the block scan and
 * kernel dispatch shared by the blocked kinds) over index_ref.c (the
 * kernels' plain-C references) and index_topk.c (the top-k buffers), one
 * file per kind implementing the methods
 * table idx_kind_ops: index_exact.c, index_ivf.c, index_hnsw.c (+ the Faiss
 * shim index_hnsw_faiss.cc). Kind files never call each other.
 *
 * Kinds:
 *   exact  every key is scored. Keys are stored as f16, bf16 or int8 with a
 *          per-row f32 scale (score = scale_i * sum_j q_j * k_ij); the scan is
 *          split over OpenMP threads, each keeps its own top-k candidates, then
 *          they are merged.
 *   ivf    k-means (k-means++ seeding, Lloyd iterations, L2) over a uniform
 *          sample of the WHOLE prefix; every key goes to its nearest centroid's
 *          inverted list. A query ranks lists by the score it expects of a
 *          list's best key: q . c_l + |q| * bonus_l, with bonus_l = sigma_l *
 *          sqrt(2 ln(n_l + 1)) (sigma_l: the list's RMS spread per dimension;
 *          the expected maximum of n_l Gaussian scores). On hard data this
 *          lifts recall by 0.05-0.15 at equal nprobe over ranking by q . c_l
 *          alone. The union over the g queries of each query's best nprobe
 *          lists is scanned once, and EVERY query gets exact scores for every
 *          key of that union (so a query may see keys of lists another query of
 *          the group probed: that only adds true candidates). nprobe = nlist is
 *          the exact search over the same key precision.
 *          Defaults: nlist = round(sqrt(N)); nprobe = max(8, nlist / 16);
 *          n_train = min(N, 40 * nlist); n_iter = 10. Recall@100 of one query
 *          at the defaults (d = 64): 1.00 on the test set (20000 keys around
 *          64 Gaussian centres, spread 1; tests/test_index.c asserts >= 0.9),
 *          ~0.98 with spread 2, ~0.73 for 100000 keys in 256 overlapping
 *          clusters, ~0.35 on isotropic Gaussian keys (no structure: no
 *          inverted file does well there; raise nprobe or use exact).
 *   hnsw   Faiss IndexHNSWFlat (f32 keys, inner product, M = 16) when the build
 *          has Faiss (SPARQ_HAVE_FAISS); otherwise idx_build fails with "hnsw
 *          index not built: Faiss not available". efSearch = max(ef_search, k).
 *
 * Results: ids[h*k + r], scores[h*k + r] for query h, rank r, sorted by
 * descending score; equal scores are ordered by ascending id (exact, ivf), so
 * results do not depend on the thread count. Keys whose score is NaN are never
 * returned. When fewer than k keys qualify (k > N, or an ivf probe that covers
 * fewer than k keys, or an hnsw search that finds fewer), the remaining slots
 * are id -1 with score -INFINITY.
 *
 * Serialized layout (native little-endian, sections at 64-byte offsets):
 *   header (128 B): magic "SPQINDX1", u32 version=1, kind, key_type, d,
 *     i64 n, u64 total_bytes, i64 n_blocks (exact/ivf: key blocks;
 *     hnsw: neighbour slots), i32 nlist, nprobe, hnsw_m, ef_search,
 *     ef_construction, max_level, entry_point; rest zero.
 *   exact: keys [n_blocks][d][16] (f16/bf16/i8), i8 only: scales f32 [n_blocks*16]
 *   ivf:   centroids f32 [ceil(nlist/16)][d][16], list_off i64 [nlist+1]
 *          (block offsets), list_n i64 [nlist] (keys per list), list_bonus
 *          f32 [nlist], ids i32 [n_blocks*16] (-1 in padding), keys and
 *          scales as for exact
 *   hnsw:  keys f32 [n][d], levels i32 [n], offsets u64 [n+1],
 *          neighbours i32 [n_blocks]   (copied into Faiss on load)
 * Keys are kept in blocks of 16 rows stored dimension-major ([d][16]): a
 * SIMD register then holds one dimension of 16 keys and the scan is pure
 * FMAs with a broadcast query element, no horizontal sums.
 *
 * Threads: n_threads 0 means omp_get_max_threads(); 1 runs without a
 * parallel region (the caller may already be parallel over heads). A built
 * or loaded index is read-only and may be searched from several threads at
 * once, each with its own scratch.
 */
#ifndef SPARQ_INDEX_H
#define SPARQ_INDEX_H

#include "util/cpu.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Key storage types. IDX_F32 is internal (centroids, k-means samples). */
enum { IDX_F32 = 0, IDX_F16 = 1, IDX_BF16 = 2, IDX_I8 = 3 };
enum { IDX_EXACT = 1, IDX_IVF = 2, IDX_HNSW = 3 };

#define IDX_BLOCK 16     /* keys per storage block                        */
#define IDX_MAX_G 64     /* queries per search                            */
#define IDX_MAX_D 4096   /* largest key dimension accepted               */

typedef struct idx_params {
    const char *kind;     /* "exact" | "ivf" | "hnsw"                        */
    int      key_type;    /* exact, ivf: IDX_F16 (default), IDX_BF16, IDX_I8 */
    int      nlist;       /* ivf lists; 0 = round(sqrt(N))                   */
    int      nprobe;      /* ivf default probes; 0 = max(8, nlist/16)        */
    int      n_iter;      /* ivf Lloyd iterations (>= 0); default 10         */
    int64_t  n_train;     /* ivf k-means sample; 0 = min(N, 40*nlist)        */
    uint64_t seed;        /* ivf sampling and k-means++ seeding              */
    int      hnsw_m;      /* hnsw links per node; default 16                 */
    int      ef_construction; /* hnsw; default 40 (Faiss's)                  */
    int      ef_search;   /* hnsw default efSearch; default 64               */
    int      n_threads;   /* build threads; 0 = omp_get_max_threads()        */
    /* ivf: lists trained elsewhere (a sparse prefill's growing inverted
     * file): centroids [nlist][d] and the list of every key; both or
     * neither. Given, no k-means and no assignment run. */
    const float   *centroids;
    const int32_t *labels;
} idx_params;

/* Search-time knobs; 0 in a field means the index's default. */
typedef struct idx_search_params {
    int nprobe;     /* ivf: lists probed per query (clamped to nlist)     */
    int ef_search;  /* hnsw: efSearch (raised to k)                       */
    int n_threads;  /* 0 = omp_get_max_threads()                          */
} idx_search_params;

typedef struct idx_index idx_index;
typedef struct idx_scratch idx_scratch;

/* kind "exact", key_type IDX_F16, the defaults listed above. */
idx_params idx_default_params(void);

/* Builds an index over keys [N][d] (f32, copied; the caller keeps ownership).
 * 1 <= N <= INT32_MAX, 1 <= d <= IDX_MAX_D. Returns 0 and *out (free with
 * idx_free), or -1 with a message in err (bad parameters, out of memory,
 * hnsw without Faiss). exact and ivf are deterministic for a given seed and
 * any thread count (byte-identical images); hnsw is not (Faiss inserts in
 * parallel). */
int idx_build(const idx_params *p, const float *keys, int64_t N, int d,
              idx_index **out, char *err, size_t err_size);

/* NULL is a no-op. Does not touch a buffer passed to idx_deserialize. */
void idx_free(idx_index *ix);

int     idx_kind(const idx_index *ix);      /* IDX_EXACT / IDX_IVF / IDX_HNSW */
int64_t idx_count(const idx_index *ix);     /* N */
int     idx_dim(const idx_index *ix);       /* d */
int     idx_nlist(const idx_index *ix);     /* ivf lists, else 0 */
int     idx_key_type(const idx_index *ix);  /* IDX_F16 / IDX_BF16 / IDX_I8 (hnsw: IDX_F32) */
const char *idx_kind_name(const idx_index *ix); /* "exact", "ivf", "hnsw" */

/* Scratch memory for searches: per-thread candidate buffers and ivf/hnsw
 * work arrays. idx_scratch_reserve grows it for (ix, g, k, n_threads) so
 * that later searches with no larger needs never allocate; idx_search grows
 * it itself when needed. One scratch must not be used by two searches at
 * once. create returns NULL when out of memory; free(NULL) is a no-op. */
idx_scratch *idx_scratch_create(void);
int  idx_scratch_reserve(idx_scratch *s, const idx_index *ix, int g, int k,
                         int n_threads, char *err, size_t err_size);
void idx_scratch_free(idx_scratch *s);

/* Top-k of q . key for each of g queries q [g][d] (1 <= g <= IDX_MAX_G,
 * k >= 1): ids [g][k] and scores [g][k] as described at the top. sp may be
 * NULL (index defaults), s may be NULL (a temporary scratch is allocated).
 * Returns 0, or -1 with a message (bad arguments, out of memory). */
int idx_search(const idx_index *ix, const float *q, int g, int k,
               const idx_search_params *sp, idx_scratch *s,
               int32_t *ids, float *scores, char *err, size_t err_size);

/* The index bytes the last search through s read (keys, i8 scales, ids,
 * ivf centroids and probe bonuses), counted by the scan itself: the keys
 * it scored, not the padding rows of a list's last block. *nominal is 1
 * when the count is an estimate instead (hnsw: Faiss reports nothing;
 * g * max(ef, k) * 2M * (4d + 4)). 0 before any search. */
void idx_scratch_cost(const idx_scratch *s, uint64_t *bytes, int *nominal);

/* Bytes idx_serialize writes (0 only if ix is NULL). */
size_t idx_serialized_size(const idx_index *ix);
/* Writes the layout above into dst[0..n); -1 with a message if n is too
 * small. */
int idx_serialize(const idx_index *ix, void *dst, size_t n, char *err,
                  size_t err_size);
/* Loads an index from exactly n bytes. The input is treated as hostile: every
 * size, offset, id and graph link is checked before use and anything
 * inconsistent is an error, never a crash. exact and ivf indexes reference
 * src in place when it is 64-byte aligned (e.g. an mmap; src must then stay
 * mapped and unchanged until idx_free) and copy it otherwise; hnsw is always
 * copied into Faiss. */
int idx_deserialize(const void *src, size_t n, idx_index **out, char *err,
                    size_t err_size);

/* ---- kernels (exposed for tests) ------------------------------------------
 * Scores of one block of 16 keys (blk: [d][16] of key_type; scale16: the 16
 * row scales for IDX_I8, else unused) against g queries q [g][d]:
 * out[h*16 + r] = (scale_r *) sum_j q[h*d + j] * k_rj. The SIMD version sums
 * in a different order: expect ~1e-6 relative differences. */
void idx_block_scores(int key_type, const void *blk, const float *scale16,
                      int d, const float *q, int g, float *out);
void idx_block_scores_ref(int key_type, const void *blk, const float *scale16,
                          int d, const float *q, int g, float *out);

/* Nearest centroid (L2) of each row of x [n][d]: c [ceil(nc/16)][d][16]
 * blocked centroids, hn [ceil(nc/16)*16] = |c|^2 / 2 (+INFINITY in padding).
 * label[i] = argmax_c (x_i . c - hn_c) (the smallest c on ties), best[i] that
 * value. */
void idx_assign(const float *x, int64_t n, int d, const float *c,
                const float *hn, int nc, int32_t *label, float *best);
void idx_assign_ref(const float *x, int64_t n, int d, const float *c,
                    const float *hn, int nc, int32_t *label, float *best);

/* The ivf kind's k-means: nc centroids, k-means++ seeding from seed, then
 * n_iter Lloyd steps over n_train rows sampled from the keys, with
 * n_threads threads (0 = all cores). */
typedef struct idx_kmeans_params {
    int      nc;
    int64_t  n_train;
    int      n_iter;
    uint64_t seed;
    int      n_threads;
} idx_kmeans_params;
/* k-means of kp's centroids over keys [N][d], written blocked as
 * idx_assign reads them: cb [ceil(nc/16)][d][16], hn [ceil(nc/16)*16]. For
 * an inverted file grown elsewhere (attn_pf_sparse.c). 0, or -1 with a
 * message. */
int idx_ivf_centroids(const float *keys, int64_t N, int d, const idx_kmeans_params *kp, float *cb, float *hn,
                      char *err, size_t err_size);

/* ---- shared by index_*.c only ---------------------------------------------- */

/* Candidate buffer of one query in one thread: keeps at least the best k of
 * everything pushed (order: score desc, then id asc) in s/id [cap], cap >=
 * k + 32. thr is the k-th best score after the last shrink (-INF before):
 * scores below it cannot enter. */
typedef struct idx_topk {
    float   *s;
    int32_t *id;
    int      n, cap, k;
    float    thr;
} idx_topk;

void idx_topk_init(idx_topk *t, float *s, int32_t *id, int cap, int k);
/* Pushes 16 scores; lane r has id ids16[r] (or base + r if ids16 is NULL)
 * and is considered only if bit r of valid is set. */
void idx_topk_push16(idx_topk *t, const float *s16, const int32_t *ids16,
                     int32_t base, uint32_t valid);
void idx_topk_push16_ref(idx_topk *t, const float *s16, const int32_t *ids16,
                         int32_t base, uint32_t valid);
/* Keeps the best k and raises the threshold to the k-th best score. */
void idx_topk_shrink(idx_topk *t);
/* Adds every candidate of src into dst. */
void idx_topk_merge(idx_topk *dst, const idx_topk *src);
/* Writes the best min(k, k_out) sorted into ids/scores [k_out], padding the
 * rest with -1/-INF. */
void idx_topk_finish(idx_topk *t, int k_out, int32_t *ids, float *scores);
/* Reorders s/id [n] so that the best m (m <= n) come first, in any order. */
void idx_select(float *s, int32_t *id, int64_t n, int64_t m);

typedef struct idx_kind_ops idx_kind_ops;
typedef struct idx_header idx_header;

struct idx_index {
    const idx_kind_ops *ops;    /* the kind's methods                         */
    int      kind, key_type, d; /* kind: ops->id                              */
    int64_t  n;
    int64_t  n_blocks;          /* exact/ivf key blocks of 16                 */
    const void   *keys;         /* [n_blocks][d][16] key_type                 */
    const float  *scales;       /* IDX_I8: [n_blocks*16]                      */
    /* ivf */
    int      nlist, nprobe;
    const float   *centroids;   /* [ceil(nlist/16)][d][16]                    */
    const int64_t *list_off;    /* [nlist+1], in blocks                       */
    const int64_t *list_n;      /* [nlist]                                    */
    const float   *list_bonus;  /* [nlist] probe bonus per unit |q|           */
    const int32_t *ids;         /* [n_blocks*16], -1 in padding               */
    /* hnsw */
    void    *faiss;             /* opaque Faiss index (index_hnsw_faiss.cc)   */
    int      hnsw_m, ef_search, ef_construction;
    /* in-place kinds: the serialized image the pointers above point into */
    const uint8_t *image;
    size_t   image_bytes;
    void    *owned;             /* freed by idx_free (image or NULL)          */
};

struct idx_scratch {
    int      n_thr, g, cap;     /* reserved: threads, queries, buffer size   */
    float   *s;                 /* [n_thr][g][cap]                            */
    int32_t *id;                /* [n_thr][g][cap]                            */
    idx_topk *tk;               /* [n_thr][g]                                 */
    float   *blk;               /* [n_thr][g][16] block scores                */
    int64_t  nl;                /* reserved ivf lists (padded to 16)          */
    int64_t  ncs;               /* reserved centroid scores (g * nl)          */
    float   *cs;                /* [g][nl] centroid scores                    */
    float   *ls;                /* [nl] select temp                           */
    int32_t *li;                /* [nl] select temp / union list ids          */
    uint8_t *lmark;             /* [nl] list in the union                     */
    int64_t  hk;                /* reserved hnsw g*k                          */
    float   *hd;                /* [hk]                                       */
    int64_t *hl;                /* [hk]                                       */
    uint64_t cost_bytes;        /* the last search's index bytes read         */
    int      cost_nominal;      /* ... estimated, not counted (hnsw)          */
};

/* ---- the kinds' methods table and registry (index.c) ------------------------
 * Adding a kind = one file index_NAME.c defining `const idx_kind_ops
 * idx_kind_NAME` and one line in index.c's registry. index.c checks the
 * generic arguments (key count and dimension, finite keys, thread count,
 * g, k, the image header) before calling a method. */
struct idx_kind_ops {
    const char *name;      /* idx_params.kind                                 */
    uint32_t    id;        /* the image header's kind field (IDX_EXACT, ...)  */
    int         in_place;  /* images are bound in place (64-byte aligned), so
                              ix->image is the serialized form              */
    /* Kind-specific build parameters for N keys. */
    int  (*check)(const idx_params *p, int64_t N, char *err, size_t err_size);
    /* Fills ix (kind, ops already set) from keys [N][d]. */
    int  (*build)(const idx_params *p, const float *keys, int64_t N, int d, idx_index *ix,
                  char *err, size_t err_size);
    /* Binds (in_place) or copies an image of n bytes whose header h was
     * read and checked for magic, version, kind, d, n and size. */
    int  (*load)(idx_index *ix, const idx_header *h, const uint8_t *img, size_t n, char *err,
                 size_t err_size);
    /* Image size and writer; NULL for in_place kinds (the image is copied). */
    size_t (*serialized_size)(const idx_index *ix);
    int  (*serialize)(const idx_index *ix, uint8_t *dst, size_t n, char *err, size_t err_size);
    /* Grows s for g queries, k results and n_thr (resolved) threads. */
    int  (*reserve)(idx_scratch *s, const idx_index *ix, int g, int k, int n_thr, char *err,
                    size_t err_size);
    /* One search (arguments checked, s reserved, s's cost zeroed): results as
     * described at the top, and s->cost_bytes / cost_nominal set. */
    int  (*search)(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
                   int n_thr, idx_scratch *s, int32_t *ids, float *scores, char *err,
                   size_t err_size);
    /* Frees what the kind owns beyond ix->owned; NULL if nothing. */
    void (*release)(idx_index *ix);
};

extern const idx_kind_ops idx_kind_exact, idx_kind_ivf, idx_kind_hnsw;

/* Registry: lookup by name (NULL if unknown), the kinds in order, and
 * their names joined by sep (help texts, error messages). */
const idx_kind_ops *idx_kind_find(const char *name);
int idx_kind_count(void);
const idx_kind_ops *idx_kind_at(int i);
const char *idx_kind_names(char *buf, size_t size, const char *sep);

/* ---- the image framing and scratch (index.c, index_common.c) --------------- */

#define IDX_HEADER_BYTES 128
#define IDX_MAGIC        "SPQINDX1" /* the image's first 8 bytes */
struct idx_header {
    uint32_t kind, key_type, d;
    int64_t  n;
    uint64_t total_bytes;
    int64_t  n_blocks;
    int32_t  nlist, nprobe, hnsw_m, ef_search, ef_construction, max_level,
             entry_point;
};
/* The image's framing, the thread count and the scratch's growth
 * (index_common.c, what every kind calls). */
void idx_header_write(const idx_header *h, uint8_t *dst);
/* Appends a section of count x elt bytes at the next 64-byte boundary after
 * *end: *off its offset, *end moved past it; -1 on overflow. */
int idx_section(size_t *end, int64_t count, size_t elt, size_t *off);
/* The image size for sections ending at end (64-byte aligned); -1 on overflow. */
int idx_image_end(size_t end, size_t *total);
/* Allocates a zeroed 64-aligned image of total bytes, sets h->total_bytes
 * and writes the header; NULL with a message on failure. */
uint8_t *idx_image_alloc(idx_header *h, size_t total, char *err, size_t err_size);
/* Resolves n_threads (0 -> omp max). */
int idx_threads(int n_threads);
/* Makes sure s has room for the given sizes (hnsw_gk: g*k for hnsw, else 0). */
int idx_scratch_grow(idx_scratch *s, int n_thr, int g, int cap, int64_t nl,
                     int64_t hnsw_gk, char *err, size_t err_size);

/* ---- blocked keys, shared by exact and ivf (index_scan.c) ------------------ */

int idx_topk_cap(int64_t k, int64_t n);
size_t idx_elt_bytes(int key_type);
/* Bytes of one key row as a scan reads it: d keys, the i8 scale, the id. */
uint64_t idx_row_bytes(const idx_index *ix);
/* Scores blocks [b0, b1) against g queries and pushes them into tk [g]; only
 * the first n_rows rows of the range are keys. blk: [g][16] work space.
 * Returns the bytes of the keys it scored (rows x idx_row_bytes). */
uint64_t idx_scan_blocks(const idx_index *ix, int64_t b0, int64_t b1, int64_t n_rows,
                         const float *q, int g, idx_topk *tk, float *blk);
/* The ranges of blocks one search scans: at(ix, ctx, i, ...) gives range
 * i's blocks [b0, b1) and how many of their rows are keys, for i < n. */
typedef struct idx_ranges {
    int64_t     n;
    void      (*at)(const idx_index *ix, const void *ctx, int64_t i, int64_t *b0, int64_t *b1, int64_t *n_rows);
    const void *ctx;
} idx_ranges;
/* One search over the ranges, split over n_thr threads. Writes ids /
 * scores [g][k] and adds the bytes read to s->cost_bytes. */
void idx_scan_ranges(const idx_index *ix, const float *q, int g, int k, const idx_ranges *ranges, int n_thr,
                     idx_scratch *s, int32_t *ids, float *scores);
/* The reserve method of blocked kinds (candidate buffers, nlist lists). */
int idx_blocked_reserve(idx_scratch *s, const idx_index *ix, int g, int k, int n_thr, char *err,
                        size_t err_size);
/* Blocks v [n][d] of f32 into dst [ceil(n/16)][d][16] of key_type (i8:
 * per-row scales into scales [..*16]); padding rows are zero. */
void idx_pack_rows(int key_type, const float *v, int64_t n, int d, void *dst,
                   float *scales);
void idx_pack_rows_ref(int key_type, const float *v, int64_t n, int d, void *dst,
                       float *scales);

/* One level's kernels (the un-suffixed functions call through the table of
 * the level running, util/cpu.h). */
typedef struct idx_kernels {
    void (*block_scores)(int key_type, const void *blk, const float *scale16, int d, const float *q, int g,
                         float *out);
    void (*topk_push16)(idx_topk *t, const float *s16, const int32_t *ids16, int32_t base, uint32_t valid);
    void (*pack_rows)(int key_type, const float *v, int64_t n, int d, void *dst, float *scales);
    void (*assign)(const float *x, int64_t n, int d, const float *c, const float *hn, int nc, int32_t *label,
                   float *best);
} idx_kernels;
extern const idx_kernels idx_kernels_ref, idx_kernels_avx2, idx_kernels_avx512;
const idx_kernels *idx_kernels_at(cpu_level level);
/* The key sections (keys, then i8 scales) of h's n_blocks, appended after
 * *end; -1 on overflow or a bad key type. */
int idx_keys_layout(const idx_header *h, size_t *end, size_t *off_keys, size_t *off_scales);
/* A loaded header's key type is f16, bf16 or i8 and no hnsw field is set. */
int idx_keys_check(const idx_header *h, char *err, size_t err_size);
/* idx_params.key_type is f16, bf16 or i8. */
int idx_keys_param_check(const idx_params *p, char *err, size_t err_size);
/* Points ix's key fields into img. */
void idx_keys_bind(idx_index *ix, const idx_header *h, const uint8_t *img, size_t off_keys,
                   size_t off_scales);

/* The Faiss shim (index_hnsw_faiss.cc, compiled only with Faiss). Arrays in
 * idx_hnsw_parts may be unaligned: they are only ever memcpy'd. */
typedef struct idx_hnsw_parts {
    const void *keys;       /* f32 [n][d]                                  */
    const void *levels;     /* i32 [n]: levels of each node (>= 1)         */
    const void *offsets;    /* u64 [n+1]: node i's links start             */
    const void *neighbors;  /* i32 [n_neighbors]: -1 ends a level's links  */
    int64_t n_neighbors;
    int32_t max_level, entry_point;
} idx_hnsw_parts;
int  idx_faiss_hnsw_build(const float *keys, int64_t n, int d, int m, int ef_construction,
                          int n_thr, void **out, char *err, size_t err_size);
int  idx_faiss_hnsw_search(const void *h, const float *q, int g, int k, int ef_search,
                           int n_thr, float *dist, int64_t *lab, char *err, size_t err_size);
void idx_faiss_hnsw_parts(const void *h, idx_hnsw_parts *p);
/* Copies p into a new Faiss index after checking the graph: levels within
 * Faiss's table for m, offsets matching each node's levels, links in range
 * and only to nodes present on that level, a top-level entry point. */
int  idx_faiss_hnsw_from_parts(const idx_hnsw_parts *p, int64_t n, int d, int m,
                               int ef_construction, void **out, char *err, size_t err_size);
void idx_faiss_hnsw_free(void *h);

#ifdef __cplusplus
}
#endif

#endif
