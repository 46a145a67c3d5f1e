/* chat_template: the model's Jinja chat template rendered through jinja.c, and the trained spans found from
 * prefix renderings (see chat_template.h). */
#include "chat_template.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jinja.h"
#include "json_util.h"

struct chat_template {
    jinja_template *tpl, *tool_tpl; /* tool_tpl: the "tool_use" template of a named list, used with tools */
    json_t *vars;                   /* special tokens and --template-arg values */
    char source[4096 + 64];
    char eot[64];
};

/* Templates dflash ships: one row per format, chosen by a special token of the tokenizer (tokenizer_config.json's
 * added_tokens_decoder) before the folder's own template, or by name with --template NAME; --template FILE wins.
 * gpt-oss: the npm package's tokenizer_config.json has no template, and the model folder's chat_template.jinja
 * ends earlier assistant turns with <|end|> and the last with <|return|> (no one end-of-turn marker for the
 * spans) and prints today's date (strftime_now). The .jinja files are embedded in the library. */
#define EMBED(sym, file)                                                                                        \
    __asm__(".pushsection .rodata\n.globl " #sym "\n.hidden " #sym "\n" #sym ":\n.incbin \"" file "\"\n" \
            ".byte 0\n.popsection")
EMBED(dflash_harmony_jinja, "common/formats/harmony.jinja");
extern const char dflash_harmony_jinja[];

static const struct builtin_template {
    const char *name;   /* --template NAME */
    const char *marker; /* a special token only this format's tokenizers have */
    const char *src;
} BUILTINS[] = {
    {"harmony", "<|channel|>", dflash_harmony_jinja}, /* gpt-oss (o200k_harmony); openai/harmony docs/format.md */
};

/* The row whose marker is an added token of tokenizer_config.json cfg, or named name; NULL if none. */
static const struct builtin_template *builtin_find(const json_t *cfg, const char *name)
{
    for (size_t i = 0; i < sizeof BUILTINS / sizeof *BUILTINS; i++) {
        if (name) { if (!strcmp(name, BUILTINS[i].name)) return &BUILTINS[i]; continue; }
        const char *k; json_t *v;
        json_object_foreach(json_object_get(cfg, "added_tokens_decoder"), k, v) {
            const char *c = json_string_value(json_object_get(v, "content"));
            if (c && !strcmp(c, BUILTINS[i].marker)) return &BUILTINS[i];
        }
    }
    return NULL;
}

static const char *const SPECIAL_TOKENS[] = {"bos_token", "eos_token", "unk_token", "pad_token", "sep_token",
                                             "cls_token", "mask_token", NULL};

