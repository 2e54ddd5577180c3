/* test_proc.h - what the tests that run other processes share (test_server,
 * test_deploy, test_hardening, test_webui, test_install, test_build, ...): a
 * monotonic clock, a loopback connect, waiting for a started `sparq serve` to
 * write the port it bound to its port file, starting and stopping one, and
 * running a shell command for its output and exit status.
 */
#ifndef SPARQ_TEST_PROC_H
#define SPARQ_TEST_PROC_H

#include <arpa/inet.h>
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A connected socket to 127.0.0.1:port, or -1. */
static inline int dial(int port)
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
static inline int wait_port_file(pid_t *pid, const char *port_file, int *port, useconds_t poll_us)
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

/* A `sparq serve` child: its output goes to log, the port it bound to port. */
typedef struct proc_server {
    pid_t pid;
    int   port;
    char  log[64], port_file[80];
} proc_server;

/* Starts `bin serve --port 0 --port-file ... args` (through sh, so args may
 * hold quotes) with stdout and stderr in a temporary log named after tag;
 * 0 once it listens, else -1 (pid -1 when it died or never started). */
static inline int proc_server_start(proc_server *s, const char *bin, const char *tag, const char *args)
{
    snprintf(s->log, sizeof s->log, "/tmp/sparq_test_%s_log_XXXXXX", tag);
    const int fd = mkstemp(s->log);
    s->pid = -1;
    if (fd < 0) return -1;
    snprintf(s->port_file, sizeof s->port_file, "%s.port", s->log);
    unlink(s->port_file);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s serve --port 0 --port-file %s %s", bin, s->port_file, args);
    s->pid = fork();
    if (s->pid < 0) {
        close(fd);
        return -1;
    }
    if (s->pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd);
    return wait_port_file(&s->pid, s->port_file, &s->port, 50000);
}

/* SIGTERM, then its exit status (-1 if it hangs for 20 s: then killed; the
 * log is kept then, to read why). */
static inline int proc_server_stop(proc_server *s)
{
    if (s->pid <= 0) return -1;
    kill(s->pid, SIGTERM);
    int st = 0;
    for (double t0 = now(); now() - t0 < 20;) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            unlink(s->port_file);
            unlink(s->log);
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        usleep(50000);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    return -1;
}

/* Runs a shell command (printf-style); the first out_size-1 bytes of its
 * stdout go to out, NUL-terminated, when out is not NULL, and the rest is
 * read and dropped so the command never blocks on a full pipe. Returns its
 * exit status, or -1 if it could not run or did not exit. */
__attribute__((format(printf, 3, 4)))
static inline int proc_sh(char *out, size_t out_size, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof cmd) return -1;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t len = 0;
    char sink[4096];
    for (;;) {
        const size_t room = out && out_size > 0 ? out_size - 1 - len : 0;
        char *dst = room ? out + len : sink;
        size_t got = fread(dst, 1, room ? room : sizeof sink, p);
        if (got == 0) break;
        if (room) len += got;
    }
    if (out && out_size > 0) out[len] = 0;
    int st = pclose(p);
    return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif
