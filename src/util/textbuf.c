/* textbuf.c - see textbuf.h. */
#include "util/textbuf.h"

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
    /* a FIFO or socket would block until a writer comes; character
     * devices stay allowed (/dev/null is a fine empty file) */
    struct stat st;
    if (stat(path, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode) || S_ISDIR(st.st_mode))) return NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
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
