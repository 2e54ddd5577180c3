/* test_streamer.c - core/streamer (what sparq_generate's on_text and the
 * server's replies stream) against a naive reference written apart: after
 * every piece, the reference searches the whole text for the earliest
 * stop string, and otherwise declares final the longest prefix that
 * neither ends in the start of a stop string nor cuts a character (the
 * characters' starts known from how the text was built). Hand-made cases
 * (stop strings and characters split across pieces, a stop string made of
 * multi-byte characters, several stop strings, empty text and pieces, an
 * echoed prefix) and seeded random ones. */
#include "test.h"
#include "core/streamer.h"
#include "util/rng.h"

#include <stdint.h>

enum { MAX_TEXT = 512 };

/* The text so far and where its characters start (is_start[i]: byte i
 * begins a character; is_start[len] = 1). */
typedef struct ref_text {
    char          b[MAX_TEXT + 1];
    size_t        len;
    unsigned char is_start[MAX_TEXT + 1];
} ref_text;

/* Marks the character starts of valid UTF-8 by the lead bytes' lengths
 * (for hand-made texts, whose characters were not recorded). */
static void ref_mark(ref_text *t)
{
    memset(t->is_start, 0, sizeof t->is_start);
    for (size_t i = 0; i < t->len;) {
        const unsigned char c = (unsigned char)t->b[i];
        t->is_start[i] = 1;
        i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    }
    t->is_start[t->len] = 1;
}

/* What the streamer must say once the text is t[0..n): 1 and *cut if a
 * stop string occurs in t[start..n) (cut: the earliest occurrence), else
 * 0 and *ok, the final bytes. */
static int ref_judge(const ref_text *t, size_t n, size_t start, const char *const *stop, int n_stop, size_t *cut,
                     size_t *ok)
{
    for (size_t p = start; p < n; p++)
        for (int i = 0; i < n_stop; i++) {
            const size_t ls = strlen(stop[i]);
            if (ls && p + ls <= n && memcmp(t->b + p, stop[i], ls) == 0) {
                *cut = p;
                return 1;
            }
        }
    size_t m = n;
    for (size_t q = start; q < n; q++) /* the earliest suffix that begins a stop string */
        for (int i = 0; i < n_stop; i++) {
            const size_t ls = strlen(stop[i]), k = n - q;
            if (k < ls && memcmp(t->b + q, stop[i], k) == 0 && q < m) m = q;
        }
    while (m > start && !t->is_start[m]) m--;
    *ok = m;
    return 0;
}

/* Feeds t[start..) in pieces ending at ends[0..n_pieces) through a
 * streamer (t[0..start) is already in the buffer, as an echoed prompt) and
 * checks each step, and the flush, against the reference. Returns the
 * number of failed checks' cases (0 when all agree). */
static int run_case(const char *name, const ref_text *t, size_t start, const size_t *ends, int n_pieces,
                    const char *const *stop, int n_stop)
{
    text_buf buf = { 0 };
    int bad = 0;
    CHECK(text_append(&buf, t->b, start) == 0, "%s: buffer", name);
    streamer st;
    streamer_init(&st, stop, n_stop, start);
    text_buf sent = { 0 }; /* what a client would have seen */
    CHECK(text_append(&sent, t->b, start) == 0, "%s: sent", name);
    size_t from = start, was_ok = st.ok;
    int stopped = 0;
    for (int k = 0; k < n_pieces && !stopped; k++) {
        const size_t end = ends[k];
        const int rc = streamer_feed(&st, &buf, t->b + from, end - from);
        from = end;
        size_t cut = 0, ok = 0;
        const int want = ref_judge(t, end, start, stop, n_stop, &cut, &ok);
        if (rc != want) {
            CHECK(rc == want, "%s: piece %d: feed says %d, the reference %d", name, k, rc, want);
            bad++;
            break;
        }
        if (want) {
            stopped = 1;
            const int same = buf.len == cut && st.ok == cut && buf.data[cut] == 0;
            bad += !same;
            CHECK(same, "%s: piece %d: cut at %zu (ok %zu), want %zu",
                  name, k, buf.len, st.ok, cut);
        } else {
            const int same = st.ok == ok && buf.len == end && memcmp(buf.data, t->b, end) == 0;
            bad += !same;
            CHECK(same,
                  "%s: piece %d: ok %zu, want %zu (text %zu bytes, want %zu)", name, k, st.ok, ok, buf.len, end);
        }
        CHECK(st.ok >= was_ok, "%s: piece %d: final bytes never shrink", name, k);
        if (st.ok > sent.len) text_append(&sent, buf.data + sent.len, st.ok - sent.len);
        was_ok = st.ok;
    }
    size_t cut = 0, ok = 0;
    const size_t all = n_pieces ? ends[n_pieces - 1] : start;
    if (!stopped) {
        CHECK(ref_judge(t, all, start, stop, n_stop, &cut, &ok) == 0, "%s: no stop", name);
        CHECK(streamer_flush(&st, &buf) == all && st.ok == all, "%s: flush makes all %zu bytes final", name, all);
        if (st.ok > sent.len) text_append(&sent, buf.data + sent.len, st.ok - sent.len);
    }
    CHECK(sent.len == buf.len && (!sent.len || memcmp(sent.data, buf.data, sent.len) == 0),
          "%s: the streamed bytes are the text", name);
    free(sent.data);
    free(buf.data);
    return bad;
}

