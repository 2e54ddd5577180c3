/* metrics.c - task scores (see metrics.h).
 *
 * Map:
 *   char classes      a small UTF-8 decoder and word/space classes that
 *                     mimic Python's \w and str.split() closely enough
 *   QA                metrics_normalize_answer, metrics_qa_match, contains_ci
 *   Porter stemmer    porter_* steps, one function per step of the paper;
 *                     NLTK's changes are marked "NLTK:"
 *   ROUGE-L           tokenize like rouge_score, LCS with two rows
 *   LM / repetition   nll, bpc, utf8 chars, match length
 *   fidelity / stats  KL, argmax, mean, standard error
 */
#include "eval/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- character classes ------------------------------------------------ */

enum { CC_WORD, CC_SPACE, CC_OTHER };

/* Decodes one code point at s[i..n); invalid bytes decode as themselves
 * (length 1) so that no input is ever rejected or skipped. */
static size_t next_cp(const unsigned char *s, size_t n, size_t i, unsigned *cp)
{
    unsigned c = s[i];
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > n) { *cp = c; return 1; }
    unsigned v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) { *cp = c; return 1; }
        v = (v << 6) | (s[i + k] & 0x3F);
    }
    *cp = v;
    return len;
}

static int is_ascii_space(unsigned c)
{
    /* Python's str.split() also splits on the ASCII separators 0x1c-0x1f. */
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

/* Word (\w), whitespace (str.split) or other, for a code point. Outside
 * ASCII only the common punctuation and space blocks are told apart;
 * everything else is taken as a letter. */
static int cp_class(unsigned cp)
{
    if (cp < 0x80) {
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || (cp >= '0' && cp <= '9') || cp == '_')
            return CC_WORD;
        return is_ascii_space(cp) ? CC_SPACE : CC_OTHER;
    }
    if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
        cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
        return CC_SPACE;
    if (cp < 0xA0) return CC_OTHER; /* C1 controls */
    if (cp <= 0xBF) {
        /* Latin-1 symbols; these few are letters or numbers to Python */
        return (cp == 0xAA || cp == 0xB2 || cp == 0xB3 || cp == 0xB5 || cp == 0xB9 || cp == 0xBA ||
                (cp >= 0xBC && cp <= 0xBE)) ? CC_WORD : CC_OTHER;
    }
    if (cp == 0xD7 || cp == 0xF7) return CC_OTHER;
    if ((cp >= 0x2000 && cp <= 0x206F) || (cp >= 0x3000 && cp <= 0x303F) || (cp >= 0x2190 && cp <= 0x23FF))
        return CC_OTHER;
    return CC_WORD;
}

