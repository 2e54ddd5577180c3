/* test_tokenizer.c - tokenizer against llama.cpp's vectors and by hand.
 *
 *   1. golden: every case of each .inp in ../shared/golden/llamacpp/tokenizer
 *      must give exactly the ids of the matching .out (add_special = 0), and the
 *      decoded ids must give the text back (SPM: with the leading space);
 *      the qwen2 and llama-bpe pre-tokenizer hybrids (golden README F.5) also
 *      against their .add_special.out (add_special = 1)
 *   2. stories260K prompts (add_special = 1) == *.tokens.i32
 *   3. pre-tokenizer splits for llama3 / qwen2 / gpt-2 derived by hand from
 *      the published regexes
 *   4. BPE merging against a naive quadratic re-implementation (gpt-2 vocab)
 *   5. hand-made vocabularies built in memory: SPM merging order, byte
 *      fallback, unknown, user-defined tokens, decoding; malformed metadata
 *      is rejected with a message
 */
#include "tensor/gguf.h"
#include "util/paths.h"
#include "test.h"
#include "core/tokenizer.h"

#include <stdint.h>

/* ------------------------------------------------------------------ */
/* helpers                                                              */

static tokenizer *load_vocab(const char *rel, gguf_file **gf)
{
    char path[4096], err[256];
    *gf = NULL;
    if (path_find(rel, path, sizeof(path))) return NULL;
    if (gguf_open(path, gf, err, sizeof(err))) {
        CHECK(0, "gguf_open %s: %s", path, err);
        return NULL;
    }
    tokenizer *t = NULL;
    if (tok_create_from_gguf(*gf, &t, err, sizeof(err))) {
        CHECK(0, "tok_create %s: %s", path, err);
        gguf_close(*gf);
        *gf = NULL;
        return NULL;
    }
    return t;
}

/* Encodes into a malloc'd array; *n = count (or -1). */
static int32_t *encode(const tokenizer *t, const char *s, size_t len, int add_special, int *n)
{
    *n = tok_encode(t, s, len, add_special, NULL, 0);
    if (*n < 0) return NULL;
    int32_t *ids = malloc(((size_t)*n + 1) * sizeof(*ids));
    if (!ids) { *n = -1; return NULL; }
    int n2 = tok_encode(t, s, len, add_special, ids, *n);
    CHECK(n2 == *n, "second encode gave %d, first %d", n2, *n);
    return ids;
}

/* Concatenated pieces of ids into a malloc'd buffer. */
static char *decode_all(const tokenizer *t, const int32_t *ids, int n, size_t *out_len)
{
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    for (int i = 0; i < n && buf; i++) {
        int k = tok_decode(t, ids[i], NULL, 0);
        if (k < 0) { free(buf); return NULL; }
        if (len + (size_t)k + 1 > cap) {
            while (len + (size_t)k + 1 > cap) cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); return NULL; }
            buf = nb;
        }
        tok_decode(t, ids[i], buf + len, k);
        len += (size_t)k;
    }
    if (buf) buf[len] = 0;
    *out_len = len;
    return buf;
}

/* Parses one .out line ("  1 2 3") into ids; returns the count. */
static int parse_ids(const char *line, size_t len, int32_t *ids, int max)
{
    int n = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && line[i] == ' ') i++;
        if (i >= len) break;
        long v = 0;
        while (i < len && line[i] >= '0' && line[i] <= '9') v = v * 10 + (line[i++] - '0');
        if (n < max) ids[n] = (int32_t)v;
        n++;
        while (i < len && line[i] != ' ') i++;
    }
    return n;
}

/* ------------------------------------------------------------------ */
/* 1. golden vectors                                                    */

/* add_special: compare with VEC.add_special.out, ids from encoding with the
 * vocabulary's own BOS/EOS rule (the decode round trip is then skipped:
 * the added specials are not text). */
static void golden_vocab_x(const char *name, const char *vocab_rel, const char *vec_rel, int is_spm, int add_special)
{
    char ipath[4096], opath[4096], rel[512];
    snprintf(rel, sizeof(rel), "%s.inp", vec_rel);
    int have = path_find(rel, ipath, sizeof(ipath)) == 0;
    snprintf(rel, sizeof(rel), "%s%s.out", vec_rel, add_special ? ".add_special" : "");
    have = have && path_find(rel, opath, sizeof(opath)) == 0;
    gguf_file *gf = NULL;
    tokenizer *t = have ? load_vocab(vocab_rel, &gf) : NULL;
    if (!t) {
        char why[600];
        snprintf(why, sizeof(why), "%s: vocab or vectors not found", name);
        test_skip(why);
        return;
    }
    size_t in_len, out_len;
    char *inp = test_read_file(ipath, &in_len);
    char *outp = test_read_file(opath, &out_len);
    CHECK(inp && outp, "%s: cannot read vectors", name);
    if (!inp || !outp) { free(inp); free(outp); tok_free(t); gguf_close(gf); return; }

    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sep_len = strlen(sep);
    const char *p = inp, *end = inp + in_len, *line = outp, *out_end = outp + out_len;
    int n_cases = 0, n_exact = 0, n_round = 0, n_round_tried = 0;
    while (p < end) {
        const char *q = memmem(p, (size_t)(end - p), sep, sep_len);
        if (!q) break;
        const char *nl = memchr(line, '\n', (size_t)(out_end - line));
        size_t line_len = nl ? (size_t)(nl - line) : (size_t)(out_end - line);
        int32_t want[4096];
        int n_want = parse_ids(line, line_len, want, 4096);

        int n;
        int32_t *got = encode(t, p, (size_t)(q - p), add_special, &n);
        int d = 0;
        while (got && d < n && d < n_want && got[d] == want[d]) d++;
        int same = got && n == n_want && d == n;
        CHECK(same, "%s case %d (%zu bytes): got %d ids, want %d (first difference at %d)", name,
              n_cases, (size_t)(q - p), n, n_want, d);
        n_exact += same;

        /* decode round trip: the text comes back (SPM adds a leading space) */
        if (got && !add_special) {
            size_t dl;
            char *dec = decode_all(t, got, n, &dl);
            size_t tl = (size_t)(q - p);
            int ok;
            n_round_tried++;
            if (is_spm && tl > 0)
                ok = dec && dl == tl + 1 && dec[0] == ' ' && memcmp(dec + 1, p, tl) == 0;
            else
                ok = dec && dl == tl && memcmp(dec, p, tl) == 0;
            CHECK(ok, "%s case %d: decode does not reproduce the text", name, n_cases);
            n_round += ok;
            free(dec);
        }
        free(got);
        n_cases++;
        p = q + sep_len;
        line = nl ? nl + 1 : out_end;
    }
    CHECK(n_cases == 46, "%s: %d cases, want 46", name, n_cases);
    fprintf(stderr, "  %-16s%s %2d/%d cases exact, %2d/%d decode round trips\n", name,
            add_special ? " +special" : "", n_exact, n_cases, n_round, n_round_tried);
    free(inp);
    free(outp);
    tok_free(t);
    gguf_close(gf);
}