/* A hand-made case: text s, cut into pieces after the given byte counts
 * (ends, ascending, the last = strlen(s)), after `start` echoed bytes. */
static void hand(const char *name, const char *s, size_t start, const size_t *ends, int n_pieces, const char *const *stop,
                 int n_stop)
{
    ref_text t;
    t.len = strlen(s);
    memcpy(t.b, s, t.len + 1);
    ref_mark(&t);
    run_case(name, &t, start, ends, n_pieces, stop, n_stop);
}

/* One specific outcome a reader can check by eye, besides the reference. */
static void expect(const char *name, const char *s, const size_t *ends, int n_pieces, const char *const *stop, int n_stop,
                   int want_rc, const char *want_text, const size_t *want_ok)
{
    text_buf buf = { 0 };
    streamer st;
    streamer_init(&st, stop, n_stop, 0);
    size_t from = 0;
    int rc = 0;
    for (int k = 0; k < n_pieces && !rc; k++) {
        rc = streamer_feed(&st, &buf, s + from, ends[k] - from);
        from = ends[k];
        if (want_ok && !rc) CHECK(st.ok == want_ok[k], "%s: piece %d: ok %zu, want %zu", name, k, st.ok, want_ok[k]);
    }
    if (!rc) streamer_flush(&st, &buf);
    CHECK(rc == want_rc && buf.len == strlen(want_text) && (!buf.len || !memcmp(buf.data, want_text, buf.len)),
          "%s: rc %d text '%.*s', want %d '%s'", name, rc, (int)buf.len, buf.data ? buf.data : "", want_rc, want_text);
    free(buf.data);
}

static void hand_cases(void)
{
    /* a stop string split across pieces: "wor" is held until "ld" ends it */
    const char *s1[] = { "world" };
    const size_t e1[] = { 8, 10, 13 }, ok1[] = { 7, 7 };
    expect("split stop", "hello, world!", e1, 3, s1, 1, 1, "hello, ", ok1);
    hand("split stop", "hello, world!", 0, e1, 3, s1, 1);
    /* a held start that turns out not to be the stop is released */
    const size_t e1b[] = { 3, 6 }, ok1b[] = { 2, 6 };
    expect("false start", "awowx", (const size_t[]){ 3, 5 }, 2, s1, 1, 0, "awowx", NULL);
    expect("released", "a woxy", e1b, 2, (const char *const[]){ "wox!" }, 1, 0, "a woxy", ok1b);
    /* a character split across pieces: its first bytes wait */
    const char *t2 = "caf\xC3\xA9 \xE6\x97\xA5\xF0\x9F\x98\x80!";
    const size_t e2[] = { 4, 5, 7, 8, 9, 11, 12, 13, 14 }, ok2[] = { 3, 5, 6, 6, 9, 9, 9, 13, 14 };
    expect("split chars", t2, e2, 9, NULL, 0, 0, t2, ok2);
    hand("split chars", t2, 0, e2, 9, NULL, 0);
    /* a stop string of multi-byte characters, its bytes split anyhow */
    const char *s3[] = { "\xE6\x97\xA5\xE6\x9C\xAC" }; /* "日本" */
    const char *t3 = "x\xE6\x97\xA5\xE6\x97\xA5\xE6\x9C\xAC!";
    const size_t e3[] = { 2, 3, 5, 8, 10, 11 }, ok3[] = { 1, 1, 1, 4 };
    expect("multi-byte stop", t3, e3, 6, s3, 1, 1, "x\xE6\x97\xA5", ok3);
    hand("multi-byte stop", t3, 0, e3, 6, s3, 1);
    /* a stop string ending inside a character and one starting there: the
     * held bytes are both a stop's start and a cut character */
    const char *s4[] = { "f\xC3\xA9!" };
    const char *t4 = "caf\xC3\xA9?caf\xC3\xA9!";
    const size_t e4[] = { 4, 6, 10, 11, 12 }, ok4[] = { 2, 6, 8, 8 };
    expect("stop across a character", t4, e4, 5, s4, 1, 1, "caf\xC3\xA9?ca", ok4);
    hand("stop across a character", t4, 0, e4, 5, s4, 1);
    /* a stop string made of a character's trailing bytes (no valid text
     * has one there, but a byte-level stop still matches bytes) */
    const char *s5[] = { "\xA9" };
    const size_t e5[] = { 4, 6 };
    expect("stop inside a character", "caf\xC3\xA9!", e5, 2, s5, 1, 1, "caf\xC3", NULL);
    /* several stop strings: the earliest in the text wins, whatever the
     * list's order; the longest held start holds */
    const char *s6[] = { "lazy", "brown", "quick b" };
    const char *t6 = "the quick brown fox";
    const size_t e6[] = { 5, 9, 12, 19 }, ok6[] = { 4, 4, 4 };
    expect("earliest of several", t6, e6, 4, s6, 3, 1, "the ", ok6);
    hand("earliest of several", t6, 0, e6, 4, s6, 3);
    const char *s6b[] = { "own", "brown fox" };
    expect("earliest, later listed", "a brown fox", (const size_t[]){ 11 }, 1, s6b, 2, 1, "a ", NULL);
    /* empty text, empty pieces, an empty stop string (never matches) */
    const char *s7[] = { "", "x" };
    expect("empty", "", (const size_t[]){ 0, 0 }, 2, s7, 2, 0, "", (const size_t[]){ 0, 0 });
    hand("empty", "", 0, (const size_t[]){ 0 }, 1, s7, 2);
    hand("empty pieces", "ab", 0, (const size_t[]){ 0, 1, 1, 2, 2 }, 5, s7, 2);
    /* flush at the end: a held stop start and a cut character go out */
    expect("flush", "x wor", (const size_t[]){ 5 }, 1, s1, 1, 0, "x wor", (const size_t[]){ 2 });
    expect("flush a cut character", "x \xE6\x97", (const size_t[]){ 4 }, 1, s1, 1, 0, "x \xE6\x97",
           (const size_t[]){ 2 });
    /* an echoed prefix: it holds a stop string and ends in one's start,
     * neither of which counts */
    const char *s8[] = { "stop", "end" };
    hand("echo", "stop en then end.", 7, (const size_t[]){ 9, 14, 17 }, 3, s8, 2);
    hand("echo, a stop across its end", "stop end more", 6, (const size_t[]){ 8, 13 }, 2, s8, 2);
}