static int is_ascii_punct(unsigned char c)
{
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

static unsigned char lower_ascii(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c;
}

/* str.lower() for the scripts SQuAD-style answers use (Latin-1, Latin
 * Extended-A, Greek, Cyrillic). Each mapping keeps the UTF-8 length (two
 * bytes), so text can be lowercased in place. Other code points are kept. */
static unsigned lower_cp(unsigned cp)
{
    if (cp < 0x80) return lower_ascii((unsigned char)cp);
    if (cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) return cp + 0x20;
    if (cp >= 0x100 && cp <= 0x17F) {
        if (cp == 0x130 || cp == 0x131 || cp == 0x138 || cp == 0x149 || cp == 0x17F) return cp; /* no 1:1 lower */
        if (cp == 0x178) return 0xFF;
        /* pairs (upper, lower) start on even code points, except in
         * 0x139-0x148 and 0x179-0x17E where they start on odd ones */
        int odd_pairs = (cp >= 0x139 && cp <= 0x148) || (cp >= 0x179 && cp <= 0x17E);
        return ((cp & 1) == (unsigned)odd_pairs) ? cp + 1 : cp;
    }
    if ((cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) || (cp >= 0x410 && cp <= 0x42F)) return cp + 0x20;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 0x50;
    if (cp == 0x386) return 0x3AC;
    if (cp >= 0x388 && cp <= 0x38A) return cp + 0x25;
    if (cp == 0x38C) return 0x3CC;
    if (cp == 0x38E || cp == 0x38F) return cp + 0x3F;
    return cp;
}

/* ---- question answering ------------------------------------------------- */

char *metrics_normalize_answer(const char *s, size_t n)
{
    const unsigned char *in = (const unsigned char *)s;
    unsigned char *t = malloc(n + 1), *u = malloc(n + 1);
    char *out = malloc(n + 1);
    if (!t || !u || !out) { free(t); free(u); free(out); return NULL; }

    /* lower(), then remove_punc() (string.punctuation is ASCII only) */
    size_t nt = 0;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        size_t len = next_cp(in, n, i, &cp);
        if (len == 1) {
            if (!is_ascii_punct(in[i])) t[nt++] = lower_ascii(in[i]);
        } else if (len == 2) {
            unsigned lc = lower_cp(cp); /* two bytes in, two bytes out */
            t[nt++] = (unsigned char)(0xC0 | (lc >> 6));
            t[nt++] = (unsigned char)(0x80 | (lc & 0x3F));
        } else {
            memcpy(t + nt, in + i, len);
            nt += len;
        }
        i += len;
    }

    /* remove_articles(): re.sub(r"\b(a|an|the)\b", " ") == a maximal run of
     * word characters that is exactly a, an or the becomes one space. */
    size_t nu = 0, i = 0;
    while (i < nt) {
        unsigned cp;
        size_t len = next_cp(t, nt, i, &cp);
        if (cp_class(cp) != CC_WORD) {
            memcpy(u + nu, t + i, len);
            nu += len;
            i += len;
            continue;
        }
        size_t j = i;
        while (j < nt) {
            size_t l2 = next_cp(t, nt, j, &cp);
            if (cp_class(cp) != CC_WORD) break;
            j += l2;
        }
        size_t w = j - i;
        if ((w == 1 && t[i] == 'a') || (w == 2 && !memcmp(t + i, "an", 2)) || (w == 3 && !memcmp(t + i, "the", 3))) {
            u[nu++] = ' ';
        } else {
            memcpy(u + nu, t + i, w);
            nu += w;
        }
        i = j;
    }

    /* white_space_fix(): " ".join(text.split()) */
    size_t no = 0;
    int pending_space = 0;
    i = 0;
    while (i < nu) {
        unsigned cp;
        size_t len = next_cp(u, nu, i, &cp);
        if (cp_class(cp) == CC_SPACE) {
            pending_space = no > 0;
        } else {
            if (pending_space) out[no++] = ' ';
            pending_space = 0;
            memcpy(out + no, u + i, len);
            no += len;
        }
        i += len;
    }
    out[no] = 0;
    free(t);
    free(u);
    return out;
}

int metrics_qa_match(const char *output, const char *const *answers, int n_answers)
{
    char *out = metrics_normalize_answer(output, strlen(output));
    if (!out) return -1;
    size_t n_out = strlen(out);
    int match = 0;
    for (int a = 0; a < n_answers && !match; a++) {
        if (!answers[a]) continue;
        char *ans = metrics_normalize_answer(answers[a], strlen(answers[a]));
        if (!ans) { free(out); return -1; }
        size_t n_ans = strlen(ans);
        match = n_ans > 0 && n_ans <= n_out && memcmp(out, ans, n_ans) == 0;
        free(ans);
    }
    free(out);
    return match;
}

int metrics_contains_ci(const char *haystack, const char *needle)
{
    size_t n = strlen(haystack), m = strlen(needle);
    if (m > n) return 0;
    for (size_t i = 0; i + m <= n; i++) {
        size_t k = 0;
        while (k < m && lower_ascii((unsigned char)haystack[i + k]) == lower_ascii((unsigned char)needle[k])) k++;
        if (k == m) return 1;
    }
    return 0;
}

/* ---- Porter stemmer ----------------------------------------------------- */

typedef struct {
    char *b;                  /* the word being stemmed, b[0..k) */
    size_t k;
    metrics_porter_mode mode;
} porter;

static int is_vowel_letter(char c)
{
    return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u';
}

/* Porter's consonant: not a vowel, and 'y' only when it follows a vowel
 * (or starts the word). Resolved without recursion: in a run of y's the
 * answer alternates from the letter before the run. */
