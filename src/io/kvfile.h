/* kvfile.h - KV cache files: a prefix prefilled once, saved with its key
 * indexes, and mapped back (mmap) for decoding, so a cache larger than RAM
 * is read from disk page by page. docs/KVFILE.md explains the choices.
 *
 * File layout, format version 1. Little-endian; every section starts at a
 * multiple of 4096 so K, V and each index image can be used in place from a
 * mapping. Regions the prefix does not fill (positions n..cap-1 of each
 * head) are never written: they are holes in a sparse file.
 *
 *   offset     bytes                    section
 *   0          4096                     header (below)
 *   meta_off   meta_bytes               metadata, in this order:
 *                                         tokens   i32 [n_tokens]
 *                                         v_sum    f32 [n_layer][n_kv_head][d]
 *                                         crc_k    u32 [n_layer][n_kv_head]
 *                                         crc_v    u32 [n_layer][n_kv_head]
 *                                         crc_kt   u32 [n_layer][n_kv_head] (if K^T)
 *                                         index    n_index x 64-byte entries
 *   k_off      kv_bytes                 K   elem [n_layer][n_kv_head][cap][d]
 *   v_off      kv_bytes                 V   elem [n_layer][n_kv_head][cap][d]
 *   kt_off     kv_bytes (if flag K^T)   K^T elem [n_layer][n_kv_head][d][cap]
 *   images_off images_bytes             index images, each at a multiple of 4096
 *
 * The K and V layout is the in-memory kv_cache's (kvcache.h), so the cache
 * of a loaded context IS the private mapping: suffix tokens written at
 * positions >= n land in private pages, the file is never modified.
 *
 * Header (offsets in bytes; unused bytes are zero):
 *     0 u8[8]  magic "SPARQKVC"        8 u32 version (1)
 *    12 u32    header bytes (4096)    16 u64 file bytes (exact file size)
 *    24 char[32] architecture (NUL padded; "synthetic" for a model-less cache)
 *    56 i32    n_layer   60 n_head   64 n_kv_head   68 head_dim
 *    72 i32    n_embd    76 n_vocab
 *    80 u64    model hash (model_fingerprint; 0 when synthetic)
 *    88 u32    elem (0 f32, 1 f16, 2 q8_0: rows of d/32 blocks of an f16
 *              scale and 32 int8, as the q8_0 cache; never with K^T)
 *    92 u32    flags (bit 0: K^T present)
 *    96 i64    n (prefix positions)  104 i64 cap (positions per head)
 *   112 i64    n_tokens (0 or n)     120 u32 n_index   124 u32 0
 *   128 u64    meta_off  136 meta_bytes  144 k_off  152 v_off  160 kt_off
 *   168 u64    kv_bytes  176 images_off  184 images_bytes
 *   192 u32    CRC-32C of the metadata section
 *  4092 u32    CRC-32C of header bytes [0, 4092)
 * Every offset and size is recomputed from the shape when a file is opened
 * and must match exactly.
 *
 * Index entry (64 bytes): 0 char[8] kind ("exact", "ivf", "hnsw", "sparq";
 * NUL padded) | 8 i32 layer | 12 i32 kv_head | 16 u64 offset | 24 u64 bytes
 * | 32 i64 keys indexed (= n) | 40 u32 CRC-32C of the image | rest zero.
 * Images: index.h's serialized layout (exact, ivf, hnsw) or attn_topk.c's
 * K^T image (sparq). At most one image per (layer, kv_head, kind).
 *
 * Data checksums: crc_k[l][h] covers the n rows of K of (layer l, head h)
 * (n * d elements), crc_v the same of V; crc_kt runs over K^T's first n
 * columns in blocks of KVF_KT_BLOCK columns: for each block, the block's
 * segment of row 0, then of row 1, ... (the order the writer produces).
 *
 * Checks on open: the header (magic, version, checksum, shape limits,
 * layout, file size - a shorter file is "truncated") and the metadata
 * checksum, always; the model fingerprint when one is expected; the data
 * checksums (K, V, K^T, every index image) when verify is KVF_VERIFY_ALWAYS
 * or the data to hash is at most KVF_VERIFY_LIMIT bytes. Index images are
 * also validated structurally when an index is bound (idx_deserialize).
 *
 * Writing: kvf_writer_create lays the file out under path.tmp; heads and
 * index images may be written from several threads (distinct heads);
 * kvf_writer_finish writes the metadata and header last, syncs, and
 * renames path.tmp to path, so a crash never leaves a valid-looking file.
 */
#ifndef SPARQ_KVFILE_H
#define SPARQ_KVFILE_H

#include <stddef.h>
#include <stdint.h>
#include "attn/attn.h"
#include "sparq.h"

#define KVF_MAGIC        "SPARQKVC"
#define KVF_VERSION      1
#define KVF_PAGE         4096
#define KVF_VERIFY_LIMIT ((uint64_t)1 << 30) /* data bytes hashed by default */
#define KVF_KT_BLOCK     4096                 /* K^T checksum block, columns   */
/* KVF_VERIFY_META: the header and metadata only, for a file whose data this
 * process has already checked (a server opening one document per request). */
