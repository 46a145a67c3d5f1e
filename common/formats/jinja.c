/* jinja: lexer (source -> text/var/block chunks of tokens, whitespace control applied as Jinja2's lexer does),
 * recursive-descent parser (chunks -> one AST, precedence as jinja2/parser.py), and a tree-walking renderer over
 * jansson values with Python semantics. See jinja.h for the contract. */
#include "jinja.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

const struct jinja_opts jinja_hf_opts = {.trim_blocks = true, .lstrip_blocks = true};

/* ---------------------------------------------------------------- growable byte buffer */

struct buf { char *p; size_t n, cap; };

static void bput(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2 < 64 ? 64 : (b->n + n + 1) * 2;
        b->p = xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void bputs(struct buf *b, const char *s) { bput(b, s, strlen(s)); }
static void bputc(struct buf *b, char c) { bput(b, &c, 1); }
static void bprintf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(struct buf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    bput(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ---------------------------------------------------------------- Python string helpers */

/* Python's str.isspace for one code point (what strip(), split() and trim use). */
static bool jinja_py_space(int32_t c)
{
    if ((c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85) return true;
    if (c < 0x80) return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

/* The code point at s[0..n) and its length (a bad byte counts as one code point U+FFFD). */
static int32_t cp_at(const char *s, size_t n, size_t *len)
{
    utf8proc_int32_t c;
    utf8proc_ssize_t m = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &c);
    if (m <= 0) { *len = 1; return 0xfffd; }
    *len = (size_t)m;
    return c;
}

static size_t cp_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

/* Does the code point c occur in set[0..sn)? (set NULL: Python whitespace) */
static bool cp_in(int32_t c, const char *set, size_t sn)
{
    if (!set) return jinja_py_space(c);
    for (size_t i = 0; i < sn;) {
        size_t l;
        if (cp_at(set + i, sn - i, &l) == c) return true;
        i += l;
    }
    return false;
}

/* str.strip / lstrip / rstrip of s[0..*n) with chars set (NULL: whitespace); moves *s, shrinks *n. */
static void py_strip(const char **s, size_t *n, bool left, bool right, const char *set, size_t sn)
{
    const char *p = *s, *e = *s + *n;
    while (left && p < e) {
        size_t l;
        if (!cp_in(cp_at(p, (size_t)(e - p), &l), set, sn)) break;
        p += l;
    }
    while (right && e > p) {
        const char *q = e - 1;
        while (q > p && ((unsigned char)*q & 0xc0) == 0x80) q--;
        size_t l;
        if (!cp_in(cp_at(q, (size_t)(e - q), &l), set, sn)) break;
        e = q;
    }
    *s = p;
    *n = (size_t)(e - p);
}

/* Python float repr: the shortest digits that round-trip, fixed notation for exponents in [-4, 16). */
static void py_float(struct buf *b, double x)
{
    if (isnan(x)) { bputs(b, "nan"); return; }
    if (isinf(x)) { bputs(b, x < 0 ? "-inf" : "inf"); return; }
    char t[40];
    int p;
    for (p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, x);
        if (strtod(t, NULL) == x) break;
    }
    /* t = [-]d[.ddd]e[+-]XX */
    char digits[24]; int nd = 0, neg = t[0] == '-';
    const char *q = t + neg;
    for (; *q && *q != 'e'; q++) if (*q != '.') digits[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) bputc(b, '-');
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            bputs(b, "0.");
            for (int i = 0; i < -ex - 1; i++) bputc(b, '0');
            bput(b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= ex; i++) bputc(b, i < nd ? digits[i] : '0');
            bputc(b, '.');
            if (nd > ex + 1) bput(b, digits + ex + 1, (size_t)(nd - ex - 1)); else bputc(b, '0');
        }
    } else {
        bputc(b, digits[0]);
        if (nd > 1) { bputc(b, '.'); bput(b, digits + 1, (size_t)(nd - 1)); }
        bprintf(b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

/* Python repr of a str: single quotes unless it holds ' and no ". */
static void py_repr_str(struct buf *b, const char *s, size_t n)
{
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char qc = sq && !dq ? '"' : '\'';
    bputc(b, qc);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') bputs(b, "\\\\");
        else if (c == (unsigned char)qc) { bputc(b, '\\'); bputc(b, (char)c); }
        else if (c == '\n') bputs(b, "\\n");
        else if (c == '\r') bputs(b, "\\r");
        else if (c == '\t') bputs(b, "\\t");
        else if (c < 0x20 || c == 0x7f) bprintf(b, "\\x%02x", c);
        else bputc(b, (char)c);
    }
    bputc(b, qc);
}

static void py_repr(struct buf *b, const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_NULL: bputs(b, "None"); break;
    case JSON_TRUE: bputs(b, "True"); break;
    case JSON_FALSE: bputs(b, "False"); break;
    case JSON_INTEGER: bprintf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(j)); break;
    case JSON_REAL: py_float(b, json_real_value(j)); break;
    case JSON_STRING: py_repr_str(b, json_string_value(j), json_string_length(j)); break;
    case JSON_ARRAY: {
        bputc(b, '[');
        for (size_t i = 0; i < json_array_size(j); i++) {
            if (i) bputs(b, ", ");
            py_repr(b, json_array_get(j, i));
        }
        bputc(b, ']');
        break;
    }
    case JSON_OBJECT: {
        bputc(b, '{');
        const char *k; json_t *v; int first = 1;
        json_object_foreach((json_t *)j, k, v) {
            if (!first) bputs(b, ", ");
            first = 0;
            py_repr_str(b, k, strlen(k));
            bputs(b, ": ");
            py_repr(b, v);
        }
        bputc(b, '}');
        break;
    }
    }
}

/* str(x) */
static void py_str(struct buf *b, const json_t *j)
{
    if (json_is_string(j)) bput(b, json_string_value(j), json_string_length(j));
    else py_repr(b, j);
}

struct json_fmt { int indent; bool ascii, sort; const char *item_sep, *key_sep; };

static void json_str(struct buf *b, const char *s, size_t n, bool ascii)
{
    bputc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') bputs(b, "\\\"");
        else if (c == '\\') bputs(b, "\\\\");
        else if (c == '\n') bputs(b, "\\n");
        else if (c == '\r') bputs(b, "\\r");
        else if (c == '\t') bputs(b, "\\t");
        else if (c == '\b') bputs(b, "\\b");
        else if (c == '\f') bputs(b, "\\f");
        else if (c < 0x20) bprintf(b, "\\u%04x", c);
        else if (c >= 0x80 && ascii) {
            size_t l;
            int32_t cp = cp_at(s + i, n - i, &l);
            if (cp >= 0x10000) bprintf(b, "\\u%04x\\u%04x", 0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
            else bprintf(b, "\\u%04x", cp);
            i += l;
            continue;
        } else bputc(b, (char)c);
        i++;
    }
    bputc(b, '"');
}

static int key_cmp(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* json.dumps(x, ensure_ascii=, indent=, separators=, sort_keys=) */
static void json_dump(struct buf *b, const json_t *j, const struct json_fmt *f, int level)
{
    switch (json_typeof(j)) {
    case JSON_NULL: bputs(b, "null"); return;
    case JSON_TRUE: bputs(b, "true"); return;
    case JSON_FALSE: bputs(b, "false"); return;
    case JSON_INTEGER: bprintf(b, "%" JSON_INTEGER_FORMAT, json_integer_value(j)); return;
    case JSON_REAL: {
        double x = json_real_value(j);
        if (isnan(x)) bputs(b, "NaN");
        else if (isinf(x)) bputs(b, x < 0 ? "-Infinity" : "Infinity");
        else py_float(b, x);
        return;
    }
    case JSON_STRING: json_str(b, json_string_value(j), json_string_length(j), f->ascii); return;
    default: break;
    }
    bool arr = json_is_array(j);
    size_t n = arr ? json_array_size(j) : json_object_size(j);
    if (!n) { bputs(b, arr ? "[]" : "{}"); return; }
    const char **keys = NULL;
    if (!arr) {
        keys = xmalloc(n * sizeof *keys);
        size_t i = 0; const char *k; json_t *v;
        json_object_foreach((json_t *)j, k, v) keys[i++] = k;
        if (f->sort) qsort(keys, n, sizeof *keys, key_cmp);
    }
    bputc(b, arr ? '[' : '{');
    for (size_t i = 0; i < n; i++) {
        if (i) bputs(b, f->item_sep);
        if (f->indent >= 0) {
            bputc(b, '\n');
            for (int k = 0; k < (level + 1) * f->indent; k++) bputc(b, ' ');
        }
        if (arr) { json_dump(b, json_array_get(j, i), f, level + 1); continue; }
        json_str(b, keys[i], strlen(keys[i]), f->ascii);
        bputs(b, f->key_sep);
        json_dump(b, json_object_get(j, keys[i]), f, level + 1);
    }
    if (f->indent >= 0) {
        bputc(b, '\n');
        for (int k = 0; k < level * f->indent; k++) bputc(b, ' ');
    }
    bputc(b, arr ? ']' : '}');
    free(keys);
}

/* ---------------------------------------------------------------- lexer */

enum tok_type { T_END, T_NAME, T_INT, T_FLOAT, T_STR, T_OP };

struct tok {
    int type, line;
    char *s; size_t n;  /* name, operator or decoded string (owned) */
    json_int_t i; double f;
};

enum chunk_kind { C_TEXT, C_VAR, C_BLOCK };

struct chunk {
    int kind, line;
    char *text; size_t n;          /* C_TEXT */
    struct tok *toks; size_t ntoks; /* C_VAR, C_BLOCK: ends with T_END */
};

struct lexer {
    const char *src; size_t n, pos; int line;
    const char *name; const struct jinja_opts *o;
    struct chunk *ch; size_t nch, cap;
    errbuf *err;
};

static struct chunk *lex_push(struct lexer *L, int kind, int line)
{
    if (L->nch == L->cap) { L->cap = L->cap ? 2 * L->cap : 64; L->ch = xrealloc(L->ch, L->cap * sizeof *L->ch); }
    struct chunk *c = &L->ch[L->nch++];
    memset(c, 0, sizeof *c);
    c->kind = kind; c->line = line;
    return c;
}

static int lines_in(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* rstrip (Python whitespace) of text[0..*n) */
static void rstrip_ws(const char *s, size_t *n)
{
    const char *p = s;
    size_t m = *n;
    py_strip(&p, &m, false, true, NULL, 0);
    *n = m;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                  ".", ",", ":", "|", "(", ")", "[", "]", "{", "}", NULL};

/* Decode a Python string literal's body s[0..n) (backslash escapes) into b. */
static void unescape(struct buf *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) { bputc(b, s[i]); continue; }
        char c = s[++i];
        int hex = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (hex && i + hex < n) {
            char t[9] = {0};
            memcpy(t, s + i + 1, (size_t)hex);
            char *e;
            long v = strtol(t, &e, 16);
            if (*e == 0) {
                utf8proc_uint8_t u[4];
                utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)v, u);
                bput(b, (const char *)u, (size_t)k);
                i += (size_t)hex;
                continue;
            }
        }
        switch (c) {
        case 'n': bputc(b, '\n'); break;
        case 't': bputc(b, '\t'); break;
        case 'r': bputc(b, '\r'); break;
        case 'b': bputc(b, '\b'); break;
        case 'f': bputc(b, '\f'); break;
        case 'v': bputc(b, '\v'); break;
        case 'a': bputc(b, '\a'); break;
        case '0': bputc(b, '\0'); break;
        case '\\': case '\'': case '"': bputc(b, c); break;
        case '\n': break;
        default: bputc(b, '\\'); bputc(b, c); break;
        }
    }
}

/* Tokens of one {{ }} or {% %} tag from L->pos up to its end marker; sets *strip_after (-), *keep (+). */
static int lex_tag(struct lexer *L, struct chunk *c, bool block, int open_line, bool *strip_after, bool *plus)
{
    size_t cap = 16;
    c->toks = xmalloc(cap * sizeof *c->toks);
    int depth = 0;
    for (;;) {
        while (L->pos < L->n && is_ws(L->src[L->pos])) L->line += L->src[L->pos++] == '\n';
        if (L->pos >= L->n)
            return errbuf_set(L->err, EINVAL, "%s:%d: unexpected end of template: the tag opened here is not closed",
                              L->name, open_line);
        const char *p = L->src + L->pos;
        size_t left = L->n - L->pos;
        if (c->ntoks + 2 > cap) { cap *= 2; c->toks = xrealloc(c->toks, cap * sizeof *c->toks); }
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            bool sign = (*p == '-' || *p == '+') && left >= 3 && !memcmp(p + 1, end, 2);
            if (sign || (left >= 2 && !memcmp(p, end, 2))) {
                *strip_after = sign && *p == '-';
                *plus = sign && *p == '+';
                L->pos += sign ? 3 : 2;
                c->toks[c->ntoks++] = (struct tok){.type = T_END, .line = L->line};
                return 0;
            }
        }
        struct tok *t = &c->toks[c->ntoks];
        memset(t, 0, sizeof *t);
        t->line = L->line;
        if (*p == '_' || ((*p | 32) >= 'a' && (*p | 32) <= 'z')) {
            size_t k = 1;
            while (k < left && (p[k] == '_' || ((p[k] | 32) >= 'a' && (p[k] | 32) <= 'z') || (p[k] >= '0' && p[k] <= '9'))) k++;
            t->type = T_NAME; t->s = xmalloc(k + 1); memcpy(t->s, p, k); t->s[k] = 0; t->n = k;
            L->pos += k;
        } else if (*p >= '0' && *p <= '9') {
            size_t k = 0;
            bool flt = false;
            while (k < left && ((p[k] >= '0' && p[k] <= '9') || p[k] == '_')) k++;
            if (k + 1 < left && p[k] == '.' && p[k + 1] >= '0' && p[k + 1] <= '9') {
                flt = true;
                for (k++; k < left && ((p[k] >= '0' && p[k] <= '9') || p[k] == '_'); k++) {}
            }
            if (k < left && (p[k] == 'e' || p[k] == 'E')) {
                size_t e = k + 1;
                if (e < left && (p[e] == '+' || p[e] == '-')) e++;
                if (e < left && p[e] >= '0' && p[e] <= '9') {
                    flt = true;
                    for (k = e; k < left && p[k] >= '0' && p[k] <= '9'; k++) {}
                }
            }
            char num[64];
            size_t nn = 0;
            if (k >= sizeof num) return errbuf_set(L->err, EINVAL, "%s:%d: number too long", L->name, L->line);
            for (size_t i = 0; i < k; i++) if (p[i] != '_') num[nn++] = p[i];
            num[nn] = 0;
            if (flt) { t->type = T_FLOAT; t->f = strtod(num, NULL); }
            else { t->type = T_INT; t->i = (json_int_t)strtoll(num, NULL, 10); }
            L->pos += k;
        } else if (*p == '\'' || *p == '"') {
            size_t k = 1;
            while (k < left && p[k] != *p) k += p[k] == '\\' ? 2 : 1;
            if (k >= left)
                return errbuf_set(L->err, EINVAL, "%s:%d: unterminated string literal", L->name, L->line);
            struct buf b = {0};
            bputs(&b, "");
            unescape(&b, p + 1, k - 1);
            t->type = T_STR; t->s = b.p; t->n = b.n;
            L->line += lines_in(p, k);
            L->pos += k + 1;
        } else {
            const char *op = NULL;
            for (int i = 0; OPS[i]; i++)
                if (left >= strlen(OPS[i]) && !memcmp(p, OPS[i], strlen(OPS[i]))) { op = OPS[i]; break; }
            if (!op) return errbuf_set(L->err, EINVAL, "%s:%d: unexpected character '%c'", L->name, L->line, *p);
            if (strchr("([{", *op)) depth++;
            if (strchr(")]}", *op) && depth > 0) depth--;
            t->type = T_OP; t->s = xstrdup(op); t->n = strlen(op);
            L->pos += t->n;
        }
        c->ntoks++;
    }
}

