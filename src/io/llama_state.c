/* llama_state.c - llama.cpp sequence-state files (llama_state.h). */
#include "io/llama_state.h"
#include "tensor/quant.h"
#include "util/err.h"
#include "util/paths.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A bounds-checked reader over the mapping: every read says what it wanted
 * so a short file names the field it ran out in. */
typedef struct cursor {
    const uint8_t *p;
    size_t size, at;
    char *err;
    size_t err_size;
} cursor;

static int take(cursor *c, size_t n, const char *what, const uint8_t **out)
{
    if (n > c->size - c->at)
        return err_set(c->err, c->err_size, "llama.cpp state: truncated in %s (offset %zu, %zu bytes wanted, %zu left)",
                       what, c->at, n, c->size - c->at);
    *out = c->p + c->at;
    c->at += n;
    return 0;
}

static int take_u32(cursor *c, const char *what, uint32_t *v)
{
    const uint8_t *b = NULL;
    if (take(c, 4, what, &b)) return -1;
    memcpy(v, b, 4);
    return 0;
}

static int take_u64(cursor *c, const char *what, uint64_t *v)
{
    const uint8_t *b = NULL;
    if (take(c, 8, what, &b)) return -1;
    memcpy(v, b, 8);
    return 0;
}

static int readable_type(int t) { return t == QT_F32 || t == QT_F16 || t == QT_BF16 || t == QT_Q8_0; }

static const char *type_name(int t)
{
    const quant_traits *q = quant_traits_of((uint32_t)t);
    return q && q->name ? q->name : "unknown";
}

/* One layer's type and row size: layer 0's set them (whole blocks of the
 * type, and the row width), every later layer must repeat them. */
static int layer_rows(cursor *c, int layer, const char *kind, int *type, size_t *row_bytes, int64_t *width)
{
    uint32_t t;
    uint64_t u;
    if (take_u32(c, kind, &t) || take_u64(c, kind, &u)) return -1;
    if (!readable_type((int)t))
        return err_set(c->err, c->err_size,
                       "llama.cpp state: %s cache type %u (%s) in layer %d; f32, f16, bf16 and q8_0 are read", kind, t,
                       type_name((int)t), layer);
    if (layer > 0) {
        if ((int)t != *type || u != *row_bytes)
            return err_set(c->err, c->err_size, "llama.cpp state: layer %d's %s rows differ from layer 0's", layer,
                           kind);
        return 0;
    }
    const quant_traits *q = quant_traits_of(t);
    if (u == 0 || u > (1u << 24) || u % q->block_bytes)
        return err_set(c->err, c->err_size, "llama.cpp state: %s rows of %llu bytes are not whole %s blocks", kind,
                       (unsigned long long)u, q->name);
    *type = (int)t;
    *row_bytes = (size_t)u;
    *width = (int64_t)(u / q->block_bytes) * q->block_size;
    return 0;
}

