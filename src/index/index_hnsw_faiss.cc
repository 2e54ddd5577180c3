// index_hnsw_faiss.cc - the only C++ in sparq: a thin extern "C" shim over
// Faiss's IndexHNSWFlat (inner product) for index_hnsw.c.
//
// Every entry point catches all exceptions (Faiss reports errors by throwing)
// and turns them into -1 plus a message. Thread counts are applied with
// omp_set_num_threads around the Faiss call and restored afterwards: Faiss
// parallelises add() and multi-query search() with OpenMP on its own.
#include "index/index.h"
extern "C" {
#include "util/err.h" /* a C header without its own extern "C" */
}

#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/impl/HNSW.h>
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

static_assert(sizeof(int) == 4, "Faiss HNSW levels must be 32-bit");
static_assert(sizeof(size_t) == 8, "Faiss HNSW offsets must be 64-bit");
static_assert(sizeof(faiss::HNSW::storage_idx_t) == 4, "Faiss HNSW links must be 32-bit");

namespace {

// Sets the OpenMP thread count for this scope.
struct ThreadScope {
    int saved;
    explicit ThreadScope(int n) : saved(omp_get_max_threads()) { omp_set_num_threads(n > 0 ? n : 1); }
    ~ThreadScope() { omp_set_num_threads(saved); }
};

// The graph checks idx_faiss_hnsw_from_parts promises (see index.h).
int check_graph(const faiss::HNSW &hn, int64_t n, char *err, size_t err_size)
{
    int n_lev = (int)hn.cum_nneighbor_per_level.size() - 1;
    int top = 0;
    for (int64_t i = 0; i < n; i++) {
        int l = hn.levels[i];
        if (l < 1 || l > n_lev)
            return err_set(err, err_size, "idx_deserialize: hnsw node %lld has %d levels, Faiss allows 1..%d",
                        (long long)i, l, n_lev);
        if (l > top) top = l;
        size_t want = hn.offsets[i] + (size_t)hn.cum_nb_neighbors(l);
        if (hn.offsets[i] > hn.neighbors.size() || hn.offsets[i + 1] != want)
            return err_set(err, err_size, "idx_deserialize: hnsw node %lld links at [%zu, %zu), expected end %zu",
                        (long long)i, hn.offsets[i], hn.offsets[i + 1], want);
    }
    if (hn.offsets[0] != 0 || hn.offsets[n] != hn.neighbors.size())
        return err_set(err, err_size, "idx_deserialize: hnsw offsets span [%zu, %zu), %zu links stored",
                    hn.offsets[0], hn.offsets[n], hn.neighbors.size());
    if (hn.max_level != top - 1)
        return err_set(err, err_size, "idx_deserialize: hnsw max level %d, nodes reach %d", hn.max_level, top - 1);
    if (hn.entry_point < 0 || hn.entry_point >= n || hn.levels[hn.entry_point] != top)
        return err_set(err, err_size, "idx_deserialize: hnsw entry point %d is not a top-level node", hn.entry_point);
    // a link on level l must reach a node that exists on level l: Faiss reads
    // the target's level-l range without checking
    for (int64_t i = 0; i < n; i++)
        for (int l = 0; l < hn.levels[i]; l++) {
            size_t b = hn.offsets[i] + (size_t)hn.cum_nb_neighbors(l);
            size_t e = hn.offsets[i] + (size_t)hn.cum_nb_neighbors(l + 1);
            for (size_t j = b; j < e; j++) {
                int v = hn.neighbors[j];
                if (v == -1) continue;
                if (v < 0 || v >= n || hn.levels[v] <= l)
                    return err_set(err, err_size, "idx_deserialize: hnsw node %lld level %d links to bad node %d",
                                (long long)i, l, v);
            }
        }
    return 0;
}

} // namespace

