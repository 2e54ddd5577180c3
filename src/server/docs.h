/* docs.h - documents served from their own KV files (`sparq serve
 * --load-kv ID=PATH`): a cache prefilled once (sparq prefill --save-kv,
 * sparq import), often larger than the RAM, that requests continue by
 * naming it ("sparq": {"prefix_id": ID}; the prompt is what follows the
 * document, which is not sent again).
 *
 * Each such request's context is the file mapped privately
 * (sparq_context_load_kv): its pages come from the page cache, shared by
 * every sequence and process that reads the file, and only what a sequence
 * appends after the document is its own memory. Nothing is copied, so a
 * million-token document costs a sequence no more private memory than a
 * short one. The prompt after the document goes through the request's
 * attention policy one token at a time (SPARQ_PREFILL_POLICY): an exact
 * prefill would read the whole document for every question token, while a
 * topk policy reads the file's stored index.
 */
#ifndef SPARQ_SRV_DOCS_H
#define SPARQ_SRV_DOCS_H

#include "sparq.h"

#include <stddef.h>
#include <stdint.h>

typedef struct srv_doc {
    char   *id;             /* the name requests give as prefix_id          */
    char   *path;
    int64_t n_pos;          /* positions the document holds                 */
    int64_t n_ctx;          /* the file's capacity: document + continuation */
    sparq_attn_params attn; /* the server's default policy for this capacity
                             * (a ratio means a fraction of n_ctx)          */
} srv_doc;

/* Opens every "ID=PATH" of specs[n] (ID: 1 to SRV_MAX_PREFIX_ID printable
 * characters, no '='; names distinct): each file is checked (header,
 * metadata, the model it was made with: m's, and the data checksums when
 * the data is at most 1 GiB, as sparq_context_load_kv checks by default)
 * and closed again; requests then map it checking the header only. *out
 * gets n documents (srv_docs_free) with attn unset. 0, or -1 with a
 * one-line message naming the spec. */
int  srv_docs_open(const sparq_model *m, const char *const *specs, int n, srv_doc **out, char *err, size_t err_size);
void srv_docs_free(srv_doc *d, int n);

/* The document named id, or -1. */
int  srv_doc_find(const srv_doc *d, int n, const char *id);

#endif
