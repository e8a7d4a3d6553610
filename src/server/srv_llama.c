/* llama-server's own completion API: POST /completion (and /completions),
 * which llama.cpp's clients and scripts call; /infill (srv_infill.c) lays out
 * its prompt and comes here. Request side (this file): the prompt (a
 * string, token ids, or ids and strings mixed), stop strings, grammar and
 * adapters go through the OpenAI completions parser, in a body rebuilt with
 * only the fields it reads; the sampling is llama-server's own: its defaults
 * (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), its sampler list, its
 * penalty window over the prompt's last repeat_last_n tokens, its logit_bias
 * forms, its other samplers (typical, top-n-sigma, XTC, dynamic temperature,
 * min_keep, mirostat, DRY) and its sampler lists in any order. The sampler
 * kvllm does not have (adaptive-p) is accepted only at its "off" values;
 * the fields that change nothing in the output (cache_prompt, id_slot, n_keep,
 * ...) are accepted. The response side is srv_llama_out.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_internal.h"

void llama_req_free(llama_req *q) {
    if (!q) return;
    cJSON_Delete(q->settings);
    cJSON_Delete(q->samplers);
    cJSON_Delete(q->fields);
    for (int k = 0; k < SRV_MAX_N; k++) cJSON_Delete(q->prompt_text[k]);
    for (int i = 0; i < SRV_MAX_N; i++) {
        kvl_buf_free(&q->content[i]);
        cJSON_Delete(q->tokens[i]);
        cJSON_Delete(q->probs[i]);
    }
    free(q);
}

/* ------------------------------------------------------------ request -- */

/* Fields of llama's samplers that kvllm does not have: accepted at the
 * value (or range) that switches them off, refused otherwise. */
typedef enum off_kind { OFF_EQ, OFF_LE, OFF_LT, OFF_FALSE } off_kind;
static const struct {
    const char *name;
    off_kind kind;
    double value;
    const char *what;
} OFF_FIELDS[] = {
    {"adaptive_target", OFF_LT, 0, "adaptive-p sampling"},
    {"verbose", OFF_FALSE, 0, "the __verbose field"},
    {"backend_sampling", OFF_FALSE, 0, "backend sampling"},
    {"grammar_lazy", OFF_FALSE, 0, "lazy grammars"},
};

/* Fields that change nothing in the output here: the prefix cache is always
 * on and exact (cache_prompt, n_cache_reuse), a context is never
 * shifted (n_keep, n_discard: a request that does not fit is refused), and
 * the parameters of samplers that are off. */
static const char *const NEUTRAL_FIELDS
    [] = {"cache_prompt",
          "n_keep",
          "n_discard",
          "n_cache_reuse",
          "sse_ping_interval",
          "adaptive_decay",
          "stream_options",
          "t_max_prompt_ms"}; /* llama.vscode sends it; llama-server reads it nowhere (a TODO there) */

/* Read here or passed on to the OpenAI parser. */
static const char *const OWN_FIELDS[] = {"prompt",
                                         "id_slot",
                                         "n_indent",
                                         "t_max_predict_ms",
                                         "n_predict",
                                         "max_tokens",
                                         "max_completion_tokens",
                                         "n_cmpl",
                                         "n",
                                         "seed",
                                         "n_probs",
                                         "logprobs",
                                         "temperature",
                                         "top_k",
                                         "top_p",
                                         "min_p",
                                         "repeat_penalty",
                                         "repeat_last_n",
                                         "presence_penalty",
                                         "frequency_penalty",
                                         "samplers",
                                         "typical_p",
                                         "top_n_sigma",
                                         "xtc_probability",
                                         "xtc_threshold",
                                         "dynatemp_range",
                                         "dynatemp_exponent",
                                         "min_keep",
                                         "mirostat",
                                         "mirostat_tau",
                                         "mirostat_eta",
                                         "dry_multiplier",
                                         "dry_base",
                                         "dry_allowed_length",
                                         "dry_penalty_last_n",
                                         "dry_sequence_breakers",
                                         "logit_bias",
                                         "return_tokens",
                                         "post_sampling_probs",
                                         "response_fields",
                                         "chat_parser",
                                         "model",
                                         "stop",
                                         "stream",
                                         "grammar",
                                         "json_schema",
                                         "ignore_eos",
                                         "lora",
                                         "cache_salt",
                                         "timings_per_token",
                                         "return_progress"};

static bool in(const char *k, const char *const *list, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(k, list[i]) == 0) return true;
    return false;
}
#define IN(k, list) in(k, list, sizeof list / sizeof *list)

static bool check_fields(const cJSON *b, api_error *err) {
    for (const cJSON *f = b->child; f; f = f->next) {
        const char *k = f->string;
        if (cJSON_IsNull(f) || IN(k, OWN_FIELDS) || IN(k, NEUTRAL_FIELDS)) continue;
        size_t i = 0;
        while (i < sizeof OFF_FIELDS / sizeof *OFF_FIELDS && strcmp(OFF_FIELDS[i].name, k)) i++;
        if (i == sizeof OFF_FIELDS / sizeof *OFF_FIELDS)
            return api_fail(err, 400, k, "Unrecognized request argument supplied: %s", k);
        bool off;
        if (OFF_FIELDS[i].kind == OFF_FALSE) {
            if (!cJSON_IsBool(f)) return api_fail(err, 400, k, "'%s' must be a boolean", k);
            off = cJSON_IsFalse(f);
        } else {
            if (!cJSON_IsNumber(f)) return api_fail(err, 400, k, "'%s' must be a number", k);
            const double v = f->valuedouble, w = OFF_FIELDS[i].value;
            off = OFF_FIELDS[i].kind == OFF_EQ   ? v == w
                  : OFF_FIELDS[i].kind == OFF_LE ? v <= w
                                                 : v < w;
        }
        if (!off)
            return api_fail(err, 400, k, "%s is not supported: leave '%s' at its default (off)",
                            OFF_FIELDS[i].what, k);
    }
    return true;
}