static int parse(llst_file *f, cursor *c)
{
    char *err = c->err;
    const size_t err_size = c->err_size;
    uint32_t magic, version, n_tok;
    if (take_u32(c, "the magic", &magic)) return -1;
    if (magic == 0x6767736eu) /* "ggsn": llama_state_save_file's whole-context session */
        return err_set(err, err_size, "llama.cpp state: a whole-context session file (--prompt-cache), not a sequence "
                                      "state; save one with llama-server's /slots/ID?action=save");
    if (magic != LLST_MAGIC) return err_set(err, err_size, "llama.cpp state: not a sequence state file (magic %08x)", magic);
    if (take_u32(c, "the version", &version)) return -1;
    if (version != LLST_VERSION)
        return err_set(err, err_size, "llama.cpp state: sequence state version %u; version %u (llama.cpp b5913 and "
                                      "later) is read", version, LLST_VERSION);
    if (take_u32(c, "the token count", &n_tok)) return -1;
    const uint8_t *b = NULL;
    if (take(c, (size_t)n_tok * 4, "the token ids", &b)) return -1;
    f->n_tokens = n_tok;
    f->tokens = (const int32_t *)b; /* offset 12 */

    uint32_t n_stream;
    if (take_u32(c, "the stream count", &n_stream)) return -1;
    if (n_stream < 1 || n_stream > 4096)
        return err_set(err, err_size, "llama.cpp state: %u KV streams (a file of llama.cpp before b5913, or not a "
                                      "KV cache state)", n_stream);
    for (uint32_t s = 0; s < n_stream; s++) {
        uint32_t n_cells;
        if (take_u32(c, "a stream's cell count", &n_cells)) return -1;
        if (n_cells == 0) continue;
        if (f->n_cells)
            return err_set(err, err_size, "llama.cpp state: more than one stream holds cells (a whole-context "
                                          "state); save one sequence");
        /* the smallest cell record is 8 bytes: a count beyond that is a lie */
        if (n_cells > (c->size - c->at) / 8)
            return err_set(err, err_size, "llama.cpp state: %u cells cannot fit in the file", n_cells);
        f->n_cells = n_cells;
        f->cell_of = malloc((size_t)n_cells * sizeof *f->cell_of);
        if (!f->cell_of) return err_set(err, err_size, "llama.cpp state: out of memory for %u cells", n_cells);
        for (uint32_t i = 0; i < n_cells; i++) f->cell_of[i] = -1;
        for (uint32_t i = 0; i < n_cells; i++) {
            uint32_t pos, n_seq;
            if (take_u32(c, "a cell's position", &pos) || take_u32(c, "a cell's sequence count", &n_seq)) return -1;
            if (n_seq > 4096) return err_set(err, err_size, "llama.cpp state: cell %u lists %u sequences", i, n_seq);
            if (take(c, (size_t)n_seq * 4, "a cell's sequence ids", &b)) return -1;
            /* positions must be 0..n-1, each once: a cache that slid (SWA,
             * context shift) or holds another layout has no sparq form */
            if (pos >= n_cells || f->cell_of[pos] >= 0)
                return err_set(err, err_size, "llama.cpp state: cell %u holds position %d; positions 0..%u each "
                                              "once are read", i, (int32_t)pos, n_cells - 1);
            f->cell_of[pos] = (int32_t)i;
        }
        uint32_t v_trans, n_layer;
        if (take_u32(c, "the V layout", &v_trans) || take_u32(c, "the layer count", &n_layer)) return -1;
        if (v_trans > 1) return err_set(err, err_size, "llama.cpp state: V layout %u is neither 0 nor 1", v_trans);
        if (n_layer < 1 || n_layer > 4096) return err_set(err, err_size, "llama.cpp state: %u layers", n_layer);
        f->v_trans = (int)v_trans;
        f->n_layer = (int)n_layer;
        f->k_off = calloc(n_layer, sizeof *f->k_off);
        f->v_off = calloc(n_layer, sizeof *f->v_off);
        if (!f->k_off || !f->v_off) return err_set(err, err_size, "llama.cpp state: out of memory");
        for (uint32_t l = 0; l < n_layer; l++) {
            if (layer_rows(c, (int)l, "K", &f->k_type, &f->k_row_bytes, &f->n_embd_k)) return -1;
            f->k_off[l] = c->at;
            if (take(c, (size_t)n_cells * f->k_row_bytes, "K rows", &b)) return -1;
        }
        for (uint32_t l = 0; l < n_layer; l++) {
            if (!v_trans) {
                if (layer_rows(c, (int)l, "V", &f->v_type, &f->v_row_bytes, &f->n_embd_v)) return -1;
                f->v_off[l] = c->at;
                if (take(c, (size_t)n_cells * f->v_row_bytes, "V rows", &b)) return -1;
                continue;
            }
            uint32_t t, el, n_embd;
            if (take_u32(c, "V type", &t) || take_u32(c, "V element size", &el) || take_u32(c, "V width", &n_embd))
                return -1;
            /* transposed V is stored per element: only unblocked types */
            if (t != QT_F32 && t != QT_F16 && t != QT_BF16)
                return err_set(err, err_size, "llama.cpp state: transposed V of type %u (%s)", t, type_name((int)t));
            const quant_traits *q = quant_traits_of(t);
            if (el != q->block_bytes || n_embd < 1 || n_embd > (1u << 20))
                return err_set(err, err_size, "llama.cpp state: transposed V of %u-byte elements, width %u", el,
                               n_embd);
            if (l == 0) {
                f->v_type = (int)t;
                f->v_row_bytes = el;
                f->n_embd_v = n_embd;
            } else if ((int)t != f->v_type || n_embd != f->n_embd_v) {
                return err_set(err, err_size, "llama.cpp state: layer %u's V differs from layer 0's", l);
            }
            f->v_off[l] = c->at;
            if (take(c, (size_t)n_embd * n_cells * el, "V columns", &b)) return -1;
        }
    }
    if (f->n_cells == 0) return err_set(err, err_size, "llama.cpp state: no cached positions");
    if (c->at != c->size)
        return err_set(err, err_size, "llama.cpp state: %zu bytes after the cache (not a sequence state of llama.cpp "
                                      "b5913 or later)", c->size - c->at);
    return 0;
}

