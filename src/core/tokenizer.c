/* tokenizer.c - building a tokenizer from GGUF metadata; lookups; decoding.
 *
 * Map of this file:
 *   1. string hashing (vocabulary and merge tables)
 *   2. the byte-level BPE alphabet (GPT-2 bytes_to_unicode)
 *   3. loading: tokens / scores / types, merges, special ids and flags
 *   4. llama.cpp's name-based fix-ups (EOG tokens, control overrides, ...)
 *   5. the decode cache (what each token prints as)
 *   6. public accessors
 * Encoding lives in tok_encode.c, the pre-tokenizers in tok_pretok.c.
 *
 * Everything read from the file is checked: array types, that scores and
 * token types have exactly one entry per token, that special ids are in
 * range (0xFFFFFFFF means "not set"), and sizes before they are added up.
 * The behaviour follows llama.cpp's vocabulary loader (llama_vocab::load),
 * so ids and decoded text match it.
 */
#include "util/err.h"
#include "core/tok_internal.h"
#include "core/tokenizer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* 1. hashing                                                           */

#define FNV_INIT 0xcbf29ce484222325ULL

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const uint8_t *s = p;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 0x100000001b3ULL; }
    return h;
}

/* A table with at least twice as many slots as entries keeps probes short. */
static int hash_alloc(tok_hash *h, size_t n_entries)
{
    size_t cap = 16;
    while (cap < 2 * n_entries) cap *= 2;
    h->slots = calloc(cap, sizeof(*h->slots));
    h->mask = cap - 1;
    return h->slots ? 0 : -1;
}

static int text_eq(const tokenizer *t, int32_t id, const char *s, size_t len)
{
    return t->text_len[id] == len && memcmp(t->text_arena + t->text_off[id], s, len) == 0;
}

int32_t tok_find(const tokenizer *t, const char *s, size_t len)
{
    size_t i = (size_t)fnv(s, len, FNV_INIT) & t->vocab.mask;
    for (;;) {
        int32_t v = t->vocab.slots[i];
        if (v == 0) return -1;
        if (text_eq(t, v - 1, s, len)) return v - 1;
        i = (i + 1) & t->vocab.mask;
    }
}

/* A repeated text maps to its last id, like llama.cpp's token_to_id[text] = id. */
static void vocab_insert(tokenizer *t, int32_t id)
{
    const char *s = t->text_arena + t->text_off[id];
    size_t i = (size_t)fnv(s, t->text_len[id], FNV_INIT) & t->vocab.mask;
    while (t->vocab.slots[i] != 0 && !text_eq(t, t->vocab.slots[i] - 1, s, t->text_len[id]))
        i = (i + 1) & t->vocab.mask;
    t->vocab.slots[i] = id + 1;
}

static uint64_t merge_hash(const char *l, size_t ll, const char *r, size_t rl)
{
    return fnv(r, rl, fnv("\xff", 1, fnv(l, ll, FNV_INIT)));
}

static int merge_eq(const tokenizer *t, int32_t rank, const char *l, size_t ll, const char *r, size_t rl)
{
    const tok_merge *m = &t->merges[rank];
    const char *ml = t->merge_arena + m->left_off;
    return m->left_len == ll && m->right_len == rl &&
           memcmp(ml, l, ll) == 0 && memcmp(ml + ll + 1, r, rl) == 0;
}

int32_t tok_merge_rank(const tokenizer *t, const char *l, size_t ll, const char *r, size_t rl)
{
    if (!t->merge_hash.slots) return -1;
    size_t i = (size_t)merge_hash(l, ll, r, rl) & t->merge_hash.mask;
    for (;;) {
        int32_t v = t->merge_hash.slots[i];
        if (v == 0) return -1;
        if (merge_eq(t, v - 1, l, ll, r, rl)) return v - 1;
        i = (i + 1) & t->merge_hash.mask;
    }
}