/* llama's chat_parser field, which its tools put on /completion requests
 * too: only the parser that accepts anything is accepted (it leaves the
 * content as generated). */
static bool check_chat_parser(const cJSON *b, api_error *err) {
    const cJSON *p = req_field(b, "chat_parser");
    if (!p) return true;
    cJSON *want = cJSON_Parse("{\"parsers\":[{\"type\":\"epsilon\"}],\"rules\":{},\"root\":0}");
    cJSON *got = cJSON_IsString(p) ? cJSON_Parse(p->valuestring) : NULL;
    bool ok = want && got && cJSON_Compare(want, got, true);
    cJSON_Delete(want);
    cJSON_Delete(got);
    return ok ? true
              : api_fail(err, 400, "chat_parser",
                         "'chat_parser': only the no-op parser ({\"parsers\": [{\"type\": "
                         "\"epsilon\"}], ...}) is supported on /completion");
}

int32_t *llama_tokenize_mixed(srv *s, const cJSON *v, bool add_special, bool parse_special,
                              const char *param, int64_t *n_out, api_error *err) {
    const tok_mode mode = {.parse_special = parse_special};
    if (!cJSON_IsString(v) && !cJSON_IsArray(v))
        return api_fail(err, 400, param, "'%s' must be a string, or token ids and strings", param),
               NULL;
    /* a token covers a byte at least: more text could not fit; bounds the work */
    size_t bytes = cJSON_IsString(v) ? strlen(v->valuestring) : 0;
    for (const cJSON *e = cJSON_IsArray(v) ? v->child : NULL; e; e = e->next)
        if (cJSON_IsString(e)) bytes += strlen(e->valuestring);
    if (bytes > (size_t)s->n_ctx * 256)
        return api_fail(err, 400, param,
                        "'%s' is too long (%zu bytes) for the context of %lld tokens", param, bytes,
                        (long long)s->n_ctx),
               NULL;
    if (cJSON_IsString(v))
        return srv_encode_special(s, v->valuestring, bytes, add_special, mode, n_out, param, err);
    const int32_t n_vocab = tok_n_vocab(s->vocab);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    bool first = true, ok = true;
    for (const cJSON *e = v->child; ok && e; e = e->next, first = false) {
        int64_t m = 1;
        int32_t one, *t = &one;
        if (cJSON_IsString(e)) {
            t = srv_encode_special(s, e->valuestring, strlen(e->valuestring), first && add_special,
                                   mode, &m, param, err);
            ok = t != NULL;
        } else if (cJSON_IsNumber(e) && e->valuedouble == floor(e->valuedouble) &&
                   e->valuedouble >= 0 && e->valuedouble < n_vocab) {
            one = (int32_t)e->valuedouble;
        } else {
            ok = api_fail(err, 400, param,
                          "'%s' holds something that is neither a token id (0..%d) nor a string",
                          param, n_vocab - 1);
        }
        if (ok && m > 0 && !kvl_grow((void **)&ids, &cap, n + (size_t)m, sizeof *ids, 64))
            ok = api_fail(err, 500, NULL, "out of memory");
        if (ok && m > 0) memcpy(ids + n, t, (size_t)m * sizeof *ids), n += (size_t)m;
        if (t != &one) free(t);
    }
    if (!ok) {
        free(ids);
        return NULL;
    }
    *n_out = (int64_t)n;
    return ids ? ids : malloc(sizeof *ids); /* an empty array: no ids, not a failure */
}

/* One prompt as the OpenAI parser takes it: ids. Text, alone or mixed with
 * ids, is tokenized here as llama's tokenize_mixed does it
 * (llama_tokenize_mixed: special tokens parsed, BOS and EOS where the
 * vocabulary adds them). NULL with err otherwise. */
static cJSON *one_prompt(srv *s, const cJSON *p, api_error *err) {
    if (cJSON_IsObject(p)) { /* {"prompt_string", "multimodal_data"} */
        const char *k =
            json_unknown_key(p, (const char *const[]){"prompt_string", "multimodal_data", NULL});
        const cJSON *mm = req_field(p, "multimodal_data");
        if (k) return api_fail(err, 400, "prompt", "'prompt': unknown field '%.60s'", k), NULL;
        if (mm && (!cJSON_IsArray(mm) || mm->child))
            return api_fail(err, 400, "prompt", "multimodal data is not supported (a text model)"),
                   NULL;
        p = req_field(p, "prompt_string");
        if (!cJSON_IsString(p))
            return api_fail(err, 400, "prompt", "'prompt.prompt_string' must be a string"), NULL;
    }
    if (!cJSON_IsString(p) && (!cJSON_IsArray(p) || !p->child))
        return api_fail(err, 400, "prompt",
                        "'prompt' must be a string, token ids, or ids and strings mixed"),
               NULL;
    bool strings = cJSON_IsString(p);
    for (const cJSON *e = strings ? NULL : p->child; e; e = e->next) strings |= cJSON_IsString(e);
    if (!strings) return cJSON_Duplicate(p, true); /* ids (checked there) */
    /* text tokenized here, as llama's tokenize_mixed: BOS and EOS where the
     * vocabulary adds them (EOS after a string prompt: embedding vocabularies) */
    int64_t n = 0;
    int32_t *t = llama_tokenize_mixed(s, p, true, true, "prompt", &n, err);
    if (!t) return NULL;
    cJSON *ids = cJSON_CreateArray();
    for (int64_t k = 0; k < n; k++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(t[k]));
    free(t);
    return ids;
}

