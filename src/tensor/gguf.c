/* gguf.c - GGUF v2/v3 reader (mmap or memory) and v3 writer. See gguf.h.
 *
 * Map of this file:
 *   1. cursor: bounds-checked little-endian reads with one-line errors
 *   2. key/value parsing
 *   3. tensor-info parsing and validation
 *   4. duplicate detection (sort, so hostile input cannot make it quadratic)
 *   5. gguf_parse / gguf_open / gguf_close
 *   6. lookups and typed getters
 *   7. writer
 *
 * Allocation bound: before anything is allocated, n_kv and n_tensors are
 * checked against the bytes left (a kv needs >= 13 bytes, a tensor info >= 32),
 * and every array/string count against the bytes left when it is read, so the
 * reader never allocates more than a small constant times the file size.
 */
#include "util/err.h"
#include "util/paths.h"
#include "tensor/gguf.h"

#include "tensor/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" read as a little-endian u32 */
#define GGUF_DEFAULT_ALIGNMENT 32
#define KV_MIN_BYTES 13     /* key length (8) + type (4) + smallest value (1) */
#define TENSOR_MIN_BYTES 32 /* name length 8, n_dims 4, one ne 8, type 4, offset 8 */
#define WRITER_MAX_NAME 63  /* llama.cpp rejects tensor names of >= 64 bytes */

static const char *const type_names[GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
};

/* Bytes of one scalar of `type`; 0 for str/arr (variable) and unknown ids. */
static size_t scalar_size(uint32_t type)
{
    switch (type) {
    case GGUF_U8: case GGUF_I8: case GGUF_BOOL: return 1;
    case GGUF_U16: case GGUF_I16: return 2;
    case GGUF_U32: case GGUF_I32: case GGUF_F32: return 4;
    case GGUF_U64: case GGUF_I64: case GGUF_F64: return 8;
    default: return 0;
    }
}

const char *gguf_type_name(uint32_t type)
{
    return type < GGUF_TYPE_COUNT ? type_names[type] : "unknown";
}

/* A printable rendering of an untrusted name for error messages: control and
 * non-ASCII bytes are escaped, long names cut, so one line stays one line. */
const char *gguf_str_show(gguf_str str, char *buf, size_t size)
{
    size_t o = 0;
    if (size == 0) return buf;
    for (uint64_t i = 0; i < str.len; i++) {
        unsigned char ch = (unsigned char)str.data[i];
        if (o + 8 >= size) {
            if (size >= 4) memcpy(buf + (o <= size - 4 ? o : size - 4), "...", 4);
            else buf[0] = 0;
            return buf;
        }
        if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\') {
            buf[o++] = (char)ch;
        } else {
            snprintf(buf + o, size - o, "\\x%02x", ch);
            o += 4;
        }
    }
    buf[o] = 0;
    return buf;
}

typedef struct { char s[96]; } name_buf;

static name_buf show(gguf_str str)
{
    name_buf b;
    gguf_str_show(str, b.s, sizeof b.s);
    return b;
}

/* ------------------------------------------------------------------ */
/* 1. cursor                                                            */

typedef struct cursor {
    const uint8_t *base;
    size_t size, pos;
    char *err;
    size_t err_size;
    /* what is being read, for "truncated" messages */
    const char *what;    /* "header", "kv", "tensor info"                */
    uint64_t idx, cnt;   /* item idx of cnt (when cnt != 0)                */
    const char *field;   /* "key", "value", ...                            */
} cursor;

static size_t remaining(const cursor *c) { return c->size - c->pos; }

/* Fails unless n more bytes are available. */
static int need(cursor *c, uint64_t n)
{
    if (n <= remaining(c)) return 0;
    char where[96];
    if (c->cnt)
        snprintf(where, sizeof where, "%s %" PRIu64 " of %" PRIu64 " (%s)", c->what, c->idx, c->cnt, c->field);
    else
        snprintf(where, sizeof where, "%s (%s)", c->what, c->field);
    err_set(c->err, c->err_size, "gguf: truncated: %s needs %" PRIu64 " bytes at offset %zu, file has %zu",
            where, n, c->pos, c->size);
    return -1;
}

static int rd_u32(cursor *c, const char *field, uint32_t *v)
{
    c->field = field;
    if (need(c, 4)) return -1;
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return 0;
}

static int rd_u64(cursor *c, const char *field, uint64_t *v)
{
    c->field = field;
    if (need(c, 8)) return -1;
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return 0;
}

/* A string is a view into the buffer; its length is checked against what remains. */
static int rd_str(cursor *c, const char *field, gguf_str *s)
{
    uint64_t len;
    if (rd_u64(c, field, &len)) return -1;
    if (need(c, len)) return -1;
    s->len = len;
    s->data = (const char *)c->base + c->pos;
    c->pos += (size_t)len;
    return 0;
}

