/* kvfile.c - KV cache files (see kvfile.h for the layout and checks).
 *
 * Map:
 *   CRC-32C             kvf_crc32c_ref / _sse42 / dispatch
 *   fingerprints        kvf_model_fingerprint, kvf_synthetic_fingerprint
 *   layout              layout_of: every offset from the shape, for both sides
 *   header              header_put / header_get (fixed offsets, no struct I/O)
 *   quoting             printable: file bytes in messages, non-printables escaped
 *   writer              kvf_writer_*: sparse file under path.tmp, then rename;
 *                       kvf_write_heads: every head and its index images;
 *                       kvf_check_writable: before a long job fills a writer
 *   reader              kvf_open: checks, private mapping, optional data CRCs
 *   context             sparq_context_save_kv (sparq.h)
 */
#include "util/err.h"
#include "util/paths.h"
#include "io/kvfile.h"
#include "util/sysmem.h"
#include "index/index.h"
#include "tensor/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

/* ---- CRC-32C ----------------------------------------------------------------- */

uint32_t kvf_crc32c_ref(uint32_t crc, const void *p, size_t n)
{
    const uint8_t *b = p;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= b[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

#ifdef KVF_HAVE_SSE42
uint32_t kvf_crc32c_sse42(uint32_t crc, const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t c = ~crc;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        c = _mm_crc32_u64(c, w);
    }
    uint32_t c32 = (uint32_t)c;
    for (; i < n; i++) c32 = _mm_crc32_u8(c32, b[i]);
    return ~c32;
}
#define KVF_CRC kvf_crc32c_sse42
#else
#define KVF_CRC kvf_crc32c_ref
#endif

uint32_t kvf_crc32c(uint32_t crc, const void *p, size_t n) { return KVF_CRC(crc, p, n); }

/* ---- fingerprints ---------------------------------------------------------------- */

void kvf_synthetic_fingerprint(kvf_fingerprint *out, int n_layer, int n_head, int n_kv_head,
                               int head_dim)
{
    memset(out, 0, sizeof *out);
    snprintf(out->arch, sizeof out->arch, "synthetic");
    out->n_layer = n_layer;
    out->n_head = n_head;
    out->n_kv_head = n_kv_head;
    out->head_dim = head_dim;
}

/* The first n bytes of src (up to a NUL) as text for a message: printable
 * ASCII as it is, anything else (control bytes, bytes >= 0x7f, a quote or
 * backslash) as \xHH, so bytes read from a file cannot garble the terminal
 * or the one-line message. dst must hold 4 * n + 1 bytes. */
static const char *printable(const char *src, size_t n, char *dst)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    for (size_t i = 0; i < n && src[i]; i++) {
        const unsigned char c = (unsigned char)src[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
            dst[o++] = (char)c;
        } else {
            dst[o++] = '\\';
            dst[o++] = 'x';
            dst[o++] = hex[c >> 4];
            dst[o++] = hex[c & 15];
        }
    }
    dst[o] = 0;
    return dst;
}

static void describe(const kvf_fingerprint *f, char *buf, size_t size)
{
    char arch[4 * sizeof f->arch + 1];
    snprintf(buf, size, "%s, %d layers, %d/%d heads, d %d, embd %d, vocab %d, hash %016llx",
             printable(f->arch, sizeof f->arch, arch), f->n_layer, f->n_head, f->n_kv_head, f->head_dim,
             f->n_embd, f->n_vocab, (unsigned long long)f->model_hash);
}

/* ---- layout ---------------------------------------------------------------------- */

typedef struct kvf_layout {
    uint64_t heads, es, row; /* heads; K^T element bytes; one K or V row */
    uint64_t tokens_at, vsum_at, crck_at, crcv_at, crckt_at, dir_at; /* in meta */
    uint64_t meta_off, meta_bytes, k_off, v_off, kt_off, kv_bytes, images_off;
} kvf_layout;

static uint64_t page_up(uint64_t x) { return (x + KVF_PAGE - 1) / KVF_PAGE * KVF_PAGE; }

static int layout_of(const kvf_fingerprint *fp, int elem, int64_t n, int64_t cap, int with_kt,
                     int64_t n_tokens, int64_t n_index, kvf_layout *L, char *err, size_t err_size)
{
    memset(L, 0, sizeof *L);
    if (fp->n_layer < 1 || fp->n_layer > 4096 || fp->n_kv_head < 1 || fp->n_kv_head > 4096 ||
        fp->head_dim < 1 || fp->head_dim > 4096 || fp->n_head < fp->n_kv_head ||
        fp->n_head > 65536 || fp->n_head % fp->n_kv_head)
        return err_set(err, err_size, "bad shape (%d layers, %d/%d heads, d %d)", fp->n_layer,
                    fp->n_head, fp->n_kv_head, fp->head_dim);
    if (elem != KV_F16 && elem != KV_F32 && elem != KV_Q8_0) return err_set(err, err_size, "bad element type %d", elem);
    if (elem == KV_Q8_0 && with_kt) /* K^T's blocks would run along positions: not stored */
        return err_set(err, err_size, "a q8_0 cache is stored without K^T");
    if (cap < 1 || cap > ((int64_t)1 << 40) || n < 0 || n > cap)
        return err_set(err, err_size, "bad size (%lld positions of capacity %lld)", (long long)n,
                    (long long)cap);
    if (n_tokens != 0 && n_tokens != n)
        return err_set(err, err_size, "bad token count %lld (positions %lld)", (long long)n_tokens,
                    (long long)n);
    L->heads = (uint64_t)fp->n_layer * (uint64_t)fp->n_kv_head;
    L->es = elem == KV_F16 ? 2 : 4; /* K^T's element (f16/f32 files only) */
    if (n_index < 0 || (uint64_t)n_index > L->heads * KVF_MAX_KINDS)
        return err_set(err, err_size, "bad index count %lld", (long long)n_index);
    const uint64_t row = attn_kv_row_bytes(elem, fp->head_dim); /* <= 16 KiB */
    L->row = row;
    if ((uint64_t)cap > ((uint64_t)1 << 50) / row / L->heads)
        return err_set(err, err_size, "cache of %lld positions is too large", (long long)cap);
    L->kv_bytes = L->heads * (uint64_t)cap * row;
    uint64_t o = 0;
    L->tokens_at = o; o += (uint64_t)n_tokens * 4;
    L->vsum_at = o;   o += L->heads * (uint64_t)fp->head_dim * 4;
    L->crck_at = o;   o += L->heads * 4;
    L->crcv_at = o;   o += L->heads * 4;
    L->crckt_at = o;  o += with_kt ? L->heads * 4 : 0;
    L->dir_at = o;    o += (uint64_t)n_index * 64;
    L->meta_off = KVF_PAGE;
    L->meta_bytes = o;
    L->k_off = page_up(L->meta_off + o);
    L->v_off = L->k_off + page_up(L->kv_bytes);
    L->kt_off = with_kt ? L->v_off + page_up(L->kv_bytes) : 0;
    L->images_off = (with_kt ? L->kt_off : L->v_off) + page_up(L->kv_bytes);
    return 0;
}

