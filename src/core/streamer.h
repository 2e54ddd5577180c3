/* streamer.h - the one streamer of generated text (sparq_generate's
 * on_text, the server's replies): token pieces go in, and out comes how
 * much of the text is final. A stop string cuts the text before it; bytes
 * that may begin a stop string, or that begin a UTF-8 character the next
 * piece finishes, are held back until they cannot, so no reader ever sees
 * part of a stop string or half a character. */
#ifndef SPARQ_STREAMER_H
#define SPARQ_STREAMER_H

#include "util/textbuf.h"

#include <stddef.h>

typedef struct streamer {
    const char *const *stop; /* [n_stop], borrowed; "" never matches       */
    int    n_stop;
    size_t start;            /* where the streamed text starts in the buffer
                              * (the bytes before, e.g. an echoed prompt,
                              * are final and never searched)             */
    size_t ok;               /* bytes of the buffer that are final         */
} streamer;

/* Streams the text appended to a buffer from start on (its length now). */
void streamer_init(streamer *st, const char *const *stop, int n_stop, size_t start);

/* Appends piece[0..len) to t. Returns 1 if a stop string now appears in
 * the streamed text: t is cut before the earliest one and all of it is
 * final; 0 if none does: st->ok is what is final now (it only grows); -1
 * when out of memory (t unchanged). */
int streamer_feed(streamer *st, text_buf *t, const char *piece, size_t len);

/* The end of the text (no piece follows): every byte is final, held back
 * or not. Returns st->ok, now t->len. */
size_t streamer_flush(streamer *st, const text_buf *t);

#endif
