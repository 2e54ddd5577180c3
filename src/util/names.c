/* names.c - names_join: see names.h. */
#include "util/names.h"

#include <stdio.h>

const char *names_join(char *buf, size_t size, const char *sep, int n, const char *(*name_at)(int i))
{
    size_t used = 0;
    if (size) buf[0] = 0;
    for (int i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%s", i ? sep : "", name_at(i));
        if (w < 0) break;
        used += (size_t)w;
    }
    return buf;
}
