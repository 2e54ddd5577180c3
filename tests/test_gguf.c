/* test_gguf.c - the GGUF reader and writer.
 *
 * 1. A hand-built image (byte builder below, independent of the writer) with
 *    every value type, arrays of each, and three tensors: values and tensor
 *    bytes read back exactly; typed getters and conversions.
 * 2. Malformed images, each checked for failure and a meaningful one-line
 *    message: truncation at every length, bad magic/version/counts/types/
 *    dims/offsets/alignment, duplicates, unreadable files.
 * 3. Writer round trip through a temp file; writer errors.
 * 4. Real files: stories260K.gguf against llama2.c's stories260K.bin and the
 *    golden README facts, every model in golden/llamacpp/MODELS.md (types,
 *    shapes, sizes, packed layout; a section without a table through the
 *    section it borrows shapes from and its one-sentence type rule), and
 *    llama.cpp's vocab-only GGUFs.
 */
#include "tensor/gguf.h"
#include "util/paths.h"
#include "tensor/quant.h"
#include "test.h"

#include <fnmatch.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------ */
/* byte builder                                                         */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) { fprintf(stderr, "out of memory\n"); exit(1); }
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void bb_u8(bb *b, uint8_t v) { bb_put(b, &v, 1); }
static void bb_u16(bb *b, uint16_t v) { bb_put(b, &v, 2); }
static void bb_u32(bb *b, uint32_t v) { bb_put(b, &v, 4); }
static void bb_u64(bb *b, uint64_t v) { bb_put(b, &v, 8); }
static void bb_f32(bb *b, float v) { bb_put(b, &v, 4); }
static void bb_f64(bb *b, double v) { bb_put(b, &v, 8); }
static void bb_str(bb *b, const char *s) { bb_u64(b, strlen(s)); bb_put(b, s, strlen(s)); }
static void bb_free(bb *b) { free(b->p); memset(b, 0, sizeof *b); }

static void hdr(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    bb_u32(b, 0x46554747u);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}
static void kv_head(bb *b, const char *key, uint32_t type) { bb_str(b, key); bb_u32(b, type); }
static void kv_u32(bb *b, const char *key, uint32_t v) { kv_head(b, key, GGUF_U32); bb_u32(b, v); }
static void arr_head(bb *b, const char *key, uint32_t elem, uint64_t n)
{
    kv_head(b, key, GGUF_ARR);
    bb_u32(b, elem);
    bb_u64(b, n);
}
static void tinfo(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset)
{
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) bb_u64(b, ne[i]);
    bb_u32(b, type);
    bb_u64(b, offset);
}
static void pad_to(bb *b, size_t align) { while (b->n % align) bb_u8(b, 0); }
static uint8_t pattern(size_t i) { return (uint8_t)(i * 7 + 3); }
/* Appends n pattern bytes (pattern index from `from`). */
static void data_bytes(bb *b, size_t from, size_t n) { for (size_t i = 0; i < n; i++) bb_u8(b, pattern(from + i)); }

/* Parses an exact-size heap copy so ASan sees any read past the end. */
static int parse_copy(const uint8_t *p, size_t n, gguf_file **f, char *err, size_t err_size)
{
    uint8_t *copy = malloc(n ? n : 1);
    if (n) memcpy(copy, p, n);
    int rc = gguf_parse(n ? copy : NULL, n, f, err, err_size);
    if (rc == 0) { gguf_close(*f); *f = NULL; } /* views into copy die with it */
    free(copy);
    return rc;
}

/* Checks that the image fails with a one-line "gguf: " message containing `want`. */
static void expect_fail_at(const uint8_t *p, size_t n, const char *want, const char *what, int line)
{
    gguf_file *f = (gguf_file *)1;
    char err[512] = "";
    int rc = parse_copy(p, n, &f, err, sizeof err);
    int ok = rc == -1 && f == NULL && strncmp(err, "gguf: ", 6) == 0 && strchr(err, '\n') == NULL &&
             strstr(err, want) != NULL;
    CHECK(ok, "line %d: %s: rc %d, error '%s', want '%s'", line, what, rc, err, want);
}
#define EXPECT_FAIL(b, want, what) expect_fail_at((b)->p, (b)->n, want, what, __LINE__)

/* ------------------------------------------------------------------ */
/* 1. a valid image with every value type                               */

#define SMALL_N_KV 24
#define SMALL_DATA 170 /* 48 (F32 4x3) pad 64, 68 (Q8_0 32x2) pad 96, 10 (F16 5) */

/* Builds the image; *meta_end = end of tensor infos, *data_start = data section. */
static void build_small(bb *b, uint32_t version, size_t *meta_end, size_t *data_start)
{
    hdr(b, version, 3, SMALL_N_KV);
    kv_head(b, "t.u8", GGUF_U8); bb_u8(b, 200);
    kv_head(b, "t.i8", GGUF_I8); bb_u8(b, (uint8_t)(int8_t)-100);
    kv_head(b, "t.u16", GGUF_U16); bb_u16(b, 60000);
    kv_head(b, "t.i16", GGUF_I16); bb_u16(b, (uint16_t)(int16_t)-30000);
    kv_u32(b, "t.u32", 4000000000u);
    kv_head(b, "t.i32", GGUF_I32); bb_u32(b, (uint32_t)(int32_t)-2000000000);
    kv_head(b, "t.f32", GGUF_F32); bb_f32(b, 1.5f);
    kv_head(b, "t.bool", GGUF_BOOL); bb_u8(b, 1);
    kv_head(b, "t.str", GGUF_STR); bb_str(b, "hello");
    kv_head(b, "t.u64", GGUF_U64); bb_u64(b, (1ull << 63) + 5); /* beyond int64 */
    kv_head(b, "t.i64", GGUF_I64); bb_u64(b, (uint64_t)-(1ll << 62));
    kv_head(b, "t.f64", GGUF_F64); bb_f64(b, -3.25);
    arr_head(b, "a.u8", GGUF_U8, 3); bb_u8(b, 1); bb_u8(b, 2); bb_u8(b, 255);
    arr_head(b, "a.i8", GGUF_I8, 2); bb_u8(b, (uint8_t)-1); bb_u8(b, 127);
    arr_head(b, "a.u16", GGUF_U16, 2); bb_u16(b, 65535); bb_u16(b, 7);
    arr_head(b, "a.i16", GGUF_I16, 2); bb_u16(b, (uint16_t)-2); bb_u16(b, 300);
    arr_head(b, "a.i32", GGUF_I32, 3); bb_u32(b, (uint32_t)-7); bb_u32(b, 0); bb_u32(b, 123456);
    arr_head(b, "a.f32", GGUF_F32, 3); bb_f32(b, 0.5f); bb_f32(b, -2.75f); bb_f32(b, 1e30f);
    arr_head(b, "a.bool", GGUF_BOOL, 2); bb_u8(b, 0); bb_u8(b, 1);
    arr_head(b, "a.str", GGUF_STR, 3); bb_str(b, "a"); bb_str(b, ""); bb_str(b, "ccc");
    arr_head(b, "a.u64", GGUF_U64, 1); bb_u64(b, UINT64_MAX);
    arr_head(b, "a.f64", GGUF_F64, 2); bb_f64(b, 1e300); bb_f64(b, -4.5);
    arr_head(b, "a.empty", GGUF_U32, 0);
    kv_u32(b, "general.alignment", 32);
    uint64_t ne_a[2] = { 4, 3 }, ne_b[2] = { 32, 2 }, ne_c[1] = { 5 };
    tinfo(b, "w.f32", 2, ne_a, QT_F32, 0);
    tinfo(b, "w.q8", 2, ne_b, QT_Q8_0, 64);
    tinfo(b, "w.f16", 1, ne_c, QT_F16, 160);
    *meta_end = b->n;
    pad_to(b, 32);
    *data_start = b->n;
    data_bytes(b, 0, SMALL_DATA); /* padding bytes carry the pattern too: harmless */
}