static int read_file(const char *path, char **out, size_t *len, errbuf *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *b = xmalloc(cap);
    size_t k;
    while ((k = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) b = xrealloc(b, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(b); return errbuf_set(err, EIO, "%s: read error", path); }
    b[n] = 0;
    *out = b;
    *len = n;
    return 0;
}

static int parse_into(jinja_template **out, const char *src, size_t len, const char *name, errbuf *err)
{
    return jinja_parse(out, src, len, name, &jinja_hf_opts, err);
}

/* Render the probe [user, assistant PROBE] and take the special token (<...>) after the assistant content. */
static int find_eot(chat_template *t, errbuf *err)
{
    static const char *const probes[] = {
        "[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"DFLASHPROBE\"}]",
        "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
        "{\"role\": \"assistant\", \"content\": \"DFLASHPROBE\"}]",
    };
    errbuf perr = {{0}};
    for (size_t i = 0; i < sizeof probes / sizeof *probes; i++) {
        json_t *vars = json_deep_copy(t->vars);
        json_object_set_new(vars, "messages", json_loads(probes[i], 0, NULL));
        json_object_set_new(vars, "tools", json_null());
        json_object_set_new(vars, "documents", json_null());
        json_object_set_new(vars, "add_generation_prompt", json_false());
        char *text = NULL;
        size_t len;
        int ret = jinja_render(t->tpl, vars, &text, &len, &perr);
        json_decref(vars);
        if (ret) continue;
        const char *p = NULL;
        for (const char *q = text; (q = strstr(q, "DFLASHPROBE")); q++) p = q + strlen("DFLASHPROBE");
        while (p && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) p++;
        const char *e = p && *p == '<' ? strchr(p, '>') : NULL;
        if (e && (size_t)(e + 1 - p) < sizeof t->eot) {
            memcpy(t->eot, p, (size_t)(e + 1 - p));
            t->eot[e + 1 - p] = 0;
            free(text);
            return 0;
        }
        free(text);
        return errbuf_set(err, EINVAL, "%s: no end-of-turn token (<...>) follows an assistant message's content",
                          t->source);
    }
    return errbuf_set(err, EINVAL, "%s: rendering a probe conversation (user, assistant): %s", t->source, perr.msg);
}

int chat_template_load(chat_template **out, const char *dir, const char *template_file, errbuf *err)
{
    *out = NULL;
    chat_template *t = xcalloc(1, sizeof *t);
    t->vars = json_object();
    json_t *cfg = NULL;
    char *src = NULL, path[4096 + 32];
    size_t len = 0;
    int ret = 0;
    if (dir) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        struct stat st;
        if (stat(path, &st) == 0 && (ret = json_file_load(&cfg, path, JSON_DECODE_INT_AS_REAL, err)) != 0) goto fail;
    }
    for (int i = 0; cfg && SPECIAL_TOKENS[i]; i++) { /* a string, or an AddedToken {"content": ...} */
        json_t *v = json_object_get(cfg, SPECIAL_TOKENS[i]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (json_is_string(v)) json_object_set(t->vars, SPECIAL_TOKENS[i], v);
    }
    char jpath[4096 + 32];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir ? dir : ".");
    json_t *ct = cfg ? json_object_get(cfg, "chat_template") : NULL;
    const struct builtin_template *bt = NULL;
    if (template_file) { if (access(template_file, F_OK) != 0) bt = builtin_find(NULL, template_file); }
    else bt = builtin_find(cfg, NULL);
    if (bt) {
        snprintf(t->source, sizeof t->source, "dflash's %s template (common/formats/%s.jinja)", bt->name, bt->name);
        if ((ret = parse_into(&t->tpl, bt->src, strlen(bt->src), t->source, err)) != 0) goto fail;
    } else if (template_file || (dir && access(jpath, R_OK) == 0)) {
        const char *f = template_file ? template_file : jpath;
        if ((ret = read_file(f, &src, &len, err)) != 0) goto fail;
        snprintf(t->source, sizeof t->source, "%s", f);
        if ((ret = parse_into(&t->tpl, src, len, t->source, err)) != 0) goto fail;
    } else {
        snprintf(t->source, sizeof t->source, "%s chat_template", path);
        if (json_is_array(ct)) { /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
            size_t i; json_t *e;
            json_array_foreach(ct, i, e) {
                const char *nm = json_string_value(json_object_get(e, "name"));
                json_t *body = json_object_get(e, "template");
                if (!nm || !json_is_string(body) || (strcmp(nm, "default") && strcmp(nm, "tool_use"))) continue;
                char name[sizeof t->source + 40];
                snprintf(name, sizeof name, "%s \"%s\"", t->source, nm);
                jinja_template **dst = nm[0] == 'd' ? &t->tpl : &t->tool_tpl;
                if (*dst) continue;
                if ((ret = parse_into(dst, json_string_value(body), json_string_length(body), name, err)) != 0) goto fail;
            }
            if (!t->tpl) { t->tpl = t->tool_tpl; t->tool_tpl = NULL; }
            if (!t->tpl) { ret = errbuf_set(err, EINVAL, "%s: no \"default\" template in the list", t->source); goto fail; }
        } else if (json_is_string(ct)) {
            if ((ret = parse_into(&t->tpl, json_string_value(ct), json_string_length(ct), t->source, err)) != 0) goto fail;
        } else {
            ret = errbuf_set(err, ENOENT, "%s: no chat template (neither %s nor a \"chat_template\" in "
                             "tokenizer_config.json; give --template FILE.jinja)", dir ? dir : "?", jpath);
            goto fail;
        }
    }
    if ((ret = find_eot(t, err)) != 0) goto fail;
    json_decref(cfg);
    free(src);
    *out = t;
    return 0;
fail:
    json_decref(cfg);
    free(src);
    chat_template_destroy(&t);
    return ret;
}

void chat_template_destroy(chat_template **t)
{
    if (!*t) return;
    jinja_destroy(&(*t)->tpl);
    jinja_destroy(&(*t)->tool_tpl);
    json_decref((*t)->vars);
    XFREE(*t);
}

const char *chat_template_source(const chat_template *t) { return t->source; }
const char *chat_template_eot(const chat_template *t) { return t->eot; }

int chat_template_set_arg(chat_template *t, const char *kv, errbuf *err)
{
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return errbuf_set(err, EINVAL, "template argument '%s' is not key=value", kv);
    char key[128];
    if ((size_t)(eq - kv) >= sizeof key) return errbuf_set(err, EINVAL, "template argument '%.40s...': key too long", kv);
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = 0;
    json_t *v = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!v) v = json_string(eq + 1);
    if (!v) return errbuf_set(err, EINVAL, "template argument %s: the value is not valid UTF-8", key);
    json_object_set_new(t->vars, key, v);
    return find_eot(t, err);
}

