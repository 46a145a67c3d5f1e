/* Unit tests of the Jinja2 interpreter (jinja.h) and of the chat templates built on it (chat_template.h).
 * The table's expected outputs were rendered by Python's jinja2 3.1.6 in the environment apply_chat_template uses
 * (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, HF's tojson and raise_exception); the
 * error cases give the message with the template's line. Known difference: tuples are lists ((1, 2) prints as
 * [1, 2], items() as [[k, v]]). Real templates: tests/goldens/tokenizer/template-*.json. */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "chat_template.h"
#include "jinja.h"
#include "tests/test.h"

static const struct jcase { const char *name, *tpl, *vars, *want; } cases[] = {
    {"trim_lstrip_blocks",
     "<ul>\n  {% for x in xs %}\n    <li>{{ x }}</li>\n  {% endfor %}\n</ul>\n",
     "{\"xs\": [1, 2]}",
     "<ul>\n    <li>1</li>\n    <li>2</li>\n</ul>"},
    {"minus_strips",
     "a  \n {%- if true -%} \n b \n {%- endif -%}  \n c",
     "{}",
     "abc"},
    {"plus_keeps_lstrip",
     "x\n  {%+ if true %}y{% endif %}\n",
     "{}",
     "x\n  y"},
    {"var_tags_not_trimmed",
     "a\n  {{ 'b' }}\nc {{- ' d ' -}} \n e",
     "{}",
     "a\n  b\nc d e"},
    {"comments",
     "a {# note #}\n  {#- strip -#}  b\n{# line #}\nc",
     "{}",
     "a b\nc"},
    {"raw",
     "{% raw %}{{ not rendered }}{% endraw %}",
     "{}",
     "{{ not rendered }}"},
    {"generation_tag",
     "{% generation %}gen {{ 1 }}{% endgeneration %}",
     "{}",
     "gen 1"},
    {"trailing_newline_dropped_once",
     "x\n\n",
     "{}",
     "x\n"},
    {"if_elif_else",
     "{% for n in [1, 2, 3] %}{% if n == 1 %}one{% elif n == 2 %}two{% else %}many{% endif %};{% endfor %}",
     "{}",
     "one;two;many;"},
    {"loop_vars",
     "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "{}",
     "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"loop_prev_next",
     "{% for x in [1, 2, 3] %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}",
     "{}",
     "[<1>2][1<2>3][2<3>]"},
    {"loop_cycle",
     "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}",
     "{}",
     "ababa"},
    {"for_else_and_filter",
     "{% for x in xs if x > 1 %}{{ x }}:{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
     "{\"xs\": [1, 2, 3]}",
     "2:2 3:2 |empty"},
    {"for_unpack_items",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }}{% endfor %}",
     "{\"d\": {\"b\": 1, \"a\": [2]}}",
     "b=1;a=[2];ba"},
    {"break_continue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "{}",
     "0134"},
    {"loop_scope",
     "{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}({{ x }}){% endfor %}{{ x }}",
     "{}",
     "[0](1)[0](2)0"},
    {"if_no_scope",
     "{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
     "{}",
     "5"},
    {"namespace",
     "{% set ns = namespace(n=0, s='') %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}",
     "{}",
     "6 123"},
    {"set_tuple_and_block",
     "{% set a, b = 1, 'two' %}{{ a }}{{ b }}{% set blk %}<{{ a + 1 }}>{% endset %}{{ blk }}{{ blk|length }}",
     "{}",
     "1two<2>3"},
    {"macro",
     "{% macro m(a, b=2, c='c') %}{{ a }}-{{ b }}-{{ c }}-{{ g }}{% endmacro %}{% set g = 9 %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='z') }}",
     "{}",
     "1-2-c-9 1-3-c-9 1-2-z-9"},
    {"nested_loops",
     "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}/{% endfor %}{{ loop.index }};{% endfor %}",
     "{}",
     "1x1/1y2/1;2x1/2y2/2;"},
    {"arith",
     "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 3 / 2 }} {{ 4 / 2 }} {{ 1.5 + 1 }} {{ -3 }} {{ 10 - 2 - 3 }}",
     "{}",
     "7 9 3 -4 1 2 1024 1.5 2.0 2.5 -3 5"},
    {"concat_compare",
     "{{ 'a' ~ 1 ~ none ~ true }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ 1 < 2 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 'x' != 'y' }} {{ 2 >= 2 }}",
     "{}",
     "a1NoneTrue ab [1, 2] True True True True True"},
    {"in_not_in",
     "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ not true }}",
     "{\"d\": {\"k\": 1}}",
     "True True True True False"},
    {"and_or_values",
     "{{ 0 or 'x' }} {{ '' and 'y' }} {{ 'a' and 'b' }} {{ none or [] }}|{{ x or 'default' }}",
     "{}",
     "x  b []|default"},
    {"conditional",
     "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}]",
     "{}",
     "y n []"},
    {"precedence_filters",
     "{{ xs|length - 1 }} {{ -2|abs }} {{ 'a' ~ xs|join(',') ~ 'b' }} {{ not xs|length }}",
     "{\"xs\": [1, 2, 3]}",
     "2 2 a1,2,3b False"},
    {"literals_repr",
     "{{ [1, 'a', none, true, 1.0, {'k': 'v'}] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2)|length }} {{ none }} {{ 1e20 }} {{ 0.1 }} {{ 1e-5 }} {{ 123456789012345678.0 }} {{ 2.5e15 }}",
     "{}",
     "[1, 'a', None, True, 1.0, {'k': 'v'}] {'a': 1, 'b': [2]} 2 None 1e+20 0.1 1e-05 1.2345678901234568e+17 2500000000000000.0"},
    {"string_escapes",
     "{{ 'a\\nb\\t\"c\"\\\\' }}|{{ \"it's\" }}|{{ ['it\\'s', 'x\"y', 'n\\n'] }}|{{ '\\u00e9\\x41' }}",
     "{}",
     "a\nb\t\"c\"\\|it's|[\"it's\", 'x\"y', 'n\\n']|\303\251A"},
    {"subscripts",
     "{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ xs[-2:] }}{{ d['k'] }}{{ d.k }}{{ s[1:3] }}{{ s[::-1] }}{{ s[-1] }}[{{ xs[10] }}]",
     "{\"xs\": [1, 2, 3, 4], \"d\": {\"k\": \"v\"}, \"s\": \"h\303\251llo\"}",
     "14[2, 3, 4][1, 2, 3][4, 3, 2, 1][1, 3][3, 4]vv\303\251loll\303\251ho[]"},
    {"undefined_prints_empty",
     "[{{ missing }}][{{ d.nope }}][{{ missing|default('dflt') }}][{{ ''|default('e', true) }}][{{ missing|length }}]",
     "{\"d\": {}}",
     "[][][dflt][e][0]"},
    {"tests",
     "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ xs is sequence }}{{ s is sequence }}{{ 1 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ t is boolean }}{{ t is true }}{{ f is false }}{{ 1 is false }}{{ xs is iterable }}",
     "{\"x\": 1, \"n\": null, \"s\": \"s\", \"d\": {}, \"xs\": [], \"t\": true, \"f\": false}",
     "TrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrue"},
    {"tests_args",
     "{{ 6 is divisibleby 3 }}{{ 6 is divisibleby(4) }}{{ 3 is odd }}{{ 3 is even }}{{ 'a' is eq 'a' }}{{ 1 is equalto(2) }}{{ 'a' is in 'abc' }}{{ x is not none }}{{ 'abc' is lower }}",
     "{\"x\": 1}",
     "TrueFalseTrueFalseTrueFalseTrueTrueTrue"},
    {"trim_filters",
     "[{{ '  a b \\n'|trim }}][{{ 'xxaxx'|trim('x') }}][{{ 'Hello World'|upper }}][{{ '\303\200B'|lower }}][{{ 'hello world'|capitalize }}][{{ 'hello world'|title }}]",
     "{}",
     "[a b][a][HELLO WORLD][\303\240b][Hello world][Hello World]"},
    {"replace_join",
     "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ [1, 2, 3]|join('-') }} {{ ['x', 'y']|join }} {{ users|join(', ', attribute='name') }}",
     "{\"users\": [{\"name\": \"a\"}, {\"name\": \"b\"}]}",
     "bbb bba 1-2-3 xy a, b"},
    {"tojson_hf",
     "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ '\303\251\\n\"'|tojson }}|{{ [1.5, 2, none, true, 1e-7]|tojson }}|{{ {}|tojson }}{{ []|tojson(indent=4) }}|{{ d|tojson(sort_keys=true) }}",
     "{\"d\": {\"name\": \"\345\220\215\345\211\215\", \"b\": [1, {\"c\": null}], \"a\": 0.1}}",
     "{\"name\": \"\345\220\215\345\211\215\", \"b\": [1, {\"c\": null}], \"a\": 0.1}|{\n  \"name\": \"\345\220\215\345\211\215\",\n  \"b\": [\n    1,\n    {\n      \"c\": null\n    }\n  ],\n  \"a\": 0.1\n}|\"\303\251\\n\\\"\"|[1.5, 2, null, true, 1e-07]|{}[]|{\"a\": 0.1, \"b\": [1, {\"c\": null}], \"name\": \"\345\220\215\345\211\215\"}"},
    {"length_first_last_list",
     "{{ 'h\303\251'|length }} {{ [1, 2]|length }} {{ {'a': 1}|length }} {{ [3, 4]|first }} {{ [3, 4]|last }} {{ 'ab'|list }} {{ 'xy'|first }} {{ {'k': 1}|list }}",
     "{}",
     "2 2 1 3 4 ['a', 'b'] x ['k']"},
    {"number_filters",
     "{{ '42'|int }} {{ 'x'|int }} {{ 3.7|int }} {{ '1.5'|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3|string }}{{ 'a'|string }}",
     "{}",
     "42 0 3 1.5 3 2.57 2.0 3a"},
    {"map_select",
     "{{ users|map(attribute='name')|list }} {{ users|selectattr('admin')|map(attribute='name')|join }} {{ users|rejectattr('admin')|list|length }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|reject('equalto', 2)|list }} {{ users|selectattr('name', 'equalto', 'b')|list|length }} {{ ['a', 'b']|map('upper')|list }}",
     "{\"users\": [{\"name\": \"a\", \"admin\": true}, {\"name\": \"b\", \"admin\": false}]}",
     "['a', 'b'] a 1 [1, 3] [1, 3] 1 ['A', 'B']"},
    {"sort_reverse_unique",
     "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse }} {{ [1, 2, 1, 3]|unique|list }} {{ {'b': 1, 'a': 2}|dictsort|map('first')|list }} {{ users|sort(attribute='n')|map(attribute='n')|list }}",
     "{\"users\": [{\"n\": 2}, {\"n\": 1}]}",
     "[1, 2, 3] [3, 2, 1] ['A', 'b', 'c'] [3, 2, 1] cba [1, 2, 3] ['a', 'b'] [1, 2]"},
    {"sum_min_max",
     "{{ [1, 2, 3]|sum }} {{ [1, 2, 3]|min }} {{ [1, 2, 3]|max }} {{ users|sum(attribute='n') }}",
     "{\"users\": [{\"n\": 2}, {\"n\": 5}]}",
     "6 1 3 7"},
    {"indent_wordcount",
     "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'one two  three'|wordcount }}",
     "{}",
     "a\n  b\n\n  c|  a\n  b|3"},
    {"str_methods",
     "[{{ '  x  '.strip() }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}][{{ 'x\\n\\n'.rstrip() }}][{{ 'a,b,,c'.split(',') }}][{{ ' a  b '.split() }}][{{ 'a,b,c'.split(',', 1) }}][{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}][{{ 'abc'.upper() }}][{{ 'aXbX'.replace('X', '-') }}][{{ 'hello'.find('l') }}][{{ 'hello'.count('l') }}][{{ '-'.join(['a', 'b']) }}][{{ 'ab'.title() }}]",
     "{}",
     "[x][x\n][x][['a', 'b', '', 'c']][['a', 'b']][['a', 'b,c']][TrueTrue][ABC][a-b-][2][2][a-b][Ab]"},
    {"dict_methods",
     "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|map('last')|list }} {{ d.get('a') }} {{ d.get('z', 'dz') }} {{ d.get('z') }}",
     "{\"d\": {\"a\": 1, \"b\": 2}}",
     "['a', 'b'] [1, 2] [1, 2] 1 dz None"},
    {"think_split",
     "{% set c = m.split('</think>')[-1].lstrip('\\n') %}{% set r = m.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}[{{ r }}][{{ c }}]",
     "{\"m\": \"<think>\\nwhy\\n</think>\\n\\nanswer\"}",
     "[why][answer]"},
    {"message_attrs",
     "{% for m in messages %}{{ m.role }}:{{ m['content'] }}{% if m.tool_calls is defined %}+{{ m.tool_calls|length }}{% endif %};{% endfor %}",
     "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"name\": \"f\"}]}]}",
     "user:hi;assistant:+1;"},
    {"strings_adjacent_and_unicode",
     "{{ 'a' 'b' }}|{{ '\346\227\245\346\234\254'|length }}|{{ '\346\227\245\346\234\254\350\252\236'[1] }}|{{ '\303\261'|upper }}",
     "{}",
     "ab|2|\346\234\254|\303\221"},
    {"range_dict",
     "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1, b='x') }}",
     "{}",
     "[0, 1, 2] [1, 3, 5] [3, 2, 1] {'a': 1, 'b': 'x'}"},
};

