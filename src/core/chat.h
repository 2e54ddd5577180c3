/* chat.h - chat templates: turning a conversation into the prompt text a
 * chat model was trained on.
 *
 * Templates are chosen by name or detected from the GGUF's
 * tokenizer.chat_template (a Jinja string we do not execute: we recognise
 * the family by its markers). Rendering produces text in which special
 * tokens appear literally ("<|im_start|>"); chat_tokenize then maps those
 * markers to their token ids and encodes the text between them.
 */
#ifndef SPARQ_CHAT_H
#define SPARQ_CHAT_H

#include <stddef.h>
#include <stdint.h>
#include "sparq.h"
#include "core/tokenizer.h"

/* role: "system", "user" or "assistant" */
typedef sparq_chat_msg chat_msg;

/* "llama3", "chatml", "mistral", "gemma"; NULL if the name is unknown. */
const char *chat_template_canonical(const char *name);
/* Comma-separated names for messages. */
const char *chat_template_names(void);
/* Detects the family from a Jinja template; NULL if unrecognised. */
const char *chat_template_detect(const char *jinja, size_t len);

/* Renders msgs (and, if add_assistant, the opening of the reply) into
 * out[out_size] as NUL-terminated text. Returns the full length (which may
 * exceed out_size - 1: call again with more room), or -1 for an unknown
 * template. */
int chat_render(const char *tmpl, const chat_msg *msgs, int n_msgs, int add_assistant,
                char *out, size_t out_size);

/* Tokenizes rendered chat text: every special-token marker of the template
 * that exists in the vocabulary becomes its id, the text between markers
 * is encoded without BOS/EOS. Returns the id count (may exceed max_ids), or
 * -1 on error. */
int chat_tokenize(const tokenizer *t, const char *tmpl, const char *text, size_t len,
                  int32_t *ids, int max_ids);

#endif
