/* Chat templates: family detection from the official Jinja sources and the
 * rendered prompts, compared with what those templates produce (evaluated by
 * hand from the Jinja; the same conversation as llama.cpp's test-chat-template). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"

#include "check.h"

#define DS_BOS                                                                                     \
    "<\xEF\xBD\x9C"                                                                                \
    "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define DS_EOS                                                                                     \
    "<\xEF\xBD\x9C"                                                                                \
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define DS_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define DS_ASSISTANT                                                                               \
    "<\xEF\xBD\x9C"                                                                                \
    "Assistant\xEF\xBD\x9C>"

static const chat_msg CONV[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV 6

/* Official templates (abridged where the rest only concerns tools). */
static const char *T_CHATML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                              "'\\n' + message['content'] + "
                              "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
                              "'<|im_start|>assistant\\n' }}{% endif %}";
static const char *T_LLAMA3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ "
    "content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char *T_LLAMA2 =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = "
    "false %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
    "}}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% "
    "endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% "
    "endif %}{% endfor %}";
static const char *T_MISTRAL =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 "
    "% 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
    "}}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
    "message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ "
    "raise_exception('Only "
    "user and assistant roles are supported!') }}{% endif %}{% endfor %}";
static const char *T_GEMMA =
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
    "messages[0]['content'] + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- "
    "set "
    "first_user_prefix = \"\" -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message "
    "in "
    "loop_messages -%}{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- "
    "else -%}"
    "{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\\n' + "
    "(first_user_prefix "
    "if loop.first else \"\") }}{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}{%- endfor "
    "-%}{%- if "
    "add_generation_prompt -%}{{'<start_of_turn>model\\n'}}{%- endif -%}";
static const char *T_DEEPSEEK3 =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif "
    "%}{% set ns = "
    "namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}{%- for "
    "message in "
    "messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = message['content'] "
    "%}{%- endif %}"
    "{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if "
    "message['role'] == "
    "'user' %}{{'" DS_USER
    "' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and "
    "message['content'] is not none %}{{'" DS_ASSISTANT "' + message['content'] + '" DS_EOS
    "'}}{%- endif %}"
    "{%- endfor -%}{% if add_generation_prompt %}{{'" DS_ASSISTANT "'}}{% endif %}";
static const char *T_DEEPSEEK2 =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif "
    "%}"
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + "
    "message['content'] + '\\n\\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + "
    "message['content'] + eos_token }}{% elif message['role'] == 'system' %}{{ message['content'] "
    "+ '\\n\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
static const char *T_UNKNOWN = "{% for message in messages %}{{'### ' + message['role'] + ': ' + "
                               "message['content'] + '\\n'}}{% endfor %}";

static void test_detect(void) {
    CHECK(chat_template_detect(NULL) == CHAT_TMPL_CHATML);
    CHECK(chat_template_detect("") == CHAT_TMPL_CHATML);
    CHECK(chat_template_detect(T_CHATML) == CHAT_TMPL_CHATML);
    CHECK(chat_template_detect(T_LLAMA3) == CHAT_TMPL_LLAMA3);
    CHECK(chat_template_detect(T_LLAMA2) == CHAT_TMPL_LLAMA2);
    CHECK(chat_template_detect(T_MISTRAL) == CHAT_TMPL_MISTRAL);
    CHECK(chat_template_detect(T_GEMMA) == CHAT_TMPL_GEMMA);
    CHECK(chat_template_detect(T_DEEPSEEK3) == CHAT_TMPL_DEEPSEEK3);
    CHECK(chat_template_detect(T_DEEPSEEK2) == CHAT_TMPL_DEEPSEEK2);
    CHECK(chat_template_detect(T_UNKNOWN) == CHAT_TMPL_UNKNOWN);
    CHECK(chat_family_from_name("gemma") == CHAT_TMPL_GEMMA);
    CHECK(chat_family_from_name("nope") == CHAT_TMPL_UNKNOWN);
    CHECK(strcmp(chat_family_name(CHAT_TMPL_DEEPSEEK3), "deepseek3") == 0);
}

/* Renders CONV[first..] with tmpl's family and the given BOS/EOS texts. */
static void expect(const char *tmpl, int first, const char *bos, const char *eos,
                   const char *want) {
    char *out = NULL;
    kvl_error err = {{0}};
    int64_t n = chat_template_render(chat_template_detect(tmpl), bos, eos, CONV + first,
                                     N_CONV - first, true, &out, &err);
    CHECK(n >= 0);
    if (n < 0) {
        fprintf(stderr, "  error: %s\n", err.msg);
        return;
    }
    CHECK((size_t)n == strlen(out));
    if (strcmp(out, want) != 0) {
        fprintf(stderr, "  family %s\n  got:  [%s]\n  want: [%s]\n",
                chat_family_name(chat_template_detect(tmpl)), out, want);
        failures++;
    }
    free(out);
}