static const struct jcase errors[] = {
    {"raise_exception_line", "line one\n{% if true %}\n{{ raise_exception('Roles must alternate') }}\n{% endif %}", "{}", "tpl:3: Roles must alternate"},
    {"undefined_attribute", "{{ a }}\n{{ a.b.c }}", "{}", "tpl:2: 'a' is undefined"},
    {"unknown_filter", "x\n\n{{ 1|nosuchfilter }}", "{}", "tpl:3: no filter named 'nosuchfilter'"},
    {"unknown_test", "{% if x is nosuch %}{% endif %}", "{}", "tpl:1: no test named 'nosuch'"},
    {"unclosed_if", "a\n{% if true %}\nb", "{}", "tpl:2: 'endif' expected"},
    {"stray_endfor", "a\n\n{% endfor %}", "{}", "tpl:3: unexpected 'endfor'"},
    {"unclosed_tag", "ok\n{{ 1 + ", "{}", "tpl:2: unexpected end of template"},
    {"bad_char", "{{ 1 ? 2 }}", "{}", "tpl:1: unexpected character '?'"},
    {"add_str_int", "\n{{ 'a' + 1 }}", "{}", "tpl:2: unsupported operand type(s) for +: 'str' and 'int'"},
    {"ns_set_on_dict", "{% set d = {} %}\n{% set d.x = 1 %}", "{}", "tpl:2: cannot assign attribute on non-namespace object 'd'"},
    {"not_iterable", "{% for x in 5 %}{% endfor %}", "{}", "tpl:1: 'int' object is not iterable"},
    {"unsupported_include", "{% include 'x' %}", "{}", "tpl:1: unknown or unsupported statement 'include'"},
};

