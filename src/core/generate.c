/* generate.c - the generation loop every caller shares (`sparq run`, its
 * chat mode, the evaluation harness, the server): sample, stop rules,
 * feed the sampled id, repeat.
 *
 * Stop rules, checked in this order for each sampled id: an end-of-
 * generation token (kept in tokens, its piece not in text), a stop string
 * in the text (text cut before it), max_tokens. Before each decode step:
 * the abort flag, then a full cache (context shift or stop). The last
 * sampled id is never fed (nothing would read its logits): `pending`.
 * What on_text sees and where a stop string cuts is core/streamer.h's, as
 * for the server's replies. */
#include "core/model.h"
#include "core/streamer.h"
#include "util/err.h"
#include "util/textbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *sparq_stop_name(int stop)
{
    switch (stop) {
    case SPARQ_STOP_MAX_TOKENS: return "max_tokens";
    case SPARQ_STOP_EOG: return "end_of_generation";
    case SPARQ_STOP_STRING: return "stop_string";
    case SPARQ_STOP_CONTEXT_FULL: return "context_full";
    case SPARQ_STOP_ABORTED: return "interrupted";
    case SPARQ_STOP_CALLBACK: return "stopped_by_caller";
    }
    return "?";
}

sparq_generate_params sparq_generate_default_params(void)
{
    sparq_generate_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = 128;
    return p;
}

void sparq_generation_free(sparq_generation *g)
{
    if (!g) return;
    free(g->tokens);
    free(g->text);
    memset(g, 0, sizeof *g);
}

static int fail(sparq_context *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_setv(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
    return -1;
}

int sparq_generate(sparq_context *c, float *logits, const sparq_generate_params *p, sparq_generation *out)
{
    memset(out, 0, sizeof *out);
    c->error[0] = 0;
    const sparq_model *m = c->model;
    const int n_vocab = m->hp.n_vocab;
    if (p->max_tokens < 0) return fail(c, "generate: max_tokens %d < 0", p->max_tokens);
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop)) return fail(c, "generate: bad stop list");
    if (p->context_shift && (p->n_keep < 0 || p->n_keep >= c->kv.cap - 1))
        return fail(c, "generate: keep %lld must be in [0, %lld) to shift the context", (long long)p->n_keep,
                    (long long)(c->kv.cap - 1));
    out->tokens = malloc(((size_t)p->max_tokens + 1) * sizeof *out->tokens);
    text_buf t = { 0 };
    size_t sent = 0; /* text bytes handed to on_text */
    streamer st;
    streamer_init(&st, p->stop, p->n_stop, 0);
    if (!out->tokens || text_append(&t, "", 0)) {
        fail(c, "generate: out of memory");
        goto fail;
    }
    out->stop = SPARQ_STOP_MAX_TOKENS;
    char piece[256];
    for (int i = 0; i < p->max_tokens; i++) {
        if (i > 0) { /* the logits for token i come from feeding token i-1 */
            if (c->params.abort_flag && *c->params.abort_flag) {
                out->stop = SPARQ_STOP_ABORTED;
                break;
            }
            if (c->kv.n >= c->kv.cap) {
                if (!p->context_shift) {
                    out->stop = SPARQ_STOP_CONTEXT_FULL;
                    break;
                }
                const int64_t n_discard = (c->kv.n - p->n_keep) / 2;
                if (sparq_context_shift(c, p->n_keep, n_discard)) goto fail;
                out->n_shifts++;
            }
            if (sparq_eval(c, &out->tokens[i - 1], 1, logits)) goto fail; /* its message stays */
            out->pending = 0;
            out->n_decoded++;
            if (p->on_logits && p->on_logits(p->user, logits, n_vocab)) {
                fail(c, "generate: the logits callback failed at step %d", i);
                goto fail;
            }
        }
        const int32_t id = p->sampler ? sparq_sample(p->sampler, logits) : logits_argmax(logits, n_vocab);
        out->tokens[out->n_tokens++] = id;
        if (!p->ignore_eog && sparq_token_is_eog(m, id)) {
            out->stop = SPARQ_STOP_EOG;
            break;
        }
        out->pending = 1;
        int len = sparq_token_to_piece(m, id, piece, sizeof piece);
        if (len > (int)sizeof piece) len = sizeof piece;
        const int hit = streamer_feed(&st, &t, piece, len > 0 ? (size_t)len : 0);
        if (hit < 0) {
            fail(c, "generate: out of memory");
            goto fail;
        }
        if (hit) {
            out->stop = SPARQ_STOP_STRING;
            break;
        }
        if (p->on_text && st.ok > sent) {
            const int stop = p->on_text(p->user, t.data + sent, st.ok - sent);
            sent = st.ok;
            if (stop) {
                out->stop = SPARQ_STOP_CALLBACK;
                break;
            }
        }
    }
    if (p->on_text && streamer_flush(&st, &t) > sent && out->stop != SPARQ_STOP_CALLBACK)
        p->on_text(p->user, t.data + sent, t.len - sent);
    out->text = t.data;
    out->n_text = t.len;
    return 0;
fail:
    free(t.data);
    sparq_generation_free(out);
    return -1;
}
