/* Server library without a socket: OpenAI request parsing (openai_parse) into
 * jobs and error objects, the SSE framing of streamed events
 * (openai_stream_events / openai_stream_end), the non-streaming response, and
 * the helpers they rest on (kvl_buf, UTF-8 checks, error JSON), request bodies
 * (json_parse_body), exact 64-bit seeds, API keys and tenant salts. The vocabulary is
 * the bundled stories260K model's; the server state is built here the way
 * srv_new builds it, minus the engine. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf.h"
#include "srv_internal.h"

#include "check.h"

static srv S;
static gguf_file *model_file;
static tok_vocab *vocab;

static bool setup(const char *model) {
    kvl_error err = {{0}};
    gguf_file *f = model_file = gguf_open(model, &err);
    if (!f) {
        fprintf(stderr, "cannot open %s: %s\n", model, err.msg);
        return false;
    }
    tok_vocab *v = vocab = tok_vocab_create(f, &err);
    if (!v) {
        fprintf(stderr, "cannot read the vocabulary of %s: %s\n", model, err.msg);
        return false;
    }
    server_config_default(&S.cfg);
    S.cfg.model_id = "tiny";
    S.vocab = v;
    S.n_ctx = 256; /* the pool holds less: 128 positions */
    S.n_blocks = 8;
    S.block_size = 16;
    S.max_seqs = 4;
    S.chat = CHAT_TMPL_CHATML;
    S.bos_text = tok_piece(v, tok_bos(v));
    S.eos_text = tok_piece(v, tok_eos(v));
    pthread_mutex_init(&S.tok_mu, NULL);
    return true; /* the file stays open until main ends: the vocabulary may point into it */
}

/* Parses body (JSON text); returns whether openai_parse accepted it. */
static bool parse(const char *json, bool chat, api_req *r, api_error *e) {
    cJSON *b = cJSON_Parse(json);
    if (!b) {
        fprintf(stderr, "test bug: bad JSON %s\n", json);
        abort();
    }
    memset(e, 0, sizeof *e);
    bool ok = openai_parse(&S, b, chat, r, e);
    cJSON_Delete(b);
    return ok;
}

/* A request that must be refused with status and param (NULL: no param). */
static void refused(const char *json, bool chat, int status, const char *param, const char *code) {
    api_req r;
    api_error e;
    bool ok = parse(json, chat, &r, &e);
    CHECK(!ok);
    if (ok) {
        fprintf(stderr, "  accepted: %s\n", json);
        api_req_free(&r);
        return;
    }
    CHECK(r.job == NULL);
    CHECK(e.status == status);
    CHECK(strcmp(e.param, param ? param : "") == 0);
    CHECK(code ? e.code && strcmp(e.code, code) == 0 : e.code == NULL);
    CHECK(e.msg[0] != 0);
    if (e.status != status || strcmp(e.param, param ? param : "") != 0)
        fprintf(stderr, "  %s -> %d '%s': %s\n", json, e.status, e.param, e.msg);
}

static int64_t encode(const char *text, bool add_bos, int32_t *ids, int64_t cap) {
    kvl_error err = {{0}};
    return tok_encode(S.vocab, text, strlen(text), add_bos, true, ids, cap, &err);
}

