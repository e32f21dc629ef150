/* Chat template tests.
 *
 *  - golden: every tests/data/chat/NAME.jinja over every conversation in
 *    conversations.txt, with and without add_generation_prompt, equals
 *    NAME.expected byte for byte (rendered once by @huggingface/jinja, see
 *    tools/render_chat_expected.mjs), or fails as it does;
 *  - built-in templates equal their data files; GGUF models render with
 *    their own template or a guessed built-in;
 *  - interpreter features against known Jinja/Python results;
 *  - bad templates: the right status and a message with line:column, never
 *    a crash; runaway templates stop at the limits; every prefix of every
 *    template renders or fails cleanly. */
#include "harness.h"

#include "gguf/gguf.h"
#include "chat/chat.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <string.h>

/* strftime_now's clock in the expected files: 2024-07-26 12:00:00 UTC */
#define FIXED_NOW 1721995200

#define MAX_CONVS 16
#define MAX_MSGS 16

typedef struct {
    char name[64];
    int n;
    chat_message msgs[MAX_MSGS];
} conversation;

static conversation convs[MAX_CONVS];
static int n_convs;

/* Reads "WORD... LEN\n<LEN bytes>\n" records: returns the header line (NUL-
 * terminated in place) and the payload; NULL at the end or on bad input. */
static char *next_record(char **cur, char *end, char **payload, size_t *len) {
    char *p = *cur;
    while (p < end && *p == '#') { /* comment lines */
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) return NULL;
        p = nl + 1;
    }
    if (p >= end) return NULL;
    char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return NULL;
    *nl = 0;
    if (strncmp(p, "conversation ", 13) == 0) { /* "conversation NAME COUNT": no payload */
        *payload = nl + 1;
        *len = 0;
        *cur = nl + 1;
        return p;
    }
    char *sp = strrchr(p, ' ');
    if (!sp) return NULL;
    *len = (size_t)strtoull(sp + 1, NULL, 10);
    *sp = 0;
    *payload = nl + 1;
    if (*len > (size_t)(end - *payload) || (*payload)[*len] != '\n') return NULL;
    (*payload)[*len] = 0; /* payloads become C strings (they contain no NUL) */
    *cur = *payload + *len + 1;
    return p;
}

static int load_conversations(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat/conversations.txt", test_data_dir());
    size_t size;
    char *buf = test_read_file(path, &size); /* kept for the program's life: messages point into it */
    if (!buf) return -1;
    char *cur = buf, *end = buf + size, *payload;
    size_t len;
    char *head;
    while ((head = next_record(&cur, end, &payload, &len))) {
        if (strncmp(head, "conversation ", 13) == 0) {
            if (n_convs == MAX_CONVS) return -1;
            conversation *cv = &convs[n_convs++];
            snprintf(cv->name, sizeof cv->name, "%s", head + 13);
            char *sp = strchr(cv->name, ' '); /* drop the message count */
            if (sp) *sp = 0;
            cv->n = 0;
        } else if (strncmp(head, "message ", 8) == 0 && n_convs > 0) {
            conversation *cv = &convs[n_convs - 1];
            if (cv->n == MAX_MSGS) return -1;
            cv->msgs[cv->n].role = head + 8;
            cv->msgs[cv->n].content = payload;
            cv->n++;
        } else {
            return -1;
        }
    }
    return n_convs > 0 ? 0 : -1;
}

static conversation *find_conv(const char *name) {
    for (int i = 0; i < n_convs; i++)
        if (strcmp(convs[i].name, name) == 0) return &convs[i];
    return NULL;
}

static ellm_status render(const char *tpl, size_t len, const conversation *cv, int agp, const char *bos,
                          const char *eos, char **out, size_t *out_len, ellm_error *err) {
    chat_template_params p = {
        .messages = cv->msgs,
        .n_messages = cv->n,
        .add_generation_prompt = agp,
        .bos_token = bos,
        .eos_token = eos,
        .now = FIXED_NOW,
    };
    return chat_template_render_ex(tpl, len, &p, out, out_len, err);
}