/* Text chunk of s[0..n) unless empty. */
static void lex_text(struct lexer *L, const char *s, size_t n, int line)
{
    if (!n) return;
    struct chunk *c = lex_push(L, C_TEXT, line);
    c->text = xmalloc(n + 1);
    memcpy(c->text, s, n);
    c->text[n] = 0;
    c->n = n;
}

static int lex(struct lexer *L)
{
    bool line_starting = true, strip_next = false;
    while (L->pos < L->n) {
        size_t ts = L->pos;
        const char *s = L->src;
        while (ts + 1 < L->n && !(s[ts] == '{' && (s[ts + 1] == '{' || s[ts + 1] == '%' || s[ts + 1] == '#'))) ts++;
        if (ts + 1 >= L->n) ts = L->n;
        size_t d0 = L->pos, dn = ts - L->pos;
        int dline = L->line;
        if (strip_next) { /* a -}} / -%} before this text */
            while (dn && is_ws(s[d0])) { dline += s[d0] == '\n'; d0++; dn--; }
            strip_next = false;
        }
        L->line += lines_in(s + L->pos, ts - L->pos);
        if (ts >= L->n) { lex_text(L, s + d0, dn, dline); break; }
        char kind = s[ts + 1];
        char sign = ts + 2 < L->n && (s[ts + 2] == '-' || s[ts + 2] == '+') ? s[ts + 2] : 0;
        if (sign == '-') {
            rstrip_ws(s + d0, &dn);
        } else if (sign != '+' && L->o->lstrip_blocks && kind != '{') {
            size_t lp = dn;
            while (lp > 0 && s[d0 + lp - 1] != '\n') lp--;
            bool nl = lp > 0; /* a newline in the text before the tag */
            if ((nl || line_starting) && lp < dn) {
                size_t k = lp;
                while (k < dn && is_ws(s[d0 + k])) k++;
                if (k == dn) dn = lp;
            }
        }
        lex_text(L, s + d0, dn, dline);
        int tag_line = L->line;
        L->pos = ts + 2 + (sign ? 1 : 0);
        bool strip_after = false, plus = false;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t i = L->pos; i + 1 < L->n; i++) if (s[i] == '#' && s[i + 1] == '}') { e = s + i; break; }
            if (!e) return errbuf_set(L->err, EINVAL, "%s:%d: unterminated comment", L->name, tag_line);
            strip_after = e > s + L->pos && e[-1] == '-';
            plus = e > s + L->pos && e[-1] == '+';
            L->line += lines_in(s + L->pos, (size_t)(e - s) - L->pos);
            L->pos = (size_t)(e - s) + 2;
        } else {
            struct chunk *c = lex_push(L, kind == '{' ? C_VAR : C_BLOCK, tag_line);
            int ret = lex_tag(L, c, kind == '%', tag_line, &strip_after, &plus);
            if (ret) return ret;
            if (kind == '%' && c->ntoks == 2 && c->toks[0].type == T_NAME && !strcmp(c->toks[0].s, "raw")) {
                /* {% raw %}...{% endraw %}: the text between as is */
                size_t b = L->pos;
                if (strip_after) while (b < L->n && is_ws(s[b])) b++;
                else if (L->o->trim_blocks && !plus && b < L->n && s[b] == '\n') b++;
                size_t i = b, eb = 0, ee = 0;
                for (; i + 1 < L->n; i++) {
                    if (s[i] != '{' || s[i + 1] != '%') continue;
                    size_t k = i + 2;
                    if (k < L->n && (s[k] == '-' || s[k] == '+')) k++;
                    while (k < L->n && is_ws(s[k])) k++;
                    if (L->n - k < 6 || memcmp(s + k, "endraw", 6)) continue;
                    k += 6;
                    while (k < L->n && is_ws(s[k])) k++;
                    bool minus = k < L->n && s[k] == '-';
                    if (k < L->n && (s[k] == '-' || s[k] == '+')) k++;
                    if (L->n - k < 2 || memcmp(s + k, "%}", 2)) continue;
                    eb = i; ee = k + 2;
                    strip_after = minus;
                    break;
                }
                if (!ee) return errbuf_set(L->err, EINVAL, "%s:%d: {%% raw %%} without {%% endraw %%}", L->name, tag_line);
                size_t rn = eb - b;
                if (s[eb + 2] == '-') rstrip_ws(s + b, &rn);
                L->nch--; /* the raw tag itself */
                for (size_t t = 0; t < c->ntoks; t++) free(c->toks[t].s);
                free(c->toks);
                lex_text(L, s + b, rn, L->line);
                L->line += lines_in(s + L->pos, ee - L->pos);
                L->pos = ee;
                plus = false;
            }
        }
        line_starting = false;
        if (strip_after) {
            strip_next = true;
            size_t k = L->pos;
            while (k < L->n && is_ws(s[k])) k++;
            line_starting = k > L->pos && s[k - 1] == '\n';
        } else if (kind != '{' && L->o->trim_blocks && !plus && L->pos < L->n && s[L->pos] == '\n') {
            L->pos++; L->line++;
            line_starting = true;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- AST */

enum node_kind {
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_GENERATION,
    N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_NEG, N_NOT, N_AND, N_OR, N_BIN, N_COND,
    N_LIST, N_DICT,
};
enum bin_op { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT, OP_EQ, OP_NE, OP_LT, OP_LE,
              OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node {
    int kind, op, line;
    bool flag;                 /* N_IF: has else; N_TEST: negated */
    char *name; size_t len;    /* NAME/ATTR/FILTER/TEST/MACRO name; TEXT bytes; SET ns attribute */
    json_t *lit;               /* N_LIT */
    struct node **kid; size_t nkid, kcap;
    char **argn;               /* CALL/FILTER/TEST: keyword name of kid[1 + i] (NULL: positional) */
    char **tgt; size_t ntgt;   /* FOR/SET targets, MACRO parameters */
} node;

static node *node_new(int kind, int line)
{
    node *n = xcalloc(1, sizeof *n);
    n->kind = kind; n->line = line;
    return n;
}

static void node_add(node *n, node *k)
{
    if (n->nkid == n->kcap) { n->kcap = n->kcap ? 2 * n->kcap : 4; n->kid = xrealloc(n->kid, n->kcap * sizeof *n->kid); }
    n->kid[n->nkid++] = k;
}

static void node_free(node *n)
{
    if (!n) return;
    for (size_t i = 0; i < n->nkid; i++) node_free(n->kid[i]);
    if (n->argn) for (size_t i = 0; i + 1 < n->nkid; i++) free(n->argn[i]);
    for (size_t i = 0; i < n->ntgt; i++) free(n->tgt[i]);
    free(n->kid); free(n->argn); free(n->tgt); free(n->name);
    json_decref(n->lit);
    free(n);
}

struct jinja_template {
    node *root;
    char *name;
    bool generation; /* it has {% generation %} blocks */
};

/* ---------------------------------------------------------------- filters and tests: one table each */

enum filter_id {
    F_TRIM, F_TOJSON, F_LENGTH, F_ITEMS, F_JOIN, F_UPPER, F_LOWER, F_CAPITALIZE, F_TITLE, F_REPLACE, F_DEFAULT,
    F_FIRST, F_LAST, F_LIST, F_STRING, F_INT, F_FLOAT, F_ABS, F_SAFE, F_ESCAPE, F_INDENT, F_MAP, F_SELECT, F_REJECT,
    F_SELECTATTR, F_REJECTATTR, F_REVERSE, F_SORT, F_UNIQUE, F_DICTSORT, F_ROUND, F_MIN, F_MAX, F_SUM,
    F_STARTSWITH, F_ENDSWITH, F_WORDCOUNT,
};
static const struct { const char *name; int id; } FILTERS[] = {
    {"trim", F_TRIM}, {"tojson", F_TOJSON}, {"length", F_LENGTH}, {"count", F_LENGTH}, {"items", F_ITEMS},
    {"join", F_JOIN}, {"upper", F_UPPER}, {"lower", F_LOWER}, {"capitalize", F_CAPITALIZE}, {"title", F_TITLE},
    {"replace", F_REPLACE}, {"default", F_DEFAULT}, {"d", F_DEFAULT}, {"first", F_FIRST}, {"last", F_LAST},
    {"list", F_LIST}, {"string", F_STRING}, {"int", F_INT}, {"float", F_FLOAT}, {"abs", F_ABS}, {"safe", F_SAFE},
    {"e", F_ESCAPE}, {"escape", F_ESCAPE}, {"indent", F_INDENT}, {"map", F_MAP}, {"select", F_SELECT},
    {"reject", F_REJECT}, {"selectattr", F_SELECTATTR}, {"rejectattr", F_REJECTATTR}, {"reverse", F_REVERSE},
    {"sort", F_SORT}, {"unique", F_UNIQUE}, {"dictsort", F_DICTSORT}, {"round", F_ROUND}, {"min", F_MIN},
    {"max", F_MAX}, {"sum", F_SUM}, {"startswith", F_STARTSWITH}, {"endswith", F_ENDSWITH},
    {"wordcount", F_WORDCOUNT}, {NULL, 0},
};

enum test_id {
    X_DEFINED, X_UNDEFINED, X_NONE, X_STRING, X_MAPPING, X_SEQUENCE, X_ITERABLE, X_NUMBER, X_INTEGER, X_FLOAT,
    X_BOOLEAN, X_TRUE, X_FALSE, X_CALLABLE, X_EQ, X_NE, X_LT, X_LE, X_GT, X_GE, X_IN, X_ODD, X_EVEN, X_DIVISIBLEBY,
    X_LOWER, X_UPPER,
};
static const struct { const char *name; int id; } TESTS[] = {
    {"defined", X_DEFINED}, {"undefined", X_UNDEFINED}, {"none", X_NONE}, {"string", X_STRING},
    {"mapping", X_MAPPING}, {"sequence", X_SEQUENCE}, {"iterable", X_ITERABLE}, {"number", X_NUMBER},
    {"integer", X_INTEGER}, {"float", X_FLOAT}, {"boolean", X_BOOLEAN}, {"true", X_TRUE}, {"false", X_FALSE},
    {"callable", X_CALLABLE}, {"equalto", X_EQ}, {"eq", X_EQ}, {"==", X_EQ}, {"sameas", X_EQ}, {"ne", X_NE},
    {"!=", X_NE}, {"lt", X_LT}, {"lessthan", X_LT}, {"<", X_LT}, {"le", X_LE}, {"<=", X_LE}, {"gt", X_GT},
    {"greaterthan", X_GT}, {">", X_GT}, {"ge", X_GE}, {">=", X_GE}, {"in", X_IN}, {"odd", X_ODD}, {"even", X_EVEN},
    {"divisibleby", X_DIVISIBLEBY}, {"lower", X_LOWER}, {"upper", X_UPPER}, {NULL, 0},
};

static int filter_lookup(const char *name)
{
    for (int i = 0; FILTERS[i].name; i++) if (!strcmp(FILTERS[i].name, name)) return FILTERS[i].id;
    return -1;
}
static int test_lookup(const char *name)
{
    for (int i = 0; TESTS[i].name; i++) if (!strcmp(TESTS[i].name, name)) return TESTS[i].id;
    return -1;
}

/* ---------------------------------------------------------------- parser */

struct parser {
    struct chunk *ch; size_t nch, ci;
    struct tok *t; size_t ti;   /* the current tag's tokens */
    const char *name;
    errbuf *err;
    int failed;
    int depth;                  /* nesting of expressions and statements (bounded: the C stack) */
    bool generation;            /* a {% generation %} block was seen */
};

#define MAX_NESTING 128

static struct tok *cur(struct parser *P) { return &P->t[P->ti]; }
static bool is_op(struct parser *P, const char *op) { return cur(P)->type == T_OP && !strcmp(cur(P)->s, op); }
static bool is_name(struct parser *P, const char *nm) { return cur(P)->type == T_NAME && !strcmp(cur(P)->s, nm); }
static void adv(struct parser *P) { if (cur(P)->type != T_END) P->ti++; }

static node *perr(struct parser *P, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static node *perr(struct parser *P, int line, const char *fmt, ...)
{
    if (P->failed) return NULL;
    P->failed = 1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    errbuf_set(P->err, EINVAL, "%s:%d: %s", P->name, line, msg);
    return NULL;
}

static const char *tok_desc(struct tok *t)
{
    return t->type == T_END ? "end of tag" : t->type == T_STR ? "a string" : t->type == T_INT || t->type == T_FLOAT ? "a number" : t->s;
}

static bool expect_op(struct parser *P, const char *op)
{
    if (is_op(P, op)) { adv(P); return true; }
    perr(P, cur(P)->line, "expected '%s', got '%s'", op, tok_desc(cur(P)));
    return false;
}

static char *expect_name(struct parser *P)
{
    if (cur(P)->type != T_NAME) { perr(P, cur(P)->line, "expected a name, got '%s'", tok_desc(cur(P))); return NULL; }
    char *s = xstrdup(cur(P)->s);
    adv(P);
    return s;
}

static node *p_expr(struct parser *P);
static node *p_or(struct parser *P);
static node *p_unary(struct parser *P, bool with_filter);
static node *p_primary(struct parser *P);
static node *p_postfix(struct parser *P, node *n);

#define CHECK(x) do { if (!(x) || P->failed) { node_free(x); return NULL; } } while (0)

/* (args): positional and name=value into n->kid[1..], n->argn */
static bool p_call_args(struct parser *P, node *n)
{
    if (!expect_op(P, "(")) return false;
    while (!is_op(P, ")")) {
        char *kw = NULL;
        if (cur(P)->type == T_NAME && P->t[P->ti + 1].type == T_OP && !strcmp(P->t[P->ti + 1].s, "=")) {
            kw = xstrdup(cur(P)->s);
            adv(P); adv(P);
        }
        node *a = p_expr(P);
        if (!a || P->failed) { free(kw); node_free(a); return false; }
        node_add(n, a);
        n->argn = xrealloc(n->argn, n->nkid * sizeof *n->argn);
        n->argn[n->nkid - 2] = kw;
        if (!is_op(P, ",")) break;
        adv(P);
    }
    if (!n->argn) n->argn = xcalloc(1, sizeof *n->argn);
    return expect_op(P, ")");
}

static node *p_filter_expr(struct parser *P, node *n)
{
    for (;;) {
        if (is_op(P, "|")) {
            adv(P);
            int line = cur(P)->line;
            char *nm = expect_name(P);
            if (!nm) { node_free(n); return NULL; }
            int id = filter_lookup(nm);
            if (id < 0) { node *e = perr(P, line, "no filter named '%s'", nm); free(nm); node_free(n); return e; }
            node *f = node_new(N_FILTER, line);
            f->name = nm; f->op = id;
            node_add(f, n);
            n = f;
            if (is_op(P, "(") && !p_call_args(P, f)) { node_free(f); return NULL; }
            if (!f->argn) f->argn = xcalloc(1, sizeof *f->argn);
        } else if (is_name(P, "is")) {
            int line = cur(P)->line;
            adv(P);
            bool neg = false;
            if (is_name(P, "not")) { neg = true; adv(P); }
            char *nm = NULL;
            if (cur(P)->type == T_NAME) nm = expect_name(P);
            else if (cur(P)->type == T_OP && test_lookup(cur(P)->s) >= 0) { nm = xstrdup(cur(P)->s); adv(P); }
            else { node_free(n); return perr(P, line, "expected a test name after 'is'"); }
            int id = test_lookup(nm);
            if (id < 0) { node *e = perr(P, line, "no test named '%s'", nm); free(nm); node_free(n); return e; }
            node *t = node_new(N_TEST, line);
            t->name = nm; t->op = id; t->flag = neg;
            node_add(t, n);
            n = t;
            struct tok *c = cur(P);
            if (is_op(P, "(")) {
                if (!p_call_args(P, t)) { node_free(t); return NULL; }
            } else if ((c->type == T_NAME || c->type == T_STR || c->type == T_INT || c->type == T_FLOAT ||
                        is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") && !is_name(P, "if")) {
                node *a = p_primary(P);
                if (a && !P->failed) a = p_postfix(P, a);
                if (!a || P->failed) { node_free(a); node_free(t); return NULL; }
                node_add(t, a);
            }
            if (!t->argn) t->argn = xcalloc(t->nkid, sizeof *t->argn);
        } else if (is_op(P, "(")) {
            node *c = node_new(N_CALL, cur(P)->line);
            node_add(c, n);
            n = c;
            if (!p_call_args(P, c)) { node_free(c); return NULL; }
        } else {
            return n;
        }
    }
}

static node *p_postfix(struct parser *P, node *n)
{
    for (;;) {
        int line = cur(P)->line;
        if (is_op(P, ".")) {
            adv(P);
            node *a = node_new(N_ATTR, line);
            node_add(a, n);
            n = a;
            if (cur(P)->type == T_INT) { /* x.0: an item */
                n->kind = N_ITEM;
                node *k = node_new(N_LIT, line);
                k->lit = json_integer(cur(P)->i);
                node_add(n, k);
                adv(P);
                continue;
            }
            if (!(n->name = expect_name(P))) { node_free(n); return NULL; }
        } else if (is_op(P, "[")) {
            adv(P);
            node *idx[3] = {NULL, NULL, NULL};
            int part = 0;
            bool slice = false;
            while (!is_op(P, "]")) {
                if (is_op(P, ":")) { slice = true; part++; adv(P); if (part > 2) break; continue; }
                if (idx[part]) break;
                idx[part] = p_expr(P);
                if (!idx[part] || P->failed) break;
            }
            if (P->failed || !expect_op(P, "]") || (!slice && !idx[0])) {
                for (int i = 0; i < 3; i++) node_free(idx[i]);
                node_free(n);
                return P->failed ? NULL : perr(P, line, "empty subscript");
            }
            node *s = node_new(slice ? N_SLICE : N_ITEM, line);
            node_add(s, n);
            node_add(s, idx[0]);
            if (slice) { node_add(s, idx[1]); node_add(s, idx[2]); }
            n = s;
        } else if (is_op(P, "(")) {
            node *c = node_new(N_CALL, line);
            node_add(c, n);
            n = c;
            if (!p_call_args(P, c)) { node_free(c); return NULL; }
        } else {
            return n;
        }
    }
}

static node *p_primary(struct parser *P)
{
    struct tok *t = cur(P);
    node *n = NULL;
    switch (t->type) {
    case T_NAME:
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) { n = node_new(N_LIT, t->line); n->lit = json_true(); }
        else if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) { n = node_new(N_LIT, t->line); n->lit = json_false(); }
        else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) { n = node_new(N_LIT, t->line); n->lit = json_null(); }
        else { n = node_new(N_NAME, t->line); n->name = xstrdup(t->s); }
        adv(P);
        return n;
    case T_STR: {
        struct buf b = {0};
        bputs(&b, "");
        int line = t->line;
        while (cur(P)->type == T_STR) { bput(&b, cur(P)->s, cur(P)->n); adv(P); } /* "a" "b": one string */
        n = node_new(N_LIT, line);
        n->lit = json_stringn_nocheck(b.p, b.n);
        free(b.p);
        return n;
    }
    case T_INT: n = node_new(N_LIT, t->line); n->lit = json_integer(t->i); adv(P); return n;
    case T_FLOAT: n = node_new(N_LIT, t->line); n->lit = json_real(t->f); adv(P); return n;
    default: break;
    }
    int line = t->line;
    if (is_op(P, "(")) {
        adv(P);
        if (is_op(P, ")")) { adv(P); return node_new(N_LIST, line); }
        node *e = p_expr(P);
        CHECK(e);
        if (is_op(P, ",")) {
            node *l = node_new(N_LIST, line);
            node_add(l, e);
            while (is_op(P, ",")) {
                adv(P);
                if (is_op(P, ")")) break;
                node *x = p_expr(P);
                if (!x || P->failed) { node_free(l); return NULL; }
                node_add(l, x);
            }
            e = l;
        }
        if (!expect_op(P, ")")) { node_free(e); return NULL; }
        return e;
    }
    if (is_op(P, "[") || is_op(P, "{")) {
        bool dict = is_op(P, "{");
        const char *close = dict ? "}" : "]";
        adv(P);
        n = node_new(dict ? N_DICT : N_LIST, line);
        while (!is_op(P, close)) {
            node *x = p_expr(P);
            if (!x || P->failed) { node_free(n); return NULL; }
            node_add(n, x);
            if (dict) {
                if (!expect_op(P, ":")) { node_free(n); return NULL; }
                node *v = p_expr(P);
                if (!v || P->failed) { node_free(n); return NULL; }
                node_add(n, v);
            }
            if (!is_op(P, ",")) break;
            adv(P);
        }
        if (!expect_op(P, close)) { node_free(n); return NULL; }
        return n;
    }
    return perr(P, line, "unexpected '%s'", tok_desc(t));
}

static node *p_unary(struct parser *P, bool with_filter)
{
    int line = cur(P)->line;
    node *n;
    if (is_op(P, "-") || is_op(P, "+")) {
        bool neg = is_op(P, "-");
        adv(P);
        if (++P->depth > MAX_NESTING) return perr(P, line, "expression nested too deeply");
        node *x = p_unary(P, false);
        P->depth--;
        CHECK(x);
        if (neg) { n = node_new(N_NEG, line); node_add(n, x); }
        else n = x;
    } else {
        n = p_primary(P);
    }
    CHECK(n);
    n = p_postfix(P, n);
    CHECK(n);
    if (with_filter) n = p_filter_expr(P, n);
    return n;
}

static node *bin(int op, node *a, node *b, int line)
{
    node *n = node_new(N_BIN, line);
    n->op = op;
    node_add(n, a); node_add(n, b);
    return n;
}

static node *p_pow(struct parser *P)
{
    node *a = p_unary(P, true);
    while (a && !P->failed && is_op(P, "**")) {
        int line = cur(P)->line;
        adv(P);
        node *b = p_unary(P, true);
        if (!b) { node_free(a); return NULL; }
        a = bin(OP_POW, a, b, line);
    }
    return a;
}

static node *p_math2(struct parser *P)
{
    node *a = p_pow(P);
    for (;;) {
        if (!a || P->failed) return a;
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV : is_op(P, "%") ? OP_MOD : -1;
        if (op < 0) return a;
        int line = cur(P)->line;
        adv(P);
        node *b = p_pow(P);
        if (!b) { node_free(a); return NULL; }
        a = bin(op, a, b, line);
    }
}

static node *p_concat(struct parser *P)
{
    node *a = p_math2(P);
    while (a && !P->failed && is_op(P, "~")) {
        int line = cur(P)->line;
        adv(P);
        node *b = p_math2(P);
        if (!b) { node_free(a); return NULL; }
        a = bin(OP_CONCAT, a, b, line);
    }
    return a;
}

static node *p_math1(struct parser *P)
{
    node *a = p_concat(P);
    for (;;) {
        if (!a || P->failed) return a;
        int op = is_op(P, "+") ? OP_ADD : is_op(P, "-") ? OP_SUB : -1;
        if (op < 0) return a;
        int line = cur(P)->line;
        adv(P);
        node *b = p_concat(P);
        if (!b) { node_free(a); return NULL; }
        a = bin(op, a, b, line);
    }
}

static node *p_compare(struct parser *P)
{
    node *a = p_math1(P);
    for (;;) {
        if (!a || P->failed) return a;
        int line = cur(P)->line, op = -1;
        if (is_op(P, "==")) op = OP_EQ;
        else if (is_op(P, "!=")) op = OP_NE;
        else if (is_op(P, "<")) op = OP_LT;
        else if (is_op(P, "<=")) op = OP_LE;
        else if (is_op(P, ">")) op = OP_GT;
        else if (is_op(P, ">=")) op = OP_GE;
        else if (is_name(P, "in")) op = OP_IN;
        else if (is_name(P, "not") && P->t[P->ti + 1].type == T_NAME && !strcmp(P->t[P->ti + 1].s, "in")) { op = OP_NOTIN; adv(P); }
        if (op < 0) return a;
        adv(P);
        node *b = p_math1(P);
        if (!b) { node_free(a); return NULL; }
        a = bin(op, a, b, line);
    }
}

static node *p_not(struct parser *P)
{
    if (is_name(P, "not")) {
        if (++P->depth > MAX_NESTING) return perr(P, cur(P)->line, "expression nested too deeply");
        node *n = node_new(N_NOT, cur(P)->line);
        adv(P);
        node *x = p_not(P);
        P->depth--;
        if (!x) { node_free(n); return NULL; }
        node_add(n, x);
        return n;
    }
    return p_compare(P);
}

static node *p_and(struct parser *P)
{
    node *a = p_not(P);
    while (a && !P->failed && is_name(P, "and")) {
        node *n = node_new(N_AND, cur(P)->line);
        adv(P);
        node *b = p_not(P);
        if (!b) { node_free(a); node_free(n); return NULL; }
        node_add(n, a); node_add(n, b);
        a = n;
    }
    return a;
}

static node *p_or(struct parser *P)
{
    node *a = p_and(P);
    while (a && !P->failed && is_name(P, "or")) {
        node *n = node_new(N_OR, cur(P)->line);
        adv(P);
        node *b = p_and(P);
        if (!b) { node_free(a); node_free(n); return NULL; }
        node_add(n, a); node_add(n, b);
        a = n;
    }
    return a;
}

static node *p_expr1(struct parser *P);
static node *p_expr(struct parser *P)
{
    if (++P->depth > MAX_NESTING) { P->depth--; return perr(P, cur(P)->line, "expression nested too deeply"); }
    node *n = p_expr1(P);
    P->depth--;
    return n;
}

static node *p_expr1(struct parser *P)
{
    node *a = p_or(P);
    while (a && !P->failed && is_name(P, "if")) {
        node *c = node_new(N_COND, cur(P)->line);
        adv(P);
        node *cond = p_or(P);
        if (!cond) { node_free(a); node_free(c); return NULL; }
        node *b = NULL;
        if (is_name(P, "else")) {
            adv(P);
            if (!(b = p_expr(P))) { node_free(a); node_free(cond); node_free(c); return NULL; }
        }
        node_add(c, cond); node_add(c, a); node_add(c, b);
        a = c;
    }
    return a;
}

/* expr [, expr]*: a list (tuple) when there is a comma */
static node *p_tuple(struct parser *P)
{
    node *e = p_expr(P);
    if (!e || P->failed || !is_op(P, ",")) return e;
    node *l = node_new(N_LIST, e->line);
    node_add(l, e);
    while (is_op(P, ",")) {
        adv(P);
        if (cur(P)->type == T_END) break;
        node *x = p_expr(P);
        if (!x || P->failed) { node_free(l); return NULL; }
        node_add(l, x);
    }
    return l;
}

static bool expect_end(struct parser *P)
{
    if (cur(P)->type == T_END) return true;
    perr(P, cur(P)->line, "expected the end of the tag, got '%s'", tok_desc(cur(P)));
    return false;
}

/* names [, names]* into n->tgt */
static bool p_targets(struct parser *P, node *n)
{
    bool paren = is_op(P, "(");
    if (paren) adv(P);
    do {
        if (n->ntgt && !is_op(P, ",")) break;
        if (n->ntgt) adv(P);
        char *nm = expect_name(P);
        if (!nm) return false;
        n->tgt = xrealloc(n->tgt, (n->ntgt + 1) * sizeof *n->tgt);
        n->tgt[n->ntgt++] = nm;
    } while (is_op(P, ","));
    return !paren || expect_op(P, ")");
}

static node *p_body(struct parser *P, const char *const *stops, const char **which, int open_line);

/* Move to the next chunk; when it is a block, P->t is its tokens. */
static void next_chunk(struct parser *P)
{
    P->ci++;
    if (P->ci < P->nch) { P->t = P->ch[P->ci].toks; P->ti = 0; }
}

/* The statements after the current (fully read) tag, up to one of stops. */
static node *p_sub(struct parser *P, const char *const *stops, const char **which)
{
    int open_line = P->ch[P->ci].line;
    if (++P->depth > MAX_NESTING) return perr(P, open_line, "statements nested too deeply");
    next_chunk(P);
    node *n = p_body(P, stops, which, open_line);
    P->depth--;
    return n;
}

/* One statement from its opening tag (current); returns with its last tag current and read. */
static node *p_block(struct parser *P)
{
    struct chunk *c = &P->ch[P->ci];
    int line = c->line;
    if (cur(P)->type != T_NAME) return perr(P, line, "expected a statement name, got '%s'", tok_desc(cur(P)));
    char kw[32];
    snprintf(kw, sizeof kw, "%s", cur(P)->s);
    adv(P);
    const char *which = NULL;
    if (!strcmp(kw, "if")) {
        node *n = node_new(N_IF, line);
        static const char *const stops[] = {"elif", "else", "endif", NULL};
        for (;;) {
            node *cond = p_expr(P);
            if (!cond || !expect_end(P)) { node_free(cond); node_free(n); return NULL; }
            node_add(n, cond);
            node *body = p_sub(P, stops, &which);
            if (!body) { node_free(n); return NULL; }
            node_add(n, body);
            if (strcmp(which, "elif")) break;
        }
        if (!strcmp(which, "else")) {
            if (!expect_end(P)) { node_free(n); return NULL; }
            static const char *const stops2[] = {"endif", NULL};
            node *body = p_sub(P, stops2, &which);
            if (!body) { node_free(n); return NULL; }
            node_add(n, body);
            n->flag = true;
        }
        if (!expect_end(P)) { node_free(n); return NULL; }
        return n;
    }
    if (!strcmp(kw, "for")) {
        node *n = node_new(N_FOR, line);
        if (!p_targets(P, n)) { node_free(n); return NULL; }
        if (!is_name(P, "in")) { node_free(n); return perr(P, cur(P)->line, "expected 'in' in the for statement"); }
        adv(P);
        node *it = p_or(P), *cond = NULL;
        if (!it) { node_free(n); return NULL; }
        if (is_op(P, ",")) { /* for x in a, b */
            node *l = node_new(N_LIST, it->line);
            node_add(l, it);
            while (is_op(P, ",")) { adv(P); node *x = p_or(P); if (!x) { node_free(l); node_free(n); return NULL; } node_add(l, x); }
            it = l;
        }
        if (is_name(P, "if")) { adv(P); if (!(cond = p_expr(P))) { node_free(it); node_free(n); return NULL; } }
        if (is_name(P, "recursive")) { node_free(it); node_free(cond); node_free(n); return perr(P, line, "recursive loops are not supported"); }
        node_add(n, it);
        if (!expect_end(P)) { node_free(cond); node_free(n); return NULL; }
        static const char *const stops[] = {"else", "endfor", NULL};
        node *body = p_sub(P, stops, &which), *els = NULL;
        if (body && !strcmp(which, "else")) {
            static const char *const stops2[] = {"endfor", NULL};
            if (expect_end(P)) els = p_sub(P, stops2, &which);
            if (!els) { node_free(body); body = NULL; }
        }
        node_add(n, body); node_add(n, els); node_add(n, cond);
        if (!body || !expect_end(P)) { node_free(n); return NULL; }
        return n;
    }
    if (!strcmp(kw, "set")) {
        node *n = node_new(N_SET, line);
        if (!p_targets(P, n)) { node_free(n); return NULL; }
        if (n->ntgt == 1 && is_op(P, ".")) { adv(P); if (!(n->name = expect_name(P))) { node_free(n); return NULL; } }
        if (is_op(P, "=")) {
            adv(P);
            node *e = p_tuple(P);
            if (!e || !expect_end(P)) { node_free(e); node_free(n); return NULL; }
            node_add(n, e);
            return n;
        }
        if (n->ntgt != 1 || n->name) { node_free(n); return perr(P, line, "expected '=' in the set statement"); }
        if (!expect_end(P)) { node_free(n); return NULL; }
        n->kind = N_SETBLOCK;
        static const char *const stops[] = {"endset", NULL};
        node *body = p_sub(P, stops, &which);
        if (!body || !expect_end(P)) { node_free(body); node_free(n); return NULL; }
        node_add(n, body);
        return n;
    }
    if (!strcmp(kw, "macro")) {
        node *n = node_new(N_MACRO, line);
        if (!(n->name = expect_name(P)) || !expect_op(P, "(")) { node_free(n); return NULL; }
        node_add(n, NULL); /* the body, below; kid[1 + i]: parameter i's default */
        while (!is_op(P, ")")) {
            char *nm = expect_name(P);
            if (!nm) { node_free(n); return NULL; }
            n->tgt = xrealloc(n->tgt, (n->ntgt + 1) * sizeof *n->tgt);
            n->tgt[n->ntgt++] = nm;
            node *def = NULL;
            if (is_op(P, "=")) { adv(P); if (!(def = p_expr(P))) { node_free(n); return NULL; } }
            node_add(n, def);
            if (!is_op(P, ",")) break;
            adv(P);
        }
        if (!expect_op(P, ")") || !expect_end(P)) { node_free(n); return NULL; }
        static const char *const stops[] = {"endmacro", NULL};
        node *body = p_sub(P, stops, &which);
        if (!body) { node_free(n); return NULL; }
        n->kid[0] = body;
        if (cur(P)->type == T_NAME) adv(P); /* {% endmacro name %} */
        if (!expect_end(P)) { node_free(n); return NULL; }
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        if (!expect_end(P)) return NULL;
        return node_new(kw[0] == 'b' ? N_BREAK : N_CONTINUE, line);
    }
    if (!strcmp(kw, "generation")) { /* HF's {% generation %}: the assistant's tokens (jinja_render_spans) */
        if (!expect_end(P)) return NULL;
        static const char *const stops[] = {"endgeneration", NULL};
        node *body = p_sub(P, stops, &which);
        if (!body || !expect_end(P)) { node_free(body); return NULL; }
        node *n = node_new(N_GENERATION, line);
        node_add(n, body);
        P->generation = true;
        return n;
    }
    return perr(P, line, "unknown or unsupported statement '%s'", kw);
}

/* Statements up to a block whose keyword is in stops (NULL: to the end); *which is that keyword, the tokens
 * after it current. open_line: the line of the tag that opened them (for "'endif' expected"). */
static node *p_body(struct parser *P, const char *const *stops, const char **which, int open_line)
{
    node *body = node_new(N_BODY, open_line);
    while (P->ci < P->nch) {
        struct chunk *c = &P->ch[P->ci];
        if (c->kind == C_TEXT) {
            node *t = node_new(N_TEXT, c->line);
            t->name = c->text; t->len = c->n;
            c->text = NULL;
            node_add(body, t);
            next_chunk(P);
            continue;
        }
        P->t = c->toks; P->ti = 0;
        if (c->kind == C_VAR) {
            node *o = node_new(N_OUT, c->line);
            node *e = p_tuple(P);
            if (!e || !expect_end(P)) { node_free(e); node_free(o); node_free(body); return NULL; }
            node_add(o, e);
            node_add(body, o);
            next_chunk(P);
            continue;
        }
        if (cur(P)->type == T_NAME && stops)
            for (int i = 0; stops[i]; i++)
                if (!strcmp(cur(P)->s, stops[i])) { *which = stops[i]; adv(P); return body; }
        if (cur(P)->type == T_NAME && (!strncmp(cur(P)->s, "end", 3) || !strcmp(cur(P)->s, "elif") || !strcmp(cur(P)->s, "else"))) {
            int last = 0;
            while (stops && stops[last + 1]) last++;
            perr(P, c->line, "unexpected '%s'%s%s", cur(P)->s, stops ? ", expected " : "", stops ? stops[last] : "");
            node_free(body);
            return NULL;
        }
        node *s = p_block(P);
        if (!s) { node_free(body); return NULL; }
        node_add(body, s);
        next_chunk(P);
    }
    if (stops) {
        int last = 0;
        while (stops[last + 1]) last++;
        perr(P, open_line, "'%s' expected: the template ends before this tag is closed", stops[last]);
        node_free(body);
        return NULL;
    }
    return body;
}

int jinja_parse(jinja_template **out, const char *src, size_t len, const char *name, const struct jinja_opts *opts,
                errbuf *err)
{
    *out = NULL;
    /* Jinja normalizes newlines and drops one trailing newline (keep_trailing_newline=False) */
    struct buf s = {0};
    bputs(&s, "");
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') { bputc(&s, '\n'); if (i + 1 < len && src[i + 1] == '\n') i++; }
        else bputc(&s, src[i]);
    }
    if (s.n && s.p[s.n - 1] == '\n') s.p[--s.n] = 0;
    struct lexer L = {.src = s.p, .n = s.n, .line = 1, .name = name, .o = opts ? opts : &jinja_hf_opts, .err = err};
    int ret = lex(&L);
    node *root = NULL;
    bool generation = false;
    if (!ret) {
        struct parser P = {.ch = L.ch, .nch = L.nch, .name = name, .err = err};
        if (P.nch) { P.t = P.ch[0].toks; P.ti = 0; }
        root = p_body(&P, NULL, NULL, 1);
        if (!root) ret = -EINVAL;
        generation = P.generation;
    }
    for (size_t i = 0; i < L.nch; i++) {
        free(L.ch[i].text);
        for (size_t k = 0; k < L.ch[i].ntoks; k++) free(L.ch[i].toks[k].s);
        free(L.ch[i].toks);
    }
    free(L.ch);
    free(s.p);
    if (ret) return ret;
    jinja_template *t = xcalloc(1, sizeof *t);
    t->root = root;
    t->name = xstrdup(name);
    t->generation = generation;
    *out = t;
    return 0;
}

