/* index.c - the index kinds' registry and everything that does not depend on
 * a kind: finding a kind by name, the name lists for help and errors, the
 * public entry points (idx_build / idx_search / idx_(de)serialize / idx_free)
 * that check their arguments and dispatch through the kind's methods, the
 * serialized image's header reader, aligned copies and the search scratch's
 * life (what the kinds call back, the image's framing and the scratch's
 * growth, is index_common.c's, below them).
 *
 * Adding a kind = one file index_NAME.c defining `const idx_kind_ops
 * idx_kind_NAME` and one line in `kinds[]` below. No kind file calls
 * another kind's file.
 */
#include "util/err.h"
#include "util/names.h"
#include "index/index.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the registry --------------------------------------------------------------- */

static const idx_kind_ops *const kinds[] = {
    &idx_kind_exact,
    &idx_kind_ivf,
    &idx_kind_hnsw,
};
enum { N_KINDS = (int)(sizeof kinds / sizeof kinds[0]) };

int idx_kind_count(void) { return N_KINDS; }

const idx_kind_ops *idx_kind_at(int i) { return i >= 0 && i < N_KINDS ? kinds[i] : NULL; }

const idx_kind_ops *idx_kind_find(const char *name)
{
    for (int i = 0; name && i < N_KINDS; i++)
        if (strcmp(kinds[i]->name, name) == 0) return kinds[i];
    return NULL;
}

static const idx_kind_ops *kind_by_id(uint32_t id)
{
    for (int i = 0; i < N_KINDS; i++)
        if (kinds[i]->id == id) return kinds[i];
    return NULL;
}

static const char *kind_name(int i) { return kinds[i]->name; }

const char *idx_kind_names(char *buf, size_t size, const char *sep)
{
    return names_join(buf, size, sep, N_KINDS, kind_name);
}

/* ---- the serialized image's framing ------------------------------------------------ */

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static int header_read(idx_header *h, const uint8_t *src, size_t n, char *err, size_t err_size)
{
    if (n < IDX_HEADER_BYTES)
        return err_set(err, err_size, "idx_deserialize: %zu bytes is shorter than the %d-byte header",
                    n, IDX_HEADER_BYTES);
    if (memcmp(src, IDX_MAGIC, 8) != 0)
        return err_set(err, err_size, "idx_deserialize: bad magic (not a sparq index)");
    uint32_t ver = get32(src + 8);
    if (ver != 1) return err_set(err, err_size, "idx_deserialize: version %u, expected 1", ver);
    h->kind = get32(src + 12);
    h->key_type = get32(src + 16);
    h->d = get32(src + 20);
    h->n = (int64_t)get64(src + 24);
    h->total_bytes = get64(src + 32);
    h->n_blocks = (int64_t)get64(src + 40);
    int32_t f[7];
    for (int i = 0; i < 7; i++) f[i] = (int32_t)get32(src + 48 + 4 * i);
    h->nlist = f[0]; h->nprobe = f[1]; h->hnsw_m = f[2]; h->ef_search = f[3];
    h->ef_construction = f[4]; h->max_level = f[5]; h->entry_point = f[6];
    for (int i = 76; i < IDX_HEADER_BYTES; i++)
        if (src[i]) return err_set(err, err_size, "idx_deserialize: reserved header byte %d is not zero", i);
    if (!kind_by_id(h->kind))
        return err_set(err, err_size, "idx_deserialize: unknown index kind %u", h->kind);
    if (h->d < 1 || h->d > IDX_MAX_D)
        return err_set(err, err_size, "idx_deserialize: key dimension %u outside [1, %d]", h->d, IDX_MAX_D);
    if (h->n < 1 || h->n > INT32_MAX)
        return err_set(err, err_size, "idx_deserialize: key count %lld outside [1, %d]",
                    (long long)h->n, INT32_MAX);
    if (h->total_bytes != n)
        return err_set(err, err_size, "idx_deserialize: header says %llu bytes, buffer has %zu",
                    (unsigned long long)h->total_bytes, n);
    return 0;
}

