/* props.c - GET /props: the server's settings in the shape llama-server
 * gives them, which web UIs and benchmark clients read to learn the
 * context size, the slot count, the sampling defaults and the chat
 * template; sparq's own settings (attention policies, KV type, version)
 * under "sparq". Only fixed facts of this process: no lock is taken. */
#include "server/srv_internal.h"
#include "util/json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void write_str(FILE *f, const char *s) { json_write_str(f, s ? s : "", s ? strlen(s) : 0); }

/* A token's text, as llama-server reports bos_token / eos_token. */
static void write_token(FILE *f, const sparq_model *m, int id)
{
    char piece[256];
    int len = id >= 0 ? sparq_token_to_piece(m, id, piece, sizeof piece) : 0;
    if (len < 0) len = 0;
    if (len > (int)sizeof piece) len = sizeof piece;
    json_write_str(f, piece, (size_t)len);
}

/* What a request gets for each field it leaves out (request.c's defaults;
 * the sampler's order in sparq.h), under llama-server's names. Stages this
 * server does not have are reported switched off. */
static void write_params(FILE *f)
{
    fputs("{\"n_predict\":-1,\"seed\":4294967295,\"temperature\":1.0,\"dynatemp_range\":0.0,"
          "\"dynatemp_exponent\":1.0,\"top_k\":0,\"top_p\":1.0,\"min_p\":0.0,\"xtc_probability\":0.0,"
          "\"xtc_threshold\":0.1,\"typical_p\":1.0,\"repeat_last_n\":-1,\"repeat_penalty\":1.0,"
          "\"presence_penalty\":0.0,\"frequency_penalty\":0.0,\"dry_multiplier\":0.0,\"mirostat\":0,"
          "\"stop\":[],\"max_tokens\":-1,\"n_keep\":0,\"n_discard\":0,\"ignore_eos\":false,\"stream\":false,"
          "\"n_probs\":0,\"min_keep\":0,\"grammar\":\"\","
          "\"samplers\":[\"penalties\",\"min_p\",\"temperature\",\"top_k\",\"top_p\"],"
          "\"timings_per_token\":false}", f);
}

static const char *kv_name(int kv_type)
{
    return kv_type == SPARQ_KV_F32 ? "f32" : kv_type == SPARQ_KV_Q8_0 ? "q8_0" : "f16";
}

char *srv_props_json(const srv_server *s, size_t *len)
{
    const srv_config *c = &s->cfg;
    const char *tmpl = c->chat_template ? c->chat_template : sparq_model_chat_template(s->model);
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    fprintf(f, "{\"default_generation_settings\":{\"id\":0,\"id_task\":-1,\"n_ctx\":%lld,\"speculative\":false,"
               "\"is_processing\":false,\"params\":", (long long)c->n_ctx);
    write_params(f);
    fputs(",\"prompt\":\"\",\"next_token\":{\"has_next_token\":true,\"has_new_line\":false,\"n_remain\":-1,"
          "\"n_decoded\":0,\"stopping_word\":\"\"}}", f);
    fprintf(f, ",\"total_slots\":%d,\"model_path\":", c->parallel);
    write_str(f, c->model_path ? c->model_path : c->model_id);
    fputs(",\"model_alias\":", f);
    write_str(f, c->model_id);
    /* sparq renders a known template family (core/chat.c) rather than
     * running the GGUF's Jinja text: the family in use is what is named */
    fputs(",\"chat_template\":", f);
    write_str(f, tmpl);
    fprintf(f, ",\"chat_template_fallback\":%s", c->chat_template_fallback ? "true" : "false");
    fputs(",\"bos_token\":", f);
    write_token(f, s->model, sparq_token_bos(s->model));
    fputs(",\"eos_token\":", f);
    write_token(f, s->model, sparq_token_eos(s->model));
    fputs(",\"modalities\":{\"vision\":false,\"audio\":false},\"build_info\":", f);
    write_str(f, c->build_info ? c->build_info : sparq_version());
    fputs(",\"is_sleeping\":false,\"sparq\":{\"version\":", f);
    write_str(f, sparq_version());
    fputs(",\"cpu\":", f);
    write_str(f, sparq_cpu_level());
    fputs(",\"attn\":", f);
    write_str(f, c->attn.policy ? c->attn.policy : "dense");
    fputs(",\"attn_policies\":[", f);
    for (int i = 0; sparq_attn_policy_name(i); i++) {
        if (i) fputc(',', f);
        write_str(f, sparq_attn_policy_name(i));
    }
    fprintf(f, "],\"kv_type\":\"%s\",\"max_prompt\":%d,\"queue\":%d}}", kv_name(c->kv_type), c->max_prompt,
            c->queue);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