void jinja_destroy(jinja_template **t)
{
    if (!*t) return;
    node_free((*t)->root);
    free((*t)->name);
    XFREE(*t);
}

/* ---------------------------------------------------------------- values and the renderer */

/* A for loop's state, what loop.* reads (made only when asked). */
struct loopinfo { json_t *items; size_t i, len; };

/* A value: a JSON value (owned reference), a macro, a loop, or undefined (none; what names what was missing). */
typedef struct val {
    json_t *j;
    const node *mac;
    const char *what;
    const struct loopinfo *loop;
    const char *fn; /* a global function: range, namespace, dict, raise_exception, strftime_now */
} val;

static const val UNDEF = {NULL, NULL, NULL, NULL, NULL};
static val V(json_t *j) { return (val){j, NULL, NULL, NULL, NULL}; }         /* takes the reference */
static val VREF(json_t *j) { return (val){json_incref(j), NULL, NULL, NULL, NULL}; }
static val undef(const char *what) { return (val){NULL, NULL, what, NULL, NULL}; }
static bool is_undef(val v) { return !v.j && !v.mac && !v.loop && !v.fn; }
static void vfree(val v) { json_decref(v.j); }

/* A scope's variables: a few, in a small array (names point into the AST); ro: the caller's variables. */
struct var { const char *name; json_t *v; };
struct scope {
    struct var *vars; size_t n, cap;
    const json_t *ro;
    const struct loopinfo *loop;
    struct scope *up;
};