/* Characters of 1 to 4 bytes a random text is made of. */
static const char *const alphabet[] = { "a", "b", " ", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "ab", "\n" };
enum { N_ALPHA = sizeof alphabet / sizeof alphabet[0] };

static void random_cases(void)
{
    uint64_t rng = 42;
    const int n_cases = test_quick() ? 300 : 3000;
    int bad = 0;
    for (int c = 0; c < n_cases && bad < 5; c++) {
        ref_text t;
        memset(&t, 0, sizeof t);
        const int n_chars = (int)(rng_splitmix64(&rng) % 40);
        for (int i = 0; i < n_chars; i++) {
            const char *ch = alphabet[rng_splitmix64(&rng) % N_ALPHA];
            const size_t l = strlen(ch);
            for (size_t j = 0; j < l; j++) t.is_start[t.len + j] = j == 0 || ch == alphabet[6];
            memcpy(t.b + t.len, ch, l);
            t.len += l;
        }
        t.is_start[t.len] = 1;
        /* stop strings: pieces of the text itself (so they often match,
         * also from inside a character), or short byte strings */
        char stops[4][16];
        const char *stop[4];
        const int n_stop = (int)(rng_splitmix64(&rng) % 5);
        for (int i = 0; i < n_stop; i++) {
            size_t l = 1 + rng_splitmix64(&rng) % 6;
            if (t.len && rng_splitmix64(&rng) % 3) {
                const size_t at = rng_splitmix64(&rng) % t.len;
                if (l > t.len - at) l = t.len - at;
                memcpy(stops[i], t.b + at, l);
            } else {
                for (size_t j = 0; j < l; j++) stops[i][j] = "ab \xC3\xA9\xE6"[rng_splitmix64(&rng) % 6];
            }
            stops[i][l] = 0;
            stop[i] = stops[i];
        }
        /* an echoed prefix now and then, then pieces of 0 to 5 bytes */
        size_t start = 0;
        if (t.len && rng_splitmix64(&rng) % 4 == 0) {
            start = rng_splitmix64(&rng) % (t.len + 1);
            while (!t.is_start[start]) start--;
        }
        size_t ends[MAX_TEXT + 1];
        int n_pieces = 0;
        for (size_t at = start; (at < t.len || n_pieces == 0) && n_pieces < MAX_TEXT;) {
            size_t step = rng_splitmix64(&rng) % 6;
            if (step > t.len - at) step = t.len - at;
            at += step;
            ends[n_pieces++] = at;
        }
        char name[32];
        snprintf(name, sizeof name, "random %d", c);
        bad += run_case(name, &t, start, ends, n_pieces, stop, n_stop) != 0;
    }
    CHECK(bad == 0, "%d random cases disagree with the reference", bad);
}

int main(void)
{
    hand_cases();
    random_cases();
    return test_summary("test_streamer");
}
