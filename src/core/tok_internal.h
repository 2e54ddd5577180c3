/* tok_internal.h - private pieces shared by the tokenizer's source files.
 *
 *   unicode_tables.c  generated codepoint -> category flags (ucd_flags)
 *   tok_pretok.c      UTF-8 decoding as llama.cpp does it, the hand-written
 *                     pre-tokenizer matchers, and the name -> pipeline table
 *   tokenizer.c       loading the vocabulary from GGUF, lookups, decoding
 *   tok_encode.c      special-token splitting, SPM and BPE merging
 *
 * Nothing here is part of the public API (see tokenizer.h).
 */
#ifndef SPARQ_TOK_INTERNAL_H
#define SPARQ_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "util/utf8.h" /* utf8_encode */

/* tokenizer.h's handle, repeated rather than included: tokenizer.c
 * includes this header, so including tokenizer.h here would put the two
 * modules in a circle (tests/test_layers.c). */
typedef struct tokenizer tokenizer;

/* Codepoint flags: one general-category bit (the Unicode major class) plus
 * the White_Space property. Same meaning as llama.cpp's unicode_cpt_flags,
 * so regexes written with \p{L}, \p{N}, \p{P}, \s behave identically. */
enum {
    UCF_UNDEFINED  = 0x001,  /* Cn (unassigned) */
    UCF_NUMBER     = 0x002,  /* \p{N} */
    UCF_LETTER     = 0x004,  /* \p{L} */
    UCF_SEPARATOR  = 0x008,  /* \p{Z} */
    UCF_MARK       = 0x010,  /* \p{M} */
    UCF_PUNCT      = 0x020,  /* \p{P} */
    UCF_SYMBOL     = 0x040,  /* \p{S} */
    UCF_CONTROL    = 0x080,  /* \p{C} other than Cn */
    UCF_WHITESPACE = 0x100,  /* \s (Unicode White_Space) */
};

typedef struct ucd_range {
    uint32_t start;   /* first codepoint; the range ends at the next start */
    uint16_t flags;   /* UCF_* */
} ucd_range;

extern const ucd_range ucd_ranges[];  /* sorted by start, ucd_ranges[0].start == 0 */
extern const int ucd_n_ranges;

/* Flags of cp; codepoints past U+10FFFF are UCF_UNDEFINED. */
uint16_t ucd_flags(uint32_t cp);

/* Byte length of the UTF-8 sequence a lead byte announces, from its high
 * nibble alone (continuation bytes count as 1). This is how llama.cpp splits
 * text into SPM/BPE symbols, valid or not. */
size_t tok_utf8_len(uint8_t lead);

/* Decodes one codepoint at s[0..n) (n >= 1) the way llama.cpp does:
 * continuation bytes are checked, overlong forms and surrogates are not;
 * anything else (or a value past U+10FFFF) yields U+FFFD and *adv = 1. */
uint32_t tok_utf8_decode(const uint8_t *s, size_t n, size_t *adv);


/* ------------------------------------------------------------------ */
/* Pre-tokenizer: splits text into words before BPE merging. A pipeline is a
 * list of regex-like matchers applied one after another; each splits every
 * current piece into its matches and the gaps between them (HF "Isolated"
 * behaviour, and what llama.cpp's unicode_regex_split does). */

typedef struct pt_def pt_def;

typedef struct pt_text {
    uint32_t *cps;    /* [n] codepoints (invalid UTF-8 bytes -> U+FFFD)     */
    uint16_t *flags;  /* [n] ucd_flags(cps[i])                               */
    size_t   *boff;   /* [n+1] byte offset of each codepoint; boff[n] = len */
    size_t    n;
    size_t   *ends;   /* [n_pieces] codepoint index where each piece ends    */
    size_t    n_pieces;
} pt_text;

/* The pipeline for a tokenizer.ggml.pre name, or NULL if unknown. */
const pt_def *pt_find(const char *name, size_t name_len);
int pt_ignore_merges(const pt_def *d);  /* whole-word vocab hit skips merges */
int pt_default_add_bos(const pt_def *d);/* add_bos default before the GGUF key */
int pt_drops_bos(const pt_def *d);      /* pre type that has no BOS (chatglm) */

/* Decodes text[len] and runs the pipeline; fills *t (free with pt_free).
 * Returns 0, or -1 on allocation failure. */
int  pt_split(const pt_def *d, const char *text, size_t len, pt_text *t);
void pt_free(pt_text *t);

/* ------------------------------------------------------------------ */
/* The tokenizer object (tokenizer.c loads it, tok_encode.c runs it).   */

/* Token attributes, as llama.cpp derives them from tokenizer.ggml.token_type
 * (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte; any
 * other value is "undefined") plus its name-based overrides. */
enum {
    TA_UNKNOWN      = 1 << 0,
    TA_UNUSED       = 1 << 1,
    TA_NORMAL       = 1 << 2,
    TA_CONTROL      = 1 << 3,
    TA_USER_DEFINED = 1 << 4,
    TA_BYTE         = 1 << 5,
    TA_LSTRIP       = 1 << 6,  /* eat spaces before it when split from text */
    TA_RSTRIP       = 1 << 7,  /* eat spaces after it */
    TA_EOG          = 1 << 8,  /* ends generation (tok_is_eog) */
};

enum { TOK_SPM = 1, TOK_BPE = 2 };

/* Open-addressing hash of byte strings -> id; slots hold id + 1 (0 = empty). */
typedef struct tok_hash {
    int32_t *slots;      /* [mask + 1] */
    size_t   mask;
} tok_hash;

typedef struct tok_merge {
    size_t   left_off;   /* into merge_arena */
    uint32_t left_len;
    uint32_t right_len;  /* right follows left + 1 (the space) */
} tok_merge;

struct tokenizer {
    int       type;              /* TOK_SPM / TOK_BPE */
    int32_t   n_vocab;

    char     *text_arena;        /* every token text, NUL-terminated */
    size_t   *text_off;          /* [n_vocab] */
    uint32_t *text_len;          /* [n_vocab] */
    float    *scores;            /* [n_vocab] SPM merge priority (0 if absent) */
    uint16_t *attr;              /* [n_vocab] TA_* */
    tok_hash  vocab;             /* text -> id; a repeated text maps to the last id */

    char     *piece_arena;       /* decoded bytes of every token */
    size_t   *piece_off;         /* [n_vocab] */
    uint32_t *piece_len;         /* [n_vocab] */

    /* BPE */
    const pt_def *pre;
    char     *merge_arena;       /* the merge strings "left right", back to back */
    tok_merge *merges;           /* [n_merges], index = rank */
    int32_t   n_merges;
    tok_hash  merge_hash;        /* (left, right) -> rank; first rank wins */
    int       ignore_merges;

    /* text that is split off before tokenizing (user-defined tokens),
     * longest first */
    int32_t  *specials;
    int32_t   n_specials;

    int32_t   byte_tok[256];     /* SPM byte fallback: <0xXX> (or the byte itself) */
    int32_t   char_tok[256];     /* the one-byte string as a token, or -1 */

    int32_t   bos, eos, unk, eot, eom;   /* -1 = none */
    int       add_bos, add_eos, add_space_prefix;
    int       spm_word_chunks;   /* "▁" only leads tokens: words merge alone */
};

/* Vocabulary lookups (tokenizer.c). */
int32_t tok_find(const tokenizer *t, const char *s, size_t len);
int32_t tok_merge_rank(const tokenizer *t, const char *l, size_t ll, const char *r, size_t rl);

#endif