/* ---- scratch ---------------------------------------------------------------------- */

idx_scratch *idx_scratch_create(void)
{
    return calloc(1, sizeof(idx_scratch));
}

void idx_scratch_free(idx_scratch *s)
{
    if (!s) return;
    free(s->s); free(s->id); free(s->tk); free(s->blk);
    free(s->cs); free(s->ls); free(s->li); free(s->lmark);
    free(s->hd); free(s->hl);
    free(s);
}

int idx_scratch_reserve(idx_scratch *s, const idx_index *ix, int g, int k, int n_threads,
                        char *err, size_t err_size)
{
    if (!s || !ix || g < 1 || g > IDX_MAX_G || k < 1)
        return err_set(err, err_size, "idx_scratch_reserve: bad arguments (g=%d, k=%d)", g, k);
    return ix->ops->reserve(s, ix, g, k, idx_threads(n_threads), err, err_size);
}

void idx_scratch_cost(const idx_scratch *s, uint64_t *bytes, int *nominal)
{
    *bytes = s ? s->cost_bytes : 0;
    *nominal = s ? s->cost_nominal : 0;
}

/* ---- entry points ------------------------------------------------------------------- */

idx_params idx_default_params(void)
{
    idx_params p = {
        .kind = "exact", .key_type = IDX_F16, .nlist = 0, .nprobe = 0, .n_iter = 10,
        .n_train = 0, .seed = 0x5eed5eedull, .hnsw_m = 16, .ef_construction = 40,
        .ef_search = 64, .n_threads = 0,
    };
    return p;
}

static int check_params(const idx_params *p, const idx_kind_ops *kind, const float *keys, int64_t N,
                        int d, char *err, size_t err_size)
{
    if (!kind) {
        char names[64];
        return err_set(err, err_size, "idx_build: unknown index kind '%s' (%s)", p->kind ? p->kind : "(null)",
                       idx_kind_names(names, sizeof names, "|"));
    }
    if (!keys) return err_set(err, err_size, "idx_build: keys is NULL");
    if (N < 1 || N > INT32_MAX)
        return err_set(err, err_size, "idx_build: key count %lld outside [1, %d]", (long long)N, INT32_MAX);
    if (d < 1 || d > IDX_MAX_D)
        return err_set(err, err_size, "idx_build: key dimension %d outside [1, %d]", d, IDX_MAX_D);
    if (p->n_threads < 0 || p->n_threads > 4096)
        return err_set(err, err_size, "idx_build: n_threads %d outside [0, 4096]", p->n_threads);
    if (kind->check(p, N, err, err_size)) return -1;
    /* non-finite keys would poison k-means and the graph; refuse them for all
     * kinds so the contract is the same */
    for (int64_t i = 0; i < N * d; i++)
        if (!isfinite(keys[i]))
            return err_set(err, err_size, "idx_build: key %lld, component %lld is not finite",
                        (long long)(i / d), (long long)(i % d));
    return 0;
}

