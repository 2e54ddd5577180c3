/* tok_pretok.c - BPE pre-tokenizers written by hand (no regex engine).
 *
 * Map of this file:
 *   1. UTF-8 and category lookups (llama.cpp-compatible decoding)
 *   2. matchers: one function per regex; m(t, s, p, e) returns the length
 *      of the match starting exactly at codepoint p inside the piece [s, e),
 *      or 0 when the regex does not match there
 *   3. pipelines: tokenizer.ggml.pre name -> list of matchers
 *   4. the driver (pt_split) and the public tok_pretokenize
 *
 * Every regex a pipeline uses is quoted above its matcher. The driver scans
 * each piece left to right, cuts out every match and keeps the text between
 * matches as pieces too, which is regex find-all with "Isolated" behaviour.
 * Because each matcher implements the leftmost-alternative semantics of its
 * regex at a fixed start, the result equals a backtracking regex engine's.
 *
 * Two details come from how llama.cpp runs these regexes, and matter for
 * exact token ids:
 *   - invalid UTF-8 bytes become U+FFFD, one per byte;
 *   - regexes without \p{..} run on std::wregex, where non-ASCII whitespace
 *     was first replaced by U+000B; so e.g. U+3000 (ideographic space) is \s
 *     but no longer inside a literal range like [　-。]. wre_cp() mirrors it.
 */
#include "core/tok_internal.h"
#include "core/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ */
/* 1. UTF-8 and categories                                              */

uint16_t ucd_flags(uint32_t cp)
{
    if (cp > 0x10FFFF) return UCF_UNDEFINED;
    int lo = 0, hi = ucd_n_ranges - 1;       /* last range with start <= cp */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (ucd_ranges[mid].start <= cp) lo = mid; else hi = mid - 1;
    }
    return ucd_ranges[lo].flags;
}

size_t tok_utf8_len(uint8_t lead)
{
    static const uint8_t len_by_nibble[16] = { 1,1,1,1,1,1,1,1, 1,1,1,1, 2,2, 3, 4 };
    return len_by_nibble[lead >> 4];
}

uint32_t tok_utf8_decode(const uint8_t *s, size_t n, size_t *adv)
{
    uint8_t b = s[0];
    size_t need;
    uint32_t cp;
    if (b < 0x80) { *adv = 1; return b; }
    if (b < 0xC0)      { *adv = 1; return 0xFFFD; }     /* stray continuation */
    else if (b < 0xE0) { need = 1; cp = b & 0x1F; }
    else if (b < 0xF0) { need = 2; cp = b & 0x0F; }
    else if (b < 0xF8) { need = 3; cp = b & 0x07; }
    else               { *adv = 1; return 0xFFFD; }
    if (need >= n) { *adv = 1; return 0xFFFD; }        /* truncated */
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) { *adv = 1; return 0xFFFD; }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    /* llama.cpp would throw on F5..F7 leads later; we keep going instead */
    if (cp > 0x10FFFF) { *adv = 1; return 0xFFFD; }
    *adv = need + 1;
    return cp;
}

/* ------------------------------------------------------------------ */
/* 2. matchers                                                          */

#define NO_CP 0xFFFFFFFFu

typedef size_t (*pt_match_fn)(const pt_text *t, size_t s, size_t p, size_t e);

/* Flags / codepoint at i, or 0 / NO_CP outside the piece (so lookahead
 * stops at piece boundaries, as a regex run on the piece alone would). */
static inline uint16_t FL(const pt_text *t, size_t i, size_t e) { return i < e ? t->flags[i] : 0; }
static inline uint32_t CP(const pt_text *t, size_t i, size_t e) { return i < e ? t->cps[i] : NO_CP; }

#define IS_L(f)  ((f) & UCF_LETTER)
#define IS_N(f)  ((f) & UCF_NUMBER)
#define IS_WS(f) ((f) & UCF_WHITESPACE)
#define IS_P(f)  ((f) & UCF_PUNCT)
/* [^\s\p{L}\p{N}] for a position inside the piece */
#define IS_OTHER(f) ((f) && !((f) & (UCF_WHITESPACE | UCF_LETTER | UCF_NUMBER)))

/* Codepoint as std::wregex saw it (see the file comment). */
static inline uint32_t wre_cp(const pt_text *t, size_t i)
{
    uint32_t c = t->cps[i];
    return (c > 0x7F && IS_WS(t->flags[i])) ? 0x0B : c;
}