static void golden_vocab(const char *name, const char *vocab_rel, const char *vec_rel, int is_spm)
{
    golden_vocab_x(name, vocab_rel, vec_rel, is_spm, 0);
}

static void test_golden(void)
{
    static const struct { const char *name; int spm; } vocabs[] = {
        { "llama-spm", 1 }, { "phi-3", 1 }, { "gpt-2", 0 }, { "deepseek-llm", 0 },
        { "deepseek-coder", 0 }, { "falcon", 0 }, { "starcoder", 0 },
    };
    for (size_t i = 0; i < sizeof(vocabs) / sizeof(vocabs[0]); i++) {
        char v[256];
        snprintf(v, sizeof(v), "golden/llamacpp/tokenizer/ggml-vocab-%s.gguf", vocabs[i].name);
        golden_vocab(vocabs[i].name, v, v, vocabs[i].spm);
    }
    golden_vocab("stories260K", "stories260K.gguf", "golden/llamacpp/tokenizer/stories260K.gguf", 1);
    /* golden README F.5: the gpt-2 vocabulary under the qwen2 and llama-bpe
     * (llama3) pre-tokenizers, without and with the vocabulary's specials
     * (llama-bpe adds BOS 50256, qwen2 nothing) */
    static const char *const pre[] = { "gpt-2-pre-qwen2", "gpt-2-pre-llama-bpe" };
    for (size_t i = 0; i < sizeof(pre) / sizeof(pre[0]); i++) {
        char v[256];
        snprintf(v, sizeof(v), "golden/llamacpp/tokenizer/ggml-vocab-%s.gguf", pre[i]);
        golden_vocab_x(pre[i], v, v, 0, 0);
        golden_vocab_x(pre[i], v, v, 0, 1);
    }
}

/* ------------------------------------------------------------------ */
/* 2. stories260K prompts with BOS                                      */

static void test_stories_prompts(void)
{
    gguf_file *gf;
    tokenizer *t = load_vocab("stories260K.gguf", &gf);
    if (!t) { test_skip("stories260K.gguf not found"); return; }
    CHECK(tok_n_vocab(t) == 512, "n_vocab %d", tok_n_vocab(t));
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2, "bos %d eos %d", tok_bos(t), tok_eos(t));
    CHECK(tok_is_eog(t, 2) && !tok_is_eog(t, 1) && !tok_is_eog(t, 100), "eog flags");
    static const char *const names[] = { "once_upon_a_time", "lily_tom_park", "sad_dog", "boy_cat_story" };
    for (size_t i = 0; i < 4; i++) {
        char rel[256], pp[4096], tp[4096];
        snprintf(rel, sizeof(rel), "golden/llamacpp/stories260K/%s.prompt.txt", names[i]);
        int ok = path_find(rel, pp, sizeof(pp)) == 0;
        snprintf(rel, sizeof(rel), "golden/llamacpp/stories260K/%s.tokens.i32", names[i]);
        ok = ok && path_find(rel, tp, sizeof(tp)) == 0;
        if (!ok) { test_skip(names[i]); continue; }
        size_t pl, tl;
        char *prompt = test_read_file(pp, &pl);
        int32_t *want = test_read_file(tp, &tl);
        int n;
        int32_t *got = encode(t, prompt, pl, 1, &n);
        int same = got && (size_t)n == tl / 4;
        for (int k = 0; same && k < n; k++) same = got[k] == want[k];
        CHECK(same, "stories prompt %s: %d ids, want %zu", names[i], n, tl / 4);
        free(prompt);
        free(want);
        free(got);
    }
    tok_free(t);
    gguf_close(gf);
}

/* ------------------------------------------------------------------ */
/* 3. pre-tokenizer splits by hand                                      */

/* pieces: the expected split, separated by '|' (no '|' in these texts) */
static void check_split(const char *pre, const char *text, const char *pieces)
{
    size_t off[256];
    int n = tok_pretokenize(pre, text, strlen(text), off, 256);
    char got[2048];
    size_t g = 0, start = 0;
    for (int i = 0; i < n && i < 256 && g + 8 < sizeof(got); i++) {
        if (i) got[g++] = '|';
        size_t len = off[i] - start;
        if (g + len >= sizeof(got) - 1) break;
        memcpy(got + g, text + start, len);
        g += len;
        start = off[i];
    }
    got[g] = 0;
    CHECK(n >= 0 && strcmp(got, pieces) == 0, "%s split of \"%s\":\n     got  [%s]\n     want [%s]",
          pre, text, got, pieces);
}

