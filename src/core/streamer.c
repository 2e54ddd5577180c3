/* streamer.c - see streamer.h. */
#include "core/streamer.h"
#include "util/utf8.h"

#include <stdint.h>
#include <string.h>

void streamer_init(streamer *st, const char *const *stop, int n_stop, size_t start)
{
    st->stop = n_stop > 0 ? stop : NULL;
    st->n_stop = n_stop > 0 ? n_stop : 0;
    st->start = start;
    st->ok = start;
}

/* The earliest stop string in t[start..n) that ends after `before` (an
 * earlier one would have stopped an earlier piece): where it starts, or
 * SIZE_MAX. */
static size_t find_stop(const streamer *st, const char *t, size_t n, size_t before)
{
    size_t best = SIZE_MAX;
    for (int i = 0; i < st->n_stop; i++) {
        const size_t ls = strlen(st->stop[i]);
        if (ls == 0 || n - st->start < ls) continue;
        size_t p = before >= st->start + ls ? before - ls + 1 : st->start;
        for (; p + ls <= n && p < best; p++)
            if (memcmp(t + p, st->stop[i], ls) == 0) {
                best = p;
                break;
            }
    }
    return best;
}

/* Bytes at the end of t[start..n) that begin some stop string (at most
 * its length - 1): they wait for the next piece to show whether it
 * follows. */
static size_t stop_prefix_tail(const streamer *st, const char *t, size_t n)
{
    size_t hold = 0;
    for (int i = 0; i < st->n_stop; i++) {
        const size_t ls = strlen(st->stop[i]);
        for (size_t k = ls > 0 ? ls - 1 : 0; k > hold; k--)
            if (k <= n - st->start && memcmp(t + n - k, st->stop[i], k) == 0) {
                hold = k;
                break;
            }
    }
    return hold;
}

int streamer_feed(streamer *st, text_buf *t, const char *piece, size_t len)
{
    const size_t before = t->len;
    if (len > 0 && text_append(t, piece, len)) return -1;
    if (!t->data) return 0; /* nothing appended yet: nothing to judge */
    const size_t hit = find_stop(st, t->data, t->len, before);
    if (hit != SIZE_MAX) {
        t->len = hit;
        t->data[t->len] = 0;
        st->ok = t->len;
        return 1;
    }
    size_t ok = t->len - stop_prefix_tail(st, t->data, t->len);
    ok -= utf8_incomplete_tail(t->data + st->start, ok - st->start);
    if (ok > st->ok) st->ok = ok;
    return 0;
}

size_t streamer_flush(streamer *st, const text_buf *t)
{
    st->ok = t->len;
    return st->ok;
}