/* ------------------------------------------------------------------ */
/* 2. byte-level alphabet: printable Latin-1 bytes stand for themselves,
 *    the other 68 bytes (0x00-0x20, 0x7F-0xA0, 0xAD) for U+0100.. in order */

uint32_t tok_byte_to_cp(uint8_t b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) return b;
    if (b <= 0x20) return 256u + b;
    if (b <= 0xA0) return 256u + 33u + (uint32_t)(b - 0x7F);
    return 256u + 67u; /* 0xAD */
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return tok_byte_to_cp((uint8_t)cp) == cp ? (int)cp : -1;
    uint32_t n = cp - 256;
    if (n <= 32) return (int)n;
    if (n <= 66) return (int)(0x7F + n - 33);
    if (n == 67) return 0xAD;
    return -1;
}

/* ------------------------------------------------------------------ */
/* 3. loading                                                           */

void tok_free(tokenizer *t)
{
    if (!t) return;
    free(t->text_arena);
    free(t->text_off);
    free(t->text_len);
    free(t->scores);
    free(t->attr);
    free(t->vocab.slots);
    free(t->piece_arena);
    free(t->piece_off);
    free(t->piece_len);
    free(t->merge_arena);
    free(t->merges);
    free(t->merge_hash.slots);
    free(t->specials);
    free(t);
}

static int is_int_type(uint32_t ty)
{
    return ty == GGUF_U8 || ty == GGUF_I8 || ty == GGUF_U16 || ty == GGUF_I16 ||
           ty == GGUF_U32 || ty == GGUF_I32 || ty == GGUF_U64 || ty == GGUF_I64;
}

/* The per-token array `key` must be absent or have exactly n entries of a
 * numeric type (integers only when want_int). Returns the kv, NULL if
 * absent, or sets *bad. */
static const gguf_kv *per_token_array(const gguf_file *f, const char *key, uint64_t n, int want_int,
                                      int *bad, char *err, size_t err_size)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    *bad = 0;
    if (!kv) return NULL;
    int ok_type = kv->type == GGUF_ARR &&
                  (want_int ? is_int_type(kv->arr_type)
                            : (is_int_type(kv->arr_type) || kv->arr_type == GGUF_F32 || kv->arr_type == GGUF_F64));
    if (!ok_type) {
        *bad = 1;
        err_set(err, err_size, "tokenizer: %s is not an array of %s", key, want_int ? "integers" : "numbers");
        return NULL;
    }
    if (kv->n != n) {
        *bad = 1;
        err_set(err, err_size, "tokenizer: %s has %llu entries but tokenizer.ggml.tokens has %llu",
             key, (unsigned long long)kv->n, (unsigned long long)n);
        return NULL;
    }
    return kv;
}