/* render tpl with vars (JSON); *out malloc'd or NULL; returns the jinja_parse/render result */
static int render(const char *tpl, const char *vars, char **out, errbuf *err)
{
    jinja_template *t;
    *out = NULL;
    int ret = jinja_parse(&t, tpl, strlen(tpl), "tpl", &jinja_hf_opts, err);
    if (ret) return ret;
    json_t *v = json_loads(vars, 0, NULL);
    size_t len;
    ret = jinja_render(t, v, out, &len, err);
    if (!ret && strlen(*out) != len) ret = -1000;
    json_decref(v);
    jinja_destroy(&t);
    return ret;
}

TEST(jinja_renders_as_python_jinja2)
{
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *out;
        errbuf err = {{0}};
        int ret = render(cases[i].tpl, cases[i].vars, &out, &err);
        if (ret || strcmp(out, cases[i].want)) {
            fprintf(stderr, "  case %s: %s\n    got  \"%s\"\n    want \"%s\"\n", cases[i].name, ret ? err.msg : "differs",
                    out ? out : "", cases[i].want);
            test_failed_here = 1;
        }
        free(out);
    }
}

TEST(jinja_errors_name_the_line)
{
    for (size_t i = 0; i < sizeof errors / sizeof *errors; i++) {
        char *out;
        errbuf err = {{0}};
        int ret = render(errors[i].tpl, errors[i].vars, &out, &err);
        if (ret != -EINVAL || !strstr(err.msg, errors[i].want)) {
            fprintf(stderr, "  case %s: got %d \"%s\", want -EINVAL \"%s\"\n", errors[i].name, ret, err.msg, errors[i].want);
            test_failed_here = 1;
        }
        EXPECT(out == NULL);
        free(out);
    }
}

