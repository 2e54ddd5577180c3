/* sysmem.h - what the machine's memory allows, for choices that depend on
 * it (a KV cache in a file rather than in RAM, reading an index image in
 * at once or page by page, benchmark sizes). */
#ifndef SPARQ_UTIL_SYSMEM_H
#define SPARQ_UTIL_SYSMEM_H

#include <stdint.h>

/* MemAvailable of /proc/meminfo in bytes (memory the kernel can give
 * without swapping, page cache included); 0 if unknown. */
int64_t sysmem_available(void);

#endif
