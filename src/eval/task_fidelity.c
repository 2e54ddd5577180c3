/* task_fidelity.c - any text under each policy against dense attention:
 * one example holding the whole text (its id is the file); the harness
 * (sweep.c) tokenizes it and cuts the tokens into the windows laid out by
 * task_fidelity_layout, then compares per-token KL, top-1 agreement and
 * greedy tokens before divergence (docs/EVALUATION.md "Fidelity"). */
#include "util/err.h"
#include "eval/task_impl.h"

#include <stdlib.h>
#include <string.h>

static const char FIDELITY_TEXT[] = "data/text/tinyshakespeare_input.txt";

static int fidelity_open(task_set *s, char *err, size_t err_size)
{
    /* a given text is looked up on the search path too */
    char path[TASK_PATH_MAX];
    if (task_find_data("fidelity", s->p.path ? s->p.path : FIDELITY_TEXT, path, sizeof path, err, err_size))
        return -1;
    if (task_read_file("fidelity", path, &s->text, &s->n_text, err, err_size)) return -1;
    if (!(s->priv = task_dup_n(path, strlen(path)))) return err_set(err, err_size, "fidelity: out of memory");
    s->n_examples = 1;
    return 0;
}

static int fidelity_get(const task_set *s, int64_t i, task_example *ex, char *err, size_t err_size)
{
    (void)i;
    sbuf b = { 0 };
    sb_add(&b, s->text, s->n_text);
    if (sb_finish(&b, ex, err, err_size)) return -1;
    ex->n_context = ex->n_prompt;
    ex->id = task_dup_n(s->priv, strlen(s->priv));
    if (!ex->id) return err_set(err, err_size, "fidelity: out of memory");
    return 0;
}

int task_fidelity_layout(const task_params *p, int64_t n_ctx, int64_t n_ids, int lead, task_fid_layout *out,
                         char *err, size_t err_size)
{
    memset(out, 0, sizeof *out);
    const int F = p->fid_tokens > 0 ? p->fid_tokens : (int)(n_ctx / 2 < 256 ? n_ctx / 2 : 256);
    const int P = p->fid_prompt > 0 ? p->fid_prompt : (int)(n_ctx - F);
    if (P < 2 || F < 1 || (int64_t)P + F > n_ctx)
        return err_set(err, err_size, "fidelity: prompt %d + forced %d tokens must fit the context %lld (prompt >= 2)",
                       P, F, (long long)n_ctx);
    const int64_t room = n_ctx - P + 1;
    int G = p->fid_gen > 0 ? p->fid_gen : (int)(room < 128 ? room : 128);
    if (G > room) G = (int)room;
    out->prompt = P;
    out->forced = F;
    out->gen = G;
    out->stride = P - lead + F;
    out->n_windows = n_ids / out->stride;
    if (out->n_windows < 1)
        return err_set(err, err_size,
                       "fidelity: the text has %lld tokens, a window needs %lld (see --fid-prompt/--fid-tokens)",
                       (long long)n_ids, (long long)out->stride);
    /* mean cache length over the decode steps: forced at P+1..P+F, greedy at P+1..P+G-1 */
    const double steps = (double)F + (G > 1 ? G - 1 : 0);
    out->mean_len = P + ((double)F * (F + 1) / 2 + (double)(G - 1) * G / 2) / (steps > 0 ? steps : 1);
    return 0;
}

static const task_option fidelity_options[] = {
    { "--fid-prompt", TASK_OPT_INT, offsetof(task_params, fid_prompt), 2, "N",
      "prompt tokens per window, BOS included (default context - forced)" },
    { "--fid-tokens", TASK_OPT_INT, offsetof(task_params, fid_tokens), 1, "N",
      "teacher-forced tokens compared per window (default min(256, context/2))" },
    { "--fid-gen", TASK_OPT_INT, offsetof(task_params, fid_gen), 1, "N", "greedy tokens compared (default min(128, room))" },
    { 0 },
};

const task_def task_def_fidelity = {
    .name = "fidelity",
    .summary = "any text (-f FILE, default Tiny Shakespeare) against dense: top-1 agreement, KL, first divergence",
    .metric = "top1_agreement",
    .run = TASK_RUN_FIDELITY,
    .stream = 7,
    .options = fidelity_options,
    .open = fidelity_open,
    .get = fidelity_get,
    .free_priv = free,
};
