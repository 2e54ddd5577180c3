/* paths.c - the model/data search path (see paths.h). */
#include "util/paths.h"
#include "util/err.h"

#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <dlfcn.h>
#include <limits.h>
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

int path_binary_dir(char *out, size_t out_size)
{
    char buf[PATH_MAX];
    int got = 0;
    /* The object this function is linked into: libsparq.so when the library
     * is shared (also under Python), else the executable, which dladdr names
     * "" and /proc/self/exe names exactly. */
    Dl_info info;
    if (dladdr((void *)path_binary_dir, &info) && info.dli_fname && info.dli_fname[0] &&
        realpath(info.dli_fname, buf))
        got = 1;
    if (!got) {
        ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
        if (n > 0) {
            buf[n] = 0;
            got = 1;
        }
    }
    char *slash = got ? strrchr(buf, '/') : NULL;
    if (!slash || (size_t)(slash - buf) >= out_size) {
        if (out_size) out[0] = 0;
        return -1;
    }
    memcpy(out, buf, (size_t)(slash - buf));
    out[slash - buf] = 0;
    return 0;
}

/* Beside the binary: build/sparq and build/libsparq.so find the checkout's
 * models/ (so a bare clone runs), an installed PREFIX/bin/sparq or
 * PREFIX/lib/libsparq.so finds PREFIX/share/sparq/models. */
static const char *const beside_binary[] = { "../models", "../share/sparq/models" };

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
    char bin[PATH_MAX], dir[PATH_MAX + 32];
    if (path_binary_dir(bin, sizeof bin) == 0)
        for (size_t i = 0; i < sizeof beside_binary / sizeof beside_binary[0]; i++) {
            int n = snprintf(dir, sizeof dir, "%s/%s", bin, beside_binary[i]);
            if (n > 0 && (size_t)n < sizeof dir && try_path(dir, (size_t)n, name, out, out_size)) return 0;
        }
    out[0] = 0;
    return -1;
}

int path_append_env(const char *dirs)
{
    const char *old = getenv("SPARQ_MODEL_PATH");
    if (!old || !*old) return setenv("SPARQ_MODEL_PATH", dirs, 1);
    size_t n = strlen(old) + 1 + strlen(dirs) + 1;
    char *v = malloc(n);
    if (!v) return -1;
    snprintf(v, n, "%s:%s", old, dirs);
    int rc = setenv("SPARQ_MODEL_PATH", v, 1);
    free(v);
    return rc;
}

const char *path_search_description(void)
{
    return "the name as given, $SPARQ_MODEL_PATH, then models/ and share/sparq/models/ beside the binary's directory";
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
