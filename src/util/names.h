/* names.h - a registry's names joined for help text and error messages
 * ("dense, sparq, oracle"): the attention policies, index kinds and eval
 * tasks all list themselves through names_join. */
#ifndef SPARQ_UTIL_NAMES_H
#define SPARQ_UTIL_NAMES_H

#include <stddef.h>

/* name_at(0 .. n-1) joined by sep into buf[size] (truncated, always
 * NUL-terminated when size > 0); returns buf. */
const char *names_join(char *buf, size_t size, const char *sep, int n, const char *(*name_at)(int i));

#endif