/* ------------------------------------------------------------------ */
/* 2. key/value pairs                                                   */

static int parse_kv(cursor *c, gguf_kv *kv, uint64_t i)
{
    if (rd_str(c, "key", &kv->key)) return -1;
    if (rd_u32(c, "type", &kv->type)) return -1;
    if (kv->type >= GGUF_TYPE_COUNT) {
        err_set(c->err, c->err_size, "gguf: kv %" PRIu64 " '%s': unknown value type %" PRIu32 " (valid 0..%d)",
                i, show(kv->key).s, kv->type, GGUF_TYPE_COUNT - 1);
        return -1;
    }
    if (kv->type == GGUF_STR) {
        kv->n = 1;
        kv->data = c->base + c->pos;
        kv->strs = malloc(sizeof *kv->strs);
        if (!kv->strs) {
            err_set(c->err, c->err_size, "gguf: kv %" PRIu64 ": out of memory", i);
            return -1;
        }
        return rd_str(c, "string value", &kv->strs[0]);
    }
    if (kv->type != GGUF_ARR) {
        size_t sz = scalar_size(kv->type);
        c->field = "value";
        if (need(c, sz)) return -1;
        kv->n = 1;
        kv->data = c->base + c->pos;
        c->pos += sz;
        return 0;
    }

    if (rd_u32(c, "array type", &kv->arr_type)) return -1;
    if (kv->arr_type >= GGUF_TYPE_COUNT) {
        err_set(c->err, c->err_size, "gguf: kv %" PRIu64 " '%s': unknown array element type %" PRIu32 " (valid 0..%d)",
                i, show(kv->key).s, kv->arr_type, GGUF_TYPE_COUNT - 1);
        return -1;
    }
    if (kv->arr_type == GGUF_ARR) {
        err_set(c->err, c->err_size, "gguf: kv %" PRIu64 " '%s': arrays of arrays are not supported", i,
                show(kv->key).s);
        return -1;
    }
    if (rd_u64(c, "array length", &kv->n)) return -1;
    /* a string element needs at least its 8-byte length */
    size_t esz = kv->arr_type == GGUF_STR ? 8 : scalar_size(kv->arr_type);
    if (kv->n > remaining(c) / esz) {
        char needs[64];
        if (kv->n > UINT64_MAX / esz) /* the product itself overflows */
            snprintf(needs, sizeof needs, "%" PRIu64 " x %zu", kv->n, esz);
        else
            snprintf(needs, sizeof needs, "%s%" PRIu64, kv->arr_type == GGUF_STR ? ">= " : "", kv->n * esz);
        err_set(c->err, c->err_size,
                "gguf: truncated: kv %" PRIu64 " of %" PRIu64 " '%s' (array of %" PRIu64 " %s) needs %s bytes at offset %zu, file has %zu",
                i, c->cnt, show(kv->key).s, kv->n, type_names[kv->arr_type], needs, c->pos, c->size);
        return -1;
    }
    kv->data = c->base + c->pos;
    if (kv->arr_type != GGUF_STR) {
        c->pos += (size_t)kv->n * esz;
        return 0;
    }
    kv->strs = calloc(kv->n ? (size_t)kv->n : 1, sizeof *kv->strs);
    if (!kv->strs) {
        err_set(c->err, c->err_size, "gguf: kv %" PRIu64 " '%s': out of memory for %" PRIu64 " strings", i,
                show(kv->key).s, kv->n);
        return -1;
    }
    for (uint64_t j = 0; j < kv->n; j++)
        if (rd_str(c, "array string", &kv->strs[j])) return -1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* 3. tensor infos                                                      */

/* Reads one tensor info and checks what does not depend on the data section:
 * n_dims, ne (non-negative, product fits int64), type, block size, byte size. */
static int parse_tensor_info(cursor *c, gguf_tensor *t, uint64_t i)
{
    if (rd_str(c, "name", &t->name)) return -1;
    if (rd_u32(c, "n_dims", &t->n_dims)) return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS) {
        err_set(c->err, c->err_size, "gguf: tensor %" PRIu64 " '%s': n_dims %" PRIu32 " not in 1..%d", i,
                show(t->name).s, t->n_dims, GGUF_MAX_DIMS);
        return -1;
    }
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if (rd_u64(c, "ne", &v)) return -1;
        if (v > (uint64_t)INT64_MAX) {
            err_set(c->err, c->err_size, "gguf: tensor %" PRIu64 " '%s': ne[%" PRIu32 "] = %" PRId64 " is negative", i,
                    show(t->name).s, d, (int64_t)v);
            return -1;
        }
        t->ne[d] = (int64_t)v;
    }
    if (rd_u32(c, "type", &t->type)) return -1;
    if (rd_u64(c, "offset", &t->offset)) return -1;

    /* The element count must fit int64 (llama.cpp's rule); rows are counted
     * separately because ne[0] == 0 would hide an overflow among the others. */
    int64_t n_el = 1, rows = 1;
    int overflow = 0;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        if (t->ne[d] != 0 && n_el > INT64_MAX / t->ne[d]) overflow = 1;
        else n_el *= t->ne[d];
        if (d > 0) {
            if (t->ne[d] != 0 && rows > INT64_MAX / t->ne[d]) overflow = 1;
            else rows *= t->ne[d];
        }
    }
    if (overflow) {
        err_set(c->err, c->err_size,
                "gguf: tensor %" PRIu64 " '%s': element count of [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "] overflows int64",
                i, show(t->name).s, t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
        return -1;
    }
    const quant_traits *tr = quant_traits_of(t->type);
    if (!tr) {
        err_set(c->err, c->err_size, "gguf: tensor %" PRIu64 " '%s': unknown tensor type %" PRIu32, i,
                show(t->name).s, t->type);
        return -1;
    }
    size_t row_bytes;
    if (quant_row_bytes(t->type, t->ne[0], &row_bytes)) {
        err_set(c->err, c->err_size, "gguf: tensor %" PRIu64 " '%s': ne[0] = %" PRId64 " not a multiple of block size %" PRId64 " of type %s",
                i, show(t->name).s, t->ne[0], tr->block_size, tr->name);
        return -1;
    }
    if (row_bytes != 0 && (uint64_t)rows > UINT64_MAX / row_bytes) {
        err_set(c->err, c->err_size, "gguf: tensor %" PRIu64 " '%s': byte size %zu x %" PRId64 " rows overflows", i,
                show(t->name).s, row_bytes, rows);
        return -1;
    }
    t->nbytes = (uint64_t)row_bytes * (uint64_t)rows;
    return 0;
}