/* prompt into o: one prompt, or an array of them (llama's several prompts:
 * strings, ids, mixed arrays or {prompt_string}), each as one_prompt makes it;
 * special tokens in text are parsed. An array with any number in it is one
 * prompt of ids (and strings), as llama reads it. */
static bool put_prompt(srv *s, const cJSON *b, cJSON *o, api_error *err) {
    const cJSON *p = req_field(b, "prompt");
    if (!p) return api_fail(err, 400, "prompt", "'prompt' is required");
    bool numbers = false;
    for (const cJSON *e = cJSON_IsArray(p) ? p->child : NULL; e; e = e->next)
        numbers |= cJSON_IsNumber(e);
    cJSON *out;
    if (cJSON_IsArray(p) && p->child && !numbers) { /* several prompts */
        out = cJSON_CreateArray();
        for (const cJSON *e = p->child; out && e; e = e->next) {
            cJSON *one = one_prompt(s, e, err);
            if (!one) {
                cJSON_Delete(out);
                return false;
            }
            cJSON_AddItemToArray(out, one);
        }
    } else if (!(out = one_prompt(s, p, err))) {
        return false;
    }
    cJSON_AddItemToObject(o, "prompt", out);
    cJSON_AddBoolToObject(o, "parse_special", true);
    return true;
}