static void test_pretokenize(void)
{
    /* Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
     *           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    const char *l3 = "llama3";
    check_split(l3, "Hello world's 12345 test!!\n\n  x", "Hello| world|'s| |123|45| test|!!\n\n| | x");
    check_split(l3, "I'M HERE, YOU'RE not", "I|'M| HERE|,| YOU|'RE| not");
    check_split(l3, "1234567", "123|456|7");
    check_split(l3, "abc123def", "abc|123|def");
    check_split(l3, "  leading", " | leading");
    check_split(l3, "trailing   ", "trailing|   ");
    check_split(l3, "a\n\n\nb", "a|\n\n\n|b");
    check_split(l3, "x \n y", "x| \n| y");
    check_split(l3, "$100.00", "$|100|.|00");
    check_split(l3, "(hi) ...!", "(hi|)| ...!");
    check_split(l3, "\tfoo\t\tbar", "\tfoo|\t|\tbar");
    check_split(l3, "don't", "don|'t");
    check_split(l3, "\xc3\x84pfel \xe6\x88\x91\xe6\x83\xb3 \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe",
                "\xc3\x84pfel| \xe6\x88\x91\xe6\x83\xb3| \xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe");
    check_split(l3, "?!\r\n", "?!\r\n");
    check_split("llama-bpe", "3.14159", "3|.|141|59");

    /* Qwen2: the same with \p{N} (single digits) */
    const char *q2 = "qwen2";
    check_split(q2, "Hello world's 12345 test!!\n\n  x", "Hello| world|'s| |1|2|3|4|5| test|!!\n\n| | x");
    check_split(q2, "1234567", "1|2|3|4|5|6|7");
    check_split(q2, "abc123def", "abc|1|2|3|def");
    check_split(q2, "I'M HERE, YOU'RE not", "I|'M| HERE|,| YOU|'RE| not");
    check_split(q2, "  leading", " | leading");
    check_split(q2, "trailing   ", "trailing|   ");
    check_split(q2, "a\n\n\nb", "a|\n\n\n|b");
    check_split(q2, "$100.00", "$|1|0|0|.|0|0");
    check_split(q2, "\tfoo\t\tbar", "\tfoo|\t|\tbar");
    check_split(q2, "we'll x'LL", "we|'ll| x|'LL");
    check_split(q2, "\xe2\x85\xa7 \xc2\xbd", "\xe2\x85\xa7| |\xc2\xbd"); /* Ⅷ and ½ are \p{N} */

    /* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    const char *g2 = "gpt-2";
    check_split(g2, "Hello world's 12345 test!!\n\n  x", "Hello| world|'s| 12345| test|!!|\n\n | x");
    check_split(g2, "I'M here", "I|'|M| here");   /* case-sensitive contractions */
    check_split(g2, "a  b", "a| | b");
    check_split(g2, "x\n", "x|\n");

    CHECK(tok_pretokenize("no-such-pre", "x", 1, NULL, 0) == -1, "unknown pre name");
    size_t o[4];
    CHECK(tok_pretokenize("gpt-2", "", 0, o, 4) == 0, "empty text has no pieces");
    /* invalid UTF-8 bytes are single symbols (U+FFFD, a symbol) and the
     * offsets still index the original bytes */
    int n = tok_pretokenize("gpt-2", "a\xff\xfe b", 5, o, 4);
    CHECK(n == 3 && o[0] == 1 && o[1] == 3 && o[2] == 5, "invalid utf-8 split: n=%d", n);
}

/* ------------------------------------------------------------------ */
/* 4. merging against naive quadratic references                        */

/* Test-side GPT-2 bytes_to_unicode, written from the published definition:
 * bytes ! .. ~, ¡ .. ¬, ® .. ÿ map to themselves, the rest to 256, 257, ...
 * in byte order. */
static uint32_t ref_byte_cp(int b)
{
    int n = 0;
    for (int c = 0; c < 256; c++) {
        int keep = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        if (c == b) return keep ? (uint32_t)c : 256u + (uint32_t)n;
        if (!keep) n++;
    }
    return 0;
}

static size_t put_utf8(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xC0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3F));
    return 2; /* the byte-level alphabet stays below U+0800 */
}

typedef struct { const char *s; size_t n; } span;

/* merges "l r" of a gguf, sorted for bsearch */
typedef struct { const char *s; size_t n; int rank; } ref_merge;
static int cmp_merge(const void *a, const void *b)
{
    const ref_merge *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->s, y->s, n);
    return c ? c : (x->n < y->n ? -1 : x->n > y->n);
}

static int ref_rank(const ref_merge *m, size_t nm, span l, span r)
{
    char key[512];
    if (l.n + r.n + 1 > sizeof(key)) return -1;
    memcpy(key, l.s, l.n);
    key[l.n] = ' ';
    memcpy(key + l.n + 1, r.s, r.n);
    ref_merge k = { key, l.n + r.n + 1, 0 };
    const ref_merge *hit = bsearch(&k, m, nm, sizeof(*m), cmp_merge);
    return hit ? hit->rank : -1;
}

/* Random text from a small alphabet of ASCII, spaces and a few multi-byte
 * characters, so merges, spaces and byte tokens all occur. */
static size_t random_text(uint64_t *st, char *out, size_t max)
{
    static const char *const parts[] = {
        "a", "e", "th", "in", "er", "the", "ing", " ", " ", "  ", "\n", "x", "Q", "7", "42", "!", ".",
        "'s", "\xc3\xa9", "\xe6\x88\x91", "\xf0\x9f\xa6\x99", "\t", "ll", "on", "re", "an", "Hello", "wor",
    };
    size_t n = 0;
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    int k = 1 + (int)((*st >> 33) % 24);
    for (int i = 0; i < k; i++) {
        *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
        const char *p = parts[(*st >> 33) % (sizeof(parts) / sizeof(parts[0]))];
        size_t l = strlen(p);
        if (n + l >= max) break;
        memcpy(out + n, p, l);
        n += l;
    }
    out[n] = 0;
    return n;
}