static int is_cons(const char *b, size_t i)
{
    if (is_vowel_letter(b[i])) return 0;
    if (b[i] != 'y') return 1;
    size_t s = i;
    while (s > 0 && b[s - 1] == 'y') s--;
    /* the y at s is a consonant at the start of the word or after a vowel */
    int first = s == 0 ? 1 : is_vowel_letter(b[s - 1]);
    return ((i - s) & 1) ? !first : first;
}

/* m = number of VC sequences in b[0..len) */
static int measure(const char *b, size_t len)
{
    int m = 0, prev = -1;
    for (size_t i = 0; i < len; i++) {
        int c = is_vowel_letter(b[i]) ? 0 : (b[i] != 'y' ? 1 : (i == 0 ? 1 : !prev));
        if (prev == 0 && c == 1) m++;
        prev = c;
    }
    return m;
}

static int has_vowel(const char *b, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (!is_cons(b, i)) return 1;
    return 0;
}

static int ends_double_cons(const char *b, size_t len)
{
    return len >= 2 && b[len - 1] == b[len - 2] && is_cons(b, len - 1);
}

/* *o: ends consonant-vowel-consonant, the last not w, x or y.
 * NLTK: a two-letter stem vowel-consonant counts too. */
static int ends_cvc(const porter *p, size_t len)
{
    const char *b = p->b;
    if (len >= 3 && is_cons(b, len - 3) && !is_cons(b, len - 2) && is_cons(b, len - 1) &&
        b[len - 1] != 'w' && b[len - 1] != 'x' && b[len - 1] != 'y')
        return 1;
    return p->mode == METRICS_PORTER_NLTK && len == 2 && !is_cons(b, 0) && is_cons(b, 1);
}

static int ends(const porter *p, const char *suf)
{
    size_t l = strlen(suf);
    return p->k >= l && memcmp(p->b + p->k - l, suf, l) == 0;
}

/* Replaces the suffix `suf` (known to be there) by `rep`, never longer
 * than the suffix in any rule below except step 1b's +e, which refills a
 * letter just removed. */
static void set_suffix(porter *p, const char *suf, const char *rep)
{
    size_t ls = strlen(suf), lr = strlen(rep);
    memcpy(p->b + p->k - ls, rep, lr);
    p->k = p->k - ls + lr;
}

typedef struct {
    const char *suf, *rep;
} rule;

/* The first rule whose suffix matches decides: applied if the measure of
 * the remaining stem exceeds min_m, otherwise the word is left alone. */
static void apply_rules(porter *p, const rule *r, size_t n_rules, int min_m)
{
    for (size_t i = 0; i < n_rules; i++) {
        if (!ends(p, r[i].suf)) continue;
        if (measure(p->b, p->k - strlen(r[i].suf)) > min_m) set_suffix(p, r[i].suf, r[i].rep);
        return;
    }
}

static void step1a(porter *p)
{
    if (p->mode == METRICS_PORTER_NLTK && p->k == 4 && ends(p, "ies")) { set_suffix(p, "ies", "ie"); return; }
    if (ends(p, "sses")) set_suffix(p, "sses", "ss");
    else if (ends(p, "ies")) set_suffix(p, "ies", "i");
    else if (ends(p, "ss")) return;
    else if (ends(p, "s")) p->k--;
}

static void step1b(porter *p)
{
    if (p->mode == METRICS_PORTER_NLTK && ends(p, "ied")) {
        set_suffix(p, "ied", p->k == 4 ? "ie" : "i");
        return;
    }
    if (ends(p, "eed")) {
        if (measure(p->b, p->k - 3) > 0) p->k--;
        return;
    }
    size_t stem;
    if (ends(p, "ed") && has_vowel(p->b, p->k - 2)) stem = p->k - 2;
    else if (ends(p, "ing") && has_vowel(p->b, p->k - 3)) stem = p->k - 3;
    else return;
    p->k = stem;
    if (ends(p, "at") || ends(p, "bl") || ends(p, "iz")) {
        p->b[p->k++] = 'e';
    } else if (ends_double_cons(p->b, p->k)) {
        char c = p->b[p->k - 1];
        if (c != 'l' && c != 's' && c != 'z') p->k--;
    } else if (measure(p->b, p->k) == 1 && ends_cvc(p, p->k)) {
        p->b[p->k++] = 'e';
    }
}

