/* model_repack.c - weights rewritten once at load into the GEMM tiles'
 * layout (tensor/gemm.h), so that every product of such a matrix, one
 * token or a thousand, runs through the same tiles without packing it again.
 *
 * Why: prefill used to pack each panel of every matrix per batch, and a
 * batched decode step (sparq_decode_batch) multiplied each row with each
 * sequence by the one-token dot, at a few percent of the machine's int8 rate.
 * With the rows packed once, a step of B sequences is one GEMM of B tokens.
 * It also makes results independent of the batch by construction: the tiles
 * compute each (row, token) output by the same per-lane sequence of
 * operations whatever else shares the tile (gemm_panel_ref spells it out),
 * so a token's logits are the same alone, in a batch of 64 or in a prefill.
 *
 * Which types: Q8_0 only. Its packed rows take 36 bytes per 32 weights
 * against 34 in the file (codes as they are, the scale as f32), so a decode
 * step that reads every weight once costs about the same. The other integer
 * kinds widen 4- to 6-bit codes to bytes (Q4_0: 32 + 4 bytes against 18),
 * which would nearly double what decode reads; they keep packing per batch
 * for prefill only. Embeddings are never repacked (rows are looked up); a
 * tied output matrix gets a packed copy of its own.
 *
 * The packed copy lives in one anonymous mapping advised for huge pages,
 * like the file itself (gguf.c: decode streams it at DRAM speed); the
 * file's copy of each repacked matrix is released (release_source).
 */
#include "core/model.h"
#include "tensor/gemm.h"
#include "tensor/quant.h"
#include "util/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

size_t model_act_row_bytes(const model_hparams *hp)
{
    size_t max_in = (size_t)hp->n_embd;
    if ((size_t)hp->n_ff > max_in) max_in = hp->n_ff;
    if ((size_t)hp->n_head * hp->head_dim > max_in) max_in = (size_t)hp->n_head * hp->head_dim;
    size_t bytes = (max_in * 4 + 63) / 64 * 64; /* any vec_dot type: <= 4 bytes per element */
    const size_t tile = gemm_act_bytes(QT_Q8_0, (int64_t)((max_in + 31) / 32 * 32));
    return tile > bytes ? tile : bytes;
}

static int repackable(const weight *w)
{
    return w->data && w->type == QT_Q8_0 && gemm_supported(w->type) && gemm_row_bytes(w->type, w->n_in) > 0;
}

/* Bytes of w's packed copy: whole 16-row groups, 64-byte aligned. */
static size_t packed_bytes(const weight *w)
{
    const size_t groups = (size_t)((w->n_out + GEMM_GROUP - 1) / GEMM_GROUP);
    return groups * GEMM_GROUP * gemm_row_bytes(w->type, w->n_in);
}

enum { MATRICES_PER_LAYER = 7 };

/* The model's matrices in one list: MATRICES_PER_LAYER per layer, then the
 * output. */
static int list_matrices(sparq_model *m, weight **out)
{
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        layer_weights *L = &m->layers[il];
        weight *ws[MATRICES_PER_LAYER] = { &L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down };
        for (int i = 0; i < MATRICES_PER_LAYER; i++) out[n++] = ws[i];
    }
    out[n++] = &m->output;
    return n;
}

/* The file's copy of a repacked matrix is never read again (every product
 * reads the packed one), so its pages go back to the system and the model
 * takes about the file's memory, not twice that. Kept: the first 4 KiB of
 * each matrix (the KV-file fingerprint hashes every tensor's, context.c)
 * and a tied output's rows (the embeddings, looked up by token). data is
 * cleared, so a reader added later fails at once instead of reading zeros. */
static void release_source(const sparq_model *m, weight *w)
{
    if (w->data == m->tok_embd.data) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = ((uintptr_t)w->data + 4096 + page - 1) / page * page;
    const uintptr_t b = ((uintptr_t)w->data + (uintptr_t)(w->n_out * (int64_t)w->row_bytes)) / page * page;
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED); /* advice: on failure the pages just stay */
    w->data = NULL;
}

int model_repack(sparq_model *m, char *err, size_t err_size)
{
    const int cap = MATRICES_PER_LAYER * m->hp.n_layer + 1;
    weight **ws = malloc((size_t)cap * sizeof *ws);
    size_t *offs = malloc((size_t)cap * sizeof *offs);
    if (!ws || !offs) {
        free(ws);
        free(offs);
        return err_set(err, err_size, "model: out of memory");
    }
    const int n = list_matrices(m, ws);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = total;
        if (repackable(ws[i])) total += packed_bytes(ws[i]);
    }
    int rc = 0;
    if (total > 0) {
        void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) {
            err_set(err, err_size, "model: cannot allocate %zu bytes for the repacked weights: %s "
                    "(--no-repack keeps them as stored)", total, strerror(errno));
            rc = -1;
        } else {
            madvise(mem, total, MADV_HUGEPAGE); /* advice only */
            m->packed = mem;
            m->packed_size = total;
            /* one matrix per job, packed a few groups at a time */
            enum { JOB_ROWS = 16 * GEMM_GROUP };
#pragma omp parallel for schedule(dynamic, 1)
            for (int i = 0; i < n; i++) {
                weight *w = ws[i];
                if (!repackable(w)) continue;
                const size_t rb = gemm_row_bytes(w->type, w->n_in);
                uint8_t *dst = (uint8_t *)mem + offs[i];
                for (int64_t r0 = 0; r0 < w->n_out; r0 += JOB_ROWS) {
                    const int nr = (int)(w->n_out - r0 < JOB_ROWS ? w->n_out - r0 : JOB_ROWS);
                    gemm_pack_rows(w->type, (const uint8_t *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, nr,
                                   w->n_in, dst + (size_t)r0 * rb);
                }
                w->packed = dst;
            }
            mprotect(mem, total, PROT_READ); /* read-only from here, like the weights */
            for (int i = 0; i < n; i++)
                if (ws[i]->packed) release_source(m, ws[i]);
        }
    }
    free(ws);
    free(offs);
    return rc;
}

void model_repack_free(sparq_model *m)
{
    if (m->packed) munmap(m->packed, m->packed_size);
    m->packed = NULL;
    m->packed_size = 0;
}