/* The OpenAI completions body for what that parser reads. */
static cJSON *openai_body(srv *s, const cJSON *b, api_error *err) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return api_fail(err, 500, NULL, "out of memory"), NULL;
    static const char *const PASS[] = {
        "model", "stream",     "grammar",           "json_schema",    "ignore_eos",
        "lora",  "cache_salt", "timings_per_token", "return_progress"};
    for (size_t i = 0; i < sizeof PASS / sizeof *PASS; i++) {
        const cJSON *v = req_field(b, PASS[i]);
        if (v) cJSON_AddItemToObject(o, PASS[i], cJSON_Duplicate(v, true));
    }
    const cJSON *stop = req_field(b, "stop");
    if (cJSON_IsArray(stop)) { /* llama drops empty stop strings */
        cJSON *a = cJSON_AddArrayToObject(o, "stop");
        for (const cJSON *w = stop->child; w; w = w->next)
            if (!cJSON_IsString(w) || w->valuestring[0])
                cJSON_AddItemToArray(a, cJSON_Duplicate(w, true));
    } else if (stop && !(cJSON_IsString(stop) && !stop->valuestring[0])) {
        cJSON_AddItemToObject(o, "stop", cJSON_Duplicate(stop, true));
    }
    const cJSON *n = req_field(b, "n_cmpl") ? req_field(b, "n_cmpl") : req_field(b, "n");
    if (n) cJSON_AddItemToObject(o, "n", cJSON_Duplicate(n, true));
    const cJSON *np = req_field(b, "n_probs") ? req_field(b, "n_probs") : req_field(b, "logprobs");
    if (np && !(cJSON_IsNumber(np) && np->valuedouble == 0))
        cJSON_AddItemToObject(o, "logprobs", cJSON_Duplicate(np, true));
    if (!put_prompt(s, b, o, err)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* llama's sampler names (and its aliases) and characters. The first six run
 * in this order in kvllm's fast chain (sampler.c); a list in another order,
 * or with the others, runs the general one. */
typedef enum smp {
    SMP_PENALTIES,
    SMP_TOP_K,
    SMP_TOP_P,
    SMP_MIN_P,
    SMP_INFILL,
    SMP_TEMPERATURE,
    SMP_TOP_N_SIGMA,
    SMP_TYPICAL,
    SMP_XTC,
    SMP_DRY,
    SMP_OFF, /* samplers whose parameters are at "off" here (OFF_FIELDS) */
    SMP_UNKNOWN
} smp;

/* llama's name and letter of each smp (sampler_params.order's letters). */
static const char *const SMP_NAMES[] = {"penalties",   "top_k",       "top_p", "min_p", "infill",
                                        "temperature", "top_n_sigma", "typ_p", "xtc",   "dry"};
static const char SMP_LETTERS[] = "ekpmitsyxd";
/* ... and of the sampler that is off here (llama's adaptive-p, letter a) */
static const char *off_name(char c) {
    (void)c;
    return "adaptive_p";
}

static smp sampler_char(char c) {
    if (c == 'a') return SMP_OFF;
    const char *at = c ? strchr(SMP_LETTERS, c) : NULL;
    return at ? (smp)(at - SMP_LETTERS) : SMP_UNKNOWN;
}

/* A sampler by llama's name or alias (sampler_letter); letter: its letter. */
static smp sampler_named(const char *name, char *letter) {
    *letter = sampler_letter(name);
    return sampler_char(*letter);
}

static bool sampler_list(const cJSON *v, llama_req *q, bool on[SMP_OFF], char order[16],
                         bool *in_order, api_error *err);

/* samplers: which of llama's samplers run, and in what order (llama's chain
 * applies them as listed, each as many times as named); one left out is off
 * (temperature: sampling at 1, as llama's chain then samples from the logits
 * as they are). Their letters go to order; *in_order says whether the list
 * keeps the fast chain's order (penalties, top_k, top_p, min_p, infill,
 * temperature) with none of the others. Without a list: llama's default,
 * which has no infill sampler. */
static bool parse_samplers(const cJSON *b, const char *server_list, llama_req *q, bool on[SMP_OFF],
                           char order[16], bool *in_order, api_error *err) {
    const cJSON *v = req_field(b, "samplers");
    cJSON *dflt = NULL; /* the server's --samplers, where the request has no list */
    if (!v && server_list && server_list[0]) v = dflt = cJSON_CreateString(server_list);
    const bool ok = sampler_list(v, q, on, order, in_order, err);
    cJSON_Delete(dflt);
    return ok;
}

/* parse_samplers' list v (NULL: none). */
static bool sampler_list(const cJSON *v, llama_req *q, bool on[SMP_OFF], char order[16],
                         bool *in_order, api_error *err) {
    for (int i = 0; i < SMP_OFF; i++) on[i] = !v && i != SMP_INFILL;
    *in_order = true;
    order[0] = 0;
    if (!v) return true;
    cJSON *names = q ? (q->samplers = cJSON_CreateArray()) : NULL; /* (OpenAI's: none kept) */
    if (!cJSON_IsArray(v) && !cJSON_IsString(v))
        return api_fail(
            err, 400, "samplers",
            "'samplers' must be an array of sampler names or a string of their letters");
    int last = -1, i = 0, n = 0;
    const cJSON *e = cJSON_IsArray(v) ? v->child : NULL;
    for (const char *c = cJSON_IsString(v) ? v->valuestring : ""; e || *c; i++) {
        smp s;
        char letter = 0;
        if (e) {
            if (!cJSON_IsString(e))
                return api_fail(err, 400, "samplers", "samplers[%d] must be a sampler name", i);
            s = sampler_named(e->valuestring, &letter);
            e = e->next;
        } else {
            letter = *c;
            s = sampler_char(*c++);
        }
        if (s == SMP_UNKNOWN)
            return api_fail(err, 400, "samplers", "samplers[%d]: unknown sampler", i);
        if (names)
            cJSON_AddItemToArray(
                names, cJSON_CreateString(s == SMP_OFF ? off_name(letter) : SMP_NAMES[s]));
        if (s == SMP_OFF) continue; /* its parameters keep it off (check_fields) */
        if (n == 15)
            return api_fail(err, 400, "samplers", "at most 15 samplers can run in one chain");
        order[n++] = SMP_LETTERS[s];
        order[n] = 0;
        *in_order &= (int)s > last && s < SMP_TOP_N_SIGMA;
        last = (int)s;
        on[s] = true;
    }
    return true;
}

/* dry_sequence_breakers: a non-empty array of strings (llama's rule), each cut
 * at SAMPLER_DRY_BREAKER_MAX bytes as llama cuts it, empty ones skipped. */
static bool parse_dry_breakers(const cJSON *b, sampler_params *p, api_error *err) {
    const cJSON *v = req_field(b, "dry_sequence_breakers");
    if (!v) return true;
    bool strings = cJSON_IsArray(v) && v->child;
    for (const cJSON *e = strings ? v->child : NULL; e; e = e->next) strings &= cJSON_IsString(e);
    if (!strings)
        return api_fail(err, 400, "dry_sequence_breakers",
                        "'dry_sequence_breakers' must be a non-empty array of strings");
    memset(p->dry_breakers, 0, sizeof p->dry_breakers);
    for (const cJSON *e = v->child; e; e = e->next)
        if (e->valuestring[0] && !sampler_dry_breaker_add(p, e->valuestring))
            return api_fail(err, 400, "dry_sequence_breakers",
                            "'dry_sequence_breakers' holds more than %d bytes of text",
                            SAMPLER_DRY_BREAKERS - 2);
    return true;
}

/* The samplers a list left out, off (temperature: sampling at 1), and the
 * list's order where it has one of its own or samplers the fast chain lacks
 * (without a list: the general chain's default); mirostat replaces the list
 * (llama runs temperature, then mirostat). */
static void use_sampler_list(sampler_params *p, const bool on[SMP_OFF], const char order[16],
                             bool in_order) {
    if (p->mirostat != 0) return;
    if (!on[SMP_PENALTIES]) p->repeat_penalty = 1, p->presence_penalty = p->frequency_penalty = 0;
    if (!on[SMP_TOP_K]) p->top_k = 0;
    if (!on[SMP_TOP_P]) p->top_p = 1;
    if (!on[SMP_MIN_P]) p->min_p = 0;
    if (!on[SMP_TEMPERATURE]) p->temperature = 1, p->dynatemp_range = 0;
    if (!on[SMP_TOP_N_SIGMA]) p->top_n_sigma = 0;
    if (!on[SMP_TYPICAL]) p->typical_p = 1;
    if (!on[SMP_XTC]) p->xtc_probability = 0;
    if (!on[SMP_DRY]) p->dry_multiplier = 0;
    p->infill = on[SMP_INFILL];
    if (!in_order || sampler_params_general(p)) memcpy(p->order, order, 16);
}

bool srv_parse_sampler_list(const cJSON *b, sampler_params *p, api_error *err) {
    const cJSON *v = req_field(b, "samplers");
    if (!v) return true; /* (the server's --samplers: already in p->order) */
    bool on[SMP_OFF], in_order;
    char order[16];
    if (!sampler_list(v, NULL, on, order, &in_order, err)) return false;
    if (on[SMP_INFILL])
        return api_fail(err, 400, "samplers",
                        "the infill sampler is served on /completion and /infill only");
    use_sampler_list(p, on, order, in_order);
    return true;
}

/* llama's samplers beyond the default chain, by its field names (also read
 * on the OpenAI endpoints, as llama-server reads them there): typical_p,
 * top_n_sigma, xtc_probability / xtc_threshold, dynatemp_range /
 * dynatemp_exponent, min_keep, mirostat (0, 1, 2) / mirostat_tau /
 * mirostat_eta. llama-server's values, unchecked there, within bounds here. */
bool srv_parse_llama_samplers(const cJSON *b, sampler_params *p, api_error *err) {
    int64_t min_keep = p->min_keep, mirostat = p->mirostat, dry_allowed = p->dry_allowed_length,
            dry_last_n = p->dry_penalty_last_n;
    bool ok = req_float(b, "typical_p", -1e30, 1e30, &p->typical_p, err) &&
              req_float(b, "top_n_sigma", -1e30, 1e30, &p->top_n_sigma, err) &&
              req_float(b, "xtc_probability", -1e30, 1e30, &p->xtc_probability, err) &&
              req_float(b, "xtc_threshold", -1e30, 1e30, &p->xtc_threshold, err) &&
              req_float(b, "dynatemp_range", -1e30, 1e30, &p->dynatemp_range, err) &&
              req_float(b, "dynatemp_exponent", -1e30, 1e30, &p->dynatemp_exponent, err) &&
              req_int(b, "min_keep", 0, INT32_MAX, &min_keep, err) &&
              req_int(b, "mirostat", 0, 2, &mirostat, err) &&
              req_float(b, "mirostat_tau", -1e30, 1e30, &p->mirostat_tau, err) &&
              req_float(b, "mirostat_eta", -1e30, 1e30, &p->mirostat_eta, err) &&
              req_float(b, "dry_multiplier", -1e30, 1e30, &p->dry_multiplier, err) &&
              req_float(b, "dry_base", -1e30, 1e30, &p->dry_base, err) &&
              req_int(b, "dry_allowed_length", 0, INT32_MAX, &dry_allowed, err) &&
              req_int(b, "dry_penalty_last_n", -1, INT32_MAX, &dry_last_n, err) &&
              parse_dry_breakers(b, p, err);
    if (!ok) return false;
    p->dry_allowed_length = (int32_t)dry_allowed;
    p->dry_penalty_last_n = (int32_t)dry_last_n;
    p->typical_p = sampler_typical_from_llama(p->typical_p);
    p->min_keep = (int32_t)min_keep;
    p->mirostat = (int32_t)mirostat;
    return true;
}

/* llama's logit_bias: [[id or text, bias or false], ...] or {"id or text":
 * bias or false}; a text biases each of its tokens; false bans. */
static bool bias_entry(srv *s, srv_job *j, const cJSON *key_num, const char *key_text,
                       const cJSON *val, api_error *err) {
    double bias;
    if (cJSON_IsNumber(val)) bias = val->valuedouble;
    else if (cJSON_IsFalse(val)) bias = -INFINITY;
    else return api_fail(err, 400, "logit_bias", "'logit_bias': a bias must be a number or false");
    if (key_num) {
        if (key_num->valuedouble != floor(key_num->valuedouble))
            return api_fail(err, 400, "logit_bias", "'logit_bias': %g is not a token id",
                            key_num->valuedouble);
        return job_add_logit_bias(s, j, (int64_t)key_num->valuedouble, bias, "logit_bias", err);
    }
    char *end = NULL;
    errno = 0;
    long long id = strtoll(key_text, &end, 10);
    if (key_text[0] && !*end && !errno)
        return job_add_logit_bias(s, j, id, bias, "logit_bias", err);
    int64_t n = 0;
    int32_t *t =
        srv_encode(s, key_text, strlen(key_text), false, (tok_mode){0}, &n, "logit_bias", err);
    if (!t) return false;
    bool ok = true;
    for (int64_t k = 0; ok && k < n; k++)
        ok = job_add_logit_bias(s, j, t[k], bias, "logit_bias", err);
    free(t);
    return ok;
}

static bool parse_logit_bias(srv *s, const cJSON *b, srv_job *j, api_error *err) {
    const cJSON *lb = req_field(b, "logit_bias");
    if (!lb) return true;
    if (cJSON_IsObject(lb)) {
        for (const cJSON *e = lb->child; e; e = e->next)
            if (!bias_entry(s, j, NULL, e->string, e, err)) return false;
        job_logit_bias_finish(j);
        return true;
    }
    if (!cJSON_IsArray(lb))
        return api_fail(err, 400, "logit_bias",
                        "'logit_bias' must be an array of [token, bias] pairs or an object");
    for (const cJSON *e = lb->child; e; e = e->next) {
        const cJSON *k = cJSON_IsArray(e) ? e->child : NULL, *v = k ? k->next : NULL;
        if (!v || v->next || !(cJSON_IsNumber(k) || cJSON_IsString(k)))
            return api_fail(err, 400, "logit_bias",
                            "'logit_bias': each entry must be [token id or text, bias or false]");
        if (!bias_entry(s, j, cJSON_IsNumber(k) ? k : NULL, k->valuestring, v, err)) return false;
    }
    job_logit_bias_finish(j);
    return true;
}

/* The sampling: llama's defaults, then the request's values, then the
 * samplers its list leaves out switched off. */
static bool parse_sampling(const srv *s, const cJSON *b, llama_req *q, srv_job *j, api_error *err) {
    sampler_params *p = &j->sampling;
    /* the OpenAI parser's: the request's, the server's --seed or a random one */
    const uint64_t seed = p->seed;
    sampler_params_default(p); /* llama-server's defaults, then the server's flags */
    sampler_params_apply(p, &s->cfg.sampling,
                         s->cfg.sampling_set & ~(SAMPLER_SET_SEED | SAMPLER_SET_ORDER));
    p->seed = seed;
    double temp = p->temperature;
    int64_t top_k = p->top_k, last_n = p->penalty_last_n;
    bool on[SMP_OFF], in_order;
    char order[16];
    bool ok =
        req_number(b, "temperature", -1e30, 1e30, &temp, err) &&
        req_int(b, "top_k", -1, INT32_MAX, &top_k, err) &&
        req_float(b, "top_p", 0, 1, &p->top_p, err) &&
        req_float(b, "min_p", 0, 1, &p->min_p, err) &&
        req_float(b, "repeat_penalty", 0, 1e30, &p->repeat_penalty, err) &&
        req_int(b, "repeat_last_n", -1, INT32_MAX, &last_n, err) &&
        req_float(b, "presence_penalty", -1e30, 1e30, &p->presence_penalty, err) &&
        req_float(b, "frequency_penalty", -1e30, 1e30, &p->frequency_penalty, err) &&
        srv_parse_llama_samplers(b, p, err) &&
        parse_samplers(b, s->cfg.sampling_set & SAMPLER_SET_ORDER ? s->cfg.sampling.order : NULL, q,
                       on, order, &in_order, err);
    if (!ok) return false;
    if (p->repeat_penalty <= 0)
        return api_fail(err, 400, "repeat_penalty", "'repeat_penalty' must be positive");
    p->temperature = temp < 0 ? 0.0f : (float)temp; /* llama: below 0 is greedy too */
    p->top_k = (int32_t)(top_k < 0 ? 0 : top_k);
    p->penalty_last_n = (int32_t)last_n; /* -1: the whole context, as here the history */
    use_sampler_list(p, on, order, in_order);
    if (p->infill && sampler_params_general(p))
        return api_fail(err, 400, "samplers",
                        "the infill sampler runs here only in llama's default order (penalties, "
                        "top_k, top_p, min_p, infill, temperature) without typical, top-n-sigma, "
                        "XTC, dynamic temperature, min_keep or mirostat");
    if (p->infill && (p->top_k < 1 || p->top_k > SAMPLER_INFILL_MAX_K))
        return api_fail(err, 400, "samplers",
                        "the infill sampler needs top_k (1..%d) before it, as llama.vscode sends",
                        SAMPLER_INFILL_MAX_K);
    j->penalize_prompt = true;
    j->vary_seed = p->temperature > 0;
    const cJSON *given = req_field(b, "seed");
    q->random_seed = (!given && !(s->cfg.sampling_set & SAMPLER_SET_SEED)) ||
                     (cJSON_IsNumber(given) && given->valuedouble == -1);
    return true;
}

void llama_sampling_json(cJSON *g, const sampler_params *p, int64_t n_ctx) {
    cJSON_AddNumberToObject(g, "temperature", p->temperature);
    cJSON_AddNumberToObject(g, "dynatemp_range", p->dynatemp_range);
    cJSON_AddNumberToObject(g, "dynatemp_exponent", p->dynatemp_exponent);
    cJSON_AddNumberToObject(g, "top_k", p->top_k);
    cJSON_AddNumberToObject(g, "top_p", p->top_p);
    cJSON_AddNumberToObject(g, "min_p", p->min_p);
    cJSON_AddNumberToObject(g, "top_n_sigma", p->top_n_sigma > 0 ? p->top_n_sigma : -1);
    cJSON_AddNumberToObject(g, "xtc_probability", p->xtc_probability);
    cJSON_AddNumberToObject(g, "xtc_threshold", p->xtc_threshold);
    cJSON_AddNumberToObject(g, "typical_p", sampler_typical_to_llama(p->typical_p));
    cJSON_AddNumberToObject(g, "repeat_last_n",
                            p->penalty_last_n < 0 ? (double)n_ctx : p->penalty_last_n);
    cJSON_AddNumberToObject(g, "repeat_penalty", p->repeat_penalty);
    cJSON_AddNumberToObject(g, "presence_penalty", p->presence_penalty);
    cJSON_AddNumberToObject(g, "frequency_penalty", p->frequency_penalty);
    cJSON_AddNumberToObject(g, "dry_multiplier", p->dry_multiplier);
    cJSON_AddNumberToObject(g, "dry_base", p->dry_base);
    cJSON_AddNumberToObject(g, "dry_allowed_length", p->dry_allowed_length);
    cJSON_AddNumberToObject(g, "dry_penalty_last_n",
                            p->dry_penalty_last_n == -1 ? (double)n_ctx
                                                        : (double)p->dry_penalty_last_n);
    cJSON *brk = cJSON_AddArrayToObject(g, "dry_sequence_breakers");
    for (const char *t = NULL; (t = sampler_dry_breaker_next(p, t));)
        cJSON_AddItemToArray(brk, cJSON_CreateString(t));
    cJSON_AddNumberToObject(g, "mirostat", p->mirostat);
    cJSON_AddNumberToObject(g, "mirostat_tau", p->mirostat_tau);
    cJSON_AddNumberToObject(g, "mirostat_eta", p->mirostat_eta);
    cJSON_AddNumberToObject(g, "min_keep", p->min_keep);
}

static cJSON *settings_json(srv *s, const cJSON *b, const llama_req *q, const srv_job *j,
                            bool stream) {
    const sampler_params *p = &j->sampling;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "seed", q->random_seed ? 4294967295.0 : (double)p->seed);
    llama_sampling_json(g, p, s->n_ctx);
    cJSON *stop = cJSON_AddArrayToObject(g, "stop");
    for (int i = 0; i < j->n_stop; i++) cJSON_AddItemToArray(stop, cJSON_CreateString(j->stop[i]));
    cJSON_AddNumberToObject(g, "max_tokens", (double)j->max_tokens);
    cJSON_AddNumberToObject(g, "n_predict", (double)j->max_tokens);
    cJSON_AddNumberToObject(g, "n_keep", 0);
    cJSON_AddNumberToObject(g, "n_discard", 0);
    cJSON_AddBoolToObject(g, "ignore_eos", j->ignore_eos);
    cJSON_AddBoolToObject(g, "stream", stream);
    cJSON *bias = cJSON_AddArrayToObject(g, "logit_bias");
    for (int i = 0; i < j->n_logit_bias; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "bias",
                                isinf(j->logit_bias[i].bias) ? -1e30 : j->logit_bias[i].bias);
        cJSON_AddNumberToObject(e, "token", j->logit_bias[i].token);
        cJSON_AddItemToArray(bias, e);
    }
    cJSON_AddNumberToObject(g, "n_probs", q->n_probs);
    const cJSON *gr = req_field(b, "grammar");
    cJSON_AddStringToObject(g, "grammar", cJSON_IsString(gr) ? gr->valuestring : "");
    cJSON_AddBoolToObject(g, "grammar_lazy", false);
    cJSON_AddArrayToObject(g, "grammar_triggers");
    cJSON_AddArrayToObject(g, "preserved_tokens");
    cJSON_AddStringToObject(g, "chat_format", "Content-only"); /* the text as generated */
    cJSON_AddStringToObject(g, "reasoning_format", "none");
    cJSON_AddBoolToObject(g, "reasoning_in_content", false);
    cJSON_AddStringToObject(g, "generation_prompt", "");
    if (q->samplers) {
        cJSON_AddItemToObject(g, "samplers", cJSON_Duplicate(q->samplers, true));
    } else {
        static const char *const ALL[] = {"penalties", "dry",   "top_n_sigma",
                                          "top_k",     "typ_p", "top_p",
                                          "min_p",     "xtc",   "temperature"};
        cJSON_AddItemToObject(g, "samplers", cJSON_CreateStringArray(ALL, 9));
    }
    cJSON_AddStringToObject(g, "speculative.types", "none");
    cJSON_AddBoolToObject(g, "timings_per_token", j->timings_per_token);
    cJSON_AddBoolToObject(g, "post_sampling_probs", q->post_sampling);
    cJSON_AddBoolToObject(g, "backend_sampling", false);
    cJSON *lora = cJSON_AddArrayToObject(g, "lora");
    for (int i = 0; i < j->n_lora; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", i);
        cJSON_AddNumberToObject(a, "scale", j->lora[i]);
        cJSON_AddItemToArray(lora, a);
    }
    return g;
}

