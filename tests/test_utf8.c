/* test_utf8.c - util/utf8: the encoder against the code point ranges'
 * byte patterns, and the unfinished-tail count and a byte's character
 * start against where each character of a text starts (known from
 * building the text). */
#include "test.h"
#include "util/utf8.h"

#include <stdint.h>

/* Characters of 1, 2, 3 and 4 bytes and where each range begins and ends. */
static const uint32_t cps[] = { 0x24, 0x7F, 0x80, 0xA2, 0x7FF, 0x800, 0x20AC, 0xFFFF, 0x10000, 0x10348, 0x10FFFF };

static size_t len_of(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

int main(void)
{
    char text[64];
    size_t starts[16], n = 0;
    int n_chars = 0;
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        char b[4];
        const size_t len = utf8_encode(cps[i], b);
        CHECK(len == len_of(cps[i]), "U+%04X: %zu bytes", (unsigned)cps[i], len);
        CHECK(utf8_valid_len((const unsigned char *)b, len) == len, "U+%04X reads back as one character",
              (unsigned)cps[i]);
        starts[n_chars++] = n;
        memcpy(text + n, b, len);
        n += len;
    }
    /* every cut: the tail is the bytes of the character the cut splits */
    for (size_t cut = 0; cut <= n; cut++) {
        size_t want = 0;
        for (int c = 0; c < n_chars; c++) {
            const size_t end = c + 1 < n_chars ? starts[c + 1] : n;
            if (starts[c] < cut && cut < end) want = cut - starts[c];
        }
        CHECK(utf8_incomplete_tail(text, cut) == want, "cut at %zu: tail %zu, want %zu", cut,
              utf8_incomplete_tail(text, cut), want);
    }
    /* a lone continuation byte run is no character's start: nothing held */
    CHECK(utf8_incomplete_tail("\x80\x80\x80\x80", 4) == 0, "continuations only");
    CHECK(utf8_incomplete_tail("", 0) == 0, "empty");
    /* every byte: the character holding it starts where the text was built
     * to start it */
    for (size_t at = 0; at < n; at++) {
        size_t want = 0;
        for (int c = 0; c < n_chars; c++)
            if (starts[c] <= at) want = starts[c];
        CHECK(utf8_char_start(text, at) == want, "byte %zu: starts at %zu, want %zu", at, utf8_char_start(text, at),
              want);
    }
    return test_summary("test_utf8");
}
