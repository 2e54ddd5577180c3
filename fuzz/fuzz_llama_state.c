/* fuzz_llama_state.c - libFuzzer harness for llama.cpp sequence-state
 * files (io/llama_state.h; scripts/fuzz.sh). Seeds: the states llama.cpp
 * wrote in tests/data/llamacpp/. The input is handed over as a memfd;
 * when accepted, every row of every layer is read back (both rotations).
 */
#include "io/llama_state.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile float sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const int fd = memfd_create("state", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    llst_file f;
    if (llst_open(path, &f, err, sizeof err) == 0) {
        const int64_t w = f.n_embd_k > f.n_embd_v ? f.n_embd_k : f.n_embd_v;
        float *row = malloc((size_t)w * sizeof(float));
        for (int l = 0; row && l < f.n_layer; l++)
            for (int64_t p = 0; p < f.n_cells; p++) {
                f.k_rot = llst_k_rot(f.k_type, 64);
                f.v_rot = llst_v_rot(f.v_type, 64);
                llst_k_row(&f, l, p, row);
                sink += row[0] + row[f.n_embd_k - 1];
                llst_v_row(&f, l, p, row);
                sink += row[0] + row[f.n_embd_v - 1];
            }
        free(row);
        for (int64_t i = 0; i < f.n_tokens; i++) sink += (float)f.tokens[i];
        llst_close(&f);
    }
    close(fd);
    return 0;
}