static void test_completion_parse(void) {
    api_req r;
    api_error e;
    CHECK(parse(
        "{\"model\":\"tiny\",\"prompt\":\"Once upon a time\",\"max_tokens\":5,\"temperature\":0,"
        "\"stop\":[\"a\",\"bc\"],\"n\":2,\"seed\":42,\"top_k\":-1,\"logprobs\":3}",
        false, &r, &e));
    if (!r.job) return;
    srv_job *j = r.job;
    int32_t ids[64];
    int64_t n = encode("Once upon a time", tok_add_bos(S.vocab), ids, 64);
    CHECK(n > 1 && j->n_prompt == n && memcmp(j->prompt, ids, (size_t)n * sizeof *ids) == 0);
    CHECK(j->max_tokens == 5 && j->n == 2);
    CHECK(j->sampling.temperature == 0 && j->sampling.seed == 42 && j->sampling.top_k == 0);
    CHECK(!j->vary_seed); /* greedy: every choice the same */
    CHECK(j->n_stop == 2 && strcmp(j->stop[0], "a") == 0 && strcmp(j->stop[1], "bc") == 0);
    CHECK(r.logprobs && j->logprobs && j->top_logprobs == 3);
    CHECK(!r.stream && !r.chat && strncmp(r.id, "cmpl-", 5) == 0);
    api_req_free(&r);

    /* Token ids, flat and nested; the OpenAI defaults. */
    CHECK(parse("{\"prompt\":[1,2,3]}", false, &r, &e));
    if (r.job) {
        CHECK(r.job->n_prompt == 3 && r.job->prompt[0] == 1 && r.job->prompt[2] == 3);
        CHECK(r.job->max_tokens == 16); /* completions default */
        CHECK(r.job->sampling.temperature == 1.0f && r.job->sampling.top_p == 1.0f);
        CHECK(r.job->vary_seed && r.job->n == 1 && r.job->n_stop == 0);
        CHECK(!r.job->no_speculative);
        api_req_free(&r);
    }
    /* logit_bias: ids as strings; a repeated id's biases add up (cJSON keeps both). */
    CHECK(
        parse("{\"prompt\":[1,2,3],\"logit_bias\":{\"7\":-100,\"9\":2.5,\"7\":1}}", false, &r, &e));
    if (r.job) {
        CHECK(r.job->n_logit_bias == 2 && r.job->logit_bias[0].token == 7 &&
              r.job->logit_bias[0].bias == -99.0f && r.job->logit_bias[1].token == 9 &&
              r.job->logit_bias[1].bias == 2.5f && !r.job->penalize_prompt);
        api_req_free(&r);
    }
    /* several prompts (vLLM's batch): n choices each, prompt-major */
    CHECK(parse("{\"prompt\":[\"Once\",[5,6,7],\"upon a time\"],\"n\":2}", false, &r, &e));
    if (r.job) {
        int64_t n1, n2;
        const int32_t *p1 = job_prompt(r.job, 1, &n1);
        job_prompt(r.job, 2, &n2);
        CHECK(r.job->n_prompts == 3 && r.job->per_prompt == 2 && r.job->n == 6);
        CHECK(n1 == 3 && p1[0] == 5 && p1[2] == 7 && n2 > 1);
        CHECK(job_prompt_tokens(r.job) == r.job->n_prompt + n1 + n2);
        api_req_free(&r);
    }
    CHECK(parse("{\"prompt\":[1,2,3],\"speculative\":false}", false, &r, &e));
    if (r.job) {
        CHECK(r.job->no_speculative);
        api_req_free(&r);
    }
    CHECK(parse("{\"prompt\":[[5,6]],\"stop\":\"x\",\"max_tokens\":254}", false, &r, &e));
    if (r.job) {
        CHECK(r.job->n_prompt == 2 && r.job->prompt[1] == 6);
        CHECK(r.job->n_stop == 1 && strcmp(r.job->stop[0], "x") == 0);
        CHECK(r.job->max_tokens == 254);
        api_req_free(&r);
    }
    CHECK(
        parse("{\"prompt\":[\"Once\"],\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
              false, &r, &e));
    if (r.job) {
        CHECK(r.stream && r.include_usage);
        api_req_free(&r);
    }
}

static void test_completion_refused(void) {
    int32_t nv = tok_n_vocab(S.vocab);
    char buf[256];
    refused("[1,2]", false, 400, NULL, NULL);
    refused("{}", false, 400, "prompt", NULL);
    refused("{\"prompt\":\"x\",\"model\":\"other\"}", false, 404, "model", "model_not_found");
    refused("{\"prompt\":[]}", false, 400, "prompt", NULL);
    refused("{\"prompt\":[1.5]}", false, 400, "prompt", NULL);
    refused("{\"prompt\":[-1]}", false, 400, "prompt", NULL);
    snprintf(buf, sizeof buf, "{\"prompt\":[%d]}", nv);
    refused(buf, false, 400, "prompt", NULL);
    refused("{\"prompt\":[\"a\",\"b\"],\"n\":9}", false, 400, "prompt", NULL); /* 18 > 16 */
    refused("{\"prompt\":[\"a\",[]]}", false, 400, "prompt", NULL);
    refused("{\"prompt\":[\"a\",7]}", false, 400, "prompt", NULL);
    refused("{\"prompt\":\"x\",\"n\":17}", false, 400, "n", NULL);
    refused("{\"prompt\":\"x\",\"n\":0}", false, 400, "n", NULL);
    refused("{\"prompt\":\"x\",\"temperature\":-1}", false, 400, "temperature", NULL);
    refused("{\"prompt\":\"x\",\"temperature\":\"hot\"}", false, 400, "temperature", NULL);
    refused("{\"prompt\":\"x\",\"top_p\":0}", false, 400, "top_p", NULL);
    refused("{\"prompt\":\"x\",\"seed\":1.5}", false, 400, "seed", NULL);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"echo\":true}", true, 400,
            "echo", NULL);
    refused("{\"prompt\":\"x\",\"echo\":1}", false, 400, "echo", NULL);
    refused("{\"prompt\":\"x\",\"best_of\":2}", false, 400, "best_of", NULL);
    refused("{\"prompt\":\"x\",\"logit_bias\":[[1,5]]}", false, 400, "logit_bias", NULL);
    refused("{\"prompt\":\"x\",\"logit_bias\":{\"a\":5}}", false, 400, "logit_bias", NULL);
    refused("{\"prompt\":\"x\",\"logit_bias\":{\"1\":101}}", false, 400, "logit_bias", NULL);
    refused("{\"prompt\":\"x\",\"logit_bias\":{\"-1\":1}}", false, 400, "logit_bias", NULL);
    snprintf(buf, sizeof buf, "{\"prompt\":\"x\",\"logit_bias\":{\"%d\":1}}", nv);
    refused(buf, false, 400, "logit_bias", NULL);
    refused("{\"prompt\":\"x\",\"stop\":[1]}", false, 400, "stop", NULL);
    refused("{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\","
            "\"10\",\"11\",\"12\","
            "\"13\",\"14\",\"15\",\"16\",\"17\"]}",
            false, 400, "stop", NULL);
    refused("{\"prompt\":\"x\",\"stream\":1}", false, 400, "stream", NULL);
    refused("{\"prompt\":\"x\",\"stream_options\":[]}", false, 400, "stream_options", NULL);
    refused("{\"prompt\":\"x\",\"max_tokens\":0}", false, 400, "max_tokens", NULL);
    refused("{\"prompt\":\"x\",\"cache_salt\":\"\"}", false, 400, "cache_salt", NULL);
    refused("{\"prompt\":\"x\",\"speculative\":\"no\"}", false, 400, "speculative", NULL);
    refused("{\"prompt\":[1,2,3],\"max_tokens\":254}", false, 400, "max_tokens",
            "context_length_exceeded");
    /* A prompt that fills the context by itself names the prompt. */
    char *big = malloc(8192), *p = big;
    p += sprintf(p, "{\"prompt\":[");
    for (int i = 0; i < 256; i++) p += sprintf(p, "%s7", i ? "," : "");
    sprintf(p, "]}");
    refused(big, false, 400, "prompt", "context_length_exceeded");
    free(big);
}