static void report_diff(const char *what, const char *want, size_t want_n, const char *got, size_t got_n) {
    size_t i = 0;
    while (i < want_n && i < got_n && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  %s: first difference at byte %zu (want %zu bytes, got %zu)\n", what, i, want_n, got_n);
    fprintf(stderr, "  want: ...%.*s...\n", (int)(want_n - from < 80 ? want_n - from : 80), want + from);
    fprintf(stderr, "  got:  ...%.*s...\n", (int)(got_n - from < 80 ? got_n - from : 80), got + from);
}

/* ---- golden renderings ---- */

static int golden_cases;

static void test_golden_file(const char *name) {
    char path[512];
    size_t tpl_len = 0, exp_len = 0;
    snprintf(path, sizeof path, "%s/chat/%s.jinja", test_data_dir(), name);
    char *tpl = test_read_file(path, &tpl_len);
    snprintf(path, sizeof path, "%s/chat/%s.expected", test_data_dir(), name);
    char *exp = test_read_file(path, &exp_len);
    CHECK(tpl && exp, "%s: cannot read template or expected file", name);
    if (!tpl || !exp) {
        free(tpl);
        free(exp);
        return;
    }
    ellm_error err;
    CHECK(chat_template_check(tpl, tpl_len, &err) == ELLM_OK, "%s: does not parse: %s", name, err.msg);

    char *cur = exp, *end = exp + exp_len, *payload, *head;
    size_t len;
    const char *bos = "", *eos = "";
    while ((head = next_record(&cur, end, &payload, &len))) {
        if (strcmp(head, "bos") == 0) {
            bos = payload;
            continue;
        }
        if (strcmp(head, "eos") == 0) {
            eos = payload;
            continue;
        }
        char conv_name[64], kind[16];
        int agp;
        if (sscanf(head, "case %63s %d %15s", conv_name, &agp, kind) != 3) {
            CHECK(0, "%s: bad record '%s'", name, head);
            break;
        }
        const conversation *cv = find_conv(conv_name);
        CHECK(cv != NULL, "%s: unknown conversation %s", name, conv_name);
        if (!cv) continue;
        char *out = NULL;
        size_t out_len = 0;
        err.msg[0] = 0;
        ellm_status st = render(tpl, tpl_len, cv, agp, bos, eos, &out, &out_len, &err);
        golden_cases++;
        if (strcmp(kind, "ok") == 0) {
            int same = st == ELLM_OK && out_len == len && memcmp(out, payload, len) == 0;
            CHECK(same, "%s / %s / agp=%d: %s", name, conv_name, agp,
                  st == ELLM_OK ? "rendering differs" : err.msg);
            if (!same && st == ELLM_OK) report_diff(name, payload, len, out, out_len);
        } else if (strcmp(kind, "raise") == 0) {
            CHECK(st == ELLM_ERR_ARG && strstr(err.msg, payload) != NULL,
                  "%s / %s / agp=%d: want raise_exception('%s'), got %s: %s", name, conv_name, agp, payload,
                  ellm_status_str(st), st == ELLM_OK ? out : err.msg);
        } else {
            CHECK(st != ELLM_OK, "%s / %s / agp=%d: want an error like '%s', got success", name, conv_name, agp,
                  payload);
        }
        CHECK((st == ELLM_OK) == (out != NULL), "%s: output pointer and status disagree", name);
        free(out);
    }
    free(tpl);
    free(exp);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void test_golden(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat", test_data_dir());
    DIR *d = opendir(path);
    CHECK(d != NULL, "cannot open %s", path);
    if (!d) return;
    char *names[128];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 128) {
        size_t len = strlen(e->d_name);
        if (len > 9 && strcmp(e->d_name + len - 9, ".expected") == 0) {
            names[n] = strdup(e->d_name);
            names[n][len - 9] = 0;
            n++;
        }
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    CHECK(n >= 30, "only %d templates with expected renderings", n);
    for (int i = 0; i < n; i++) {
        test_golden_file(names[i]);
        free(names[i]);
    }
    printf("golden: %d templates, %d renderings\n", n, golden_cases);
}

/* ---- built-ins and GGUF ---- */

static void test_builtins(void) {
    static const struct {
        const char *name, *file;
    } files[] = {
        {"llama2", "llama2-chat"},         {"llama3", "llama3-instruct"},
        {"chatml", "chatml"},              {"mistral", "mistral-v1-system"},
        {"phi3", "phi-3.5-mini-instruct"}, {"deepseek", "deepseek-llm-chat"},
        {"deepseek-coder", "deepseek-coder-instruct"}, {"deepseek3", "deepseek-v3"},
        {"gemma", "gemma-7b-it"},          {"zephyr", "zephyr-7b-beta"},
    };
    int n_names = 0;
    for (const char *const *p = chat_template_builtin_names(); *p; p++) n_names++;
    CHECK(n_names == (int)(sizeof files / sizeof files[0]), "%d built-in names", n_names);
    for (const char *const *p = chat_template_builtin_names(); *p; p++)
        CHECK(chat_template_builtin(*p) != NULL, "built-in '%s' listed but missing", *p);
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const char *t = chat_template_builtin(files[i].name);
        char path[512];
        size_t len;
        snprintf(path, sizeof path, "%s/chat/%s.jinja", test_data_dir(), files[i].file);
        char *want = test_read_file(path, &len);
        CHECK(t && want && strlen(t) == len && memcmp(t, want, len) == 0,
              "built-in '%s' differs from %s.jinja", files[i].name, files[i].file);
        free(want);
    }
    CHECK(chat_template_builtin("nope") == NULL, "unknown built-in name");
    CHECK(chat_template_builtin(NULL) == NULL, "NULL built-in name");
}

/* Renders a GGUF model's conversation and compares with NAME.expected's case. */
static void check_gguf(const char *vocab, const char *fallback, const char *expected, const char *conv,
                       int agp) {
    char path[512];
    snprintf(path, sizeof path, "%s/vocab/%s", test_data_dir(), vocab);
    gguf_file *f;
    ellm_error err;
    if (gguf_open(path, &f, &err) != ELLM_OK) {
        CHECK(0, "%s: %s", vocab, err.msg);
        return;
    }
    const conversation *cv = find_conv(conv);
    char *out = NULL;
    size_t out_len;
    ellm_status st = chat_template_render_gguf(f, fallback, cv->msgs, cv->n, agp, NULL, &out, &out_len, &err);
    CHECK(st == ELLM_OK, "%s: %s", vocab, err.msg);

    snprintf(path, sizeof path, "%s/chat/%s.expected", test_data_dir(), expected);
    size_t exp_len;
    char *exp = test_read_file(path, &exp_len);
    char want_head[128];
    snprintf(want_head, sizeof want_head, "case %s %d ok", conv, agp);
    char *cur = exp, *end = exp + exp_len, *payload, *head;
    size_t len;
    int found = 0;
    while (exp && (head = next_record(&cur, end, &payload, &len))) {
        if (strcmp(head, want_head) != 0) continue;
        found = 1;
        int same = out && out_len == len && memcmp(out, payload, len) == 0;
        CHECK(same, "%s rendered differently from %s.expected (%s)", vocab, expected, want_head);
        if (!same && out) report_diff(vocab, payload, len, out, out_len);
    }
    CHECK(found, "%s.expected has no '%s'", expected, want_head);
    free(exp);
    free(out);
    gguf_close(f);
}

static void test_gguf(void) {
    /* phi-3 ships Phi-3-mini's template; llama-spm has none: guessed llama2 */
    check_gguf("ggml-vocab-phi-3.gguf", NULL, "phi-3-mini", "multi", 1);
    check_gguf("ggml-vocab-phi-3.gguf", NULL, "phi-3-mini", "user", 0);
    check_gguf("ggml-vocab-llama-spm.gguf", NULL, "llama2-chat", "multi", 0);
    check_gguf("ggml-vocab-llama-spm.gguf", "zephyr", "zephyr-7b-beta", "system_user", 1);

    char path[512];
    snprintf(path, sizeof path, "%s/vocab/ggml-vocab-llama-spm.gguf", test_data_dir());
    gguf_file *f;
    ellm_error err;
    if (gguf_open(path, &f, &err) == ELLM_OK) {
        char *out = (char *)1;
        size_t n;
        ellm_status st = chat_template_render_gguf(f, "no-such-template", convs[0].msgs, convs[0].n, 0, NULL, &out, &n, &err);
        CHECK(st == ELLM_ERR_ARG && out == NULL, "unknown fallback name: %s", ellm_status_str(st));
        gguf_close(f);
    }
}

/* ---- features ---- */

typedef struct {
    const char *tpl;
    const char *want;
} feature_case;

/* Expected values are what Jinja2 (Python) renders with transformers'
 * settings (trim_blocks, lstrip_blocks). */
static const feature_case features[] = {
    /* whitespace control */
    {"a  {%- if true %} b {% endif -%}  c", "a b c"},
    {"{% if true %}\n  x\n{% endif %}\n", "  x\n"},
    {"  {% if true %}\nx{% endif %}", "x"},
    {"a {%+ if true %}b{% endif %}", "a b"},
    {"{# comment #}\nx", "x"},
    {"x\n", "x"},
    {"x\n\n", "x\n"},
    {"{{ 'a' }}\n{{ 'b' }}", "a\nb"},
    {"{{- ' a ' -}}  \n  ", " a "},
    {"{% raw %}{{ not parsed }}{% endraw %}", "{{ not parsed }}"},
    /* loops */
    {"{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "10TrueFalse3|21FalseFalse3|32FalseTrue3|"},
    {"{% for x in [1,2,3] %}{{ loop.revindex }}{{ loop.previtem }}{{ loop.nextitem }},{% endfor %}", "32,213,12,"},
    {"{% for x in [] %}no{% else %}empty{% endfor %}", "empty"},
    {"{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.last }}{% endfor %}", "2False4True"},
    {"{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;"},
    {"{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}", "ab"},
    {"{% for c in 'héé' %}[{{ c }}]{% endfor %}", "[h][é][é]"},
    {"{% for x in range(5) %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
     "02"},
    {"{% for x in range(2, 9, 3) %}{{ x }}{% endfor %}{% for x in range(3, 0, -1) %}{{ x }}{% endfor %}", "258321"},
    {"{% for a in [1,2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}",
     "1x11y21 2x12y22 "},
    {"{% for x in [1,2,3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "aba"},
    /* scoping */
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "1"},
    {"{% set ns = namespace(x=1) %}{% for i in [1,2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}", "4"},
    {"{% if true %}{% set y = 5 %}{% endif %}{{ y }}", "5"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}", "12"},
    {"{% set s %}in {{ 'block' }}{% endset %}[{{ s }}]", "[in block]"},
    /* expressions */
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }}",
     "7 9 3 -4 1 2 1024"},
    {"{{ 7 / 2 }} {{ 1 / 3 }} {{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 3 * 1.5 }}",
     "3.5 0.3333333333333333 1.0 1e+20 0.30000000000000004 4.5"},
    {"{{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'x' + 'y' }}", "a1None ababab [1, 2] xy"},
    {"{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 'a' != 'a' }} {{ [1, 2] == [1, 2] }} {{ true == 1 }}",
     "True True True False True True"},
    {"{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 'x' in undefined_var }}",
     "True True True True False"},
    {"{{ none or 'x' }} {{ 0 and 'y' }} {{ not '' }} {{ [] or {} }}", "x 0 True {}"},
    {"{{ 'yes' if 1 > 0 else 'no' }} {{ 'a' if false }}|{{ 'c' if false else 'd' if true else 'e' }}", "yes |d"},
    {"{{ x }}|{{ x.y.z }}|{{ x is defined }}|{{ none is none }}|{{ 'a' is string }}", "||False|True|True"},
    {"{{ [1, 'a', none, true, 1.5, {'k': [2]}] }} {{ (1,) }} {{ ('a', 'b') }} {{ \"it's\" }}",
     "[1, 'a', None, True, 1.5, {'k': [2]}] (1,) ('a', 'b') it's"},
    {"{{ [\"it's\", 'q\"', '\\n'] }}", "[\"it's\", 'q\"', '\\n']"},
    {"{{ 'a' 'b' \"c\" }} {{ '\\x41\\u00e9\\t|' }}", "abc Aé\t|"},
    /* subscripts, slices */
    {"{{ [1,2,3][-1] }} {{ [1,2,3][1:] }} {{ [1,2,3][::-1] }} {{ 'héllo'[1] }} {{ 'héllo'[::-1] }} {{ 'abcdef'[1:5:2] }}",
     "3 [2, 3] [3, 2, 1] é olléh bd"},
    {"{{ [1,2,3][5] }}|{{ {'a': 1}['b'] }}|{{ 'abc'[:-1] }}|{{ [1,2,3][-5:2] }}", "||ab|[1, 2]"},
    {"{% set m = {'role': 'user', 'items': 3} %}{{ m.role }} {{ m['role'] }} {{ m.items }} {{ m.get('x', 'd') }} {{ m.get('role') }}",
     "user user 3 d user"},
    /* string methods */
    {"{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '\\n\\na'.lstrip('\\n') }}|{{ 'a  '.rstrip() }}|", "a b|a|a|a|"},
    {"{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }}",
     "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a,b', 'c']"},
    {"{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }}",
     "True True Hello World Hello"},
    {"{{ 'aXa'.upper() }} {{ 'AxA'.lower() }} {{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'ab'.replace('', '.') }}",
     "AXA axa a+b+c ab-c .a.b."},
    {"{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }} {{ '12'.isdigit() }}",
     "2 3 2 a, b True"},
    /* filters */
    {"{{ '  x  ' | trim }}|{{ 'abc' | length }}|{{ [1,2] | length }}|{{ 'hi' | upper }}|{{ 'HI' | lower }}|{{ 'ab cd' | title }}",
     "x|3|2|HI|hi|Ab Cd"},
    {"{{ [3,1,2] | sort }} {{ ['b','A','c'] | sort }} {{ [3,1,2] | sort(reverse=true) }} {{ [1,2,3] | reverse | list }}",
     "[1, 2, 3] ['A', 'b', 'c'] [3, 2, 1] [3, 2, 1]"},
    /* nothing to sort: an undefined value (an empty list with no items at
     * all; found by fuzz_chat_template) and an empty list */
    {"{{ undefined_var | sort | tojson(indent=2) }} {{ [] | sort(attribute='a') }} {{ undefined_var | sort | length }}",
     "[] [] 0"},
    /* an attribute path that is not a string or an integer names nothing
     * (it was read through the value's string member, for an undefined one
     * a NULL pointer: found by fuzz_chat_template, seen under UBSan);
     * outputs as Jinja2 3.1 gives them */
    {"{{ [{'a': 1}] | map(attribute=nope) | select | list | length }} {{ [1, 2] | map(attribute=[1]) | select | list }} "
     "{{ [[1, 2]] | map(attribute=1.5) | select | list }}|{{ [1, 1] | unique(attribute=nope) | list }}",
     "0 [] []|[1]"},
    {"{{ [{'a': 1}, {'a': 0}] | selectattr(nope) | list }} {{ [{'a': 1}] | rejectattr(1.5) | list }}", "[] [{'a': 1}]"},
    {"{{ [1,2,3] | first }} {{ [1,2,3] | last }} {{ ['a','b'] | join(', ') }} {{ [1,2] | join }} {{ 'x' | default('d') }} {{ y | default('d') }}",
     "1 3 a, b 12 x d"},
    {"{{ '' | default('d', true) }} {{ '5' | int + 1 }} {{ 'x' | int }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 3.5 | round }}",
     "d 6 0 3 2.5 2.57 2.0 4.0"},
    {"{{ 2.675 | round(2) }} {{ 1234.5 | round(-2) }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }}",
     "2.67 1200.0 3.0 2.0"},
    {"{{ {'a': 1, 'b': [1, 'x', none, true]} | tojson }} {{ 'é\"\\n' | tojson }} {{ 'é' | tojson(ensure_ascii=true) }}",
     "{\"a\": 1, \"b\": [1, \"x\", null, true]} \"é\\\"\\n\" \"\\u00e9\""},
    {"{{ {'b': 1, 'a': {}} | tojson(indent=2, sort_keys=true) }}", "{\n  \"a\": {},\n  \"b\": 1\n}"},
    {"{{ [{'r': 'u', 'n': 1}, {'r': 'a', 'n': 2}, {'r': 'u', 'n': 3}] | selectattr('r', 'equalto', 'u') | map(attribute='n') | list }}",
     "[1, 3]"},
    {"{{ [{'r': 'u'}, {'r': 'a'}] | rejectattr('r', 'eq', 'u') | list }} {{ [1, 0, 2] | select | list }} {{ [1, 2, 3, 4] | reject('odd') | list }}",
     "[{'r': 'a'}] [1, 2] [2, 4]"},
    {"{{ ['a', 'b'] | map('upper') | join }} {{ {'a': 1} | items | list }} {{ [1, 2, 2, 1] | unique | list }} {{ [1, 5, 3] | max }} {{ [1, 2] | sum }}",
     "AB [('a', 1)] [1, 2] 5 3"},
    {"{{ 'line1\\nline2' | indent(2) }} {{ '<a>' | e }} {{ 42 | string | length }} {{ 'hi' | capitalize }} {{ -3 | abs }}",
     "line1\n  line2 &lt;a&gt; 2 Hi 3"},
    {"{% filter upper %}abc{% endfilter %}", "ABC"},
    {"{{ {'b': 2, 'a': 1} | dictsort }}", "[('a', 1), ('b', 2)]"},
    /* tests */
    {"{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ {} is mapping }} {{ [] is iterable }} {{ 1 is number }} {{ x is undefined }}",
     "True True True True True True True"},
    {"{{ true is boolean }} {{ 1 is integer }} {{ 1.0 is float }} {{ 'x' is lower }} {{ 2 is eq 2 }} {{ 1 is in [1] }} {{ none is not none }}",
     "True True True True True True False"},
    /* macros */
    {"{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }}",
     "Hi a! Hi b?"},
    {"{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{% for i in [1] %}{% set g = 'L' %}{{ m() }}{% endfor %}", "G"},
    /* globals */
    {"{{ namespace(a=1).a }} {{ dict(a=1) }} {{ range(3) | list }} {{ strftime_now('%Y-%m-%d %b') }}",
     "1 {'a': 1} [0, 1, 2] 2024-07-26 Jul"},
    /* the variables a template sees */
    {"{{ messages | length }} {{ messages[0].role }} {{ messages[0]['content'] }} {{ add_generation_prompt }} {{ bos_token }}{{ eos_token }} {{ tools }} {{ documents is none }}",
     "1 user Hi True <s></s> None True"},
};

