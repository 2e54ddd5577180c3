/* kvdir.c - content-addressed prefix KV files shared by replicas (kvdir.h). */
#include "server/kvdir.h"
#include "core/model.h"
#include "io/kvfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Temp files older than this are left-overs of a crashed writer. */
enum { KVDIR_STALE_SECONDS = 3600 };

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void kvdir_init(srv_kvdir *kd, const char *dir, size_t budget, const sparq_model *m, int kv_type)
{
    memset(kd, 0, sizeof kd[0]);
    kd->dir = dir;
    kd->budget = budget;
    model_fingerprint(m, &kd->fp);
    const kvf_fingerprint fp = kd->fp;
    /* two independent 64-bit FNV-1a streams: 128 bits, collisions out of reach */
    const uint64_t seed[2] = { 0xcbf29ce484222325ull, 0x84222325cbf29ce4ull };
    for (int k = 0; k < 2; k++) {
        uint64_t h = seed[k];
        h = fnv(h, fp.arch, sizeof fp.arch);
        const int32_t shape[7] = { fp.n_layer, fp.n_head, fp.n_kv_head, fp.head_dim, fp.n_embd, fp.n_vocab, kv_type };
        h = fnv(h, shape, sizeof shape);
        h = fnv(h, &fp.model_hash, sizeof fp.model_hash);
        kd->salt[k] = h;
    }
}

void kvdir_path(const srv_kvdir *kd, const int32_t *tokens, int n, char *path, size_t size)
{
    uint64_t h[2];
    for (int k = 0; k < 2; k++) {
        h[k] = fnv(kd->salt[k], &n, sizeof n);
        h[k] = fnv(h[k], tokens, (size_t)n * sizeof *tokens);
    }
    snprintf(path, size, "%s/%016llx%016llx.kv", kd->dir, (unsigned long long)h[0], (unsigned long long)h[1]);
}

void kvdir_path_named(const srv_kvdir *kd, const char *id, char *path, size_t size)
{
    uint64_t h[2];
    const int tag = -1; /* token names start with their count, never -1 */
    for (int k = 0; k < 2; k++) {
        h[k] = fnv(kd->salt[k], &tag, sizeof tag);
        h[k] = fnv(h[k], id, strlen(id) + 1);
    }
    snprintf(path, size, "%s/%016llx%016llx.kv", kd->dir, (unsigned long long)h[0], (unsigned long long)h[1]);
}

static int is_kv_name(const char *name)
{
    const size_t n = strlen(name);
    return n == 35 && !strcmp(name + 32, ".kv") && strspn(name, "0123456789abcdef") == 32;
}

typedef struct kv_file_info {
    char   name[40];
    off_t  size;
    double mtime;            /* ns resolution: many files share a second */
} kv_file_info;

/* Deletes least recently used files (oldest mtime first) until the
 * directory's KV files fit the budget, and temp files of crashed writers.
 * keep: the file just written, never deleted here. Returns files deleted. */
