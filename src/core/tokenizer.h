/* tokenizer.h - text <-> token ids, from the vocabulary stored in a GGUF.
 *
 * Two families, chosen by `tokenizer.ggml.model`:
 *   "llama"  SentencePiece (SPM): scores, token types, byte fallback
 *            (<0xNN> tokens), "▁" for spaces, add_space_prefix.
 *   "gpt2"   byte-level BPE with merges and the pre-tokenizer regex named by
 *            `tokenizer.ggml.pre` (gpt-2, llama3/llama-bpe, qwen2,
 *            deepseek-llm, deepseek-coder, falcon, starcoder, ...).
 * Ids equal llama.cpp's llama_tokenize(add_special, parse_special=false).
 */
#ifndef SPARQ_TOKENIZER_H
#define SPARQ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "tensor/gguf.h"

typedef struct tokenizer tokenizer;

/* Builds the tokenizer from f's tokenizer.* metadata (copies what it needs,
 * so f may be closed afterwards). Returns 0, or -1 with a one-line message. */
int  tok_create_from_gguf(const gguf_file *f, tokenizer **out, char *err, size_t err_size);
void tok_free(tokenizer *t);

/* Encodes text[len]. add_special: prepend BOS (and append EOS) when the vocab
 * says so (tokenizer.ggml.add_bos_token / add_eos_token, SPM default: BOS).
 * Writes at most max_ids ids; returns the number of ids the full encoding
 * has (which may exceed max_ids: call again with a bigger buffer), or -1 on
 * error. */
int tok_encode(const tokenizer *t, const char *text, size_t len, int add_special,
               int32_t *ids, int max_ids);

/* The bytes token `id` stands for in output text (SPM: "▁" -> " ", <0x0A> ->
 * "\n"; BPE: byte-level decoding; control tokens: ""). Writes at most
 * buf_size bytes (no NUL) and returns the full length, or -1 for a bad id. */
int tok_decode(const tokenizer *t, int32_t id, char *buf, int buf_size);

int tok_n_vocab(const tokenizer *t);
int tok_bos(const tokenizer *t);            /* -1 if none */
int tok_eos(const tokenizer *t);            /* -1 if none */
int tok_is_eog(const tokenizer *t, int32_t id); /* EOS, EOT, <|im_end|>, ... */
/* The raw vocabulary string of id (as stored, e.g. "▁the"), or NULL. An
 * empty string in the file reads "[EMPTY_<id>]", as in llama.cpp. */
const char *tok_text(const tokenizer *t, int32_t id);
/* Id of an exact vocabulary string, or -1 (for chat templates). */
int tok_lookup(const tokenizer *t, const char *text);

/* Runs the BPE pre-tokenizer named `pre_name` (a tokenizer.ggml.pre value:
 * "gpt-2", "llama3"/"llama-bpe", "qwen2", "deepseek-llm", "deepseek-coder",
 * "falcon", "starcoder", "default", ...) over text[len] without a
 * vocabulary. Piece i is text[offsets[i-1] .. offsets[i]) (offsets[-1] = 0):
 * writes at most max end offsets and returns the number of pieces (which
 * may exceed max), or -1 for an unknown name or out of memory. For tests
 * and debugging. */
int tok_pretokenize(const char *pre_name, const char *text, size_t len, size_t *offsets, int max);

/* Byte-level BPE alphabet (GPT-2 bytes_to_unicode): the codepoint standing
 * for byte b, and back (-1 for a codepoint that stands for no byte). The
 * one copy: the tokenizer and gen-model's made-up GPT-2 vocabularies. */
uint32_t tok_byte_to_cp(uint8_t b);
int      tok_cp_to_byte(uint32_t cp);

#endif
