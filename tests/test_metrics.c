/* test_metrics.c - task metrics against hand-worked values, NLTK's Porter
 * stemmer output (tables below were produced by nltk 3.8's PorterStemmer
 * in ORIGINAL_ALGORITHM and default NLTK_EXTENSIONS modes; the words are
 * the examples of Porter's 1980 paper plus the cases where NLTK differs),
 * and a separately written LCS for ROUGE-L on random token sequences. */
#include "eval/metrics.h"
#include "test.h"

#include <stdint.h>

static void check_norm(const char *in, const char *want)
{
    char *got = metrics_normalize_answer(in, strlen(in));
    CHECK(got && !strcmp(got, want), "normalize(\"%s\") = \"%s\", want \"%s\"", in, got ? got : "(null)", want);
    free(got);
}

static void test_normalize(void)
{
    check_norm("The Cat!", "cat");
    check_norm("  a  b  ", "b");
    check_norm("An apple, the pear.", "apple pear");
    check_norm("theory then anthem", "theory then anthem"); /* articles only as whole words */
    check_norm("Denver Broncos", "denver broncos");
    check_norm("'GERTRUDE'", "gertrude");
    check_norm("the", "");
    check_norm("A.B.C.", "abc");          /* punctuation goes first, so "A." is not an article */
    check_norm("a.", "");
    check_norm("Tab\tand\nnewline", "tab and newline");
    check_norm("rock-and-roll", "rockandroll");
    check_norm("the_end", "theend");       /* '_' is in string.punctuation */
    check_norm("foo\xC2\xA0" "bar", "foo bar"); /* NBSP splits like str.split() */
    check_norm("CAF\xC3\x89 the", "caf\xC3\xA9");               /* Latin-1 capital lowercased */
    check_norm("\xC5\x81" "azienki Park", "\xC5\x82" "azienki park");    /* Latin Extended-A: L-stroke */
    check_norm("\xCE\x91\xCE\x98\xCE\x97\xCE\x9D\xCE\x91", "\xCE\xB1\xCE\xB8\xCE\xB7\xCE\xBD\xCE\xB1"); /* Greek */
    check_norm("\xD0\x9C\xD0\x9E\xD0\xA1\xD0\x9A\xD0\x92\xD0\x90 \xD0\x81", "\xD0\xBC\xD0\xBE\xD1\x81\xD0\xBA\xD0\xB2\xD0\xB0 \xD1\x91"); /* Cyrillic */
    check_norm("the\xE2\x80\x94" "a \xE2\x80\x9Cthe\xE2\x80\x9D", "\xE2\x80\x94 \xE2\x80\x9C \xE2\x80\x9D"); /* dash, quotes: not \w */
    check_norm("$1,000.50", "100050");
    check_norm("", "");
}

static void test_qa_match(void)
{
    const char *broncos[] = { "Denver Broncos" };
    CHECK(metrics_qa_match(" Denver Broncos won 24-10", broncos, 1) == 1, "prefix match");
    CHECK(metrics_qa_match("The Denver Broncos.", broncos, 1) == 1, "article and punctuation ignored");
    CHECK(metrics_qa_match("Broncos", broncos, 1) == 0, "partial answer is not a match");
    CHECK(metrics_qa_match("They were the Denver Broncos", broncos, 1) == 0, "must start with the answer");
    CHECK(metrics_qa_match("Denver Broncos", broncos, 0) == 0, "no answers: no match");
    const char *only_article[] = { "The" };
    CHECK(metrics_qa_match("the cat", only_article, 1) == 0, "an answer normalising to empty never matches");
    const char *several[] = { "Santa Clara, California", "Levi's Stadium", "Levi's Stadium in the San Francisco Bay Area" };
    CHECK(metrics_qa_match("Levis Stadium, home of", several, 3) == 1, "any of several answers");
    const char *year[] = { "1978" };
    CHECK(metrics_qa_match(" 1978\nQuestion:", year, 1) == 1, "1978");
    CHECK(metrics_qa_match(" 1979", year, 1) == 0, "1979 is not 1978");
    CHECK(metrics_contains_ci("The value is 58885126-D004-470c", "58885126-d004") == 1, "contains, any case");
    CHECK(metrics_contains_ci("5888512", "58885126") == 0, "shorter haystack");
    CHECK(metrics_contains_ci("abc", "") == 1, "empty needle");
}