/* ---- header ---------------------------------------------------------------------- */

typedef struct kvf_header {
    kvf_fingerprint fp;
    uint32_t version, elem, flags, n_index, meta_crc;
    int64_t  n, cap, n_tokens;
    uint64_t file_bytes, meta_off, meta_bytes, k_off, v_off, kt_off, kv_bytes, images_off,
             images_bytes;
} kvf_header;

static void put32(uint8_t *b, size_t at, uint32_t v) { memcpy(b + at, &v, 4); }
static void put64(uint8_t *b, size_t at, uint64_t v) { memcpy(b + at, &v, 8); }
static uint32_t get32(const uint8_t *b, size_t at) { uint32_t v; memcpy(&v, b + at, 4); return v; }
static uint64_t get64(const uint8_t *b, size_t at) { uint64_t v; memcpy(&v, b + at, 8); return v; }

static void header_put(const kvf_header *h, uint8_t *b)
{
    memset(b, 0, KVF_PAGE);
    memcpy(b, KVF_MAGIC, 8);
    put32(b, 8, KVF_VERSION);
    put32(b, 12, KVF_PAGE);
    put64(b, 16, h->file_bytes);
    memcpy(b + 24, h->fp.arch, 32);
    put32(b, 56, (uint32_t)h->fp.n_layer);
    put32(b, 60, (uint32_t)h->fp.n_head);
    put32(b, 64, (uint32_t)h->fp.n_kv_head);
    put32(b, 68, (uint32_t)h->fp.head_dim);
    put32(b, 72, (uint32_t)h->fp.n_embd);
    put32(b, 76, (uint32_t)h->fp.n_vocab);
    put64(b, 80, h->fp.model_hash);
    put32(b, 88, h->elem);
    put32(b, 92, h->flags);
    put64(b, 96, (uint64_t)h->n);
    put64(b, 104, (uint64_t)h->cap);
    put64(b, 112, (uint64_t)h->n_tokens);
    put32(b, 120, h->n_index);
    put64(b, 128, h->meta_off);
    put64(b, 136, h->meta_bytes);
    put64(b, 144, h->k_off);
    put64(b, 152, h->v_off);
    put64(b, 160, h->kt_off);
    put64(b, 168, h->kv_bytes);
    put64(b, 176, h->images_off);
    put64(b, 184, h->images_bytes);
    put32(b, 192, h->meta_crc);
    put32(b, KVF_PAGE - 4, kvf_crc32c(0, b, KVF_PAGE - 4));
}

static int header_get(kvf_header *h, const uint8_t *b, char *err, size_t err_size)
{
    memset(h, 0, sizeof *h);
    if (memcmp(b, KVF_MAGIC, 8) != 0) return err_set(err, err_size, "not a sparq KV cache file (bad magic)");
    h->version = get32(b, 8);
    if (h->version != KVF_VERSION)
        return err_set(err, err_size, "format version %u, this build reads version %d", h->version,
                    KVF_VERSION);
    if (get32(b, KVF_PAGE - 4) != kvf_crc32c(0, b, KVF_PAGE - 4))
        return err_set(err, err_size, "header checksum mismatch (corrupt file)");
    if (get32(b, 12) != KVF_PAGE) return err_set(err, err_size, "bad header size %u", get32(b, 12));
    h->file_bytes = get64(b, 16);
    memcpy(h->fp.arch, b + 24, 32);
    h->fp.arch[31] = 0;
    h->fp.n_layer = (int32_t)get32(b, 56);
    h->fp.n_head = (int32_t)get32(b, 60);
    h->fp.n_kv_head = (int32_t)get32(b, 64);
    h->fp.head_dim = (int32_t)get32(b, 68);
    h->fp.n_embd = (int32_t)get32(b, 72);
    h->fp.n_vocab = (int32_t)get32(b, 76);
    h->fp.model_hash = get64(b, 80);
    h->elem = get32(b, 88);
    h->flags = get32(b, 92);
    h->n = (int64_t)get64(b, 96);
    h->cap = (int64_t)get64(b, 104);
    h->n_tokens = (int64_t)get64(b, 112);
    h->n_index = get32(b, 120);
    h->meta_off = get64(b, 128);
    h->meta_bytes = get64(b, 136);
    h->k_off = get64(b, 144);
    h->v_off = get64(b, 152);
    h->kt_off = get64(b, 160);
    h->kv_bytes = get64(b, 168);
    h->images_off = get64(b, 176);
    h->images_bytes = get64(b, 184);
    h->meta_crc = get32(b, 192);
    return 0;
}

/* ---- I/O helpers ------------------------------------------------------------------ */