/* ------------------------------------------------------------------ */
/* 4. duplicates                                                        */

typedef struct name_ref {
    gguf_str name;
    uint64_t idx;
} name_ref;

static int cmp_ref(const void *pa, const void *pb)
{
    const name_ref *a = pa, *b = pb;
    if (a->name.len != b->name.len) return a->name.len < b->name.len ? -1 : 1;
    int r = a->name.len ? memcmp(a->name.data, b->name.data, (size_t)a->name.len) : 0;
    if (r) return r;
    return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Sorting (n log n compares, each bounded by the name length) rather than
 * pairwise comparison, so a file with many keys cannot make this quadratic.
 * names(i) is read through a stride so kvs and tensors share the code. */
static int check_duplicates(const void *items, size_t stride, uint64_t n, const char *what,
                            char *err, size_t err_size)
{
    if (n < 2) return 0;
    name_ref *refs = malloc((size_t)n * sizeof *refs);
    if (!refs) {
        err_set(err, err_size, "gguf: out of memory checking %" PRIu64 " %s names", n, what);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        /* both gguf_kv and gguf_tensor start with their gguf_str name */
        memcpy(&refs[i].name, (const char *)items + i * stride, sizeof(gguf_str));
        refs[i].idx = i;
    }
    qsort(refs, (size_t)n, sizeof *refs, cmp_ref);
    int rc = 0;
    for (uint64_t i = 1; i < n; i++) {
        if (refs[i].name.len == refs[i - 1].name.len &&
            (refs[i].name.len == 0 || memcmp(refs[i].name.data, refs[i - 1].name.data, (size_t)refs[i].name.len) == 0)) {
            err_set(err, err_size, "gguf: duplicate %s name '%s': %s %" PRIu64 " and %" PRIu64, what,
                    show(refs[i].name).s, what, refs[i - 1].idx, refs[i].idx);
            rc = -1;
            break;
        }
    }
    free(refs);
    return rc;
}

/* ------------------------------------------------------------------ */
/* 5. parse / open / close                                              */

static int read_header(cursor *c, gguf_file *f)
{
    c->what = "header";
    uint32_t magic;
    if (rd_u32(c, "magic", &magic)) return -1;
    if (magic != GGUF_MAGIC) {
        err_set(c->err, c->err_size, "gguf: bad magic: 0x%08" PRIx32 " (expected 0x%08x, \"GGUF\")", magic, GGUF_MAGIC);
        return -1;
    }
    if (rd_u32(c, "version", &f->version)) return -1;
    if (f->version != 2 && f->version != 3) {
        const char *why = f->version == 1 ? " (GGUF v1 is obsolete)"
                        : f->version == 0x02000000u || f->version == 0x03000000u ? " (big-endian file?)" : "";
        err_set(c->err, c->err_size, "gguf: unsupported version: %" PRIu32 "%s, supported 2 and 3", f->version, why);
        return -1;
    }
    if (rd_u64(c, "n_tensors", &f->n_tensors)) return -1;
    if (rd_u64(c, "n_kv", &f->n_kv)) return -1;
    size_t rem = remaining(c);
    if (f->n_kv > rem / KV_MIN_BYTES) {
        err_set(c->err, c->err_size, "gguf: n_kv too large: %" PRIu64 ", at most %zu fit in the %zu bytes after offset %zu",
                f->n_kv, rem / KV_MIN_BYTES, rem, c->pos);
        return -1;
    }
    rem -= (size_t)f->n_kv * KV_MIN_BYTES;
    if (f->n_tensors > rem / TENSOR_MIN_BYTES) {
        err_set(c->err, c->err_size,
                "gguf: n_tensors too large: %" PRIu64 ", at most %zu fit in the %zu bytes left after offset %zu and %" PRIu64 " kvs",
                f->n_tensors, rem / TENSOR_MIN_BYTES, rem, c->pos, f->n_kv);
        return -1;
    }
    return 0;
}

/* general.alignment, if present, must be a u32 power of two. */
static int read_alignment(gguf_file *f, char *err, size_t err_size)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv) return 0;
    if (kv->type != GGUF_U32) {
        err_set(err, err_size, "gguf: general.alignment: type %s, expected u32", gguf_type_name(kv->type));
        return -1;
    }
    uint32_t a;
    memcpy(&a, kv->data, 4);
    if (a == 0 || (a & (a - 1)) != 0) {
        err_set(err, err_size, "gguf: general.alignment: %" PRIu32 " is not a nonzero power of two", a);
        return -1;
    }
    f->alignment = a;
    return 0;
}