static void test_chat_parse(void) {
    api_req r;
    api_error e;
    CHECK(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief\"},"
                "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},{\"type\":"
                "\"text\",\"text\":"
                "\"there\"}]}],\"stream\":true,\"logprobs\":true,\"top_logprobs\":2}",
                true, &r, &e));
    if (!r.job) return;
    const chat_msg msgs[] = {{"system", "Be brief"}, {"user", "Hi\nthere"}};
    char *text = NULL;
    kvl_error kerr = {{0}};
    CHECK(chat_template_render(CHAT_TMPL_CHATML, S.bos_text, S.eos_text, msgs, 2, true, &text,
                               &kerr) > 0);
    int32_t ids[256];
    int64_t n = text ? encode(text, tok_add_bos(S.vocab), ids, 256) : -1;
    free(text);
    CHECK(n > 0 && r.job->n_prompt == n &&
          memcmp(r.job->prompt, ids, (size_t)n * sizeof *ids) == 0);
    CHECK(r.chat && r.stream && !r.include_usage && r.logprobs && r.job->top_logprobs == 2);
    CHECK(strncmp(r.id, "chatcmpl-", 9) == 0);
    /* Chat's default max_tokens: what the context and the pool leave. */
    CHECK(r.job->max_tokens == S.n_blocks * S.block_size - n);
    api_req_free(&r);

    refused("{\"messages\":[]}", true, 400, "messages", NULL);
    refused("{\"messages\":[{\"content\":\"x\"}]}", true, 400, "messages", NULL);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", true,
            400, "messages", NULL);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", true, 400,
            "top_logprobs", NULL);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
            true, 400, "max_completion_tokens", NULL);
    chat_family keep = S.chat;
    S.chat = CHAT_TMPL_UNKNOWN;
    snprintf(S.chat_error, sizeof S.chat_error, "no template");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", true, 400, "messages", NULL);
    S.chat = keep;
}

/* Every field is read, on the short ignored list, or refused naming it. */
static void test_unknown_fields(void) {
#define MSG "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]"
    refused("{" MSG ",\"frobnicate\":1}", true, 400, "frobnicate", NULL);
    refused("{\"prompt\":\"x\",\"suffix\":\"y\"}", false, 400, "suffix", NULL);
    refused("{\"prompt\":\"x\"," MSG "}", false, 400, "messages", NULL); /* chat only */
    refused("{\"prompt\":\"x\",\"max_completion_tokens\":2}", false, 400, "max_completion_tokens",
            NULL);
    refused("{" MSG ",\"prompt\":\"x\"}", true, 400, "prompt", NULL); /* completions only */
    refused("{" MSG ",\"echo\":false}", true, 400, "echo", NULL);
    refused("{" MSG ",\"functions\":[]}", true, 400, "functions", NULL);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"weird\":1}]}", true, 400,
            "messages", NULL);
    refused("{" MSG ",\"stream_options\":{\"include_usage\":true,\"extra\":1}}", true, 400,
            "stream_options", NULL);
    /* accepted: the ignored list, nulls, the fields other parsers own, what SDKs echo in messages */
    static const char *const ok[] = {
        "{" MSG
        ",\"user\":\"u\",\"metadata\":{\"a\":\"b\"},\"store\":false,\"service_tier\":\"auto\"}",
        "{" MSG
        ",\"prompt_cache_key\":\"k\",\"safety_identifier\":\"s\",\"unknown_but_null\":null}",
        "{" MSG ",\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"a\"},{\"role\":"
        "\"assistant\","
        "\"content\":\"y\",\"refusal\":null,\"annotations\":[]},{\"role\":\"user\",\"content\":"
        "\"z\"}]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        api_req r;
        api_error e;
        bool accepted = parse(ok[i], true, &r, &e);
        CHECK(accepted);
        if (!accepted) fprintf(stderr, "  refused %s: %s\n", ok[i], e.msg);
        else api_req_free(&r);
    }
#undef MSG
}

/* ---------------------------------------------------------- streaming -- */

