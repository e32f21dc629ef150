/* Chat templates: the public entry points (chat.h), the built-in
 * templates and the GGUF helper. The interpreter is in jinja_*.c. */
#include "chat/chat.h"

#include "core/status.h"
#include "chat/jinja_internal.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

/* ---- limits ---- */

static chat_template_limits limits_or_defaults(const chat_template_limits *l) {
    chat_template_limits d = {
        .max_output = (size_t)64 << 20,
        .max_memory = (size_t)256 << 20,
        .max_iterations = 1000000,
        .max_steps = 50000000,
        .max_nesting = 100,
        .max_call_depth = 64,
    };
    if (l) {
        if (l->max_output) d.max_output = l->max_output;
        if (l->max_memory) d.max_memory = l->max_memory;
        if (l->max_iterations) d.max_iterations = l->max_iterations;
        if (l->max_steps) d.max_steps = l->max_steps;
        if (l->max_nesting > 0) d.max_nesting = l->max_nesting < 1000 ? l->max_nesting : 1000;
        if (l->max_call_depth > 0) d.max_call_depth = l->max_call_depth;
    }
    return d;
}

/* ---- rendering ---- */

/* A JSON value as the template sees it (Python's json.loads: objects keep
 * their key order, integers stay integers). ARGS: inside a tool call, where
 * an "arguments" string holding a JSON object becomes that object. */
static jv *json_to_jv(jctx *c, const cJSON *j, int args, int depth) {
    if (depth > 64) {
        jfail(c, ELLM_ERR_ARG, JPOS_NONE, "tools / tool_calls JSON nested deeper than 64 levels");
        return NULL;
    }
    if (cJSON_IsNull(j)) return J_NONE;
    if (cJSON_IsBool(j)) return J_BOOL(cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        const double d = j->valuedouble;
        if (d == (double)(int64_t)d && d > -9007199254740992.0 && d < 9007199254740992.0) return jv_int(c, (int64_t)d);
        return jv_float(c, d);
    }
    if (cJSON_IsString(j)) return jv_str_copy(c, j->valuestring, strlen(j->valuestring));
    if (cJSON_IsArray(j)) {
        jv *l = jv_list(c, (size_t)cJSON_GetArraySize(j));
        size_t i = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (!l) return NULL;
            jv *v = json_to_jv(c, it, args, depth + 1);
            if (!v) return NULL;
            l->u.l->items[i++] = v;
        }
        return l;
    }
    if (cJSON_IsObject(j)) {
        jv *d = jv_dict(c, 0);
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (!d) return NULL;
            jv *v = NULL;
            if (args && cJSON_IsString(it) && !strcmp(it->string, "arguments")) {
                cJSON *parsed = cJSON_Parse(it->valuestring);
                if (cJSON_IsObject(parsed)) v = json_to_jv(c, parsed, 0, depth + 1);
                else v = jv_str_copy(c, it->valuestring, strlen(it->valuestring));
                cJSON_Delete(parsed);
            } else {
                v = json_to_jv(c, it, args, depth + 1);
            }
            jv *key = v ? jv_str_copy(c, it->string, strlen(it->string)) : NULL;
            if (!key || jdict_set(c, d, key, v)) return NULL;
        }
        return d;
    }
    jfail(c, ELLM_ERR_ARG, JPOS_NONE, "tools / tool_calls: a JSON value of an unknown kind");
    return NULL;
}

/* `text` (JSON) parsed into a template value that must be a list; what
 * names it in errors. */
static jv *json_list(jctx *c, const char *text, int args, const char *what) {
    cJSON *j = cJSON_Parse(text);
    if (!cJSON_IsArray(j)) {
        cJSON_Delete(j);
        jfail(c, ELLM_ERR_ARG, JPOS_NONE, "%s is not a JSON array", what);
        return NULL;
    }
    jv *v = json_to_jv(c, j, args, 0);
    cJSON_Delete(j);
    return v;
}