static void test_small_image(uint32_t version)
{
    bb b = { 0 };
    size_t meta_end, data_start;
    build_small(&b, version, &meta_end, &data_start);
    gguf_file *f = NULL;
    char err[256] = "";
    int rc = gguf_parse(b.p, b.n, &f, err, sizeof err);
    CHECK(rc == 0 && f, "v%u small image: %s", version, err);
    if (rc) { bb_free(&b); return; }
    CHECK(f->version == version, "version %u", f->version);
    CHECK(f->n_kv == SMALL_N_KV && f->n_tensors == 3, "n_kv %llu n_tensors %llu",
          (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors);
    CHECK(f->alignment == 32 && f->data_offset == data_start, "data_offset %llu want %zu",
          (unsigned long long)f->data_offset, data_start);
    CHECK(f->owns_map == 0 && f->base == b.p && f->size == b.n, "views");
    CHECK(gguf_str_eq(f->kv[0].key, "t.u8") && gguf_str_eq(f->kv[SMALL_N_KV - 1].key, "general.alignment"),
          "kv order");

    int64_t i64;
    double d;
    int bo;
    gguf_str s;
    CHECK(gguf_get_int(f, "t.u8", &i64) == 1 && i64 == 200, "u8 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.i8", &i64) == 1 && i64 == -100, "i8 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.u16", &i64) == 1 && i64 == 60000, "u16 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.i16", &i64) == 1 && i64 == -30000, "i16 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.u32", &i64) == 1 && i64 == 4000000000ll, "u32 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.i32", &i64) == 1 && i64 == -2000000000ll, "i32 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.i64", &i64) == 1 && i64 == -(1ll << 62), "i64 %lld", (long long)i64);
    CHECK(gguf_get_int(f, "t.u64", &i64) == -1, "u64 above INT64_MAX is not an int64");
    CHECK(gguf_get_float(f, "t.u64", &d) == 1 && d == 9223372036854775813.0, "u64 as double %g", d);
    CHECK(gguf_get_float(f, "t.f32", &d) == 1 && d == 1.5, "f32 %g", d);
    CHECK(gguf_get_float(f, "t.f64", &d) == 1 && d == -3.25, "f64 %g", d);
    CHECK(gguf_get_float(f, "t.i16", &d) == 1 && d == -30000.0, "int as double %g", d);
    CHECK(gguf_get_bool(f, "t.bool", &bo) == 1 && bo == 1, "bool");
    CHECK(gguf_get_str(f, "t.str", &s) == 1 && gguf_str_eq(s, "hello"), "str");
    /* absent and mismatched */
    CHECK(gguf_get_int(f, "nope", &i64) == 0, "absent int");
    CHECK(gguf_get_str(f, "nope", &s) == 0, "absent str");
    CHECK(gguf_get_int(f, "t.f32", &i64) == -1, "float is not an int");
    CHECK(gguf_get_int(f, "t.str", &i64) == -1, "str is not an int");
    CHECK(gguf_get_int(f, "t.bool", &i64) == -1, "bool is not an int");
    CHECK(gguf_get_int(f, "a.i32", &i64) == -1, "array is not an int");
    CHECK(gguf_get_float(f, "t.str", &d) == -1, "str is not a float");
    CHECK(gguf_get_bool(f, "t.u8", &bo) == -1, "u8 is not a bool");
    CHECK(gguf_get_str(f, "t.u32", &s) == -1, "u32 is not a str");
    CHECK(gguf_get_str(f, "a.str", &s) == -1, "str array is not a str");
    CHECK(gguf_find_kv(f, "t.u") == NULL && gguf_find_kv(f, "t.u88") == NULL, "prefix lookups");

    const gguf_kv *kv = gguf_find_kv(f, "a.u8");
    CHECK(kv && kv->type == GGUF_ARR && kv->arr_type == GGUF_U8 && kv->n == 3 && kv->strs == NULL, "a.u8");
    if (kv) CHECK(gguf_arr_int(kv, 0) == 1 && gguf_arr_int(kv, 2) == 255 && gguf_arr_int(kv, 3) == 0, "a.u8 values");
    kv = gguf_find_kv(f, "a.i8");
    CHECK(kv != NULL, "a.i8");
    if (kv) CHECK(gguf_arr_int(kv, 0) == -1 && gguf_arr_int(kv, 1) == 127, "a.i8 values");
    kv = gguf_find_kv(f, "a.u16");
    CHECK(kv != NULL, "a.u16");
    if (kv) CHECK(gguf_arr_int(kv, 0) == 65535 && gguf_arr_float(kv, 1) == 7.0, "a.u16");
    kv = gguf_find_kv(f, "a.i16");
    CHECK(kv != NULL, "a.i16");
    if (kv) CHECK(gguf_arr_int(kv, 0) == -2 && gguf_arr_int(kv, 1) == 300, "a.i16");
    kv = gguf_find_kv(f, "a.i32");
    CHECK(kv != NULL, "a.i32");
    if (kv)
        CHECK(kv->n == 3 && gguf_arr_int(kv, 0) == -7 && gguf_arr_int(kv, 2) == 123456 &&
              gguf_arr_float(kv, 0) == -7.0, "a.i32 values");
    kv = gguf_find_kv(f, "a.f32");
    CHECK(kv != NULL, "a.f32");
    if (kv) {
        CHECK(gguf_arr_float(kv, 0) == 0.5 && gguf_arr_float(kv, 1) == -2.75, "a.f32 values");
        CHECK(gguf_arr_int(kv, 1) == -2, "float -> int truncates: %lld", (long long)gguf_arr_int(kv, 1));
        CHECK(gguf_arr_int(kv, 2) == INT64_MAX, "1e30 saturates");
    }
    kv = gguf_find_kv(f, "a.bool");
    CHECK(kv != NULL, "a.bool");
    if (kv) CHECK(gguf_arr_int(kv, 0) == 0 && gguf_arr_int(kv, 1) == 1, "a.bool");
    kv = gguf_find_kv(f, "a.str");
    CHECK(kv && kv->strs && kv->n == 3, "a.str");
    if (kv && kv->strs)
        CHECK(gguf_str_eq(kv->strs[0], "a") && gguf_str_eq(kv->strs[1], "") && gguf_str_eq(kv->strs[2], "ccc") &&
              gguf_arr_int(kv, 0) == 0, "a.str values");
    kv = gguf_find_kv(f, "a.u64");
    CHECK(kv != NULL, "a.u64");
    if (kv)
        CHECK(gguf_arr_int(kv, 0) == INT64_MAX && gguf_arr_float(kv, 0) == 18446744073709551615.0, "a.u64");
    kv = gguf_find_kv(f, "a.f64");
    CHECK(kv != NULL, "a.f64");
    if (kv)
        CHECK(gguf_arr_float(kv, 0) == 1e300 && gguf_arr_float(kv, 1) == -4.5 && gguf_arr_int(kv, 0) == INT64_MAX,
              "a.f64");
    kv = gguf_find_kv(f, "a.empty");
    CHECK(kv && kv->n == 0 && kv->arr_type == GGUF_U32 && gguf_arr_int(kv, 0) == 0, "empty array");
    kv = gguf_find_kv(f, "t.i16");
    CHECK(kv && gguf_arr_int(kv, 0) == -30000 && gguf_arr_int(kv, 1) == 0, "scalar via gguf_arr_int");

    static const struct { const char *name; uint32_t type, n_dims; int64_t ne0, ne1; uint64_t off, nbytes; } want[3] = {
        { "w.f32", QT_F32, 2, 4, 3, 0, 48 },
        { "w.q8", QT_Q8_0, 2, 32, 2, 64, 68 },
        { "w.f16", QT_F16, 1, 5, 1, 160, 10 },
    };
    for (int i = 0; i < 3; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, want[i].name);
        CHECK(t == &f->tensors[i], "tensor %s found in order", want[i].name);
        if (!t) continue;
        CHECK(t->type == want[i].type && t->n_dims == want[i].n_dims && t->ne[0] == want[i].ne0 &&
              t->ne[1] == want[i].ne1 && t->ne[2] == 1 && t->ne[3] == 1, "tensor %s shape", want[i].name);
        CHECK(t->offset == want[i].off && t->nbytes == want[i].nbytes, "tensor %s offset %llu nbytes %llu",
              want[i].name, (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        CHECK(t->data == b.p + data_start + want[i].off, "tensor %s data pointer", want[i].name);
        int same = 1;
        for (uint64_t j = 0; j < t->nbytes; j++)
            same &= ((const uint8_t *)t->data)[j] == pattern(want[i].off + j);
        CHECK(same, "tensor %s bytes", want[i].name);
    }
    CHECK(gguf_find_tensor(f, "w") == NULL && gguf_find_tensor(f, NULL) == NULL, "absent tensor");
    gguf_close(f);

    /* Truncated at every length up to the data: each must fail cleanly, with
     * "truncated" while the metadata is incomplete. The last tensor ends
     * exactly at the end, so even one byte less is an error. */
    size_t stop = b.n;
    int bad = 0;
    for (size_t n = 0; n < stop && n < b.n; n++) {
        char e[256] = "";
        gguf_file *g = NULL;
        int r = parse_copy(b.p, n, &g, e, sizeof e);
        /* short files may also fail the up-front count bound ("too large") */
        const char *want_msg = n == 0 ? "empty" : n < meta_end ? "truncated" : "past end of file";
        int msg_ok = strstr(e, want_msg) || (n < meta_end && strstr(e, "too large"));
        if (r != -1 || g != NULL || !msg_ok || strchr(e, '\n')) {
            if (bad++ < 5) CHECK(0, "v%u truncated to %zu of %zu: rc %d '%s', want '%s'", version, n, b.n, r, e, want_msg);
        }
    }
    CHECK(bad == 0, "v%u: %d truncations misreported", version, bad);
    char e[256];
    gguf_file *g;
    CHECK(parse_copy(b.p, b.n, &g, e, sizeof e) == 0, "full exact-size copy parses: %s", e);
    /* the message names what and where */
    parse_copy(b.p, 30, &g, e, sizeof e);
    CHECK(strstr(e, "n_kv too large: 24, at most 0 fit in the 6 bytes after offset 24"), "message: %s", e);
    parse_copy(b.p, meta_end - 3, &g, e, sizeof e);
    char want_e[128];
    snprintf(want_e, sizeof want_e, "truncated: tensor info 2 of 3 (offset) needs 8 bytes at offset %zu, file has %zu",
             meta_end - 8, meta_end - 3);
    CHECK(strstr(e, want_e), "message: %s", e);
    bb_free(&b);
}