TEST(jinja_without_trim_options)
{
    const struct jinja_opts plain = {0};
    jinja_template *t;
    errbuf err;
    const char *src = "a\n  {% if true %}\nb\n  {% endif %}\n";
    REQUIRE(jinja_parse(&t, src, strlen(src), "plain", &plain, &err) == 0);
    char *out;
    json_t *v = json_object();
    REQUIRE(jinja_render(t, v, &out, NULL, &err) == 0);
    EXPECT(strcmp(out, "a\n  \nb\n  ") == 0);
    free(out);
    json_decref(v);
    jinja_destroy(&t);
}

TEST(jinja_strftime_now)
{
    char *out;
    errbuf err;
    REQUIRE(render("{{ strftime_now('%Y') }}", "{}", &out, &err) == 0);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    EXPECT(atoi(out) == tm.tm_year + 1900 || atoi(out) == tm.tm_year + 1899);
    free(out);
}

/* a model folder with a ChatML template that thinks like Qwen3 and renders tools */
static const char *CHATML =
    "{%- if tools %}{{- '<|im_start|>system\\nTools: ' + tools|map(attribute='name')|join(', ') + '<|im_end|>\\n' }}{%- endif %}\n"
    "{%- for m in messages %}\n"
    "  {%- if m.role == 'assistant' %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if loop.last and m.reasoning_content is defined %}{{- '<think>' + m.reasoning_content + '</think>' }}{%- endif %}\n"
    "    {{- m.content + '<|im_end|>\\n' }}\n"
    "  {%- else %}\n"
    "    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}\n"
    "  {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is false %}{{- '<think></think>' }}{%- endif %}{%- endif %}\n";