static void test_bpe_naive(void)
{
    gguf_file *gf;
    tokenizer *t = load_vocab("golden/llamacpp/tokenizer/ggml-vocab-gpt-2.gguf", &gf);
    if (!t) { test_skip("gpt-2 vocab not found"); return; }
    const gguf_kv *km = gguf_find_kv(gf, "tokenizer.ggml.merges");
    CHECK(km && km->strs, "merges present");
    if (!km || !km->strs) { tok_free(t); gguf_close(gf); return; }
    ref_merge *m = malloc(km->n * sizeof(*m));
    for (uint64_t i = 0; i < km->n; i++) m[i] = (ref_merge){ km->strs[i].data, km->strs[i].len, (int)i };
    qsort(m, km->n, sizeof(*m), cmp_merge);

    uint64_t st = 12345;
    int n_cases = test_quick() ? 60 : 300, n_ok = 0;
    for (int c = 0; c < n_cases; c++) {
        char text[256];
        size_t len = random_text(&st, text, sizeof(text));
        int32_t want[512];
        int n_want = 0;
        size_t off[256], start = 0;
        int n_pieces = tok_pretokenize("gpt-2", text, len, off, 256);
        for (int p = 0; p < n_pieces; p++) {
            /* byte-level word, one span per character */
            char w[1024];
            span sy[512];
            size_t wn = 0;
            int ns = 0;
            for (size_t i = start; i < off[p]; i++) {
                size_t l = put_utf8(ref_byte_cp((uint8_t)text[i]), w + wn);
                sy[ns++] = (span){ w + wn, l };
                wn += l;
            }
            start = off[p];
            for (;;) {  /* merge the lowest-ranked adjacent pair, leftmost first */
                int best = -1, best_rank = 0;
                for (int i = 0; i + 1 < ns; i++) {
                    int r = ref_rank(m, km->n, sy[i], sy[i + 1]);
                    if (r >= 0 && (best < 0 || r < best_rank)) { best = i; best_rank = r; }
                }
                if (best < 0) break;
                sy[best].n += sy[best + 1].n;
                memmove(&sy[best + 1], &sy[best + 2], (size_t)(ns - best - 2) * sizeof(*sy));
                ns--;
            }
            for (int i = 0; i < ns; i++) {
                char tokstr[512];
                memcpy(tokstr, sy[i].s, sy[i].n);
                tokstr[sy[i].n] = 0;
                want[n_want++] = tok_lookup(t, tokstr);
            }
        }
        int n;
        int32_t *got = encode(t, text, len, 0, &n);
        int same = got && n == n_want;
        for (int i = 0; same && i < n; i++) same = got[i] == want[i];
        CHECK(same, "gpt-2 naive BPE differs on \"%s\"", text);
        n_ok += same;
        free(got);
    }
    fprintf(stderr, "  gpt-2 BPE vs naive merge: %d/%d\n", n_ok, n_cases);
    free(m);
    tok_free(t);
    gguf_close(gf);
}

static void test_spm_naive(void)
{
    gguf_file *gf;
    tokenizer *t = load_vocab("golden/llamacpp/tokenizer/ggml-vocab-llama-spm.gguf", &gf);
    if (!t) { test_skip("llama-spm vocab not found"); return; }
    const gguf_kv *ks = gguf_find_kv(gf, "tokenizer.ggml.scores");
    CHECK(ks != NULL, "scores present");
    if (!ks) { tok_free(t); gguf_close(gf); return; }

    uint64_t st = 777;
    int n_cases = test_quick() ? 60 : 300, n_ok = 0;
    for (int c = 0; c < n_cases; c++) {
        char text[256], esc[1024];
        size_t len = random_text(&st, text, sizeof(text)), en = 0;
        /* "▁" for every space, and one in front */
        memcpy(esc, "\xe2\x96\x81", 3);
        en = 3;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') { memcpy(esc + en, "\xe2\x96\x81", 3); en += 3; }
            else esc[en++] = text[i];
        }
        span sy[1024];
        int ns = 0;
        for (size_t i = 0; i < en; ) {   /* one span per UTF-8 character */
            uint8_t b = (uint8_t)esc[i];
            size_t l = b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
            sy[ns++] = (span){ esc + i, l };
            i += l;
        }
        for (;;) {  /* merge the best-scoring adjacent pair, leftmost first */
            int best = -1;
            double best_score = 0;
            for (int i = 0; i + 1 < ns; i++) {
                char cat[512];
                memcpy(cat, sy[i].s, sy[i].n + sy[i + 1].n);
                cat[sy[i].n + sy[i + 1].n] = 0;
                int id = tok_lookup(t, cat);
                if (id < 0) continue;
                double sc = gguf_arr_float(ks, (uint64_t)id);
                if (best < 0 || sc > best_score) { best = i; best_score = sc; }
            }
            if (best < 0) break;
            sy[best].n += sy[best + 1].n;
            memmove(&sy[best + 1], &sy[best + 2], (size_t)(ns - best - 2) * sizeof(*sy));
            ns--;
        }
        int32_t want[1024];
        int n_want = 0;
        for (int i = 0; i < ns; i++) {
            char piece[512];
            memcpy(piece, sy[i].s, sy[i].n);
            piece[sy[i].n] = 0;
            int id = tok_lookup(t, piece);
            if (id >= 0) { want[n_want++] = id; continue; }
            for (size_t k = 0; k < sy[i].n; k++) {   /* byte fallback */
                char hex[8];
                snprintf(hex, sizeof(hex), "<0x%02X>", (uint8_t)sy[i].s[k]);
                want[n_want++] = tok_lookup(t, hex);
            }
        }
        int n;
        int32_t *got = encode(t, text, len, 0, &n);
        int same = got && n == n_want;
        for (int i = 0; same && i < n; i++) same = got[i] == want[i];
        CHECK(same, "llama-spm naive SPM differs on \"%s\"", text);
        n_ok += same;
        free(got);
    }
    fprintf(stderr, "  llama-spm SPM vs naive merge: %d/%d\n", n_ok, n_cases);
    tok_free(t);
    gguf_close(gf);
}