/* The template's globals: messages, add_generation_prompt, bos/eos tokens,
 * tools (None unless given) and documents = None as transformers passes
 * them. Strings point at the caller's data, which outlives the render. */
static jscope *make_root(jctx *c, const chat_template_params *p, int args_objects) {
    jscope *root = jscope_new(c, NULL);
    jv *msgs = root ? jv_list(c, (size_t)p->n_messages) : NULL;
    if (!msgs) return NULL;
    for (int i = 0; i < p->n_messages; i++) {
        const chat_message *m = &p->messages[i];
        jv *d = jv_dict(c, 0);
        jv *role = d ? jv_str_ref(c, m->role, strlen(m->role)) : NULL;
        jv *content = !role ? NULL : m->content ? jv_str_ref(c, m->content, strlen(m->content)) : J_NONE;
        if (!content || jdict_set_str(c, d, "role", 4, role) || jdict_set_str(c, d, "content", 7, content))
            return NULL;
        if (m->tool_calls) {
            jv *calls = json_list(c, m->tool_calls, args_objects, "a message's tool_calls");
            if (!calls || jdict_set_str(c, d, "tool_calls", 10, calls)) return NULL;
        }
        if (m->tool_call_id) {
            jv *id = jv_str_ref(c, m->tool_call_id, strlen(m->tool_call_id));
            if (!id || jdict_set_str(c, d, "tool_call_id", 12, id)) return NULL;
        }
        if (m->name) {
            jv *name = jv_str_ref(c, m->name, strlen(m->name));
            if (!name || jdict_set_str(c, d, "name", 4, name)) return NULL;
        }
        msgs->u.l->items[i] = d;
    }
    jv *tools = p->tools ? json_list(c, p->tools, 0, "tools") : J_NONE;
    if (!tools) return NULL;
    const char *bos = p->bos_token ? p->bos_token : "", *eos = p->eos_token ? p->eos_token : "";
    jv *bos_v = jv_str_ref(c, bos, strlen(bos)), *eos_v = jv_str_ref(c, eos, strlen(eos));
    if (!bos_v || !eos_v || jscope_set(c, root, "messages", 8, msgs) ||
        jscope_set(c, root, "add_generation_prompt", 21, J_BOOL(p->add_generation_prompt)) ||
        jscope_set(c, root, "bos_token", 9, bos_v) || jscope_set(c, root, "eos_token", 9, eos_v) ||
        jscope_set(c, root, "tools", 5, tools) || jscope_set(c, root, "documents", 9, J_NONE))
        return NULL;
    return root;
}

/* Parses (and, with params, renders) one template; the shared body of
 * chat_template_render_ex and chat_template_check. */
static ellm_status run(const char *src, size_t len, const chat_template_params *p, int args_objects, char **out,
                       size_t *out_len, ellm_error *err) {
    if (len > JINJA_MAX_SOURCE)
        return ellm_fail(err, ELLM_ERR_ARG, "chat template: %zu bytes is larger than the %zu MiB accepted",
                         len, JINJA_MAX_SOURCE >> 20);
    jctx *c = calloc(1, sizeof *c);
    if (!c) return ellm_fail(err, ELLM_ERR_NOMEM, "chat template: out of memory");
    c->src = src;
    c->src_len = len;
    c->err = err;
    c->lim = limits_or_defaults(p ? p->limits : NULL);
    c->arena.limit = c->lim.max_memory;
    c->now = p ? p->now : 0;
    jnodes body;
    jbuf buf = {0};
    if (jinja_lex(c) == 0 && jinja_parse(c, &body) == 0 && p) {
        jscope *root = make_root(c, p, args_objects);
        if (root) jinja_render(c, root, &body, &buf);
        if (c->status == ELLM_OK && !buf.p) { /* empty output: still a string */
            buf.p = malloc(1);
            if (buf.p) buf.p[0] = 0;
            else jfail(c, ELLM_ERR_NOMEM, JPOS_NONE, "out of memory");
        }
    }
    ellm_status st = c->status;
    jarena_free(&c->arena);
    free(c);
    if (st != ELLM_OK) {
        jbuf_free(&buf);
        return st;
    }
    if (out) {
        *out = buf.p;
        *out_len = buf.n;
    } else {
        jbuf_free(&buf);
    }
    return ELLM_OK;
}

