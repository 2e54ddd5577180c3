/* paths.h - where sparq looks for models and data.
 *
 * One search path for everything that is not in the repo: each directory in
 * $SPARQ_MODEL_PATH (colon-separated), then ../shared/models, then ../shared
 * (so "stories260K.gguf" and "data/text/x.txt" both resolve). A name that
 * exists as given is returned unchanged; an absolute one is never searched.
 */
#ifndef SPARQ_PATHS_H
#define SPARQ_PATHS_H
#include <stddef.h>

/* Writes the first existing match for `name` into out[out_size].
 * Returns 0 on success, -1 if nothing matched (out then holds "") */
int path_find(const char *name, char *out, size_t out_size);

/* The search path as one human-readable string, for error messages. */
const char *path_search_description(void);

/* 0 if path names a regular file (after symlinks) or does not exist (the
 * open that follows reports that); -1 with a message if it is a FIFO,
 * device, socket or directory: opening a FIFO blocks until a writer
 * comes, so every file the engine reads is checked first. */
int path_check_regular(const char *path, char *err, size_t err_size);

#endif