cJSON *llama_default_settings(srv *s) {
    srv_job j = {.max_tokens = s->cfg.n_predict > 0 ? s->cfg.n_predict : -1};
    llama_req q = {.random_seed = !(s->cfg.sampling_set & SAMPLER_SET_SEED)};
    sampler_params_default(&j.sampling); /* llama's defaults, then the server's flags */
    sampler_params_apply(&j.sampling, &s->cfg.sampling, s->cfg.sampling_set);
    if (s->cfg.sampling_set & SAMPLER_SET_ORDER) { /* its list by llama's names */
        q.samplers = cJSON_CreateArray();
        for (const char *c = j.sampling.order; *c; c++)
            cJSON_AddItemToArray(q.samplers, cJSON_CreateString(SMP_NAMES[sampler_char(*c)]));
    }
    cJSON *empty = cJSON_CreateObject();
    cJSON *g = settings_json(s, empty, &q, &j, false);
    cJSON_Delete(empty);
    cJSON_Delete(q.samplers);
    return g;
}

static cJSON *prompt_text(srv *s, const srv_job *j, int k) {
    kvl_buf t = {0};
    int64_t len;
    const int32_t *ids = job_prompt(j, k, &len);
    srv_ids_text(s, ids, len, &t);
    cJSON *o = t.oom ? NULL : json_text(t.p ? t.p : "", t.len);
    kvl_buf_free(&t);
    return o;
}