static void test_features(void) {
    chat_message m = {.role = "user", .content = "Hi"};
    for (size_t i = 0; i < sizeof features / sizeof features[0]; i++) {
        chat_template_params p = {.messages = &m, .n_messages = 1, .add_generation_prompt = 1, .bos_token = "<s>",
                                  .eos_token = "</s>", .now = FIXED_NOW};
        char *out = NULL;
        size_t n = 0;
        ellm_error err;
        ellm_status st = chat_template_render_ex(features[i].tpl, strlen(features[i].tpl), &p, &out, &n, &err);
        int ok = st == ELLM_OK && n == strlen(features[i].want) && memcmp(out, features[i].want, n) == 0;
        CHECK(ok, "feature %zu: %s\n  template: %s\n  want: [%s]\n  got:  [%s]", i,
              st == ELLM_OK ? "wrong output" : err.msg, features[i].tpl, features[i].want, st == ELLM_OK ? out : "");
        free(out);
    }
}

/* ---- errors ---- */

/* a literal template and its length */
#define TPL(s) s, strlen(s)

typedef struct {
    const char *tpl;
    ellm_status status;
    const char *msg; /* substring of the error message */
} error_case;

static const error_case errors[] = {
    /* syntax */
    {"{% if x %}hello", ELLM_ERR_FORMAT, "1:1: 'if' block is never closed (expected '{% endif %}')"},
    {"hi {{ x", ELLM_ERR_FORMAT, "1:4: unterminated '{{' tag"},
    {"{% for x in y", ELLM_ERR_FORMAT, "unterminated '{%' tag"},
    {"a\n{# open", ELLM_ERR_FORMAT, "2:1: unterminated comment"},
    {"{{ 'abc }}", ELLM_ERR_FORMAT, "1:4: unterminated string literal"},
    {"{{ a b }}", ELLM_ERR_FORMAT, "1:6: unexpected 'b', expected '}}'"},
    {"{{ (1 + }}", ELLM_ERR_FORMAT, "unexpected '}}', expected an expression"},
    {"{% endfor %}", ELLM_ERR_FORMAT, "unexpected '{% endfor %}'"},
    {"{% frobnicate %}", ELLM_ERR_FORMAT, "unknown statement 'frobnicate'"},
    {"{% break %}", ELLM_ERR_FORMAT, "'break' outside of a for loop"},
    {"{{ x $ y }}", ELLM_ERR_FORMAT, "unexpected character '$'"},
    {"{{ '\\u12' }}", ELLM_ERR_FORMAT, "truncated \\u escape"},
    {"{% raw %}abc", ELLM_ERR_FORMAT, "'raw' block without"},
    /* unsupported */
    {"line1\n  {{ x | frobnicate }}", ELLM_ERR_UNSUPPORTED, "2:10: unknown filter 'frobnicate'"},
    {"{{ x is frobnicated }}", ELLM_ERR_UNSUPPORTED, "unknown test 'frobnicated'"},
    {"{% include 'other.jinja' %}", ELLM_ERR_UNSUPPORTED, "1:4: '{% include %}' is not supported"},
    {"{% call foo() %}{% endcall %}", ELLM_ERR_UNSUPPORTED, "'{% call %}' is not supported"},
    {"{{ 'a'.format(1) }}", ELLM_ERR_UNSUPPORTED, "unknown method 'format' of str"},
    {"{{ f(*args) }}", ELLM_ERR_UNSUPPORTED, "argument unpacking"},
    {"{% for x in y recursive %}{% endfor %}", ELLM_ERR_UNSUPPORTED, "recursive for loops"},
    {"{{ '%s' % 1 }}", ELLM_ERR_UNSUPPORTED, "string formatting"},
    /* runtime */
    {"{{ raise_exception('Only user and assistant roles are supported!') }}", ELLM_ERR_ARG,
     "1:4: template error: Only user and assistant roles are supported!"},
    {"{{ 1 / 0 }}", ELLM_ERR_FORMAT, "division by zero"},
    {"{{ undefined_thing + 'x' }}", ELLM_ERR_FORMAT, "undefined value in '+'"},
    {"{{ [1] + 'x' }}", ELLM_ERR_FORMAT, "unsupported operand types for +: list and str"},
    {"{{ nosuchfunc() }}", ELLM_ERR_FORMAT, "'nosuchfunc' is undefined"},
    {"{% set x = 1 %}{% set x.y = 2 %}", ELLM_ERR_FORMAT, "cannot set attribute 'y' on int"},
    {"{% for a, b in [1] %}{% endfor %}", ELLM_ERR_FORMAT, "cannot unpack int"},
    {"{{ 1 < 'a' }}", ELLM_ERR_FORMAT, "cannot compare int with str"},
    {"{% for x in 5 %}{% endfor %}", ELLM_ERR_FORMAT, "'int' object is not iterable"},
    {"{{ 9223372036854775807 + 1 }}", ELLM_ERR_UNSUPPORTED, "integer overflow"},
    {"{{ 2 ** 64 }}", ELLM_ERR_UNSUPPORTED, "integer overflow"},
    {"{{ 99999999999999999999 }}", ELLM_ERR_UNSUPPORTED, "does not fit in 64 bits"},
    /* runaway */
    {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ELLM_ERR_UNSUPPORTED, "macro calls nested deeper than 64"},
    {"{% for i in range(1000000000) %}x{% endfor %}", ELLM_ERR_UNSUPPORTED, "exceeds 1000000 loop iterations"},
    {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ELLM_ERR_UNSUPPORTED,
     "loop iterations"},
    {"{{ 'x' * 100000000000 }}", ELLM_ERR_UNSUPPORTED, "string repetition exceeds"},
    {"{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
     ELLM_ERR_UNSUPPORTED, "exceeds"},
    {"{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}", ELLM_ERR_UNSUPPORTED,
     "the output exceeds 67108864 bytes"},
    {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}", ELLM_ERR_UNSUPPORTED, "nested too deeply"},
    {"{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", ELLM_ERR_UNSUPPORTED, "nested too deeply"},
};

