/* paths.h - where sparq looks for models and data.
 *
 * One search path for everything: a name that exists as given is returned
 * unchanged (an absolute one is never searched); then each directory in
 * $SPARQ_MODEL_PATH (colon-separated); then models/ beside the directory of
 * the binary (the shared library, or the executable it is linked into):
 * build/sparq finds the checkout's models/, and an installed
 * PREFIX/bin/sparq finds PREFIX/share/sparq/models. The library knows no
 * directory relative to the working directory, and neither does the
 * command: a development layout (reference data in ../shared beside the
 * checkout) is added by the tests (path_append_env) and the scripts
 * (SPARQ_MODEL_PATH), never built in.
 */
#ifndef SPARQ_PATHS_H
#define SPARQ_PATHS_H
#include <stddef.h>

/* Writes the first existing match for `name` into out[out_size].
 * Returns 0 on success, -1 if nothing matched (out then holds "") */
int path_find(const char *name, char *out, size_t out_size);

/* The directory of the binary this code is linked into (libsparq.so, or
 * the executable). Returns 0, or -1 with out = "". */
int path_binary_dir(char *out, size_t out_size);

/* Appends dirs ("a:b") to $SPARQ_MODEL_PATH, after what the user set, so
 * the user's directories are searched first. Returns 0, or -1. */
int path_append_env(const char *dirs);

/* The search path as one human-readable string, for error messages. */
const char *path_search_description(void);

/* 0 if path names a regular file (after symlinks) or does not exist (the
 * open that follows reports that); -1 with a message if it is a FIFO,
 * device, socket or directory: opening a FIFO blocks until a writer
 * comes, so every file the engine reads is checked first. */
int path_check_regular(const char *path, char *err, size_t err_size);

/* open(path, flags) for reading a file that must be a regular one: the
 * open itself never blocks (O_NONBLOCK, cleared again once fstat has shown
 * a regular file), so a FIFO, device, socket or directory put where a file
 * is expected is refused at once, with no window between a check and the
 * open. Returns the descriptor (O_CLOEXEC), or -1 with "'path': why" in err
 * and errno set (EINVAL for a file of the wrong kind). */
int path_open_regular(const char *path, int flags, char *err, size_t err_size);

#endif