/* ------------------------------------------------------------------ */
/* 2. malformed images                                                  */

/* A one-tensor image with the given tensor info fields; data of `data_n`
 * bytes after 32-byte padding. */
static void one_tensor(bb *b, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset, size_t data_n)
{
    hdr(b, 3, 1, 0);
    tinfo(b, "t", n_dims, ne, type, offset);
    pad_to(b, 32);
    data_bytes(b, 0, data_n);
}

static void test_bad_header(void)
{
    bb v = { 0 };
    size_t meta_end, data_start;
    build_small(&v, 3, &meta_end, &data_start);
    bb b = { 0 };

    bb_put(&b, v.p, v.n); b.p[0] = 'X';
    EXPECT_FAIL(&b, "bad magic", "wrong magic");
    bb_free(&b);
    bb_put(&b, "GGUF", 4);
    EXPECT_FAIL(&b, "truncated: header (version)", "magic only");
    bb_free(&b);
    bb_put(&b, "GGML\x03\0\0\0", 8);
    EXPECT_FAIL(&b, "bad magic", "ggml magic");
    bb_free(&b);

    uint32_t versions[] = { 0, 1, 4, 0x03000000u };
    const char *wants[] = { "version: 0", "version: 1", "version: 4", "big-endian" };
    for (int i = 0; i < 4; i++) {
        bb_put(&b, v.p, v.n);
        memcpy(b.p + 4, &versions[i], 4);
        EXPECT_FAIL(&b, wants[i], "bad version");
        bb_free(&b);
    }
    /* absurd counts: rejected before any allocation */
    uint64_t huge = 1ull << 62;
    bb_put(&b, v.p, v.n); memcpy(b.p + 16, &huge, 8);
    EXPECT_FAIL(&b, "n_kv too large: 4611686018427387904", "n_kv 2^62");
    bb_free(&b);
    bb_put(&b, v.p, v.n); memcpy(b.p + 8, &huge, 8);
    EXPECT_FAIL(&b, "n_tensors too large: 4611686018427387904", "n_tensors 2^62");
    bb_free(&b);
    huge = UINT64_MAX;
    bb_put(&b, v.p, v.n); memcpy(b.p + 16, &huge, 8); memcpy(b.p + 8, &huge, 8);
    EXPECT_FAIL(&b, "n_kv too large", "n_kv 2^64-1");
    bb_free(&b);
    /* counts that fit the bytes individually but not together */
    hdr(&b, 3, 2, 2);
    for (int i = 0; i < 60; i++) bb_u8(&b, 0);
    EXPECT_FAIL(&b, "n_tensors too large", "n_kv and n_tensors together");
    bb_free(&b);
    /* more kvs claimed than present */
    bb_put(&b, v.p, v.n); { uint64_t n = SMALL_N_KV + 1; memcpy(b.p + 16, &n, 8); }
    EXPECT_FAIL(&b, "", "one kv too many");
    bb_free(&b);
    bb_free(&v);
}

static void test_bad_kv(void)
{
    bb b = { 0 };
    /* key length 2^63 */
    hdr(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 63); bb_put(&b, "abcdefgh", 8); bb_u32(&b, GGUF_U8); bb_u8(&b, 0);
    EXPECT_FAIL(&b, "truncated: kv 0 of 1 (key) needs 9223372036854775808 bytes", "key length 2^63");
    bb_free(&b);
    /* string value length 2^63 and 2^64-1 */
    uint64_t lens[2] = { 1ull << 63, UINT64_MAX };
    for (int i = 0; i < 2; i++) {
        hdr(&b, 3, 0, 1);
        kv_head(&b, "k", GGUF_STR); bb_u64(&b, lens[i]); bb_put(&b, "xyz", 3);
        EXPECT_FAIL(&b, "truncated: kv 0 of 1 (string value)", "string length huge");
        bb_free(&b);
    }
    /* unknown value types */
    hdr(&b, 3, 0, 1);
    kv_head(&b, "k", 13); bb_u64(&b, 0);
    EXPECT_FAIL(&b, "unknown value type 13", "value type 13");
    bb_free(&b);
    hdr(&b, 3, 0, 1);
    kv_head(&b, "k", 0xffffffffu); bb_u64(&b, 0);
    EXPECT_FAIL(&b, "unknown value type 4294967295", "value type 2^32-1");
    bb_free(&b);
    hdr(&b, 3, 0, 1);
    arr_head(&b, "k", 13, 1); bb_u64(&b, 0);
    EXPECT_FAIL(&b, "unknown array element type 13", "array of type 13");
    bb_free(&b);
    hdr(&b, 3, 0, 1);
    arr_head(&b, "k", GGUF_ARR, 1); bb_u32(&b, GGUF_U8); bb_u64(&b, 1); bb_u8(&b, 0);
    EXPECT_FAIL(&b, "arrays of arrays", "nested array");
    bb_free(&b);
    /* huge array counts, including ones whose byte size overflows */
    uint32_t elems[] = { GGUF_U8, GGUF_U32, GGUF_F64, GGUF_STR };
    uint64_t counts[] = { 1ull << 62, (1ull << 62) + 1, UINT64_MAX };
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            hdr(&b, 3, 0, 1);
            arr_head(&b, "k", elems[i], counts[j]);
            for (int k = 0; k < 64; k++) bb_u8(&b, 0);
            EXPECT_FAIL(&b, "truncated: kv 0 of 1 'k' (array of", "huge array count");
            bb_free(&b);
        }
    /* array that claims one more element than present */
    hdr(&b, 3, 0, 1);
    arr_head(&b, "k", GGUF_U32, 3); bb_u32(&b, 1); bb_u32(&b, 2); bb_u16(&b, 0);
    EXPECT_FAIL(&b, "(array of 3 u32) needs 12 bytes at offset 49, file has 59", "array one short");
    bb_free(&b);
    /* string array whose second string runs off the end */
    hdr(&b, 3, 0, 1);
    arr_head(&b, "k", GGUF_STR, 2); bb_str(&b, "ok"); bb_u64(&b, 5); bb_put(&b, "abcdefgh", 2);
    EXPECT_FAIL(&b, "truncated: kv 0 of 1 (array string) needs 5 bytes", "string array element");
    bb_free(&b);
    /* duplicate keys, also with others in between */
    hdr(&b, 3, 0, 3);
    kv_u32(&b, "a.b", 1); kv_u32(&b, "c", 2); kv_u32(&b, "a.b", 3);
    EXPECT_FAIL(&b, "duplicate kv name 'a.b': kv 0 and 2", "duplicate key");
    bb_free(&b);
    hdr(&b, 3, 0, 2);
    kv_u32(&b, "", 1); kv_u32(&b, "", 2);
    EXPECT_FAIL(&b, "duplicate kv name ''", "duplicate empty key");
    bb_free(&b);
    /* a name with control bytes is escaped: the message stays on one line */
    hdr(&b, 3, 0, 1);
    kv_head(&b, "bad\nkey", 13);
    bb_u64(&b, 0);
    EXPECT_FAIL(&b, "bad\\x0akey", "escaped name");
    bb_free(&b);
}

static void test_bad_alignment(void)
{
    bb b = { 0 };
    uint32_t bad[] = { 0, 3, 48, 0x80000001u };
    for (int i = 0; i < 4; i++) {
        hdr(&b, 3, 0, 1);
        kv_u32(&b, "general.alignment", bad[i]);
        char want[64];
        snprintf(want, sizeof want, "general.alignment: %u is not", bad[i]);
        EXPECT_FAIL(&b, want, "bad alignment");
        bb_free(&b);
    }
    hdr(&b, 3, 0, 1);
    kv_head(&b, "general.alignment", GGUF_U64); bb_u64(&b, 32);
    EXPECT_FAIL(&b, "general.alignment: type u64, expected u32", "alignment as u64");
    bb_free(&b);

    /* alignment 64 is honoured: data starts at a multiple of 64 and a
     * tensor at offset 64 is valid, one at 32 is not */
    uint64_t ne[1] = { 8 };
    for (int off = 32; off <= 64; off += 32) {
        hdr(&b, 3, 1, 1);
        kv_u32(&b, "general.alignment", 64);
        tinfo(&b, "t", 1, ne, QT_F32, (uint64_t)off);
        size_t infos_end = b.n;
        pad_to(&b, 64);
        size_t start = b.n;
        data_bytes(&b, 0, 64 + 32);
        gguf_file *f = NULL;
        char err[256] = "";
        int rc = gguf_parse(b.p, b.n, &f, err, sizeof err);
        if (off == 64) {
            CHECK(rc == 0 && f && f->alignment == 64 && f->data_offset == start && start % 64 == 0 &&
                  infos_end % 64 != 0, "alignment 64: %s", err);
            if (f) CHECK(f->tensors[0].data == b.p + start + 64, "tensor at data + 64");
        } else {
            CHECK(rc == -1 && strstr(err, "offset 32 not a multiple of alignment 64"), "offset 32 with align 64: %s", err);
        }
        gguf_close(f);
        bb_free(&b);
    }
}

