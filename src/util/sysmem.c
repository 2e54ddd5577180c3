/* sysmem.c - the machine's memory (sysmem.h). */
#include "util/sysmem.h"

#include <stdio.h>

int64_t sysmem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb > 0 ? (int64_t)kb * 1024 : 0;
}
