/* fuzz_tokenizer.c - libFuzzer harness for the tokenizers and chat
 * templates over several vocabularies (scripts/fuzz.sh).
 *
 * Vocabularies (found on the search path, util/paths.h; a missing one is
 * left out, all missing is a setup error): stories260K (SentencePiece),
 * llama-spm, llama3-style BPE, qwen2 BPE, gpt-2, phi-3. Input byte 0 picks
 * the vocabulary and a chat template; the rest is text. Each input is
 * encoded with and without specials, every id is decoded, and the text is
 * rendered as a user turn through the template and tokenized; ids must be in
 * range and the encoders must agree on their own length. Valid UTF-8 text
 * encoded without specials must decode back to itself, as
 * tests/test_tokenizer.c asserts for llama.cpp's vectors (SPM: behind the
 * one space its add_space_prefix puts in front, and with its space marker
 * U+2581 read as a space): byte-level BPE and SPM's byte fallback lose
 * nothing, and specials in the text are plain text (parse_special = false).
 */
#include "core/chat.h"
#include "core/tokenizer.h"
#include "tensor/gguf.h"
#include "util/paths.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const vocab_names[] = {
    "stories260K.gguf",
    "golden/llamacpp/tokenizer/ggml-vocab-llama-spm.gguf",
    "golden/llamacpp/tokenizer/ggml-vocab-gpt-2-pre-llama-bpe.gguf",
    "golden/llamacpp/tokenizer/ggml-vocab-gpt-2-pre-qwen2.gguf",
    "golden/llamacpp/tokenizer/ggml-vocab-gpt-2.gguf",
    "golden/llamacpp/tokenizer/ggml-vocab-phi-3.gguf",
};
/* SentencePiece vocabularies (space prefix on decode), as vocab_names */
static const int vocab_spm[] = { 1, 1, 0, 0, 0, 1 };
enum { N_VOCAB_FILES = sizeof vocab_names / sizeof vocab_names[0] };
static const char *const templates[] = { "llama3", "chatml", "phi3", "mistral", "gemma" };

/* Loaded once by LLVMFuzzerInitialize and read-only afterwards: libFuzzer
 * gives a harness no other place to keep what every input shares. */
static tokenizer *toks[N_VOCAB_FILES];
static int toks_spm[N_VOCAB_FILES];
static gguf_file *files[N_VOCAB_FILES];
static int n_toks;
static volatile uint64_t sink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    for (int i = 0; i < N_VOCAB_FILES; i++) {
        char path[1024], err[256];
        if (path_find(vocab_names[i], path, sizeof path)) continue;
        gguf_file *f = NULL;
        tokenizer *t = NULL;
        if (gguf_open(path, &f, err, sizeof err) || tok_create_from_gguf(f, &t, err, sizeof err)) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
            abort();
        }
        files[n_toks] = f;
        toks_spm[n_toks] = vocab_spm[i];
        toks[n_toks++] = t;
    }
    if (n_toks == 0) {
        fprintf(stderr, "fuzz_tokenizer: no vocabulary found (%s)\n", path_search_description());
        abort();
    }
    return 0;
}

static void check_ids(const tokenizer *t, const int32_t *ids, int n)
{
    char buf[256];
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= tok_n_vocab(t)) abort();
        int w = tok_decode(t, ids[i], buf, sizeof buf);
        if (w < 0) abort();
        sink += (uint64_t)w;
    }
}

/* 1 if s[0..n) is valid UTF-8 (shortest forms, no surrogates, <= U+10FFFF). */
static int valid_utf8(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const uint8_t c = s[i];
        size_t l;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) { l = 2; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { l = 3; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { l = 4; cp = c & 0x07; }
        else return 0;
        if (n - i < l) return 0;
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((l == 3 && cp < 0x800) || (l == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return 0;
        i += l;
    }
    return 1;
}

/* decode(encode(text)) == text. SPM: " " + text when text is not empty,
 * and a "▁" (U+2581) in the text comes back as the space it stands for -
 * SentencePiece's escape cannot tell the two apart, as in llama.cpp. */
static void check_roundtrip(const tokenizer *t, int spm, const char *text, size_t len, const int32_t *ids, int n)
{
    size_t cap = 64, dl = 0, wl = 0;
    for (int i = 0; i < n; i++) cap += (size_t)tok_decode(t, ids[i], NULL, 0);
    char *dec = malloc(cap), *want = malloc(len + 1);
    if (!dec || !want) abort();
    for (int i = 0; i < n; i++) dl += (size_t)tok_decode(t, ids[i], dec + dl, (int)(cap - dl));
    if (spm && len > 0) want[wl++] = ' ';
    for (size_t i = 0; i < len; i++) {
        if (spm && len - i >= 3 && !memcmp(text + i, "\xe2\x96\x81", 3)) {
            want[wl++] = ' ';
            i += 2;
        } else {
            want[wl++] = text[i];
        }
    }
    if (dl != wl || memcmp(dec, want, wl) != 0) {
        fprintf(stderr, "fuzz_tokenizer: %s: %d ids decode to %zu bytes, not the text's %zu\n", spm ? "SPM" : "BPE",
                n, dl, wl);
        abort();
    }
    free(want);
    free(dec);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    const tokenizer *t = toks[data[0] % n_toks];
    const int spm = toks_spm[data[0] % n_toks];
    const char *tmpl = templates[(data[0] / N_VOCAB_FILES) % 5];
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    enum { MAX_IDS = 8192 };
    int32_t *ids = malloc(MAX_IDS * sizeof *ids);
    char *chat = malloc(2 * len + 512);
    if (!ids || !chat) abort();
    for (int special = 0; special < 2; special++) {
        int n = tok_encode(t, text, len, special, ids, MAX_IDS);
        if (n < 0) continue; /* refused (e.g. not UTF-8): fine, as long as it says so */
        if (n > MAX_IDS) abort(); /* at most one id per byte plus BOS/EOS */
        check_ids(t, ids, n);
        if (!special && valid_utf8((const uint8_t *)text, len)) check_roundtrip(t, spm, text, len, ids, n);
        /* asking for fewer must give the same count */
        if (n > 1 && tok_encode(t, text, len, special, ids, n / 2) != n) abort();
    }
    /* the text as a user turn: render, then tokenize with the markers */
    char *content = malloc(len + 1);
    if (!content) abort();
    memcpy(content, text, len);
    content[len] = 0; /* embedded NULs end the message, as in the C API */
    chat_msg msg = { "user", content };
    int r = chat_render(tmpl, &msg, 1, 1, chat, 2 * len + 512);
    if (r < 0) abort(); /* the template names are all valid */
    if ((size_t)r < 2 * len + 512) {
        int n = chat_tokenize(t, tmpl, chat, (size_t)r, ids, MAX_IDS);
        if (n >= 0 && n <= MAX_IDS) check_ids(t, ids, n);
    }
    free(content);
    free(chat);
    free(ids);
    return 0;
}
