/* paths.c - the model/data search path (see paths.h). */
#include "util/paths.h"
#include "util/err.h"

#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int try_path(const char *dir, size_t dir_len, const char *name, char *out, size_t out_size)
{
    int n = snprintf(out, out_size, "%.*s/%s", (int)dir_len, dir, name);
    if (n < 0 || (size_t)n >= out_size) return 0;
    return access(out, R_OK) == 0;
}

int path_find(const char *name, char *out, size_t out_size)
{
    if (!name || !out || out_size == 0) return -1;
    if (access(name, R_OK) == 0) {
        if (strlen(name) >= out_size) { out[0] = 0; return -1; }
        strcpy(out, name);
        return 0;
    }
    if (name[0] == '/') { /* absolute and absent: nowhere else to look */
        out[0] = 0;
        return -1;
    }
    const char *env = getenv("SPARQ_MODEL_PATH");
    while (env && *env) {
        const char *colon = strchr(env, ':');
        size_t len = colon ? (size_t)(colon - env) : strlen(env);
        if (len > 0 && try_path(env, len, name, out, out_size)) return 0;
        env = colon ? colon + 1 : NULL;
    }
    static const char *const defaults[] = { "../shared/models", "../shared" };
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (try_path(defaults[i], strlen(defaults[i]), name, out, out_size)) return 0;
    out[0] = 0;
    return -1;
}

const char *path_search_description(void)
{
    return "$SPARQ_MODEL_PATH, ../shared/models, ../shared";
}

static const char *kind_of(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket" : "a device";
}

int path_check_regular(const char *path, char *err, size_t err_size)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    return err_set(err, err_size, "'%s' is %s, not a regular file", path, kind_of(st.st_mode));
}

int path_open_regular(const char *path, int flags, char *err, size_t err_size)
{
    /* O_NOCTTY: a terminal device must not become the controlling one */
    const int fd = open(path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        err_set(err, err_size, "'%s': %s", path, strerror(e));
        errno = e;
        return -1;
    }
    struct stat st;
    int e = 0;
    if (fstat(fd, &st) != 0) {
        e = errno;
        err_set(err, err_size, "'%s': cannot stat: %s", path, strerror(e));
    } else if (!S_ISREG(st.st_mode)) {
        e = EINVAL;
        err_set(err, err_size, "'%s' is %s, not a regular file", path, kind_of(st.st_mode));
    } else if (!(flags & O_NONBLOCK)) {
        const int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
            e = errno;
            err_set(err, err_size, "'%s': fcntl: %s", path, strerror(e));
        }
    }
    if (e) {
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}