/* Places the data section and every tensor in it. */
static int place_tensors(gguf_file *f, size_t infos_end, char *err, size_t err_size)
{
    /* llama.cpp pads to the data section only when there are tensors, and
     * vocab-only files end right after the infos. */
    uint64_t start = infos_end;
    if (f->n_tensors > 0) start = (start + f->alignment - 1) / f->alignment * f->alignment;
    f->data_offset = start;
    if (f->n_tensors > 0 && start > f->size) {
        err_set(err, err_size, "gguf: data section starts at %" PRIu64 ", past end of file (%zu bytes)", start, f->size);
        return -1;
    }
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0) {
            err_set(err, err_size, "gguf: tensor '%s': offset %" PRIu64 " not a multiple of alignment %" PRIu64,
                    show(t->name).s, t->offset, f->alignment);
            return -1;
        }
        uint64_t avail = f->size - start;
        if (t->offset > avail || t->nbytes > avail - t->offset) {
            /* the end may not fit in 64 bits: print it as start + offset + nbytes */
            err_set(err, err_size,
                    "gguf: tensor '%s': data [%" PRIu64 " + %" PRIu64 ", +%" PRIu64 " bytes) past end of file (%zu bytes)",
                    show(t->name).s, start, t->offset, t->nbytes, f->size);
            return -1;
        }
        t->data = f->base + start + t->offset;
    }
    return 0;
}

int gguf_parse(const void *buf, size_t size, gguf_file **out, char *err, size_t err_size)
{
    *out = NULL;
    if (size == 0) {
        err_set(err, err_size, "gguf: empty file (0 bytes)");
        return -1;
    }
    if (!buf) {
        err_set(err, err_size, "gguf: NULL buffer of %zu bytes", size);
        return -1;
    }
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) {
        err_set(err, err_size, "gguf: out of memory");
        return -1;
    }
    f->base = buf;
    f->size = size;
    cursor c = { .base = buf, .size = size, .err = err, .err_size = err_size };
    if (read_header(&c, f)) goto fail;

    /* counts are bounded by the file size above, so these cannot be absurd */
    uint64_t n_kv = f->n_kv, n_tensors = f->n_tensors;
    f->n_kv = f->n_tensors = 0; /* gguf_close frees only what was allocated */
    f->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) {
        err_set(err, err_size, "gguf: out of memory for %" PRIu64 " kvs and %" PRIu64 " tensors", n_kv, n_tensors);
        goto fail;
    }
    f->n_kv = n_kv;
    f->n_tensors = n_tensors;

    c.what = "kv";
    c.cnt = n_kv;
    for (uint64_t i = 0; i < n_kv; i++) {
        c.idx = i;
        if (parse_kv(&c, &f->kv[i], i)) goto fail;
    }
    if (check_duplicates(f->kv, sizeof *f->kv, n_kv, "kv", err, err_size)) goto fail;
    if (read_alignment(f, err, err_size)) goto fail;

    c.what = "tensor info";
    c.cnt = n_tensors;
    for (uint64_t i = 0; i < n_tensors; i++) {
        c.idx = i;
        if (parse_tensor_info(&c, &f->tensors[i], i)) goto fail;
    }
    if (check_duplicates(f->tensors, sizeof *f->tensors, n_tensors, "tensor", err, err_size)) goto fail;
    if (place_tensors(f, c.pos, err, err_size)) goto fail;
    *out = f;
    return 0;

