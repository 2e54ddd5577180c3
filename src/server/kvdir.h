/* kvdir.h - `sparq serve --kv-dir DIR`: the prefix cache's entries as
 * content-addressed KV files in a directory that several replicas may share.
 *
 * A file's name is a 128-bit hash of the model fingerprint, the KV element
 * type and the prefix's token ids (DIR/<32 hex>.kv), so equal prefixes of
 * the same model meet at one name and anything else cannot. Written under a
 * unique dot-name (this process, a counter) and renamed into place: a
 * reader never sees half a file, and two replicas writing the same prefix
 * at once each rename a complete file. A reader maps the file
 * (sparq_context_load_kv, checksums verified), copies the prefix into
 * memory at once (the prefix cache's shared copy, or the request's
 * context without one) and unmaps it, so this process holds no mapping between
 * requests; a file another replica deletes meanwhile stays valid for a
 * reader that has it open (Unix unlink semantics), so the size budget can
 * delete least recently used files (mtime, touched on every use) freely.
 * A loaded file's stored token ids must equal the prompt's: the hash names
 * the file, it is not trusted to prove what is in it (no cache poisoning by
 * a crafted collision).
 *
 * A request may name its document ("sparq": {"prefix_id": ID}): its file
 * is then DIR/<hash of the fingerprint, the KV type and ID>.kv (a separate
 * hash domain from token names), found without knowing where the document
 * ends; the stored token ids still decide how much of it a prompt uses.
 */
#ifndef SPARQ_SRV_KVDIR_H
#define SPARQ_SRV_KVDIR_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"
#include "io/kvfile.h"

typedef struct srv_kvdir {
    const char *dir;
    size_t      budget;      /* bytes; 0 = unlimited                        */
    uint64_t    salt[2];     /* the model fingerprint and KV type, hashed   */
    kvf_fingerprint fp;      /* what a file must have been made with         */
    unsigned    seq;         /* temp-name counter (the writer thread only)  */
} srv_kvdir;

/* Hashes the model's fingerprint and kv_type into kd->salt. */
void kvdir_init(srv_kvdir *kd, const char *dir, size_t budget, const sparq_model *m, int kv_type);
/* DIR/<hash of tokens[0..n)>.kv into path. */
void kvdir_path(const srv_kvdir *kd, const int32_t *tokens, int n, char *path, size_t size);
/* DIR/<hash of the name id>.kv into path. */
void kvdir_path_named(const srv_kvdir *kd, const char *id, char *path, size_t size);
/* Saves c (exactly the n prefix tokens) unless the file exists (id: under
 * that name; replace: even if it exists); then applies the budget. 1 if a
 * file was written, 0 if present, -1 on error. */
int  kvdir_save(srv_kvdir *kd, sparq_context *c, const int32_t *tokens, int n, const char *id, int replace,
                int *evicted, char *err, size_t err_size);
/* Loads the file of tokens[0..n) if present (a copy is what callers keep);
 * NULL if absent or unusable (an unusable file - corrupt, another model's,
 * or holding other tokens than tokens[0..n) - is removed). Touches its
 * mtime (the LRU order). */
sparq_context *kvdir_load(const srv_kvdir *kd, sparq_model *m, const int32_t *tokens, int n);
/* The file named id, if present and usable: *use is how many of its
 * positions the prompt ids[n] starts with (a multiple of nb, short of n).
 * NULL if absent or unusable; *use = 0 and *stale = 1 if present but the
 * prompt does not start with its first nb tokens (another document now). */
sparq_context *kvdir_load_named(const srv_kvdir *kd, sparq_model *m, const char *id, const int32_t *ids, int n,
                                int nb, int *use, int *stale);

#endif
