/* abi.c - sparq_abi_sizeof/offsetof: the public structs' layout, by name,
 * for bindings that mirror them (python/sparq checks its ctypes structs
 * against these at import, so a field added in C without the Python twin
 * fails loudly instead of corrupting memory). */
#include "sparq.h"
#include "sparq_attn.h"
#include "util/cpu.h"

#include <stddef.h>
#include <string.h>

#ifndef SPARQ_VERSION
#define SPARQ_VERSION "0.1.0"
#endif

typedef struct { const char *type, *field; size_t value; } abi_entry;

/* field == NULL: the struct's sizeof; else the field's offsetof. */
#define ABI_SIZE(T) { #T, NULL, sizeof(T) }
#define ABI_OFF(T, F) { #T, #F, offsetof(T, F) }

static const abi_entry abi_table[] = {
    ABI_SIZE(sparq_attn_params),
    ABI_OFF(sparq_attn_params, policy),
    ABI_OFF(sparq_attn_params, r),
    ABI_OFF(sparq_attn_params, k),
    ABI_OFF(sparq_attn_params, l),
    ABI_OFF(sparq_attn_params, select_logits),
    ABI_OFF(sparq_attn_params, no_realloc),
    ABI_OFF(sparq_attn_params, n_sink),
    ABI_OFF(sparq_attn_params, index),
    ABI_OFF(sparq_attn_params, topk_schedule),
    ABI_OFF(sparq_attn_params, index_key_type),
    ABI_OFF(sparq_attn_params, ivf_nlist),
    ABI_OFF(sparq_attn_params, ivf_nprobe),
    ABI_OFF(sparq_attn_params, hnsw_ef_search),
    ABI_OFF(sparq_attn_params, topk_check),
    ABI_OFF(sparq_attn_params, select_always),
    ABI_OFF(sparq_attn_params, adaptive_k),
    ABI_OFF(sparq_attn_params, k_min),

    ABI_SIZE(sparq_attn_io),
    ABI_OFF(sparq_attn_io, kv_type),
    ABI_OFF(sparq_attn_io, d),
    ABI_OFF(sparq_attn_io, g),
    ABI_OFF(sparq_attn_io, S),
    ABI_OFF(sparq_attn_io, q),
    ABI_OFF(sparq_attn_io, K),
    ABI_OFF(sparq_attn_io, KT),
    ABI_OFF(sparq_attn_io, V),
    ABI_OFF(sparq_attn_io, v_mean),
    ABI_OFF(sparq_attn_io, out),
    ABI_OFF(sparq_attn_io, sel),
    ABI_OFF(sparq_attn_io, i1),
    ABI_OFF(sparq_attn_io, alpha),
    ABI_OFF(sparq_attn_io, n_sel),
    ABI_OFF(sparq_attn_io, elements),

    ABI_SIZE(sparq_model_params),
    ABI_OFF(sparq_model_params, use_mmap),
    ABI_OFF(sparq_model_params, no_repack),

    ABI_SIZE(sparq_chat_msg),
    ABI_OFF(sparq_chat_msg, role),
    ABI_OFF(sparq_chat_msg, content),

    ABI_SIZE(sparq_context_params),
    ABI_OFF(sparq_context_params, n_ctx),
    ABI_OFF(sparq_context_params, n_threads),
    ABI_OFF(sparq_context_params, n_batch),
    ABI_OFF(sparq_context_params, kv_type),
    ABI_OFF(sparq_context_params, attn),
    ABI_OFF(sparq_context_params, progress),
    ABI_OFF(sparq_context_params, progress_user),
    ABI_OFF(sparq_context_params, abort_flag),
    ABI_OFF(sparq_context_params, prefill),

    ABI_SIZE(sparq_prefill_params),
    ABI_OFF(sparq_prefill_params, mode),
    ABI_OFF(sparq_prefill_params, window),
    ABI_OFF(sparq_prefill_params, n_sink),
    ABI_OFF(sparq_prefill_params, k),
    ABI_OFF(sparq_prefill_params, nlist),
    ABI_OFF(sparq_prefill_params, nprobe),

    ABI_SIZE(sparq_attn_stats),
    ABI_OFF(sparq_attn_stats, elements),
    ABI_OFF(sparq_attn_stats, dense_elements),
    ABI_OFF(sparq_attn_stats, formula_elements),
    ABI_OFF(sparq_attn_stats, bytes),
    ABI_OFF(sparq_attn_stats, steps),
    ABI_OFF(sparq_attn_stats, recall_hits),
    ABI_OFF(sparq_attn_stats, recall_total),
    ABI_OFF(sparq_attn_stats, index_seconds),
    ABI_OFF(sparq_attn_stats, nominal_elements),

    ABI_SIZE(sparq_sampler_params),
    ABI_OFF(sparq_sampler_params, temp),
    ABI_OFF(sparq_sampler_params, top_k),
    ABI_OFF(sparq_sampler_params, top_p),
    ABI_OFF(sparq_sampler_params, seed),
    ABI_OFF(sparq_sampler_params, min_p),
    ABI_OFF(sparq_sampler_params, repeat_penalty),
    ABI_OFF(sparq_sampler_params, presence_penalty),
    ABI_OFF(sparq_sampler_params, frequency_penalty),
    ABI_OFF(sparq_sampler_params, penalty_last_n),
};

static const abi_entry *abi_find(const char *type, const char *field)
{
    if (!type) return NULL;
    for (size_t i = 0; i < sizeof abi_table / sizeof abi_table[0]; i++) {
        const abi_entry *e = &abi_table[i];
        if (strcmp(e->type, type) != 0) continue;
        if (!field ? !e->field : (e->field && !strcmp(e->field, field))) return e;
    }
    return NULL;
}

/* The table must list every field: its last field must end the struct
 * (within the trailing padding), so a field added at the end of a struct
 * without a line here stops the build. A field added elsewhere moves the
 * offsets of the ones after it, which the binding sees. */
#define ABI_LAST(T, F) \
    _Static_assert(sizeof(T) - (offsetof(T, F) + sizeof(((T *)0)->F)) < _Alignof(T), \
                   #T " has a field after " #F ": add it to abi_table and to python/sparq/_lib.py")
ABI_LAST(sparq_attn_params, k_min);
ABI_LAST(sparq_attn_io, elements);
ABI_LAST(sparq_model_params, no_repack);
ABI_LAST(sparq_chat_msg, content);
ABI_LAST(sparq_context_params, prefill);
ABI_LAST(sparq_prefill_params, nprobe);
ABI_LAST(sparq_attn_stats, nominal_elements);
ABI_LAST(sparq_sampler_params, penalty_last_n);

const char *sparq_abi_field(const char *type, int i)
{
    if (!type || i < 0) return NULL;
    for (size_t j = 0; j < sizeof abi_table / sizeof abi_table[0]; j++) {
        const abi_entry *e = &abi_table[j];
        if (e->field && !strcmp(e->type, type) && i-- == 0) return e->field;
    }
    return NULL;
}

size_t sparq_abi_sizeof(const char *type)
{
    const abi_entry *e = abi_find(type, NULL);
    return e ? e->value : 0;
}

int64_t sparq_abi_offsetof(const char *type, const char *field)
{
    if (!field) return -1;
    const abi_entry *e = abi_find(type, field);
    return e ? (int64_t)e->value : -1;
}

const char *sparq_version(void) { return SPARQ_VERSION; }

const char *sparq_cpu_level(void) { return cpu_level_name(cpu_level_get()); }