ellm_status chat_template_render_ex(const char *template_src, size_t len,
                                    const chat_template_params *params, char **out,
                                    size_t *out_len, ellm_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!template_src || !params || !out || !out_len || params->n_messages < 0 ||
        (params->n_messages > 0 && !params->messages))
        return ellm_fail(err, ELLM_ERR_ARG, "chat template: missing template, messages or output");
    for (int i = 0; i < params->n_messages; i++)
        if (!params->messages[i].role)
            return ellm_fail(err, ELLM_ERR_ARG, "chat template: message %d has no role", i);
    ellm_status st = run(template_src, len, params, 1, out, out_len, err);
    /* Templates that splice a call's arguments into text with `+` (DeepSeek's)
     * want them as the JSON string the client sent, where the others want an
     * object: a type error with tool calls present renders again with strings. */
    int calls = 0;
    for (int i = 0; i < params->n_messages && !calls; i++) calls = params->messages[i].tool_calls != NULL;
    if (st == ELLM_ERR_FORMAT && calls) {
        ellm_error err2 = {0};
        if (run(template_src, len, params, 0, out, out_len, &err2) == ELLM_OK) return ELLM_OK;
    }
    return st;
}

ellm_status chat_template_render(const char *template_src, size_t len, const chat_message *msgs,
                                 int n_msgs, int add_generation_prompt, const char *bos_token,
                                 const char *eos_token, char **out, size_t *out_len,
                                 ellm_error *err) {
    chat_template_params p = {
        .messages = msgs,
        .n_messages = n_msgs,
        .add_generation_prompt = add_generation_prompt,
        .bos_token = bos_token,
        .eos_token = eos_token,
    };
    return chat_template_render_ex(template_src, len, &p, out, out_len, err);
}

ellm_status chat_template_check(const char *template_src, size_t len, ellm_error *err) {
    if (!template_src) return ellm_fail(err, ELLM_ERR_ARG, "chat template: missing template");
    return run(template_src, len, NULL, 1, NULL, NULL, err);
}

/* ---- built-in templates: each family's official template, verbatim ---- */

/* llama2: tests/data/chat/llama2-chat.jinja */
static const char tpl_llama2[] =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/* llama3: tests/data/chat/llama3-instruct.jinja */
static const char tpl_llama3[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n"
    "\n"
    "'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n"
    "\n"
    "' }}";

/* chatml: tests/data/chat/chatml.jinja */
static const char tpl_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n"
    "' + message['content'] + '<|im_end|>' + '\n"
    "'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n"
    "' }}{% endif %}";

/* mistral: tests/data/chat/mistral-v1-system.jinja */
static const char tpl_mistral[] =
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}"
    "\n"
    "    {%- endif %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}"
    "\n"
    "        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- ' ' + message['content'] + eos_token}}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}"
    "\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n";