typedef struct cp_range { uint32_t lo, hi; } cp_range;

static int in_ranges(uint32_t c, const cp_range *r, size_t n)
{
    size_t lo = 0, hi = n;                   /* first range with hi >= c */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (r[mid].hi < c) lo = mid + 1; else hi = mid;
    }
    return lo < n && r[lo].lo <= c;
}

/* 's|'t|'re|'ve|'m|'ll|'d, optionally ASCII-case-insensitive: 0, 2 or 3. */
static size_t contraction(const pt_text *t, size_t p, size_t e, int icase)
{
    if (t->cps[p] != '\'' || p + 1 >= e) return 0;
    uint32_t a = t->cps[p + 1], b = p + 2 < e ? t->cps[p + 2] : NO_CP;
    if (icase) {
        if (a >= 'A' && a <= 'Z') a += 32;
        if (b >= 'A' && b <= 'Z') b += 32;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t m_gpt2(const pt_text *t, size_t s, size_t p, size_t e)
{
    (void)s;
    size_t n = contraction(t, p, e, 0);
    if (n) return n;
    size_t q = p + (t->cps[p] == ' ');      /* the optional leading space */
    uint16_t f = FL(t, q, e);
    if (IS_L(f)) { while (IS_L(FL(t, q, e))) q++; return q - p; }
    if (IS_N(f)) { while (IS_N(FL(t, q, e))) q++; return q - p; }
    if (IS_OTHER(f)) { while (IS_OTHER(FL(t, q, e))) q++; return q - p; }
    size_t k = 0;
    while (IS_WS(FL(t, p + k, e))) k++;
    if (k > 1 && p + k < e) return k - 1;   /* \s+(?!\S): leave one for the word */
    return k ? k : 1;
}

/* Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (Qwen2 has \p{N} in place of \p{N}{1,3}.) */
static size_t llama3_like(const pt_text *t, size_t p, size_t e, size_t max_digits)
{
    size_t n = contraction(t, p, e, 1);
    if (n) return n;
    uint32_t c = t->cps[p];
    uint16_t f = t->flags[p];
    if (!(c == '\r' || c == '\n' || IS_N(f)) && (IS_L(f) || IS_L(FL(t, p + 1, e)))) {
        size_t q = p + 1;                   /* one prefix char or the first letter */
        while (IS_L(FL(t, q, e))) q++;
        return q - p;
    }
    if (IS_N(f)) {
        size_t q = p;
        while (q - p < max_digits && IS_N(FL(t, q, e))) q++;
        return q - p;
    }
    uint16_t f2 = c == ' ' ? FL(t, p + 1, e) : f;
    if (!(f2 & (UCF_WHITESPACE | UCF_LETTER | UCF_NUMBER))) {
        size_t q = p + (c == ' ');
        while (IS_OTHER(FL(t, q, e))) q++;
        while (CP(t, q, e) == '\r' || CP(t, q, e) == '\n') q++;
        return q - p;
    }
    size_t k = 0, last_nl = 0;
    while (IS_WS(FL(t, p + k, e))) {
        if (t->cps[p + k] == '\r' || t->cps[p + k] == '\n') last_nl = k + 1;
        k++;
    }
    if (last_nl) return last_nl;            /* \s*[\r\n]+ */
    if (k > 1 && p + k < e) return k - 1;   /* \s+(?!\S) */
    return k ? k : 1;                       /* \s+ */
}

static size_t m_llama3(const pt_text *t, size_t s, size_t p, size_t e) { (void)s; return llama3_like(t, p, e, 3); }
static size_t m_qwen2(const pt_text *t, size_t s, size_t p, size_t e)  { (void)s; return llama3_like(t, p, e, 1); }

/* \p{N} */
static size_t m_num1(const pt_text *t, size_t s, size_t p, size_t e)
{
    (void)s; (void)e;
    return IS_N(t->flags[p]) ? 1 : 0;
}

/* \p{N}+ */
static size_t m_num_run(const pt_text *t, size_t s, size_t p, size_t e)
{
    (void)s;
    size_t q = p;
    while (IS_N(FL(t, q, e))) q++;
    return q - p;
}

/* [0-9][0-9][0-9] */
static size_t m_digits3(const pt_text *t, size_t s, size_t p, size_t e)
{
    (void)s;
    if (p + 3 > e) return 0;
    for (size_t i = p; i < p + 3; i++)
        if (t->cps[i] < '0' || t->cps[i] > '9') return 0;
    return 3;
}

/* [\p{P}\$\+<=>\^~\|]+ (default) and [\p{P}\$\+<=>\^~\|`]+ (falcon) */
static size_t punct_run(const pt_text *t, size_t p, size_t e, const char *extra)
{
    size_t q = p;
    while (q < e) {
        uint32_t c = t->cps[q];
        if (!IS_P(t->flags[q]) && !(c < 0x80 && c != 0 && strchr(extra, (int)c))) break;
        q++;
    }
    return q - p;
}
static size_t m_punct_default(const pt_text *t, size_t s, size_t p, size_t e) { (void)s; return punct_run(t, p, e, "$+<=>^~|"); }
static size_t m_punct_falcon(const pt_text *t, size_t s, size_t p, size_t e)  { (void)s; return punct_run(t, p, e, "$+<=>^~|`"); }

/* [\r\n] */
static size_t m_crlf(const pt_text *t, size_t s, size_t p, size_t e)
{
    (void)s; (void)e;
    return (t->cps[p] == '\r' || t->cps[p] == '\n') ? 1 : 0;
}

/* \s?\p{L}+ and \s?\p{P}+ : the class must start right after the optional
 * space (backtracking the \s? cannot help, a space is not in the class). */
static size_t ws_opt_run(const pt_text *t, size_t p, size_t e, uint16_t cls)
{
    size_t q = p + (IS_WS(t->flags[p]) ? 1 : 0);
    if (!(FL(t, q, e) & cls)) return 0;
    while (FL(t, q, e) & cls) q++;
    return q - p;
}
static size_t m_ws_letters(const pt_text *t, size_t s, size_t p, size_t e) { (void)s; return ws_opt_run(t, p, e, UCF_LETTER); }
static size_t m_ws_punct(const pt_text *t, size_t s, size_t p, size_t e)   { (void)s; return ws_opt_run(t, p, e, UCF_PUNCT); }

/* [一-龥ࠀ-一가-퟿]+  (U+4E00-9FA5, U+0800-4E00, U+AC00-D7FF) */
static const cp_range CJK[] = { {0x0800, 0x9FA5}, {0xAC00, 0xD7FF} };

/* deepseek-llm's cased-letter class [A-Za-zµÀ-ÖØ-öø-ƺ...𞤀-𞥃] */
static const cp_range DS_LETTERS[] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00B5, 0x00B5}, {0x00C0, 0x00D6},
    {0x00D8, 0x00F6}, {0x00F8, 0x01BA}, {0x01BC, 0x01BF}, {0x01C4, 0x0293},
    {0x0295, 0x02AF}, {0x0370, 0x0373}, {0x0376, 0x0377}, {0x037B, 0x037D},
    {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A}, {0x038C, 0x038C},
    {0x038E, 0x03A1}, {0x03A3, 0x03F5}, {0x03F7, 0x0481}, {0x048A, 0x052F},
    {0x0531, 0x0556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC},
    {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115},
    {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D},
    {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E},
    {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

/* deepseek-llm's [!-/:-~！-／：-～‘-‟　-。] */
static const cp_range DS_PUNCT[] = {
    {0x0021, 0x002F}, {0x003A, 0x007E}, {0x2018, 0x201F}, {0x3000, 0x3002},
    {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static size_t range_run(const pt_text *t, size_t q, size_t e, const cp_range *r, size_t nr)
{
    size_t start = q;
    while (q < e && in_ranges(wre_cp(t, q), r, nr)) q++;
    return q - start;
}

static size_t m_cjk(const pt_text *t, size_t s, size_t p, size_t e)
{
    (void)s;
    return range_run(t, p, e, CJK, N_OF(CJK));
}

/* \s?[class]+ on the wregex view */
static size_t ws_opt_ranges(const pt_text *t, size_t p, size_t e, const cp_range *r, size_t nr)
{
    size_t q = p + (IS_WS(t->flags[p]) ? 1 : 0);
    size_t n = range_run(t, q, e, r, nr);
    return n ? (q - p) + n : 0;
}
static size_t m_ds_letters(const pt_text *t, size_t s, size_t p, size_t e) { (void)s; return ws_opt_ranges(t, p, e, DS_LETTERS, N_OF(DS_LETTERS)); }
static size_t m_ds_punct(const pt_text *t, size_t s, size_t p, size_t e)   { (void)s; return ws_opt_ranges(t, p, e, DS_PUNCT, N_OF(DS_PUNCT)); }

/* \s+$ : the whitespace run that ends the piece. A start inside a longer run
 * was already tried one position earlier, so only run starts are scanned
 * (keeps long runs linear). */
static size_t m_ws_end(const pt_text *t, size_t s, size_t p, size_t e)
{
    if (!IS_WS(t->flags[p]) || (p > s && IS_WS(t->flags[p - 1]))) return 0;
    size_t q = p;
    while (q < e && IS_WS(t->flags[q])) q++;
    return q == e ? e - p : 0;
}

/* ------------------------------------------------------------------ */
/* 3. pipelines (regex lists as llama.cpp applies them per pre type)     */

#define PT_MAX_STEPS 6

struct pt_def {
    pt_match_fn steps[PT_MAX_STEPS];
    int ignore_merges;   /* llama3 family: a word that is a token skips BPE */
    int add_bos;         /* default for add_bos before tokenizer.ggml.add_bos_token */
    int drop_bos;        /* default BOS id is none */
};

enum { PT_DEFAULT, PT_GPT2, PT_LLAMA3, PT_LLAMA3_PLAIN, PT_LLAMA3_NOBOS, PT_QWEN2,
       PT_DEEPSEEK_LLM, PT_DEEPSEEK_CODER, PT_FALCON, PT_STARCODER };

static const pt_def PT_DEFS[] = {
    [PT_DEFAULT]        = { { m_punct_default, m_gpt2, m_num_run, m_digits3 }, 0, 0, 0 },
    [PT_GPT2]           = { { m_gpt2 }, 0, 0, 0 },
    [PT_LLAMA3]         = { { m_llama3 }, 1, 1, 0 },
    [PT_LLAMA3_PLAIN]   = { { m_llama3 }, 0, 0, 0 },
    [PT_LLAMA3_NOBOS]   = { { m_llama3 }, 0, 0, 1 },
    [PT_QWEN2]          = { { m_qwen2 }, 0, 0, 0 },
    [PT_DEEPSEEK_LLM]   = { { m_crlf, m_ds_letters, m_ds_punct, m_ws_end, m_cjk, m_num_run }, 0, 0, 0 },
    [PT_DEEPSEEK_CODER] = { { m_crlf, m_ws_letters, m_ws_punct, m_cjk, m_num1 }, 0, 0, 0 },
    [PT_FALCON]         = { { m_punct_falcon, m_gpt2, m_digits3 }, 0, 0, 0 },
    [PT_STARCODER]      = { { m_num1, m_gpt2 }, 0, 0, 0 },
};

static const struct { const char *name; int def; } PT_NAMES[] = {
    { "default", PT_DEFAULT },
    { "gpt-2", PT_GPT2 }, { "phi-2", PT_GPT2 }, { "mpt", PT_GPT2 }, { "olmo", PT_GPT2 },
    { "jais", PT_GPT2 }, { "trillion", PT_GPT2 }, { "gigachat", PT_GPT2 },
    { "a.x-4.0", PT_GPT2 }, { "mellum", PT_GPT2 }, { "exaone4", PT_GPT2 },
    { "granite-docling", PT_GPT2 },
    { "llama3", PT_LLAMA3 }, { "llama-v3", PT_LLAMA3 }, { "llama-bpe", PT_LLAMA3 },
    { "falcon3", PT_LLAMA3 }, { "falcon-h1", PT_LLAMA3 }, { "pixtral", PT_LLAMA3 },
    { "midm-2.0", PT_LLAMA3 }, { "lfm2", PT_LLAMA3 },
    { "dbrx", PT_LLAMA3_PLAIN }, { "smaug-bpe", PT_LLAMA3_PLAIN },
    { "glm4", PT_LLAMA3_NOBOS }, { "chatglm-bpe", PT_LLAMA3_NOBOS },
    { "qwen2", PT_QWEN2 }, { "deepseek-r1-qwen", PT_QWEN2 }, { "kormo", PT_QWEN2 },
    { "f2llmv2", PT_QWEN2 }, { "stablelm2", PT_QWEN2 }, { "hunyuan", PT_QWEN2 },
    { "solar-open", PT_QWEN2 }, { "megrez", PT_QWEN2 },
    { "deepseek-llm", PT_DEEPSEEK_LLM },
    { "deepseek-coder", PT_DEEPSEEK_CODER },
    { "falcon", PT_FALCON },
    { "starcoder", PT_STARCODER }, { "refact", PT_STARCODER }, { "command-r", PT_STARCODER },
    { "smollm", PT_STARCODER }, { "codeshell", PT_STARCODER }, { "exaone", PT_STARCODER },
    { "minerva-7b", PT_STARCODER }, { "mellum2", PT_STARCODER },
};

const pt_def *pt_find(const char *name, size_t name_len)
{
    for (size_t i = 0; i < N_OF(PT_NAMES); i++)
        if (strlen(PT_NAMES[i].name) == name_len && memcmp(PT_NAMES[i].name, name, name_len) == 0)
            return &PT_DEFS[PT_NAMES[i].def];
    return NULL;
}

int pt_ignore_merges(const pt_def *d)   { return d->ignore_merges; }
int pt_default_add_bos(const pt_def *d) { return d->add_bos; }
int pt_drops_bos(const pt_def *d)       { return d->drop_bos; }

/* ------------------------------------------------------------------ */
/* 4. driver                                                            */

void pt_free(pt_text *t)
{
    if (!t) return;
    free(t->cps);
    free(t->flags);
    free(t->boff);
    free(t->ends);
    memset(t, 0, sizeof(*t));
}

/* One matcher over every piece of t: in[] piece ends -> out[] piece ends. */
static size_t run_step(const pt_text *t, pt_match_fn m, const size_t *in, size_t n_in, size_t *out)
{
    size_t n_out = 0, s = 0;
    for (size_t i = 0; i < n_in; i++) {
        size_t e = in[i], gap = s, p = s;
        while (p < e) {
            size_t len = m(t, s, p, e);
            if (len == 0) { p++; continue; }
            if (gap < p) out[n_out++] = p;
            p += len;
            out[n_out++] = p;
            gap = p;
        }
        if (gap < e) out[n_out++] = e;
        s = e;
    }
    return n_out;
}

int pt_split(const pt_def *d, const char *text, size_t len, pt_text *t)
{
    memset(t, 0, sizeof(*t));
    if (len > SIZE_MAX / 16) return -1;
    /* n codepoints <= len bytes; +1 keeps every malloc non-zero */
    t->cps   = malloc((len + 1) * sizeof(*t->cps));
    t->flags = malloc((len + 1) * sizeof(*t->flags));
    t->boff  = malloc((len + 1) * sizeof(*t->boff));
    t->ends  = malloc((len + 1) * sizeof(*t->ends));
    size_t *tmp = malloc((len + 1) * sizeof(*tmp));
    if (!t->cps || !t->flags || !t->boff || !t->ends || !tmp) {
        free(tmp);
        pt_free(t);
        return -1;
    }
    const uint8_t *u = (const uint8_t *)text;
    size_t off = 0, n = 0;
    while (off < len) {
        size_t adv;
        t->boff[n] = off;
        t->cps[n] = tok_utf8_decode(u + off, len - off, &adv);
        t->flags[n] = ucd_flags(t->cps[n]);
        off += adv;
        n++;
    }
    t->boff[n] = len;
    t->n = n;

    size_t n_pieces = 0;
    if (n > 0) t->ends[n_pieces++] = n;
    for (int i = 0; i < PT_MAX_STEPS && d->steps[i]; i++) {
        n_pieces = run_step(t, d->steps[i], t->ends, n_pieces, tmp);
        size_t *sw = t->ends; t->ends = tmp; tmp = sw;
    }
    t->n_pieces = n_pieces;
    free(tmp);
    return 0;
}

int tok_pretokenize(const char *pre_name, const char *text, size_t len, size_t *offsets, int max)
{
    if (!pre_name || (!text && len > 0) || (max > 0 && !offsets)) return -1;
    const pt_def *d = pt_find(pre_name, strlen(pre_name));
    if (!d) return -1;
    pt_text t;
    if (pt_split(d, text ? text : "", len, &t)) return -1;
    if (t.n_pieces > (size_t)INT32_MAX) { pt_free(&t); return -1; }
    for (size_t i = 0; i < t.n_pieces && (int64_t)i < (int64_t)max; i++)
        offsets[i] = t.boff[t.ends[i]];
    int n = (int)t.n_pieces;
    pt_free(&t);
    return n;
}