static void test_errors(void) {
    chat_message m = {.role = "user", .content = "Hi"};
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        char *out = (char *)1;
        size_t n = 7;
        ellm_error err = {0};
        ellm_status st = chat_template_render(errors[i].tpl, strlen(errors[i].tpl), &m, 1, 1, "<s>", "</s>", &out,
                                              &n, &err);
        CHECK(st == errors[i].status && strstr(err.msg, errors[i].msg) && out == NULL && n == 0,
              "error %zu: %s\n  want %s containing \"%s\"\n  got %s: \"%s\"", i, errors[i].tpl,
              ellm_status_str(errors[i].status), errors[i].msg, ellm_status_str(st), err.msg);
        if (st == ELLM_OK) free(out);
    }

    /* deep nesting in the parser */
    size_t depth = 5000;
    char *deep = malloc(depth * 2 + 16);
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (size_t i = 0; i < depth; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (size_t i = 0; i < depth; i++) deep[k++] = ')';
    k += (size_t)sprintf(deep + k, " }}");
    ellm_error err;
    char *out;
    size_t n;
    ellm_status st = chat_template_render(deep, k, &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "nesting deeper than 100"), "deep parens: %s", err.msg);
    /* a long flat chain builds a deep tree: bounded too */
    k = (size_t)sprintf(deep, "{{ 1");
    for (size_t i = 0; i < 2000; i++) k += (size_t)sprintf(deep + k, "+1");
    k += (size_t)sprintf(deep + k, " }}");
    st = chat_template_render(deep, k, &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "nested deeper than 200"), "long chain: %s", err.msg);
    k = 0;
    for (size_t i = 0; i < 300; i++) k += (size_t)sprintf(deep + k, "{%% if true %%}");
    st = chat_template_render(deep, k, &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "deeper than 100 levels"), "deep ifs: %s", err.msg);
    free(deep);

    /* the evaluator's own recursion cap: deep expressions in recursive macros */
    deep = malloc(8192);
    k = (size_t)sprintf(deep, "{%% macro f(n) %%}{{ ");
    for (int i = 0; i < 20; i++) k += (size_t)sprintf(deep + k, "-(");
    k += (size_t)sprintf(deep + k, "f(n + 1)|length");
    for (int i = 0; i < 20; i++) deep[k++] = ')';
    k += (size_t)sprintf(deep + k, " }}{%% endmacro %%}{{ f(0) }}");
    st = chat_template_render(deep, k, &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "evaluation nested deeper than 600"), "deep recursion: %s",
          err.msg);
    free(deep);

    /* limits can be tightened */
    chat_template_limits lim = {.max_output = 10};
    chat_template_params p = {.messages = &m, .n_messages = 1, .limits = &lim};
    st = chat_template_render_ex(TPL("0123456789abc"), &p, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "output exceeds 10 bytes"), "max_output: %s", err.msg);
    lim = (chat_template_limits){.max_steps = 1000};
    st = chat_template_render_ex(TPL("{% for i in range(10000) %}{% endfor %}"), &p, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "1000 evaluation steps"), "max_steps: %s", err.msg);
    lim = (chat_template_limits){.max_memory = 1 << 20};
    st = chat_template_render_ex(TPL("{% for i in range(100000) %}{% set x = [i, i, i] %}{% endfor %}"), &p, &out, &n, &err);
    CHECK(st == ELLM_ERR_UNSUPPORTED && strstr(err.msg, "working memory"), "max_memory: %s", err.msg);

    /* caller errors */
    st = chat_template_render(NULL, 0, &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_ARG, "NULL template");
    chat_message bad = {.role = NULL, .content = "x"};
    st = chat_template_render(TPL("x"), &bad, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_ARG, "message without role");
    st = chat_template_render(TPL("x"), NULL, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_ERR_ARG, "NULL messages");
    /* no messages, NULL content, empty template */
    st = chat_template_render(TPL("{{ messages | length }}"), NULL, 0, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_OK && strcmp(out, "0") == 0, "no messages");
    if (st == ELLM_OK) free(out);
    chat_message none = {.role = "assistant", .content = NULL};
    st = chat_template_render(TPL("{{ messages[0].content is none }}"), &none, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_OK && strcmp(out, "True") == 0, "NULL content is None");
    if (st == ELLM_OK) free(out);
    st = chat_template_render(TPL(""), &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_OK && out && n == 0 && out[0] == 0, "empty template");
    if (st == ELLM_OK) free(out);
    /* the template is not NUL-terminated: only `len` bytes are read */
    st = chat_template_render("{{ 1 }}garbage", 7, &m, 1, 0, NULL, NULL, &out, &n, &err);
    CHECK(st == ELLM_OK && strcmp(out, "1") == 0, "length-bounded template");
    if (st == ELLM_OK) free(out);
    CHECK(chat_template_check(TPL("{% if %}"), &err) == ELLM_ERR_FORMAT, "check finds syntax errors");
    CHECK(chat_template_check(TPL("{{ x | nope }}"), &err) == ELLM_OK, "check does not evaluate");
}

