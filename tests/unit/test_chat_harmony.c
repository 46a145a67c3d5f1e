/* Unit tests of the harmony chat format (common/formats/harmony.jinja, gpt-oss's) against its specification's own
 * examples (github.com/openai/harmony v0.0.8): the expected renderings are the files of its test-data/ named in
 * each row (read with .rstrip() as its tests do) and the examples of docs/format.md, the conversations those tests
 * build (src/tests.rs) in the message form dflash-prepare --chat takes. Also the {% generation %} spans of jinja.h
 * that give harmony's trained spans. The real tokenizer and Hugging Face's renderings:
 * tests/goldens/tokenizer/gptoss.json, template-gptoss.json. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "jinja.h"
#include "tests/test.h"

/* A model folder whose tokenizer_config.json has gpt-oss's <|channel|> token and no chat template. */
static char *gptoss_dir(void)
{
    char *dir = test_tmpdir(), path[300];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    const char *cfg = "{\"added_tokens_decoder\": {\"200005\": {\"content\": \"<|channel|>\", \"special\": true}},"
                      " \"bos_token\": \"<|startoftext|>\", \"eos_token\": \"<|return|>\"}";
    test_write_file(path, cfg, strlen(cfg));
    return dir;
}

static void rm_dir(char *dir)
{
    char path[300];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    unlink(path);
    rmdir(dir);
}