fail:
    gguf_close(f);
    return -1;
}

/* size bytes of fd into anonymous memory advised for huge pages; NULL with
 * err set on failure (out of memory, a read error, or the file shrinking). */
static void *read_to_anon(int fd, const char *path, size_t size, char *err, size_t err_size)
{
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        err_set(err, err_size, "gguf: cannot allocate %zu bytes for '%s': %s", size, path, strerror(errno));
        return NULL;
    }
    madvise(mem, size, MADV_HUGEPAGE); /* advice only: without it the copy still works */
    size_t done = 0;
    while (done < size) {
        const size_t chunk = size - done < ((size_t)64 << 20) ? size - done : ((size_t)64 << 20);
        ssize_t got = pread(fd, (char *)mem + done, chunk, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got < 0) err_set(err, err_size, "gguf: cannot read '%s': %s", path, strerror(errno));
            else err_set(err, err_size, "gguf: '%s' shrank to %zu bytes while being read", path, done);
            munmap(mem, size);
            return NULL;
        }
        done += (size_t)got;
    }
    return mem;
}

int gguf_open(const char *path, gguf_file **out, char *err, size_t err_size)
{
    return gguf_open_mode(path, GGUF_OPEN_MMAP, out, err, err_size);
}

int gguf_open_mode(const char *path, int mode, gguf_file **out, char *err, size_t err_size)
{
    *out = NULL;
    /* never blocks: a FIFO or device named as the model is refused at once */
    int fd = path_open_regular(path, O_RDONLY, NULL, 0);
    if (fd < 0) {
        if (errno == EINVAL) {
            struct stat ls;
            err_set(err, err_size, "gguf: '%s': %s", path,
                    stat(path, &ls) == 0 && S_ISDIR(ls.st_mode) ? "is a directory" : "not a regular file");
        } else {
            err_set(err, err_size, "gguf: cannot open '%s': %s", path, strerror(errno));
        }
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err_set(err, err_size, "gguf: cannot stat '%s': %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (S_ISDIR(st.st_mode) || !S_ISREG(st.st_mode)) {
        err_set(err, err_size, "gguf: '%s': %s", path, S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
        close(fd);
        return -1;
    }
    if (st.st_size == 0) {
        err_set(err, err_size, "gguf: '%s': empty file (0 bytes)", path);
        close(fd);
        return -1;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        err_set(err, err_size, "gguf: '%s': %lld bytes do not fit in memory", path, (long long)st.st_size);
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    if (mode == GGUF_OPEN_AUTO) {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        mode = pages > 0 && page > 0 && (double)size <= 0.5 * (double)pages * (double)page ? GGUF_OPEN_COPY
                                                                                             : GGUF_OPEN_MMAP;
    }
    void *map;
    if (mode == GGUF_OPEN_COPY) {
        map = read_to_anon(fd, path, size, err, err_size);
        close(fd);
        if (!map) return -1;
    } else {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        int map_errno = errno;
        close(fd); /* the mapping keeps the file alive */
        if (map == MAP_FAILED) {
            err_set(err, err_size, "gguf: cannot mmap '%s' (%zu bytes): %s", path, size, strerror(map_errno));
            return -1;
        }
    }
    gguf_file *f;
    if (gguf_parse(map, size, &f, err, err_size)) {
        munmap(map, size);
        return -1;
    }
    f->owns_map = 1;
    *out = f;
    return 0;
}

void gguf_close(gguf_file *f)
{
    if (!f) return;
    if (f->kv)
        for (uint64_t i = 0; i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    if (f->owns_map) munmap((void *)f->base, f->size);
    free(f);
}

/* ------------------------------------------------------------------ */
/* 6. lookups and getters                                               */

int gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.data, c, n) == 0);
}

/* Linear scans: files have tens of keys and at most a few thousand tensors,
 * and a scan needs no index that could go stale. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    if (!f || !key) return NULL;
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    if (!f || !name) return NULL;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

/* Integer element at p; 0 on success, -1 for non-integer types or a u64 that
 * does not fit int64. */
static int load_int(uint32_t type, const uint8_t *p, int64_t *out)
{
    switch (type) {
    case GGUF_U8:  { uint8_t v;  memcpy(&v, p, 1); *out = v; return 0; }
    case GGUF_I8:  { int8_t v;   memcpy(&v, p, 1); *out = v; return 0; }
    case GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 0; }
    case GGUF_I16: { int16_t v;  memcpy(&v, p, 2); *out = v; return 0; }
    case GGUF_U32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 0; }
    case GGUF_I32: { int32_t v;  memcpy(&v, p, 4); *out = v; return 0; }
    case GGUF_I64: { int64_t v;  memcpy(&v, p, 8); *out = v; return 0; }
    case GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
        return 0;
    }
    default: return -1;
    }
}