static srv_event *event(int index, int32_t token, const char *text, engine_finish fin,
                        int64_t n_gen) {
    size_t len = strlen(text);
    srv_event *ev = calloc(1, sizeof *ev + len + 1);
    ev->index = index;
    ev->token = token;
    ev->logprob = -0.5f;
    ev->n_top = token >= 0 ? 2 : 0;
    ev->top_ids[0] = 3;
    ev->top_ids[1] = 4;
    ev->top_lps[0] = -0.5f;
    ev->top_lps[1] = -1.5f;
    ev->finish = fin;
    ev->stats.n_generated = n_gen;
    ev->stats.kv.allocated_bytes = 1000;
    ev->stats.kv.lower_bound_bytes = 600;
    ev->stats.n_cached_prompt = 16;
    ev->text_len = len;
    memcpy(ev->text, text, len);
    return ev;
}

static srv_event *chain(srv_event **evs, int n) {
    for (int i = 0; i + 1 < n; i++) evs[i]->next = evs[i + 1];
    return evs[0];
}

/* Splits an SSE body into its frames ("data: X\n\n"); returns how many, or -1
 * if the body is not a sequence of whole data frames. */
#define MAX_FRAMES 32
static int frames(const char *body, char *out[MAX_FRAMES]) {
    int n = 0;
    const char *p = body;
    while (*p) {
        if (strncmp(p, "data: ", 6) != 0 || n == MAX_FRAMES) return -1;
        const char *end = strstr(p, "\n\n");
        if (!end) return -1;
        size_t len = (size_t)(end - p - 6);
        if (memchr(p + 6, '\n', len)) return -1; /* one line per event */
        out[n] = strndup(p + 6, len);
        n++;
        p = end + 2;
    }
    return n;
}

static void frames_free(char **f, int n) {
    for (int i = 0; i < n; i++) free(f[i]);
}

static const char *str_at(const cJSON *o, const char *path0, const char *path1) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, path0);
    if (path1) v = cJSON_GetObjectItemCaseSensitive(v, path1);
    return cJSON_GetStringValue(v);
}

static const cJSON *choice0(const cJSON *chunk) {
    return cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(chunk, "choices"), 0);
}

static void test_chat_stream(void) {
    api_req r;
    api_error e;
    CHECK(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2,\"stream\":true,"
                "\"stream_options\":{\"include_usage\":true}}",
                true, &r, &e));
    if (!r.job) return;
    stream_state st = {0};
    kvl_buf out = {0};
    /* First step: a token for each choice. Nothing ends the stream yet. */
    srv_event *a[] = {event(0, 5, "Hi", ENGINE_FINISH_NONE, 0),
                      event(1, 6, " yo", ENGINE_FINISH_NONE, 0)};
    openai_stream_events(&S, &r, &st, chain(a, 2), &out);
    events_free(a[0]);
    char *f[MAX_FRAMES];
    int n = frames(out.p, f);
    CHECK(n == 4); /* per choice: the role delta, then the content */
    for (int i = 0; i < n; i++) {
        cJSON *c = cJSON_Parse(f[i]);
        CHECK(c != NULL);
        if (!c) continue;
        const cJSON *ch = choice0(c);
        CHECK(strcmp(str_at(c, "object", NULL), "chat.completion.chunk") == 0);
        CHECK(strcmp(str_at(c, "id", NULL), r.id) == 0 &&
              strcmp(str_at(c, "model", NULL), "tiny") == 0);
        CHECK(cJSON_GetObjectItem(ch, "index")->valueint == (i < 2 ? 0 : 1));
        CHECK(cJSON_IsNull(cJSON_GetObjectItem(ch, "finish_reason")));
        if (i % 2 == 0) {
            CHECK(strcmp(str_at(ch, "delta", "role"), "assistant") == 0);
            CHECK(strcmp(str_at(ch, "delta", "content"), "") == 0);
        } else {
            CHECK(str_at(ch, "delta", "role") == NULL);
            CHECK(strcmp(str_at(ch, "delta", "content"), i == 1 ? "Hi" : " yo") == 0);
        }
        cJSON_Delete(c);
    }
    frames_free(f, n > 0 ? n : 0);
    kvl_buf_free(&out);

    /* Second step: invalid UTF-8 is replaced; choice 0 ends, then choice 1.
     * The usage chunk and [DONE] come once, after the last choice ends. */
    srv_event *b[] = {event(0, 7, "\xff!", ENGINE_FINISH_NONE, 0),
                      event(0, -1, "", ENGINE_FINISH_STOP, 3)};
    openai_stream_events(&S, &r, &st, chain(b, 2), &out);
    events_free(b[0]);
    CHECK(out.p && !strstr(out.p, "[DONE]") && !strstr(out.p, "usage"));
    n = frames(out.p, f);
    CHECK(n == 2);
    if (n == 2) {
        cJSON *c0 = cJSON_Parse(f[0]), *c1 = cJSON_Parse(f[1]);
        CHECK(c0 && strcmp(str_at(choice0(c0), "delta", "content"), "\xEF\xBF\xBD!") == 0);
        CHECK(c1 &&
              cJSON_GetObjectItem(choice0(c1), "delta")->child == NULL); /* final: an empty delta */
        CHECK(c1 && strcmp(str_at(choice0(c1), "finish_reason", NULL), "stop") == 0);
        cJSON_Delete(c0);
        cJSON_Delete(c1);
    }
    frames_free(f, n > 0 ? n : 0);
    kvl_buf_free(&out);

    srv_event *c[] = {event(1, -1, "", ENGINE_FINISH_LENGTH, 4)};
    openai_stream_events(&S, &r, &st, c[0], &out);
    events_free(c[0]);
    n = frames(out.p, f);
    CHECK(n == 3);
    if (n == 3) {
        cJSON *fin = cJSON_Parse(f[0]), *usage = cJSON_Parse(f[1]);
        CHECK(fin && strcmp(str_at(choice0(fin), "finish_reason", NULL), "length") == 0);
        const cJSON *u = cJSON_GetObjectItem(usage, "usage");
        CHECK(u && cJSON_GetArraySize(cJSON_GetObjectItem(usage, "choices")) == 0);
        CHECK(cJSON_GetObjectItem(u, "completion_tokens")->valuedouble == 7);
        CHECK(cJSON_GetObjectItem(u, "prompt_tokens")->valuedouble == (double)r.job->n_prompt);
        CHECK(cJSON_GetObjectItem(u, "total_tokens")->valuedouble == (double)r.job->n_prompt + 7);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens")
                  ->valuedouble == 16);
        CHECK(cJSON_GetObjectItem(u, "kv_allocated_bytes")->valuedouble == 2000);
        CHECK(strcmp(f[2], "[DONE]") == 0);
        cJSON_Delete(fin);
        cJSON_Delete(usage);
    }
    frames_free(f, n > 0 ? n : 0);
    kvl_buf_free(&out);
    api_req_free(&r);
}

