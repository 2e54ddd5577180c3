/* test_chat.c - chat templates render exactly the published formats
 * (written out by hand below) and are detected from Jinja markers. */
#include "test.h"
#include "core/chat.h"

static void expect_render(const char *tmpl, const chat_msg *msgs, int n, int add, const char *want)
{
    char out[1024];
    int len = chat_render(tmpl, msgs, n, add, out, sizeof out);
    CHECK(len == (int)strlen(want) && strcmp(out, want) == 0, "%s:\n got '%s'\nwant '%s'", tmpl, out, want);
    char small[8]; /* truncation still reports the full length */
    CHECK(chat_render(tmpl, msgs, n, add, small, sizeof small) == len && strlen(small) == 7, "%s truncation", tmpl);
}

int main(void)
{
    const chat_msg conv[] = { { "system", "Be brief." }, { "user", "Hi" }, { "assistant", "Hello!" },
                              { "user", "2+2?" } };
    expect_render("llama3", conv, 4, 1,
                  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_render("chatml", conv, 4, 1,
                  "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_render("qwen", conv + 1, 1, 0, "<|im_start|>user\nHi<|im_end|>\n");
    expect_render("gemma", conv + 1, 3, 1,
                  "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                  "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n");
    expect_render("phi3", conv, 4, 1,
                  "<s><|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
                  "<|user|>\n2+2?<|end|>\n<|assistant|>\n");
    expect_render("mistral", conv, 4, 1, "<s>[INST] Be brief.\n\nHi [/INST] Hello!</s>[INST] 2+2? [/INST]");

    char out[16];
    CHECK(chat_render("vicuna", conv, 1, 1, out, sizeof out) == -1, "unknown template");
    CHECK(chat_template_canonical("nope") == NULL, "unknown name");

    const char *j1 = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}";
    const char *j2 = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>";
    const char *j3 = "{{ bos_token }}{% for message in messages %}[INST] {{ message['content'] }} [/INST]";
    const char *j4 = "<start_of_turn>{{ role }}";
    CHECK(strcmp(chat_template_detect(j1, strlen(j1)), "chatml") == 0, "detect chatml");
    CHECK(strcmp(chat_template_detect(j2, strlen(j2)), "llama3") == 0, "detect llama3");
    CHECK(strcmp(chat_template_detect(j3, strlen(j3)), "mistral") == 0, "detect mistral");
    CHECK(strcmp(chat_template_detect(j4, strlen(j4)), "gemma") == 0, "detect gemma");
    const char *j5 = "{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + message['content'] + "
                     "'<|end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}";
    CHECK(strcmp(chat_template_detect(j5, strlen(j5)), "phi3") == 0, "detect phi3");
    CHECK(chat_template_detect("{{ messages }}", 14) == NULL, "no marker");
    return test_summary("test_chat");
}