static void scope_free(struct scope *s)
{
    for (size_t i = 0; i < s->n; i++) json_decref(s->vars[i].v);
    free(s->vars);
}

struct macro_def { const char *name; const node *n; };

struct rctx {
    const jinja_template *t;
    struct buf out;
    errbuf *err;
    bool failed;
    int ctl;                   /* 1 break, 2 continue: pending loop control */
    int depth;
    unsigned long steps;       /* statements run: a template that never ends is an error, not a hang */
    struct scope *global, *sc;
    struct macro_def *macros; size_t nmacros;
    json_t **ns; size_t nns;   /* namespace() objects: the only ones `set x.attr` may change */
    int capture;               /* > 0 inside a set block or a macro call: their output is not c->out's */
    size_t *gen; size_t ngen, gencap; /* {% generation %} ranges of the output, start and end per block */
};

static val rfail(struct rctx *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static val rfail(struct rctx *c, int line, const char *fmt, ...)
{
    if (c->failed) return UNDEF;
    c->failed = true;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    errbuf_set(c->err, EINVAL, "%s:%d: %s", c->t->name, line, msg);
    return UNDEF;
}

static const char *type_name(val v)
{
    if (v.mac) return "macro";
    if (v.loop) return "LoopContext";
    if (v.fn) return "builtin_function_or_method";
    if (!v.j) return "Undefined";
    switch (json_typeof(v.j)) {
    case JSON_NULL: return "NoneType";
    case JSON_TRUE: case JSON_FALSE: return "bool";
    case JSON_INTEGER: return "int";
    case JSON_REAL: return "float";
    case JSON_STRING: return "str";
    case JSON_ARRAY: return "list";
    default: return "dict";
    }
}

static val undefined_error(struct rctx *c, int line, val v)
{
    return rfail(c, line, "'%s' is undefined", v.what ? v.what : "value");
}

static bool truthy(val v)
{
    if (!v.j) return v.mac || v.loop || v.fn;
    switch (json_typeof(v.j)) {
    case JSON_NULL: case JSON_FALSE: return false;
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v.j) != 0;
    case JSON_REAL: return json_real_value(v.j) != 0;
    case JSON_STRING: return json_string_length(v.j) > 0;
    case JSON_ARRAY: return json_array_size(v.j) > 0;
    default: return json_object_size(v.j) > 0;
    }
}

static bool is_num(const json_t *j) { return json_is_integer(j) || json_is_real(j) || json_is_boolean(j); }
static double num(const json_t *j)
{
    return json_is_integer(j) ? (double)json_integer_value(j) : json_is_real(j) ? json_real_value(j) : json_is_true(j);
}
static bool is_intlike(const json_t *j) { return json_is_integer(j) || json_is_boolean(j); }
static json_int_t ival(const json_t *j) { return json_is_integer(j) ? json_integer_value(j) : json_is_true(j); }

/* Python == */
static bool jeq(const json_t *a, const json_t *b)
{
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return ival(a) == ival(b);
        return num(a) == num(b);
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    switch (json_typeof(a)) {
    case JSON_NULL: return true;
    case JSON_STRING: return json_string_length(a) == json_string_length(b) &&
                             !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    case JSON_ARRAY:
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++) if (!jeq(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    case JSON_OBJECT: {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k; json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!w || !jeq(v, w)) return false;
        }
        return true;
    }
    default: return false;
    }
}

static bool veq(val a, val b)
{
    if (is_undef(a) || is_undef(b)) return is_undef(a) && is_undef(b);
    if (!a.j || !b.j) return a.mac == b.mac && a.loop == b.loop && a.fn == b.fn;
    return jeq(a.j, b.j);
}

/* Python ordering: -1/0/1, or 2 when the types do not compare */
static int jcmp(const json_t *a, const json_t *b)
{
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return ival(a) < ival(b) ? -1 : ival(a) > ival(b);
        double x = num(a), y = num(b);
        return x < y ? -1 : x > y;
    }
    if (json_is_string(a) && json_is_string(b)) {
        size_t n = json_string_length(a), m = json_string_length(b);
        int r = memcmp(json_string_value(a), json_string_value(b), n < m ? n : m);
        return r ? (r < 0 ? -1 : 1) : n < m ? -1 : n > m;
    }
    if (json_is_array(a) && json_is_array(b)) {
        size_t n = json_array_size(a), m = json_array_size(b);
        for (size_t i = 0; i < n && i < m; i++) {
            if (jeq(json_array_get(a, i), json_array_get(b, i))) continue;
            return jcmp(json_array_get(a, i), json_array_get(b, i));
        }
        return n < m ? -1 : n > m;
    }
    return 2;
}

static json_t *jstr(const char *s, size_t n) { return json_stringn_nocheck(s, n); }
static json_t *jbuf(struct buf *b) /* takes the buffer */
{
    json_t *j = jstr(b->p ? b->p : "", b->n);
    free(b->p);
    memset(b, 0, sizeof *b);
    return j;
}

/* str(v) appended to b ("" for undefined) */
static void vstr(struct buf *b, val v)
{
    if (v.j) py_str(b, v.j);
    else if (v.mac) bprintf(b, "<macro %s>", v.mac->name);
    else if (v.loop) bputs(b, "<LoopContext>");
    else if (v.fn) bprintf(b, "<built-in function %s>", v.fn);
}

static val vstring(val v)
{
    if (v.j && json_is_string(v.j)) return VREF(v.j);
    struct buf b = {0};
    vstr(&b, v);
    return V(jbuf(&b));
}

/* ---- scopes */

static val lookup(struct rctx *c, const char *name)
{
    for (struct scope *s = c->sc; s; s = s->up) {
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->vars[i].name, name)) return VREF(s->vars[i].v);
        if (s->loop && !strcmp(name, "loop")) return (val){NULL, NULL, NULL, s->loop, NULL};
        json_t *v = s->ro ? json_object_get(s->ro, name) : NULL;
        if (v) return VREF(v);
    }
    for (size_t i = c->nmacros; i-- > 0;)
        if (!strcmp(c->macros[i].name, name)) return (val){NULL, c->macros[i].n, NULL, NULL, NULL};
    static const char *const globals[] = {"range", "namespace", "dict", "raise_exception", "strftime_now", NULL};
    for (int i = 0; globals[i]; i++)
        if (!strcmp(globals[i], name)) return (val){NULL, NULL, NULL, NULL, globals[i]};
    return undef(name);
}