static char *render(const chat_template *t, const json_t *messages, const json_t *tools, bool gen, size_t *len,
                    size_t **spans, size_t *n_spans, errbuf *err)
{
    json_t *vars = json_object();
    json_object_update(vars, t->vars);
    json_object_set(vars, "messages", (json_t *)messages);
    json_object_set_new(vars, "tools", tools ? json_incref((json_t *)tools) : json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(gen));
    char *text = NULL;
    int ret = jinja_render_spans(tools && t->tool_tpl ? t->tool_tpl : t->tpl, vars, &text, len, spans, n_spans, err);
    json_decref(vars);
    return ret ? NULL : text;
}

static void span_add(chat_text *t, size_t start, size_t end)
{
    if (t->n_spans == t->spans_cap) {
        t->spans_cap = t->spans_cap ? 2 * t->spans_cap : 16;
        t->spans = xrealloc(t->spans, t->spans_cap * sizeof *t->spans);
    }
    t->spans[t->n_spans++] = (struct chat_span){start, end};
}

int chat_template_render(const chat_template *t, const json_t *messages, const json_t *tools, chat_text *out,
                         errbuf *err)
{
    free(out->text);
    out->text = NULL;
    out->len = 0;
    out->n_spans = 0;
    if (!json_is_array(messages) || !json_array_size(messages)) return errbuf_set(err, EINVAL, "empty conversation");
    if (tools && json_is_null(tools)) tools = NULL;
    size_t *gen = NULL, n_gen = 0;
    if (!(out->text = render(t, messages, tools, false, &out->len, &gen, &n_gen, err))) return -EINVAL;
    if (jinja_has_generation(tools && t->tool_tpl ? t->tool_tpl : t->tpl)) { /* the template marks the spans */
        for (size_t k = 0; k < n_gen; k++) span_add(out, gen[2 * k], gen[2 * k + 1]);
        free(gen);
        return 0;
    }
    free(gen);
    size_t eot_len = strlen(t->eot), prev_end = 0;
    for (size_t i = 0; i < json_array_size(messages); i++) {
        const char *role = json_string_value(json_object_get(json_array_get(messages, i), "role"));
        if (!role || strcmp(role, "assistant")) continue;
        json_t *prefix = json_array();
        for (size_t k = 0; k < i; k++) json_array_append(prefix, json_array_get(messages, k));
        size_t plen;
        errbuf perr;
        char *prompt = render(t, prefix, tools, true, &plen, NULL, NULL, &perr);
        json_decref(prefix);
        if (!prompt) return errbuf_set(err, EINVAL, "message %zu: the prompt before it: %s", i, perr.msg);
        size_t s = 0;
        while (s < plen && s < out->len && prompt[s] == out->text[s]) s++;
        while (s > 0 && s < out->len && ((unsigned char)out->text[s] & 0xc0) == 0x80) s--; /* a character boundary */
        free(prompt);
        const char *e = memmem(out->text + s, out->len - s, t->eot, eot_len);
        if (!e) return errbuf_set(err, EINVAL, "message %zu: no end-of-turn %s after the assistant's turn", i, t->eot);
        if (s < prev_end) return errbuf_set(err, EINVAL, "message %zu: its turn starts inside the previous one's", i);
        prev_end = (size_t)(e - out->text) + eot_len;
        span_add(out, s, prev_end);
    }
    return 0;
}

int chat_template_render_prompt(const chat_template *t, const json_t *messages, const json_t *tools, char **out,
                                size_t *len, errbuf *err)
{
    if (!json_is_array(messages)) return errbuf_set(err, EINVAL, "the conversation is not a list of messages");
    if (tools && json_is_null(tools)) tools = NULL;
    *out = render(t, messages, tools, true, len, NULL, NULL, err);
    return *out ? 0 : -EINVAL;
}

void chat_text_free(chat_text *t)
{
    free(t->text);
    free(t->spans);
    memset(t, 0, sizeof *t);
}

void chat_text_mask(const chat_text *t, const uint32_t *start, const uint32_t *end, size_t n, uint8_t *mask)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++) {
        while (s < t->n_spans && t->spans[s].end < end[i]) s++;
        mask[i] = s < t->n_spans && t->spans[s].start <= start[i] && end[i] <= t->spans[s].end && end[i] > start[i];
    }
}