/* Any number at p as double; -1 for bool/str/arr. */
static int load_float(uint32_t type, const uint8_t *p, double *out)
{
    switch (type) {
    case GGUF_F32: { float v;  memcpy(&v, p, 4); *out = v; return 0; }
    case GGUF_F64: { double v; memcpy(&v, p, 8); *out = v; return 0; }
    case GGUF_U64: { uint64_t v; memcpy(&v, p, 8); *out = (double)v; return 0; }
    default: {
        int64_t v;
        if (load_int(type, p, &v)) return -1;
        *out = (double)v;
        return 0;
    }
    }
}

int gguf_get_int(const gguf_file *f, const char *key, int64_t *out)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type == GGUF_ARR || load_int(kv->type, kv->data, out)) return -1;
    return 1;
}

int gguf_get_float(const gguf_file *f, const char *key, double *out)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type == GGUF_ARR || load_float(kv->type, kv->data, out)) return -1;
    return 1;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_BOOL) return -1;
    *out = *(const uint8_t *)kv->data != 0;
    return 1;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return 0;
    if (kv->type != GGUF_STR) return -1;
    *out = kv->strs[0];
    return 1;
}

/* Element type and address of element i of a kv (arrays or scalars), or
 * NULL for strings and out-of-range i. */
static const uint8_t *element(const gguf_kv *kv, uint64_t i, uint32_t *type)
{
    if (!kv || i >= kv->n) return NULL;
    *type = kv->type == GGUF_ARR ? kv->arr_type : kv->type;
    size_t sz = scalar_size(*type);
    if (sz == 0) return NULL;
    return (const uint8_t *)kv->data + i * sz;
}

double gguf_arr_float(const gguf_kv *kv, uint64_t i)
{
    uint32_t type;
    const uint8_t *p = element(kv, i, &type);
    double v;
    if (!p) return 0.0;
    if (type == GGUF_BOOL) return *p != 0;
    return load_float(type, p, &v) ? 0.0 : v;
}

int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i)
{
    uint32_t type;
    const uint8_t *p = element(kv, i, &type);
    int64_t v;
    if (!p) return 0;
    if (type == GGUF_BOOL) return *p != 0;
    if (load_int(type, p, &v) == 0) return v;
    if (type == GGUF_U64) return INT64_MAX; /* a u64 beyond int64 saturates */
    double d;
    if (load_float(type, p, &d) || d != d) return 0;
    /* out-of-range float -> int conversion is undefined, so clamp first */
    if (d >= 9223372036854775807.0) return INT64_MAX;
    if (d <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)d;
}

/* ------------------------------------------------------------------ */
/* 7. writer                                                            */

typedef struct writer_tensor {
    char        *name;
    uint32_t     type, n_dims;
    int64_t      ne[GGUF_MAX_DIMS];
    uint64_t     nbytes, offset;
    gguf_fill_fn fill;
    void        *user;
} writer_tensor;

struct gguf_writer {
    uint8_t *kv_buf;          /* serialised kv pairs, in insertion order */
    size_t   kv_len, kv_cap;
    uint64_t n_kv;
    char   **keys;            /* [n_kv] for duplicate checks             */
    size_t   keys_cap;
    writer_tensor *tensors;   /* [n_tensors]                             */
    uint64_t n_tensors;
    size_t   tensors_cap;
    uint64_t data_size;       /* padded bytes of the data section so far */
    int      failed;          /* sticky: the first error is kept in err   */
    char     err[256];
};

static int wfail(gguf_writer *w, const char *fmt, ...)
{
    if (!w->failed) {
        va_list ap;
        va_start(ap, fmt);
        err_setv(w->err, sizeof w->err, fmt, ap);
        va_end(ap);
        w->failed = 1;
    }
    return -1;
}

/* Grows *p (elements of `size`) so it holds at least `want`. */
static int grow(void **p, size_t *cap, size_t want, size_t size)
{
    if (want <= *cap) return 0;
    size_t n = *cap ? *cap : 16;
    while (n < want) {
        if (n > SIZE_MAX / 2 / size) return -1;
        n *= 2;
    }
    void *q = realloc(*p, n * size);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

gguf_writer *gguf_writer_create(void)
{
    return calloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->kv_buf);
    free(w);
}

const char *gguf_writer_error(const gguf_writer *w)
{
    if (!w) return "gguf: writer is NULL (out of memory?)";
    return w->failed ? w->err : "";
}