static chat_template *load_with(const char *dir, const char *template_file, const char *args)
{
    chat_template *t;
    errbuf err;
    int rc = chat_template_load(&t, dir, template_file, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    json_t *a = json_loads(args, 0, NULL);
    REQUIRE(a);
    const char *k; json_t *v;
    json_object_foreach(a, k, v) {
        char *val = json_dumps(v, JSON_ENCODE_ANY), kv[512];
        snprintf(kv, sizeof kv, "%s=%s", k, val);
        free(val);
        rc = chat_template_set_arg(t, kv, &err);
        if (rc) fprintf(stderr, "  %s\n", err.msg);
        REQUIRE(rc == 0);
    }
    json_decref(a);
    return t;
}

/* The pieces the specification's renderings share. SYSTEM: harmony's system message (DATES: its knowledge cutoff and
 * current date lines; EFFORT: its reasoning effort; CHANNELS: the valid channels; MORE: what follows the channels
 * line). DEVELOPER: the developer message of a system or developer instruction. FUNCTIONS: the namespace of a tool
 * list in the developer message; WEATHER_FNS the three weather functions of src/tests.rs as rendered and as JSON. */
#define SYSTEM(DATES, EFFORT, CHANNELS, MORE)                                                                         \
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" DATES "\n"                \
    "Reasoning: " EFFORT "\n\n# Valid channels: " CHANNELS ". Channel must be included for every message." MORE        \
    "<|end|>"
#define CUTOFF "Knowledge cutoff: 2024-06\n"
#define ALL_CHANNELS "analysis, commentary, final"
#define TOOLS_LINE "\nCalls to these tools must go to the commentary channel: 'functions'."
#define DEVELOPER(TEXT) "<|start|>developer<|message|># Instructions\n\n" TEXT "<|end|>"
#define USER(TEXT) "<|start|>user<|message|>" TEXT "<|end|>"
#define NEXT "<|start|>assistant"
#define FUNCTIONS(FNS) "# Tools\n\n## functions\n\nnamespace functions {\n\n" FNS "} // namespace functions"
#define MSG(ROLE, TEXT) "{\"role\": \"" ROLE "\", \"content\": \"" TEXT "\"}"
#define ROBOT "Answer the user's questions like a robot."
#define CAPITAL "What is the capital of the largest country in the world?"
#define SF "What is the weather like in SF?"
#define CANDY "What is the best place to eat candy in the world?"
#define WEATHER_FNS                                                                                                   \
    "// Gets the location of the user.\n"                                                                              \
    "type get_location = () => any;\n"                                                                                 \
    "\n"                                                                                                               \
    "// Gets the current weather in the provided location.\n"                                                          \
    "type get_current_weather = (_: {\n"                                                                               \
    "// The city and state, e.g. San Francisco, CA\n"                                                                  \
    "location: string,\n"                                                                                              \
    "format?: \"celsius\" | \"fahrenheit\", // default: celsius\n"                                                     \
    "}) => any;\n"                                                                                                     \
    "\n"                                                                                                               \
    "// Gets the current weather in the provided list of locations.\n"                                                 \
    "type get_multiple_weathers = (_: {\n"                                                                             \
    "// List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]\n"                                      \
    "locations: string[],\n"                                                                                           \
    "format?: \"celsius\" | \"fahrenheit\", // default: celsius\n"                                                     \
    "}) => any;\n"                                                                                                     \
    "\n"
#define WEATHER_FNS_JSON "{\"type\": \"function\", \"function\": {\"name\": \"get_location\", \"description\": \"Gets the location of the user.\"}}, {\"type\": \"function\", \"function\": {\"name\": \"get_current_weather\", \"description\": \"Gets the current weather in the provided location.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"The city and state, e.g. San Francisco, CA\"}, \"format\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"}}, \"required\": [\"location\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"get_multiple_weathers\", \"description\": \"Gets the current weather in the provided list of locations.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"locations\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"description\": \"List of city and state, e.g. [\\\"San Francisco, CA\\\", \\\"New York, NY\\\"]\"}, \"format\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"default\": \"celsius\"}}, \"required\": [\"locations\"]}}}"

/* test-data file, messages, template arguments, its text, tools (JSON, or NULL): prompts for the next assistant turn */
static const struct spec_case { const char *file, *messages, *args, *want, *tools; } spec[] = {
    {"test_simple_convo.txt", "[" MSG("user", "What is 2 + 2?") "]", "{}",
     SYSTEM(CUTOFF, "medium", ALL_CHANNELS, "") USER("What is 2 + 2?") NEXT, NULL},
    {"test_simple_convo_low_effort.txt", "[" MSG("developer", ROBOT) ", " MSG("user", CAPITAL) "]",
     "{\"reasoning_effort\": \"low\"}",
     SYSTEM(CUTOFF, "low", ALL_CHANNELS, "") DEVELOPER(ROBOT) USER(CAPITAL) NEXT, NULL},
    {"test_simple_convo_medium_effort.txt", "[" MSG("system", ROBOT) ", " MSG("user", CAPITAL) "]",
     "{\"reasoning_effort\": \"medium\"}",
     SYSTEM(CUTOFF, "medium", ALL_CHANNELS, "") DEVELOPER(ROBOT) USER(CAPITAL) NEXT, NULL},
    {"test_simple_convo_high_effort.txt", "[" MSG("developer", ROBOT) ", " MSG("user", CAPITAL) "]",
     "{\"reasoning_effort\": \"high\"}",
     SYSTEM(CUTOFF, "high", ALL_CHANNELS, "") DEVELOPER(ROBOT) USER(CAPITAL) NEXT, NULL},
    {"test_simple_convo_low_effort_no_instruction.txt", "[" MSG("user", CAPITAL) "]",
     "{\"reasoning_effort\": \"low\"}",
     SYSTEM(CUTOFF, "low", ALL_CHANNELS, "") USER(CAPITAL) NEXT, NULL},
    {"test_simple_convo_medium_effort_no_instruction.txt", "[" MSG("user", CAPITAL) "]", "{}",
     SYSTEM(CUTOFF, "medium", ALL_CHANNELS, "") USER(CAPITAL) NEXT, NULL},
    {"test_simple_convo_high_effort_no_instruction.txt", "[" MSG("user", CAPITAL) "]",
     "{\"reasoning_effort\": \"high\"}",
     SYSTEM(CUTOFF, "high", ALL_CHANNELS, "") USER(CAPITAL) NEXT, NULL},
    {"test_reasoning_system_message.txt", "[" MSG("user", "What is 2 + 2?") "]",
     "{\"valid_channels\": [\"analysis\", \"final\"]}",
     SYSTEM(CUTOFF, "medium", "analysis, final", "") USER("What is 2 + 2?") NEXT, NULL},
    {"test_reasoning_system_message_no_instruction.txt", "[" MSG("user", CANDY) "]",
     "{\"reasoning_effort\": \"high\", \"valid_channels\": [\"analysis\", \"final\"]}",
     SYSTEM(CUTOFF, "high", "analysis, final", "") USER(CANDY) NEXT, NULL},
    {"test_reasoning_system_message_with_dates.txt", "[" MSG("user", "What is 42 * pi?") "]",
     "{\"knowledge_cutoff\": \"2021-01\", \"current_date\": \"2021-01-01\", \"valid_channels\": [\"analysis\", \"final\"]}",
     SYSTEM("Knowledge cutoff: 2021-01\nCurrent date: 2021-01-01\n", "medium", "analysis, final", "")
     USER("What is 42 * pi?") NEXT, NULL},
    {"test_no_tools.txt", "[]", "{\"current_date\": \"2025-06-28\"}",
     SYSTEM(CUTOFF "Current date: 2025-06-28\n", "medium", ALL_CHANNELS, "") NEXT, NULL},
    {"test_dropping_cot_by_default.txt",
     "[" MSG("user", "What is 2 + 2?") ", {\"role\": \"assistant\", \"thinking\": \"User asks: \\u201cWhat is 2 + 2?"
     "\\u201d Simple arithmetic. Provide answer.\", \"content\": \"2 + 2 equals 4.\"}, "
     MSG("user", "What about 9 / 2?") "]",
     "{\"harmony_system\": false}",
     USER("What is 2 + 2?") "<|start|>assistant<|channel|>final<|message|>2 + 2 equals 4.<|end|>"
     USER("What about 9 / 2?") NEXT, NULL},
    {"test_render_functions_with_parameters.txt",
     "[" MSG("developer", "Always respond in riddles") ", " MSG("user", SF) "]",
     "{\"reasoning_effort\": \"high\", \"current_date\": \"2025-06-28\"}",
     SYSTEM(CUTOFF "Current date: 2025-06-28\n", "high", ALL_CHANNELS, TOOLS_LINE)
     DEVELOPER("Always respond in riddles\n"
               "\n"
               FUNCTIONS(WEATHER_FNS
                         "// A function with various complex schemas.\n"
                         "type kitchensink = (_: // params object\n"
                         "{\n"
                         "// STRING\n"
                         "//\n"
                         "// A string\n"
                         "// Examples:\n"
                         "// - \"hello\"\n"
                         "// - \"world\"\n"
                         "string?: string,\n"
                         "// A nullable string\n"
                         "string_nullable?: string | null, // default: \"the default\"\n"
                         "string_enum?: \"a\" | \"b\" | \"c\",\n"
                         "// a oneof\n"
                         "// default: 20\n"
                         "oneof_string_or_number?:\n"
                         " | string // default: \"default_string_in_oneof\"\n"
                         " | number // numbers can happen too\n"
                         ",\n"
                         "}) => any;\n"
                         "\n"))
     USER(SF) NEXT,
     "[" WEATHER_FNS_JSON ", {\"type\": \"function\", \"function\": {\"name\": \"kitchensink\", \"description\": \"A function with various complex schemas.\", \"parameters\": {\"description\": \"params object\", \"type\": \"object\", \"properties\": {\"string\": {\"type\": \"string\", \"title\": \"STRING\", \"description\": \"A string\", \"examples\": [\"hello\", \"world\"]}, \"string_nullable\": {\"type\": \"string\", \"nullable\": true, \"description\": \"A nullable string\", \"default\": \"the default\"}, \"string_enum\": {\"type\": \"string\", \"enum\": [\"a\", \"b\", \"c\"]}, \"oneof_string_or_number\": {\"oneOf\": [{\"type\": \"string\", \"default\": \"default_string_in_oneof\"}, {\"type\": \"number\", \"description\": \"numbers can happen too\"}], \"description\": \"a oneof\", \"default\": 20}}}}}]"},
    {"docs/format.md (Function calling: the complete input example with two functions)",
     "[" MSG("system", "Use a friendly tone.") ", " MSG("user", SF) "]",
     "{\"reasoning_effort\": \"high\", \"current_date\": \"2025-06-28\"}",
     SYSTEM(CUTOFF "Current date: 2025-06-28\n", "high", ALL_CHANNELS, TOOLS_LINE)
     DEVELOPER("Use a friendly tone.\n\n" FUNCTIONS(WEATHER_FNS)) USER(SF) NEXT,
     "[" WEATHER_FNS_JSON "]"},
};

TEST(harmony_renders_the_specification_prompts)
{
    char *dir = gptoss_dir();
    for (size_t i = 0; i < sizeof spec / sizeof *spec; i++) {
        chat_template *t = load_with(dir, NULL, spec[i].args);
        EXPECT_CONTAINS(chat_template_source(t), "harmony");
        json_t *m = json_loads(spec[i].messages, 0, NULL);
        REQUIRE(m);
        json_t *tools = spec[i].tools ? json_loads(spec[i].tools, 0, NULL) : NULL;
        REQUIRE(!spec[i].tools || tools);
        char *out = NULL;
        size_t len;
        errbuf err;
        int rc = chat_template_render_prompt(t, m, tools, &out, &len, &err);
        if (rc) fprintf(stderr, "  %s: %s\n", spec[i].file, err.msg);
        EXPECT(rc == 0);
        if (out && strcmp(out, spec[i].want)) fprintf(stderr, "  %s: got\n%s\n", spec[i].file, out);
        EXPECT(out && strcmp(out, spec[i].want) == 0 && len == strlen(spec[i].want));
        free(out);
        json_decref(m);
        json_decref(tools);
        chat_template_destroy(&t);
    }
    rm_dir(dir);
}

/* test_keep_analysis_between_finals.txt renders the conversation as history; a training sample ends its last
 * assistant message with <|return|> instead of <|end|> (docs/format.md: "For supervised targets/training examples,
 * ending with <|return|> is appropriate"). The trained spans: each final message the model generates. */
TEST(harmony_training_sample_and_spans)
{
    static const char *const want =
        "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>final<|message|>4<|end|>"
        "<|start|>user<|message|>What is 3 + 5?<|end|><|start|>assistant<|channel|>analysis<|message|>thinking 3+5"
        "<|end|><|start|>assistant<|channel|>final<|message|>8<|end|>";
    char *dir = gptoss_dir();
    chat_template *t = load_with(dir, NULL, "{\"harmony_system\": false}");
    EXPECT(strcmp(chat_template_eot(t), "<|return|>") == 0);
    json_t *m = json_loads("[{\"role\": \"user\", \"content\": \"What is 2 + 2?\"},"
                           " {\"role\": \"assistant\", \"content\": \"4\"},"
                           " {\"role\": \"user\", \"content\": \"What is 3 + 5?\"},"
                           " {\"role\": \"assistant\", \"thinking\": \"thinking 3+5\", \"content\": \"8\"}]", 0, NULL);
    REQUIRE(m);
    chat_text ct = {0};
    errbuf err;
    REQUIRE(chat_template_render(t, m, NULL, &ct, &err) == 0);
    size_t n = strlen(want) - strlen("<|end|>");
    EXPECT(ct.len == n + strlen("<|return|>") && memcmp(ct.text, want, n) == 0 && strcmp(ct.text + n, "<|return|>") == 0);
    REQUIRE(ct.n_spans == 2);
    EXPECT(ct.len >= ct.spans[1].end);
    const char *s0 = "<|channel|>final<|message|>4<|end|>", *s1 = "<|channel|>final<|message|>8<|return|>";
    EXPECT(ct.spans[0].end - ct.spans[0].start == strlen(s0) && !memcmp(ct.text + ct.spans[0].start, s0, strlen(s0)));
    EXPECT(ct.spans[1].end == ct.len && ct.spans[1].end - ct.spans[1].start == strlen(s1) &&
           !memcmp(ct.text + ct.spans[1].start, s1, strlen(s1)));
    /* thinking before the last user message is dropped (test_dropping_cot_by_default.txt) */
    json_object_set_new(json_array_get(m, 1), "thinking", json_string("early"));
    REQUIRE(chat_template_render(t, m, NULL, &ct, &err) == 0);
    EXPECT(strstr(ct.text, "early") == NULL && ct.n_spans == 2);
    chat_text_free(&ct);
    json_decref(m);
    chat_template_destroy(&t);
    rm_dir(dir);
}

/* A tool call and its result: the call's header as the reference renderer writes it
 * (test_does_not_drop_if_ongoing_analysis.txt: "<|start|>assistant to=functions.lookup_weather<|channel|>commentary
 * <|constrain|>json<|message|>"), the tool message as docs/format.md gives it ("<|start|>functions.get_weather
 * to=assistant<|channel|>commentary<|message|>{output}<|end|>"), the thinking kept (after the last user message). */
TEST(harmony_tool_calls_and_results)
{
    char *dir = gptoss_dir();
    chat_template *t = load_with(dir, NULL, "{\"harmony_system\": false}");
    json_t *m = json_loads("[{\"role\": \"user\", \"content\": \"What is the weather like in SF?\"},"
                           " {\"role\": \"assistant\", \"thinking\": \"Need to use function get_weather.\", \"tool_calls\":"
                           "  [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
                           "    \"arguments\": {\"location\": \"San Francisco\"}}}]},"
                           " {\"role\": \"tool\", \"content\": \"{\\\"sunny\\\": true, \\\"temperature\\\": 20}\"},"
                           " {\"role\": \"assistant\", \"content\": \"It is sunny.\"}]", 0, NULL);
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]", 0, NULL);
    REQUIRE(m && tools);
    chat_text ct = {0};
    errbuf err;
    int rc = chat_template_render(t, m, tools, &ct, &err);
    if (rc) fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(rc == 0);
    static const char *const want =
        "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
        "type get_weather = () => any;\n\n} // namespace functions<|end|>"
        "<|start|>user<|message|>What is the weather like in SF?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>Need to use function get_weather.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
        "{\"location\":\"San Francisco\"}<|call|>"
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"sunny\": true, \"temperature\": 20}"
        "<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>";
    if (strcmp(ct.text, want)) fprintf(stderr, "  got\n%s\n", ct.text);
    EXPECT(strcmp(ct.text, want) == 0);
    EXPECT(ct.n_spans == 1 && ct.spans[0].end == ct.len &&
           ct.len - ct.spans[0].start == strlen("<|channel|>final<|message|>It is sunny.<|return|>"));
    chat_text_free(&ct);
    json_decref(tools);
    json_decref(m);
    chat_template_destroy(&t);
    rm_dir(dir);
}

