/* utf8.h - the one UTF-8 encoder, validator and decoder (json.c, the
 * tokenizer, the CLI and the server share them). */
#ifndef SPARQ_UTF8_H
#define SPARQ_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Writes code point cp (<= 0x10FFFF) as 1..4 bytes to out; returns the
 * count. The caller keeps surrogates out if it needs valid UTF-8. */
size_t utf8_encode(uint32_t cp, char *out);

/* Length (1..4) of the valid UTF-8 sequence at s[0..avail), or 0 if the
 * bytes there are not one (overlong forms, surrogates, > U+10FFFF and
 * truncated sequences are all invalid). avail >= 1. */
size_t utf8_valid_len(const unsigned char *s, size_t avail);

/* Bytes at the end of s[0..n) that start a UTF-8 sequence not finished
 * there (0 to 3), judged by the lead byte's length alone: streamed text
 * is held back before them, so no one sees half a character. */
size_t utf8_incomplete_tail(const char *s, size_t n);

/* Where the character holding byte s[at] starts (at, unless s[at] is a
 * continuation byte): cutting s there splits no character. s[at] must be
 * readable. */
size_t utf8_char_start(const char *s, size_t at);

#endif