/* phi3: tests/data/chat/phi-3.5-mini-instruct.jinja */
static const char tpl_phi3[] =
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% elif message['role'] == 'user' %}{{'<|user|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n"
    "' + message['content'] + '<|end|>\n"
    "'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n"
    "' }}{% else %}{{ eos_token }}{% endif %}";

/* deepseek: tests/data/chat/deepseek-llm-chat.jinja */
static const char tpl_deepseek[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\n"
    "\n"
    "' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] + '\n"
    "\n"
    "' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";

/* deepseek-coder: tests/data/chat/deepseek-coder-instruct.jinja */
static const char tpl_deepseek_coder[] =
    "{% if not add_generation_prompt is defined %}\n"
    "{% set add_generation_prompt = false %}\n"
    "{% endif %}\n"
    "{%- set ns = namespace(found=false) -%}\n"
    "{%- for message in messages -%}\n"
    "    {%- if message['role'] == 'system' -%}\n"
    "        {%- set ns.found = true -%}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
    "{{bos_token}}{%- if not ns.found -%}\n"
    "{{'You are an AI programming assistant, utilizing the Deepseek Coder model, developed by Deepseek Company, and you only answer questions related to computer science. For politically sensitive questions, security and privacy issues, and other non-computer science questions, you will refuse to answer\\n'}}"
    "\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['role'] == 'system' %}\n"
    "{{ message['content'] }}\n"
    "    {%- else %}\n"
    "        {%- if message['role'] == 'user' %}\n"
    "{{'### Instruction:\\n' + message['content'] + '\\n'}}\n"
    "        {%- else %}\n"
    "{{'### Response:\\n' + message['content'] + '\\n<|EOT|>\\n'}}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{% if add_generation_prompt %}\n"
    "{{'### Response:'}}\n"
    "{% endif %}";

/* deepseek3: tests/data/chat/deepseek-v3.jinja */
static const char tpl_deepseek3[] =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}"
    "{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}{%- if ns.is_first_sp %}"
    "{% set ns.system_prompt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}"
    "{%- else %}{% set ns.system_prompt = ns.system_prompt + '\n"
    "\n"
    "' + message['content'] %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}"
    "{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is none %}"
    "{%- set ns.is_tool = false -%}{%- for tool in message['tool_calls']%}{%- if not ns.is_first %}"
    "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n"
    "' + '```json' + '\n"
    "' + tool['function']['arguments'] + '\n"
    "' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns.is_first = true -%}{%- else %}{{'\n"
    "' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n"
    "' + '```json' + '\n"
    "' + tool['function']['arguments'] + '\n"
    "' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- endfor %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- set ns.is_tool = false -%}{%- else %}{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}"
    "{%- endif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -%}"
    "{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}"
    "{%- set ns.is_output_first = false %}{%- else %}{{'\n"
    "<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}"
    "{%- endif %}{%- endfor -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    "{% if add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}";

/* gemma: tests/data/chat/gemma-7b-it.jinja */
static const char tpl_gemma[] =
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}"
    "{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}";

/* zephyr: tests/data/chat/zephyr-7b-beta.jinja */
static const char tpl_zephyr[] =
    "{% for message in messages %}\n"
    "{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\n"
    "' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\n"
    "' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n"
    "'  + message['content'] + eos_token }}\n"
    "{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n"
    "{{ '<|assistant|>' }}\n"
    "{% endif %}\n"
    "{% endfor %}";

static const struct {
    const char *name;
    const char *text;
} builtins[] = {
    {"llama2", tpl_llama2},
    {"llama3", tpl_llama3},
    {"chatml", tpl_chatml},
    {"mistral", tpl_mistral},
    {"phi3", tpl_phi3},
    {"deepseek", tpl_deepseek},
    {"deepseek-coder", tpl_deepseek_coder},
    {"deepseek3", tpl_deepseek3},
    {"gemma", tpl_gemma},
    {"zephyr", tpl_zephyr},
};

#define N_BUILTINS (sizeof builtins / sizeof builtins[0])

const char *chat_template_builtin(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (strcmp(builtins[i].name, name) == 0) return builtins[i].text;
    return NULL;
}

static const char *const builtin_names[] = {"llama2", "llama3", "chatml", "mistral", "phi3", "deepseek",
                                            "deepseek-coder", "deepseek3", "gemma", "zephyr", NULL};
_Static_assert(sizeof builtin_names / sizeof builtin_names[0] == N_BUILTINS + 1,
               "builtin_names lists every built-in template");

const char *const *chat_template_builtin_names(void) { return builtin_names; }

/* ---- GGUF models ---- */

/* Text of token `key` ("tokenizer.ggml.bos_token_id"), malloc'ed; "" if the
 * model has no such token. NULL only when out of memory. */
static char *token_text(const gguf_file *f, const char *key) {
    int64_t id, tokens = gguf_find_key(f, "tokenizer.ggml.tokens");
    const char *s = "";
    size_t n = 0;
    if (gguf_get_i64(f, key, &id, NULL) != ELLM_OK || tokens < 0 || id < 0 ||
        gguf_get_arr_str(f, tokens, (uint64_t)id, &s, &n) != ELLM_OK) {
        s = "";
        n = 0;
    }
    char *t = malloc(n + 1);
    if (t) {
        memcpy(t, s, n);
        t[n] = 0;
    }
    return t;
}

/* The family a vocabulary's special tokens point to, for models that ship
 * no template; NULL if nothing is recognisable. */
static const char *guess_family(const gguf_file *f) {
    static const struct {
        const char *token;
        const char *family;
    } markers[] = {
        {"<|im_start|>", "chatml"},     {"<|start_header_id|>", "llama3"},
        {"<start_of_turn>", "gemma"},   {"<\xef\xbd\x9cUser\xef\xbd\x9c>", "deepseek3"},
        {"<|EOT|>", "deepseek-coder"},  {"<|end|>", "phi3"},
        {"[INST]", "mistral"},
    };
    int64_t key = gguf_find_key(f, "tokenizer.ggml.tokens");
    gguf_value_type type;
    uint64_t n = 0;
    const void *data;
    if (key < 0 || gguf_get_arr(f, "tokenizer.ggml.tokens", &type, &n, &data, NULL) != ELLM_OK ||
        type != GGUF_TYPE_STRING)
        return NULL;
    size_t best = sizeof markers / sizeof markers[0];
    int bos_is_deepseek = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *s;
        size_t len;
        if (gguf_get_arr_str(f, key, i, &s, &len) != ELLM_OK) continue;
        for (size_t m = 0; m < best; m++)
            if (strlen(markers[m].token) == len && memcmp(markers[m].token, s, len) == 0) best = m;
        if (len == 25 && memcmp(s, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", 25) == 0)
            bos_is_deepseek = 1;
    }
    if (best < sizeof markers / sizeof markers[0]) return markers[best].family;
    if (bos_is_deepseek) return "deepseek";
    const char *model;
    size_t len;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, &len, NULL) == ELLM_OK && len == 5 &&
        memcmp(model, "llama", 5) == 0)
        return "llama2";
    return NULL;
}