static void assign(struct rctx *c, const char *name, val v)
{
    struct scope *s = c->sc;
    size_t i = 0;
    while (i < s->n && strcmp(s->vars[i].name, name)) i++;
    if (v.j) {
        json_incref(v.j);
        if (i < s->n) { json_decref(s->vars[i].v); s->vars[i].v = v.j; return; }
        if (s->n == s->cap) { s->cap = s->cap ? 2 * s->cap : 4; s->vars = xrealloc(s->vars, s->cap * sizeof *s->vars); }
        s->vars[s->n++] = (struct var){name, v.j};
    } else {
        if (i < s->n) { json_decref(s->vars[i].v); s->vars[i] = s->vars[--s->n]; }
        if (v.mac) { /* one entry per name: a macro defined in a loop is defined again, not added again */
            size_t k = 0;
            while (k < c->nmacros && strcmp(c->macros[k].name, name)) k++;
            if (k == c->nmacros) c->macros = xrealloc(c->macros, ++c->nmacros * sizeof *c->macros);
            c->macros[k] = (struct macro_def){name, v.mac};
        }
    }
}

/* ---- items, attributes, iteration */

/* The byte offsets of code points of s[0..n): off[i] for i in [0, count], count returned. ASCII: NULL. */
static size_t *cp_offsets(const char *s, size_t n, size_t *count)
{
    size_t k = cp_count(s, n);
    *count = k;
    if (k == n) return NULL;
    size_t *off = xmalloc((k + 1) * sizeof *off), j = 0;
    for (size_t i = 0; i < n; i++) if (((unsigned char)s[i] & 0xc0) != 0x80) off[j++] = i;
    off[k] = n;
    return off;
}

static val getitem(struct rctx *c, int line, val o, val k)
{
    if (is_undef(o)) return undefined_error(c, line, o);
    if (!o.j || !k.j) return undef("item");
    if (json_is_object(o.j)) {
        if (!json_is_string(k.j)) return undef("item");
        json_t *v = json_object_get(o.j, json_string_value(k.j));
        return v ? VREF(v) : undef("item"); /* (the key's text may not outlive k: ev names literal ones) */
    }
    if (!is_intlike(k.j)) return undef("item");
    json_int_t i = ival(k.j);
    if (json_is_array(o.j)) {
        json_int_t n = (json_int_t)json_array_size(o.j);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return undef("item");
        return VREF(json_array_get(o.j, (size_t)i));
    }
    if (json_is_string(o.j)) {
        const char *s = json_string_value(o.j);
        size_t cnt, *off = cp_offsets(s, json_string_length(o.j), &cnt);
        if (i < 0) i += (json_int_t)cnt;
        val r = undef("item");
        if (i >= 0 && i < (json_int_t)cnt)
            r = off ? V(jstr(s + off[i], off[i + 1] - off[i])) : V(jstr(s + i, 1));
        free(off);
        return r;
    }
    return undef("item");
}

static val loop_attr(const struct loopinfo *l, const char *name)
{
    json_int_t i = (json_int_t)l->i, n = (json_int_t)l->len;
    if (!strcmp(name, "index")) return V(json_integer(i + 1));
    if (!strcmp(name, "index0")) return V(json_integer(i));
    if (!strcmp(name, "revindex")) return V(json_integer(n - i));
    if (!strcmp(name, "revindex0")) return V(json_integer(n - i - 1));
    if (!strcmp(name, "first")) return V(json_boolean(i == 0));
    if (!strcmp(name, "last")) return V(json_boolean(i + 1 == n));
    if (!strcmp(name, "length")) return V(json_integer(n));
    if (!strcmp(name, "depth")) return V(json_integer(1));
    if (!strcmp(name, "depth0")) return V(json_integer(0));
    if (!strcmp(name, "previtem") && i > 0) return VREF(json_array_get(l->items, (size_t)i - 1));
    if (!strcmp(name, "nextitem") && i + 1 < n) return VREF(json_array_get(l->items, (size_t)i + 1));
    return undef(name);
}

static val getattr_(struct rctx *c, int line, val o, const char *name)
{
    if (is_undef(o)) return undefined_error(c, line, o);
    if (o.loop) return loop_attr(o.loop, name);
    if (o.j && json_is_object(o.j)) {
        json_t *v = json_object_get(o.j, name);
        if (v) return VREF(v);
    }
    return undef(name);
}

/* The items a for loop or a filter sees: a new array (list, dict keys, string characters; undefined: empty). */
static json_t *iter_items(struct rctx *c, int line, val v)
{
    if (is_undef(v)) return json_array();
    if (!v.j || json_is_array(v.j)) return v.j ? json_copy(v.j) : NULL;
    json_t *a = json_array();
    if (json_is_object(v.j)) {
        const char *k; json_t *x;
        json_object_foreach(v.j, k, x) json_array_append_new(a, json_string(k));
        return a;
    }
    if (json_is_string(v.j)) {
        const char *s = json_string_value(v.j);
        size_t n = json_string_length(v.j);
        for (size_t i = 0; i < n;) {
            size_t l;
            cp_at(s + i, n - i, &l);
            json_array_append_new(a, jstr(s + i, l));
            i += l;
        }
        return a;
    }
    json_decref(a);
    rfail(c, line, "'%s' object is not iterable", type_name(v));
    return NULL;
}

/* Python slice of a sequence of n items: the indexes it takes into idx (caller frees), their count. */
static size_t slice_indexes(json_int_t n, const json_t *a, const json_t *b, const json_t *st, json_int_t **idx)
{
    json_int_t step = st && !json_is_null(st) ? ival(st) : 1;
    if (step == 0) step = 1;
    json_int_t lo, hi;
    if (step > 0) {
        lo = a && !json_is_null(a) ? ival(a) : 0;
        hi = b && !json_is_null(b) ? ival(b) : n;
        lo = lo < 0 ? (lo + n < 0 ? 0 : lo + n) : lo > n ? n : lo;
        hi = hi < 0 ? (hi + n < 0 ? 0 : hi + n) : hi > n ? n : hi;
    } else {
        lo = a && !json_is_null(a) ? ival(a) : n - 1;
        hi = b && !json_is_null(b) ? ival(b) : -1 - n;
        lo = lo < 0 ? (lo + n < -1 ? -1 : lo + n) : lo > n - 1 ? n - 1 : lo;
        hi = hi < 0 ? (hi + n < -1 ? -1 : hi + n) : hi > n - 1 ? n - 1 : hi;
    }
    *idx = xmalloc((size_t)(n > 0 ? n : 1) * sizeof **idx);
    size_t k = 0;
    for (json_int_t i = lo; step > 0 ? i < hi : i > hi; i += step) (*idx)[k++] = i;
    return k;
}

static val do_slice(struct rctx *c, int line, val o, val a, val b, val st)
{
    if (is_undef(o)) return undefined_error(c, line, o);
    const json_t *parts[3] = {a.j, b.j, st.j};
    for (int i = 0; i < 3; i++)
        if (parts[i] && !json_is_null(parts[i]) && !is_intlike(parts[i]))
            return rfail(c, line, "slice indices must be integers or None");
    json_int_t *idx;
    if (o.j && json_is_array(o.j)) {
        size_t k = slice_indexes((json_int_t)json_array_size(o.j), a.j, b.j, st.j, &idx);
        json_t *r = json_array();
        for (size_t i = 0; i < k; i++) json_array_append(r, json_array_get(o.j, (size_t)idx[i]));
        free(idx);
        return V(r);
    }
    if (o.j && json_is_string(o.j)) {
        const char *s = json_string_value(o.j);
        size_t cnt, *off = cp_offsets(s, json_string_length(o.j), &cnt);
        size_t k = slice_indexes((json_int_t)cnt, a.j, b.j, st.j, &idx);
        struct buf r = {0};
        bputs(&r, "");
        for (size_t i = 0; i < k; i++) {
            size_t p = (size_t)idx[i];
            if (off) bput(&r, s + off[p], off[p + 1] - off[p]); else bputc(&r, s[p]);
        }
        free(idx); free(off);
        return V(jbuf(&r));
    }
    return rfail(c, line, "'%s' object is not subscriptable", type_name(o));
}

/* ---- evaluation */

static val ev(struct rctx *c, const node *n);
static void exec_body(struct rctx *c, const node *n);

/* Evaluated call arguments: positional args[0..npos), keyword kw[i]/kwv[i]. */
struct args {
    val a[16]; size_t n;
    const char *kw[16]; val kv[16]; size_t nkw;
};

static void args_free(struct args *A)
{
    for (size_t i = 0; i < A->n; i++) vfree(A->a[i]);
    for (size_t i = 0; i < A->nkw; i++) vfree(A->kv[i]);
}

/* kid[first..] of n evaluated */
static bool eval_args(struct rctx *c, const node *n, size_t first, struct args *A)
{
    A->n = A->nkw = 0;
    for (size_t i = first; i < n->nkid; i++) {
        const char *kw = n->argn ? n->argn[i - 1] : NULL;
        if ((kw ? A->nkw : A->n) >= 16) { rfail(c, n->line, "too many arguments"); return false; }
        val v = ev(c, n->kid[i]);
        if (c->failed) { vfree(v); args_free(A); return false; }
        if (kw) { A->kw[A->nkw] = kw; A->kv[A->nkw++] = v; }
        else A->a[A->n++] = v;
    }
    return true;
}

/* Keyword argument name; UNDEF when absent. */
static val kwarg(const struct args *A, const char *name)
{
    for (size_t i = 0; name && i < A->nkw; i++) if (!strcmp(A->kw[i], name)) return A->kv[i];
    return UNDEF;
}
/* Argument pos (positional index) or keyword name; UNDEF when absent. */
static val arg(const struct args *A, size_t pos, const char *name)
{
    return pos < A->n ? A->a[pos] : kwarg(A, name);
}

static bool arg_str(struct rctx *c, int line, val v, const char *what, const char **s, size_t *n)
{
    if (v.j && json_is_string(v.j)) { *s = json_string_value(v.j); *n = json_string_length(v.j); return true; }
    rfail(c, line, "%s must be a string, not %s", what, type_name(v));
    return false;
}

static val call_macro(struct rctx *c, const node *m, const node *call, struct args *A)
{
    if (A->n > m->ntgt) return rfail(c, call->line, "macro '%s' takes %zu arguments, %zu given", m->name, m->ntgt, A->n);
    if (++c->depth > 200) return rfail(c, call->line, "macro recursion too deep");
    struct scope s = {.up = c->global};
    struct scope *saved = c->sc;
    struct buf saved_out = c->out;
    memset(&c->out, 0, sizeof c->out);
    c->capture++;
    bputs(&c->out, "");
    c->sc = &s;
    for (size_t i = 0; i < m->ntgt && !c->failed; i++) {
        val v = arg(A, i, m->tgt[i]);
        if (is_undef(v) && !(i < A->n) && m->kid[1 + i]) {
            val d = ev(c, m->kid[1 + i]);
            assign(c, m->tgt[i], d);
            vfree(d);
        } else {
            assign(c, m->tgt[i], v);
        }
    }
    if (!c->failed) exec_body(c, m->kid[0]);
    c->sc = saved;
    scope_free(&s);
    struct buf r = c->out;
    c->out = saved_out;
    c->capture--;
    c->depth--;
    c->ctl = 0;
    if (c->failed) { free(r.p); return UNDEF; }
    return V(jbuf(&r));
}

static json_t *mk_range(json_int_t a, json_int_t b, json_int_t st)
{
    json_t *r = json_array();
    for (json_int_t i = a; st > 0 ? i < b : i > b; i += st) json_array_append_new(r, json_integer(i));
    return r;
}

static val call_global(struct rctx *c, const node *n, const char *name, struct args *A)
{
    if (!strcmp(name, "range")) {
        json_int_t p[3] = {0, 0, 1};
        for (size_t i = 0; i < A->n && i < 3; i++) {
            if (!A->a[i].j || !is_intlike(A->a[i].j)) return rfail(c, n->line, "range() arguments must be integers");
            p[i] = ival(A->a[i].j);
        }
        if (A->n == 1) { p[1] = p[0]; p[0] = 0; }
        if (A->n == 0 || p[2] == 0) return rfail(c, n->line, "range() needs 1 to 3 integer arguments, step not 0");
        if (((double)p[1] - (double)p[0]) / (double)p[2] > 1e6) return rfail(c, n->line, "range() too long");
        return V(mk_range(p[0], p[1], p[2]));
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *o = json_object();
        if (A->n && A->a[0].j && json_is_object(A->a[0].j)) json_object_update(o, A->a[0].j);
        for (size_t i = 0; i < A->nkw; i++) if (A->kv[i].j) json_object_set(o, A->kw[i], A->kv[i].j);
        if (name[0] == 'n') {
            c->ns = xrealloc(c->ns, (c->nns + 1) * sizeof *c->ns);
            c->ns[c->nns++] = json_incref(o);
        }
        return V(o);
    }
    if (!strcmp(name, "raise_exception")) {
        struct buf b = {0};
        bputs(&b, "");
        if (A->n) vstr(&b, A->a[0]);
        rfail(c, n->line, "%s", b.p);
        free(b.p);
        return UNDEF;
    }
    if (!strcmp(name, "strftime_now")) {
        const char *f; size_t fl;
        if (!arg_str(c, n->line, arg(A, 0, "format"), "strftime_now's format", &f, &fl)) return UNDEF;
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[256];
        size_t k = strftime(out, sizeof out, f, &tm);
        return V(jstr(out, k));
    }
    return rfail(c, n->line, "'%s' is undefined", name);
}

static val str_upper_lower(const char *s, size_t n, int mode) /* 0 lower, 1 upper, 2 capitalize, 3 title */
{
    struct buf b = {0};
    bputs(&b, "");
    bool prev_cased = false;
    for (size_t i = 0; i < n;) {
        size_t l;
        int32_t cp = cp_at(s + i, n - i, &l), o;
        if (mode == 0) o = utf8proc_tolower(cp);
        else if (mode == 1) o = utf8proc_toupper(cp);
        else if (mode == 2) o = i == 0 ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        else o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        utf8proc_category_t k = utf8proc_category(cp);
        prev_cased = k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
        utf8proc_uint8_t u[4];
        bput(&b, (const char *)u, (size_t)utf8proc_encode_char(o, u));
        i += l;
    }
    return V(jbuf(&b));
}

static val str_replace(const char *s, size_t n, const char *a, size_t an, const char *r, size_t rn, json_int_t count)
{
    struct buf b = {0};
    bputs(&b, "");
    size_t i = 0;
    json_int_t done = 0;
    if (an == 0) { /* Python inserts r between characters */
        for (; i <= n && (count < 0 || done < count); done++) {
            bput(&b, r, rn);
            if (i == n) { i++; break; }
            size_t l;
            cp_at(s + i, n - i, &l);
            bput(&b, s + i, l);
            i += l;
        }
        if (i < n) bput(&b, s + i, n - i);
        return V(jbuf(&b));
    }
    while (i + an <= n && (count < 0 || done < count)) {
        const char *f = memmem(s + i, n - i, a, an);
        if (!f) break;
        bput(&b, s + i, (size_t)(f - (s + i)));
        bput(&b, r, rn);
        i = (size_t)(f - s) + an;
        done++;
    }
    bput(&b, s + i, n - i);
    return V(jbuf(&b));
}

static bool str_starts(const char *s, size_t n, const json_t *p, bool end)
{
    if (json_is_array(p)) {
        for (size_t i = 0; i < json_array_size(p); i++) if (str_starts(s, n, json_array_get(p, i), end)) return true;
        return false;
    }
    size_t k = json_string_length(p);
    return k <= n && !memcmp(end ? s + n - k : s, json_string_value(p), k);
}

