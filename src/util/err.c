/* err.c - err_set: see err.h. */
#include "util/err.h"

#include <stdio.h>

int err_setv(char *err, size_t err_size, const char *fmt, va_list ap)
{
    if (err && err_size) vsnprintf(err, err_size, fmt, ap);
    return -1;
}

int err_set(char *err, size_t err_size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_setv(err, err_size, fmt, ap);
    va_end(ap);
    return -1;
}