/* After the OpenAI parser: llama's sampling, logit_bias, response options
 * and n_predict, on the job it made. */
static bool llama_finish(srv *s, const cJSON *body, int64_t n_predict, api_req *r, api_error *err) {
    srv_job *j = r->job;
    llama_req *q = r->llama = calloc(1, sizeof *q);
    if (!q) return api_fail(err, 500, NULL, "out of memory");
    q->n_probs = j->top_logprobs;
    j->logprobs = r->logprobs = q->n_probs > 0;
    bool ok = parse_sampling(s, body, q, j, err) && parse_logit_bias(s, body, j, err) &&
              req_bool(body, "return_tokens", &q->return_tokens, err) &&
              req_bool(body, "post_sampling_probs", &q->post_sampling, err);
    if (!ok) return false;
    /* the chain's own probabilities: the general chain computes them (the
     * infill sampler runs in the fast one only) */
    if (q->post_sampling && j->sampling.infill)
        return api_fail(err, 400, "post_sampling_probs",
                        "post_sampling_probs is not supported with the infill sampler here");
    j->post_sampling_probs = q->post_sampling && q->n_probs > 0;
    const cJSON *rf = req_field(body, "response_fields");
    if (rf) {
        bool strings = cJSON_IsArray(rf);
        for (const cJSON *e = strings ? rf->child : NULL; e; e = e->next)
            strings &= cJSON_IsString(e);
        if (!strings)
            return api_fail(err, 400, "response_fields",
                            "'response_fields' must be an array of field paths");
        q->fields = cJSON_Duplicate(rf, true);
    }
    /* n_predict -1 (or more than fits): until the context is full, as llama's
     * slot stops there (the OpenAI parser's 16 is its own default) */
    int64_t longest = 0; /* of the request's prompts */
    for (int k = 0; k < j->n_prompts; k++) {
        int64_t n;
        job_prompt(j, k, &n);
        longest = n > longest ? n : longest;
    }
    const int64_t room =
        (s->n_ctx < s->n_blocks * s->block_size ? s->n_ctx : s->n_blocks * s->block_size) - longest;
    j->max_tokens = n_predict < 0 || n_predict > room ? (room > 0 ? room : 1) : n_predict;
    /* n_predict 0 (llama.vscode's cache warm-up): the prompt is computed and
     * cached as for any request; the one token its last logits give is not
     * answered */
    q->prompt_only = n_predict == 0;
    if (q->prompt_only) j->max_tokens = 1;
    int64_t n_indent = 0, t_max = 0, id_slot = -1;
    if (!req_int(body, "n_indent", 0, INT32_MAX, &n_indent, err) ||
        !req_int(body, "t_max_predict_ms", -1, INT32_MAX, &t_max, err) ||
        !req_int(body, "id_slot", -1, s->max_seqs - 1, &id_slot, err))
        return false;
    j->id_slot = (int)id_slot; /* the slot it runs on if idle (slot_take) */
    j->n_indent = (int)n_indent;
    j->max_predict_s = t_max > 0 ? (double)t_max / 1e3 : 0;
    q->settings = settings_json(s, body, q, j, r->stream);
    bool made = q->settings != NULL;
    for (int k = 0; k < j->n_prompts; k++)
        made = made && (q->prompt_text[k] = prompt_text(s, j, k));
    return made ? true : api_fail(err, 500, NULL, "out of memory");
}