/* str.split(sep=None, maxsplit=-1) */
static val str_split(const char *s, size_t n, const char *sep, size_t sn, json_int_t max)
{
    json_t *r = json_array();
    size_t i = 0;
    json_int_t done = 0;
    if (!sep) {
        for (;;) {
            while (i < n) { size_t l; if (!jinja_py_space(cp_at(s + i, n - i, &l))) break; i += l; }
            if (i >= n) break;
            size_t j = i;
            if (max >= 0 && done >= max) {
                const char *p = s + i; size_t m = n - i;
                py_strip(&p, &m, false, true, NULL, 0);
                json_array_append_new(r, jstr(p, m));
                break;
            }
            while (j < n) { size_t l; if (jinja_py_space(cp_at(s + j, n - j, &l))) break; j += l; }
            json_array_append_new(r, jstr(s + i, j - i));
            done++;
            i = j;
        }
        return V(r);
    }
    for (;;) {
        const char *f = (max < 0 || done < max) && sn ? memmem(s + i, n - i, sep, sn) : NULL;
        if (!f) { json_array_append_new(r, jstr(s + i, n - i)); break; }
        json_array_append_new(r, jstr(s + i, (size_t)(f - (s + i))));
        i = (size_t)(f - s) + sn;
        done++;
    }
    return V(r);
}

/* obj.method(args) for the str, dict and loop methods templates call */
static val call_method(struct rctx *c, const node *n, val o, const char *m, struct args *A, bool *handled)
{
    *handled = true;
    int line = n->line;
    if (o.j && json_is_string(o.j)) {
        const char *s = json_string_value(o.j);
        size_t sl = json_string_length(o.j);
        if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
            val ch = arg(A, 0, "chars");
            const char *set = NULL; size_t sn = 0;
            if (ch.j && !json_is_null(ch.j) && !arg_str(c, line, ch, "strip's chars", &set, &sn)) return UNDEF;
            py_strip(&s, &sl, m[0] != 'r', m[0] != 'l', set, sn);
            return V(jstr(s, sl));
        }
        if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
            val sp = arg(A, 0, "sep"), mx = arg(A, 1, "maxsplit");
            const char *sep = NULL; size_t sn = 0;
            if (sp.j && !json_is_null(sp.j) && !arg_str(c, line, sp, "split's separator", &sep, &sn)) return UNDEF;
            if (sep && !sn) return rfail(c, line, "empty separator");
            json_int_t max = mx.j && is_intlike(mx.j) ? ival(mx.j) : -1;
            if (m[0] == 'r' && max >= 0) return rfail(c, line, "rsplit with maxsplit is not supported");
            return str_split(s, sl, sep, sn, max);
        }
        if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            val p = arg(A, 0, "prefix");
            if (!p.j || !(json_is_string(p.j) || json_is_array(p.j)))
                return rfail(c, line, "%s takes a string or a tuple of strings", m);
            return V(json_boolean(str_starts(s, sl, p.j, m[0] == 'e')));
        }
        if (!strcmp(m, "upper")) return str_upper_lower(s, sl, 1);
        if (!strcmp(m, "lower")) return str_upper_lower(s, sl, 0);
        if (!strcmp(m, "capitalize")) return str_upper_lower(s, sl, 2);
        if (!strcmp(m, "title")) return str_upper_lower(s, sl, 3);
        if (!strcmp(m, "replace")) {
            const char *a, *r; size_t an, rn;
            if (!arg_str(c, line, arg(A, 0, "old"), "replace's old", &a, &an) ||
                !arg_str(c, line, arg(A, 1, "new"), "replace's new", &r, &rn)) return UNDEF;
            val cnt = arg(A, 2, "count");
            return str_replace(s, sl, a, an, r, rn, cnt.j && is_intlike(cnt.j) ? ival(cnt.j) : -1);
        }
        if (!strcmp(m, "find") || !strcmp(m, "count")) {
            const char *a; size_t an;
            if (!arg_str(c, line, arg(A, 0, "sub"), "the substring", &a, &an)) return UNDEF;
            if (m[0] == 'f') {
                const char *f = an ? memmem(s, sl, a, an) : s;
                return V(json_integer(f ? (json_int_t)cp_count(s, (size_t)(f - s)) : -1));
            }
            json_int_t k = 0;
            for (const char *p = s; an && (p = memmem(p, sl - (size_t)(p - s), a, an)); p += an) k++;
            return V(json_integer(an ? k : (json_int_t)cp_count(s, sl) + 1));
        }
        if (!strcmp(m, "join")) {
            json_t *items = iter_items(c, line, arg(A, 0, "iterable"));
            if (!items) return UNDEF;
            struct buf b = {0};
            bputs(&b, "");
            for (size_t i = 0; i < json_array_size(items); i++) {
                if (i) bput(&b, s, sl);
                py_str(&b, json_array_get(items, i));
            }
            json_decref(items);
            return V(jbuf(&b));
        }
        if (!strcmp(m, "isdigit") || !strcmp(m, "isspace") || !strcmp(m, "isalpha")) {
            bool r = sl > 0;
            for (size_t i = 0; i < sl && r;) {
                size_t l;
                int32_t cp = cp_at(s + i, sl - i, &l);
                utf8proc_category_t k = utf8proc_category(cp);
                r = m[2] == 'd' ? k == UTF8PROC_CATEGORY_ND : m[2] == 's' ? jinja_py_space(cp)
                    : (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO);
                i += l;
            }
            return V(json_boolean(r));
        }
    }
    if (o.j && json_is_object(o.j)) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            json_t *r = json_array();
            const char *k; json_t *v;
            json_object_foreach(o.j, k, v) {
                if (m[0] == 'k') json_array_append_new(r, json_string(k));
                else if (m[0] == 'v') json_array_append(r, v);
                else json_array_append_new(r, json_pack("[sO]", k, v));
            }
            return V(r);
        }
        if (!strcmp(m, "get")) {
            val k = arg(A, 0, "key");
            json_t *v = k.j && json_is_string(k.j) ? json_object_get(o.j, json_string_value(k.j)) : NULL;
            if (v) return VREF(v);
            val d = arg(A, 1, "default");
            return d.j ? VREF(d.j) : V(json_null());
        }
    }
    if (o.loop && !strcmp(m, "cycle")) {
        if (!A->n) return rfail(c, line, "loop.cycle needs at least one argument");
        val v = A->a[o.loop->i % A->n];
        return v.j ? VREF(v.j) : UNDEF;
    }
    *handled = false;
    return UNDEF;
}

static val apply_filter(struct rctx *c, const node *n, val x, struct args *A);
static val ev_filter_test(struct rctx *c, const node *n);
static bool apply_test(struct rctx *c, const node *n, int id, val x, struct args *A);

static __attribute__((noinline)) val ev_call(struct rctx *c, const node *n)
{
    const node *f = n->kid[0];
    struct args A;
    if (f->kind == N_ATTR) {
        val o = ev(c, f->kid[0]);
        if (c->failed) return UNDEF;
        if (is_undef(o)) return undefined_error(c, n->line, o);
        if (!eval_args(c, n, 1, &A)) { vfree(o); return UNDEF; }
        bool handled;
        val r = call_method(c, n, o, f->name, &A, &handled);
        if (!handled) {
            val m = getattr_(c, n->line, o, f->name);
            if (m.mac) r = call_macro(c, m.mac, n, &A);
            else r = rfail(c, n->line, "'%s' object has no method '%s'", type_name(o), f->name);
            vfree(m);
        }
        vfree(o);
        args_free(&A);
        return r;
    }
    if (!eval_args(c, n, 1, &A)) return UNDEF;
    val r;
    if (f->kind == N_NAME) {
        val m = lookup(c, f->name);
        if (m.mac) r = call_macro(c, m.mac, n, &A);
        else if (m.fn) r = call_global(c, n, m.fn, &A);
        else if (is_undef(m)) r = rfail(c, n->line, "'%s' is undefined", f->name);
        else r = rfail(c, n->line, "'%s' (%s) is not callable", f->name, type_name(m));
        vfree(m);
    } else {
        val m = ev(c, f);
        r = m.mac ? call_macro(c, m.mac, n, &A) : m.fn ? call_global(c, n, m.fn, &A) : c->failed ? UNDEF
            : rfail(c, n->line, "'%s' object is not callable", type_name(m));
        vfree(m);
    }
    args_free(&A);
    return r;
}