static int kvdir_sweep(const srv_kvdir *kd, const char *keep)
{
    DIR *d = opendir(kd->dir);
    if (!d) return 0;
    kv_file_info *f = NULL;
    int n = 0, cap = 0, deleted = 0;
    size_t total = 0;
    const time_t now = time(NULL);
    struct dirent *e;
    char p[PATH_MAX];
    while ((e = readdir(d))) {
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", kd->dir, e->d_name);
        /* lstat: a symlink is judged as itself, not by what it points to */
        if (e->d_name[0] == '.' && strstr(e->d_name, ".part") && lstat(p, &st) == 0 &&
            now - st.st_mtime > KVDIR_STALE_SECONDS) {
            deleted += unlink(p) == 0;
            continue;
        }
        if (!is_kv_name(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        total += (size_t)st.st_size;
        if (!strcmp(p, keep)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            kv_file_info *g = realloc(f, (size_t)cap * sizeof *g);
            if (!g) break;
            f = g;
        }
        snprintf(f[n].name, sizeof f[n].name, "%.*s", (int)sizeof f[n].name - 1, e->d_name);
        f[n].size = st.st_size;
        f[n++].mtime = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
    }
    closedir(d);
    while (kd->budget && total > kd->budget && n > 0) {
        int lru = 0;
        for (int i = 1; i < n; i++)
            if (f[i].mtime < f[lru].mtime) lru = i;
        snprintf(p, sizeof p, "%s/%s", kd->dir, f[lru].name);
        if (unlink(p) == 0) deleted++;
        total -= (size_t)f[lru].size; /* gone, or another replica deleted it */
        f[lru] = f[--n];
    }
    free(f);
    return deleted;
}

int kvdir_save(srv_kvdir *kd, sparq_context *c, const int32_t *tokens, int n, const char *id, int replace,
               int *evicted, char *err, size_t err_size)
{
    char path[PATH_MAX], part[PATH_MAX];
    *evicted = 0;
    if (id) kvdir_path_named(kd, id, path, sizeof path);
    else kvdir_path(kd, tokens, n, path, sizeof path);
    if (!replace && access(path, F_OK) == 0) return 0;
    /* unique per writer, created exclusively (a symlink planted under the
     * name is unlinked, never written through) and renamed straight to its
     * KV name: a rename replaces whatever entry is there, it never follows
     * a symlink at the destination */
    snprintf(part, sizeof part, "%s/.%s.%ld.%u.part", kd->dir, strrchr(path, '/') + 1, (long)getpid(), kd->seq++);
    if (context_save_kv_as(c, path, part, NULL, tokens, n, err, err_size)) return -1;
    *evicted = kvdir_sweep(kd, path);
    return 1;
}

/* The context of the file at path if it holds token ids matching ids for
 * at least `need` positions (*match: how many, up to the file's n); NULL
 * otherwise (an unusable file is removed). exact: path is the name of
 * exactly ids[0..n), so a file holding any other tokens is no collision
 * but planted or damaged: it is removed too, or it would keep the name
 * from ever caching its prompt (a write skips a name that exists). */
static sparq_context *load_path(const srv_kvdir *kd, sparq_model *m, const char *path, const int32_t *ids, int n,
                                int need, int exact, int *match)
{
    char err[256];
    *match = 0;
    /* only files a writer renamed into place: a FIFO, device or symlink
     * planted under a KV name is left alone (never opened, never removed) */
    struct stat st;
    if (lstat(path, &st) != 0) return NULL;
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "serve: kv-dir: ignoring '%s': not a regular file\n", path);
        return NULL;
    }
    if (access(path, R_OK) != 0) return NULL;
    kvf_file *kf = NULL;
    int64_t stored = -1;
    if (kvf_open(path, &kd->fp, KVF_VERIFY_AUTO, &kf, err, sizeof err) == 0) {
        const int lim = kf->n_tokens < n ? (int)kf->n_tokens : n;
        int l = 0;
        while (kf->tokens && l < lim && kf->tokens[l] == ids[l]) l++;
        *match = l;
        stored = kf->n_tokens;
        kvf_close(kf);
        if (exact && (l < n || stored != n)) {
            fprintf(stderr, "serve: kv-dir: removing '%s': it holds other tokens than its name stands for\n", path);
            unlink(path);
            *match = 0;
            return NULL;
        }
        if (l < need || need <= 0) return NULL; /* another document under a prefix_id: prefill */
    }
    sparq_context_params cp = sparq_context_default_params();
    cp.n_threads = 1;
    sparq_context *c = NULL;
    if (sparq_context_load_kv(m, &cp, path, SPARQ_VERIFY_ALWAYS, &c, err, sizeof err)) {
        /* corrupt, or (a hash collision) another model's: nobody can use it */
        fprintf(stderr, "serve: kv-dir: removing unusable '%s': %s\n", path, err);
        unlink(path);
        *match = 0;
        return NULL;
    }
    if (sparq_context_pos(c) != stored) {
        sparq_context_free(c);
        *match = 0;
        return NULL;
    }
    utimensat(AT_FDCWD, path, NULL, 0); /* most recently used */
    return c;
}

sparq_context *kvdir_load(const srv_kvdir *kd, sparq_model *m, const int32_t *tokens, int n)
{
    char path[PATH_MAX];
    int match;
    kvdir_path(kd, tokens, n, path, sizeof path);
    sparq_context *c = load_path(kd, m, path, tokens, n, n, 1, &match);
    if (c && sparq_context_pos(c) != n) { /* a file of n tokens holds n positions */
        sparq_context_free(c);
        return NULL;
    }
    return c;
}

sparq_context *kvdir_load_named(const srv_kvdir *kd, sparq_model *m, const char *id, const int32_t *ids, int n,
                                int nb, int *use, int *stale)
{
    char path[PATH_MAX];
    int match;
    *use = 0;
    *stale = 0;
    kvdir_path_named(kd, id, path, sizeof path);
    const int lim = n - 1; /* the last prompt token is always prefilled */
    sparq_context *c = load_path(kd, m, path, ids, lim, nb, 0, &match);
    if (!c) {
        *stale = access(path, F_OK) == 0 && match < nb;
        return NULL;
    }
    *use = match / nb * nb;
    return c;
}
