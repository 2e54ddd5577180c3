/* eval_file.c - eval_file.h: a bounded whole-file read that refuses what
 * is not a regular file.
 */
#include "eval/eval_file.h"
#include "util/err.h"
#include "util/textbuf.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

int eval_read_file(const char *path, char **text, size_t *n, char *err, size_t err_size)
{
    *text = NULL;
    *n = 0;
    /* a FIFO or device would block or never end: only regular files */
    struct stat st;
    if (stat(path, &st) != 0) return err_set(err, err_size, "cannot open '%s' (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return err_set(err, err_size, "'%s' is not a regular file", path);
    if ((uint64_t)st.st_size > EVAL_MAX_FILE_BYTES)
        return err_set(err, err_size, "'%s' is larger than %llu bytes", path, (unsigned long long)EVAL_MAX_FILE_BYTES);
    if (!(*text = text_read_file(path, n)))
        return err_set(err, err_size, "cannot read '%s' (%s)", path, errno ? strerror(errno) : "read error");
    return 0;
}
