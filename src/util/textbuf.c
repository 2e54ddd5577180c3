/* textbuf.c - see textbuf.h. */
#include "util/textbuf.h"
#include "util/paths.h"

#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int text_append(text_buf *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *d = realloc(t->data, cap);
        if (!d) return -1;
        t->data = d;
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = 0;
    return 0;
}

char *text_read_file(const char *path, size_t *len)
{
    /* a FIFO or socket would block until a writer comes; the open itself
     * must not block either (a check before it would leave a window) */
    const int fd = path_open_regular(path, O_RDONLY, NULL, 0);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    text_buf t = { 0 };
    char chunk[1 << 16];
    size_t got;
    int bad = text_append(&t, "", 0);
    while (!bad && (got = fread(chunk, 1, sizeof chunk, f)) > 0) bad = text_append(&t, chunk, got);
    bad |= ferror(f);
    fclose(f);
    if (bad) {
        free(t.data);
        return NULL;
    }
    *len = t.len;
    return t.data;
}