/* Every prefix of every template (and of a few broken ones) renders or
 * fails cleanly: no crash, no leak (under ASan), status and output agree. */
static void test_truncated(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat", test_data_dir());
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    int ok = 1, files = 0;
    size_t prefixes = 0;
    const conversation *cv = find_conv("multi");
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".jinja") != 0) continue;
        snprintf(path, sizeof path, "%s/chat/%s", test_data_dir(), e->d_name);
        size_t n;
        char *tpl = test_read_file(path, &n);
        if (!tpl) continue;
        files++;
        for (size_t cut = 0; cut <= n; cut++) {
            char *copy = malloc(cut ? cut : 1); /* exact size: ASan catches over-reads */
            memcpy(copy, tpl, cut);
            char *out = NULL;
            size_t out_len;
            ellm_error err;
            ellm_status st = render(copy, cut, cv, (int)(cut & 1), "<s>", "</s>", &out, &out_len, &err);
            if ((st == ELLM_OK) != (out != NULL)) ok = 0;
            free(out);
            free(copy);
            prefixes++;
        }
        free(tpl);
    }
    closedir(d);
    CHECK(files > 0 && ok, "truncated templates: %d files, status/output mismatch", files);
    printf("truncated: %zu prefixes of %d templates\n", prefixes, files);
}