/* ------------------------------------------------------------------ */
/* 5. hand-made vocabularies, built as GGUF bytes in memory             */

typedef struct gbuf { uint8_t *b; size_t n, cap; uint64_t n_kv; } gbuf;

static void gb_put(gbuf *g, const void *p, size_t n)
{
    if (g->n + n > g->cap) {
        while (g->n + n > g->cap) g->cap = g->cap ? 2 * g->cap : 256;
        g->b = realloc(g->b, g->cap);
    }
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void gb_u32(gbuf *g, uint32_t v) { gb_put(g, &v, 4); }
static void gb_u64(gbuf *g, uint64_t v) { gb_put(g, &v, 8); }
static void gb_str(gbuf *g, const char *s, size_t n) { gb_u64(g, n); gb_put(g, s, n); }
static void gb_key(gbuf *g, const char *k, uint32_t type) { gb_str(g, k, strlen(k)); gb_u32(g, type); g->n_kv++; }
static void kv_str(gbuf *g, const char *k, const char *v) { gb_key(g, k, GGUF_STR); gb_str(g, v, strlen(v)); }
static void kv_u32(gbuf *g, const char *k, uint32_t v) { gb_key(g, k, GGUF_U32); gb_u32(g, v); }
static void kv_bool(gbuf *g, const char *k, int v) { uint8_t b = (uint8_t)v; gb_key(g, k, GGUF_BOOL); gb_put(g, &b, 1); }
static void kv_strs(gbuf *g, const char *k, const char *const *v, size_t n)
{
    gb_key(g, k, GGUF_ARR);
    gb_u32(g, GGUF_STR);
    gb_u64(g, n);
    for (size_t i = 0; i < n; i++) gb_str(g, v[i], strlen(v[i]));
}
static void kv_f32s(gbuf *g, const char *k, const float *v, size_t n)
{
    gb_key(g, k, GGUF_ARR);
    gb_u32(g, GGUF_F32);
    gb_u64(g, n);
    gb_put(g, v, n * 4);
}
static void kv_i32s(gbuf *g, const char *k, const int32_t *v, size_t n)
{
    gb_key(g, k, GGUF_ARR);
    gb_u32(g, GGUF_I32);
    gb_u64(g, n);
    gb_put(g, v, n * 4);
}

/* Wraps the kvs in a GGUF v3 header; parses it and builds a tokenizer.
 * Returns 0 and *t, or -1 with err (the gguf image is freed either way;
 * the tokenizer copies what it needs). */
static int gb_tokenizer(gbuf *g, tokenizer **t, char *err, size_t err_size)
{
    gbuf file = { 0 };
    gb_u32(&file, 0x46554747u);
    gb_u32(&file, 3);
    gb_u64(&file, 0);
    gb_u64(&file, g->n_kv);
    gb_put(&file, g->b, g->n);
    free(g->b);
    memset(g, 0, sizeof(*g));
    gguf_file *f = NULL;
    *t = NULL;
    int rc = gguf_parse(file.b, file.n, &f, err, err_size);
    if (rc == 0) rc = tok_create_from_gguf(f, t, err, err_size);
    gguf_close(f);
    free(file.b);
    return rc;
}

#define SPM_N 19
static const char *const SPM_TOKENS[SPM_N] = {
    "<unk>", "<s>", "</s>", "<0x0A>", "<0xC3>", "<0xA9>", "\xe2\x96\x81", "a", "b", "ab",
    "\xe2\x96\x81" "a", "\xe2\x96\x81" "ab", "ba", "<|user|>", "aa", "\xff\xfe", "<0xZZ>", "c", "",
};
static const float SPM_SCORES[SPM_N] = {
    0, 0, 0, 0, 0, 0, -1, -2, -2, -1, -1.5f, -0.5f, -0.1f, 0, -1, -5, 0, -3, -9,
};
static const int32_t SPM_TYPES[SPM_N] = { 2, 3, 3, 6, 6, 6, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 6, 5, 1 };

static void spm_kvs(gbuf *g, size_t n_scores, size_t n_types)
{
    kv_str(g, "tokenizer.ggml.model", "llama");
    kv_strs(g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    kv_f32s(g, "tokenizer.ggml.scores", SPM_SCORES, n_scores);
    kv_i32s(g, "tokenizer.ggml.token_type", SPM_TYPES, n_types);
}

static void expect_ids(const tokenizer *t, const char *text, size_t len, int add_special,
                       const int32_t *want, int n_want, const char *what)
{
    int n;
    int32_t *got = encode(t, text, len, add_special, &n);
    int same = got && n == n_want;
    for (int i = 0; same && i < n; i++) same = got[i] == want[i];
    char g[256] = "";
    size_t o = 0;
    for (int i = 0; got && i < n && o + 12 < sizeof(g); i++) o += (size_t)snprintf(g + o, sizeof(g) - o, " %d", got[i]);
    CHECK(same, "%s: got [%s ] (%d ids, want %d)", what, g, n, n_want);
    free(got);
}

static void expect_piece(const tokenizer *t, int32_t id, const char *want, size_t want_len)
{
    char buf[64];
    int n = tok_decode(t, id, buf, sizeof(buf));
    CHECK(n == (int)want_len && memcmp(buf, want, want_len) == 0, "decode(%d): %d bytes, want %zu", id, n, want_len);
}

static void test_hand_spm(void)
{
    char err[256];
    gbuf g = { 0 };
    spm_kvs(&g, SPM_N, SPM_N);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 0xFFFFFFFFu);   /* "not set": default 1 */
    tokenizer *t;
    if (gb_tokenizer(&g, &t, err, sizeof(err))) { CHECK(0, "hand SPM vocab: %s", err); return; }
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 2, "defaults bos %d eos %d", tok_bos(t), tok_eos(t));
    CHECK(strcmp(tok_text(t, 18), "[EMPTY_18]") == 0, "empty token renamed: %s", tok_text(t, 18));

    /* "▁ab": ab (-1) beats ▁a (-1.5), then ▁ab (-0.5) */
    expect_ids(t, "ab", 2, 0, (const int32_t[]){ 11 }, 1, "spm ab");
    expect_ids(t, "ab", 2, 1, (const int32_t[]){ 1, 11 }, 2, "spm ab with BOS");
    /* "▁bab": ba (-0.1) first, then nothing merges further */
    expect_ids(t, "bab", 3, 0, (const int32_t[]){ 6, 12, 8 }, 3, "spm bab");
    /* "▁aaa": the two "aa" tie; the leftmost merges first, which kills ▁a */
    expect_ids(t, "aaa", 3, 0, (const int32_t[]){ 6, 14, 7 }, 3, "spm aaa (leftmost tie)");
    /* spaces become ▁ */
    expect_ids(t, "a b", 3, 0, (const int32_t[]){ 10, 6, 8 }, 3, "spm a b");
    /* byte fallback: é = C3 A9, \n = <0x0A>; no token and no byte token -> <unk> */
    expect_ids(t, "\xc3\xa9\n", 3, 0, (const int32_t[]){ 6, 4, 5, 3 }, 4, "spm byte fallback");
    expect_ids(t, "z", 1, 0, (const int32_t[]){ 6, 0 }, 2, "spm unknown -> unk");
    /* user-defined tokens are split out of plain text; the text after one
     * gets the space prefix again; control tokens stay text */
    expect_ids(t, "a<|user|> b", 11, 0, (const int32_t[]){ 10, 13, 6, 6, 8 }, 5, "spm user-defined");
    expect_ids(t, "<s>", 3, 0, (const int32_t[]){ 6, 0, 0, 0 }, 4, "spm <s> is not parsed");
    /* invalid UTF-8 in vocab and text: split by lead byte, still matched */
    expect_ids(t, "\xff\xfe", 2, 0, (const int32_t[]){ 6, 15 }, 2, "spm invalid utf-8 token");
    expect_ids(t, "", 0, 0, NULL, 0, "spm empty");
    expect_ids(t, "", 0, 1, (const int32_t[]){ 1 }, 1, "spm empty with BOS");

    expect_piece(t, 11, " ab", 3);
    expect_piece(t, 3, "\n", 1);
    expect_piece(t, 4, "\xc3", 1);
    expect_piece(t, 1, "", 0);          /* control */
    expect_piece(t, 0, "", 0);          /* unknown */
    expect_piece(t, 13, "<|user|>", 8); /* user-defined: as written */
    expect_piece(t, 17, "", 0);         /* unused */
    expect_piece(t, 15, "\xff\xfe", 2);
    CHECK(tok_decode(t, SPM_N, NULL, 0) == -1 && tok_decode(t, -1, NULL, 0) == -1, "bad ids");
    char small[2];
    CHECK(tok_decode(t, 11, small, 2) == 3 && small[0] == ' ' && small[1] == 'a', "truncated decode");
    CHECK(tok_lookup(t, "ab") == 9 && tok_lookup(t, "zz") == -1, "lookup");
    CHECK(tok_is_eog(t, 2) && !tok_is_eog(t, 1), "eog");
    int32_t few[1];
    CHECK(tok_encode(t, "a b", 3, 0, few, 1) == 3 && few[0] == 10, "short output buffer");
    tok_free(t);

    /* add_space_prefix = false, add_eos = true */
    spm_kvs(&g, SPM_N, SPM_N);
    kv_bool(&g, "tokenizer.ggml.add_space_prefix", 0);
    kv_bool(&g, "tokenizer.ggml.add_eos_token", 1);
    if (gb_tokenizer(&g, &t, err, sizeof(err))) { CHECK(0, "hand SPM vocab 2: %s", err); return; }
    expect_ids(t, "ab", 2, 1, (const int32_t[]){ 1, 9, 2 }, 3, "spm no prefix, BOS+EOS");
    tok_free(t);
}