static int load_tokens(tokenizer *t, const gguf_file *f, char *err, size_t err_size)
{
    const gguf_kv *kt = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (!kt) return err_set(err, err_size, "tokenizer: tokenizer.ggml.tokens missing");
    if (kt->type != GGUF_ARR || kt->arr_type != GGUF_STR || !kt->strs)
        return err_set(err, err_size, "tokenizer: tokenizer.ggml.tokens is not an array of strings");
    /* ids are int32 and the hash stores id + 1 */
    if (kt->n == 0 || kt->n > (uint64_t)(INT32_MAX / 4))
        return err_set(err, err_size, "tokenizer: tokenizer.ggml.tokens has %llu entries (want 1..%d)",
                    (unsigned long long)kt->n, INT32_MAX / 4);
    int32_t n = (int32_t)kt->n;
    t->n_vocab = n;

    int bad;
    const gguf_kv *ks = per_token_array(f, "tokenizer.ggml.scores", kt->n, 0, &bad, err, err_size);
    if (bad) return -1;
    const gguf_kv *ky = per_token_array(f, "tokenizer.ggml.token_type", kt->n, 1, &bad, err, err_size);
    if (bad) return -1;

    /* llama.cpp renames an empty token to "[EMPTY_<id>]" so it stays unique */
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        uint64_t len = kt->strs[i].len;
        if (len == 0) len = 32;
        if (len > UINT32_MAX - 1 || total > SIZE_MAX - len - 1)
            return err_set(err, err_size, "tokenizer: token %d is too long (%llu bytes)", i,
                        (unsigned long long)kt->strs[i].len);
        total += (size_t)len + 1;
    }
    t->text_arena = malloc(total);
    t->text_off = malloc((size_t)n * sizeof(*t->text_off));
    t->text_len = malloc((size_t)n * sizeof(*t->text_len));
    t->scores = malloc((size_t)n * sizeof(*t->scores));
    t->attr = malloc((size_t)n * sizeof(*t->attr));
    if (!t->text_arena || !t->text_off || !t->text_len || !t->scores || !t->attr ||
        hash_alloc(&t->vocab, (size_t)n))
        return err_set(err, err_size, "tokenizer: out of memory for %d tokens", n);

    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        char *dst = t->text_arena + off;
        size_t len = (size_t)kt->strs[i].len;
        if (len == 0) {
            len = (size_t)snprintf(dst, 32, "[EMPTY_%d]", i);
        } else {
            memcpy(dst, kt->strs[i].data, len);
            dst[len] = 0;
        }
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)len;
        off += len + 1;

        t->scores[i] = ks ? (float)gguf_arr_float(ks, (uint64_t)i) : 0.0f;
        int64_t ty = ky ? gguf_arr_int(ky, (uint64_t)i) : 1;
        switch (ty) {
        case 1:  t->attr[i] = TA_NORMAL; break;
        case 2:  t->attr[i] = TA_UNKNOWN; break;
        case 3:  t->attr[i] = TA_CONTROL; break;
        case 4:  t->attr[i] = TA_USER_DEFINED; break;
        case 5:  t->attr[i] = TA_UNUSED; break;
        case 6:  t->attr[i] = TA_BYTE; break;
        default: t->attr[i] = 0; break;   /* undefined: never printed */
        }
        vocab_insert(t, i);
    }
    return 0;
}

/* Merges "left right", split at the first space after the first byte (so a
 * left part may itself be a space). The first occurrence of a pair keeps
 * its rank. */
static int load_merges(tokenizer *t, const gguf_file *f, char *err, size_t err_size)
{
    const gguf_kv *km = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!km) return err_set(err, err_size, "tokenizer: tokenizer.ggml.merges missing for a gpt2 (BPE) vocab");
    if (km->type != GGUF_ARR || km->arr_type != GGUF_STR || !km->strs)
        return err_set(err, err_size, "tokenizer: tokenizer.ggml.merges is not an array of strings");
    if (km->n > (uint64_t)(INT32_MAX / 4))
        return err_set(err, err_size, "tokenizer: tokenizer.ggml.merges has %llu entries (max %d)",
                    (unsigned long long)km->n, INT32_MAX / 4);
    int32_t n = (int32_t)km->n;
    size_t total = 1;
    for (int32_t i = 0; i < n; i++) {
        uint64_t len = km->strs[i].len;
        if (len > UINT32_MAX - 2 || total > SIZE_MAX - len - 2)
            return err_set(err, err_size, "tokenizer: merge %d is too long", i);
        total += (size_t)len + 2;
    }
    t->merge_arena = malloc(total);
    t->merges = malloc(((size_t)n + 1) * sizeof(*t->merges));
    if (!t->merge_arena || !t->merges || hash_alloc(&t->merge_hash, (size_t)n))
        return err_set(err, err_size, "tokenizer: out of memory for %d merges", n);
    t->n_merges = n;

    size_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const char *s = km->strs[i].data;
        size_t len = (size_t)km->strs[i].len;
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        tok_merge *m = &t->merges[i];
        char *dst = t->merge_arena + off;
        m->left_off = off;
        if (sp) {
            m->left_len = (uint32_t)(sp - s);
            m->right_len = (uint32_t)(len - m->left_len - 1);
            memcpy(dst, s, len);
        } else {            /* no separator: llama.cpp stores the pair ("", "") */
            m->left_len = m->right_len = 0;
            dst[0] = ' ';
        }
        off += (size_t)m->left_len + 1 + m->right_len;

        const char *l = t->merge_arena + m->left_off, *r = l + m->left_len + 1;
        size_t h = (size_t)merge_hash(l, m->left_len, r, m->right_len) & t->merge_hash.mask;
        int dup = 0;
        while (t->merge_hash.slots[h] != 0) {
            if (merge_eq(t, t->merge_hash.slots[h] - 1, l, m->left_len, r, m->right_len)) { dup = 1; break; }
            h = (h + 1) & t->merge_hash.mask;
        }
        if (!dup) t->merge_hash.slots[h] = i + 1;
    }
    return 0;
}

