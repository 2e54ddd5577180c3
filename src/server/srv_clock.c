/* srv_clock.c - monotonic seconds (srv_clock.h). */
#include "server/srv_clock.h"

#include <time.h>

double srv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
