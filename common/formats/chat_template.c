/* chat_template: Qwen3 and Llama-3 chat templates as code (see chat_template.h). Each function follows the reference
 * Jinja template of the model's tokenizer_config.json line for line (no tools). */
#include "chat_template.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <string.h>
#include <utf8proc.h>

#include "json_util.h"

static void put(chat_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) { t->cap = (t->len + n + 1) * 2; t->text = xrealloc(t->text, t->cap); }
    memcpy(t->text + t->len, s, n);
    t->len += n;
    t->text[t->len] = 0;
}
static void puts_(chat_text *t, const char *s) { put(t, s, strlen(s)); }

static void span(chat_text *t, size_t start)
{
    if (t->n_spans == t->spans_cap) {
        t->spans_cap = t->spans_cap ? 2 * t->spans_cap : 16;
        t->spans = xrealloc(t->spans, t->spans_cap * sizeof *t->spans);
    }
    t->spans[t->n_spans++] = (struct chat_span){start, t->len};
}

void chat_text_free(chat_text *t)
{
    free(t->text); free(t->spans);
    memset(t, 0, sizeof *t);
}

int chat_template_parse(const char *name, enum chat_template_kind *out)
{
    if (!strcmp(name, "qwen3")) { *out = CHAT_TEMPLATE_QWEN3; return 0; }
    if (!strcmp(name, "llama3")) { *out = CHAT_TEMPLATE_LLAMA3; return 0; }
    return -EINVAL;
}

int chat_template_detect(const char *path, enum chat_template_kind *out, errbuf *err)
{
    json_t *root;
    int ret = json_file_load(&root, path, JSON_DECODE_INT_AS_REAL, err); /* model_max_length may exceed int64 */
    if (ret) return ret;
    const char *tpl = json_string_value(json_object_get(root, "chat_template"));
    if (tpl && strstr(tpl, "<|im_start|>")) *out = CHAT_TEMPLATE_QWEN3;
    else if (tpl && strstr(tpl, "<|start_header_id|>")) *out = CHAT_TEMPLATE_LLAMA3;
    else ret = errbuf_set(err, ENOENT, "%s: chat_template not recognised (pass --template qwen3|llama3)", path);
    json_decref(root);
    return ret;
}