static void test_hand_bpe(void)
{
    /* byte-level: "Ġ" = U+0120 stands for a space, "Ċ" = U+010A for \n */
    static const char *const toks[] = {
        "a", "b", "c", "\xc4\xa0", "ab", "abc", "\xc4\xa0" "a", "\xc4\xa0" "ab", "\xc4\x8a", "<|endoftext|>", "\xc3\xb8",
    };
    static const char *const merges[] = { "a b", "\xc4\xa0 a", "ab c", "\xc4\xa0" "a b" };
    static const int32_t types[] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 4 };
    char err[256];
    gbuf g = { 0 };
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "gpt-2");
    kv_strs(&g, "tokenizer.ggml.tokens", toks, 11);
    kv_i32s(&g, "tokenizer.ggml.token_type", types, 11);
    kv_strs(&g, "tokenizer.ggml.merges", merges, 4);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 9);
    kv_u32(&g, "tokenizer.ggml.eos_token_id", 9);
    tokenizer *t;
    if (gb_tokenizer(&g, &t, err, sizeof(err))) { CHECK(0, "hand BPE vocab: %s", err); return; }
    /* "abc" merges a+b (rank 0) then ab+c (rank 2); " ab": a+b (rank 0)
     * beats Ġ+a (rank 1), and "Ġ ab" is no merge */
    expect_ids(t, "abc ab", 6, 0, (const int32_t[]){ 5, 3, 4 }, 3, "bpe ranks");
    /* unknown characters are dropped (llama.cpp behaviour); \n is Ċ */
    expect_ids(t, "a\nx", 3, 0, (const int32_t[]){ 0, 8 }, 2, "bpe newline, drop unknown");
    /* control tokens are text; user-defined ø is split out */
    expect_ids(t, "b\xc3\xb8" "c", 4, 0, (const int32_t[]){ 1, 10, 2 }, 3, "bpe user-defined");
    /* no add_bos_token key: gpt-2 adds nothing */
    expect_ids(t, "a", 1, 1, (const int32_t[]){ 0 }, 1, "bpe no BOS by default");
    expect_piece(t, 7, " ab", 3);
    expect_piece(t, 8, "\n", 1);
    expect_piece(t, 9, "", 0);
    expect_piece(t, 10, "\xc3\xb8", 2);
    CHECK(tok_is_eog(t, 9), "<|endoftext|> ends generation");
    tok_free(t);
}