/* Special id `key`: in range -> *id; absent or 0xFFFFFFFF/-1 -> unchanged
 * (the model-type default); anything else is an error when `strict`, and
 * ignored otherwise (llama.cpp ignores it with a warning). */
static int read_id(const gguf_file *f, const char *key, int32_t n_vocab, int strict, int32_t *id,
                   char *err, size_t err_size)
{
    int64_t v;
    int r = gguf_get_int(f, key, &v);
    if (r == 0) return 0;
    if (r < 0) return err_set(err, err_size, "tokenizer: %s is not an integer", key);
    if (v >= 0 && v < n_vocab) { *id = (int32_t)v; return 0; }
    if (v == 0xFFFFFFFFLL || v == -1 || !strict) return 0;
    return err_set(err, err_size, "tokenizer: %s = %lld is outside the vocabulary [0, %d)",
                key, (long long)v, n_vocab);
}

static int read_bool(const gguf_file *f, const char *key, int *out, char *err, size_t err_size)
{
    if (gguf_get_bool(f, key, out) < 0) return err_set(err, err_size, "tokenizer: %s is not a bool", key);
    return 0;
}

/* ------------------------------------------------------------------ */
/* 4. name-based fix-ups (llama.cpp recognises these tokens by text)    */

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int32_t find_cstr(const tokenizer *t, const char *s) { return tok_find(t, s, strlen(s)); }

/* Lowest id whose text is in list, or -1. */
static int32_t first_of(const tokenizer *t, const char *const *list, size_t n)
{
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = find_cstr(t, list[i]);
        if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
}