typedef struct {
    const char *word, *stem;
} stem_case;

static void test_porter(void)
{
    /* Both modes agree on these (Porter's own examples). */
    static const stem_case common[] = {
        { "caresses", "caress" }, { "ponies", "poni" }, { "caress", "caress" },
        { "cats", "cat" }, { "feed", "feed" }, { "agreed", "agre" }, { "plastered", "plaster" },
        { "bled", "bled" }, { "motoring", "motor" }, { "sing", "sing" }, { "conflated", "conflat" },
        { "troubled", "troubl" }, { "sized", "size" }, { "hopping", "hop" }, { "tanned", "tan" },
        { "falling", "fall" }, { "hissing", "hiss" }, { "fizzed", "fizz" }, { "failing", "fail" },
        { "filing", "file" }, { "happy", "happi" }, { "sky", "sky" }, { "relational", "relat" },
        { "conditional", "condit" }, { "rational", "ration" }, { "valenci", "valenc" }, { "hesitanci", "hesit" },
        { "digitizer", "digit" }, { "conformabli", "conform" }, { "radicalli", "radic" },
        { "differentli", "differ" }, { "vileli", "vile" }, { "analogousli", "analog" },
        { "vietnamization", "vietnam" }, { "predication", "predic" }, { "operator", "oper" },
        { "feudalism", "feudal" }, { "decisiveness", "decis" }, { "hopefulness", "hope" },
        { "callousness", "callous" }, { "formaliti", "formal" }, { "sensitiviti", "sensit" },
        { "sensibiliti", "sensibl" }, { "triplicate", "triplic" }, { "formative", "form" },
        { "formalize", "formal" }, { "electriciti", "electr" }, { "electrical", "electr" },
        { "hopeful", "hope" }, { "goodness", "good" }, { "revival", "reviv" }, { "allowance", "allow" },
        { "inference", "infer" }, { "airliner", "airlin" }, { "gyroscopic", "gyroscop" },
        { "adjustable", "adjust" }, { "defensible", "defens" }, { "irritant", "irrit" },
        { "replacement", "replac" }, { "adjustment", "adjust" }, { "dependent", "depend" },
        { "adoption", "adopt" }, { "homologou", "homolog" }, { "communism", "commun" }, { "activate", "activ" },
        { "angulariti", "angular" }, { "homologous", "homolog" }, { "effective", "effect" },
        { "bowdlerize", "bowdler" }, { "probate", "probat" }, { "rate", "rate" }, { "cease", "ceas" },
        { "controll", "control" }, { "roll", "roll" }, { "generalizations", "gener" },
        { "oscillators", "oscil" }, { "fully", "fulli" }, { "syzygy", "syzygi" }, { "cried", "cri" },
    };
    /* word, original algorithm, NLTK extensions */
    static const struct { const char *word, *orig, *nltk; } differ[] = {
        { "ties", "ti", "tie" },          { "dying", "dy", "die" },       { "skies", "ski", "sky" },
        { "cry", "cry", "cri" },          { "enjoy", "enjoi", "enjoy" },  { "hopefully", "hopefulli", "hope" },
        { "analogi", "analogi", "analog" }, { "news", "new", "news" },     { "toy", "toi", "toy" },
        { "died", "di", "die" },          { "lying", "ly", "lie" },
    };
    char buf[64];
    for (size_t i = 0; i < sizeof common / sizeof *common; i++) {
        for (int mode = 0; mode < 2; mode++) {
            size_t n = strlen(common[i].word);
            memcpy(buf, common[i].word, n);
            size_t k = metrics_porter_stem(buf, n, mode ? METRICS_PORTER_ORIGINAL : METRICS_PORTER_NLTK);
            CHECK(k == strlen(common[i].stem) && !memcmp(buf, common[i].stem, k), "stem(%s, mode %d) = %.*s, want %s",
                  common[i].word, mode, (int)k, buf, common[i].stem);
        }
    }
    for (size_t i = 0; i < sizeof differ / sizeof *differ; i++) {
        size_t n = strlen(differ[i].word);
        memcpy(buf, differ[i].word, n);
        size_t k = metrics_porter_stem(buf, n, METRICS_PORTER_ORIGINAL);
        CHECK(k == strlen(differ[i].orig) && !memcmp(buf, differ[i].orig, k), "original stem(%s) = %.*s, want %s",
              differ[i].word, (int)k, buf, differ[i].orig);
        memcpy(buf, differ[i].word, n);
        k = metrics_porter_stem(buf, n, METRICS_PORTER_NLTK);
        CHECK(k == strlen(differ[i].nltk) && !memcmp(buf, differ[i].nltk, k), "nltk stem(%s) = %.*s, want %s",
              differ[i].word, (int)k, buf, differ[i].nltk);
    }
    /* hostile shapes: long runs of y (consonant/vowel alternation), empty */
    char ys[4000];
    memset(ys, 'y', sizeof ys);
    size_t k = metrics_porter_stem(ys, sizeof ys, METRICS_PORTER_NLTK);
    CHECK(k <= sizeof ys && k > 0, "4000 y's: %zu", k);
    CHECK(metrics_porter_stem(buf, 0, METRICS_PORTER_ORIGINAL) == 0, "empty word");
}