static void step1c(porter *p)
{
    if (!ends(p, "y")) return;
    size_t stem = p->k - 1;
    /* NLTK: only after a consonant that is not the whole stem (enjoy stays) */
    int ok = p->mode == METRICS_PORTER_NLTK ? (stem > 1 && is_cons(p->b, stem - 1)) : has_vowel(p->b, stem);
    if (ok) p->b[p->k - 1] = 'i';
}

static void step2(porter *p)
{
    /* NLTK: -alli becomes -al and step 2 runs again on the result */
    while (p->mode == METRICS_PORTER_NLTK && ends(p, "alli") && measure(p->b, p->k - 4) > 0)
        set_suffix(p, "alli", "al");
    static const rule common_head[] = {
        { "ational", "ate" }, { "tional", "tion" }, { "enci", "ence" }, { "anci", "ance" }, { "izer", "ize" },
    };
    static const rule common_tail[] = {
        { "alli", "al" },     { "entli", "ent" },   { "eli", "e" },       { "ousli", "ous" },
        { "ization", "ize" }, { "ation", "ate" },   { "ator", "ate" },    { "alism", "al" },
        { "iveness", "ive" }, { "fulness", "ful" }, { "ousness", "ous" }, { "aliti", "al" },
        { "iviti", "ive" },   { "biliti", "ble" },
    };
    /* The rule list is one ordered list; the first matching suffix decides. */
    rule list[24];
    size_t n = 0;
    for (size_t i = 0; i < sizeof common_head / sizeof *common_head; i++) list[n++] = common_head[i];
    list[n++] = p->mode == METRICS_PORTER_ORIGINAL ? (rule){ "abli", "able" } : (rule){ "bli", "ble" };
    for (size_t i = 0; i < sizeof common_tail / sizeof *common_tail; i++) list[n++] = common_tail[i];
    if (p->mode == METRICS_PORTER_NLTK) list[n++] = (rule){ "fulli", "ful" };
    for (size_t i = 0; i < n; i++) {
        if (!ends(p, list[i].suf)) continue;
        if (measure(p->b, p->k - strlen(list[i].suf)) > 0) set_suffix(p, list[i].suf, list[i].rep);
        return;
    }
    /* NLTK: -logi -> -log when the word minus "ogi" has m > 0 */
    if (p->mode == METRICS_PORTER_NLTK && ends(p, "logi") && measure(p->b, p->k - 3) > 0) p->k--;
}

static void step3(porter *p)
{
    static const rule r[] = {
        { "icate", "ic" }, { "ative", "" }, { "alize", "al" }, { "iciti", "ic" },
        { "ical", "ic" },  { "ful", "" },   { "ness", "" },
    };
    apply_rules(p, r, sizeof r / sizeof *r, 0);
}

static void step4(porter *p)
{
    static const rule r[] = {
        { "al", "" },   { "ance", "" }, { "ence", "" }, { "er", "" },  { "ic", "" },  { "able", "" },
        { "ible", "" }, { "ant", "" },  { "ement", "" }, { "ment", "" }, { "ent", "" }, { "ion", "" },
        { "ou", "" },   { "ism", "" },  { "ate", "" },  { "iti", "" }, { "ous", "" }, { "ive", "" },
        { "ize", "" },
    };
    for (size_t i = 0; i < sizeof r / sizeof *r; i++) {
        if (!ends(p, r[i].suf)) continue;
        size_t stem = p->k - strlen(r[i].suf);
        int ok = measure(p->b, stem) > 1;
        if (ok && !strcmp(r[i].suf, "ion")) ok = p->b[stem - 1] == 's' || p->b[stem - 1] == 't';
        if (ok) p->k = stem;
        return;
    }
}

static void step5(porter *p)
{
    if (ends(p, "e")) {
        int m = measure(p->b, p->k - 1);
        if (m > 1 || (m == 1 && !ends_cvc(p, p->k - 1))) p->k--;
    }
    if (ends(p, "ll") && measure(p->b, p->k - 1) > 1) p->k--;
}