static int put(gguf_writer *w, const void *p, size_t n)
{
    if (w->kv_len > SIZE_MAX - n || grow((void **)&w->kv_buf, &w->kv_cap, w->kv_len + n, 1))
        return wfail(w, "gguf: writer: out of memory for metadata");
    if (n) memcpy(w->kv_buf + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_u32(gguf_writer *w, uint32_t v) { return put(w, &v, 4); }
static int put_u64(gguf_writer *w, uint64_t v) { return put(w, &v, 8); }

static int put_str(gguf_writer *w, const char *s)
{
    size_t n = strlen(s);
    return put_u64(w, n) || put(w, s, n) ? -1 : 0;
}

/* Starts a kv: checks the key, records it, writes key and type. On a later
 * failure the buffer holds a partial kv, but the writer is then failed and
 * writes nothing. */
static int begin_kv(gguf_writer *w, const char *key, uint32_t type)
{
    if (!w) return -1;
    if (w->failed) return -1;
    if (!key) return wfail(w, "gguf: writer: NULL key");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return wfail(w, "gguf: writer: duplicate key '%s'", key);
    char *copy = strdup(key);
    if (!copy || grow((void **)&w->keys, &w->keys_cap, (size_t)w->n_kv + 1, sizeof *w->keys)) {
        free(copy);
        return wfail(w, "gguf: writer: out of memory for key '%s'", key);
    }
    w->keys[w->n_kv++] = copy;
    return put_str(w, key) || put_u32(w, type) ? -1 : 0;
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    return begin_kv(w, key, GGUF_U32) || put_u32(w, v) ? -1 : 0;
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    return begin_kv(w, key, GGUF_I32) || put(w, &v, 4) ? -1 : 0;
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    return begin_kv(w, key, GGUF_F32) || put(w, &v, 4) ? -1 : 0;
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    return begin_kv(w, key, GGUF_BOOL) || put(w, &b, 1) ? -1 : 0;
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    if (w && !v) return wfail(w, "gguf: writer: NULL string for key '%s'", key ? key : "(null)");
    return begin_kv(w, key, GGUF_STR) || put_str(w, v) ? -1 : 0;
}

static int begin_arr(gguf_writer *w, const char *key, uint32_t elem, const void *v, uint64_t n)
{
    if (w && n > 0 && !v) return wfail(w, "gguf: writer: NULL array for key '%s'", key ? key : "(null)");
    return begin_kv(w, key, GGUF_ARR) || put_u32(w, elem) || put_u64(w, n) ? -1 : 0;
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
    if (begin_arr(w, key, GGUF_STR, v, n)) return -1;
    for (uint64_t i = 0; i < n; i++) {
        if (!v[i]) return wfail(w, "gguf: writer: key '%s': string %" PRIu64 " is NULL", key, i);
        if (put_str(w, v[i])) return -1;
    }
    return 0;
}

int gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    if (begin_arr(w, key, GGUF_F32, v, n)) return -1;
    if (n > SIZE_MAX / 4) return wfail(w, "gguf: writer: key '%s': %" PRIu64 " elements too many", key, n);
    return put(w, v, (size_t)n * 4);
}

int gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    if (begin_arr(w, key, GGUF_I32, v, n)) return -1;
    if (n > SIZE_MAX / 4) return wfail(w, "gguf: writer: key '%s': %" PRIu64 " elements too many", key, n);
    return put(w, v, (size_t)n * 4);
}

static uint64_t pad_to(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const int64_t *ne,
                           gguf_fill_fn fill, void *user)
{
    if (!w || w->failed) return -1;
    if (!name || !ne) return wfail(w, "gguf: writer: tensor with NULL name or shape");
    size_t len = strlen(name);
    if (len == 0 || len > WRITER_MAX_NAME)
        return wfail(w, "gguf: writer: tensor name '%s' has %zu bytes, need 1..%d", name, len, WRITER_MAX_NAME);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) return wfail(w, "gguf: writer: duplicate tensor '%s'", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return wfail(w, "gguf: writer: tensor '%s': n_dims %" PRIu32 " not in 1..%d", name, n_dims, GGUF_MAX_DIMS);
    const quant_traits *tr = quant_traits_of(type);
    if (!tr) return wfail(w, "gguf: writer: tensor '%s': unknown type %" PRIu32, name, type);

    writer_tensor t = { .type = type, .n_dims = n_dims, .fill = fill, .user = user };
    int64_t n_el = 1, rows = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = (uint32_t)d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0) return wfail(w, "gguf: writer: tensor '%s': ne[%d] = %" PRId64 " is negative", name, d, t.ne[d]);
        if (t.ne[d] != 0 && (n_el > INT64_MAX / t.ne[d] || rows > INT64_MAX / t.ne[d]))
            return wfail(w, "gguf: writer: tensor '%s': element count overflows int64", name);
        n_el *= t.ne[d];
        if (d > 0) rows *= t.ne[d];
    }
    size_t row_bytes;
    if (quant_row_bytes(type, t.ne[0], &row_bytes))
        return wfail(w, "gguf: writer: tensor '%s': ne[0] = %" PRId64 " not a multiple of block size %" PRId64 " of %s",
                     name, t.ne[0], tr->block_size, tr->name);
    if (row_bytes && (uint64_t)rows > (UINT64_MAX - GGUF_DEFAULT_ALIGNMENT - w->data_size) / row_bytes)
        return wfail(w, "gguf: writer: tensor '%s': data size overflows", name);
    t.nbytes = (uint64_t)row_bytes * (uint64_t)rows;
    t.offset = w->data_size;
    t.name = strdup(name);
    if (!t.name || grow((void **)&w->tensors, &w->tensors_cap, (size_t)w->n_tensors + 1, sizeof *w->tensors)) {
        free(t.name);
        return wfail(w, "gguf: writer: out of memory for tensor '%s'", name);
    }
    w->tensors[w->n_tensors++] = t;
    w->data_size = pad_to(t.offset + t.nbytes, GGUF_DEFAULT_ALIGNMENT);
    return 0;
}