/* ---- tool calling ---------------------------------------------------- */

/* tests/data/chat/tools/cases.json (tools/render_chat_tools_expected.mjs):
 * templates that handle tools, rendered with a tools array and conversations
 * holding tool calls and tool turns; every rendering byte for byte, the
 * template's raise_exception messages and errors as there. Messages go in
 * as a server passes them: tool_calls as JSON text, arguments as strings. */
static void test_tools(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/chat/tools/cases.json", test_data_dir());
    size_t n;
    char *text = test_read_file(path, &n);
    cJSON *j = text ? cJSON_ParseWithLength(text, n) : NULL;
    free(text);
    CHECK(j != NULL, "cannot read %s", path);
    if (!j) return;
    char *tools = cJSON_PrintUnformatted(cJSON_GetObjectItem(j, "tools"));
    const cJSON *tool_convs = cJSON_GetObjectItem(j, "conversations"), *tpl;
    int cases = 0;
    cJSON_ArrayForEach(tpl, cJSON_GetObjectItem(j, "templates")) {
        snprintf(path, sizeof path, "%s/chat/%s.jinja", test_data_dir(), tpl->string);
        size_t src_len;
        char *src = test_read_file(path, &src_len);
        CHECK(src != NULL, "cannot read %s", path);
        const char *bos = cJSON_GetObjectItem(tpl, "bos")->valuestring, *eos = cJSON_GetObjectItem(tpl, "eos")->valuestring;
        const cJSON *cs;
        cJSON_ArrayForEach(cs, cJSON_GetObjectItem(tpl, "cases")) {
            const char *conv = cJSON_GetObjectItem(cs, "conversation")->valuestring;
            const char *kind = cJSON_GetObjectItem(cs, "kind")->valuestring;
            const char *want = cJSON_GetObjectItem(cs, "text")->valuestring;
            const int agp = cJSON_IsTrue(cJSON_GetObjectItem(cs, "add_generation_prompt"));
            const cJSON *msgs = cJSON_GetObjectItem(tool_convs, conv), *m;
            chat_message cm[8];
            char *calls[8] = {0};
            int nm = 0;
            cJSON_ArrayForEach(m, msgs) {
                if (nm == 8) break;
                const cJSON *content = cJSON_GetObjectItem(m, "content"), *tc = cJSON_GetObjectItem(m, "tool_calls");
                const cJSON *id = cJSON_GetObjectItem(m, "tool_call_id"), *name = cJSON_GetObjectItem(m, "name");
                calls[nm] = tc ? cJSON_PrintUnformatted(tc) : NULL;
                cm[nm] = (chat_message){.role = cJSON_GetObjectItem(m, "role")->valuestring,
                                        .content = cJSON_IsString(content) ? content->valuestring : NULL,
                                        .tool_calls = calls[nm],
                                        .tool_call_id = cJSON_IsString(id) ? id->valuestring : NULL,
                                        .name = cJSON_IsString(name) ? name->valuestring : NULL};
                nm++;
            }
            chat_template_params p = {.messages = cm, .n_messages = nm, .add_generation_prompt = agp,
                                      .bos_token = bos, .eos_token = eos, .now = FIXED_NOW, .tools = tools};
            char *out = NULL;
            size_t out_len = 0;
            ellm_error err = {0};
            ellm_status st = src ? chat_template_render_ex(src, src_len, &p, &out, &out_len, &err) : ELLM_ERR_IO;
            cases++;
            if (!strcmp(kind, "ok")) {
                int same = st == ELLM_OK && out_len == strlen(want) && memcmp(out, want, out_len) == 0;
                CHECK(same, "tools: %s / %s / agp=%d: %s", tpl->string, conv, agp,
                      st == ELLM_OK ? "rendering differs" : err.msg);
                if (!same && st == ELLM_OK) report_diff(tpl->string, want, strlen(want), out, out_len);
            } else if (!strcmp(kind, "raise")) {
                CHECK(st == ELLM_ERR_ARG && strstr(err.msg, want), "tools: %s / %s / agp=%d: want raise '%s', got %s",
                      tpl->string, conv, agp, want, st == ELLM_OK ? out : err.msg);
            } else {
                CHECK(st != ELLM_OK, "tools: %s / %s / agp=%d: want an error like '%s', got success", tpl->string,
                      conv, agp, want);
            }
            free(out);
            for (int i = 0; i < nm; i++) cJSON_free(calls[i]);
        }
        free(src);
    }
    CHECK(cases >= 40, "tools: only %d cases in cases.json", cases);
    printf("tools: %d renderings with tool calls compared\n", cases);

    /* malformed JSON is a clear error, not a crash or a silent None */
    const char *tpl_src = "{{ tools | tojson }}|{{ messages[0].tool_calls[0].function.arguments.x }}";
    chat_message bad = {.role = "assistant", .content = "", .tool_calls = "[{\"function\": {\"arguments\": \"{\\\"x\\\": 7}\"}}]"};
    chat_template_params p = {.messages = &bad, .n_messages = 1, .tools = "[{\"a\": [1, 2.5, true, null]}]"};
    char *out = NULL;
    size_t out_len = 0;
    ellm_error err = {0};
    ellm_status st = chat_template_render_ex(tpl_src, strlen(tpl_src), &p, &out, &out_len, &err);
    CHECK(st == ELLM_OK && out && !strcmp(out, "[{\"a\": [1, 2.5, true, null]}]|7"), "tools and arguments as values: %s",
          st == ELLM_OK ? out : err.msg);
    free(out);
    p.tools = "{\"not\": \"a list\"}";
    st = chat_template_render_ex(tpl_src, strlen(tpl_src), &p, &out, &out_len, &err);
    CHECK(st == ELLM_ERR_ARG && strstr(err.msg, "tools is not a JSON array"), "tools not a list: %s", err.msg);
    p.tools = NULL;
    bad.tool_calls = "[{\"function\": ";
    st = chat_template_render_ex(tpl_src, strlen(tpl_src), &p, &out, &out_len, &err);
    CHECK(st == ELLM_ERR_ARG && strstr(err.msg, "tool_calls is not a JSON array"), "truncated tool_calls: %s", err.msg);
    cJSON_free(tools);
    cJSON_Delete(j);
}

int main(void) {
    CHECK(load_conversations() == 0, "cannot load %s/chat/conversations.txt", test_data_dir());
    if (n_convs == 0) return test_finish();
    test_golden();
    test_builtins();
    test_gguf();
    test_features();
    test_errors();
    test_truncated();
    test_tools();
    return test_finish();
}