static int pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
    const uint8_t *b = p;
    while (n) {
        ssize_t w = pwrite(fd, b, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        b += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

static int pread_all(int fd, void *p, size_t n, uint64_t off)
{
    uint8_t *b = p;
    while (n) {
        ssize_t r = pread(fd, b, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        b += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static const char *const kind_names[KVF_MAX_KINDS] = { "exact", "ivf", "hnsw", "sparq" };

static int known_kind(const char *s, size_t n)
{
    for (int i = 0; i < KVF_MAX_KINDS; i++)
        if (strlen(kind_names[i]) == n && strncmp(kind_names[i], s, n) == 0) return i;
    return -1;
}

int kvf_parse_kinds(const char *list, const char *out[KVF_MAX_KINDS], char *err, size_t err_size)
{
    int n = 0;
    if (!list) return 0;
    for (const char *s = list; *s;) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        const int k = known_kind(s, len);
        if (k < 0)
            return err_set(err, err_size, "unknown index kind '%.*s' (exact, ivf, hnsw, sparq)",
                        (int)len, s);
        for (int i = 0; i < n; i++)
            if (out[i] == kind_names[k]) return err_set(err, err_size, "index kind '%s' given twice", kind_names[k]);
        out[n++] = kind_names[k];
        s = e ? e + 1 : s + len;
    }
    return n;
}

/* ---- writer ------------------------------------------------------------------------ */

/* The data sections [k_off, images_off) of a file being written, mapped
 * shared (kvf_writer_map); private once the file is finished. */
struct kvf_map {
    uint8_t *base;
    size_t   bytes;
    uint8_t *k, *v, *kt;
};

struct kvf_writer {
    kvf_map        *map;        /* the cache built in place, or NULL (not owned) */
    int             keep;       /* abort leaves the temp file (a resumable prefill) */
    char           *path, *tmp;
    int             fd;
    kvf_fingerprint fp;
    int             elem, with_kt, n_kinds;
    int64_t         n, cap, n_tokens;
    const char     *kinds[KVF_MAX_KINDS];
    kvf_layout      L;
    uint8_t        *meta;       /* [meta_bytes]                               */
    uint8_t        *head_done;  /* [heads]                                    */
    uint8_t        *slot_done;  /* [heads * n_kinds]                          */
    int             tokens_done;
    uint64_t        append;     /* next image offset (atomic)                 */
};

void kvf_writer_abort(kvf_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->tmp && !w->keep) unlink(w->tmp);
    free(w->path);
    free(w->tmp);
    free(w->meta);
    free(w->head_done);
    free(w->slot_done);
    free(w);
}

int kvf_writer_create(const char *path, const kvf_fingerprint *fp, const kvf_shape *shape, kvf_writer **out,
                      char *err, size_t err_size)
{
    return kvf_writer_create_as(path, NULL, fp, shape, out, err, err_size);
}

/* Creates tmp for writing, never through a name planted there: O_EXCL and
 * O_NOFOLLOW refuse an existing file or symlink, which (a left-over of a
 * crashed writer, or a link aimed at a victim) is unlinked, not followed,
 * and the create tried once more. */
static int create_exclusive(const char *tmp)
{
    const int flags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(tmp, flags, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0) fd = open(tmp, flags, 0644);
    return fd;
}

int kvf_writer_create_as(const char *path, const char *tmp, const kvf_fingerprint *fp, const kvf_shape *shape,
                         kvf_writer **out, char *err, size_t err_size)
{
    *out = NULL;
    const int elem = shape->elem;
    const int64_t n = shape->n, cap = shape->cap, n_tokens = shape->n_tokens;
    kvf_writer *w = calloc(1, sizeof *w);
    if (!w) return err_set(err, err_size, "kvfile: out of memory");
    w->fd = -1;
    char e2[192];
    int nk = kvf_parse_kinds(shape->kinds, w->kinds, e2, sizeof e2);
    if (nk < 0) {
        kvf_writer_abort(w);
        return err_set(err, err_size, "kvfile '%s': %s", path, e2);
    }
    w->n_kinds = nk;
    w->fp = *fp;
    w->elem = elem;
    w->with_kt = !!shape->with_kt;
    w->n = n;
    w->cap = cap;
    w->n_tokens = n_tokens;
    const int64_t heads = (int64_t)fp->n_layer * fp->n_kv_head;
    if (layout_of(fp, elem, n, cap, w->with_kt, n_tokens, heads * nk, &w->L, e2, sizeof e2)) {
        kvf_writer_abort(w);
        return err_set(err, err_size, "kvfile '%s': %s", path, e2);
    }
    if (n < 1) {
        kvf_writer_abort(w);
        return err_set(err, err_size, "kvfile '%s': nothing to save (the cache is empty)", path);
    }
    const size_t plen = strlen(path), tlen = tmp ? strlen(tmp) + 1 : plen + 5;
    w->path = malloc(plen + 1);
    w->tmp = malloc(tlen);
    w->meta = calloc(1, w->L.meta_bytes ? (size_t)w->L.meta_bytes : 1);
    w->head_done = calloc((size_t)heads, 1);
    w->slot_done = calloc((size_t)(heads * (nk ? nk : 1)), 1);
    if (!w->path || !w->tmp || !w->meta || !w->head_done || !w->slot_done) {
        kvf_writer_abort(w);
        return err_set(err, err_size, "kvfile '%s': out of memory", path);
    }
    memcpy(w->path, path, plen + 1);
    if (tmp) memcpy(w->tmp, tmp, tlen);
    else snprintf(w->tmp, tlen, "%s.tmp", path);
    w->fd = create_exclusive(w->tmp);
    if (w->fd < 0) {
        int e = errno;
        char t[4096];
        snprintf(t, sizeof t, "%s", w->tmp);
        free(w->tmp);
        w->tmp = NULL; /* nothing of ours to unlink */
        kvf_writer_abort(w);
        return err_set(err, err_size, "kvfile: cannot create '%s': %s", t, strerror(e));
    }
    w->append = w->L.images_off;
    *out = w;
    return 0;
}

/* ---- resumable prefills ------------------------------------------------------------ */

/* Page 0 of a file built in place holds, until kvf_writer_finish writes the
 * header there, a record of how far the prefill got:
 *   0 u8[8] "SPARQRSM"   8 u64 model hash   16 i64 n   24 i64 cap
 *   32 u32 elem   36 u32 with_kt   40 u32 CRC-32C of the n token ids
 *   44 u32 index kinds   48 i64 positions done   56 u32 CRC-32C of [0, 56)
 * Rows reach the file through the shared mapping before the record that
 * counts them, so a process that dies (Ctrl-C, kill, a crash) leaves a
 * file whose record never claims a row that is not there. */
#define KVF_RESUME_MAGIC "SPARQRSM"

static void resume_record(const kvf_writer *w, uint32_t tokens_crc, int64_t done, uint8_t rec[64])
{
    memset(rec, 0, 64);
    memcpy(rec, KVF_RESUME_MAGIC, 8);
    put64(rec, 8, w->fp.model_hash);
    put64(rec, 16, (uint64_t)w->n);
    put64(rec, 24, (uint64_t)w->cap);
    put32(rec, 32, (uint32_t)w->elem);
    put32(rec, 36, (uint32_t)w->with_kt);
    put32(rec, 40, tokens_crc);
    put32(rec, 44, (uint32_t)w->n_kinds);
    put64(rec, 48, (uint64_t)done);
    put32(rec, 56, kvf_crc32c(0, rec, 56));
}

int kvf_writer_progress(kvf_writer *w, uint32_t tokens_crc, int64_t done)
{
    uint8_t rec[64];
    resume_record(w, tokens_crc, done, rec);
    return pwrite_all(w->fd, rec, sizeof rec, 0);
}

void kvf_writer_keep(kvf_writer *w, int keep) { w->keep = keep; }

int kvf_writer_resume(const char *path, const kvf_fingerprint *fp, const kvf_shape *shape, uint32_t tokens_crc,
                      kvf_writer **out, int64_t *done, char *err, size_t err_size)
{
    *out = NULL;
    *done = 0;
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return err_set(err, err_size, "kvfile: path of %zu bytes is too long", strlen(path));
    /* the partial file is ours only if it is a regular file: no links followed */
    const int fd = open(tmp, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        err_set(err, err_size, "no partial prefill at '%s' (%s)", tmp, strerror(errno));
        return 1;
    }
    struct stat st;
    uint8_t rec[64], want[64];
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || pread_all(fd, rec, sizeof rec, 0)) {
        close(fd);
        err_set(err, err_size, "'%s' is not a readable partial KV file", tmp);
        return 1;
    }
    kvf_writer *w;
    /* a writer of the same shape, on a scratch name, then moved onto tmp */
    char scratch[4200];
    snprintf(scratch, sizeof scratch, "%s.resume", tmp);
    if (kvf_writer_create_as(path, scratch, fp, shape, &w, err, err_size)) {
        close(fd);
        return -1;
    }
    close(w->fd);
    unlink(w->tmp);
    snprintf(w->tmp, strlen(w->tmp) + 1, "%s", tmp); /* tmp is shorter than scratch */
    w->fd = fd;
    const int64_t got = (int64_t)get64(rec, 48);
    resume_record(w, tokens_crc, got, want);
    if (memcmp(rec, want, 64) != 0 || got < 0 || got > shape->n || (uint64_t)st.st_size != w->L.images_off) {
        w->keep = 1; /* not ours to delete: the caller decides */
        kvf_writer_abort(w);
        err_set(err, err_size, "'%s' is not a partial prefill of this model, document and cache shape", tmp);
        return 1;
    }
    *out = w;
    *done = got;
    return 0;
}

void kvf_map_free(void *map)
{
    kvf_map *m = map;
    if (!m) return;
    if (m->base) munmap(m->base, m->bytes);
    free(m);
}

int kvf_writer_map(kvf_writer *w, int64_t index_bytes, kvf_map **out, char *err, size_t err_size)
{
    *out = NULL;
    const uint64_t data = w->L.images_off - w->L.k_off;
    /* the whole file, indexes included, is checked against the free space
     * now: a prefill of hours must not fail at its end */
    const uint64_t need = w->L.images_off + (uint64_t)(index_bytes > 0 ? index_bytes : 0);
    const char *slash = strrchr(w->tmp, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - w->tmp) + 1 : 1, slash ? w->tmp : ".");
    struct statvfs vf;
    struct stat st; /* a resumed file already holds part of it */
    const uint64_t held = fstat(w->fd, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
    const uint64_t more = need > held ? need - held : 0;
    if (statvfs(dir, &vf) == 0 && (uint64_t)vf.f_bavail * vf.f_frsize < more)
        return err_set(err, err_size, "kvfile '%s': needs %.2f GiB on disk, %.2f GiB free in '%s'", w->path,
                       need / 1073741824.0, (double)vf.f_bavail * vf.f_frsize / 1073741824.0, dir);
    kvf_map *m = calloc(1, sizeof *m);
    if (!m) return err_set(err, err_size, "kvfile: out of memory");
    /* a sparse file: the space is taken as rows are written */
    if (ftruncate(w->fd, (off_t)w->L.images_off)) {
        free(m);
        return err_set(err, err_size, "kvfile: cannot size '%s': %s", w->tmp, strerror(errno));
    }
    /* the blocks of the rows the file will hold are reserved now: a store
     * into a shared mapping whose page the file system cannot allocate is
     * a SIGBUS, not an error, so a disk that fills up during the prefill
     * must not get the chance (capacity beyond n stays a hole) */
    const uint64_t heads = w->L.heads, head_bytes = (uint64_t)w->cap * w->L.row, rows = (uint64_t)w->n * w->L.row;
    for (uint64_t hh = 0; hh < heads; hh++) {
        int e = posix_fallocate(w->fd, (off_t)(w->L.k_off + hh * head_bytes), (off_t)rows);
        if (!e) e = posix_fallocate(w->fd, (off_t)(w->L.v_off + hh * head_bytes), (off_t)rows);
        for (int j = 0; !e && w->with_kt && j < w->fp.head_dim; j++) /* K^T: the first n columns of each row */
            e = posix_fallocate(w->fd, (off_t)(w->L.kt_off + hh * head_bytes + (uint64_t)j * w->cap * w->L.es),
                                (off_t)((uint64_t)w->n * w->L.es));
        if (e == EOPNOTSUPP || e == EINVAL) break; /* a file system without it: sparse, as before */
        if (e) {
            free(m);
            return err_set(err, err_size, "kvfile: cannot reserve the cache's %.2f GiB in '%s': %s",
                           (double)heads * rows * 2 / 1073741824.0, w->tmp, strerror(e));
        }
    }
    void *p = mmap(NULL, (size_t)data, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, w->fd, (off_t)w->L.k_off);
    if (p == MAP_FAILED) {
        free(m);
        return err_set(err, err_size, "kvfile: cannot map %.2f GiB of '%s': %s", data / 1073741824.0, w->tmp,
                       strerror(errno));
    }
    m->base = p;
    m->bytes = (size_t)data;
    m->k = m->base;
    m->v = m->base + (w->L.v_off - w->L.k_off);
    m->kt = w->with_kt ? m->base + (w->L.kt_off - w->L.k_off) : NULL;
    w->map = m;
    *out = m;
    return 0;
}

const char *kvf_writer_path(const kvf_writer *w) { return w->path; }
uint8_t *kvf_map_k(const kvf_map *m) { return m->k; }
uint8_t *kvf_map_v(const kvf_map *m) { return m->v; }
uint8_t *kvf_map_kt(const kvf_map *m) { return m->kt; }

int kvf_writer_tokens(kvf_writer *w, const int32_t *tokens)
{
    if (w->n_tokens) memcpy(w->meta + w->L.tokens_at, tokens, (size_t)w->n_tokens * 4);
    w->tokens_done = 1;
    return 0;
}

int kvf_writer_head(kvf_writer *w, int layer, int head, const void *k, const void *v,
                    const float *v_sum, char *err, size_t err_size)
{
    if (layer < 0 || layer >= w->fp.n_layer || head < 0 || head >= w->fp.n_kv_head)
        return err_set(err, err_size, "kvfile: no head (%d, %d)", layer, head);
    const int d = w->fp.head_dim;
    const size_t hh = (size_t)layer * w->fp.n_kv_head + head, es = w->L.es;
    const size_t rows = (size_t)w->n * w->L.row;
    const uint64_t at = hh * (uint64_t)w->cap * w->L.row;
    /* a cache built in place (kvf_writer_map) is already there */
    const int in_place = w->map && (const uint8_t *)k == w->map->k + at && (const uint8_t *)v == w->map->v + at;
    if (!in_place && (pwrite_all(w->fd, k, rows, w->L.k_off + at) || pwrite_all(w->fd, v, rows, w->L.v_off + at)))
        return err_set(err, err_size, "kvfile: writing '%s' failed: %s", w->tmp, strerror(errno));
    put32(w->meta, w->L.crck_at + hh * 4, kvf_crc32c(0, k, rows));
    put32(w->meta, w->L.crcv_at + hh * 4, kvf_crc32c(0, v, rows));
    float *sum = (float *)(void *)(w->meta + w->L.vsum_at) + hh * d; /* meta is malloc'ed: aligned */
    if (v_sum) {
        memcpy(sum, v_sum, (size_t)d * sizeof *sum);
    } else {
        memset(sum, 0, (size_t)d * sizeof *sum);
        float *row = malloc((size_t)d * sizeof *row);
        if (!row) return err_set(err, err_size, "kvfile: out of memory");
        for (int64_t s = 0; s < w->n; s++) {
            attn_kv_row_f32(v, w->elem, d, s, d, row);
            for (int j = 0; j < d; j++) sum[j] += row[j];
        }
        free(row);
    }
    if (w->with_kt && w->map && w->map->kt) { /* built in place: checksum it */
        uint32_t crc = 0;
        for (int64_t s0 = 0; s0 < w->n; s0 += KVF_KT_BLOCK) {
            const int64_t nb = w->n - s0 < KVF_KT_BLOCK ? w->n - s0 : KVF_KT_BLOCK;
            for (int j = 0; j < d; j++)
                crc = kvf_crc32c(crc, w->map->kt + at + ((size_t)j * w->cap + (size_t)s0) * es, (size_t)nb * es);
        }
        put32(w->meta, w->L.crckt_at + hh * 4, crc);
    } else if (w->with_kt) { /* d rows of K^T, each the first n of cap, in blocks of KVF_KT_BLOCK columns */
        uint8_t *buf = malloc((size_t)KVF_KT_BLOCK * d * es);
        if (!buf) return err_set(err, err_size, "kvfile: out of memory");
        const uint8_t *kb = k;
        uint32_t crc = 0;
        int bad = 0;
        for (int64_t s0 = 0; s0 < w->n && !bad; s0 += KVF_KT_BLOCK) {
            const int64_t nb = w->n - s0 < KVF_KT_BLOCK ? w->n - s0 : KVF_KT_BLOCK;
            for (int j = 0; j < d; j++)
                for (int64_t s = 0; s < nb; s++)
                    memcpy(buf + ((size_t)j * nb + s) * es, kb + ((size_t)(s0 + s) * d + j) * es, es);
            for (int j = 0; j < d && !bad; j++) {
                const uint64_t o = w->L.kt_off + at + ((uint64_t)j * w->cap + s0) * es;
                bad = pwrite_all(w->fd, buf + (size_t)j * nb * es, (size_t)nb * es, o);
                crc = kvf_crc32c(crc, buf + (size_t)j * nb * es, (size_t)nb * es);
            }
        }
        put32(w->meta, w->L.crckt_at + hh * 4, crc);
        free(buf);
        if (bad) return err_set(err, err_size, "kvfile: writing '%s' failed: %s", w->tmp, strerror(errno));
    }
    w->head_done[hh] = 1;
    return 0;
}

int kvf_writer_index(kvf_writer *w, int layer, int head, const char *kind, const void *image,
                     size_t bytes, int64_t n, char *err, size_t err_size)
{
    int ki = -1;
    for (int i = 0; i < w->n_kinds; i++)
        if (strcmp(w->kinds[i], kind) == 0) ki = i;
    if (ki < 0 || layer < 0 || layer >= w->fp.n_layer || head < 0 || head >= w->fp.n_kv_head)
        return err_set(err, err_size, "kvfile: no index slot (%s, layer %d, head %d)", kind, layer, head);
    if (bytes == 0) return err_set(err, err_size, "kvfile: empty %s index image", kind);
    const size_t slot = ((size_t)layer * w->fp.n_kv_head + head) * w->n_kinds + ki;
    const uint64_t off = __atomic_fetch_add(&w->append, page_up(bytes), __ATOMIC_RELAXED);
    if (pwrite_all(w->fd, image, bytes, off))
        return err_set(err, err_size, "kvfile: writing '%s' failed: %s", w->tmp, strerror(errno));
    uint8_t *e = w->meta + w->L.dir_at + slot * 64;
    memset(e, 0, 64);
    memcpy(e, kind, strlen(kind));
    put32(e, 8, (uint32_t)layer);
    put32(e, 12, (uint32_t)head);
    put64(e, 16, off);
    put64(e, 24, bytes);
    put64(e, 32, (uint64_t)n);
    put32(e, 40, kvf_crc32c(0, image, bytes));
    w->slot_done[slot] = 1;
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One head from view (its first n rows) and an image of every index kind
 * the writer announced, built by the topk policy with p. */
static int writer_head_indexed(kvf_writer *w, int layer, int head, const kvf_head_rows *r,
                               const sparq_attn_params *p, double *build_s, char *err, size_t err_size)
{
    const attn_kv_view *view = &r->view;
    const float *v_sum = r->v_sum;
    if (view->S < w->n || view->d != w->fp.head_dim || view->elem != w->elem)
        return err_set(err, err_size, "kvfile: head view of %lld x %d (elem %d) for a file of %lld x %d (elem %d)",
                       (long long)view->S, view->d, view->elem, (long long)w->n, w->fp.head_dim, w->elem);
    int rc = kvf_writer_head(w, layer, head, view->K, view->V, v_sum, err, err_size);
    for (int i = 0; i < w->n_kinds && !rc; i++) {
        void *img = NULL;
        size_t bytes = 0;
        const double t0 = now_s();
        /* one thread per build: callers run the heads in parallel */
        if (r->ivf_labels && strcmp(w->kinds[i], "ivf") == 0)
            rc = attn_topk_ivf_image_preset(p, view, w->n, r->ivf_nlist, r->ivf_centroids, r->ivf_labels, &img,
                                            &bytes, err, err_size);
        else
            rc = attn_topk_index_image(p, w->kinds[i], view, w->n, 1, &img, &bytes, err, err_size);
        if (build_s) *build_s += now_s() - t0;
        if (!rc) rc = kvf_writer_index(w, layer, head, w->kinds[i], img, bytes, w->n, err, err_size);
        free(img);
    }
    return rc;
}

int kvf_write_heads(kvf_writer *w, int n_threads, const sparq_attn_params *p, kvf_rows_fn rows, void *user,
                    double *build_s, char *err, size_t err_size)
{
    const int n_kv = w->fp.n_kv_head, heads = w->fp.n_layer * n_kv;
    int failed = 0;
    double bsum = 0;
#pragma omp parallel for num_threads(n_threads > 0 ? n_threads : omp_get_num_procs()) \
    schedule(dynamic, 1) reduction(+ : bsum)
    for (int hh = 0; hh < heads; hh++) {
        int stop;
#pragma omp atomic read
        stop = failed;
        if (stop) continue;
        char e[256] = "";
        const int l = hh / n_kv, h = hh % n_kv;
        kvf_head_rows r;
        memset(&r, 0, sizeof r);
        double b = 0;
        int rc = rows(user, l, h, &r, e, sizeof e);
        if (!rc) rc = writer_head_indexed(w, l, h, &r, p, &b, e, sizeof e);
        free(r.owned);
        bsum += b;
        if (rc) {
#pragma omp critical(kvf_write_heads)
            if (!failed) {
                err_set(err, err_size, "%s", e[0] ? e : "kvfile: a head could not be written");
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    if (build_s) *build_s = bsum;
    if (failed) {
        kvf_writer_abort(w);
        return -1;
    }
    return kvf_writer_finish(w, err, err_size);
}

int kvf_check_writable(const char *path, char *err, size_t err_size)
{
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return err_set(err, err_size, "kvfile '%s': exists and is not a regular file", path);
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return err_set(err, err_size, "kvfile: path of %zu bytes is too long", strlen(path));
    /* the writer creates path.tmp and renames it: try exactly that, never
     * through a name already there (it would follow a planted symlink) */
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
        return 0;
    }
    if (errno != EEXIST) return err_set(err, err_size, "kvfile: cannot create '%s': %s", tmp, strerror(errno));
    /* something is there already: the writer will unlink it, which takes
     * a writable directory */
    char *slash = strrchr(tmp, '/');
    if (slash) slash[slash == tmp ? 1 : 0] = 0;
    if (access(slash ? tmp : ".", W_OK | X_OK) != 0)
        return err_set(err, err_size, "kvfile: cannot write in the directory of '%s': %s", path, strerror(errno));
    return 0;
}

int kvf_writer_finish(kvf_writer *w, char *err, size_t err_size)
{
    const int64_t heads = (int64_t)w->fp.n_layer * w->fp.n_kv_head;
    for (int64_t i = 0; i < heads; i++)
        if (!w->head_done[i]) {
            err_set(err, err_size, "kvfile: head %lld of layer %lld was not written",
                 (long long)(i % w->fp.n_kv_head), (long long)(i / w->fp.n_kv_head));
            kvf_writer_abort(w);
            return -1;
        }
    for (int64_t i = 0; i < heads * w->n_kinds; i++)
        if (!w->slot_done[i]) {
            err_set(err, err_size, "kvfile: the %s index of layer %lld head %lld is missing",
                 w->kinds[i % w->n_kinds], (long long)(i / w->n_kinds / w->fp.n_kv_head),
                 (long long)(i / w->n_kinds % w->fp.n_kv_head));
            kvf_writer_abort(w);
            return -1;
        }
    if (w->n_tokens && !w->tokens_done) {
        err_set(err, err_size, "kvfile: token ids were announced but not written");
        kvf_writer_abort(w);
        return -1;
    }
    kvf_header h;
    memset(&h, 0, sizeof h);
    h.fp = w->fp;
    h.elem = (uint32_t)w->elem;
    h.flags = w->with_kt ? 1u : 0u;
    h.n = w->n;
    h.cap = w->cap;
    h.n_tokens = w->n_tokens;
    h.n_index = (uint32_t)(heads * w->n_kinds);
    h.meta_off = w->L.meta_off;
    h.meta_bytes = w->L.meta_bytes;
    h.k_off = w->L.k_off;
    h.v_off = w->L.v_off;
    h.kt_off = w->L.kt_off;
    h.kv_bytes = w->L.kv_bytes;
    h.images_off = w->L.images_off;
    h.images_bytes = w->append - w->L.images_off;
    h.file_bytes = w->append;
    h.meta_crc = kvf_crc32c(0, w->meta, w->L.meta_bytes);
    uint8_t hdr[KVF_PAGE];
    header_put(&h, hdr);
    if (ftruncate(w->fd, (off_t)h.file_bytes) || pwrite_all(w->fd, w->meta, w->L.meta_bytes, h.meta_off) ||
        pwrite_all(w->fd, hdr, KVF_PAGE, 0) || fdatasync(w->fd)) {
        err_set(err, err_size, "kvfile: writing '%s' failed: %s", w->tmp, strerror(errno));
        kvf_writer_abort(w);
        return -1;
    }
    if (close(w->fd) != 0) {
        w->fd = -1;
        err_set(err, err_size, "kvfile: closing '%s' failed: %s", w->tmp, strerror(errno));
        kvf_writer_abort(w);
        return -1;
    }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0) {
        err_set(err, err_size, "kvfile: cannot rename '%s' to '%s': %s", w->tmp, w->path, strerror(errno));
        kvf_writer_abort(w);
        return -1;
    }
    free(w->tmp);
    w->tmp = NULL;
    int rc = 0;
    if (w->map) { /* the cache stays where it is, now over a private copy of the finished file */
        const int fd = open(w->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        void *p = fd < 0 ? MAP_FAILED
                         : mmap(w->map->base, w->map->bytes, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd, (off_t)w->L.k_off);
        if (fd >= 0) close(fd);
        if (p == MAP_FAILED) { /* the file is complete; this cache must not write to it */
            mprotect(w->map->base, w->map->bytes, PROT_READ);
            rc = err_set(err, err_size, "kvfile: '%s' is saved, but its cache could not be mapped privately "
                                        "again (it is now read-only)", w->path);
        }
    }
    kvf_writer_abort(w); /* frees; nothing left to unlink */
    return rc;
}

/* ---- reader ------------------------------------------------------------------------- */

int kvf_preload(const char *path, void (*progress)(void *user, int64_t done, int64_t total), void *user,
                char *err, size_t err_size)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(err, err_size, "cannot open '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, err_size, "'%s' is not a regular file", path);
    }
    /* MemAvailable counts the page cache, this file's cached pages too: a
     * file larger than it would evict its own first pages while reading
     * its last, and every ask would go back to the disk anyway. */
    const int64_t avail = sysmem_available();
    if (avail > 0 && (int64_t)st.st_size > avail - ((int64_t)1 << 30)) {
        close(fd);
        err_set(err, err_size, "'%s' is %.1f GiB, more than the %.1f GiB of memory available less 1 GiB: "
                "not preloaded, its pages are read as they are used", path, (double)st.st_size / 1073741824.0,
                (double)avail / 1073741824.0);
        return 1;
    }
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL); /* advice only */
    const size_t chunk = (size_t)16 << 20;
    uint8_t *buf = malloc(chunk);
    if (!buf) {
        close(fd);
        return err_set(err, err_size, "out of memory (%zu bytes)", chunk);
    }
    int64_t done = 0;
    if (progress) progress(user, 0, (int64_t)st.st_size);
    while (done < (int64_t)st.st_size) {
        const ssize_t r = read(fd, buf, chunk);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            const int e = r < 0 ? errno : 0;
            free(buf);
            close(fd);
            return err_set(err, err_size, "reading '%s' at byte %lld: %s", path, (long long)done,
                           e ? strerror(e) : "unexpected end of file");
        }
        done += r;
        if (progress) progress(user, done, (int64_t)st.st_size);
    }
    free(buf);
    close(fd);
    return 0;
}

void kvf_close(kvf_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_bytes);
    if (f->fd >= 0) close(f->fd);
    free(f->meta);
    free(f->entries);
    free(f);
}

const void *kvf_find_index(const kvf_file *f, int layer, int head, const char *kind, size_t *bytes)
{
    for (int i = 0; i < f->n_index; i++) {
        const kvf_index_entry *e = &f->index[i];
        if (e->layer == layer && e->head == head && strncmp(e->kind, kind, 8) == 0) {
            *bytes = (size_t)e->bytes;
            return f->map + e->offset;
        }
    }
    return NULL;
}

void kvf_advise_random(kvf_file *f)
{
    const uint64_t kv = page_up((uint64_t)f->fp.n_layer * f->fp.n_kv_head * (uint64_t)f->cap *
                                attn_kv_row_bytes(f->elem, f->fp.head_dim));
    madvise(f->k, (size_t)kv, MADV_RANDOM); /* advice only: failure changes nothing */
    madvise(f->v, (size_t)kv, MADV_RANDOM);
    if (f->kt) madvise(f->kt, (size_t)kv, MADV_RANDOM);
}

/* The policy asks for an image when it is about to use it, and will scan
 * it again and again: read it in and map it now, in one sequential pass,
 * rather than a page fault at a time during decoding - when the file's
 * images fit easily in memory. When they do not (a million-token file on
 * a small machine), reading each one in whole would push the previous ones
 * and the K/V rows out of the page cache and read the file from disk at
 * every step: a search then faults in only the lists it probes. */
static const void *find_cb(const void *user, int layer, int kv_head, const char *kind, size_t *bytes)
{
    const kvf_file *f = user;
    const void *img = kvf_find_index(f, layer, kv_head, kind, bytes);
    if (img && f->populate) {
        const uintptr_t a = (uintptr_t)img & ~(uintptr_t)(KVF_PAGE - 1);
        const size_t len = (size_t)((uintptr_t)img + *bytes - a);
#ifdef MADV_POPULATE_READ
        if (madvise((void *)a, len, MADV_POPULATE_READ) != 0) /* kernels before 5.14 */
#endif
            madvise((void *)a, len, MADV_WILLNEED);
    }
    return img;
}

static int cmp_entry_off(const void *a, const void *b)
{
    const kvf_index_entry *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Parses and checks the index directory against the images region. */
static int read_dir(kvf_file *f, const kvf_header *h, const uint8_t *dir, char *err, size_t err_size)
{
    const int n = (int)h->n_index;
    f->entries = calloc(n ? (size_t)n : 1, sizeof *f->entries);
    kvf_index_entry *sorted = calloc(n ? (size_t)n : 1, sizeof *sorted);
    if (!f->entries || !sorted) {
        free(sorted);
        return err_set(err, err_size, "out of memory");
    }
    const uint64_t lo = h->images_off, hi = h->images_off + h->images_bytes;
    for (int i = 0; i < n; i++) {
        const uint8_t *e = dir + (size_t)i * 64;
        kvf_index_entry *x = &f->entries[i];
        memcpy(x->kind, e, 8);
        x->layer = (int32_t)get32(e, 8);
        x->head = (int32_t)get32(e, 12);
        x->offset = get64(e, 16);
        x->bytes = get64(e, 24);
        x->n = (int64_t)get64(e, 32);
        x->crc = get32(e, 40);
        size_t kl = strnlen(x->kind, 8);
        char kind[4 * 8 + 1];
        if (known_kind(x->kind, kl) < 0 || x->layer < 0 || x->layer >= h->fp.n_layer ||
            x->head < 0 || x->head >= h->fp.n_kv_head || x->offset % KVF_PAGE || x->bytes == 0 ||
            x->offset < lo || x->offset > hi || x->bytes > hi - x->offset || x->n != h->n) {
            free(sorted);
            return err_set(err, err_size, "index entry %d ('%s', layer %d, head %d) is invalid", i,
                           printable(x->kind, 8, kind), x->layer, x->head);
        }
        for (int j = 0; j < i; j++)
            if (f->entries[j].layer == x->layer && f->entries[j].head == x->head &&
                strncmp(f->entries[j].kind, x->kind, 8) == 0) {
                free(sorted);
                return err_set(err, err_size, "index entry %d duplicates entry %d", i, j);
            }
    }
    memcpy(sorted, f->entries, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_entry_off);
    for (int i = 1; i < n; i++)
        if (sorted[i].offset < sorted[i - 1].offset + sorted[i - 1].bytes) {
            free(sorted);
            return err_set(err, err_size, "index images overlap");
        }
    free(sorted);
    f->index = f->entries;
    f->n_index = n;
    return 0;
}

/* Data checksums; -1 names the first mismatch. */
static int verify_data(const kvf_file *f, const uint8_t *meta, const kvf_layout *L,
                       int n_threads, char *err, size_t err_size)
{
    const int64_t heads = (int64_t)L->heads;
    const int d = f->fp.head_dim;
    const size_t es = L->es, rows = (size_t)f->n * L->row;
    int64_t bad = -1;
    char what[8] = "";
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
    for (int64_t hh = 0; hh < heads; hh++) {
        const uint64_t at = (uint64_t)hh * f->cap * L->row;
        const char *w = NULL;
        if (kvf_crc32c(0, f->k + at, rows) != get32(meta, L->crck_at + hh * 4)) w = "K";
        else if (kvf_crc32c(0, f->v + at, rows) != get32(meta, L->crcv_at + hh * 4)) w = "V";
        else if (f->kt) {
            uint32_t c = 0;
            for (int64_t s0 = 0; s0 < f->n; s0 += KVF_KT_BLOCK) {
                const int64_t nb = f->n - s0 < KVF_KT_BLOCK ? f->n - s0 : KVF_KT_BLOCK;
                for (int j = 0; j < d; j++)
                    c = kvf_crc32c(c, f->kt + at + ((size_t)j * f->cap + (size_t)s0) * es, (size_t)nb * es);
            }
            if (c != get32(meta, L->crckt_at + hh * 4)) w = "K^T";
        }
        if (w) {
#pragma omp critical(kvf_verify)
            if (bad < 0 || hh < bad) {
                bad = hh;
                snprintf(what, sizeof what, "%s", w);
            }
        }
    }
    if (bad >= 0)
        return err_set(err, err_size, "data checksum mismatch in %s of layer %lld head %lld (corrupt file)",
                    what, (long long)(bad / f->fp.n_kv_head), (long long)(bad % f->fp.n_kv_head));
    int64_t bad_i = -1;
#pragma omp parallel for num_threads(n_threads) schedule(dynamic, 1)
    for (int i = 0; i < f->n_index; i++) {
        const kvf_index_entry *e = &f->index[i];
        if (kvf_crc32c(0, f->map + e->offset, (size_t)e->bytes) != e->crc) {
#pragma omp critical(kvf_verify)
            if (bad_i < 0 || i < bad_i) bad_i = i;
        }
    }
    if (bad_i >= 0)
        return err_set(err, err_size, "data checksum mismatch in the %.8s index of layer %d head %d (corrupt file)",
                    f->index[bad_i].kind, f->index[bad_i].layer, f->index[bad_i].head);
    return 0;
}

static int fingerprint_check(const kvf_fingerprint *file, const kvf_fingerprint *want, char *err,
                             size_t err_size)
{
    if (strncmp(file->arch, want->arch, 32) == 0 && file->n_layer == want->n_layer &&
        file->n_head == want->n_head && file->n_kv_head == want->n_kv_head &&
        file->head_dim == want->head_dim && file->n_embd == want->n_embd &&
        file->n_vocab == want->n_vocab && file->model_hash == want->model_hash)
        return 0;
    char a[320], b[320];
    describe(file, a, sizeof a);
    describe(want, b, sizeof b);
    return err_set(err, err_size, "made by another model (file: %s; this model: %s)", a, b);
}

static int open_checked(kvf_file *f, const char *path, const kvf_fingerprint *expect, int verify,
                        char *err, size_t err_size)
{
    f->fd = path_open_regular(path, O_RDONLY, NULL, 0); /* a FIFO here would block the reader for good */
    if (f->fd < 0)
        return err_set(err, err_size, "cannot open: %s", errno == EINVAL ? "not a regular file" : strerror(errno));
    struct stat st;
    if (fstat(f->fd, &st) != 0) return err_set(err, err_size, "cannot stat: %s", strerror(errno));
    if (st.st_size < KVF_PAGE)
        return err_set(err, err_size, "truncated or not a KV cache file (%lld bytes)", (long long)st.st_size);
    uint8_t hb[KVF_PAGE];
    if (pread_all(f->fd, hb, KVF_PAGE, 0)) return err_set(err, err_size, "cannot read the header");
    kvf_header h;
    if (header_get(&h, hb, err, err_size)) return -1;
    if (h.flags > 1) return err_set(err, err_size, "unknown flags %#x", h.flags);
    kvf_layout L;
    char e2[192];
    if (layout_of(&h.fp, (int)h.elem, h.n, h.cap, h.flags & 1, h.n_tokens, h.n_index, &L, e2, sizeof e2))
        return err_set(err, err_size, "bad header: %s", e2);
    if (h.meta_off != L.meta_off || h.meta_bytes != L.meta_bytes || h.k_off != L.k_off ||
        h.v_off != L.v_off || h.kt_off != L.kt_off || h.kv_bytes != L.kv_bytes ||
        h.images_off != L.images_off || h.images_bytes > ((uint64_t)1 << 50) ||
        h.file_bytes != h.images_off + h.images_bytes)
        return err_set(err, err_size, "bad header: section offsets do not match the shape");
    if ((uint64_t)st.st_size < h.file_bytes)
        return err_set(err, err_size, "truncated: %lld bytes, the header says %llu", (long long)st.st_size,
                    (unsigned long long)h.file_bytes);
    if ((uint64_t)st.st_size > h.file_bytes)
        return err_set(err, err_size, "%llu unexpected bytes after the end of the cache",
                    (unsigned long long)((uint64_t)st.st_size - h.file_bytes));
    if (expect && fingerprint_check(&h.fp, expect, err, err_size)) return -1;
    f->meta = malloc(L.meta_bytes ? (size_t)L.meta_bytes : 1);
    if (!f->meta) return err_set(err, err_size, "out of memory");
    if (pread_all(f->fd, f->meta, (size_t)L.meta_bytes, L.meta_off))
        return err_set(err, err_size, "cannot read the metadata");
    if (kvf_crc32c(0, f->meta, L.meta_bytes) != h.meta_crc)
        return err_set(err, err_size, "metadata checksum mismatch (corrupt file)");
    const uint8_t *meta = f->meta;
    if (read_dir(f, &h, meta + L.dir_at, err, err_size)) return -1;
    f->fp = h.fp;
    f->elem = (int)h.elem;
    f->n = h.n;
    f->cap = h.cap;
    f->n_tokens = h.n_tokens;
    f->tokens = (const int32_t *)(const void *)(meta + L.tokens_at);
    f->v_sum = (const float *)(const void *)(meta + L.vsum_at);
    f->file_bytes = h.file_bytes;
    f->map_bytes = (size_t)h.file_bytes;
    /* private and writable: the cache's later tokens land in private pages;
     * NORESERVE so a cache larger than RAM + swap can still be mapped */
    void *map = mmap(NULL, f->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, f->fd, 0);
    if (map == MAP_FAILED) return err_set(err, err_size, "cannot map %zu bytes: %s", f->map_bytes, strerror(errno));
    f->map = map;
    close(f->fd);
    f->fd = -1;
    f->k = f->map + h.k_off;
    f->v = f->map + h.v_off;
    f->kt = h.kt_off ? f->map + h.kt_off : NULL;
    f->source.find = find_cb;
    const int64_t avail = sysmem_available();
    f->populate = avail <= 0 || h.images_bytes <= (uint64_t)avail / 4;
    f->source.user = f;
    const uint64_t per_head = (uint64_t)f->n * L.row;
    f->data_bytes = L.heads * per_head * (f->kt ? 3 : 2);
    for (int i = 0; i < f->n_index; i++) f->data_bytes += f->index[i].bytes;
    if (verify == KVF_VERIFY_ALWAYS || (verify == KVF_VERIFY_AUTO && f->data_bytes <= KVF_VERIFY_LIMIT)) {
        if (verify_data(f, meta, &L, omp_get_num_procs(), err, err_size)) return -1;
        f->verified = 1;
    }
    return 0;
}

int kvf_open(const char *path, const kvf_fingerprint *expect, int verify, kvf_file **out,
             char *err, size_t err_size)
{
    *out = NULL;
    kvf_file *f = calloc(1, sizeof *f);
    if (!f) return err_set(err, err_size, "kvfile '%s': out of memory", path);
    f->fd = -1;
    char e2[384];
    if (open_checked(f, path, expect, verify, e2, sizeof e2)) {
        kvf_close(f);
        return err_set(err, err_size, "kvfile '%s': %s", path, e2);
    }
    *out = f;
    return 0;
}
