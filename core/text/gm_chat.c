/*
 * gm_chat.c - Gemma chat template rendering and the response-start finder (see gm_chat.h).
 *
 * The renderer is a direct transcription of the Gemma 3 Jinja template rather than a Jinja
 * interpreter: the template is fixed for the Gemma family, and a transcription is checked
 * against transformers' apply_chat_template output in tests/unit/test_tokenizer_model.c. Gemma 4's
 * turns differ only in their markers and in the system message being a turn (gm_chat.h).
 * Two passes (measure, then write) so the output is one exact allocation.
 */
#include "gm_chat.h"

#include "gm_alloc.h" /* gm_malloc, gm_free */

#include <string.h>

/* The turn markers of each format (gm_chat.h). */
typedef struct chat_marks {
    const char *start, *end, *gen;
    bool system_turn; /* a system message is a turn of its own (else folded into the first user turn) */
} chat_marks;

static const chat_marks MARKS[2] = {
    [GM_CHAT_GEMMA3] = {"<start_of_turn>", "<end_of_turn>\n", "<start_of_turn>model\n", false},
    [GM_CHAT_GEMMA4] = {"<|turn>", "<turn|>\n", "<|turn>model\n", true},
};

static const chat_marks *marks(gm_chat_format f) { return &MARKS[f == GM_CHAT_GEMMA4 ? 1 : 0]; }

gm_chat_format gm_chat_format_of(const gm_tokenizer *tok) {
    if (tok && gm_tokenizer_find(tok, "<|turn>", 7) >= 0 && gm_tokenizer_find(tok, "<turn|>", 7) >= 0)
        return GM_CHAT_GEMMA4;
    return GM_CHAT_GEMMA3;
}

typedef enum role { ROLE_SYSTEM, ROLE_USER, ROLE_MODEL, ROLE_BAD } role;

static role parse_role(const char *r) {
    if (!r) return ROLE_BAD;
    if (strcmp(r, "system") == 0) return ROLE_SYSTEM;
    if (strcmp(r, "user") == 0) return ROLE_USER;
    if (strcmp(r, "assistant") == 0 || strcmp(r, "model") == 0) return ROLE_MODEL;
    return ROLE_BAD;
}

/* Jinja's `trim` strips whitespace at both ends (ASCII whitespace here). */
static void trimmed(const char *s, const char **b, size_t *n) {
    size_t len = strlen(s), i = 0;
    while (i < len && strchr(" \t\n\r\v\f", s[i])) i++;
    while (len > i && strchr(" \t\n\r\v\f", s[len - 1])) len--;
    *b = s + i;
    *n = len - i;
}

/* Appends n bytes at *o when buf is not NULL; always advances *o (the measuring pass). */
static void put(char *buf, size_t *o, const char *s, size_t n) {
    if (buf) memcpy(buf + *o, s, n);
    *o += n;
}

/* Validates and renders into buf (NULL: only measure). Returns the length via *len. */
static gm_status render(gm_chat_format fmt, const gm_chat_msg *msgs, int64_t n, bool gen, char *buf, size_t *len,
                        gm_error *err) {
    const chat_marks *mk = marks(fmt);
    size_t o = 0;
    int64_t first = 0;
    const char *system = NULL;
    if (n > 0 && parse_role(msgs[0].role) == ROLE_SYSTEM) {
        if (!msgs[0].content)
            return gm_error_set(err, GM_ERR_INVALID, "chat: message 0 (system) has no content");
        system = msgs[0].content;
        first = 1;
        if (mk->system_turn) { /* its own turn, trimmed like every other */
            const char *c;
            size_t cn;
            trimmed(system, &c, &cn);
            put(buf, &o, mk->start, strlen(mk->start));
            put(buf, &o, "system\n", 7);
            put(buf, &o, c, cn);
            put(buf, &o, mk->end, strlen(mk->end));
            system = NULL;
        }
        if (n == 1 || parse_role(msgs[1].role) != ROLE_USER)
            return gm_error_set(err, GM_ERR_INVALID,
                                "chat: message 0 is a system message, so message 1 must be a user "
                                "message (the system text is folded into it)%s",
                                n == 1 ? "; there is none" : "");
    }
    for (int64_t i = first; i < n; i++) {
        role r = parse_role(msgs[i].role);
        if (r == ROLE_BAD)
            return gm_error_set(err, GM_ERR_INVALID,
                                "chat: message %lld has role \"%.32s\"; expected system, user, "
                                "assistant or model",
                                (long long)i, msgs[i].role ? msgs[i].role : "(null)");
        if (r == ROLE_SYSTEM)
            return gm_error_set(err, GM_ERR_INVALID,
                                "chat: message %lld is a system message; only the first message "
                                "may be one",
                                (long long)i);
        role want = (i - first) % 2 == 0 ? ROLE_USER : ROLE_MODEL;
        if (r != want)
            return gm_error_set(err, GM_ERR_INVALID,
                                "chat: message %lld has role %s but roles must alternate user, "
                                "model, user, ... (after an optional system message); expected %s",
                                (long long)i, msgs[i].role, want == ROLE_USER ? "user" : "model");
        if (!msgs[i].content)
            return gm_error_set(err, GM_ERR_INVALID, "chat: message %lld has no content", (long long)i);
        const char *name = r == ROLE_USER ? "user\n" : "model\n";
        put(buf, &o, mk->start, strlen(mk->start));
        put(buf, &o, name, strlen(name));
        if (i == first && system) {
            put(buf, &o, system, strlen(system));
            put(buf, &o, "\n\n", 2);
        }
        const char *c;
        size_t cn;
        trimmed(msgs[i].content, &c, &cn);
        put(buf, &o, c, cn);
        put(buf, &o, mk->end, strlen(mk->end));
    }
    if (gen) put(buf, &o, mk->gen, strlen(mk->gen));
    if (buf) buf[o] = '\0';
    *len = o;
    return GM_OK;
}