static void test_completion_stream(void) {
    api_req r;
    api_error e;
    CHECK(parse("{\"prompt\":[1,2],\"stream\":true,\"logprobs\":2}", false, &r, &e));
    if (!r.job) return;
    stream_state st = {0};
    kvl_buf out = {0};
    srv_event *a[] = {event(0, 5, "ab", ENGINE_FINISH_NONE, 0),
                      event(0, 6, "cde", ENGINE_FINISH_NONE, 0),
                      event(0, -1, "", ENGINE_FINISH_CANCELLED, 2)};
    openai_stream_events(&S, &r, &st, chain(a, 3), &out);
    events_free(a[0]);
    char *f[MAX_FRAMES];
    int n = frames(out.p, f);
    CHECK(n == 4); /* no usage chunk: not asked for */
    if (n == 4) {
        for (int i = 0; i < 3; i++) {
            cJSON *c = cJSON_Parse(f[i]);
            CHECK(c && strcmp(str_at(c, "object", NULL), "text_completion") == 0);
            const cJSON *ch = choice0(c), *lp = cJSON_GetObjectItem(ch, "logprobs");
            CHECK(strcmp(str_at(ch, "text", NULL), i == 0 ? "ab" : i == 1 ? "cde" : "") == 0);
            if (i < 2) {
                /* text_offset counts the bytes streamed before this token */
                CHECK(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 0)->valuedouble ==
                      (i ? 2 : 0));
                CHECK(cJSON_GetArraySize(
                          cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0)) == 2);
                CHECK(cJSON_IsNull(cJSON_GetObjectItem(ch, "finish_reason")));
            } else {
                CHECK(cJSON_IsNull(lp));
                CHECK(strcmp(str_at(ch, "finish_reason", NULL), "abort") == 0);
            }
            cJSON_Delete(c);
        }
        CHECK(strcmp(f[3], "[DONE]") == 0);
    }
    frames_free(f, n > 0 ? n : 0);
    kvl_buf_free(&out);

    /* The engine failed mid-stream: an error event, then [DONE]. */
    stream_state st2 = {0};
    st2.failed = true;
    r.include_usage = true;
    openai_stream_end(&S, &r, &st2, &out);
    n = frames(out.p, f);
    CHECK(n == 2);
    if (n == 2) {
        cJSON *c = cJSON_Parse(f[0]);
        CHECK(c && str_at(c, "error", "message") &&
              strcmp(str_at(c, "error", "type"), "server_error") == 0);
        CHECK(c && !cJSON_GetObjectItem(c, "usage"));
        CHECK(strcmp(f[1], "[DONE]") == 0);
        cJSON_Delete(c);
    }
    frames_free(f, n > 0 ? n : 0);
    kvl_buf_free(&out);
    api_req_free(&r);
}

static void test_response(void) {
    api_req r;
    api_error e;
    CHECK(parse("{\"prompt\":[1,2],\"n\":2}", false, &r, &e));
    if (!r.job) return;
    srv_event *a[] = {
        event(1, 5, "x", ENGINE_FINISH_NONE, 0), event(0, 6, "He", ENGINE_FINISH_NONE, 0),
        event(0, 7, "llo", ENGINE_FINISH_NONE, 0), event(0, -1, "", ENGINE_FINISH_STOP, 2),
        event(1, -1, "y", ENGINE_FINISH_LENGTH, 1)};
    char *js = openai_response(&S, &r, chain(a, 5));
    events_free(a[0]);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    CHECK(o != NULL);
    if (o) {
        const cJSON *ch = cJSON_GetObjectItem(o, "choices");
        CHECK(cJSON_GetArraySize(ch) == 2);
        CHECK(strcmp(str_at(cJSON_GetArrayItem(ch, 0), "text", NULL), "Hello") == 0);
        CHECK(strcmp(str_at(cJSON_GetArrayItem(ch, 1), "text", NULL), "xy") == 0);
        CHECK(strcmp(str_at(cJSON_GetArrayItem(ch, 0), "finish_reason", NULL), "stop") == 0);
        CHECK(strcmp(str_at(cJSON_GetArrayItem(ch, 1), "finish_reason", NULL), "length") == 0);
        CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")
                  ->valuedouble == 3);
        CHECK(strcmp(str_at(o, "object", NULL), "text_completion") == 0);
    }
    cJSON_Delete(o);
    free(js);
    api_req_free(&r);
}