/* Rules checked on the real vocabularies, each derived from llama.cpp's
 * documented behaviour rather than recorded ids. */
static int contains_id(const int32_t *ids, int n, int32_t id)
{
    for (int i = 0; i < n; i++) if (ids[i] == id) return 1;
    return 0;
}

static void test_special_rules(void)
{
    gguf_file *gf;
    tokenizer *t = load_vocab("golden/llamacpp/tokenizer/ggml-vocab-deepseek-coder.gguf", &gf);
    if (t) {
        /* user-defined tokens (ø, <|EOT|>) are split out of plain text; the
         * FIM tokens are user-defined in the file but llama.cpp makes them
         * control tokens by name, and control tokens stay plain text */
        const char *s = "s\xc3\xb8ren <|EOT|> <\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>";
        int n;
        int32_t *ids = encode(t, s, strlen(s), 0, &n);
        int32_t oe = tok_lookup(t, "\xc3\xb8"), eot = tok_lookup(t, "<|EOT|>");
        int32_t fim = tok_lookup(t, "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>");
        CHECK(oe >= 0 && eot >= 0 && fim >= 0, "deepseek-coder specials present");
        CHECK(ids && contains_id(ids, n, oe) && contains_id(ids, n, eot) && !contains_id(ids, n, fim),
              "deepseek-coder special splitting");
        char buf[64];
        CHECK(tok_decode(t, fim, buf, sizeof(buf)) == 0, "FIM token prints nothing");
        CHECK(tok_decode(t, eot, buf, sizeof(buf)) == 7 && memcmp(buf, "<|EOT|>", 7) == 0, "<|EOT|> prints as text");
        free(ids);
        /* add_bos_token = true in this file */
        ids = encode(t, "x", 1, 1, &n);
        CHECK(ids && n == 2 && ids[0] == tok_bos(t), "deepseek-coder BOS");
        free(ids);
        tok_free(t);
        gguf_close(gf);
    } else {
        test_skip("deepseek-coder vocab");
    }

    t = load_vocab("golden/llamacpp/tokenizer/ggml-vocab-phi-3.gguf", &gf);
    if (t) {
        /* "</s>" is user-defined in Phi-3's file, but its name makes it an
         * end-of-generation control token: not parsed, not printed */
        int32_t s_id = tok_lookup(t, "</s>"), end = tok_lookup(t, "<|end|>");
        int n;
        int32_t *ids = encode(t, "a</s>", 5, 0, &n);
        CHECK(ids && !contains_id(ids, n, s_id), "phi-3 </s> stays text");
        CHECK(tok_is_eog(t, s_id) && tok_is_eog(t, end) && tok_is_eog(t, tok_eos(t)), "phi-3 EOG set");
        CHECK(!tok_is_eog(t, tok_lookup(t, "<|user|>")), "<|user|> is not EOG");
        CHECK(tok_decode(t, s_id, NULL, 0) == 0, "phi-3 </s> prints nothing");
        free(ids);
        tok_free(t);
        gguf_close(gf);
    } else {
        test_skip("phi-3 vocab");
    }
}

/* The gpt-2 vocabulary with another tokenizer.ggml.pre: checks that each
 * pipeline is wired into tok_encode (the splits themselves are tested in
 * test_pretokenize). */
static tokenizer *gpt2_with_pre(const gguf_file *src, const char *pre)
{
    gbuf g = { 0 };
    const gguf_kv *tk = gguf_find_kv(src, "tokenizer.ggml.tokens");
    const gguf_kv *mk = gguf_find_kv(src, "tokenizer.ggml.merges");
    if (!tk || !mk || !tk->strs || !mk->strs) return NULL;
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", pre);
    const gguf_kv *kvs[2] = { tk, mk };
    for (int k = 0; k < 2; k++) {
        gb_key(&g, k ? "tokenizer.ggml.merges" : "tokenizer.ggml.tokens", GGUF_ARR);
        gb_u32(&g, GGUF_STR);
        gb_u64(&g, kvs[k]->n);
        for (uint64_t i = 0; i < kvs[k]->n; i++) gb_str(&g, kvs[k]->strs[i].data, kvs[k]->strs[i].len);
    }
    kv_u32(&g, "tokenizer.ggml.bos_token_id", 50256);
    tokenizer *t;
    char err[256];
    if (gb_tokenizer(&g, &t, err, sizeof(err))) { CHECK(0, "gpt-2 vocab with pre %s: %s", pre, err); return NULL; }
    return t;
}