gm_status gm_chat_render(gm_chat_format fmt, const gm_chat_msg *msgs, int64_t n, bool add_generation_prompt,
                         char **out, size_t *len_out, gm_error *err) {
    *out = NULL;
    if (len_out) *len_out = 0;
    if (n < 0 || (n > 0 && !msgs))
        return gm_error_set(err, GM_ERR_INVALID, "gm_chat_render: invalid arguments");
    size_t len;
    GM_TRY(render(fmt, msgs, n, add_generation_prompt, NULL, &len, err));
    char *buf = gm_malloc(len + 1);
    if (!buf) return gm_error_set(err, GM_ERR_NOMEM, "chat: out of memory (%zu bytes)", len + 1);
    render(fmt, msgs, n, add_generation_prompt, buf, &len, err);
    *out = buf;
    if (len_out) *len_out = len;
    return GM_OK;
}

gm_status gm_chat_encode(const gm_tokenizer *tok, const gm_chat_msg *msgs, int64_t n,
                         bool add_generation_prompt, int32_t **ids, int64_t *n_ids,
                         gm_error *err) {
    *ids = NULL;
    if (n_ids) *n_ids = 0;
    char *text;
    size_t len;
    GM_TRY(gm_chat_render(gm_chat_format_of(tok), msgs, n, add_generation_prompt, &text, &len, err));
    gm_status st = gm_tokenizer_encode_alloc(tok, text, len, true, true, ids, n_ids, err);
    gm_free(text);
    return st;
}

int64_t gm_chat_find_after_last(const int32_t *ids, int64_t n, const int32_t *pat, int64_t m) {
    if (!ids || !pat || m <= 0 || n < m) return -1;
    for (int64_t i = n - m; i >= 0; i--)
        if (ids[i] == pat[0] && memcmp(ids + i, pat, (size_t)m * sizeof *pat) == 0) return i + m;
    return -1;
}

gm_status gm_chat_earlier_model_turns(const gm_tokenizer *tok, const int32_t *ids, int64_t n, int64_t (**spans)[2],
                                      int64_t *n_spans, gm_error *err) {
    *spans = NULL, *n_spans = 0;
    const chat_marks *mk = marks(gm_chat_format_of(tok));
    int32_t pat[16], sot[4];
    int64_t m = 0, ms = 0;
    GM_TRY(gm_tokenizer_encode(tok, mk->gen, strlen(mk->gen), false, true, pat, 16, &m, err));
    GM_TRY(gm_tokenizer_encode(tok, mk->start, strlen(mk->start), false, true, sot, 4, &ms, err));
    int64_t last = gm_chat_find_after_last(ids, n, pat, m), count = 0;
    for (int64_t i = 0; m > 0 && i + m < last; i++)
        if (ids[i] == pat[0] && memcmp(ids + i, pat, (size_t)m * sizeof *pat) == 0) count++;
    if (count == 0) return GM_OK;
    int64_t (*out)[2] = gm_malloc((size_t)count * sizeof *out);
    if (!out) return gm_error_set(err, GM_ERR_NOMEM, "out of memory");
    int64_t k = 0;
    for (int64_t i = 0; i + m < last && k < count; i++) {
        if (ids[i] != pat[0] || memcmp(ids + i, pat, (size_t)m * sizeof *pat) != 0) continue;
        int64_t start = i + m, end = start;
        while (end < n && !(ms == 1 && ids[end] == sot[0])) end++;
        out[k][0] = start, out[k][1] = end, k++;
        i = end - 1;
    }
    *spans = out, *n_spans = k;
    return GM_OK;
}

gm_status gm_chat_response_start(const gm_tokenizer *tok, const int32_t *ids, int64_t n,
                                 int64_t *start, gm_error *err) {
    *start = -1;
    const chat_marks *mk = marks(gm_chat_format_of(tok));
    int32_t pat[16];
    int64_t m = 0;
    GM_TRY(gm_tokenizer_encode(tok, mk->gen, strlen(mk->gen), false, true, pat, 16, &m, err));
    *start = gm_chat_find_after_last(ids, n, pat, m);
    if (*start < 0)
        return gm_error_set(err, GM_ERR_NOT_FOUND,
                            "chat: no model turn (\"%.*smodel\\n\") in a sequence of "
                            "%lld tokens\n  hint: render the conversation with gm_chat_render and "
                            "encode with parse_special = true",
                            (int)strlen(mk->start), mk->start, (long long)n);
    return GM_OK;
}

/* The "chat_template" of google/gemma-3-*-it's tokenizer_config.json, verbatim (the template
 * gm_chat_render implements; tests/ref/make_tokenizer_ref.py holds the same string). */
const char gm_chat_gemma3_jinja[] =
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n"
    "\n"
    "' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n"
    "\n"
    "' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n"
    "' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n"
    "' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n"
    "'}}\n"
    "{%- endif -%}\n";

/* gm_chat_render's GM_CHAT_GEMMA4 format as Jinja (written by gemmarun, not Google's template:
 * gm_chat.h says why), in the Gemma 3 template's style. */
const char gm_chat_gemma4_jinja[] =
    "{{ bos_token }}\n"
    "{%- for message in messages -%}\n"
    "    {%- if message['role'] == 'assistant' -%}\n"
    "        {%- set role = 'model' -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<|turn>' + role + '\n' }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- else -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<|image|>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<turn|>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{ '<|turn>model\n' }}\n"
    "{%- endif -%}\n";