/* -------------------------------------------------------------- tools -- */

/* No template here: tools go in the system message, calls are the generic JSON
 * format, parsed out of the output into message.tool_calls / delta.tool_calls. */
static void test_tool_calls(void) {
    const char *tools =
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}}}}}]";
    char body[512];
    api_req plain, r;
    api_error e;
    int64_t ctx = S.n_ctx, blocks = S.n_blocks;
    S.n_ctx = 1024; /* room for the tools' description */
    S.n_blocks = 64;
    CHECK(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", true, &plain, &e));
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],%s}", tools);
    CHECK(parse(body, true, &r, &e), "%s", e.msg);
    S.n_ctx = ctx;
    S.n_blocks = blocks;
    if (!r.job || !plain.job) return;
    CHECK(r.job->parse_fmt == TOOL_FMT_GENERIC && r.job->tools.n == 1);
    CHECK(r.job->n_prompt > plain.job->n_prompt + 20, "the tools are described in the prompt");
    CHECK(plain.job->parse_fmt == TOOL_FMT_NONE && !plain.job->think);
    api_req_free(&plain);

    /* Not streamed: the call's text split over tokens. */
    srv_event *a[] = {event(0, 5, "{\"name\": \"f\", ", ENGINE_FINISH_NONE, 0),
                      event(0, 6, "\"arguments\": {\"a\": \"\xc3\xa9\"}}", ENGINE_FINISH_NONE, 0),
                      event(0, -1, "", ENGINE_FINISH_STOP, 2)};
    char *js = openai_response(&S, &r, chain(a, 3));
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    const cJSON *msg = cJSON_GetObjectItem(choice0(o), "message");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    CHECK(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")), "%s", js);
    CHECK(str_at(call, "type", NULL) && !strcmp(str_at(call, "type", NULL), "function"));
    CHECK(str_at(call, "id", NULL) && !strncmp(str_at(call, "id", NULL), "call_", 5));
    CHECK(str_at(call, "function", "name") && !strcmp(str_at(call, "function", "name"), "f"));
    CHECK(str_at(call, "function", "arguments") &&
              !strcmp(str_at(call, "function", "arguments"), "{\"a\":\"\xc3\xa9\"}"),
          "%s", js);
    CHECK(str_at(choice0(o), "finish_reason", NULL) &&
          !strcmp(str_at(choice0(o), "finish_reason", NULL), "tool_calls"));
    cJSON_Delete(o);
    free(js);

    /* Streamed: the role, then the call (id, type, name, "" first; then the
     * arguments), then the finish chunk; no content delta. */
    stream_state st = {0};
    kvl_buf out = {0};
    openai_stream_events(&S, &r, &st, a[0], &out);
    events_free(a[0]);
    char *f[MAX_FRAMES];
    int n = frames(out.p, f);
    CHECK(n == 5, "%d frames:\n%s", n, out.p);
    for (int i = 0; i < n && n == 5; i++) {
        cJSON *c = cJSON_Parse(f[i]);
        const cJSON *ch = choice0(c);
        const cJSON *tc = cJSON_GetArrayItem(
            cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "tool_calls"), 0);
        if (i == 0) CHECK(!strcmp(str_at(ch, "delta", "role"), "assistant"));
        if (i == 1) {
            CHECK(cJSON_GetObjectItem(tc, "index")->valueint == 0 &&
                  !strncmp(str_at(tc, "id", NULL), "call_", 5));
            CHECK(!strcmp(str_at(tc, "function", "name"), "f") &&
                  !strcmp(str_at(tc, "function", "arguments"), ""));
        }
        if (i == 2) {
            CHECK(!cJSON_GetObjectItem(tc, "id") &&
                  !strcmp(str_at(tc, "function", "arguments"), "{\"a\":\"\xc3\xa9\"}"));
        }
        if (i < 3) CHECK(cJSON_IsNull(cJSON_GetObjectItem(ch, "finish_reason")));
        if (i == 4) CHECK(!strcmp(f[i], "[DONE]"), "last frame: %s", f[i]);
        if (i == 3) CHECK(!strcmp(str_at(ch, "finish_reason", NULL), "tool_calls"));
        CHECK(i == 0 || !str_at(ch, "delta", "content"), "frame %d: %s", i, f[i]);
        cJSON_Delete(c);
    }
    frames_free(f, n > 0 ? n : 0);
    kvl_buf_free(&out);
    stream_state_free(&st);
    api_req_free(&r);

    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
            "\"function\"}]}",
            true, 400, "tools[0]", NULL);
    refused("{\"prompt\":\"x\",\"tools\":[]}", false, 400, "tools", NULL);
    refused("{\"prompt\":\"x\",\"tool_choice\":\"none\"}", false, 400, "tool_choice", NULL);
    refused("{\"prompt\":\"x\",\"reasoning_effort\":\"low\"}", false, 400, "reasoning_effort",
            NULL);
}