TEST(harmony_chosen_by_name_and_refuses_what_it_cannot_render)
{
    chat_template *t = load_with(NULL, "harmony", "{}");
    EXPECT_CONTAINS(chat_template_source(t), "harmony.jinja");
    chat_text ct = {0};
    errbuf err;
    json_t *m = json_loads("[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"content\": \"5\"}]", 0, NULL);
    EXPECT(chat_template_render(t, m, NULL, &ct, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "message 1: a tool message with no name answers no tool call");
    json_decref(m);
    m = json_loads("[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"system\", \"content\": \"late\"}]", 0, NULL);
    EXPECT(chat_template_render(t, m, NULL, &ct, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "role 'system'");
    json_decref(m);
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"description\": \"no name\"}}]", 0, NULL);
    m = json_loads("[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", \"content\": \"a\"}]", 0, NULL);
    EXPECT(chat_template_render(t, m, tools, &ct, &err) == -EINVAL);
    EXPECT_CONTAINS(err.msg, "tool 0 has no function name");
    json_decref(tools);
    json_decref(m);
    chat_text_free(&ct);
    chat_template_destroy(&t);
    /* a gpt-oss folder with its own chat_template.jinja (Hugging Face's: no one end-of-turn marker) gets harmony;
     * --template FILE still wins */
    char *g = gptoss_dir(), p[300];
    snprintf(p, sizeof p, "%s/chat_template.jinja", g);
    const char *own = "{% for m in messages %}{{ m.content }}<|end|>{% endfor %}";
    test_write_file(p, own, strlen(own));
    t = load_with(g, NULL, "{}");
    EXPECT_CONTAINS(chat_template_source(t), "harmony");
    chat_template_destroy(&t);
    t = load_with(g, p, "{}");
    EXPECT_CONTAINS(chat_template_source(t), p);
    chat_template_destroy(&t);
    unlink(p);
    rm_dir(g);
    /* a folder without that token and without a template still says it has none */
    char *dir = test_tmpdir();
    EXPECT(chat_template_load(&t, dir, NULL, &err) == -ENOENT);
    rmdir(dir);
}

TEST(jinja_generation_blocks_give_spans)
{
    static const char src[] = "{% for x in xs %}<{{ x }}>{% generation %}[{{ x }}]{% endgeneration %}{% endfor %}"
                              "{% set s %}{% generation %}not counted{% endgeneration %}{% endset %}.";
    jinja_template *t;
    errbuf err;
    REQUIRE(jinja_parse(&t, src, strlen(src), "t", &jinja_hf_opts, &err) == 0);
    EXPECT(jinja_has_generation(t));
    json_t *v = json_loads("{\"xs\": [\"a\", \"bc\"]}", 0, NULL);
    char *out;
    size_t len, *sp, n;
    REQUIRE(jinja_render_spans(t, v, &out, &len, &sp, &n, &err) == 0);
    EXPECT(strcmp(out, "<a>[a]<bc>[bc].") == 0);
    EXPECT(n == 2 && sp[0] == 3 && sp[1] == 6 && sp[2] == 10 && sp[3] == 14);
    free(out);
    free(sp);
    json_decref(v);
    jinja_destroy(&t);
    REQUIRE(jinja_parse(&t, "x", 1, "t", &jinja_hf_opts, &err) == 0);
    EXPECT(!jinja_has_generation(t));
    jinja_destroy(&t);
}

TEST_MAIN
