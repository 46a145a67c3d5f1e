/* libFuzzer target: the input is a chat template; jinja_parse and jinja_render (with a conversation, tools and
 * HF's variables) must accept or reject it with an error naming the template and a line, and never crash; an
 * accepted one renders the same text twice (a parsed template is read-only). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *VARS =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi \\u00e9\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>r</think>a\", \"tool_calls\": [{\"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1.5}}}]}, {\"role\": \"tool\", \"content\": \"5\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"enable_thinking\": false}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (!vars && !(vars = json_loads(VARS, 0, NULL))) abort();
    jinja_template *t;
    errbuf err;
    if (jinja_parse(&t, (const char *)data, size, "fuzz", &jinja_hf_opts, &err)) {
        if (strncmp(err.msg, "fuzz:", 5)) abort(); /* every error names the template and line */
        return 0;
    }
    char *a = NULL, *b = NULL;
    size_t na, nb;
    int ra = jinja_render(t, vars, &a, &na, &err);
    if (ra && strncmp(err.msg, "fuzz:", 5)) abort();
    int rb = jinja_render(t, vars, &b, &nb, &err);
    /* strftime_now may differ between the two renderings; everything else must not */
    if (ra != rb || (!ra && !memmem(data, size, "strftime", 8) && (na != nb || memcmp(a, b, na)))) abort();
    if (!ra && strlen(a) > na) abort();
    free(a);
    free(b);
    jinja_destroy(&t);
    return 0;
}
