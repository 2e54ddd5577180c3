/* cpu.c - the physical core count (see cpu.h). */
#include "util/cpu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define CPU_MAX_SETS 1024

int cpu_physical_cores(void)
{
    /* the sibling masks seen so far; a machine with more distinct cores
     * than this keeps counting but stops remembering (an overcount only
     * if masks repeat after that) */
    char seen[CPU_MAX_SETS][64];
    int n_seen = 0, n_cores = 0;
    for (int cpu = 0;; cpu++) {
        char path[96], mask[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", cpu);
        FILE *f = fopen(path, "r");
        if (!f) break;
        const int ok = fgets(mask, sizeof mask, f) != NULL;
        fclose(f);
        if (!ok) continue;
        mask[strcspn(mask, "\n")] = 0;
        int dup = 0;
        for (int i = 0; i < n_seen && !dup; i++) dup = strcmp(seen[i], mask) == 0;
        if (dup) continue;
        n_cores++;
        if (n_seen < CPU_MAX_SETS) snprintf(seen[n_seen++], sizeof seen[0], "%s", mask);
    }
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (n_cores <= 0) return online > 0 ? (int)online : 1;
    return online > 0 && online < n_cores ? (int)online : n_cores;
}