static void check_rouge(const char *ref, const char *pred, int stem, double p, double r, double f)
{
    metrics_rouge s;
    int rc = metrics_rouge_l(ref, pred, stem, &s);
    CHECK(rc == 0, "rouge rc");
    CHECK(fabs(s.precision - p) < 1e-12 && fabs(s.recall - r) < 1e-12 && fabs(s.f1 - f) < 1e-12,
          "rouge(\"%s\", \"%s\", stem %d) = P %.6f R %.6f F %.6f, want %.6f %.6f %.6f", ref, pred, stem, s.precision,
          s.recall, s.f1, p, r, f);
}

/* LCS by full table, written independently of the library's two-row DP. */
static size_t lcs_full(const int *a, size_t n, const int *b, size_t m)
{
    size_t *t = calloc((n + 1) * (m + 1), sizeof *t);
    if (!t) return 0;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            size_t up = t[(i - 1) * (m + 1) + j], left = t[i * (m + 1) + j - 1];
            t[i * (m + 1) + j] = a[i - 1] == b[j - 1] ? t[(i - 1) * (m + 1) + j - 1] + 1 : (up > left ? up : left);
        }
    size_t v = t[n * (m + 1) + m];
    free(t);
    return v;
}

static void test_rouge(void)
{
    /* LCS(the cat sat on the mat, the cat lay on the mat) = "the cat on the mat" = 5 of 6 */
    check_rouge("the cat sat on the mat", "the cat lay on the mat", 1, 5.0 / 6, 5.0 / 6, 5.0 / 6);
    /* Lin (2004): S1 "police killed the gunman", S2 "police kill the gunman": LCS 3 of 4;
     * with the stemmer killed -> kill and the two are identical. */
    check_rouge("police killed the gunman", "police kill the gunman", 0, 0.75, 0.75, 0.75);
    check_rouge("police killed the gunman", "police kill the gunman", 1, 1, 1, 1);
    check_rouge("police killed the gunman", "the gunman kill police", 1, 0.5, 0.5, 0.5);
    /* unequal lengths: LCS(a b c d e, a c e) = 3; P = 1, R = 0.6, F = 2*0.6/1.6 = 0.75 */
    check_rouge("a b c d e", "a c e", 0, 1.0, 0.6, 0.75);
    check_rouge("Hello, World!", "hello world", 1, 1, 1, 1);        /* case and punctuation */
    check_rouge("2015 season", "season 2015", 1, 0.5, 0.5, 0.5);
    check_rouge("was", "wa", 1, 0, 0, 0);        /* words of <= 3 letters are not stemmed */
    check_rouge("cats", "cat", 1, 1, 1, 1);      /* cats (4 letters) -> cat */
    check_rouge("", "anything", 1, 0, 0, 0);
    check_rouge("some words", "", 1, 0, 0, 0);
    check_rouge("... !!!", "a b", 1, 0, 0, 0);   /* no tokens on one side */
    check_rouge("caf\xC3\xA9 au lait", "caf lait", 0, 1.0, 2.0 / 3, 0.8); /* non-ASCII splits tokens */

    /* random token sequences vs the full-table LCS (short words: no stemming) */
    static const char *const vocab[] = { "a", "b", "c", "d", "e", "of", "to", "in", "the" };
    uint64_t x = 7;
    int rounds = test_quick() ? 50 : 300, bad = 0;
    for (int r = 0; r < rounds; r++) {
        int ta[80], tb[80];
        char sa[400] = "", sb[400] = "";
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t n = (x >> 33) % 60, m = (x >> 45) % 60;
        for (size_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            ta[i] = (int)((x >> 33) % 9);
            strcat(sa, vocab[ta[i]]);
            strcat(sa, (x >> 40) & 1 ? " " : ", ");
        }
        for (size_t j = 0; j < m; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            tb[j] = (int)((x >> 33) % 9);
            strcat(sb, vocab[tb[j]]);
            strcat(sb, " ");
        }
        metrics_rouge s;
        metrics_rouge_l(sa, sb, 1, &s);
        double lcs = (double)lcs_full(ta, n, tb, m);
        double p = m ? lcs / (double)m : 0, rr = n ? lcs / (double)n : 0;
        double f = (n && m && p + rr > 0) ? 2 * p * rr / (p + rr) : 0;
        if (fabs(s.f1 - f) > 1e-12 || fabs(s.precision - p) > 1e-12 || fabs(s.recall - rr) > 1e-12) bad++;
    }
    CHECK(bad == 0, "ROUGE-L disagrees with the full-table LCS in %d of %d cases", bad, rounds);
}

