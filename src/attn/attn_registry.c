/* attn_registry.c - the attention policies' registry (attn.h): the one
 * list every name list, help text and `--attn all` comes from. Adding a
 * policy is its file attn_NAME.c and one line in registry[] here. It sits
 * above the policies, which call only what is below them (attn.c).
 */
#include "attn/attn.h"
#include "util/names.h"

#include <string.h>

/* ---- registry ------------------------------------------------------------ */

static const attn_policy *const registry[] = {
    &attn_policy_dense,  &attn_policy_sparq, &attn_policy_oracle,
    &attn_policy_flexgen, &attn_policy_h2o,  &attn_policy_streaming,
    &attn_policy_topk,
};
#define N_REGISTRY ((int)(sizeof registry / sizeof registry[0]))

const attn_policy *attn_policy_find(const char *name)
{
    if (!name) name = "dense";
    for (int i = 0; i < N_REGISTRY; i++)
        if (strcmp(registry[i]->name, name) == 0) return registry[i];
    return NULL;
}

int attn_policy_count(void) { return N_REGISTRY; }

const attn_policy *attn_policy_at(int i) { return i >= 0 && i < N_REGISTRY ? registry[i] : NULL; }

static const char *policy_name(int i) { return registry[i]->name; }

const char *attn_policy_names(char *buf, size_t size, const char *sep)
{
    return names_join(buf, size, sep, N_REGISTRY, policy_name);
}