static val arith(struct rctx *c, int line, int op, val a, val b)
{
    if (is_undef(a)) return undefined_error(c, line, a);
    if (is_undef(b)) return undefined_error(c, line, b);
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    json_t *x = a.j, *y = b.j;
    if (!x || !y) goto bad;
    if (op == OP_ADD && json_is_string(x) && json_is_string(y)) {
        struct buf r = {0};
        bput(&r, json_string_value(x), json_string_length(x));
        bput(&r, json_string_value(y), json_string_length(y));
        if (!r.p) bputs(&r, "");
        return V(jbuf(&r));
    }
    if (op == OP_ADD && json_is_array(x) && json_is_array(y)) {
        json_t *r = json_copy(x);
        json_array_extend(r, y);
        return V(r);
    }
    if (op == OP_MUL && (json_is_string(x) || json_is_array(x)) && is_intlike(y)) {
        json_int_t k = ival(y);
        if (json_is_array(x)) {
            json_t *r = json_array();
            for (json_int_t i = 0; i < k; i++) json_array_extend(r, x);
            return V(r);
        }
        struct buf r = {0};
        bputs(&r, "");
        for (json_int_t i = 0; i < k && r.n < (1u << 26); i++) bput(&r, json_string_value(x), json_string_length(x));
        return V(jbuf(&r));
    }
    if (!is_num(x) || !is_num(y)) goto bad;
    if (is_intlike(x) && is_intlike(y) && op != OP_DIV) {
        json_int_t p = ival(x), q = ival(y), r;
        /* Python's ints do not overflow; past 64 bits these become floats */
        switch (op) {
        case OP_ADD: if (!__builtin_add_overflow(p, q, &r)) return V(json_integer(r)); break;
        case OP_SUB: if (!__builtin_sub_overflow(p, q, &r)) return V(json_integer(r)); break;
        case OP_MUL: if (!__builtin_mul_overflow(p, q, &r)) return V(json_integer(r)); break;
        case OP_FLOORDIV: case OP_MOD: {
            if (q == 0) return rfail(c, line, "integer division or modulo by zero");
            if (q == -1) { if (op == OP_MOD) return V(json_integer(0)); if (p != INT64_MIN) return V(json_integer(-p)); break; }
            json_int_t d = p / q, m = p % q;
            if (m && ((m < 0) != (q < 0))) { d--; m += q; }
            return V(json_integer(op == OP_MOD ? m : d));
        }
        case OP_POW: {
            if (q < 0) break;
            if (p == 0 || p == 1) return V(json_integer(q == 0 ? 1 : p));
            if (p == -1) return V(json_integer(q % 2 ? -1 : 1));
            bool over = false; /* |p| >= 2 overflows within 63 steps */
            r = 1;
            for (json_int_t i = 0; i < q && !over; i++) over = __builtin_mul_overflow(r, p, &r);
            if (!over) return V(json_integer(r));
            break;
        }
        }
    }
    double p = num(x), q = num(y);
    switch (op) {
    case OP_ADD: return V(json_real(p + q));
    case OP_SUB: return V(json_real(p - q));
    case OP_MUL: return V(json_real(p * q));
    case OP_DIV: if (q == 0) return rfail(c, line, "division by zero"); return V(json_real(p / q));
    case OP_FLOORDIV: if (q == 0) return rfail(c, line, "float floor division by zero"); return V(json_real(floor(p / q)));
    case OP_MOD: {
        if (q == 0) return rfail(c, line, "float modulo");
        double m = fmod(p, q);
        if (m && ((m < 0) != (q < 0))) m += q;
        return V(json_real(m));
    }
    case OP_POW: return V(json_real(pow(p, q)));
    }
bad:
    return rfail(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", sym[op], type_name(a), type_name(b));
}

static bool contains(struct rctx *c, int line, val item, val seq)
{
    if (is_undef(seq)) { undefined_error(c, line, seq); return false; }
    if (seq.j && json_is_string(seq.j)) {
        if (!item.j || !json_is_string(item.j)) { rfail(c, line, "'in <string>' requires string as left operand, not %s", type_name(item)); return false; }
        size_t k = json_string_length(item.j);
        return !k || memmem(json_string_value(seq.j), json_string_length(seq.j), json_string_value(item.j), k);
    }
    if (seq.j && json_is_array(seq.j)) {
        for (size_t i = 0; i < json_array_size(seq.j); i++) if (item.j && jeq(item.j, json_array_get(seq.j, i))) return true;
        return false;
    }
    if (seq.j && json_is_object(seq.j)) return item.j && json_is_string(item.j) && json_object_get(seq.j, json_string_value(item.j));
    rfail(c, line, "argument of type '%s' is not iterable", type_name(seq));
    return false;
}

static __attribute__((noinline)) val ev_bin(struct rctx *c, const node *n)
{
    val a = ev(c, n->kid[0]);
    if (c->failed) return UNDEF;
    val b = ev(c, n->kid[1]);
    if (c->failed) { vfree(a); return UNDEF; }
    val r;
    switch (n->op) {
    case OP_CONCAT: {
        struct buf s = {0};
        bputs(&s, "");
        vstr(&s, a); vstr(&s, b);
        r = V(jbuf(&s));
        break;
    }
    case OP_EQ: r = V(json_boolean(veq(a, b))); break;
    case OP_NE: r = V(json_boolean(!veq(a, b))); break;
    case OP_LT: case OP_LE: case OP_GT: case OP_GE: {
        int k = a.j && b.j ? jcmp(a.j, b.j) : 2;
        if (k == 2) { r = rfail(c, n->line, "'%s' not supported between instances of '%s' and '%s'",
                                n->op == OP_LT ? "<" : n->op == OP_LE ? "<=" : n->op == OP_GT ? ">" : ">=",
                                type_name(a), type_name(b)); break; }
        bool t = n->op == OP_LT ? k < 0 : n->op == OP_LE ? k <= 0 : n->op == OP_GT ? k > 0 : k >= 0;
        r = V(json_boolean(t));
        break;
    }
    case OP_IN: case OP_NOTIN: {
        bool t = contains(c, n->line, a, b);
        r = c->failed ? UNDEF : V(json_boolean(n->op == OP_IN ? t : !t));
        break;
    }
    default: r = arith(c, n->line, n->op, a, b); break;
    }
    vfree(a); vfree(b);
    return r;
}

/* x | filter(args), x is test(args): apart from ev, whose stack frame stays small */
static __attribute__((noinline)) val ev_filter_test(struct rctx *c, const node *n)
{
    val x = ev(c, n->kid[0]);
    struct args A;
    if (c->failed || !eval_args(c, n, 1, &A)) { vfree(x); return UNDEF; }
    val r;
    if (n->kind == N_FILTER) r = apply_filter(c, n, x, &A);
    else {
        bool t = apply_test(c, n, n->op, x, &A);
        r = c->failed ? UNDEF : V(json_boolean(t != n->flag));
    }
    vfree(x);
    args_free(&A);
    return r;
}

static val ev1(struct rctx *c, const node *n);

/* The value of expression n; UNDEF (owning nothing) once rendering failed. */
static val ev(struct rctx *c, const node *n)
{
    if (c->failed) return UNDEF;
    val r = ev1(c, n);
    if (c->failed) { vfree(r); return UNDEF; }
    return r;
}

static val ev1(struct rctx *c, const node *n)
{
    switch (n->kind) {
    case N_LIT: return VREF(n->lit);
    case N_NAME: return lookup(c, n->name);
    case N_ATTR: {
        val o = ev(c, n->kid[0]);
        if (c->failed) return UNDEF;
        val r = getattr_(c, n->line, o, n->name);
        vfree(o);
        return r;
    }
    case N_ITEM: {
        val o = ev(c, n->kid[0]), k = ev(c, n->kid[1]);
        val r = c->failed ? UNDEF : getitem(c, n->line, o, k);
        if (is_undef(r) && n->kid[1]->kind == N_LIT && json_is_string(n->kid[1]->lit)) r.what = json_string_value(n->kid[1]->lit);
        vfree(o); vfree(k);
        return r;
    }
    case N_SLICE: {
        val o = ev(c, n->kid[0]);
        val p[3] = {UNDEF, UNDEF, UNDEF};
        for (int i = 0; i < 3; i++) if (n->kid[1 + i]) p[i] = ev(c, n->kid[1 + i]);
        val r = c->failed ? UNDEF : do_slice(c, n->line, o, p[0], p[1], p[2]);
        vfree(o);
        for (int i = 0; i < 3; i++) vfree(p[i]);
        return r;
    }
    case N_CALL: return ev_call(c, n);
    case N_FILTER: case N_TEST: return ev_filter_test(c, n);
    case N_NEG: {
        val x = ev(c, n->kid[0]);
        if (c->failed) return UNDEF;
        val r = !x.j || !is_num(x.j) ? rfail(c, n->line, "bad operand type for unary -: '%s'", type_name(x))
                : is_intlike(x.j) && ival(x.j) != INT64_MIN ? V(json_integer(-ival(x.j))) : V(json_real(-num(x.j)));
        vfree(x);
        return r;
    }
    case N_NOT: {
        val x = ev(c, n->kid[0]);
        bool t = truthy(x);
        vfree(x);
        return c->failed ? UNDEF : V(json_boolean(!t));
    }
    case N_AND: case N_OR: {
        val a = ev(c, n->kid[0]);
        if (c->failed) return UNDEF;
        if (truthy(a) == (n->kind == N_OR)) return a;
        vfree(a);
        return ev(c, n->kid[1]);
    }
    case N_BIN: return ev_bin(c, n);
    case N_COND: {
        val k = ev(c, n->kid[0]);
        bool t = truthy(k);
        vfree(k);
        if (c->failed) return UNDEF;
        if (t) return ev(c, n->kid[1]);
        return n->kid[2] ? ev(c, n->kid[2]) : undef("conditional expression");
    }
    case N_LIST: {
        json_t *a = json_array();
        for (size_t i = 0; i < n->nkid && !c->failed; i++) {
            val v = ev(c, n->kid[i]);
            json_array_append_new(a, v.j ? v.j : json_null());
        }
        return V(a);
    }
    case N_DICT: {
        json_t *o = json_object();
        for (size_t i = 0; i + 1 < n->nkid && !c->failed; i += 2) {
            val k = ev(c, n->kid[i]), v = ev(c, n->kid[i + 1]);
            if (!c->failed && (!k.j || !json_is_string(k.j))) rfail(c, n->line, "dict keys must be strings here");
            if (!c->failed) json_object_set(o, json_string_value(k.j), v.j ? v.j : json_null());
            vfree(k); vfree(v);
        }
        return V(o);
    }
    default:
        return rfail(c, n->line, "not an expression");
    }
}

/* ---- filters */

static json_int_t vlen(val v)
{
    if (!v.j) return 0;
    if (json_is_string(v.j)) return (json_int_t)cp_count(json_string_value(v.j), json_string_length(v.j));
    if (json_is_array(v.j)) return (json_int_t)json_array_size(v.j);
    if (json_is_object(v.j)) return (json_int_t)json_object_size(v.j);
    return -1;
}

/* attribute "a.b" of item (dots: nested) */
static json_t *attr_path(json_t *item, const char *path)
{
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s", path);
    json_t *v = item;
    for (char *save, *p = strtok_r(tmp, ".", &save); p && v; p = strtok_r(NULL, ".", &save))
        v = json_is_array(v) && *p >= '0' && *p <= '9' ? json_array_get(v, (size_t)atoi(p)) : json_object_get(v, p);
    return v;
}

struct sort_ctx { const char *attr; bool cs; };
static __thread struct sort_ctx sort_ctx_;
static int sort_cmp(const void *pa, const void *pb)
{
    json_t *a = *(json_t *const *)pa, *b = *(json_t *const *)pb;
    if (sort_ctx_.attr) { a = attr_path(a, sort_ctx_.attr); b = attr_path(b, sort_ctx_.attr); }
    if (!a || !b) return !a - !b;
    if (!sort_ctx_.cs && json_is_string(a) && json_is_string(b)) {
        int r = strcasecmp(json_string_value(a), json_string_value(b));
        if (r) return r;
    }
    int k = jcmp(a, b);
    return k == 2 ? 0 : k;
}

static val apply_filter(struct rctx *c, const node *n, val x, struct args *A)
{
    int line = n->line;
    int id = n->op;
    if (is_undef(x) && id != F_DEFAULT && id != F_LENGTH && id != F_STRING && id != F_TRIM && id != F_LIST &&
        id != F_ITEMS && id != F_JOIN && id != F_FIRST && id != F_LAST && id != F_SAFE && id != F_UPPER && id != F_LOWER)
        return undefined_error(c, line, x);
    switch (id) {
    case F_TRIM: {
        val s = vstring(x), ch = arg(A, 0, "chars");
        const char *p = json_string_value(s.j), *set = NULL;
        size_t l = json_string_length(s.j), sn = 0;
        if (ch.j && !json_is_null(ch.j) && !arg_str(c, line, ch, "trim's chars", &set, &sn)) { vfree(s); return UNDEF; }
        py_strip(&p, &l, true, true, set, sn);
        val r = V(jstr(p, l));
        vfree(s);
        return r;
    }
    case F_TOJSON: {
        if (!x.j) return rfail(c, line, "Object of type %s is not JSON serializable", type_name(x));
        val ind = arg(A, 0, "indent"), asc = kwarg(A, "ensure_ascii"), sk = kwarg(A, "sort_keys"), sep = kwarg(A, "separators");
        struct json_fmt f = {.indent = ind.j && is_intlike(ind.j) ? (int)ival(ind.j) : -1, .ascii = truthy(asc),
                             .sort = truthy(sk)};
        f.item_sep = f.indent >= 0 ? "," : ", ";
        f.key_sep = ": ";
        if (sep.j && json_is_array(sep.j) && json_array_size(sep.j) == 2) {
            f.item_sep = json_string_value(json_array_get(sep.j, 0));
            f.key_sep = json_string_value(json_array_get(sep.j, 1));
            if (!f.item_sep || !f.key_sep) return rfail(c, line, "tojson: separators must be two strings");
        }
        struct buf b = {0};
        bputs(&b, "");
        json_dump(&b, x.j, &f, 0);
        return V(jbuf(&b));
    }
    case F_LENGTH: {
        json_int_t k = vlen(x);
        if (k < 0) return rfail(c, line, "object of type '%s' has no len()", type_name(x));
        return V(json_integer(k));
    }
    case F_ITEMS: {
        if (is_undef(x)) return V(json_array());
        if (!json_is_object(x.j)) return rfail(c, line, "items: '%s' is not a mapping", type_name(x));
        bool h;
        return call_method(c, n, x, "items", A, &h);
    }
    case F_JOIN: {
        json_t *items = iter_items(c, line, x);
        if (!items) return UNDEF;
        val sep = arg(A, 0, "d"), at = arg(A, 1, "attribute");
        struct buf b = {0};
        bputs(&b, "");
        for (size_t i = 0; i < json_array_size(items); i++) {
            if (i && sep.j) py_str(&b, sep.j);
            json_t *it = json_array_get(items, i);
            if (at.j) it = json_is_string(at.j) ? attr_path(it, json_string_value(at.j)) : NULL;
            if (it) py_str(&b, it);
        }
        json_decref(items);
        return V(jbuf(&b));
    }
    case F_UPPER: case F_LOWER: case F_CAPITALIZE: case F_TITLE: {
        val s = vstring(x);
        val r = str_upper_lower(json_string_value(s.j), json_string_length(s.j),
                                id == F_LOWER ? 0 : id == F_UPPER ? 1 : id == F_CAPITALIZE ? 2 : 3);
        vfree(s);
        return r;
    }
    case F_REPLACE: {
        val s = vstring(x);
        const char *a, *r; size_t an, rn;
        val out = UNDEF;
        val cnt = arg(A, 2, "count");
        if (arg_str(c, line, arg(A, 0, "old"), "replace's old", &a, &an) &&
            arg_str(c, line, arg(A, 1, "new"), "replace's new", &r, &rn))
            out = str_replace(json_string_value(s.j), json_string_length(s.j), a, an, r, rn,
                              cnt.j && is_intlike(cnt.j) ? ival(cnt.j) : -1);
        vfree(s);
        return out;
    }
    case F_DEFAULT: {
        val d = arg(A, 0, "default_value");
        bool boolean = truthy(arg(A, 1, "boolean"));
        if (is_undef(x) || (boolean && !truthy(x))) return d.j ? VREF(d.j) : d.mac ? d : V(json_string(""));
        return x.j ? VREF(x.j) : x;
    }
    case F_FIRST: case F_LAST: {
        if (is_undef(x)) return undef("first");
        json_t *items = iter_items(c, line, x);
        if (!items) return UNDEF;
        size_t k = json_array_size(items);
        val r = k ? VREF(json_array_get(items, id == F_FIRST ? 0 : k - 1)) : undef(id == F_FIRST ? "first" : "last");
        json_decref(items);
        return r;
    }
    case F_LIST: { json_t *items = iter_items(c, line, x); return items ? V(items) : UNDEF; }
    case F_STRING: case F_SAFE: return x.j && json_is_string(x.j) ? VREF(x.j) : vstring(x);
    case F_ESCAPE: {
        val s = vstring(x);
        struct buf b = {0};
        bputs(&b, "");
        const char *p = json_string_value(s.j);
        for (size_t i = 0; i < json_string_length(s.j); i++) {
            switch (p[i]) {
            case '&': bputs(&b, "&amp;"); break;
            case '<': bputs(&b, "&lt;"); break;
            case '>': bputs(&b, "&gt;"); break;
            case '"': bputs(&b, "&#34;"); break;
            case '\'': bputs(&b, "&#39;"); break;
            default: bputc(&b, p[i]);
            }
        }
        vfree(s);
        return V(jbuf(&b));
    }
    case F_INT: case F_FLOAT: {
        double d;
        if (is_num(x.j)) d = num(x.j);
        else if (json_is_string(x.j)) {
            char *e;
            d = strtod(json_string_value(x.j), &e);
            if (*e || e == json_string_value(x.j)) {
                val def = arg(A, 0, "default");
                return def.j ? VREF(def.j) : id == F_INT ? V(json_integer(0)) : V(json_real(0));
            }
        } else d = 0;
        return id == F_INT ? V(json_integer(is_intlike(x.j) ? ival(x.j) : (json_int_t)d)) : V(json_real(d));
    }
    case F_ABS:
        if (!is_num(x.j)) return rfail(c, line, "bad operand type for abs(): '%s'", type_name(x));
        return is_intlike(x.j) && ival(x.j) != INT64_MIN ? V(json_integer(llabs((long long)ival(x.j)))) : V(json_real(fabs(num(x.j))));
    case F_ROUND: {
        if (!is_num(x.j)) return rfail(c, line, "round: '%s' is not a number", type_name(x));
        val pr = arg(A, 0, "precision"), me = arg(A, 1, "method");
        double p = pow(10, pr.j && is_intlike(pr.j) ? (double)ival(pr.j) : 0), v = num(x.j) * p;
        const char *m = me.j && json_is_string(me.j) ? json_string_value(me.j) : "common";
        v = !strcmp(m, "floor") ? floor(v) : !strcmp(m, "ceil") ? ceil(v) : nearbyint(v); /* Python: half to even */
        return V(json_real(v / p));
    }
    case F_INDENT: {
        val s = vstring(x), w = arg(A, 0, "width");
        bool first = truthy(arg(A, 1, "first")), blank = truthy(arg(A, 2, "blank"));
        struct buf pad = {0}, b = {0};
        bputs(&pad, ""); bputs(&b, "");
        if (w.j && json_is_string(w.j)) bputs(&pad, json_string_value(w.j));
        else for (json_int_t i = 0; i < (w.j && is_intlike(w.j) ? ival(w.j) : 4); i++) bputc(&pad, ' ');
        const char *p = json_string_value(s.j), *e = p + json_string_length(s.j);
        for (bool line0 = true; p <= e; line0 = false) {
            const char *nl = memchr(p, '\n', (size_t)(e - p));
            size_t l = nl ? (size_t)(nl - p) : (size_t)(e - p);
            if ((!line0 || first) && (blank || l)) bput(&b, pad.p, pad.n);
            bput(&b, p, l);
            if (!nl) break;
            bputc(&b, '\n');
            p = nl + 1;
        }
        free(pad.p);
        vfree(s);
        return V(jbuf(&b));
    }
    case F_MAP: case F_SELECT: case F_REJECT: case F_SELECTATTR: case F_REJECTATTR: {
        json_t *items = iter_items(c, line, x);
        if (!items) return UNDEF;
        json_t *r = json_array();
        val at = id == F_MAP ? kwarg(A, "attribute") : id >= F_SELECTATTR ? arg(A, 0, NULL) : UNDEF;
        size_t tpos = id >= F_SELECTATTR ? 1 : 0;
        val tname = id == F_MAP ? arg(A, 0, NULL) : arg(A, tpos, NULL);
        int tid = -1;
        if (tname.j && json_is_string(tname.j)) {
            tid = id == F_MAP ? filter_lookup(json_string_value(tname.j)) : test_lookup(json_string_value(tname.j));
            if (tid < 0) { json_decref(items); json_decref(r); return rfail(c, line, "no %s named '%s'", id == F_MAP ? "filter" : "test", json_string_value(tname.j)); }
        }
        if (id >= F_SELECTATTR && !(at.j && json_is_string(at.j))) { json_decref(items); json_decref(r); return rfail(c, line, "%s needs an attribute name", n->name); }
        struct args B = {0};
        for (size_t i = tpos + 1; i < A->n && B.n < 16; i++) B.a[B.n++] = A->a[i];
        for (size_t i = 0; i < json_array_size(items) && !c->failed; i++) {
            json_t *it = json_array_get(items, i);
            json_t *subj = at.j && json_is_string(at.j) ? attr_path(it, json_string_value(at.j)) : it;
            val sv = subj ? (val){subj, NULL, NULL, NULL, NULL} : undef("attribute");
            if (id == F_MAP) {
                if (tid >= 0) {
                    node fake = *n;
                    fake.op = tid;
                    val m = apply_filter(c, &fake, sv, &B);
                    json_array_append_new(r, m.j ? m.j : json_null());
                } else {
                    json_array_append(r, subj ? subj : json_null());
                }
                continue;
            }
            bool t = tid >= 0 ? apply_test(c, n, tid, sv, &B) : truthy(sv);
            if (t == (id == F_SELECT || id == F_SELECTATTR)) json_array_append(r, it);
        }
        json_decref(items);
        if (c->failed) { json_decref(r); return UNDEF; }
        return V(r);
    }
    case F_REVERSE: {
        if (x.j && json_is_string(x.j)) {
            val neg = V(json_integer(-1));
            val r = do_slice(c, line, x, UNDEF, UNDEF, neg);
            vfree(neg);
            return r;
        }
        json_t *items = iter_items(c, line, x);
        if (!items) return UNDEF;
        json_t *r = json_array();
        for (size_t i = json_array_size(items); i-- > 0;) json_array_append(r, json_array_get(items, i));
        json_decref(items);
        return V(r);
    }
    case F_SORT: case F_UNIQUE: case F_DICTSORT: case F_MIN: case F_MAX: {
        json_t *items;
        if (id == F_DICTSORT) {
            if (!json_is_object(x.j)) return rfail(c, line, "dictsort: '%s' is not a mapping", type_name(x));
            bool h;
            val it = call_method(c, n, x, "items", A, &h);
            items = it.j;
        } else if (!(items = iter_items(c, line, x))) return UNDEF;
        size_t k = json_array_size(items);
        json_t **v = xmalloc((k ? k : 1) * sizeof *v);
        for (size_t i = 0; i < k; i++) v[i] = json_array_get(items, i);
        val at = kwarg(A, "attribute");
        sort_ctx_ = (struct sort_ctx){at.j && json_is_string(at.j) ? json_string_value(at.j) : id == F_DICTSORT ? "0" : NULL,
                                      truthy(arg(A, id == F_SORT ? 1 : 0, "case_sensitive"))};
        val r = UNDEF;
        if (id == F_MIN || id == F_MAX) {
            size_t best = 0;
            for (size_t i = 1; i < k; i++) {
                int cmp = sort_cmp(&v[i], &v[best]);
                if (id == F_MIN ? cmp < 0 : cmp > 0) best = i;
            }
            r = k ? VREF(v[best]) : undef(id == F_MIN ? "min" : "max");
        } else if (id == F_UNIQUE) {
            json_t *o = json_array();
            for (size_t i = 0; i < k; i++) {
                bool seen = false;
                for (size_t j = 0; j < json_array_size(o) && !seen; j++) seen = sort_cmp(&v[i], &(json_t *){json_array_get(o, j)}) == 0;
                if (!seen) json_array_append(o, v[i]);
            }
            r = V(o);
        } else {
            /* a stable insertion sort (Python's sort is stable) */
            for (size_t i = 1; i < k; i++)
                for (size_t j = i; j > 0 && sort_cmp(&v[j - 1], &v[j]) > 0; j--) { json_t *t = v[j]; v[j] = v[j - 1]; v[j - 1] = t; }
            bool rev = id == F_SORT && truthy(arg(A, 0, "reverse"));
            json_t *o = json_array();
            for (size_t i = 0; i < k; i++) json_array_append(o, v[rev ? k - 1 - i : i]);
            r = V(o);
        }
        free(v);
        json_decref(items);
        return r;
    }
    case F_SUM: {
        json_t *items = iter_items(c, line, x);
        if (!items) return UNDEF;
        val at = arg(A, 0, "attribute"), st = arg(A, 1, "start");
        val acc = st.j ? VREF(st.j) : V(json_integer(0));
        for (size_t i = 0; i < json_array_size(items) && !c->failed; i++) {
            json_t *it = json_array_get(items, i);
            if (at.j && json_is_string(at.j)) it = attr_path(it, json_string_value(at.j));
            val s = arith(c, line, OP_ADD, acc, it ? (val){it, NULL, NULL, NULL, NULL} : undef("attribute"));
            vfree(acc);
            acc = s;
        }
        json_decref(items);
        return acc;
    }
    case F_STARTSWITH: case F_ENDSWITH: {
        if (!x.j || !json_is_string(x.j)) return rfail(c, line, "%s: '%s' is not a string", n->name, type_name(x));
        val p = arg(A, 0, "prefix");
        if (!p.j || !(json_is_string(p.j) || json_is_array(p.j))) return rfail(c, line, "%s takes a string", n->name);
        return V(json_boolean(str_starts(json_string_value(x.j), json_string_length(x.j), p.j, id == F_ENDSWITH)));
    }
    case F_WORDCOUNT: {
        val s = vstring(x);
        val parts = str_split(json_string_value(s.j), json_string_length(s.j), NULL, 0, -1);
        val r = V(json_integer((json_int_t)json_array_size(parts.j)));
        vfree(parts); vfree(s);
        return r;
    }
    }
    return rfail(c, line, "filter '%s' not implemented", n->name);
}

static bool apply_test(struct rctx *c, const node *n, int id, val x, struct args *A)
{
    val a = arg(A, 0, NULL);
    json_t *j = x.j;
    switch (id) {
    case X_DEFINED: return !is_undef(x);
    case X_UNDEFINED: return is_undef(x);
    case X_NONE: return j && json_is_null(j);
    case X_STRING: return j && json_is_string(j);
    case X_MAPPING: return j && json_is_object(j);
    case X_SEQUENCE: return j && (json_is_string(j) || json_is_array(j) || json_is_object(j));
    case X_ITERABLE: return is_undef(x) || (j && (json_is_string(j) || json_is_array(j) || json_is_object(j)));
    case X_NUMBER: return j && is_num(j);
    case X_INTEGER: return j && json_is_integer(j);
    case X_FLOAT: return j && json_is_real(j);
    case X_BOOLEAN: return j && json_is_boolean(j);
    case X_TRUE: return j && json_is_true(j);
    case X_FALSE: return j && json_is_false(j);
    case X_CALLABLE: return x.mac || x.fn;
    case X_EQ: return veq(x, a);
    case X_NE: return !veq(x, a);
    case X_LT: case X_LE: case X_GT: case X_GE: {
        int k = j && a.j ? jcmp(j, a.j) : 2;
        if (k == 2) { rfail(c, n->line, "'%s' not supported between '%s' and '%s'", n->name, type_name(x), type_name(a)); return false; }
        return id == X_LT ? k < 0 : id == X_LE ? k <= 0 : id == X_GT ? k > 0 : k >= 0;
    }
    case X_IN: return contains(c, n->line, x, a);
    case X_ODD: case X_EVEN: case X_DIVISIBLEBY: {
        if (!j || !is_intlike(j)) { rfail(c, n->line, "test '%s' needs an integer, not %s", n->name, type_name(x)); return false; }
        json_int_t v = ival(j);
        if (id == X_DIVISIBLEBY) {
            if (!a.j || !is_intlike(a.j) || !ival(a.j)) { rfail(c, n->line, "divisibleby needs a non-zero integer"); return false; }
            return v % ival(a.j) == 0;
        }
        return (v % 2 != 0) == (id == X_ODD);
    }
    case X_LOWER: case X_UPPER: {
        if (!j || !json_is_string(j)) return false;
        val o = str_upper_lower(json_string_value(j), json_string_length(j), id == X_LOWER ? 0 : 1);
        bool r = jeq(o.j, j);
        vfree(o);
        return r;
    }
    }
    rfail(c, n->line, "test '%s' not implemented", n->name);
    return false;
}

/* ---- statements */

#define MAX_STEPS 10000000ul
#define MAX_OUTPUT (1ul << 30)

/* Does v hold x (or is it x)? Namespaces are the only mutable values: storing one in itself would be a cycle. */
static bool holds(const json_t *v, const json_t *x, int depth)
{
    if (v == x) return true;
    if (depth > 64) return true; /* deeper than any template data: refuse */
    size_t i; const char *k; json_t *e;
    if (json_is_array(v)) json_array_foreach(v, i, e) if (holds(e, x, depth + 1)) return true;
    if (json_is_object(v)) json_object_foreach((json_t *)v, k, e) if (holds(e, x, depth + 1)) return true;
    return false;
}

static void assign_targets(struct rctx *c, const node *n, char **tgt, size_t ntgt, val v)
{
    if (ntgt == 1) { assign(c, tgt[0], v); return; }
    json_t *items = v.j && json_is_array(v.j) ? v.j : NULL;
    if (!items || json_array_size(items) != ntgt) {
        rfail(c, n->line, "cannot unpack %s into %zu names", items ? "a list of another length" : type_name(v), ntgt);
        return;
    }
    for (size_t i = 0; i < ntgt; i++) assign(c, tgt[i], V(json_array_get(items, i)));
}

static __attribute__((noinline)) void exec_for(struct rctx *c, const node *n)
{
    val it = ev(c, n->kid[0]);
    if (c->failed) return;
    json_t *items = iter_items(c, n->line, it);
    vfree(it);
    if (!items) return;
    struct scope *outer = c->sc;
    if (n->kid[3]) { /* {% for x in xs if cond %}: loop.* counts the kept items */
        json_t *kept = json_array();
        for (size_t i = 0; i < json_array_size(items) && !c->failed; i++) {
            struct scope s = {.up = outer};
            c->sc = &s;
            assign_targets(c, n, n->tgt, n->ntgt, V(json_array_get(items, i)));
            val k = ev(c, n->kid[3]);
            if (truthy(k)) json_array_append(kept, json_array_get(items, i));
            vfree(k);
            c->sc = outer;
            scope_free(&s);
        }
        json_decref(items);
        items = kept;
    }
    size_t len = json_array_size(items);
    for (size_t i = 0; i < len && !c->failed; i++) {
        if (++c->steps > MAX_STEPS) { rfail(c, n->line, "the template runs too long (over %lu statements)", MAX_STEPS); break; }
        struct loopinfo li = {items, i, len};
        struct scope s = {.loop = &li, .up = outer};
        c->sc = &s;
        assign_targets(c, n, n->tgt, n->ntgt, V(json_array_get(items, i)));
        if (!c->failed) exec_body(c, n->kid[1]);
        c->sc = outer;
        scope_free(&s);
        int ctl = c->ctl;
        c->ctl = 0;
        if (ctl == 1) break;
    }
    json_decref(items);
    if (!len && n->kid[2] && !c->failed) exec_body(c, n->kid[2]);
}

/* {{ a + b + c }} with only strings: appended as they come, without the intermediate strings (else false: the
 * caller evaluates it). */
static __attribute__((noinline)) bool emit_concat(struct rctx *c, const node *n)
{
    const node *leaf[32];
    size_t k = 0;
    const node *x = n;
    while (x->kind == N_BIN && x->op == OP_ADD && k < 31) { leaf[k++] = x->kid[1]; x = x->kid[0]; }
    if (k == 0 || (x->kind == N_BIN && x->op == OP_ADD)) return false;
    leaf[k++] = x;
    val v[32];
    size_t i;
    for (i = 0; i < k; i++) {
        v[i] = ev(c, leaf[k - 1 - i]);
        if (c->failed || !v[i].j || !json_is_string(v[i].j)) { i++; break; }
    }
    bool all = i == k && !c->failed && v[k - 1].j && json_is_string(v[k - 1].j);
    if (all)
        for (size_t j = 0; j < k; j++) bput(&c->out, json_string_value(v[j].j), json_string_length(v[j].j));
    for (size_t j = 0; j < i; j++) vfree(v[j]);
    return all || c->failed;
}

static void exec_stmt(struct rctx *c, const node *n)
{
    if (++c->steps > MAX_STEPS || c->out.n > MAX_OUTPUT) {
        rfail(c, n->line, "the template runs too long (over %lu statements or %lu bytes of output)", MAX_STEPS, MAX_OUTPUT);
        return;
    }
    switch (n->kind) {
    case N_TEXT: bput(&c->out, n->name, n->len); return;
    case N_OUT: {
        if (emit_concat(c, n->kid[0])) return;
        val v = ev(c, n->kid[0]);
        if (!c->failed) vstr(&c->out, v);
        vfree(v);
        return;
    }
    case N_BODY: exec_body(c, n); return;
    case N_IF:
        for (size_t i = 0; i + 1 < n->nkid; i += 2) {
            val k = ev(c, n->kid[i]);
            bool t = truthy(k);
            vfree(k);
            if (c->failed) return;
            if (t) { exec_body(c, n->kid[i + 1]); return; }
        }
        if (n->flag) exec_body(c, n->kid[n->nkid - 1]);
        return;
    case N_FOR: exec_for(c, n); return;
    case N_SET: {
        val v = ev(c, n->kid[0]);
        if (c->failed) return;
        if (n->name) { /* ns.attr = v */
            val o = lookup(c, n->tgt[0]);
            bool ok = false;
            for (size_t i = 0; o.j && i < c->nns; i++) ok |= c->ns[i] == o.j;
            if (!ok) rfail(c, n->line, "cannot assign attribute on non-namespace object '%s'", n->tgt[0]);
            else if (v.j && holds(v.j, o.j, 0)) rfail(c, n->line, "cannot store namespace '%s' inside itself", n->tgt[0]);
            else json_object_set(o.j, n->name, v.j ? v.j : json_null());
            vfree(o);
        } else {
            assign_targets(c, n, n->tgt, n->ntgt, v);
        }
        vfree(v);
        return;
    }
    case N_SETBLOCK: {
        struct buf saved = c->out;
        memset(&c->out, 0, sizeof c->out);
        bputs(&c->out, "");
        c->capture++;
        exec_body(c, n->kid[0]);
        c->capture--;
        struct buf r = c->out;
        c->out = saved;
        val v = V(jbuf(&r));
        assign(c, n->tgt[0], v);
        vfree(v);
        return;
    }
    case N_MACRO: assign(c, n->name, (val){NULL, n, NULL, NULL, NULL}); return;
    case N_BREAK: c->ctl = 1; return;
    case N_CONTINUE: c->ctl = 2; return;
    case N_GENERATION: {
        size_t start = c->out.n;
        exec_body(c, n->kid[0]);
        if (c->capture || c->failed) return;
        if (c->ngen + 2 > c->gencap) {
            c->gencap = c->gencap ? 2 * c->gencap : 16;
            c->gen = xrealloc(c->gen, c->gencap * sizeof *c->gen);
        }
        c->gen[c->ngen++] = start;
        c->gen[c->ngen++] = c->out.n;
        return;
    }
    default: rfail(c, n->line, "not a statement"); return;
    }
}

static void exec_body(struct rctx *c, const node *n)
{
    for (size_t i = 0; i < n->nkid && !c->failed && !c->ctl; i++) exec_stmt(c, n->kid[i]);
}

int jinja_render_spans(const jinja_template *t, const json_t *vars, char **out, size_t *len, size_t **spans,
                       size_t *n_spans, errbuf *err)
{
    *out = NULL;
    if (len) *len = 0;
    if (spans) *spans = NULL;
    if (n_spans) *n_spans = 0;
    struct scope caller = {.ro = vars}, global = {.up = &caller};
    struct rctx c = {.t = t, .err = err, .global = &global, .sc = &global};
    bputs(&c.out, "");
    exec_body(&c, t->root);
    scope_free(&global);
    for (size_t i = 0; i < c.nns; i++) json_decref(c.ns[i]);
    free(c.ns);
    free(c.macros);
    if (c.failed) { free(c.out.p); free(c.gen); return -EINVAL; }
    *out = c.out.p;
    if (len) *len = c.out.n;
    if (spans) { *spans = c.gen; *n_spans = c.ngen / 2; }
    else free(c.gen);
    return 0;
}

int jinja_render(const jinja_template *t, const json_t *vars, char **out, size_t *len, errbuf *err)
{
    return jinja_render_spans(t, vars, out, len, NULL, NULL, err);
}

bool jinja_has_generation(const jinja_template *t) { return t->generation; }