static void test_bad_tensors(void)
{
    bb b = { 0 };
    uint64_t ne2[2] = { 4, 2 };
    /* n_dims 0 and 5 */
    one_tensor(&b, 0, ne2, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "n_dims 0 not in 1..4", "n_dims 0");
    bb_free(&b);
    uint64_t ne5[5] = { 1, 1, 1, 1, 1 };
    one_tensor(&b, 5, ne5, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "n_dims 5 not in 1..4", "n_dims 5");
    bb_free(&b);
    hdr(&b, 3, 1, 0);
    bb_str(&b, "t"); bb_u32(&b, 0xffffffffu);
    for (int k = 0; k < 40; k++) bb_u8(&b, 0);
    EXPECT_FAIL(&b, "n_dims 4294967295", "n_dims 2^32-1");
    bb_free(&b);
    /* negative dims */
    uint64_t neg[2] = { 4, (uint64_t)-1 };
    one_tensor(&b, 2, neg, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "ne[1] = -1 is negative", "negative ne");
    bb_free(&b);
    uint64_t neg0[1] = { 1ull << 63 };
    one_tensor(&b, 1, neg0, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "ne[0] = -9223372036854775808 is negative", "ne INT64_MIN");
    bb_free(&b);
    /* products that overflow int64, also hidden behind a zero ne[0] */
    uint64_t big[2] = { 1ull << 32, 1ull << 32 };
    one_tensor(&b, 2, big, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "overflows int64", "ne product 2^64");
    bb_free(&b);
    uint64_t big4[4] = { 1 << 16, 1 << 16, 1 << 16, 1 << 15 };
    one_tensor(&b, 4, big4, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "overflows int64", "ne product 2^63");
    bb_free(&b);
    uint64_t zbig[3] = { 0, 1ull << 40, 1ull << 40 };
    one_tensor(&b, 3, zbig, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "overflows int64", "rows overflow behind ne[0] = 0");
    bb_free(&b);
    /* fits int64 elements but the tensor is far bigger than the file */
    uint64_t large[2] = { 1ull << 31, 1ull << 31 };
    one_tensor(&b, 2, large, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "byte size 8589934592 x 2147483648 rows overflows", "2^62 elements, 2^64 bytes");
    bb_free(&b);
    uint64_t large2[2] = { 1ull << 30, 1ull << 30 };
    one_tensor(&b, 2, large2, QT_F32, 0, 64);
    EXPECT_FAIL(&b, "+4611686018427387904 bytes) past end of file", "2^62 bytes");
    bb_free(&b);
    /* unknown tensor types: past the table, and ids ggml never assigned */
    uint32_t bad_types[] = { 4, 5, 31, 40, 1000, 0xffffffffu };
    for (int i = 0; i < 6; i++) {
        one_tensor(&b, 2, ne2, bad_types[i], 0, 64);
        char want[64];
        snprintf(want, sizeof want, "unknown tensor type %u", bad_types[i]);
        EXPECT_FAIL(&b, want, "unknown tensor type");
        bb_free(&b);
    }
    /* ne[0] not a multiple of the block size */
    uint64_t ne33[2] = { 33, 1 };
    one_tensor(&b, 2, ne33, QT_Q8_0, 0, 64);
    EXPECT_FAIL(&b, "ne[0] = 33 not a multiple of block size 32 of type Q8_0", "Q8_0 ne[0] 33");
    bb_free(&b);
    uint64_t ne128[1] = { 128 };
    one_tensor(&b, 1, ne128, QT_Q4_K, 0, 512);
    EXPECT_FAIL(&b, "not a multiple of block size 256", "Q4_K ne[0] 128");
    bb_free(&b);
    /* offsets */
    one_tensor(&b, 2, ne2, QT_F32, 4, 64);
    EXPECT_FAIL(&b, "offset 4 not a multiple of alignment 32", "unaligned offset");
    bb_free(&b);
    one_tensor(&b, 2, ne2, QT_F32, 64, 64);
    EXPECT_FAIL(&b, "past end of file", "tensor past end");
    bb_free(&b);
    one_tensor(&b, 2, ne2, QT_F32, 0, 31);
    EXPECT_FAIL(&b, "past end of file", "tensor one byte short");
    bb_free(&b);
    one_tensor(&b, 2, ne2, QT_F32, UINT64_MAX - 31, 64); /* offset + nbytes wraps */
    EXPECT_FAIL(&b, "past end of file", "offset near 2^64");
    bb_free(&b);
    /* data section itself past the end: infos end unaligned, file stops there */
    hdr(&b, 3, 1, 0);
    uint64_t z[1] = { 0 };
    tinfo(&b, "t", 1, z, QT_F32, 0);
    EXPECT_FAIL(&b, "data section starts at", "missing padding");
    bb_free(&b);
    /* a zero-element tensor at the very end is fine */
    hdr(&b, 3, 1, 0);
    tinfo(&b, "t", 1, z, QT_F32, 0);
    pad_to(&b, 32);
    {
        gguf_file *f = NULL;
        char err[256] = "";
        CHECK(gguf_parse(b.p, b.n, &f, err, sizeof err) == 0 && f->tensors[0].nbytes == 0, "empty tensor: %s", err);
        gguf_close(f);
    }
    bb_free(&b);
    /* duplicate tensor names */
    hdr(&b, 3, 3, 0);
    tinfo(&b, "x", 2, ne2, QT_F32, 0);
    tinfo(&b, "y", 2, ne2, QT_F32, 32);
    tinfo(&b, "x", 2, ne2, QT_F32, 64);
    pad_to(&b, 32);
    data_bytes(&b, 0, 96);
    EXPECT_FAIL(&b, "duplicate tensor name 'x': tensor 0 and 2", "duplicate tensor");
    bb_free(&b);
    /* tensor name length 2^63 */
    hdr(&b, 3, 1, 0);
    bb_u64(&b, 1ull << 63);
    for (int k = 0; k < 40; k++) bb_u8(&b, 0);
    EXPECT_FAIL(&b, "truncated: tensor info 0 of 1 (name) needs 9223372036854775808 bytes", "tensor name 2^63");
    bb_free(&b);
}

static void test_files(void)
{
    char err[512];
    gguf_file *f = (gguf_file *)1;
    CHECK(gguf_open("/nonexistent/dir/x.gguf", &f, err, sizeof err) == -1 && f == NULL &&
          strstr(err, "No such file or directory") && strstr(err, "/nonexistent/dir/x.gguf"), "missing: %s", err);
    f = (gguf_file *)1;
    CHECK(gguf_open("/tmp", &f, err, sizeof err) == -1 && f == NULL && strstr(err, "directory"), "dir: %s", err);

    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);
    CHECK(gguf_open(path, &f, err, sizeof err) == -1 && strstr(err, "empty file"), "empty: %s", err);

    /* a real file round trip via gguf_open (mmap) */
    bb b = { 0 };
    size_t meta_end, data_start;
    build_small(&b, 3, &meta_end, &data_start);
    FILE *fp = fopen(path, "wb");
    CHECK(fp && fwrite(b.p, 1, b.n, fp) == b.n && fclose(fp) == 0, "write temp");
    CHECK(gguf_open(path, &f, err, sizeof err) == 0 && f->owns_map == 1 && f->size == b.n, "open: %s", err);
    if (f) {
        const gguf_tensor *t = gguf_find_tensor(f, "w.q8");
        CHECK(t && memcmp(t->data, b.p + data_start + 64, 68) == 0, "mapped bytes");
        gguf_close(f);
    }
    /* the same file read into anonymous memory: same parse, a private copy */
    f = NULL;
    CHECK(gguf_open_mode(path, GGUF_OPEN_COPY, &f, err, sizeof err) == 0 && f && f->owns_map == 1 &&
          f->size == b.n && memcmp(f->base, b.p, b.n) == 0, "open copy: %s", err);
    if (f) {
        const gguf_tensor *t = gguf_find_tensor(f, "w.q8");
        CHECK(t && memcmp(t->data, b.p + data_start + 64, 68) == 0 && f->n_tensors == 3, "copied bytes");
        gguf_close(f);
    }
    f = NULL;
    CHECK(gguf_open_mode(path, GGUF_OPEN_AUTO, &f, err, sizeof err) == 0 && f && f->size == b.n &&
          memcmp(f->base, b.p, b.n) == 0, "open auto: %s", err);
    gguf_close(f);
    /* a truncated copy fails like a truncated map */
    CHECK(truncate(path, (off_t)(data_start - 1)) == 0, "truncate");
    f = (gguf_file *)1;
    CHECK(gguf_open_mode(path, GGUF_OPEN_COPY, &f, err, sizeof err) == -1 && f == NULL && strstr(err, "past end of file"),
          "truncated copy: %s", err);
    /* unreadable file */
    if (geteuid() != 0) {
        chmod(path, 0);
        CHECK(gguf_open(path, &f, err, sizeof err) == -1 && strstr(err, "Permission denied"), "no read: %s", err);
    }
    unlink(path);
    bb_free(&b);
    gguf_close(NULL);
    CHECK(1, "gguf_close(NULL)");
    /* empty buffer */
    CHECK(gguf_parse("", 0, &f, err, sizeof err) == -1 && strstr(err, "empty"), "empty buffer: %s", err);
}

/* ------------------------------------------------------------------ */
/* 3. writer                                                            */