static const char *const EOT_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
    "<end_of_utterance>",
};
static const char *const EOM_TEXTS[] = { "<|eom_id|>" };
static const char *const FIM_PRE_TEXTS[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
    "<PRE>", "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>",
};
static const char *const FIM_SUF_TEXTS[] = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>",
    "<SUF>", "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>",
};
static const char *const FIM_MID_TEXTS[] = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
    "<MID>", "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>",
};
static const char *const FIM_PAD_TEXTS[] = { "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]" };
static const char *const FIM_REP_TEXTS[] = { "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>" };
static const char *const FIM_SEP_TEXTS[] = { "<|file_sep|>" };
static const char *const EOG_TEXTS[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", "[e~[",
};
static const char *const ALWAYS_SHOWN_TEXTS[] = { "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>" };

/* A token llama.cpp treats as "control" is never printed (special=false)
 * and never split out of plain text. */
static void make_control(tokenizer *t, int32_t id) { if (id >= 0) t->attr[id] |= TA_CONTROL; }

static int is_eog_text(const tokenizer *t, const char *s)
{
    int32_t id = find_cstr(t, s);
    return id >= 0 && (t->attr[id] & TA_EOG);
}

static int detect_specials(tokenizer *t, const gguf_file *f, char *err, size_t err_size)
{
    int32_t n = t->n_vocab;
    int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
    if (read_id(f, "tokenizer.ggml.eot_token_id", n, 0, &t->eot, err, err_size) ||
        read_id(f, "tokenizer.ggml.eom_token_id", n, 0, &t->eom, err, err_size) ||
        read_id(f, "tokenizer.ggml.fim_pre_token_id", n, 0, &fim_pre, err, err_size) ||
        read_id(f, "tokenizer.ggml.fim_suf_token_id", n, 0, &fim_suf, err, err_size) ||
        read_id(f, "tokenizer.ggml.fim_mid_token_id", n, 0, &fim_mid, err, err_size) ||
        read_id(f, "tokenizer.ggml.fim_pad_token_id", n, 0, &fim_pad, err, err_size) ||
        read_id(f, "tokenizer.ggml.fim_rep_token_id", n, 0, &fim_rep, err, err_size) ||
        read_id(f, "tokenizer.ggml.fim_sep_token_id", n, 0, &fim_sep, err, err_size) ||
        read_id(f, "tokenizer.ggml.prefix_token_id", n, 0, &fim_pre, err, err_size) ||
        read_id(f, "tokenizer.ggml.suffix_token_id", n, 0, &fim_suf, err, err_size) ||
        read_id(f, "tokenizer.ggml.middle_token_id", n, 0, &fim_mid, err, err_size))
        return -1;

    /* ids not given in the file are found by text and become control tokens */
    if (t->eot < 0) { t->eot = first_of(t, EOT_TEXTS, N_OF(EOT_TEXTS)); make_control(t, t->eot); }
    if (t->eom < 0) { t->eom = first_of(t, EOM_TEXTS, N_OF(EOM_TEXTS)); make_control(t, t->eom); }
    if (fim_pre < 0) { fim_pre = first_of(t, FIM_PRE_TEXTS, N_OF(FIM_PRE_TEXTS)); make_control(t, fim_pre); }
    if (fim_suf < 0) { fim_suf = first_of(t, FIM_SUF_TEXTS, N_OF(FIM_SUF_TEXTS)); make_control(t, fim_suf); }
    if (fim_mid < 0) { fim_mid = first_of(t, FIM_MID_TEXTS, N_OF(FIM_MID_TEXTS)); make_control(t, fim_mid); }
    if (fim_pad < 0) { fim_pad = first_of(t, FIM_PAD_TEXTS, N_OF(FIM_PAD_TEXTS)); make_control(t, fim_pad); }
    if (fim_rep < 0) { fim_rep = first_of(t, FIM_REP_TEXTS, N_OF(FIM_REP_TEXTS)); make_control(t, fim_rep); }
    if (fim_sep < 0) { fim_sep = first_of(t, FIM_SEP_TEXTS, N_OF(FIM_SEP_TEXTS)); make_control(t, fim_sep); }

    /* end-of-generation set */
    int32_t eog_ids[] = { fim_pad, fim_rep, fim_sep, t->eos, t->eot, t->eom };
    for (size_t i = 0; i < N_OF(eog_ids); i++)
        if (eog_ids[i] >= 0) t->attr[eog_ids[i]] |= TA_EOG;
    for (size_t i = 0; i < N_OF(EOG_TEXTS); i++) {
        int32_t id = find_cstr(t, EOG_TEXTS[i]);
        if (id >= 0) t->attr[id] |= TA_EOG | TA_CONTROL;
    }
    /* gpt-oss: these are always printed */
    for (size_t i = 0; i < N_OF(ALWAYS_SHOWN_TEXTS); i++) {
        int32_t id = find_cstr(t, ALWAYS_SHOWN_TEXTS[i]);
        if (id >= 0) t->attr[id] = (uint16_t)((t->attr[id] & TA_EOG) | TA_USER_DEFINED);
    }
    /* o200k_harmony / solar-open: "<|end|>" ends a message, not generation */
    int has_call = is_eog_text(t, "<|call|>") || is_eog_text(t, "<|calls|>");
    int32_t end_id = find_cstr(t, "<|end|>");
    if (end_id >= 0 && (t->attr[end_id] & TA_EOG) && has_call &&
        (is_eog_text(t, "<|return|>") || is_eog_text(t, "<|flush|>")))
        t->attr[end_id] = TA_USER_DEFINED;
    /* gemma4: "</s>" is ordinary text there */
    int32_t s_id = find_cstr(t, "</s>");
    if (s_id >= 0 && (t->attr[s_id] & TA_EOG) && is_eog_text(t, "<|tool_response>"))
        t->attr[s_id] = TA_NORMAL;
    return 0;
}

/* User-defined tokens are cut out of plain text before tokenizing, even
 * with parse_special = false (control and unknown tokens are not). Longest
 * first, then by id, so that a longer token wins over its prefix. */
static int build_specials(tokenizer *t, const gguf_file *f, char *err, size_t err_size)
{
    int32_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->attr[i] & TA_USER_DEFINED) && !(t->attr[i] & (TA_CONTROL | TA_UNKNOWN))) n++;
    t->specials = malloc(((size_t)n + 1) * sizeof(*t->specials));
    if (!t->specials) return err_set(err, err_size, "tokenizer: out of memory");
    t->n_specials = n;
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if ((t->attr[i] & TA_USER_DEFINED) && !(t->attr[i] & (TA_CONTROL | TA_UNKNOWN))) t->specials[n++] = i;
    /* insertion sort by length, descending; stable, so ids stay ascending.
     * Lists are short (hundreds to a few thousand, most of equal length). */
    for (int32_t i = 1; i < n; i++) {
        int32_t id = t->specials[i], j = i;
        while (j > 0 && t->text_len[t->specials[j - 1]] < t->text_len[id]) {
            t->specials[j] = t->specials[j - 1];
            j--;
        }
        t->specials[j] = id;
    }

    /* Phi-3: spaces after its special tokens belong to the token */
    gguf_str name;
    if (gguf_get_str(f, "general.name", &name) == 1) {
        char low[256];
        size_t len = name.len < sizeof(low) - 1 ? (size_t)name.len : sizeof(low) - 1;
        for (size_t i = 0; i < len; i++) {
            char c = name.data[i];
            low[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
        }
        low[len] = 0;
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            for (int32_t i = 0; i < t->n_vocab; i++)
                if (t->attr[i] & (TA_CONTROL | TA_USER_DEFINED | TA_UNKNOWN)) t->attr[i] |= TA_RSTRIP;
            int32_t id = find_cstr(t, "</s>");
            if (id >= 0) t->attr[id] |= TA_RSTRIP;
            const char *keep[] = { "<unk>", "<s>", "<|endoftext|>" };
            for (size_t i = 0; i < N_OF(keep); i++) {
                id = find_cstr(t, keep[i]);
                if (id >= 0) t->attr[id] &= (uint16_t)~TA_RSTRIP;
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ */
/* 5. decode cache: the bytes each token prints as (special = false)    */

#define MAX_PIECE (1u << 20)

/* "<0xNN>" -> NN, read like strtol on the two characters after "<0x". */
static int byte_of_token(const char *s, size_t len)
{
    int v = 0;
    for (size_t i = 3; i < 5 && i < len; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 :
                (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        if (d < 0) break;
        v = v * 16 + d;
    }
    return v;
}

/* Writes the piece of token id into out (NULL: only measure); returns its
 * length. BPE text is mapped back from the byte-level alphabet; a codepoint
 * outside it is spelled "[UNK_BYTE_0x<hex>" + token text + "]", as
 * llama.cpp does. */
static size_t make_piece(const tokenizer *t, int32_t id, char *out)
{
    uint16_t a = t->attr[id];
    const char *s = t->text_arena + t->text_off[id];
    size_t len = t->text_len[id], n = 0;
    if (a & (TA_UNKNOWN | TA_CONTROL)) return 0;
    if (a & TA_USER_DEFINED) {
        if (out) memcpy(out, s, len);
        return len;
    }
    if (a & TA_NORMAL) {
        if (t->type == TOK_SPM) {
            for (size_t i = 0; i < len; ) {
                if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    if (out) out[n] = ' ';
                    n++; i += 3;
                } else {
                    if (out) out[n] = s[i];
                    n++; i++;
                }
            }
            return n;
        }
        for (size_t i = 0; i < len; ) {
            size_t adv;
            uint32_t cp = tok_utf8_decode((const uint8_t *)s + i, len - i, &adv);
            i += adv;
            int b = tok_cp_to_byte(cp);
            if (b >= 0) {
                if (out) out[n] = (char)b;
                n++;
                continue;
            }
            char u8[4];
            size_t ul = utf8_encode(cp, u8);
            if (out) {
                memcpy(out + n, "[UNK_BYTE_0x", 12);
                static const char hexd[] = "0123456789abcdef";
                for (size_t k = 0; k < ul; k++) {
                    out[n + 12 + 2 * k] = hexd[(uint8_t)u8[k] >> 4];
                    out[n + 13 + 2 * k] = hexd[(uint8_t)u8[k] & 15];
                }
                memcpy(out + n + 12 + 2 * ul, s, len);
                out[n + 12 + 2 * ul + len] = ']';
            }
            n += 12 + 2 * ul + len + 1;
            if (n > MAX_PIECE) return n;   /* caller rejects it */
        }
        return n;
    }
    if (a & TA_BYTE) {
        if (out) out[0] = (char)byte_of_token(s, len);
        return 1;
    }
    return 0; /* unused / undefined */
}

static int build_pieces(tokenizer *t, char *err, size_t err_size)
{
    size_t total = 0;
    t->piece_off = malloc((size_t)t->n_vocab * sizeof(*t->piece_off));
    t->piece_len = malloc((size_t)t->n_vocab * sizeof(*t->piece_len));
    if (!t->piece_off || !t->piece_len) return err_set(err, err_size, "tokenizer: out of memory");
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t n = make_piece(t, i, NULL);
        if (n > MAX_PIECE)
            return err_set(err, err_size, "tokenizer: token %d decodes to more than %u bytes", i, MAX_PIECE);
        if (total > SIZE_MAX - n - 1) return err_set(err, err_size, "tokenizer: decoded vocabulary too large");
        t->piece_off[i] = total;
        t->piece_len[i] = (uint32_t)n;
        total += n;
    }
    t->piece_arena = malloc(total + 1);
    if (!t->piece_arena) return err_set(err, err_size, "tokenizer: out of memory");
    for (int32_t i = 0; i < t->n_vocab; i++) make_piece(t, i, t->piece_arena + t->piece_off[i]);
    return 0;
}

/* 1 when every "▁" of every token is in the token's leading run of "▁"
 * (true for SentencePiece vocabularies split on whitespace); tok_encode.c
 * then merges word by word. */
static int spaces_only_lead(const tokenizer *t)
{
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->text_arena + t->text_off[i];
        size_t len = t->text_len[i], k = 0;
        while (k + 3 <= len && memcmp(s + k, "\xe2\x96\x81", 3) == 0) k += 3;
        if (k < len && memmem(s + k, len - k, "\xe2\x96\x81", 3)) return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ */

int tok_create_from_gguf(const gguf_file *f, tokenizer **out, char *err, size_t err_size)
{
    if (out) *out = NULL;
    if (!f || !out) return err_set(err, err_size, "tokenizer: NULL argument");
    gguf_str model;
    int r = gguf_get_str(f, "tokenizer.ggml.model", &model);
    if (r == 0) return err_set(err, err_size, "tokenizer: tokenizer.ggml.model missing");
    if (r < 0) return err_set(err, err_size, "tokenizer: tokenizer.ggml.model is not a string");

    tokenizer *t = calloc(1, sizeof(*t));
    if (!t) return err_set(err, err_size, "tokenizer: out of memory");

    if (gguf_str_eq(model, "llama")) {
        t->type = TOK_SPM;
        t->bos = 1; t->eos = 2; t->unk = 0;
        t->add_bos = 1; t->add_space_prefix = 1;
    } else if (gguf_str_eq(model, "gpt2")) {
        t->type = TOK_BPE;
        t->bos = 11; t->eos = 11; t->unk = -1;
        gguf_str pre = { 7, "default" };
        r = gguf_get_str(f, "tokenizer.ggml.pre", &pre);
        if (r < 0) { err_set(err, err_size, "tokenizer: tokenizer.ggml.pre is not a string"); goto fail; }
        t->pre = pt_find(pre.data, (size_t)pre.len);
        if (!t->pre) {
            char shown[80];
            err_set(err, err_size, "tokenizer: unsupported pre-tokenizer '%s' (tokenizer.ggml.pre)",
                    gguf_str_show(pre, shown, sizeof shown));
            goto fail;
        }
        t->ignore_merges = pt_ignore_merges(t->pre);
        t->add_bos = pt_default_add_bos(t->pre);
        if (pt_drops_bos(t->pre)) t->bos = -1;
    } else {
        char shown[80];
        err_set(err, err_size, "tokenizer: unsupported tokenizer.ggml.model '%s' (want llama or gpt2)",
                gguf_str_show(model, shown, sizeof shown));
        goto fail;
    }
    t->eot = t->eom = -1;

    if (load_tokens(t, f, err, err_size)) goto fail;
    if (t->type == TOK_BPE && load_merges(t, f, err, err_size)) goto fail;

    /* defaults that do not exist in this vocabulary are disabled */
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->eos >= t->n_vocab) t->eos = -1;
    if (t->unk >= t->n_vocab) t->unk = -1;
    if (read_id(f, "tokenizer.ggml.bos_token_id", t->n_vocab, 1, &t->bos, err, err_size) ||
        read_id(f, "tokenizer.ggml.eos_token_id", t->n_vocab, 1, &t->eos, err, err_size) ||
        read_id(f, "tokenizer.ggml.unknown_token_id", t->n_vocab, 1, &t->unk, err, err_size) ||
        read_bool(f, "tokenizer.ggml.add_bos_token", &t->add_bos, err, err_size) ||
        read_bool(f, "tokenizer.ggml.add_eos_token", &t->add_eos, err, err_size) ||
        read_bool(f, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err, err_size))
        goto fail;

    if (detect_specials(t, f, err, err_size)) goto fail;
    if (build_specials(t, f, err, err_size)) goto fail;

    for (int b = 0; b < 256; b++) {
        char c = (char)b, hex[8];
        t->char_tok[b] = tok_find(t, &c, 1);
        snprintf(hex, sizeof(hex), "<0x%02X>", b);
        int32_t id = tok_find(t, hex, 6);
        t->byte_tok[b] = id >= 0 ? id : t->char_tok[b];
    }
    if (build_pieces(t, err, err_size)) goto fail;
    if (t->type == TOK_SPM) t->spm_word_chunks = spaces_only_lead(t);

    *out = t;
    return 0;
fail:
    tok_free(t);
    return -1;
}

/* ------------------------------------------------------------------ */
/* 6. accessors                                                         */

int tok_decode(const tokenizer *t, int32_t id, char *buf, int buf_size)
{
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    size_t n = t->piece_len[id];
    size_t c = buf_size > 0 ? ((size_t)buf_size < n ? (size_t)buf_size : n) : 0;
    if (c) memcpy(buf, t->piece_arena + t->piece_off[id], c);
    return (int)n;
}

int tok_n_vocab(const tokenizer *t) { return t ? t->n_vocab : 0; }
int tok_bos(const tokenizer *t) { return t ? t->bos : -1; }
int tok_eos(const tokenizer *t) { return t ? t->eos : -1; }

int tok_is_eog(const tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & TA_EOG) != 0;
}

const char *tok_text(const tokenizer *t, int32_t id)
{
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    return t->text_arena + t->text_off[id];
}

int tok_lookup(const tokenizer *t, const char *text)
{
    if (!t || !text) return -1;
    return tok_find(t, text, strlen(text));
}