int idx_build(const idx_params *p, const float *keys, int64_t N, int d, idx_index **out,
              char *err, size_t err_size)
{
    if (!out) return err_set(err, err_size, "idx_build: out is NULL");
    *out = NULL;
    if (!p) return err_set(err, err_size, "idx_build: params is NULL");
    const idx_kind_ops *kind = idx_kind_find(p->kind);
    if (check_params(p, kind, keys, N, d, err, err_size)) return -1;
    idx_index *ix = calloc(1, sizeof *ix);
    if (!ix) return err_set(err, err_size, "idx_build: out of memory");
    ix->ops = kind;
    ix->kind = (int)kind->id;
    if (kind->build(p, keys, N, d, ix, err, err_size)) {
        idx_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}

void idx_free(idx_index *ix)
{
    if (!ix) return;
    if (ix->ops && ix->ops->release) ix->ops->release(ix);
    free(ix->owned);
    free(ix);
}

int         idx_kind(const idx_index *ix)      { return ix->kind; }
const char *idx_kind_name(const idx_index *ix) { return ix->ops->name; }
int64_t     idx_count(const idx_index *ix)     { return ix->n; }
int         idx_dim(const idx_index *ix)       { return ix->d; }
int         idx_nlist(const idx_index *ix)     { return ix->nlist; }
int         idx_key_type(const idx_index *ix)  { return ix->key_type; }

int idx_search(const idx_index *ix, const float *q, int g, int k, const idx_search_params *sp,
               idx_scratch *s, int32_t *ids, float *scores, char *err, size_t err_size)
{
    if (!ix || !q || !ids || !scores) return err_set(err, err_size, "idx_search: NULL argument");
    if (g < 1 || g > IDX_MAX_G) return err_set(err, err_size, "idx_search: g %d outside [1, %d]", g, IDX_MAX_G);
    if (k < 1) return err_set(err, err_size, "idx_search: k %d is not positive", k);
    idx_search_params d0 = { 0 };
    if (!sp) sp = &d0;
    if (sp->nprobe < 0 || sp->ef_search < 0 || sp->n_threads < 0)
        return err_set(err, err_size, "idx_search: negative search parameter");
    int nt = idx_threads(sp->n_threads);
    idx_scratch *tmp = NULL;
    if (!s) {
        s = tmp = idx_scratch_create();
        if (!s) return err_set(err, err_size, "idx_search: out of memory");
    }
    int rc = ix->ops->reserve(s, ix, g, k, nt, err, err_size);
    if (rc == 0) {
        s->cost_bytes = 0;
        s->cost_nominal = 0;
        rc = ix->ops->search(ix, q, g, k, sp, nt, s, ids, scores, err, err_size);
    }
    idx_scratch_free(tmp);
    return rc;
}

size_t idx_serialized_size(const idx_index *ix)
{
    if (!ix) return 0;
    return ix->ops->serialized_size ? ix->ops->serialized_size(ix) : ix->image_bytes;
}

int idx_serialize(const idx_index *ix, void *dst, size_t n, char *err, size_t err_size)
{
    if (!ix || !dst) return err_set(err, err_size, "idx_serialize: NULL argument");
    size_t need = idx_serialized_size(ix);
    if (need == 0) return err_set(err, err_size, "idx_serialize: the %s index cannot be written", ix->ops->name);
    if (n < need) return err_set(err, err_size, "idx_serialize: buffer of %zu bytes, need %zu", n, need);
    if (ix->ops->serialize) return ix->ops->serialize(ix, dst, need, err, err_size);
    memcpy(dst, ix->image, need);
    return 0;
}

int idx_deserialize(const void *src, size_t n, idx_index **out, char *err, size_t err_size)
{
    if (!out) return err_set(err, err_size, "idx_deserialize: out is NULL");
    *out = NULL;
    if (!src) return err_set(err, err_size, "idx_deserialize: src is NULL");
    idx_header h;
    if (header_read(&h, src, n, err, err_size)) return -1;
    idx_index *ix = calloc(1, sizeof *ix);
    if (!ix) return err_set(err, err_size, "idx_deserialize: out of memory");
    ix->ops = kind_by_id(h.kind);
    ix->kind = (int)h.kind;
    const uint8_t *img = src;
    int rc = 0;
    if (ix->ops->in_place && (uintptr_t)src % 64 != 0) {
        /* typed access needs alignment: work on an aligned private copy */
        uint8_t *copy = aligned_alloc(64, align64(n));
        if (!copy) {
            rc = err_set(err, err_size, "idx_deserialize: out of memory copying %zu bytes", n);
        } else {
            memcpy(copy, src, n);
            ix->owned = copy;
            img = copy;
        }
    }
    if (rc == 0) rc = ix->ops->load(ix, &h, img, n, err, err_size);
    if (rc == 0 && ix->ops->in_place) {
        ix->image = img;
        ix->image_bytes = n;
    }
    if (rc) {
        idx_free(ix);
        return -1;
    }
    *out = ix;
    return 0;
}