enum { KVF_VERIFY_AUTO = 0, KVF_VERIFY_ALWAYS = 1, KVF_VERIFY_META = 2 };
enum { KVF_MAX_KINDS = 4 };

/* Which model a cache belongs to. */
typedef struct kvf_fingerprint {
    char     arch[32];      /* general.architecture, or "synthetic"         */
    int32_t  n_layer, n_head, n_kv_head, head_dim, n_embd, n_vocab;
    uint64_t model_hash;    /* 0 for a synthetic cache                      */
} kvf_fingerprint;

/* A model's fingerprint is made by the engine (core/model.h,
 * model_fingerprint): this layer knows shapes, not models. */
/* A fingerprint for a cache made without a model (benchmarks). */
void kvf_synthetic_fingerprint(kvf_fingerprint *out, int n_layer, int n_head, int n_kv_head,
                               int head_dim);

typedef struct kvf_index_entry {
    char     kind[8];
    int32_t  layer, head;
    uint64_t offset, bytes;
    int64_t  n;
    uint32_t crc;
} kvf_index_entry;

typedef struct kvf_file {
    kvf_fingerprint fp;
    int       elem;           /* KV_F16, KV_F32 or KV_Q8_0                   */
    int64_t   n, cap;
    int64_t   n_tokens;
    const int32_t *tokens;    /* [n_tokens]                                  */
    const float   *v_sum;     /* [n_layer][n_kv_head][d]                     */
    uint8_t  *k, *v, *kt;     /* into the private mapping; kt NULL if absent */
    int       n_index;
    const kvf_index_entry *index;
    attn_index_source source; /* serves the images (kvf_find_index), reading
                                 each one in as it is first asked for      */
    int       verified;       /* the data checksums were checked            */
    uint64_t  data_bytes;     /* what verification hashes                   */
    uint64_t  file_bytes;
    int       populate;       /* read each image in whole when first asked
                                 for: the images take at most a quarter of
                                 the available memory                      */
    /* private */
    int       fd;
    uint8_t  *map;
    size_t    map_bytes;
    void     *meta;
    kvf_index_entry *entries;
} kvf_file;

/* Opens and checks path (see the top); expect == NULL skips the model
 * check. Returns 0 and *out (kvf_close), or -1 with a one-line message. */
int  kvf_open(const char *path, const kvf_fingerprint *expect, int verify, kvf_file **out,
              char *err, size_t err_size);
void kvf_close(kvf_file *f);
/* Reads the file at path once, in order, into the page cache, so that the
 * mappings of it made later (by kvf_open, by every request of a server)
 * fault in from memory rather than from the disk at random. progress (may
 * be NULL) gets bytes done and total. Returns 0; 1 when the file is larger
 * than the memory available (err says so; nothing read); -1 on error. */
int  kvf_preload(const char *path, void (*progress)(void *user, int64_t done, int64_t total), void *user,
                 char *err, size_t err_size);
/* Tells the kernel K, V and K^T will be read at random rows (top-k
 * gathers): no read-around on a page fault, so a gathered row costs one
 * page of I/O, not the device's readahead window. */
void kvf_advise_random(kvf_file *f);
/* The image of `kind` for (layer, head), or NULL; *bytes its size. */
const void *kvf_find_index(const kvf_file *f, int layer, int head, const char *kind,
                           size_t *bytes);

typedef struct kvf_writer kvf_writer;

/* What a file being written holds besides the model's fingerprint: n
 * positions of K and V in elem (kvcache.h's KV_*) in a cache of capacity
 * cap (n <= cap), K^T if with_kt, n_tokens (0 or n) token ids, and one
 * index image per layer, head and kind of the comma list `kinds` (NULL or
 * "" = none). */
typedef struct kvf_shape {
    int         elem;
    int64_t     n, cap;
    int         with_kt;
    int64_t     n_tokens;
    const char *kinds;
} kvf_shape;

/* Starts path.tmp for a file of this shape. */
int  kvf_writer_create(const char *path, const kvf_fingerprint *fp, const kvf_shape *shape, kvf_writer **out,
                       char *err, size_t err_size);
/* The same, written under the name tmp (NULL: path.tmp) and renamed to
 * path by kvf_writer_finish. tmp is created exclusively: a file or symlink
 * already under that name is unlinked, never written through. */
int  kvf_writer_create_as(const char *path, const char *tmp, const kvf_fingerprint *fp, const kvf_shape *shape,
                          kvf_writer **out, char *err, size_t err_size);
int  kvf_writer_tokens(kvf_writer *w, const int32_t *tokens);
/* One head: k, v [n][d] rows of elem; v_sum [d] (the cache's running sum,
 * stored as is) or NULL (summed here in position order, as kv_write does).
 * Safe from several threads for distinct heads. */
int  kvf_writer_head(kvf_writer *w, int layer, int head, const void *k, const void *v,
                     const float *v_sum, char *err, size_t err_size);
/* One index image (any alignment) for a (layer, head, kind) slot that
 * kvf_writer_create announced. Safe from several threads. */
