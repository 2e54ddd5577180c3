/* fuzz_index.c - libFuzzer harness for key-index images (index/index.h;
 * scripts/fuzz.sh): idx_deserialize on hostile bytes, then searches.
 *
 * The input is copied to a 64-byte aligned buffer (so exact and ivf use it in
 * place, as from a mapped KV file) and loaded; a loaded index is searched
 * with a few query groups and k values, and every id it returns must be -1
 * or a key of the index. A refused image must give a one-line message.
 */
#include "index/index.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (4u << 20)) return 0;
    void *img = aligned_alloc(64, (size + 63) / 64 * 64 + 64);
    if (!img) abort();
    memcpy(img, data, size);
    idx_index *ix = NULL;
    char err[512];
    if (idx_deserialize(img, size, &ix, err, sizeof err)) {
        if (memchr(err, '\n', strnlen(err, sizeof err))) {
            fprintf(stderr, "multi-line error: %s\n", err);
            abort();
        }
        free(img);
        return 0;
    }
    const int d = idx_dim(ix);
    const int64_t N = idx_count(ix);
    enum { G = 4, K = 8 };
    float *q = malloc((size_t)G * d * sizeof *q);
    int32_t ids[G * K];
    float scores[G * K];
    if (!q) abort();
    for (int i = 0; i < G * d; i++) q[i] = (float)((i * 37 % 17) - 8) * 0.25f;
    idx_scratch *s = idx_scratch_create();
    if (!s) abort();
    for (int g = 1; g <= G; g += 3)
        for (int k = 1; k <= K; k += 7) {
            if (idx_search(ix, q, g, k, NULL, s, ids, scores, err, sizeof err)) continue;
            for (int i = 0; i < g * k; i++) {
                if (ids[i] < -1 || ids[i] >= N) {
                    fprintf(stderr, "id %d outside [-1, %lld)\n", ids[i], (long long)N);
                    abort();
                }
                sink += (uint64_t)ids[i];
            }
        }
    idx_scratch_free(s);
    free(q);
    idx_free(ix);
    free(img);
    return 0;
}
