/* test_proc.h - what the tests that run servers share (test_server,
 * test_deploy): a monotonic clock, a loopback connect, and waiting for a
 * started `sparq serve` to write the port it bound to its port file.
 */
#ifndef SPARQ_TEST_PROC_H
#define SPARQ_TEST_PROC_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A connected socket to 127.0.0.1:port, or -1. */
static int dial(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    return fd;
}

/* Waits up to 60 s (loading under load can be slow) for the server *pid to
 * write its port to port_file: 0 and *port, or -1 (*pid = -1 when it died). */
static int wait_port_file(pid_t *pid, const char *port_file, int *port, useconds_t poll_us)
{
    for (double t0 = now(); now() - t0 < 60;) {
        FILE *f = fopen(port_file, "r");
        if (f) {
            int ok = fscanf(f, "%d", port) == 1;
            fclose(f);
            if (ok) return 0;
        }
        int st;
        if (waitpid(*pid, &st, WNOHANG) == *pid) {
            *pid = -1;
            return -1;
        }
        usleep(poll_us);
    }
    return -1;
}

#endif