int  kvf_writer_index(kvf_writer *w, int layer, int head, const char *kind, const void *image,
                      size_t bytes, int64_t n, char *err, size_t err_size);
/* The rows of one head, as a kvf_write_heads callback supplies them. */
typedef struct kvf_head_rows {
    attn_kv_view view;     /* K and V of the head, at least n positions      */
    const float *v_sum;    /* as for kvf_writer_head (NULL: summed here)     */
    void        *owned;    /* freed with free() once the head is written     */
    /* optional: the head's keys already in an inverted file (a sparse
     * prefill's): its ivf image is packed from these lists */
    int            ivf_nlist;
    const float   *ivf_centroids; /* [ivf_nlist][d]                          */
    const int32_t *ivf_labels;    /* [n]                                     */
} kvf_head_rows;
/* Supplies the rows of (layer, head) into *out; 0, or -1 with err set.
 * Called from several threads at once for distinct heads. */
typedef int (*kvf_rows_fn)(void *user, int layer, int head, kvf_head_rows *out, char *err, size_t err_size);
/* Writes every (layer, head) the writer holds with n_threads threads (0 =
 * all cores): rows(user, layer, head, ...) supplies a head's rows, which are written with an image of every
 * index kind the writer announced, built by the topk policy with p
 * (attn_topk_index_image, one thread per head). Then finishes the writer,
 * or aborts it at the first failure (its message in err). Frees w either
 * way. build_s (may be NULL): index build seconds summed over heads. */
int  kvf_write_heads(kvf_writer *w, int n_threads, const sparq_attn_params *p, kvf_rows_fn rows, void *user,
                     double *build_s, char *err, size_t err_size);
/* A cache built in place: the data sections of the file being written
 * (K, V and K^T, laid out as kvcache.h's cache of capacity cap) mapped
 * shared and writable, so rows stored there go to the file's pages (the
 * page cache, written back by the kernel), not to private memory: a cache
 * larger than RAM. First checks that the finished file (plus index_bytes
 * of images) fits in the free disk space. kvf_writer_head then finds a
 * head's rows in place and only checksums them; kvf_writer_finish maps
 * the same addresses privately over the finished file, so the cache stays
 * usable (later rows go to private pages, as with a loaded file). The map
 * outlives the writer: kvf_map_free (the owner_free of a borrowed cache). */
typedef struct kvf_map kvf_map;
int      kvf_writer_map(kvf_writer *w, int64_t index_bytes, kvf_map **out, char *err, size_t err_size);
const char *kvf_writer_path(const kvf_writer *w); /* the final path */
uint8_t *kvf_map_k(const kvf_map *m);
uint8_t *kvf_map_v(const kvf_map *m);
uint8_t *kvf_map_kt(const kvf_map *m); /* NULL without K^T */
void     kvf_map_free(void *map);

/* Resumable prefills: kvf_writer_progress records in the temp file that
 * its first `done` positions are written (tokens_crc: CRC-32C of the
 * document's token ids); kvf_writer_keep(w, 1) makes an abort leave the
 * temp file; kvf_writer_resume reopens path.tmp for a writer of this shape
 * whose record matches (model, shape, kinds, tokens) and says how far it
 * got. Resume returns 0 (and *done), 1 when there is no matching partial
 * file (the reason in err; the file is left alone), -1 on errors. */
int  kvf_writer_progress(kvf_writer *w, uint32_t tokens_crc, int64_t done);
void kvf_writer_keep(kvf_writer *w, int keep);
int  kvf_writer_resume(const char *path, const kvf_fingerprint *fp, const kvf_shape *shape, uint32_t tokens_crc,
                       kvf_writer **out, int64_t *done, char *err, size_t err_size);

/* Whether a writer for path could start: path is not a directory or other
 * non-file, and path.tmp can be created (probed exclusively and removed
 * again; if something is there already, its directory must be writable for
 * the writer to replace it). For commands that check before a long
 * computation. */
int  kvf_check_writable(const char *path, char *err, size_t err_size);
/* Checks every head and slot was written, writes metadata and header,
 * syncs and renames. Frees w whatever the outcome (the temp file is
 * removed on failure). */
int  kvf_writer_finish(kvf_writer *w, char *err, size_t err_size);
/* Removes the temp file and frees w (NULL: no-op). */
void kvf_writer_abort(kvf_writer *w);

/* Parses a comma list of index kinds into out[0..KVF_MAX_KINDS) (no
 * duplicates); returns the count or -1 with a message. */
int  kvf_parse_kinds(const char *list, const char *out[KVF_MAX_KINDS], char *err, size_t err_size);

/* CRC-32C (Castagnoli), continuing from crc (0 to start). The reference is
 * bitwise; the SSE4.2 twin uses the crc32 instruction. */
uint32_t kvf_crc32c(uint32_t crc, const void *p, size_t n);
uint32_t kvf_crc32c_ref(uint32_t crc, const void *p, size_t n);
#if defined(__SSE4_2__)
#define KVF_HAVE_SSE42 1
uint32_t kvf_crc32c_sse42(uint32_t crc, const void *p, size_t n);
#endif

#endif