typedef struct fill_ctx {
    uint32_t seed;
    int calls;
} fill_ctx;

static int fill_pattern(void *user, void *dst, size_t nbytes)
{
    fill_ctx *c = user;
    uint8_t *p = dst;
    for (size_t i = 0; i < nbytes; i++) p[i] = (uint8_t)(c->seed * 31 + i * 13 + (i >> 8));
    c->calls++;
    return 0;
}

static int fill_fail(void *user, void *dst, size_t nbytes)
{
    (void)user; (void)dst; (void)nbytes;
    return -1;
}

static void test_writer(void)
{
    char path[] = "/tmp/test_gguf_w_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd < 0) return;
    close(fd);

    gguf_writer *w = gguf_writer_create();
    CHECK(w != NULL, "create");
    const char *toks[4] = { "<unk>", "", "hello world", "\xe4\xbd\xa0" };
    float sc[5] = { 0.0f, -1.5f, 3.25f, 1e-20f, -0.0f };
    int32_t ty[3] = { 1, -2, 2147483647 };
    CHECK(gguf_writer_set_str(w, "general.architecture", "llama") == 0, "set str");
    CHECK(gguf_writer_set_u32(w, "k.u32", 4294967295u) == 0, "set u32");
    CHECK(gguf_writer_set_i32(w, "k.i32", -5) == 0, "set i32");
    CHECK(gguf_writer_set_f32(w, "k.f32", 1e-5f) == 0, "set f32");
    CHECK(gguf_writer_set_bool(w, "k.bool", 7) == 0, "set bool");
    CHECK(gguf_writer_set_bool(w, "k.false", 0) == 0, "set bool false");
    CHECK(gguf_writer_set_arr_str(w, "k.toks", toks, 4) == 0, "set arr str");
    CHECK(gguf_writer_set_arr_f32(w, "k.scores", sc, 5) == 0, "set arr f32");
    CHECK(gguf_writer_set_arr_i32(w, "k.types", ty, 3) == 0, "set arr i32");
    CHECK(gguf_writer_set_arr_i32(w, "k.none", NULL, 0) == 0, "set empty arr");

    static const struct { const char *name; uint32_t type, n_dims; int64_t ne[4]; uint64_t nbytes; } tw[] = {
        { "a", QT_F32, 2, { 3, 5 }, 60 },          /* 60 -> padded 64 */
        { "b.q8", QT_Q8_0, 2, { 64, 3 }, 204 },    /* 2 blocks x 34 x 3 rows */
        { "c.q4k", QT_Q4_K, 1, { 512 }, 288 },
        { "d.f16", QT_F16, 3, { 7, 2, 3 }, 84 },
        { "e.empty", QT_F32, 1, { 0 }, 0 },
        { "f.bf16", QT_BF16, 4, { 2, 1, 2, 2 }, 16 },
    };
    enum { NT = sizeof tw / sizeof tw[0] };
    fill_ctx ctx[NT];
    for (int i = 0; i < NT; i++) {
        ctx[i] = (fill_ctx){ .seed = (uint32_t)i + 1 };
        CHECK(gguf_writer_add_tensor(w, tw[i].name, tw[i].type, tw[i].n_dims, tw[i].ne, fill_pattern, &ctx[i]) == 0,
              "add %s: %s", tw[i].name, gguf_writer_error(w));
    }
    CHECK(gguf_writer_add_tensor(w, "g.zero", QT_F32, 1, (const int64_t[]){ 3 }, NULL, NULL) == 0, "NULL fill");
    char err[256] = "";
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0, "write: %s", err);
    gguf_writer_free(w);

    gguf_file *f = NULL;
    CHECK(gguf_open(path, &f, err, sizeof err) == 0, "reopen: %s", err);
    if (f) {
        CHECK(f->version == 3 && f->alignment == 32 && f->n_kv == 10 && f->n_tensors == NT + 1, "header");
        CHECK(f->data_offset % 32 == 0, "data section aligned");
        static const char *const order[10] = { "general.architecture", "k.u32", "k.i32", "k.f32", "k.bool",
                                               "k.false", "k.toks", "k.scores", "k.types", "k.none" };
        int ordered = 1;
        for (int i = 0; i < 10; i++) ordered &= gguf_str_eq(f->kv[i].key, order[i]);
        CHECK(ordered, "kv insertion order");
        gguf_str s;
        int64_t v;
        double d;
        int bo;
        CHECK(gguf_get_str(f, "general.architecture", &s) == 1 && gguf_str_eq(s, "llama"), "str back");
        CHECK(f->kv[1].type == GGUF_U32 && gguf_get_int(f, "k.u32", &v) == 1 && v == 4294967295ll, "u32 back");
        CHECK(f->kv[2].type == GGUF_I32 && gguf_get_int(f, "k.i32", &v) == 1 && v == -5, "i32 back");
        CHECK(f->kv[3].type == GGUF_F32 && gguf_get_float(f, "k.f32", &d) == 1 && d == (double)1e-5f, "f32 back");
        CHECK(gguf_get_bool(f, "k.bool", &bo) == 1 && bo == 1 && *(const uint8_t *)f->kv[4].data == 1, "bool stored as 1");
        CHECK(gguf_get_bool(f, "k.false", &bo) == 1 && bo == 0, "false back");
        const gguf_kv *kv = gguf_find_kv(f, "k.toks");
        CHECK(kv && kv->arr_type == GGUF_STR && kv->n == 4 && kv->strs, "toks");
        if (kv && kv->strs) {
            int same = 1;
            for (int i = 0; i < 4; i++) same &= gguf_str_eq(kv->strs[i], toks[i]);
            CHECK(same, "toks values");
        }
        kv = gguf_find_kv(f, "k.scores");
        CHECK(kv && kv->arr_type == GGUF_F32 && kv->n == 5, "scores");
        if (kv) {
            CHECK(memcmp(kv->data, sc, sizeof sc) == 0, "scores bytes");
            CHECK(gguf_arr_float(kv, 2) == 3.25, "score 2");
        }
        kv = gguf_find_kv(f, "k.types");
        CHECK(kv && kv->arr_type == GGUF_I32 && kv->n == 3 && gguf_arr_int(kv, 1) == -2 &&
              gguf_arr_int(kv, 2) == 2147483647, "types");
        kv = gguf_find_kv(f, "k.none");
        CHECK(kv && kv->type == GGUF_ARR && kv->n == 0, "empty array back");

        uint64_t expect_off = 0;
        for (int i = 0; i < NT; i++) {
            const gguf_tensor *t = gguf_find_tensor(f, tw[i].name);
            CHECK(t != NULL, "tensor %s", tw[i].name);
            if (!t) continue;
            int same_shape = t->type == tw[i].type && t->n_dims == tw[i].n_dims;
            for (uint32_t d2 = 0; d2 < GGUF_MAX_DIMS; d2++)
                same_shape &= t->ne[d2] == (d2 < tw[i].n_dims ? tw[i].ne[d2] : 1);
            CHECK(same_shape, "tensor %s shape", tw[i].name);
            /* llama.cpp requires each offset to be the running padded size */
            CHECK(t->nbytes == tw[i].nbytes && t->offset == expect_off, "tensor %s nbytes %llu offset %llu want %llu",
                  tw[i].name, (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                  (unsigned long long)expect_off);
            expect_off += (tw[i].nbytes + 31) / 32 * 32;
            uint8_t *ref = malloc(tw[i].nbytes + 1);
            fill_ctx c2 = { .seed = (uint32_t)i + 1 };
            fill_pattern(&c2, ref, (size_t)tw[i].nbytes);
            CHECK(memcmp(t->data, ref, (size_t)tw[i].nbytes) == 0, "tensor %s bytes", tw[i].name);
            CHECK(ctx[i].calls == (tw[i].nbytes ? 1 : 0), "fill called once per non-empty tensor");
            free(ref);
        }
        const gguf_tensor *z = gguf_find_tensor(f, "g.zero");
        CHECK(z && z->nbytes == 12 && memcmp(z->data, "\0\0\0\0\0\0\0\0\0\0\0\0", 12) == 0, "NULL fill -> zeros");
        /* padding after the last tensor too, as llama.cpp writes (and reads) it */
        CHECK(f->size == f->data_offset + expect_off + 32, "file size %zu", f->size);
        int zero_pad = 1;
        for (size_t i = (size_t)(f->data_offset + 60); i < f->data_offset + 64; i++) zero_pad &= f->base[i] == 0;
        CHECK(zero_pad, "zero padding between tensors");
        gguf_close(f);
    }

    /* writer errors are sticky and reported by write */
    w = gguf_writer_create();
    CHECK(gguf_writer_set_u32(w, "x", 1) == 0, "first x");
    CHECK(gguf_writer_set_f32(w, "x", 2) == -1 && strstr(gguf_writer_error(w), "duplicate key 'x'"), "dup key: %s",
          gguf_writer_error(w));
    CHECK(gguf_writer_set_u32(w, "y", 1) == -1, "sticky");
    CHECK(gguf_writer_write(w, path, err, sizeof err) == -1 && strstr(err, "duplicate key"), "write reports: %s", err);
    gguf_writer_free(w);

    struct { const char *name; uint32_t type, n_dims; int64_t ne0; const char *want; } bad[] = {
        { "0123456789012345678901234567890123456789012345678901234567890123", QT_F32, 1, 4, "need 1..63" },
        { "", QT_F32, 1, 4, "need 1..63" },
        { "t", 4, 1, 4, "unknown type 4" },
        { "t", QT_Q8_0, 1, 33, "not a multiple of block size 32" },
        { "t", QT_F32, 0, 4, "n_dims 0" },
        { "t", QT_F32, 5, 4, "n_dims 5" },
        { "t", QT_F32, 1, -1, "negative" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        w = gguf_writer_create();
        int64_t ne[5] = { bad[i].ne0, 1, 1, 1, 1 };
        CHECK(gguf_writer_add_tensor(w, bad[i].name, bad[i].type, bad[i].n_dims, ne, NULL, NULL) == -1 &&
              strstr(gguf_writer_error(w), bad[i].want), "bad tensor %zu: '%s'", i, gguf_writer_error(w));
        gguf_writer_free(w);
    }
    w = gguf_writer_create();
    int64_t ne1[1] = { 4 };
    gguf_writer_add_tensor(w, "t", QT_F32, 1, ne1, NULL, NULL);
    CHECK(gguf_writer_add_tensor(w, "t", QT_F32, 1, ne1, NULL, NULL) == -1 &&
          strstr(gguf_writer_error(w), "duplicate tensor 't'"), "dup tensor");
    gguf_writer_free(w);
    int64_t big[2] = { 1ll << 40, 1ll << 40 };
    w = gguf_writer_create();
    CHECK(gguf_writer_add_tensor(w, "t", QT_F32, 2, big, NULL, NULL) == -1, "huge tensor: %s", gguf_writer_error(w));
    gguf_writer_free(w);

    /* a failing fill removes the partial file */
    w = gguf_writer_create();
    gguf_writer_add_tensor(w, "t", QT_F32, 1, ne1, fill_fail, NULL);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == -1 && strstr(err, "fill callback failed for tensor 't'"),
          "fill fail: %s", err);
    CHECK(access(path, F_OK) != 0, "partial file removed");
    CHECK(gguf_writer_write(w, "/nonexistent/dir/x.gguf", err, sizeof err) == -1 && strstr(err, "cannot create"),
          "bad path: %s", err);
    gguf_writer_free(w);
    gguf_writer_free(NULL);
    CHECK(gguf_writer_set_u32(NULL, "x", 1) == -1 && gguf_writer_write(NULL, path, err, sizeof err) == -1, "NULL writer");

    /* a writer with no tensors gives a vocab-only style file */
    w = gguf_writer_create();
    gguf_writer_set_str(w, "general.architecture", "llama");
    CHECK(gguf_writer_write(w, path, err, sizeof err) == 0, "no tensors: %s", err);
    gguf_writer_free(w);
    CHECK(gguf_open(path, &f, err, sizeof err) == 0 && f->n_tensors == 0 && f->n_kv == 1, "no tensors back: %s", err);
    gguf_close(f);
    unlink(path);
}