extern "C" int idx_faiss_hnsw_build(const float *keys, int64_t n, int d, int m, int ef_construction,
                                    int n_thr, void **out, char *err, size_t err_size)
{
    *out = nullptr;
    faiss::IndexHNSWFlat *ix = nullptr;
    try {
        ThreadScope ts(n_thr);
        ix = new faiss::IndexHNSWFlat(d, m, faiss::METRIC_INNER_PRODUCT);
        ix->hnsw.efConstruction = ef_construction;
        ix->add((faiss::Index::idx_t)n, keys);
        *out = ix;
        return 0;
    } catch (const std::exception &e) {
        delete ix;
        return err_set(err, err_size, "idx_build: Faiss HNSW build failed: %s", e.what());
    } catch (...) {
        delete ix;
        return err_set(err, err_size, "idx_build: Faiss HNSW build failed");
    }
}

extern "C" int idx_faiss_hnsw_search(const void *h, const float *q, int g, int k, int ef_search, int n_thr,
                                     float *dist, int64_t *lab, char *err, size_t err_size)
{
    try {
        const faiss::IndexHNSWFlat *ix = static_cast<const faiss::IndexHNSWFlat *>(h);
        ThreadScope ts(n_thr);
        faiss::SearchParametersHNSW sp;
        sp.efSearch = ef_search;
        static_assert(sizeof(faiss::Index::idx_t) == sizeof(int64_t), "Faiss ids must be 64-bit");
        ix->search(g, q, k, dist, reinterpret_cast<faiss::Index::idx_t *>(lab), &sp);
        return 0;
    } catch (const std::exception &e) {
        return err_set(err, err_size, "idx_search: Faiss HNSW search failed: %s", e.what());
    } catch (...) {
        return err_set(err, err_size, "idx_search: Faiss HNSW search failed");
    }
}

extern "C" void idx_faiss_hnsw_parts(const void *h, idx_hnsw_parts *p)
{
    const faiss::IndexHNSWFlat *ix = static_cast<const faiss::IndexHNSWFlat *>(h);
    const faiss::IndexFlat *st = dynamic_cast<const faiss::IndexFlat *>(ix->storage);
    p->keys = st ? st->get_xb() : nullptr;
    p->levels = ix->hnsw.levels.data();
    p->offsets = ix->hnsw.offsets.data();
    p->neighbors = ix->hnsw.neighbors.data();
    p->n_neighbors = (int64_t)ix->hnsw.neighbors.size();
    p->max_level = ix->hnsw.max_level;
    p->entry_point = ix->hnsw.entry_point;
}

extern "C" int idx_faiss_hnsw_from_parts(const idx_hnsw_parts *p, int64_t n, int d, int m, int ef_construction,
                                         void **out, char *err, size_t err_size)
{
    *out = nullptr;
    faiss::IndexHNSWFlat *ix = nullptr;
    try {
        ix = new faiss::IndexHNSWFlat(d, m, faiss::METRIC_INNER_PRODUCT);
        faiss::HNSW &hn = ix->hnsw;
        hn.efConstruction = ef_construction;
        hn.levels.resize((size_t)n);
        std::memcpy(hn.levels.data(), p->levels, (size_t)n * 4);
        hn.offsets.resize((size_t)n + 1);
        std::memcpy(hn.offsets.data(), p->offsets, ((size_t)n + 1) * 8);
        hn.neighbors.resize((size_t)p->n_neighbors);
        if (p->n_neighbors) std::memcpy(hn.neighbors.data(), p->neighbors, (size_t)p->n_neighbors * 4);
        hn.max_level = p->max_level;
        hn.entry_point = p->entry_point;
        if (check_graph(hn, n, err, err_size)) {
            delete ix;
            return -1;
        }
        ix->storage->add((faiss::Index::idx_t)n, static_cast<const float *>(p->keys));
        ix->ntotal = (faiss::Index::idx_t)n;
        *out = ix;
        return 0;
    } catch (const std::exception &e) {
        delete ix;
        return err_set(err, err_size, "idx_deserialize: Faiss HNSW load failed: %s", e.what());
    } catch (...) {
        delete ix;
        return err_set(err, err_size, "idx_deserialize: Faiss HNSW load failed");
    }
}

extern "C" void idx_faiss_hnsw_free(void *h)
{
    delete static_cast<faiss::IndexHNSWFlat *>(h);
}