/* ------------------------------------------------------------ helpers -- */

static void test_helpers(void) {
    kvl_buf b = {0};
    for (int i = 0; i < 1000; i++) kvl_buf_printf(&b, "%d,", i);
    CHECK(b.p && !b.oom && b.len == strlen(b.p) && strncmp(b.p, "0,1,2,", 6) == 0);
    CHECK(b.len > 3 && strcmp(b.p + b.len - 4, "999,") == 0);
    char big[1200];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = 0;
    size_t before = b.len;
    kvl_buf_printf(&b, "<%s>", big); /* longer than sb_printf's stack buffer */
    CHECK(b.len == before + sizeof big + 1 && b.p[b.len - 1] == '>');
    kvl_buf_put(&b, "a\0b", 3);
    CHECK(b.p[b.len - 2] == 0 && b.p[b.len] == 0);
    kvl_buf_free(&b);
    CHECK(b.p == NULL && b.len == 0);

    CHECK(utf8_valid("h\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80", 10));
    CHECK(!utf8_valid("\xC0\xAF", 2));         /* overlong '/' */
    CHECK(!utf8_valid("\xED\xA0\x80", 3));     /* surrogate */
    CHECK(!utf8_valid("\xF4\x90\x80\x80", 4)); /* above U+10FFFF */
    CHECK(!utf8_valid("\xE2\x82", 2));         /* cut short */
    CHECK(!utf8_valid("a\0b", 3));
    cJSON *t = json_text("a\0b\xE2\x82", 5);
    CHECK(t && strcmp(cJSON_GetStringValue(t), "a\xEF\xBF\xBD"
                                               "b\xEF\xBF\xBD\xEF\xBF\xBD") == 0);
    cJSON_Delete(t);

    CHECK(secret_equal("sk-abc", "sk-abc"));
    CHECK(!secret_equal("sk-abc", "sk-abd") && !secret_equal("sk-abc", "sk-ab") &&
          !secret_equal("", "x"));

    api_error e;
    CHECK(!api_fail(&e, 400, "max_tokens", "too %s", "many"));
    char *js = api_error_json(&e);
    cJSON *o = js ? cJSON_Parse(js) : NULL;
    CHECK(o && strcmp(str_at(o, "error", "message"), "too many") == 0);
    CHECK(o && strcmp(str_at(o, "error", "param"), "max_tokens") == 0);
    CHECK(o && strcmp(str_at(o, "error", "type"), "invalid_request_error") == 0);
    cJSON_Delete(o);
    free(js);
}

/* ------------------------------------------------ bodies, seeds, keys -- */

/* json_parse_body on n bytes of text: NULL (with a 400) or the parsed body. */
static cJSON *body_of(const char *text, size_t n) {
    api_error e;
    memset(&e, 0, sizeof e);
    cJSON *b = json_parse_body(text, n, &e);
    if (!b) CHECK(e.status == 400 && e.msg[0]);
    return b;
}

static bool body_ok(const char *text) {
    cJSON *b = body_of(text, strlen(text));
    cJSON_Delete(b);
    return b != NULL;
}

/* The seed openai_parse takes from a body that went through json_parse_body. */
static bool seed_of(const char *text, uint64_t *seed) {
    cJSON *b = body_of(text, strlen(text));
    if (!b) return false;
    api_req r;
    api_error e;
    bool ok = openai_parse(&S, b, false, &r, &e);
    cJSON_Delete(b);
    if (!ok) return false;
    *seed = r.job->sampling.seed;
    api_req_free(&r);
    return true;
}

static void test_bodies(void) {
    CHECK(body_ok("{\"prompt\":\"x\"}"));
    CHECK(body_ok(" {\"prompt\":\"x\"} \r\n\t"));
    CHECK(!body_ok("{\"prompt\":\"x\"} x"));
    CHECK(!body_ok("{\"prompt\":\"x\"}{}"));
    CHECK(!body_ok("{\"prompt\":\"x\"},"));
    CHECK(!body_of("{\"prompt\":\"x\"}\0", 15)); /* a raw NUL after the value */
    CHECK(!body_ok("{\"prompt\":\"a\\u0000b\"}"));
    CHECK(!body_ok("{\"messages\":[{\"content\":\"\\u0000\"}]}"));
    CHECK(!body_ok("{\"a\\u0000\":1}"));            /* in a key too */
    CHECK(body_ok("{\"prompt\":\"a\\\\u0000b\"}")); /* an escaped backslash, then text */
    CHECK(body_ok("{\"prompt\":\"\\\"\\\\\",\"x\":\"\\u0001\"}"));

    /* Top-level numbers keep their text, nested ones are not needed. */
    const char *nums = "{ \"s\" : \"1,}\" , \"n\":[1,{\"k\":2}], \"seed\" :-0012 ,\"t\":1e3}";
    cJSON *b = body_of(nums, strlen(nums));
    CHECK(b != NULL);
    if (b) {
        const cJSON *seed = cJSON_GetObjectItem(b, "seed"), *tt = cJSON_GetObjectItem(b, "t");
        CHECK(seed && seed->valuestring && strcmp(seed->valuestring, "-0012") == 0);
        CHECK(tt && tt->valuestring && strcmp(tt->valuestring, "1e3") == 0);
        CHECK(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "n"), 0)->valuestring == NULL);
    }
    cJSON_Delete(b);

    uint64_t seed = 0;
    CHECK(seed_of("{\"prompt\":\"x\",\"seed\":18446744073709551615}", &seed) && seed == UINT64_MAX);
    CHECK(seed_of("{\"prompt\":\"x\",\"seed\":18446744073709551614}", &seed) &&
          seed == UINT64_MAX - 1);
    CHECK(seed_of("{\"prompt\":\"x\",\"seed\":9007199254740993}", &seed) &&
          seed == 9007199254740993ull);
    CHECK(seed_of("{\"prompt\":\"x\",\"seed\":-1}", &seed) && seed == UINT64_MAX);
    CHECK(seed_of("{\"prompt\":\"x\",\"seed\":-9223372036854775808}", &seed) && seed == 1ull << 63);
    CHECK(seed_of("{\"prompt\":\"x\",\"seed\":1e3}", &seed) && seed == 1000);
    CHECK(!seed_of("{\"prompt\":\"x\",\"seed\":18446744073709551616}", &seed));
    CHECK(!seed_of("{\"prompt\":\"x\",\"seed\":2.5}", &seed));
}