/* Python's str.isspace for one code point (Jinja's trim is str.strip()). */
static bool py_space(utf8proc_int32_t c)
{
    if ((c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85) return true;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

static void py_strip(const char **s, size_t *n)
{
    const char *p = *s, *e = *s + *n;
    while (p < e) {
        utf8proc_int32_t c; utf8proc_ssize_t m = utf8proc_iterate((const utf8proc_uint8_t *)p, e - p, &c);
        if (m <= 0 || !py_space(c)) break;
        p += m;
    }
    while (e > p) { /* step back one code point */
        const char *q = e - 1;
        while (q > p && ((unsigned char)*q & 0xc0) == 0x80) q--;
        utf8proc_int32_t c; utf8proc_ssize_t m = utf8proc_iterate((const utf8proc_uint8_t *)q, e - q, &c);
        if (m <= 0 || !py_space(c)) break;
        e = q;
    }
    *s = p; *n = (size_t)(e - p);
}

static void strip_nl(const char **s, size_t *n, bool left, bool right)
{
    while (left && *n && **s == '\n') { (*s)++; (*n)--; }
    while (right && *n && (*s)[*n - 1] == '\n') (*n)--;
}

static const char *rfind(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = n >= k ? n - k + 1 : 0; i-- > 0;) if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static const char *find(const char *s, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++) if (!memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

static bool has_prefix(const char *s, const char *p) { return strncmp(s, p, strlen(p)) == 0; }
static bool has_suffix(const char *s, const char *p)
{
    size_t n = strlen(s), k = strlen(p);
    return n >= k && !strcmp(s + n - k, p);
}

static int render_qwen3(const struct chat_msg *m, size_t n, chat_text *t, errbuf *err)
{
    if (!strcmp(m[0].role, "system")) { puts_(t, "<|im_start|>system\n"); puts_(t, m[0].content); puts_(t, "<|im_end|>\n"); }
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        if (!strcmp(m[k].role, "user") &&
            !(has_prefix(m[k].content, "<tool_response>") && has_suffix(m[k].content, "</tool_response>"))) {
            last_query = k; break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role, *c = m[i].content;
        if (!strcmp(role, "user") || (!strcmp(role, "system") && i > 0)) {
            puts_(t, "<|im_start|>"); puts_(t, role); puts_(t, "\n"); puts_(t, c); puts_(t, "<|im_end|>\n");
        } else if (!strcmp(role, "system")) {
            continue;
        } else if (!strcmp(role, "assistant")) {
            const char *content = c, *reason = ""; size_t cl = strlen(c), rl = 0;
            const char *close = find(c, cl, "</think>");
            if (close) {
                const char *last_close = rfind(c, cl, "</think>");
                content = last_close + 8; cl = strlen(content); strip_nl(&content, &cl, true, false);
                reason = c; rl = (size_t)(close - c); strip_nl(&reason, &rl, false, true);
                const char *open = rfind(reason, rl, "<think>");
                if (open) { rl -= (size_t)(open + 7 - reason); reason = open + 7; }
                strip_nl(&reason, &rl, true, false);
            }
            puts_(t, "<|im_start|>assistant\n");
            size_t start = t->len;
            if (i > last_query && (i == n - 1 || rl)) {
                strip_nl(&reason, &rl, true, true);
                puts_(t, "<think>\n"); put(t, reason, rl); puts_(t, "\n</think>\n\n");
                if (!rl) start = t->len; /* the empty think block is not trained (as the goldens' mask) */
                strip_nl(&content, &cl, true, false);
            }
            put(t, content, cl);
            puts_(t, "<|im_end|>");
            span(t, start);
            puts_(t, "\n");
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(m[i - 1].role, "tool")) puts_(t, "<|im_start|>user");
            puts_(t, "\n<tool_response>\n"); puts_(t, c); puts_(t, "\n</tool_response>");
            if (i == n - 1 || strcmp(m[i + 1].role, "tool")) puts_(t, "<|im_end|>\n");
        } else {
            return errbuf_set(err, EINVAL, "message %zu: unknown role \"%s\"", i, role);
        }
    }
    return 0;
}

static int render_llama3(const struct chat_msg *m, size_t n, chat_text *t, errbuf *err)
{
    for (size_t i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "ipython") &&
            strcmp(role, "tool"))
            return errbuf_set(err, EINVAL, "message %zu: unknown role \"%s\"", i, role);
        if (i == 0) puts_(t, "<|begin_of_text|>");
        puts_(t, "<|start_header_id|>"); puts_(t, role); puts_(t, "<|end_header_id|>\n\n");
        size_t start = t->len;
        const char *c = m[i].content; size_t cl = strlen(c);
        py_strip(&c, &cl);
        put(t, c, cl);
        puts_(t, "<|eot_id|>");
        if (!strcmp(role, "assistant")) span(t, start);
    }
    puts_(t, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

int chat_template_render(enum chat_template_kind kind, const struct chat_msg *msgs, size_t n, chat_text *out,
                         errbuf *err)
{
    out->len = 0; out->n_spans = 0;
    put(out, "", 0);
    if (!n) return errbuf_set(err, EINVAL, "empty conversation");
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content) return errbuf_set(err, EINVAL, "message %zu: no role or content", i);
    return kind == CHAT_TEMPLATE_QWEN3 ? render_qwen3(msgs, n, out, err) : render_llama3(msgs, n, out, err);
}

void chat_text_mask(const chat_text *t, const uint32_t *start, const uint32_t *end, size_t n, uint8_t *mask)
{
    size_t s = 0;
    for (size_t i = 0; i < n; i++) {
        while (s < t->n_spans && t->spans[s].end < end[i]) s++;
        mask[i] = s < t->n_spans && t->spans[s].start <= start[i] && end[i] <= t->spans[s].end && end[i] > start[i];
    }
}