/* ------------------------------------------------------------------ */
/* 4. real files                                                        */

static void test_stories(void)
{
    char path[1024], bin_path[1024], err[512];
    if (path_find("stories260K.gguf", path, sizeof path)) { test_skip("stories260K.gguf not found"); return; }
    gguf_file *f = NULL;
    CHECK(gguf_open(path, &f, err, sizeof err) == 0, "open %s: %s", path, err);
    if (!f) return;
    gguf_str s;
    int64_t v;
    double d;
    CHECK(f->version == 3 && f->n_tensors == 48 && f->n_kv == 19 && f->size == 1185376, "stories header");
    CHECK(gguf_get_str(f, "general.architecture", &s) == 1 && gguf_str_eq(s, "llama"), "arch");
    CHECK(gguf_get_str(f, "tokenizer.ggml.model", &s) == 1 && gguf_str_eq(s, "llama"), "tokenizer model");
    static const struct { const char *key; int64_t v; } ints[] = {
        { "llama.block_count", 5 }, { "llama.embedding_length", 64 }, { "llama.attention.head_count", 8 },
        { "llama.attention.head_count_kv", 4 }, { "llama.rope.dimension_count", 8 },
        { "llama.feed_forward_length", 172 }, { "llama.context_length", 512 },
        { "tokenizer.ggml.bos_token_id", 1 }, { "tokenizer.ggml.eos_token_id", 2 },
        { "tokenizer.ggml.unknown_token_id", 0 }, { "tokenizer.ggml.seperator_token_id", 4294967295ll },
        { "tokenizer.ggml.padding_token_id", 4294967295ll },
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        CHECK(gguf_get_int(f, ints[i].key, &v) == 1 && v == ints[i].v, "%s = %lld", ints[i].key, (long long)v);
    CHECK(gguf_get_float(f, "llama.attention.layer_norm_rms_epsilon", &d) == 1 && fabs(d - 1e-5) < 1e-12, "eps %g", d);
    CHECK(gguf_find_kv(f, "general.file_type") == NULL && gguf_find_kv(f, "llama.rope.freq_base") == NULL,
          "absent keys");
    const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CHECK(tok && tok->arr_type == GGUF_STR && tok->n == 512 && tok->strs, "tokens");
    if (tok && tok->strs) {
        CHECK(gguf_str_eq(tok->strs[0], "<unk>") && gguf_str_eq(tok->strs[1], "<s>") &&
              gguf_str_eq(tok->strs[2], "</s>"), "special tokens");
        char want[16];
        int bytes_ok = 1;
        for (int b = 0; b < 256; b++) { /* byte fallback tokens 3..258 */
            snprintf(want, sizeof want, "<0x%02X>", b);
            bytes_ok &= gguf_str_eq(tok->strs[3 + b], want);
        }
        CHECK(bytes_ok, "byte fallback tokens");
    }
    const gguf_kv *sc = gguf_find_kv(f, "tokenizer.ggml.scores");
    CHECK(sc && sc->arr_type == GGUF_F32 && sc->n == 512, "scores");
    const gguf_kv *tt = gguf_find_kv(f, "tokenizer.ggml.token_type");
    CHECK(tt && tt->arr_type == GGUF_I32 && tt->n == 512 && gguf_arr_int(tt, 0) == 2 && gguf_arr_int(tt, 1) == 3 &&
          gguf_arr_int(tt, 3) == 6, "token types");
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    CHECK(emb && emb->type == QT_F32 && emb->n_dims == 2 && emb->ne[0] == 64 && emb->ne[1] == 512 &&
          emb->nbytes == 64 * 512 * 4 && emb->offset == 0, "token_embd shape");

    /* tensor bytes against llama2.c's checkpoint the GGUF was converted from:
     * header 7 x i32, then token embeddings [vocab][dim], rms_att [L][dim],
     * wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final [dim] */
    if (path_find("stories260K.bin", bin_path, sizeof bin_path) == 0) {
        size_t n;
        uint8_t *bin = test_read_file(bin_path, &n);
        const size_t dim = 64, hid = 172, L = 5, V = 512, kvd = 32;
        size_t final_off = 28 + 4 * (V * dim + L * dim + L * dim * dim + 2 * L * dim * kvd + L * dim * dim + L * dim +
                                     3 * L * hid * dim);
        const gguf_tensor *an = gguf_find_tensor(f, "blk.0.attn_norm.weight");
        const gguf_tensor *on = gguf_find_tensor(f, "output_norm.weight");
        CHECK(bin && n > final_off + dim * 4 && emb && an && on, "stories260K.bin");
        if (bin && n > final_off + dim * 4 && emb && an && on) {
            CHECK(memcmp(emb->data, bin + 28, V * dim * 4) == 0, "token_embd bytes");
            CHECK(memcmp(an->data, bin + 28 + V * dim * 4, dim * 4) == 0, "blk.0.attn_norm bytes");
            CHECK(memcmp(on->data, bin + final_off, dim * 4) == 0, "output_norm bytes");
        }
        free(bin);
    } else {
        test_skip("stories260K.bin not found");
    }
    gguf_close(f);
}

/* Every model listed in golden/llamacpp/MODELS.md: arch, file_type, size, and
 * each tensor's name/type/shape in order; and the data section must be packed
 * (offsets are running 32-padded sizes), which checks the type table's block
 * byte sizes against files llama.cpp wrote. */
static void check_model_entry(const char *rel, const char *arch, const char *ftype, long long size,
                              char names[][80], char types[][16], int64_t shapes[][2], int n)
{
    char path[1024], sub[1024], err[512];
    snprintf(sub, sizeof sub, "golden/llamacpp/%s", rel);
    const char *base = strrchr(rel, '/') ? strrchr(rel, '/') + 1 : rel;
    if (path_find(sub, path, sizeof path) && path_find(base, path, sizeof path)) {
        test_skip(rel);
        return;
    }
    gguf_file *f = NULL;
    CHECK(gguf_open(path, &f, err, sizeof err) == 0, "%s: %s", rel, err);
    if (!f) return;
    gguf_str s;
    int64_t ft;
    CHECK(gguf_get_str(f, "general.architecture", &s) == 1 && gguf_str_eq(s, arch), "%s arch", rel);
    if (strcmp(ftype, "None") == 0)
        CHECK(gguf_get_int(f, "general.file_type", &ft) == 0, "%s has no file_type", rel);
    else
        CHECK(gguf_get_int(f, "general.file_type", &ft) == 1 && ft == atoll(ftype), "%s file_type", rel);
    CHECK((long long)f->size == size, "%s size %zu want %lld", rel, f->size, size);
    CHECK(f->n_tensors == (uint64_t)n, "%s: %llu tensors, MODELS.md lists %d", rel,
          (unsigned long long)f->n_tensors, n);
    uint64_t packed = 0;
    int bad = 0;
    for (int i = 0; i < n && (uint64_t)i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const quant_traits *tr = quant_traits_of(t->type);
        int ok = gguf_str_eq(t->name, names[i]) && tr && strcmp(tr->name, types[i]) == 0 &&
                 t->ne[0] == shapes[i][0] && t->ne[1] == shapes[i][1] && t->ne[2] == 1 && t->ne[3] == 1 &&
                 t->n_dims == (shapes[i][1] > 1 ? 2u : 1u) && t->offset == packed;
        if (!ok && bad++ < 3)
            CHECK(0, "%s tensor %d: got '%.*s' %s [%lld, %lld] offset %llu; want %s %s [%lld, %lld] offset %llu", rel, i,
                  (int)t->name.len, t->name.data, tr ? tr->name : "?", (long long)t->ne[0], (long long)t->ne[1],
                  (unsigned long long)t->offset, names[i], types[i], (long long)shapes[i][0], (long long)shapes[i][1],
                  (unsigned long long)packed);
        packed += (t->nbytes + f->alignment - 1) / f->alignment * f->alignment;
    }
    CHECK(bad == 0, "%s: %d tensors differ from MODELS.md", rel, bad);
    CHECK(f->data_offset + packed == f->size, "%s: data %llu + %llu != size %zu", rel,
          (unsigned long long)f->data_offset, (unsigned long long)packed, f->size);
    gguf_close(f);
}

/* A section of MODELS.md may have no tensor table and instead borrow the
 * shapes of another section ("Same shapes as NAME above.") and state the
 * types in one sentence of this form:
 *   Every matrix T [except `GLOB` (T)[, `GLOB` (T)]...[ and `GLOB` (T)]][; norms T].
 * A tensor takes the type of the first exception whose glob matches its
 * name, else the norms' type if its name ends in "norm.weight", else the
 * matrices' type if it is 2-D. Anything else fails the check instead of
 * being let through: a sentence in another form or naming an unknown type,
 * a tensor the sentence does not cover, an exception no tensor matches. */
enum { RULE_MAX_EXC = 8 };
typedef struct type_rule {
    char matrix[16], norms[16]; /* norms "": the sentence says nothing of them */
    int n_exc;
    char exc_glob[RULE_MAX_EXC][80], exc_type[RULE_MAX_EXC][16];
} type_rule;

static int rule_lit(const char **p, const char *w)
{
    size_t n = strlen(w);
    if (strncmp(*p, w, n) != 0) return 0;
    *p += n;
    return 1;
}

/* A ggml type name the type table knows ("Q6_K"), copied into out[16]. */
static int rule_type_word(const char **p, char *out)
{
    size_t n = strspn(*p, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
    if (n == 0 || n >= 16) return 0;
    memcpy(out, *p, n);
    out[n] = 0;
    for (uint32_t t = 0; t < QT_COUNT; t++) {
        const quant_traits *tr = quant_traits_of(t);
        if (tr && strcmp(tr->name, out) == 0) {
            *p += n;
            return 1;
        }
    }
    return 0;
}

static int parse_type_rule(const char *s, type_rule *r)
{
    memset(r, 0, sizeof *r);
    const char *p = s;
    if (!rule_lit(&p, "Every matrix ") || !rule_type_word(&p, r->matrix)) return -1;
    if (rule_lit(&p, " except ")) {
        do {
            if (r->n_exc == RULE_MAX_EXC || !rule_lit(&p, "`")) return -1;
            size_t n = strcspn(p, "`");
            if (n == 0 || n >= sizeof r->exc_glob[0] || p[n] != '`') return -1;
            memcpy(r->exc_glob[r->n_exc], p, n);
            r->exc_glob[r->n_exc][n] = 0;
            p += n;
            if (!rule_lit(&p, "` (") || !rule_type_word(&p, r->exc_type[r->n_exc]) || !rule_lit(&p, ")")) return -1;
            r->n_exc++;
        } while (rule_lit(&p, ", and ") || rule_lit(&p, ", ") || rule_lit(&p, " and "));
    }
    if (rule_lit(&p, "; norms ") && !rule_type_word(&p, r->norms)) return -1;
    rule_lit(&p, ".");
    p += strspn(p, " \t\r\n");
    return *p ? -1 : 0;
}

/* The type the rule gives tensor `name` with ne1 rows, or NULL if it says
 * nothing about it; exc_hit[k] counts the tensors exception k decided. */
static const char *rule_type_of(const type_rule *r, const char *name, int64_t ne1, int *exc_hit)
{
    for (int k = 0; k < r->n_exc; k++)
        if (fnmatch(r->exc_glob[k], name, 0) == 0) {
            exc_hit[k]++;
            return r->exc_type[k];
        }
    size_t n = strlen(name), tail = strlen("norm.weight");
    if (n >= tail && strcmp(name + n - tail, "norm.weight") == 0) return r->norms[0] ? r->norms : NULL;
    return ne1 > 1 ? r->matrix : NULL;
}

static void test_type_rule(void)
{
    type_rule r;
    int hit[RULE_MAX_EXC] = { 0 };
    CHECK(parse_type_rule("Every matrix IQ4_XS except `output.weight` (Q6_K) and `blk.*.attn_v.weight` (Q5_K); "
                          "norms F32.\n", &r) == 0 && r.n_exc == 2, "rule parses");
    static const struct { const char *name; int64_t ne1; const char *want; } cases[] = {
        { "output.weight", 512, "Q6_K" },          { "blk.1.attn_v.weight", 64, "Q5_K" },
        { "blk.0.ffn_down.weight", 256, "IQ4_XS" }, { "token_embd.weight", 512, "IQ4_XS" },
        { "output_norm.weight", 1, "F32" },        { "blk.0.attn_q.bias", 1, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = rule_type_of(&r, cases[i].name, cases[i].ne1, hit);
        CHECK(cases[i].want ? got && strcmp(got, cases[i].want) == 0 : got == NULL, "rule: %s is %s, want %s",
              cases[i].name, got ? got : "(none)", cases[i].want ? cases[i].want : "(none)");
    }
    CHECK(hit[0] == 1 && hit[1] == 1, "rule exceptions used %d, %d times", hit[0], hit[1]);
    CHECK(parse_type_rule("Every matrix Q8_0 except `a` (Q6_K), `b` (Q5_K), and `c` (F16)", &r) == 0 && r.n_exc == 3 &&
          strcmp(r.exc_type[2], "F16") == 0 && r.norms[0] == 0, "rule list with commas");
    CHECK(rule_type_of(&r, "blk.0.ffn_norm.weight", 1, hit) == NULL, "no norms clause: norms not covered");
    static const char *const bad[] = {
        "Every matrix IQ4_XQ; norms F32.",                           /* unknown type */
        "Every matrix IQ4_XS except output.weight (Q6_K).",          /* glob not quoted */
        "Every matrix IQ4_XS except `output.weight` Q6_K.",          /* type not in parentheses */
        "Every matrix IQ4_XS except `output.weight` (Q6_K) or so.",  /* trailing words */
        "Every matrix IQ4_XS; norms F32 and biases F16.",
        "Most matrices IQ4_XS.",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(parse_type_rule(bad[i], &r) != 0, "rule rejected: '%s'", bad[i]);
}

/* One "## PATH" section of MODELS.md; its table rows are md_*[first..first+n). */
typedef struct md_section {
    char rel[512], arch[64], ftype[32];
    long long size;
    int first, n;
    char same_as[128]; /* "Same shapes as NAME above": NAME */
    char rule[512];    /* the "Every matrix ..." sentence */
    int n_rules;
} md_section;

/* rel's file name without ".gguf" ("rand-llama-iq4_nl"), which is how a
 * section names another; the full path is accepted too. */
static int md_names_section(const md_section *m, const char *name)
{
    if (strcmp(m->rel, name) == 0) return 1;
    const char *base = strrchr(m->rel, '/') ? strrchr(m->rel, '/') + 1 : m->rel;
    size_t n = strlen(name);
    return strncmp(base, name, n) == 0 && (base[n] == 0 || strcmp(base + n, ".gguf") == 0);
}

static void test_models_md(void)
{
    char path[1024];
    if (path_find("golden/llamacpp/MODELS.md", path, sizeof path)) { test_skip("MODELS.md not found"); return; }
    FILE *fp = fopen(path, "r");
    CHECK(fp != NULL, "open MODELS.md");
    if (!fp) return;
    enum { MAXT = 4096, MAXM = 128 };
    static char names[MAXT][80], types[MAXT][16], dtypes[MAXT][16];
    static int64_t shapes[MAXT][2];
    static md_section md[MAXM];
    char line[1024];
    int n_rows = 0, n_md = 0, overflow = 0;
    md_section *cur = NULL;
    while (fgets(line, sizeof line, fp)) {
        if (strncmp(line, "## ", 3) == 0) {
            if (n_md == MAXM) { overflow = 1; cur = NULL; continue; }
            cur = &md[n_md++];
            memset(cur, 0, sizeof *cur);
            snprintf(cur->rel, sizeof cur->rel, "%.500s", line + 3);
            cur->rel[strcspn(cur->rel, " \r\n")] = 0;
            cur->first = n_rows;
            continue;
        }
        if (!cur) continue;
        if (strncmp(line, "arch `", 6) == 0) {
            sscanf(line, "arch `%63[^`]`, general.file_type %31[^,], %lld bytes", cur->arch, cur->ftype, &cur->size);
            continue;
        }
        if (strncmp(line, "Same shapes as ", 15) == 0) {
            sscanf(line + 15, "%127s", cur->same_as);
            continue;
        }
        if (strncmp(line, "Every matrix ", 13) == 0) {
            snprintf(cur->rule, sizeof cur->rule, "%.510s", line);
            cur->n_rules++;
            continue;
        }
        char name[80], type[16];
        long long a, b = 1;
        int k = sscanf(line, "| %79s | %15s | %lld x %lld |", name, type, &a, &b);
        if (k >= 3 && strcmp(name, "tensor") != 0) {
            if (n_rows == MAXT) { overflow = 1; continue; }
            snprintf(names[n_rows], sizeof names[n_rows], "%s", name);
            snprintf(types[n_rows], sizeof types[n_rows], "%s", type);
            shapes[n_rows][0] = a;
            shapes[n_rows][1] = k == 4 ? b : 1;
            n_rows++;
            cur->n++;
        }
    }
    fclose(fp);
    CHECK(!overflow, "MODELS.md has more than %d sections or %d tensor rows", MAXM, MAXT);

    for (int i = 0; i < n_md; i++) {
        const md_section *m = &md[i], *src = m;
        CHECK(m->n_rules <= 1, "%s: %d type sentences", m->rel, m->n_rules);
        if (m->n == 0) {
            /* no table: the shapes come from the section named, the types from the sentence */
            CHECK(m->same_as[0], "%s: neither a tensor table nor 'Same shapes as'", m->rel);
            CHECK(m->rule[0], "%s: no table and no 'Every matrix ...' sentence for the types", m->rel);
            if (!m->same_as[0] || !m->rule[0]) continue;
            int found = 0;
            for (int j = 0; j < n_md; j++)
                if (j != i && md_names_section(&md[j], m->same_as)) { src = &md[j]; found++; }
            CHECK(found == 1 && src->n > 0, "%s: 'Same shapes as %s' names %d sections with a table", m->rel,
                  m->same_as, found);
            if (found != 1 || src->n == 0) continue;
        } else {
            CHECK(!m->same_as[0], "%s: a tensor table and 'Same shapes as %s'", m->rel, m->same_as);
        }
        char (*want)[16] = types + src->first;
        if (m->rule[0]) { /* the sentence's types; with a table of its own they must agree with it */
            type_rule r;
            int hit[RULE_MAX_EXC] = { 0 }, uncovered = 0, differ = 0;
            CHECK(parse_type_rule(m->rule, &r) == 0, "%s: cannot read the type sentence '%.*s'", m->rel,
                  (int)strcspn(m->rule, "\r\n"), m->rule);
            if (parse_type_rule(m->rule, &r) != 0) continue;
            for (int t = 0; t < src->n; t++) {
                const char *ty = rule_type_of(&r, names[src->first + t], shapes[src->first + t][1], hit);
                if (!ty && uncovered++ < 3)
                    CHECK(0, "%s: the type sentence does not cover %s", m->rel, names[src->first + t]);
                snprintf(dtypes[t], sizeof dtypes[t], "%s", ty ? ty : "?");
                if (m->n && strcmp(dtypes[t], types[m->first + t]) != 0 && differ++ < 3)
                    CHECK(0, "%s: %s is %s in the table but %s by the sentence", m->rel, names[m->first + t],
                          types[m->first + t], dtypes[t]);
            }
            for (int k = 0; k < r.n_exc; k++)
                CHECK(hit[k] > 0, "%s: no tensor matches `%s`", m->rel, r.exc_glob[k]);
            if (uncovered || differ) continue;
            want = dtypes;
        }
        check_model_entry(m->rel, m->arch, m->ftype, m->size, names + src->first, want, shapes + src->first, src->n);
    }
    CHECK(n_md >= 15, "MODELS.md lists %d models", n_md);
}

/* llama.cpp's vocab-only test files: no tensors, large string arrays. */
static void test_vocab_files(void)
{
    static const struct { const char *name; const char *arch; uint64_t n_vocab; } vf[] = {
        { "ggml-vocab-llama-spm.gguf", "llama", 32000 },     { "ggml-vocab-gpt-2.gguf", "gpt2", 50257 },
        { "ggml-vocab-falcon.gguf", "falcon", 65024 },       { "ggml-vocab-phi-3.gguf", "phi3", 32064 },
        { "ggml-vocab-starcoder.gguf", "starcoder2", 49152 }, { "ggml-vocab-deepseek-coder.gguf", "llama", 32256 },
        { "ggml-vocab-deepseek-llm.gguf", "llama", 102400 },
    };
    for (size_t i = 0; i < sizeof vf / sizeof vf[0]; i++) {
        char sub[256], path[1024], err[512];
        snprintf(sub, sizeof sub, "golden/llamacpp/tokenizer/%s", vf[i].name);
        if (path_find(sub, path, sizeof path)) { test_skip(sub); continue; }
        gguf_file *f = NULL;
        CHECK(gguf_open(path, &f, err, sizeof err) == 0, "%s: %s", vf[i].name, err);
        if (!f) continue;
        gguf_str s;
        int64_t vs;
        CHECK(f->n_tensors == 0 && f->data_offset == f->size, "%s: metadata ends at %llu, file %zu", vf[i].name,
              (unsigned long long)f->data_offset, f->size);
        CHECK(gguf_get_str(f, "general.architecture", &s) == 1 && gguf_str_eq(s, vf[i].arch), "%s arch", vf[i].name);
        const gguf_kv *tok = gguf_find_kv(f, "tokenizer.ggml.tokens");
        const gguf_kv *tt = gguf_find_kv(f, "tokenizer.ggml.token_type");
        const gguf_kv *sc = gguf_find_kv(f, "tokenizer.ggml.scores");
        CHECK(tok && tok->arr_type == GGUF_STR && tok->n == vf[i].n_vocab && tok->strs, "%s tokens", vf[i].name);
        CHECK(tt && tt->n == vf[i].n_vocab, "%s token types", vf[i].name);
        CHECK(!sc || sc->n == vf[i].n_vocab, "%s scores", vf[i].name);
        char key[128];
        snprintf(key, sizeof key, "%s.vocab_size", vf[i].arch);
        int r = gguf_get_int(f, key, &vs);
        CHECK(r == 0 || (r == 1 && (uint64_t)vs == vf[i].n_vocab), "%s vocab_size", vf[i].name);
        /* every id in llama.cpp's expected tokenizations is a valid index */
        char out_path[1100];
        snprintf(out_path, sizeof out_path, "%s.out", path);
        size_t n;
        char *txt = test_read_file(out_path, &n);
        if (txt && tok) {
            long long max_id = -1;
            for (char *p = txt; *p;) {
                char *end;
                long long id = strtoll(p, &end, 10);
                if (end == p) { p++; continue; }
                if (id > max_id) max_id = id;
                p = end;
            }
            CHECK(max_id >= 0 && (uint64_t)max_id < tok->n, "%s: max id %lld < %llu", vf[i].name, max_id,
                  (unsigned long long)tok->n);
        }
        free(txt);
        gguf_close(f);
    }
}

/* gguf_str_show: what every message that quotes a file's bytes uses. */
static void test_str_show(void)
{
    char buf[96];
    gguf_str s = { 12, "ab\x1b[2J'\\\n\xff\x00z" };
    CHECK(strcmp(gguf_str_show(s, buf, sizeof buf), "ab\\x1b[2J\\x27\\x5c\\x0a\\xff\\x00z") == 0, "escaped: %s", buf);
    gguf_str plain = { 5, "llama" };
    CHECK(strcmp(gguf_str_show(plain, buf, sizeof buf), "llama") == 0, "plain: %s", buf);
    char long_name[300];
    memset(long_name, 'x', sizeof long_name);
    gguf_str lng = { sizeof long_name, long_name };
    gguf_str_show(lng, buf, sizeof buf);
    CHECK(strlen(buf) < sizeof buf && strcmp(buf + strlen(buf) - 3, "...") == 0, "cut: %zu bytes", strlen(buf));
    char small[5];
    gguf_str_show(lng, small, sizeof small);
    CHECK(strlen(small) < sizeof small, "tiny buffer stays terminated");
}

int main(void)
{
    test_str_show();
    test_small_image(3);
    test_small_image(2);
    test_bad_header();
    test_bad_kv();
    test_bad_alignment();
    test_bad_tensors();
    test_files();
    test_writer();
    test_stories();
    test_type_rule();
    test_models_md();
    test_vocab_files();
    return test_summary("test_gguf");
}
