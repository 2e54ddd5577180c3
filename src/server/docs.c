/* docs.c - documents served from their own KV files (docs.h). */
#include "server/docs.h"
#include "server/srv_internal.h"
#include "core/model.h"
#include "io/kvfile.h"
#include "util/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void srv_docs_free(srv_doc *d, int n)
{
    for (int i = 0; d && i < n; i++) {
        free(d[i].id);
        free(d[i].path);
    }
    free(d);
}

int srv_doc_find(const srv_doc *d, int n, const char *id)
{
    for (int i = 0; id && i < n; i++)
        if (!strcmp(d[i].id, id)) return i;
    return -1;
}

static int valid_id(const char *s, size_t len)
{
    if (len < 1 || len > SRV_MAX_PREFIX_ID) return 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] >= 0x7f || s[i] == '=') return 0;
    return 1;
}

int srv_docs_open(const sparq_model *m, const char *const *specs, int n, srv_doc **out, char *err, size_t err_size)
{
    *out = NULL;
    if (n <= 0) return 0;
    srv_doc *d = calloc((size_t)n, sizeof *d);
    if (!d) return err_set(err, err_size, "out of memory");
    kvf_fingerprint fp;
    model_fingerprint(m, &fp);
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(specs[i], '=');
        if (!eq || !valid_id(specs[i], (size_t)(eq - specs[i])) || !eq[1]) {
            err_set(err, err_size, "--load-kv '%.200s': expected ID=PATH, ID 1 to %d printable characters without '='",
                    specs[i], SRV_MAX_PREFIX_ID);
            goto fail;
        }
        d[i].id = strndup(specs[i], (size_t)(eq - specs[i]));
        d[i].path = strdup(eq + 1);
        if (!d[i].id || !d[i].path) {
            err_set(err, err_size, "out of memory");
            goto fail;
        }
        if (srv_doc_find(d, i, d[i].id) >= 0) {
            err_set(err, err_size, "--load-kv: the name '%s' is given twice", d[i].id);
            goto fail;
        }
        char e[400];
        kvf_file *f = NULL;
        if (kvf_open(d[i].path, &fp, KVF_VERIFY_AUTO, &f, e, sizeof e)) {
            err_set(err, err_size, "--load-kv %s: %s", d[i].id, e);
            goto fail;
        }
        d[i].n_pos = f->n;
        d[i].n_ctx = f->cap;
        kvf_close(f);
        if (d[i].n_pos < 1 || d[i].n_pos >= d[i].n_ctx) {
            err_set(err, err_size, "--load-kv %s: the file holds %lld positions of %lld: %s", d[i].id,
                    (long long)d[i].n_pos, (long long)d[i].n_ctx,
                    d[i].n_pos < 1 ? "nothing to continue" : "no room left to continue it");
            goto fail;
        }
    }
    *out = d;
    return 0;
fail:
    srv_docs_free(d, n);
    return -1;
}