static void test_render(void) {
    expect(T_CHATML, 0, NULL, NULL,
           "<|im_start|>system\nYou are a helpful "
           "assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
           "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
           "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
           "question"
           "<|im_end|>\n<|im_start|>assistant\n");
    expect(
        T_LLAMA3, 0, "<|begin_of_text|>", "<|eot_id|>",
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
        "assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho "
        "are you"
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>"
        "assistant<|end_header_id|>\n\n");
    expect(
        T_LLAMA2, 0, "<s>", "</s>",
        "<s>[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there </s>"
        "<s>[INST] Who are you [/INST] I am an assistant </s><s>[INST] Another question [/INST]");
    expect(
        T_MISTRAL, 1, "<s>", "</s>",
        "<s>[INST] Hello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>"
        "[INST] Another question [/INST]");
    expect(T_MISTRAL, 0, "<s>", "</s>",
           "<s>[INST] You are a helpful assistant\n\nHello [/INST]Hi there</s>[INST] Who are you "
           "[/INST]"
           "   I am an assistant   </s>[INST] Another question [/INST]");
    expect(T_GEMMA, 0, "<bos>", "<eos>",
           "<bos><start_of_turn>user\nYou are a helpful "
           "assistant\n\nHello<end_of_turn>\n<start_of_turn>model\n"
           "Hi there<end_of_turn>\n<start_of_turn>user\nWho are "
           "you<end_of_turn>\n<start_of_turn>model\n"
           "I am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n"
           "<start_of_turn>model\n");
    expect(T_DEEPSEEK3, 0, DS_BOS, DS_EOS,
           DS_BOS "You are a helpful assistant" DS_USER "Hello" DS_ASSISTANT
                  "Hi there" DS_EOS DS_USER "Who are you" DS_ASSISTANT
                  "   I am an assistant   " DS_EOS DS_USER "Another question" DS_ASSISTANT);
    expect(T_DEEPSEEK2, 0, "", DS_EOS,
           "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there" DS_EOS
           "User: Who are you\n\n"
           "Assistant:    I am an assistant   " DS_EOS "User: Another question\n\nAssistant:");
    /* The families' default BOS/EOS texts are the official ones. */
    expect(T_GEMMA, 1, NULL, NULL,
           "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\nHi "
           "there<end_of_turn>\n"
           "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant"
           "<end_of_turn>\n<start_of_turn>user\nAnother "
           "question<end_of_turn>\n<start_of_turn>model\n");
}

static void test_errors(void) {
    char *out = (char *)1;
    kvl_error err = {{0}};
    CHECK(chat_template_apply(T_UNKNOWN, CONV, N_CONV, true, &out, &err) < 0);
    CHECK(out == NULL && strstr(err.msg, "unsupported chat template") != NULL);
    /* user, user: the Llama 2 / Gemma templates raise an exception */
    chat_msg twice[] = {{"user", "a"}, {"user", "b"}};
    CHECK(chat_template_apply(T_LLAMA2, twice, 2, true, &out, &err) < 0);
    CHECK(strstr(err.msg, "alternate") != NULL);
    CHECK(chat_template_apply(T_GEMMA, twice, 2, true, &out, &err) < 0);
    chat_msg tool[] = {{"user", "a"}, {"tool", "b"}};
    CHECK(chat_template_apply(T_DEEPSEEK3, tool, 2, true, &out, &err) < 0);
    CHECK(strstr(err.msg, "tool") != NULL);
    chat_msg late_sys[] = {{"user", "a"}, {"system", "b"}};
    CHECK(chat_template_apply(T_MISTRAL, late_sys, 2, true, &out, &err) < 0);
    /* ChatML passes any role through, as its template does */
    CHECK(chat_template_apply(NULL, tool, 2, false, &out, &err) > 0);
    CHECK(strcmp(out, "<|im_start|>user\na<|im_end|>\n<|im_start|>tool\nb<|im_end|>\n") == 0);
    free(out);
    /* "developer" (OpenAI's newer name) is the system role */
    chat_msg dev[] = {{"developer", "d"}, {"user", "u"}};
    CHECK(chat_template_apply(T_LLAMA3, dev, 2, false, &out, &err) > 0);
    CHECK(strstr(out, "<|start_header_id|>system<|end_header_id|>\n\nd") != NULL);
    free(out);
    chat_msg null_content[] = {{"user", NULL}};
    CHECK(chat_template_apply(NULL, null_content, 1, true, &out, &err) < 0);
    /* no messages: just the generation prompt */
    CHECK(chat_template_apply(NULL, NULL, 0, true, &out, &err) ==
          (int64_t)strlen("<|im_start|>assistant\n"));
    free(out);
}

int main(void) {
    test_detect();
    test_render();
    test_errors();
    if (failures) {
        fprintf(stderr, "test_chat_template: %d failure(s)\n", failures);
        return 1;
    }
    printf("test_chat_template: ok\n");
    return 0;
}