bool llama_parse(srv *s, const cJSON *body, api_req *r, api_error *err) {
    memset(r, 0, sizeof *r);
    if (!cJSON_IsObject(body))
        return api_fail(err, 400, NULL, "the request body must be a JSON object");
    if (!check_fields(body, err) || !check_chat_parser(body, err)) return false;
    int64_t n_predict = s->cfg.n_predict ? s->cfg.n_predict : -1, seed = -1; /* (the server's -n) */
    bool ok = req_int(body, "n_predict", -1, INT32_MAX, &n_predict, err) &&
              req_int(body, "max_tokens", -1, INT32_MAX, &n_predict, err) &&
              req_int(body, "max_completion_tokens", -1, INT32_MAX, &n_predict, err) &&
              req_int(body, "seed", -1, 4294967295LL, &seed, err);
    if (!ok) return false;
    if (req_field(body, "n_predict")) req_int(body, "n_predict", -1, INT32_MAX, &n_predict, err);
    cJSON *o = openai_body(s, body, err);
    if (!o) return false;
    if (seed >= 0) cJSON_AddNumberToObject(o, "seed", (double)seed);
    ok = openai_parse(s, o, false, r, err);
    cJSON_Delete(o);
    if (!ok) {
        static const char *const map[][2] = {{"logprobs", "n_probs"}};
        if (!req_field(body, "logprobs")) api_error_rename(err, map, 1);
        return false;
    }
    if (llama_finish(s, body, n_predict, r, err)) return true;
    api_req_free(r); /* the job, and what llama_finish made */
    return false;
}
