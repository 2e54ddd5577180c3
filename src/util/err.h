/* err.h - the one way a function reports a failure to its caller: a
 * one-line message in a caller-owned buffer and a -1 return.
 *
 *     if (n < 0) return err_set(err, err_size, "n %d < 0", n);
 *
 * err may be NULL (or err_size 0): the message is then dropped. */
#ifndef SPARQ_UTIL_ERR_H
#define SPARQ_UTIL_ERR_H

#include <stdarg.h>
#include <stddef.h>

int err_set(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int err_setv(char *err, size_t err_size, const char *fmt, va_list ap);

#endif