size_t metrics_porter_stem(char *word, size_t n, metrics_porter_mode mode)
{
    if (mode == METRICS_PORTER_NLTK) {
        /* NLTK's irregular forms, looked up before any step */
        static const rule pool[] = {
            { "skies", "sky" },       { "dying", "die" },     { "lying", "lie" },     { "tying", "tie" },
            { "innings", "inning" },  { "outings", "outing" }, { "cannings", "canning" },
        };
        static const char *const keep[] = { "sky", "news", "inning", "outing", "canning",
                                            "howe", "proceed", "exceed", "succeed" };
        for (size_t i = 0; i < sizeof pool / sizeof *pool; i++)
            if (n == strlen(pool[i].suf) && !memcmp(word, pool[i].suf, n)) {
                size_t l = strlen(pool[i].rep);
                memcpy(word, pool[i].rep, l);
                return l;
            }
        for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
            if (n == strlen(keep[i]) && !memcmp(word, keep[i], n)) return n;
        if (n <= 2) return n; /* NLTK leaves 1-2 letter words alone */
    }
    if (n == 0) return 0;
    porter p = { word, n, mode };
    step1a(&p);
    step1b(&p);
    step1c(&p);
    step2(&p);
    step3(&p);
    step4(&p);
    step5(&p);
    return p.k;
}

/* ---- ROUGE-L ------------------------------------------------------------ */

typedef struct {
    char *buf;          /* lowercased copy; tokens are stemmed in place */
    size_t *off, *len;  /* [n] */
    uint64_t *hash;     /* [n] */
    size_t n;
} token_list;

static void tokens_free(token_list *t)
{
    free(t->buf);
    free(t->off);
    free(t->len);
    free(t->hash);
}

static int tokenize(const char *text, int use_stemmer, token_list *t)
{
    size_t n = strlen(text);
    memset(t, 0, sizeof *t);
    t->buf = malloc(n + 1);
    /* at most one token per two bytes (a token and a separator) */
    size_t cap = n / 2 + 1;
    t->off = malloc(cap * sizeof *t->off);
    t->len = malloc(cap * sizeof *t->len);
    t->hash = malloc(cap * sizeof *t->hash);
    if (!t->buf || !t->off || !t->len || !t->hash) { tokens_free(t); return -1; }
    for (size_t i = 0; i < n; i++) t->buf[i] = (char)lower_ascii((unsigned char)text[i]);
    size_t i = 0;
    while (i < n) {
        char c = t->buf[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) { i++; continue; }
        size_t j = i;
        while (j < n && ((t->buf[j] >= 'a' && t->buf[j] <= 'z') || (t->buf[j] >= '0' && t->buf[j] <= '9'))) j++;
        size_t len = j - i;
        if (use_stemmer && len > 3) len = metrics_porter_stem(t->buf + i, len, METRICS_PORTER_NLTK);
        if (len > 0) {
            uint64_t h = 1469598103934665603ull; /* FNV-1a */
            for (size_t k = 0; k < len; k++) h = (h ^ (unsigned char)t->buf[i + k]) * 1099511628211ull;
            t->off[t->n] = i;
            t->len[t->n] = len;
            t->hash[t->n] = h;
            t->n++;
        }
        i = j;
    }
    return 0;
}

static int token_eq(const token_list *a, size_t i, const token_list *b, size_t j)
{
    return a->hash[i] == b->hash[j] && a->len[i] == b->len[j] &&
           memcmp(a->buf + a->off[i], b->buf + b->off[j], a->len[i]) == 0;
}

int metrics_rouge_l(const char *reference, const char *prediction, int use_stemmer, metrics_rouge *out)
{
    memset(out, 0, sizeof *out);
    token_list r, p;
    if (tokenize(reference, use_stemmer, &r)) return -1;
    if (tokenize(prediction, use_stemmer, &p)) { tokens_free(&r); return -1; }
    int rc = 0;
    if (r.n > 0 && p.n > 0) {
        /* LCS by dynamic programming, one row per reference token */
        size_t *prev = calloc(p.n + 1, sizeof *prev), *cur = calloc(p.n + 1, sizeof *cur);
        if (!prev || !cur) {
            rc = -1;
        } else {
            for (size_t i = 0; i < r.n; i++) {
                cur[0] = 0;
                for (size_t j = 0; j < p.n; j++)
                    cur[j + 1] = token_eq(&r, i, &p, j) ? prev[j] + 1 : (prev[j + 1] > cur[j] ? prev[j + 1] : cur[j]);
                size_t *tmp = prev;
                prev = cur;
                cur = tmp;
            }
            double lcs = (double)prev[p.n];
            out->precision = lcs / (double)p.n;
            out->recall = lcs / (double)r.n;
            double s = out->precision + out->recall;
            out->f1 = s > 0 ? 2.0 * out->precision * out->recall / s : 0.0;
        }
        free(prev);
        free(cur);
    }
    tokens_free(&r);
    tokens_free(&p);
    return rc;
}

