/* gguf.h - reading (and writing) GGUF files, versions 2 and 3.
 *
 * File layout (all little-endian):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { str key | u32 type | value }        value: scalar, str, or
 *                                                 { u32 elem_type | u64 n | n x elem }
 *   n_tensors x { str name | u32 n_dims | n_dims x u64 ne | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32)
 *   tensor data; each tensor at data_start + offset, offset % alignment == 0
 *   str = { u64 len | len bytes, no NUL }
 *
 * The file is hostile until proven otherwise: every count and length is
 * checked against the bytes that remain before anything is allocated or
 * read, every product of dims is overflow-checked, and every tensor must lie
 * inside the file. Errors are one line naming the object, the value and the
 * bound, e.g. "gguf: tensor 'blk.0.attn_q.weight': data [1234, 99999) past end of file (5000 bytes)".
 *
 * One parser serves files (mmap, zero-copy) and memory buffers (tests).
 * All returned pointers are views into the mapping, valid until gguf_close.
 */
#ifndef SPARQ_GGUF_H
#define SPARQ_GGUF_H

#include <stddef.h>
#include <stdint.h>

enum gguf_value_type {
    GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4,
    GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STR = 8, GGUF_ARR = 9,
    GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12, GGUF_TYPE_COUNT
};

#define GGUF_MAX_DIMS 4

typedef struct gguf_str {
    uint64_t    len;
    const char *data;        /* not NUL-terminated                          */
} gguf_str;

typedef struct gguf_kv {
    gguf_str    key;
    uint32_t    type;        /* enum gguf_value_type                        */
    uint32_t    arr_type;    /* element type when type == GGUF_ARR           */
    uint64_t    n;           /* element count (1 for scalars)               */
    const void *data;        /* scalar value, or first array element (for
                                arrays of numbers; unaligned: use memcpy)   */
    gguf_str   *strs;        /* [n] when type == GGUF_STR or an array of
                                strings; NULL otherwise                     */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str    name;
    uint32_t    type;        /* quant.h QT_* id                             */
    uint32_t    n_dims;
    int64_t     ne[GGUF_MAX_DIMS]; /* ne[0] is the contiguous dim; unused = 1 */
    uint64_t    offset;      /* relative to the data section                */
    uint64_t    nbytes;
    const void *data;        /* into the mapping                            */
} gguf_tensor;

typedef struct gguf_file {
    uint32_t     version;
    uint64_t     n_kv;
    gguf_kv     *kv;         /* [n_kv]                                      */
    uint64_t     n_tensors;
    gguf_tensor *tensors;    /* [n_tensors]                                 */
    uint64_t     alignment;
    uint64_t     data_offset;/* start of the tensor data section           */
    const uint8_t *base;     /* whole file                                  */
    size_t       size;
    int          owns_map;   /* 1 when gguf_open mapped it                  */
} gguf_file;

/* Maps and parses `path`. On failure returns -1, *out = NULL and a one-line
 * message in err[err_size]. Free with gguf_close. */
int gguf_open(const char *path, gguf_file **out, char *err, size_t err_size);

/* How gguf_open_mode holds the file: mapped from the page cache, or read
 * into anonymous memory advised for transparent huge pages. Decode streams
 * every weight once per token; from huge pages that measured 5-13% faster
 * (fewer TLB misses, and the prefetchers run across whole 2 MiB pages) at
 * the cost of a read at load time. */
enum {
    GGUF_OPEN_MMAP = 0,
    GGUF_OPEN_COPY = 1,
    GGUF_OPEN_AUTO = 2  /* COPY when the file takes at most half the RAM (a
                           larger copy would push out the rest of the page
                           cache), else MMAP */
};
int gguf_open_mode(const char *path, int mode, gguf_file **out, char *err, size_t err_size);

/* Parses a file image in memory; `buf` must outlive the result. */
int gguf_parse(const void *buf, size_t size, gguf_file **out, char *err, size_t err_size);

/* Frees everything; gguf_close(NULL) is a no-op. */
void gguf_close(gguf_file *f);

/* Lookups. Return NULL when absent. */
const gguf_kv     *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: return 1 when found and convertible, 0 when absent, and -1
 * when present with an incompatible type (any integer type converts to
 * int64, any number to double, a string to gguf_str). */
int gguf_get_int(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_float(const gguf_file *f, const char *key, double *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* Array of numbers: element i converted (caller checks i < kv->n). */
double  gguf_arr_float(const gguf_kv *kv, uint64_t i);
int64_t gguf_arr_int(const gguf_kv *kv, uint64_t i);

/* 1 if the gguf_str equals the C string. */
int gguf_str_eq(gguf_str s, const char *c);

/* Additions (gguf.c):
 * Notes on the above: for GGUF_STR kvs, `data` points at the raw value (use
 * strs[0]); gguf_arr_float / gguf_arr_int also accept a scalar kv with i == 0,
 * map bools to 0/1, return 0 for strings or i >= kv->n, and gguf_arr_int
 * truncates floats toward zero, saturating (NaN -> 0; u64 > INT64_MAX ->
 * INT64_MAX). gguf_get_int returns -1 for a u64 above INT64_MAX. */

/* A string from a file made safe to quote in a one-line message: bytes
 * outside printable ASCII, quotes and backslashes become \xNN, a string too
 * long for buf ends in "...". Writes buf (size >= 1), returns it. */
const char *gguf_str_show(gguf_str s, char *buf, size_t size);

/* "u32", "str", ... for messages; "unknown" for ids >= GGUF_TYPE_COUNT. */
const char *gguf_type_name(uint32_t type);

/* ------------------------------------------------------------------ */
/* Writer (for `sparq gen-model` and tests). Tensor data is produced by a
 * callback at write time, so multi-GB files stream without being held in
 * memory. All functions return 0 or -1 (with a message in w's error). */

typedef struct gguf_writer gguf_writer;
typedef int (*gguf_fill_fn)(void *user, void *dst, size_t nbytes);

gguf_writer *gguf_writer_create(void);
void gguf_writer_free(gguf_writer *w);
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer *w, const char *key, int v);
int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v);
int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
int gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Declares a tensor; `fill(user, dst, nbytes)` writes its bytes later. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const int64_t *ne,
                           gguf_fill_fn fill, void *user);
/* Writes version-3 GGUF with alignment 32. */
int gguf_writer_write(gguf_writer *w, const char *path, char *err, size_t err_size);

/* Additions (gguf.c):
 * Errors in the set/add calls are sticky: the first one is kept, later calls
 * return -1 without effect, and gguf_writer_write reports it. gguf_writer_free
 * (NULL) is a no-op, and every call accepts w == NULL (returns -1), so a failed
 * gguf_writer_create needs no separate check. Duplicate keys or tensor names,
 * tensor names outside 1..63 bytes (llama.cpp's limit), unknown types, and
 * ne[0] not a multiple of the block size are errors. A NULL fill writes
 * zeros; a fill returning non-zero fails the write. On any write failure the
 * partial file is removed. */

/* The first error of a set/add call, "" if none. */
const char *gguf_writer_error(const gguf_writer *w);

#endif
