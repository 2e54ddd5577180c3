/* eval_file.h - reading a whole data or text file for the evaluation
 * harness (eval.h) and the task readers (tasks.h), with one size limit.
 *
 * Below both: eval.h includes tasks.h for the task table, so the file
 * reading the tasks also need cannot live in eval.c.
 */
#ifndef SPARQ_EVAL_FILE_H
#define SPARQ_EVAL_FILE_H

#include <stddef.h>
#include <stdint.h>

/* Reads a whole regular file of at most EVAL_MAX_FILE_BYTES into a malloc'd
 * NUL-terminated buffer (*text, caller frees; *n bytes). Returns 0, or -1
 * with a message (a FIFO or device is refused, not waited on). */
#define EVAL_MAX_FILE_BYTES ((uint64_t)1 << 31)
int eval_read_file(const char *path, char **text, size_t *n, char *err, size_t err_size);

#endif