/* ---- language modelling ------------------------------------------------- */

int64_t metrics_utf8_chars(const char *s, size_t n)
{
    int64_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

static double log_sum_exp(const float *x, int64_t n, double *max_out)
{
    double mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > mx) mx = x[i];
    *max_out = mx;
    if (!(mx > -INFINITY)) return mx; /* no finite entry (or NaN) */
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

double metrics_nll(const float *logits, int64_t n_vocab, int64_t target)
{
    if (n_vocab <= 0 || target < 0 || target >= n_vocab) return NAN;
    double mx;
    double lse = log_sum_exp(logits, n_vocab, &mx);
    return lse - (double)logits[target];
}

double metrics_bpc(double sum_nll_nats, int64_t n_chars)
{
    if (n_chars <= 0) return 0.0;
    return sum_nll_nats * M_LOG2E / (double)n_chars;
}

/* ---- repetition --------------------------------------------------------- */

static size_t skip_leading_space(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned cp;
        size_t len = next_cp(s, n, i, &cp);
        if (cp_class(cp) != CC_SPACE) break;
        i += len;
    }
    return i;
}

int64_t metrics_match_length(const char *generated, size_t n_generated, const char *reference, size_t n_reference)
{
    const unsigned char *g = (const unsigned char *)generated, *r = (const unsigned char *)reference;
    size_t i = skip_leading_space(g, n_generated), j = skip_leading_space(r, n_reference);
    int64_t count = 0;
    while (i < n_generated && j < n_reference) {
        unsigned cg, cr;
        size_t lg = next_cp(g, n_generated, i, &cg), lr = next_cp(r, n_reference, j, &cr);
        if (lg != lr || memcmp(g + i, r + j, lg) != 0) break;
        count++;
        i += lg;
        j += lr;
    }
    return count;
}

/* ---- fidelity ----------------------------------------------------------- */

double metrics_kl_logits(const float *p_logits, const float *q_logits, int64_t n)
{
    if (n <= 0) return NAN;
    double mp, mq;
    double lse_p = log_sum_exp(p_logits, n, &mp);
    double lse_q = log_sum_exp(q_logits, n, &mq);
    if (!(mp > -INFINITY) || !(mq > -INFINITY) || isinf(mp) || isinf(mq)) return NAN;
    double kl = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (p_logits[i] == -INFINITY) continue;
        if (q_logits[i] == -INFINITY) return INFINITY; /* p puts mass where q has none */
        double lp = (double)p_logits[i] - lse_p;
        double lq = (double)q_logits[i] - lse_q;
        kl += exp(lp) * (lp - lq);
    }
    /* rounding can leave a tiny negative value for near-identical inputs */
    return kl < 0.0 ? 0.0 : kl;
}

int64_t metrics_argmax(const float *x, int64_t n)
{
    if (n <= 0) return -1;
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

int64_t metrics_common_prefix(const int32_t *a, int64_t n_a, const int32_t *b, int64_t n_b)
{
    int64_t i = 0;
    while (i < n_a && i < n_b && a[i] == b[i]) i++;
    return i;
}

/* ---- aggregation -------------------------------------------------------- */

double metrics_mean(const double *x, int64_t n)
{
    if (n <= 0) return 0.0;
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += x[i];
    return s / (double)n;
}

double metrics_stderr(const double *x, int64_t n)
{
    if (n < 2) return 0.0;
    double mean = metrics_mean(x, n), ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (x[i] - mean) * (x[i] - mean);
    return sqrt(ss / (double)(n - 1)) / sqrt((double)n);
}