static void test_pre_variants(void)
{
    gguf_file *gf;
    tokenizer *base = load_vocab("golden/llamacpp/tokenizer/ggml-vocab-gpt-2.gguf", &gf);
    if (!base) { test_skip("gpt-2 vocab"); return; }
    int32_t d[10], i123 = tok_lookup(base, "123"), i45 = tok_lookup(base, "45");
    char c[2] = "0";
    for (int i = 0; i < 10; i++) { c[0] = (char)('0' + i); d[i] = tok_lookup(base, c); }
    int32_t sp = tok_lookup(base, "\xc4\xa0");  /* "Ġ", a lone space */
    struct { const char *pre; int n; int32_t want[8]; } cases[] = {
        { "gpt-2",     0, { 0 } },   /* checked by round trip below */
        { "llama-bpe", 3, { sp, i123, i45 } },
        { "qwen2",     6, { sp, d[1], d[2], d[3], d[4], d[5] } },
        { "starcoder", 6, { sp, d[1], d[2], d[3], d[4], d[5] } },
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        tokenizer *t = gpt2_with_pre(gf, cases[k].pre);
        if (!t) continue;
        if (strcmp(cases[k].pre, "gpt-2") == 0) {
            /* " 12345" is one GPT-2 word; whatever BPE makes of it, it must
             * decode back and start with no lone space token */
            int n;
            int32_t *ids = encode(t, " 12345", 6, 0, &n);
            size_t dl;
            char *dec = ids ? decode_all(t, ids, n, &dl) : NULL;
            CHECK(dec && dl == 6 && memcmp(dec, " 12345", 6) == 0 && ids[0] != sp, "gpt-2 wiring");
            free(dec);
            free(ids);
        } else {
            expect_ids(t, " 12345", 6, 0, cases[k].want, cases[k].n, cases[k].pre);
        }
        /* llama3 family adds BOS by default; the others do not */
        int n;
        int32_t *ids = encode(t, "a", 1, 1, &n);
        int want_bos = strcmp(cases[k].pre, "llama-bpe") == 0;
        CHECK(ids && n == 1 + want_bos && (!want_bos || ids[0] == 50256), "%s BOS default", cases[k].pre);
        free(ids);
        tok_free(t);
    }
    tok_free(base);
    gguf_close(gf);
}

/* Each mutation of a valid SPM vocabulary must be rejected with a message. */
static void test_malformed(void)
{
    char err[256];
    tokenizer *t;
    gbuf g = { 0 };
    struct { const char *what; int rc; } r[16];
    int n = 0;

    spm_kvs(&g, SPM_N - 1, SPM_N);
    r[n].what = "scores shorter than tokens"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    spm_kvs(&g, SPM_N, SPM_N - 1);
    r[n].what = "token types shorter than tokens"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    spm_kvs(&g, SPM_N, SPM_N);
    kv_u32(&g, "tokenizer.ggml.bos_token_id", SPM_N);
    r[n].what = "bos id out of range"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    spm_kvs(&g, SPM_N, SPM_N);
    kv_u32(&g, "tokenizer.ggml.unknown_token_id", 1000000);
    r[n].what = "unk id out of range"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    spm_kvs(&g, SPM_N, SPM_N);
    kv_u32(&g, "tokenizer.ggml.add_bos_token", 1);
    r[n].what = "add_bos_token not a bool"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    spm_kvs(&g, SPM_N, SPM_N);
    kv_str(&g, "tokenizer.ggml.eos_token_id", "2");
    r[n].what = "eos id is a string"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_f32s(&g, "tokenizer.ggml.tokens", SPM_SCORES, SPM_N);
    r[n].what = "tokens not strings"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_str(&g, "tokenizer.ggml.model", "llama");
    r[n].what = "no tokens"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, 0);
    r[n].what = "zero tokens"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_str(&g, "tokenizer.ggml.model", "t5x");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    r[n].what = "unknown model"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    r[n].what = "no model"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    r[n].what = "gpt2 without merges"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "no-such-regex");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    kv_strs(&g, "tokenizer.ggml.merges", SPM_TOKENS, 2);
    r[n].what = "unknown pre-tokenizer"; r[n++].rc = gb_tokenizer(&g, &t, err, sizeof(err));
    for (int i = 0; i < n; i++) CHECK(r[i].rc == -1, "malformed vocab accepted: %s", r[i].what);
    CHECK(err[0] != 0, "error message set");

    /* and a float token_type array alone is a type error, not a crash */
    kv_str(&g, "tokenizer.ggml.model", "llama");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    kv_f32s(&g, "tokenizer.ggml.token_type", SPM_SCORES, SPM_N);
    CHECK(gb_tokenizer(&g, &t, err, sizeof(err)) == -1 && strstr(err, "token_type"),
          "float token_type rejected: %s", err);

    /* names from the file are quoted with their control bytes escaped */
    kv_str(&g, "tokenizer.ggml.model", "t5\r\x1b]0;x\x07");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    CHECK(gb_tokenizer(&g, &t, err, sizeof(err)) == -1 && strstr(err, "'t5\\x0d\\x1b]0;x\\x07'"),
          "unknown model quoted escaped: %s", err);
    kv_str(&g, "tokenizer.ggml.model", "gpt2");
    kv_str(&g, "tokenizer.ggml.pre", "qwen\n2");
    kv_strs(&g, "tokenizer.ggml.tokens", SPM_TOKENS, SPM_N);
    kv_strs(&g, "tokenizer.ggml.merges", SPM_TOKENS, 2);
    CHECK(gb_tokenizer(&g, &t, err, sizeof(err)) == -1 && strstr(err, "'qwen\\x0a2'") && !strchr(err, '\n'),
          "unknown pre-tokenizer quoted escaped: %s", err);
    tok_free(NULL);
}

/* ------------------------------------------------------------------ */

int main(void)
{
    test_pretokenize();
    test_golden();
    test_stories_prompts();
    test_bpe_naive();
    test_spm_naive();
    test_hand_spm();
    test_hand_bpe();
    test_special_rules();
    test_pre_variants();
    test_malformed();
    return test_summary("test_tokenizer");
}