static void test_keys(void) {
    srv s;
    memset(&s, 0, sizeof s);
    server_config_default(&s.cfg);
    s.cfg.api_key = "k-one";
    CHECK(keys_load(&s) && s.n_keys == 1);
    const srv_key *k = keys_match(&s, "Bearer k-one");
    CHECK(k && k == keys_match(&s, "bearer   k-one"));
    CHECK(!keys_match(&s, "Bearer k-on") && !keys_match(&s, "Bearer k-one ") &&
          !keys_match(&s, "k-one") && !keys_match(&s, NULL) && !keys_match(&s, "Bearer "));
    bool oom;
    char *a = tenant_salt(&s, k, NULL, &oom), *b = tenant_salt(&s, k, "x", &oom),
         *c = tenant_salt(&s, NULL, "x", &oom);
    CHECK(a && b && c && strlen(a) == 17 && strncmp(a, b, 17) == 0 && strcmp(b + 17, "x") == 0 &&
          strcmp(c, "x") == 0);
    CHECK(!tenant_salt(&s, NULL, NULL, &oom) && !oom);
    s.cfg.prefix_cache_shared = true;
    char *d = tenant_salt(&s, k, "x", &oom);
    CHECK(d && strcmp(d, "x") == 0);
    free(a), free(b), free(c), free(d);
    keys_free(&s);
    CHECK(s.n_keys == 0 && s.keys == NULL);
}

/* srv_guard: marks around what could form a control token (stories260K: <s>,
 * </s>, <unk>), removed again by srv_unguard with the ranges they enclosed;
 * a client's own U+FDD0..U+FDD2 survive; a text without either is unchanged. */
static void test_guard(void) {
    static const struct {
        const char *in;
        size_t n_spans;
        size_t off[2], len[2];
    } cases[] = {
        {"plain text", 0, {0}, {0}},
        {"x</s>", 1, {1}, {4}},
        {"</s></s>y<s>", 2, {0, 9}, {8, 3}}, /* touching ranges merge */
        {"a</s>b<unk>c", 2, {1, 6}, {4, 5}},
        {"s>tail", 1, {0}, {2}}, /* a head that could end "</s>" */
        {"head</", 1, {4}, {2}}, /* a tail that could start it */
        {"\xEF\xB7\x90x\xEF\xB7\x91</s>\xEF\xB7\x92", 1, {7}, {4}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *in = cases[i].in;
        size_t n = strlen(in), glen = 0, n_spans = 99;
        char *g = srv_guard_string(vocab, in, n, &glen);
        CHECK(g != NULL);
        if (!g) continue;
        CHECK((glen == n) == (cases[i].n_spans == 0 && !strstr(in, "\xEF\xB7")), "case %zu", i);
        tok_span *spans = NULL;
        CHECK(srv_unguard(g, &glen, &spans, &n_spans));
        CHECK(glen == n && memcmp(g, in, n) == 0, "case %zu: text back", i);
        CHECK(n_spans == cases[i].n_spans, "case %zu: %zu ranges", i, n_spans);
        for (size_t k = 0; k < n_spans && k < cases[i].n_spans; k++)
            CHECK(spans[k].off == cases[i].off[k] && spans[k].len == cases[i].len[k],
                  "case %zu range %zu: %zu+%zu", i, k, spans[k].off, spans[k].len);
        free(spans);
        free(g);
    }
}

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : "models/stories260K.gguf";
    if (!setup(model)) return 1;
    test_completion_parse();
    test_completion_refused();
    test_chat_parse();
    test_unknown_fields();
    test_chat_stream();
    test_completion_stream();
    test_response();
    test_tool_calls();
    test_helpers();
    test_bodies();
    test_keys();
    test_guard();
    pthread_mutex_destroy(&S.tok_mu);
    tok_vocab_destroy(vocab);
    gguf_close(model_file);
    if (failures) fprintf(stderr, "test_server: %d failure(s)\n", failures);
    else printf("test_server: all passed\n");
    return failures != 0;
}
