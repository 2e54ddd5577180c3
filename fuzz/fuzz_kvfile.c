/* fuzz_kvfile.c - libFuzzer harness for the KV cache file reader
 * (io/kvfile.h; scripts/fuzz.sh).
 *
 * A mutated file almost never gets past the checksums, so the harness first
 * recomputes every checksum the reader checks (the data ones, each index
 * image's, the metadata's, then the header's) wherever the header's own
 * numbers place them inside the input: mutations then reach the layout,
 * shape and index-directory checks behind the CRCs. Odd input lengths keep
 * the bytes as given, so the checksum checks themselves are fuzzed too.
 * The file is handed over as a memfd; when accepted, every view the reader
 * gives out is touched at both ends.
 */
#include "io/kvfile.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile uint64_t sink;

static uint64_t rd64(const uint8_t *b, size_t at) { uint64_t v; memcpy(&v, b + at, 8); return v; }
static uint32_t rd32(const uint8_t *b, size_t at) { uint32_t v; memcpy(&v, b + at, 4); return v; }
static void wr32(uint8_t *b, size_t at, uint32_t v) { memcpy(b + at, &v, 4); }

/* [off, off + len) lies inside n bytes */
static int inside(uint64_t off, uint64_t len, size_t n) { return off <= n && len <= n - off; }

/* *off = base + i * stride without wrapping, and [*off, *off + len) inside n */
static int slot(uint64_t base, uint64_t i, uint64_t stride, uint64_t len, size_t n, uint64_t *off)
{
    uint64_t m;
    return !__builtin_mul_overflow(i, stride, &m) && !__builtin_add_overflow(base, m, off) &&
           inside(*off, len, n);
}

static void fix_checksums(uint8_t *b, size_t n)
{
    if (n < 4096) return;
    const int64_t L = (int32_t)rd32(b, 56), H = (int32_t)rd32(b, 64), d = (int32_t)rd32(b, 68);
    const uint32_t elem = rd32(b, 88), flags = rd32(b, 92);
    const int64_t rows = (int64_t)rd64(b, 96), cap = (int64_t)rd64(b, 104);
    const int64_t n_tokens = (int64_t)rd64(b, 112);
    const uint32_t n_index = rd32(b, 120);
    const uint64_t meta_off = rd64(b, 128), meta_bytes = rd64(b, 136);
    const uint64_t k_off = rd64(b, 144), v_off = rd64(b, 152), kt_off = rd64(b, 160);
    const uint64_t es = elem == 1 ? 2 : 4;
    if (L > 0 && H > 0 && d > 0 && L * H <= 4096 && d <= 1024 && rows >= 0 && rows <= cap &&
        cap <= (1 << 20) && n_tokens >= 0 && n_tokens <= (1 << 20) && n_index <= 4096 &&
        inside(meta_off, meta_bytes, n)) {
        uint8_t *meta = b + meta_off;
        const uint64_t heads = (uint64_t)(L * H);
        const uint64_t crc_at = (uint64_t)n_tokens * 4 + heads * (uint64_t)d * 4;
        const uint64_t n_crc = (flags & 1) ? 3 : 2;
        const uint64_t dir_at = crc_at + n_crc * heads * 4;
        if (dir_at + (uint64_t)n_index * 64 <= meta_bytes) {
            const uint64_t head_bytes = (uint64_t)cap * d * es, used = (uint64_t)rows * d * es;
            for (uint64_t hh = 0; hh < heads; hh++) {
                uint64_t off;
                if (slot(k_off, hh, head_bytes, used, n, &off))
                    wr32(meta, crc_at + hh * 4, kvf_crc32c(0, b + off, used));
                if (slot(v_off, hh, head_bytes, used, n, &off))
                    wr32(meta, crc_at + (heads + hh) * 4, kvf_crc32c(0, b + off, used));
                if ((flags & 1) && slot(kt_off, hh, head_bytes, head_bytes, n, &off)) {
                    /* K^T [d][cap]: blocks of columns, rows within a block */
                    const uint8_t *kt = b + off;
                    uint32_t c = 0;
                    for (int64_t c0 = 0; c0 < rows; c0 += KVF_KT_BLOCK) {
                        const int64_t w = rows - c0 < KVF_KT_BLOCK ? rows - c0 : KVF_KT_BLOCK;
                        for (int64_t r = 0; r < d; r++)
                            c = kvf_crc32c(c, kt + ((uint64_t)r * cap + c0) * es, (uint64_t)w * es);
                    }
                    wr32(meta, crc_at + (2 * heads + hh) * 4, c);
                }
            }
            for (uint32_t i = 0; i < n_index; i++) {
                uint8_t *e = meta + dir_at + (uint64_t)i * 64;
                const uint64_t off = rd64(e, 16), bytes = rd64(e, 24);
                if (inside(off, bytes, n)) wr32(e, 40, kvf_crc32c(0, b + off, bytes));
            }
        }
        wr32(b, 192, kvf_crc32c(0, meta, meta_bytes));
    }
    wr32(b, 4092, kvf_crc32c(0, b, 4092));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (8u << 20)) return 0;
    uint8_t *b = malloc(size ? size : 1);
    if (!b) abort();
    memcpy(b, data, size);
    if (size % 2 == 0) fix_checksums(b, size);
    int fd = memfd_create("kvfile", 0);
    if (fd < 0) abort();
    if (size && write(fd, b, size) != (ssize_t)size) abort();
    free(b);
    char path[64], err[512];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    kvf_file *f = NULL;
    if (kvf_open(path, NULL, KVF_VERIFY_ALWAYS, &f, err, sizeof err) == 0) {
        uint64_t acc = (uint64_t)f->n + (uint64_t)f->n_tokens;
        if (f->n_tokens) acc += (uint64_t)f->tokens[0] + (uint64_t)f->tokens[f->n_tokens - 1];
        const int64_t heads = (int64_t)f->fp.n_layer * f->fp.n_kv_head, d = f->fp.head_dim;
        acc += f->v_sum[0] > 0;
        acc += f->v_sum[heads * d - 1] > 0;
        const size_t es = f->elem ? 2 : 4;
        if (f->n > 0) {
            acc += f->k[0] + f->v[0];
            acc += f->k[(size_t)((heads - 1) * f->cap + f->n) * d * es - 1];
        }
        static const char *const kinds[] = { "exact", "ivf", "hnsw", "sparq" };
        for (int l = 0; l < f->fp.n_layer && l < 4; l++)
            for (int h = 0; h < f->fp.n_kv_head && h < 4; h++)
                for (int k = 0; k < 4; k++) {
                    size_t bytes = 0;
                    const uint8_t *img = kvf_find_index(f, l, h, kinds[k], &bytes);
                    if (img && bytes) acc += img[0] + img[bytes - 1];
                }
        sink += acc;
        kvf_close(f);
    } else if (memchr(err, '\n', strnlen(err, sizeof err))) {
        fprintf(stderr, "multi-line error: %s\n", err);
        abort(); /* errors are one line */
    }
    close(fd);
    return 0;
}