static void test_lm(void)
{
    CHECK_NEAR(metrics_bpc(100.0, 200), 100.0 * 1.4426950408889634 / 200.0, 1e-15);
    CHECK_NEAR(metrics_bpc(100.0, 200), 0.7213475204444817, 1e-15);
    CHECK(metrics_bpc(5.0, 0) == 0.0, "no characters");
    const float two[2] = { 0.0f, 0.0f };
    CHECK_NEAR(metrics_nll(two, 2, 0), log(2.0), 1e-12);
    const float three[3] = { 1.0f, 2.0f, 3.0f };
    /* log(e + e^2 + e^3) - 3 = log(1 + e^-1 + e^-2) */
    CHECK_NEAR(metrics_nll(three, 3, 2), 0.40760596444438, 1e-12);
    const float big[2] = { 1000.0f, 0.0f };
    CHECK_NEAR(metrics_nll(big, 2, 1), 1000.0, 1e-9); /* stable at large logits */
    CHECK(isnan(metrics_nll(three, 3, 3)), "target out of range");
    CHECK(metrics_utf8_chars("h\xC3\xA9llo \xE2\x82\xAC", 10) == 7, "code points");
}

static void test_match_length(void)
{
    const char *g = " can; for my good", *r = " can; for my uncle Gloucester";
    CHECK(metrics_match_length(g, strlen(g), r, strlen(r)) == 12, "\"can; for my \" = 12");
    CHECK(metrics_match_length("can", 3, "can; for", 8) == 3, "an early stop scores its length");
    CHECK(metrics_match_length("\n  abc", 6, "abc", 3) == 3, "leading whitespace stripped");
    CHECK(metrics_match_length("abcdef", 6, "abc", 3) == 3, "longer generation: the reference length");
    CHECK(metrics_match_length("h\xC3\xA9llo", 6, "h\xC3\xA9lp", 5) == 3, "code points: h, e-acute, l");
    CHECK(metrics_match_length("\xC3\xA9", 2, "\xC3\xA8", 2) == 0, "mismatch inside a character");
    CHECK(metrics_match_length("x", 1, "y", 1) == 0, "first character differs");
    CHECK(metrics_match_length("", 0, "abc", 3) == 0, "empty generation");
}