static char *model_dir(const char *tpl, bool as_jinja_file)
{
    char *dir = test_tmpdir(), p[512];
    json_t *cfg = json_pack("{ss}", "eos_token", "<|im_end|>");
    if (!as_jinja_file) json_object_set_new(cfg, "chat_template", json_string(tpl));
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    REQUIRE(json_dump_file(cfg, p, 0) == 0);
    json_decref(cfg);
    if (as_jinja_file) {
        snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
        test_write_file(p, tpl, strlen(tpl));
    }
    return dir;
}

static const char *span_text(const chat_text *t, size_t k, char *buf, size_t n)
{
    snprintf(buf, n, "%.*s", (int)(t->spans[k].end - t->spans[k].start), t->text + t->spans[k].start);
    return buf;
}

TEST(chat_template_spans_follow_the_served_prompt)
{
    char *dir = model_dir(CHATML, false), b[256];
    chat_template *t;
    errbuf err;
    REQUIRE(chat_template_load(&t, dir, NULL, &err) == 0);
    EXPECT(strcmp(chat_template_eot(t), "<|im_end|>") == 0);
    EXPECT_CONTAINS(chat_template_source(t), "tokenizer_config.json");
    json_t *msgs = json_loads("[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"q1\"},"
                              " {\"role\": \"assistant\", \"content\": \"a1\"}, {\"role\": \"user\", \"content\": \"q2\"},"
                              " {\"role\": \"assistant\", \"content\": \"a2\", \"reasoning_content\": \"r\"}]", 0, NULL);
    chat_text ct = {0};
    /* thinking on: the think block is generated, so trained */
    REQUIRE(chat_template_render(t, msgs, NULL, &ct, &err) == 0);
    REQUIRE(ct.n_spans == 2);
    EXPECT(strcmp(span_text(&ct, 0, b, sizeof b), "a1<|im_end|>") == 0);
    EXPECT(strcmp(span_text(&ct, 1, b, sizeof b), "<think>r</think>a2<|im_end|>") == 0);
    /* thinking off: the prompt holds "<think></think>" and the rendering leaves it at "r" */
    REQUIRE(chat_template_set_arg(t, "enable_thinking=false", &err) == 0);
    REQUIRE(chat_template_render(t, msgs, NULL, &ct, &err) == 0);
    EXPECT(strcmp(span_text(&ct, 1, b, sizeof b), "r</think>a2<|im_end|>") == 0);
    /* tools reach the template */
    json_t *tools = json_loads("[{\"name\": \"f\"}, {\"name\": \"g\"}]", 0, NULL);
    REQUIRE(chat_template_render(t, msgs, tools, &ct, &err) == 0);
    EXPECT(strncmp(ct.text, "<|im_start|>system\nTools: f, g<|im_end|>\n", 40) == 0);
    EXPECT(strcmp(span_text(&ct, 0, b, sizeof b), "a1<|im_end|>") == 0);
    /* the mask: tokens wholly inside a span */
    uint32_t s[3] = {0, (uint32_t)ct.spans[0].start, (uint32_t)ct.spans[0].end - 1};
    uint32_t e[3] = {5, (uint32_t)ct.spans[0].start + 2, (uint32_t)ct.spans[0].end + 1};
    uint8_t m[3];
    chat_text_mask(&ct, s, e, 3, m);
    EXPECT(m[0] == 0 && m[1] == 1 && m[2] == 0);
    json_decref(tools);
    json_decref(msgs);
    chat_text_free(&ct);
    chat_template_destroy(&t);
}