const char *chat_template_builtin_guess(const gguf_file *f) {
    const char *name = f ? guess_family(f) : NULL;
    return name ? chat_template_builtin(name) : NULL;
}

ellm_status chat_template_render_gguf(const gguf_file *f, const char *fallback,
                                      const chat_message *msgs, int n_msgs,
                                      int add_generation_prompt, const char *tools, char **out,
                                      size_t *out_len, ellm_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!f) return ellm_fail(err, ELLM_ERR_ARG, "chat template: no model");
    const char *src;
    size_t len;
    if (gguf_get_str(f, "tokenizer.chat_template", &src, &len, NULL) != ELLM_OK) {
        const char *name = fallback ? fallback : guess_family(f);
        if (!name)
            return ellm_fail(err, ELLM_ERR_UNSUPPORTED,
                             "chat template: the model has no tokenizer.chat_template and its family is "
                             "not recognisable; name a built-in template");
        src = chat_template_builtin(name);
        if (!src)
            return ellm_fail(err, ELLM_ERR_ARG, "chat template: no built-in template called '%s'", name);
        len = strlen(src);
    }
    char *bos = token_text(f, "tokenizer.ggml.bos_token_id");
    char *eos = token_text(f, "tokenizer.ggml.eos_token_id");
    ellm_status st;
    if (!bos || !eos)
        st = ellm_fail(err, ELLM_ERR_NOMEM, "chat template: out of memory");
    else {
        chat_template_params p = {.messages = msgs, .n_messages = n_msgs, .add_generation_prompt = add_generation_prompt,
                                  .bos_token = bos, .eos_token = eos, .tools = tools};
        st = chat_template_render_ex(src, len, &p, out, out_len, err);
    }
    free(bos);
    free(eos);
    return st;
}
