/* textbuf.h - a growable byte string and whole-file reading: the two text
 * chores several modules share. */
#ifndef SPARQ_TEXTBUF_H
#define SPARQ_TEXTBUF_H

#include <stddef.h>

/* Always NUL-terminated once something was appended; free(data) to drop. */
typedef struct text_buf {
    char  *data;
    size_t len, cap;
} text_buf;

/* Appends s[n]; returns 0, or -1 when out of memory (t unchanged). */
int text_append(text_buf *t, const char *s, size_t n);

/* Reads a whole file into a NUL-terminated malloc'ed buffer (*len bytes,
 * without the NUL). Returns NULL if it cannot be opened or read, or is a
 * FIFO, socket or directory (reading those blocks or misleads). */
char *text_read_file(const char *path, size_t *len);

#endif