TEST(chat_template_sources_and_errors)
{
    errbuf err;
    chat_template *t;
    /* chat_template.jinja wins over tokenizer_config.json */
    char *dir = model_dir(CHATML, true);
    REQUIRE(chat_template_load(&t, dir, NULL, &err) == 0);
    EXPECT_CONTAINS(chat_template_source(t), "chat_template.jinja");
    EXPECT(chat_template_set_arg(t, "novalue", &err) == -EINVAL);
    EXPECT(chat_template_set_arg(t, "flag=not json", &err) == 0); /* a string */
    chat_template_destroy(&t);
    /* a template error names the file and line; a conversation that breaks it names the message */
    const char *bad = "{% for m in messages %}\n{{ m.content }}\n{% if m.role == 'robot' %}{{ raise_exception('no robots') }}{% endif %}<|end|>\n{% endfor %}";
    char *d2 = model_dir(bad, false), p[600];
    REQUIRE(chat_template_load(&t, d2, NULL, &err) == 0);
    EXPECT(strcmp(chat_template_eot(t), "<|end|>") == 0);
    json_t *msgs = json_loads("[{\"role\": \"robot\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"y\"}]", 0, NULL);
    chat_text ct = {0};
    EXPECT(chat_template_render(t, msgs, NULL, &ct, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "tokenizer_config.json chat_template:3: no robots");
    json_decref(msgs);
    chat_text_free(&ct);
    chat_template_destroy(&t);
    /* no template at all, and a template without an end-of-turn token */
    char *d3 = test_tmpdir();
    EXPECT(chat_template_load(&t, d3, NULL, &err) == -ENOENT);
    EXPECT_CONTAINS(err.msg, "chat_template.jinja");
    snprintf(p, sizeof p, "%s/plain.jinja", d3);
    const char *plain = "{% for m in messages %}{{ m.content }}\n{% endfor %}";
    test_write_file(p, plain, strlen(plain));
    EXPECT(chat_template_load(&t, d3, p, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "no end-of-turn token");
    snprintf(p, sizeof p, "%s/syntax.jinja", d3);
    test_write_file(p, "ok\n{% if x %}\n", 14);
    EXPECT(chat_template_load(&t, d3, p, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "syntax.jinja:2: 'endif' expected");
}

TEST_MAIN