/* Output with a running position and a sticky error. */
typedef struct wfile {
    FILE    *fp;
    uint64_t pos;
    int      bad;
} wfile;

static void wout(wfile *o, const void *p, size_t n)
{
    if (o->bad || n == 0) return;
    if (fwrite(p, 1, n, o->fp) != n) o->bad = errno ? errno : EIO;
    o->pos += n;
}

static void wout_u32(wfile *o, uint32_t v) { wout(o, &v, 4); }
static void wout_u64(wfile *o, uint64_t v) { wout(o, &v, 8); }

static void wout_pad(wfile *o)
{
    static const uint8_t zeros[GGUF_DEFAULT_ALIGNMENT];
    wout(o, zeros, (size_t)(pad_to(o->pos, GGUF_DEFAULT_ALIGNMENT) - o->pos));
}

int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t err_size)
{
    if (!w) {
        err_set(err, err_size, "%s", gguf_writer_error(w));
        return -1;
    }
    if (w->failed) {
        err_set(err, err_size, "%s", w->err);
        return -1;
    }
    uint64_t max_bytes = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].nbytes > max_bytes) max_bytes = w->tensors[i].nbytes;
    if (max_bytes > SIZE_MAX) {
        err_set(err, err_size, "gguf: writer: a %" PRIu64 "-byte tensor does not fit in memory", max_bytes);
        return -1;
    }
    /* one buffer, reused: the fill callback produces a whole tensor */
    uint8_t *buf = max_bytes ? malloc((size_t)max_bytes) : NULL;
    if (max_bytes && !buf) {
        err_set(err, err_size, "gguf: writer: out of memory for a %" PRIu64 "-byte tensor buffer", max_bytes);
        return -1;
    }
    wfile o = { .fp = fopen(path, "wb") };
    if (!o.fp) {
        err_set(err, err_size, "gguf: cannot create '%s': %s", path, strerror(errno));
        free(buf);
        return -1;
    }
    errno = 0;
    wout_u32(&o, GGUF_MAGIC);
    wout_u32(&o, 3);
    wout_u64(&o, w->n_tensors);
    wout_u64(&o, w->n_kv);
    wout(&o, w->kv_buf, w->kv_len);
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        size_t len = strlen(t->name);
        wout_u64(&o, len);
        wout(&o, t->name, len);
        wout_u32(&o, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) wout_u64(&o, (uint64_t)t->ne[d]);
        wout_u32(&o, t->type);
        wout_u64(&o, t->offset);
    }
    /* like llama.cpp: the data section is aligned, and every tensor is
     * padded, so offsets are the running padded sizes */
    wout_pad(&o);
    int rc = 0;
    for (uint64_t i = 0; i < w->n_tensors && !o.bad; i++) {
        const writer_tensor *t = &w->tensors[i];
        size_t n = (size_t)t->nbytes;
        if (n) memset(buf, 0, n);
        if (t->fill && n && t->fill(t->user, buf, n) != 0) {
            err_set(err, err_size, "gguf: writer: fill callback failed for tensor '%s'", t->name);
            rc = -1;
            break;
        }
        wout(&o, buf, n);
        wout_pad(&o);
    }
    if (fclose(o.fp) != 0 && !o.bad) o.bad = errno ? errno : EIO;
    if (rc == 0 && o.bad) {
        err_set(err, err_size, "gguf: cannot write '%s': %s", path, strerror(o.bad));
        rc = -1;
    }
    if (rc) unlink(path); /* never leave a truncated model behind */
    free(buf);
    return rc;
}
