/* cpu.h - how many threads a default run uses. */
#ifndef SPARQ_CPU_H
#define SPARQ_CPU_H

/* Physical cores, as llama.cpp counts them: the distinct
 * /sys/devices/system/cpu/cpuN/topology/thread_siblings_list sets (SMT siblings
 * share a core's execution units, so a second thread on one brings a
 * memory-bound decode nothing). Falls back to the online CPUs when /sys
 * says nothing. Always >= 1. */
int cpu_physical_cores(void);

#endif
