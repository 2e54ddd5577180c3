/* llama_state.h - reading llama.cpp's saved sequence state, the file
 * llama_state_seq_save_file and llama-server's /slots/ID?action=save write,
 * so a cache prefilled by llama.cpp elsewhere (a rented GPU) can become a
 * sparq KV file here. Read-only, mapped; nothing of llama.cpp is linked.
 *
 * Format (little-endian), as llama.cpp writes it from build b5913 (commit
 * 225e7a1, 2025-07-16: KV streams) on; state version 2 before that had no
 * stream count and is refused:
 *   u32 magic "ggsq" (0x67677371)   u32 version (2)
 *   u32 n_token_count               i32 tokens[n_token_count]
 *   u32 n_stream, then per stream:
 *     u32 cell_count; if > 0:
 *       per cell: i32 pos, u32 n_seq_id, i32 seq_id[n_seq_id]
 *       u32 v_trans, u32 n_layer
 *       per layer: i32 k_type, u64 k_row_bytes, k rows [cell_count]
 *       v_trans == 0: per layer: i32 v_type, u64 v_row_bytes, v rows [cell_count]
 *       v_trans == 1: per layer: i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
 *                     then for each of the n_embd_v components its
 *                     cell_count values (V transposed)
 * K rows hold the keys after RoPE, the heads side by side. Since build b8619
 * (744c0c7, 2026-04-01) llama.cpp stores a quantized cache rotated: every
 * chunk of nrot components of a head (K: the largest power of two >= 64
 * dividing the head size; V: 64) is multiplied by the orthonormal
 * Walsh-Hadamard matrix of that size, whenever the head size is a multiple
 * of 64 (and LLAMA_ATTN_ROT_DISABLE is unset). The file does not say so:
 * the importer finds out by recomputing the first keys (llst_*_rot).
 * Types are ggml's
 * (quant.h ids); f32, f16, bf16 and q8_0 are read. Models whose cache has a
 * different shape per cell (M-RoPE) or per layer are not read.
 *
 * Every count and size is checked against the file before use: a
 * truncated, hostile or other-format file is a one-line error. */
#ifndef SPARQ_LLAMA_STATE_H
#define SPARQ_LLAMA_STATE_H

#include <stddef.h>
#include <stdint.h>

#define LLST_MAGIC   0x67677371u /* "ggsq" */
#define LLST_VERSION 2u

typedef struct llst_file {
    const uint8_t *map;      /* the whole file, mapped read-only            */
    size_t         size;
    int64_t        n_tokens; /* token ids saved with the state              */
    const int32_t *tokens;   /* into map (4-byte aligned: offset 12)        */
    int64_t        n_cells;  /* cached positions                            */
    int32_t       *cell_of;  /* [n_cells]: the cell holding position p      */
    int            n_layer;
    int            v_trans;
    int            k_type, v_type;   /* quant.h ids, the same in every layer */
    int64_t        n_embd_k, n_embd_v; /* elements of a K / V row           */
    size_t         k_row_bytes, v_row_bytes; /* v: per element if v_trans  */
    size_t        *k_off, *v_off;    /* [n_layer] data offsets in map       */
    int            k_rot, v_rot;     /* Hadamard chunk the rows are rotated
                                      * by (llst_*_row undo it), 0 = none  */
} llst_file;

/* Opens and validates path. 0, or -1 with a message. */
int  llst_open(const char *path, llst_file *f, char *err, size_t err_size);
void llst_close(llst_file *f);

/* The rotation chunk llama.cpp b8619+ would use for a head of size d in a
 * cache of this type: K: the largest power of two >= 64 dividing d, V: 64;
 * 0 when it would not rotate (unquantized type, d not a multiple of 64). */
int llst_k_rot(int type, int d);
int llst_v_rot(int type, int d);

/* x[n] <- H x chunk by chunk (H the orthonormal Walsh-Hadamard matrix of
 * size nrot, Sylvester order: its own inverse). */
void llst_hadamard(float *x, int64_t n, int nrot);

/* The key row (n_embd_k floats) / value row (n_embd_v) of position pos in
 * layer, widened to f32 and rotated back when f->k_rot / v_rot say so. */
void llst_k_row(const llst_file *f, int layer, int64_t pos, float *out);
void llst_v_row(const llst_file *f, int layer, int64_t pos, float *out);

#endif