static void test_kl(void)
{
    const float p[4] = { 1.5f, -2.0f, 0.25f, 3.0f };
    CHECK(fabs(metrics_kl_logits(p, p, 4)) < 1e-15, "KL of identical = 0");
    /* p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3) */
    const float pl[2] = { 0.0f, 0.0f }, ql[2] = { 0.0f, (float)log(3.0) };
    CHECK_NEAR(metrics_kl_logits(pl, ql, 2), 0.5 * log(4.0 / 3.0), 1e-7);
    const float pl5[2] = { 5.0f, 5.0f }, ql7[2] = { -7.0f, -7.0f + (float)log(3.0) };
    CHECK_NEAR(metrics_kl_logits(pl5, ql7, 2), 0.5 * log(4.0 / 3.0), 1e-6); /* shift invariant */
    const float pm[2] = { -INFINITY, 0.0f };
    CHECK_NEAR(metrics_kl_logits(pm, pl, 2), log(2.0), 1e-12); /* p = (0, 1), q = (1/2, 1/2) */
    CHECK(isinf(metrics_kl_logits(pl, pm, 2)), "q = 0 where p > 0: infinite");
    CHECK(metrics_argmax(p, 4) == 3, "argmax");
    const float tie[3] = { 2.0f, 2.0f, 1.0f };
    CHECK(metrics_argmax(tie, 3) == 0, "argmax takes the first of ties");
    CHECK(metrics_argmax(p, 0) == -1, "argmax of nothing");
    CHECK(metrics_argmax(pl5, 2) == metrics_argmax(pl, 2), "top-1 agreement");
    const int32_t ta[5] = { 5, 9, 2, 7, 7 }, tb[4] = { 5, 9, 3, 7 };
    CHECK(metrics_common_prefix(ta, 5, tb, 4) == 2, "tokens match before the first divergence");
    CHECK(metrics_common_prefix(ta, 2, ta, 5) == 2 && metrics_common_prefix(ta, 0, tb, 4) == 0, "prefix lengths");
}

static void test_stats(void)
{
    const double x[4] = { 1, 2, 3, 4 };
    CHECK_NEAR(metrics_mean(x, 4), 2.5, 1e-15);
    /* sample variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3; se = sqrt(5/3) / 2 */
    CHECK_NEAR(metrics_stderr(x, 4), sqrt(5.0 / 3.0) / 2.0, 1e-15);
    CHECK(metrics_stderr(x, 1) == 0.0 && metrics_mean(x, 0) == 0.0, "degenerate sizes");
    const double acc[5] = { 1, 0, 1, 1, 0 };
    CHECK_NEAR(metrics_stderr(acc, 5), sqrt(0.3) / sqrt(5.0), 1e-15); /* var = 1.2/4 = 0.3 */
}

int main(void)
{
    test_normalize();
    test_qa_match();
    test_porter();
    test_rouge();
    test_lm();
    test_match_length();
    test_kl();
    test_stats();
    return test_summary("test_metrics");
}
