/* prefix_cache.c - the scheduler's prefix cache (prefix_cache.h). */
#include "server/prefix_cache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void pc_drop(prefix_cache *pc, int i)
{
    sparq_prefix_free(pc->e[i].p);
    free(pc->e[i].tokens);
    free(pc->e[i].id);
    pc->bytes -= pc->e[i].bytes;
    pc->e[i] = pc->e[--pc->n];
}

void pc_free(prefix_cache *pc)
{
    while (pc->n) pc_drop(pc, pc->n - 1);
    free(pc->e);
}

int pc_common_len(const int32_t *a, const int32_t *b, int lim)
{
    int l = 0;
    while (l < lim && a[l] == b[l]) l++;
    return l;
}

int pc_find(const prefix_cache *pc, const int32_t *ids, int n, int *use)
{
    int best = -1;
    *use = 0;
    for (int i = 0; i < pc->n; i++) {
        const pc_entry *e = &pc->e[i];
        const int u = pc_common_len(e->tokens, ids, e->n < n - 1 ? e->n : n - 1) / pc->nb * pc->nb;
        if (u > *use) {
            *use = u;
            best = i;
        }
    }
    return best;
}

/* Evicts unused entries, least recently used first, until `extra` more
 * bytes fit; 0 if they do. */
static int pc_fit(prefix_cache *pc, size_t extra)
{
    while (pc->bytes + extra > pc->budget) {
        int lru = -1;
        for (int i = 0; i < pc->n; i++)
            if (!sparq_prefix_users(pc->e[i].p) && (lru < 0 || pc->e[i].used < pc->e[lru].used)) lru = i;
        if (lru < 0) return -1;
        pc_drop(pc, lru);
    }
    return 0;
}

int pc_named(const prefix_cache *pc, const char *id)
{
    for (int i = 0; id && id[0] && i < pc->n; i++)
        if (pc->e[i].id && !strcmp(pc->e[i].id, id)) return i;
    return -1;
}

int pc_insert(srv_server *s, prefix_cache *pc, const sparq_context *src, const int32_t *ids, int n, int64_t n_ctx,
              const char *id)
{
    if (id && (!id[0] || pc_named(pc, id) >= 0)) id = NULL;
    for (int i = 0; i < pc->n; i++) {
        pc_entry *e = &pc->e[i];
        if (e->n < n || memcmp(e->tokens, ids, (size_t)n * sizeof *ids)) continue;
        if (!id) return i;
        if (!e->id && e->n == n) { /* the same prefix: it gets the name */
            e->id = strdup(id);
            return i;
        }
    }
    const size_t bytes = (size_t)n * sparq_model_n_layer(s->model) * sparq_model_n_kv_head(s->model) *
                         sparq_model_head_dim(s->model) * 2 * (s->cfg.kv_type == SPARQ_KV_F32 ? 4 : 2);
    if (bytes > pc->budget || pc_fit(pc, bytes)) return -1;
    if (pc->n == pc->cap) {
        int cap = pc->cap ? 2 * pc->cap : 16;
        pc_entry *e = realloc(pc->e, (size_t)cap * sizeof *e);
        if (!e) return -1;
        pc->e = e;
        pc->cap = cap;
    }
    char err[256];
    pc_entry e = { malloc((size_t)n * sizeof *ids), n, id ? strdup(id) : NULL, NULL, srv_now(), 0 };
    if (!e.tokens || (id && !e.id) || sparq_prefix_create(src, n, n_ctx, &e.p, err, sizeof err)) {
        if (e.tokens && (!id || e.id)) fprintf(stderr, "serve: prefix cache: %s\n", err);
        free(e.tokens);
        free(e.id);
        return -1;
    }
    memcpy(e.tokens, ids, (size_t)n * sizeof *ids);
    e.bytes = sparq_prefix_bytes(e.p);
    pc->e[pc->n++] = e;
    pc->bytes += e.bytes;
    return pc->n - 1;
}

void pc_name_check(prefix_cache *pc, const srv_request *r)
{
    const int i = pc_named(pc, r->prefix_id);
    if (i < 0) return;
    pc_entry *e = &pc->e[i];
    const int l = pc_common_len(e->tokens, r->prompt, e->n < r->n_prompt ? e->n : r->n_prompt);
    if (l < pc->nb) {
        free(e->id);
        e->id = NULL;
    } else if (l < e->n) {
        e->n = l / pc->nb * pc->nb;
    }
}

int pc_attach(prefix_cache *pc, int i, sparq_context *c, int u)
{
    char err[256];
    pc_entry *e = &pc->e[i];
    if (sparq_context_attach_prefix(c, e->p, u, err, sizeof err)) return -1;
    e->used = srv_now();
    const size_t b = sparq_prefix_bytes(e->p);
    pc->bytes += b - e->bytes;
    e->bytes = b;
    pc_fit(pc, 0); /* e is in use now: others go, if any can */
    return 0;
}

void pc_publish(srv_server *s, const prefix_cache *pc)
{
    int64_t users = 0;
    for (int i = 0; i < pc->n; i++) users += sparq_prefix_users(pc->e[i].p);
    s->metrics.prefix_entries = pc->n;
    s->metrics.prefix_bytes = (int64_t)pc->bytes;
    s->metrics.prefix_users = users;
}
