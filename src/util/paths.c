/* paths.c - the model/data search path (see paths.h). */
#include "util/paths.h"
#include "util/err.h"

#include <sys/stat.h>

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

int path_check_regular(const char *path, char *err, size_t err_size)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return 0;
    const char *what = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode) ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket" : "a device";
    return err_set(err, err_size, "'%s' is %s, not a regular file", path, what);
}
