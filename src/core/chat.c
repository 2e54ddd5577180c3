/* chat.c - chat templates (see chat.h). One table row per family. */
#include "core/chat.h"

#include <stdio.h>
#include <string.h>

typedef struct chat_family {
    const char *name;
    const char *detect;         /* marker found in tokenizer.chat_template */
    const char *bos;            /* text before the conversation           */
    const char *turn_open;      /* printf: %s = role                       */
    const char *turn_close;     /* after each message                      */
    const char *assistant_role; /* role name the model answers as          */
    const char *const specials[6]; /* markers that are special tokens     */
} chat_family;

static const chat_family families[] = {
    { "llama3", "<|start_header_id|>", "<|begin_of_text|>",
      "<|start_header_id|>%s<|end_header_id|>\n\n", "<|eot_id|>", "assistant",
      { "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", NULL } },
    { "chatml", "<|im_start|>", "", "<|im_start|>%s\n", "<|im_end|>\n", "assistant",
      { "<|im_start|>", "<|im_end|>", NULL } },
    { "gemma", "<start_of_turn>", "<bos>", "<start_of_turn>%s\n", "<end_of_turn>\n", "model",
      { "<bos>", "<start_of_turn>", "<end_of_turn>", NULL } },
    /* Phi-3: <|role|>\n ... <|end|>\n; Microsoft's files add BOS <s>. */
    { "phi3", "<|assistant|>", "<s>", "<|%s|>\n", "<|end|>\n", "assistant",
      { "<s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>", NULL } },
    /* Mistral has no roles: handled by a special case in chat_render. */
    { "mistral", "[INST]", "<s>", "", "", "", { "<s>", "</s>", "[INST]", "[/INST]", NULL } },
};
#define N_FAMILIES (sizeof families / sizeof families[0])

static const chat_family *family(const char *name)
{
    for (size_t i = 0; name && i < N_FAMILIES; i++)
        if (strcmp(families[i].name, name) == 0) return &families[i];
    return NULL;
}

const char *chat_template_canonical(const char *name)
{
    if (name && (strcmp(name, "qwen") == 0 || strcmp(name, "qwen2") == 0)) return "chatml";
    const chat_family *f = family(name);
    return f ? f->name : NULL;
}

const char *chat_template_names(void) { return "llama3, chatml (qwen), phi3, mistral, gemma"; }

const char *chat_template_detect(const char *jinja, size_t len)
{
    for (size_t i = 0; jinja && i < N_FAMILIES; i++) {
        size_t m = strlen(families[i].detect);
        for (size_t at = 0; at + m <= len; at++)
            if (memcmp(jinja + at, families[i].detect, m) == 0) return families[i].name;
    }
    return NULL;
}

/* Appends printf output to out, tracking the full length even past the end. */
#define EMIT(...)                                                                          \
    do {                                                                                   \
        int w_ = snprintf(len < out_size ? out + len : NULL, len < out_size ? out_size - len : 0, \
                          __VA_ARGS__);                                                    \
        if (w_ < 0) return -1;                                                             \
        len += (size_t)w_;                                                                 \
    } while (0)

int chat_render(const char *tmpl, const chat_msg *msgs, int n_msgs, int add_assistant,
                char *out, size_t out_size)
{
    const chat_family *f = family(chat_template_canonical(tmpl));
    if (!f) return -1;
    size_t len = 0;
    if (out_size) out[0] = 0;
    EMIT("%s", f->bos);
    if (strcmp(f->name, "mistral") == 0) {
        /* [INST] user [/INST] answer</s> ...; a system prompt is prefixed
         * to the first user message, as Mistral's template does. */
        const char *system = NULL;
        for (int i = 0; i < n_msgs; i++) {
            if (strcmp(msgs[i].role, "system") == 0) { system = msgs[i].content; continue; }
            if (strcmp(msgs[i].role, "user") == 0) {
                EMIT("[INST] %s%s%s [/INST]", system ? system : "", system ? "\n\n" : "", msgs[i].content);
                system = NULL;
            } else {
                EMIT(" %s</s>", msgs[i].content);
            }
        }
        return (int)len;
    }
    for (int i = 0; i < n_msgs; i++) {
        const char *role = strcmp(msgs[i].role, "assistant") == 0 ? f->assistant_role : msgs[i].role;
        EMIT(f->turn_open, role);
        EMIT("%s%s", msgs[i].content, f->turn_close);
    }
    if (add_assistant) EMIT(f->turn_open, f->assistant_role);
    return (int)len;
}

int chat_tokenize(const tokenizer *t, const char *tmpl, const char *text, size_t len,
                  int32_t *ids, int max_ids)
{
    const chat_family *f = family(chat_template_canonical(tmpl));
    if (!f) return -1;
    int n = 0;
    size_t start = 0, at = 0;
    while (at <= len) {
        const char *hit = NULL;
        int hit_id = -1;
        for (int s = 0; at < len && f->specials[s]; s++) {
            size_t m = strlen(f->specials[s]);
            if (at + m <= len && memcmp(text + at, f->specials[s], m) == 0) {
                hit_id = tok_lookup(t, f->specials[s]);
                if (hit_id >= 0) { hit = f->specials[s]; break; }
            }
        }
        if (!hit && at < len) { at++; continue; }
        if (at > start) { /* the text since the last marker */
            int got = tok_encode(t, text + start, at - start, 0, n < max_ids ? ids + n : NULL,
                                 n < max_ids ? max_ids - n : 0);
            if (got < 0) return -1;
            n += got;
        }
        if (!hit) break;
        if (n < max_ids) ids[n] = hit_id;
        n++;
        at += strlen(hit);
        start = at;
    }
    return n;
}