int llst_open(const char *path, llst_file *f, char *err, size_t err_size)
{
    memset(f, 0, sizeof *f);
    const int fd = path_open_regular(path, O_RDONLY, err, err_size);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return err_set(err, err_size, "'%s': %s", path, strerror(errno));
    }
    if (st.st_size < 20) {
        close(fd);
        return err_set(err, err_size, "'%s': %lld bytes, too short for a llama.cpp state", path, (long long)st.st_size);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return err_set(err, err_size, "'%s': mmap: %s", path, strerror(errno));
    f->map = map;
    f->size = (size_t)st.st_size;
    cursor c = { f->map, f->size, 0, err, err_size };
    if (parse(f, &c)) {
        llst_close(f);
        return -1;
    }
    return 0;
}

void llst_close(llst_file *f)
{
    if (f->map) munmap((void *)f->map, f->size);
    free(f->cell_of);
    free(f->k_off);
    free(f->v_off);
    memset(f, 0, sizeof *f);
}

/* Every section starts at a multiple of 4 bytes (the fields before data
 * are 4 or 8 bytes, counts of i32), so rows are aligned for f32 and f16. */
static void widen(int type, const uint8_t *src, float *out, int64_t n)
{
    quant_to_float((uint32_t)type, src, out, n);
}

int llst_k_rot(int type, int d)
{
    if (type != QT_Q8_0 || d % 64) return 0; /* the quantized types read here */
    int n = 64;
    while (d % (2 * n) == 0) n *= 2;
    return n;
}

int llst_v_rot(int type, int d) { return type == QT_Q8_0 && d % 64 == 0 ? 64 : 0; }

void llst_hadamard(float *x, int64_t n, int nrot)
{
    const float scale = 1.0f / sqrtf((float)nrot);
    for (int64_t c = 0; c + nrot <= n; c += nrot) {
        float *y = x + c;
        for (int len = 1; len < nrot; len *= 2)
            for (int i = 0; i < nrot; i += 2 * len)
                for (int j = i; j < i + len; j++) {
                    const float a = y[j], b = y[j + len];
                    y[j] = a + b;
                    y[j + len] = a - b;
                }
        for (int i = 0; i < nrot; i++) y[i] *= scale;
    }
}

void llst_k_row(const llst_file *f, int layer, int64_t pos, float *out)
{
    const int64_t cell = f->cell_of[pos];
    widen(f->k_type, f->map + f->k_off[layer] + (size_t)cell * f->k_row_bytes, out, f->n_embd_k);
    if (f->k_rot) llst_hadamard(out, f->n_embd_k, f->k_rot);
}

void llst_v_row(const llst_file *f, int layer, int64_t pos, float *out)
{
    const int64_t cell = f->cell_of[pos];
    if (!f->v_trans) {
        widen(f->v_type, f->map + f->v_off[layer] + (size_t)cell * f->v_row_bytes, out, f->n_embd_v);
        if (f->v_rot) llst_hadamard(out, f->n_embd_v, f->v_rot);
        return;
    }
    const uint8_t *col = f->map + f->v_off[layer] + (size_t)cell * f->v_row_bytes;
    const size_t stride = (size_t)f->n_cells * f->v_row_bytes;
    for (int64_t j = 0; j < f->n_embd_v; j++) widen(f->v_type, col + (size_t)j * stride, out + j, 1);
    if (f->v_rot) llst_hadamard(out, f->n_embd_v, f->v_rot);
}
