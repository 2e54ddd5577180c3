/* srv_clock.h - the server's one clock: monotonic seconds, for deadlines,
 * timings and the writer's drain limit. A module of its own below the
 * scheduler, so the modules the scheduler drives (the sequences, the
 * prefix cache, the writer, /slots) read the time without calling back
 * into sched.c. */
#ifndef SPARQ_SRV_CLOCK_H
#define SPARQ_SRV_CLOCK_H

/* Seconds on CLOCK_MONOTONIC (only differences mean anything). */
double srv_now(void);

#endif
