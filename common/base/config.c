#include "config.h"

#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const type_names[] = {"int", "double", "bool", "string", "int list", "enum"};

static int table_len(const config_field *table)
{
    int n = 0;
    while (table[n].name) n++;
    return n;
}

static size_t field_size(const config_field *f)
{
    switch (f->type) {
    case CONFIG_INT:
    case CONFIG_BOOL:
    case CONFIG_ENUM: return sizeof(int);
    case CONFIG_DOUBLE: return sizeof(double);
    case CONFIG_STRING: return CONFIG_STRING_MAX;
    case CONFIG_INT_LIST: return sizeof(config_int_list);
    }
    DF_ASSERT(!"unknown config type");
}

static int has_bounds(const config_field *f)
{
    return f->min < f->max;
}

static int field_matches(const config_field *f, const char *key)
{
    size_t sl = strlen(f->section);
    return strncmp(key, f->section, sl) == 0 && key[sl] == '.' && strcmp(key + sl + 1, f->name) == 0;
}

const config_field *config_find(const config_field *table, const char *key)
{
    for (const config_field *f = table; f->name; f++)
        if (field_matches(f, key)) return f;
    return NULL;
}

/* Strict integer: optional sign, decimal digits, nothing else, within int. */
static int parse_int(const char *s, int *out)
{
    while (*s == ' ' || *s == '\t') s++;
    if (!*s) return -1;
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    while (*end == ' ' || *end == '\t') end++;
    if (*end || errno == ERANGE || x < INT_MIN || x > INT_MAX) return -1;
    *out = (int)x;
    return 0;
}

static void format_double(char *buf, size_t n, double v);

static int bounds_check(const config_field *f, double x, char *why, size_t n)
{
    if (has_bounds(f) && !(x >= f->min && x <= f->max)) {
        char lo[32], hi[32];
        format_double(lo, sizeof lo, f->min);
        format_double(hi, sizeof hi, f->max);
        snprintf(why, n, "value %.17g out of range [%s, %s]", x, lo, hi);
        return -1;
    }
    return 0;
}

/* Parse a list "1, 2, 3" or "[1, 2, 3]" ("" and "[]" are empty). */
static int parse_list(const config_field *f, const char *s, config_int_list *out, char *why, size_t n)
{
    char buf[CONFIG_STRING_MAX * 4];
    if (strlen(s) >= sizeof buf) {
        snprintf(why, n, "list longer than %zu characters", sizeof buf - 1);
        return -1;
    }
    strcpy(buf, s);
    char *p = buf, *e = buf + strlen(buf);
    while (*p == ' ' || *p == '\t') p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t')) *--e = '\0';
    if (*p == '[') {
        if (e == p + 1 || e[-1] != ']') {
            snprintf(why, n, "missing closing ] in list \"%.64s\"", s);
            return -1;
        }
        *--e = '\0';
        p++;
    } else if (e > p && e[-1] == ']') {
        snprintf(why, n, "missing opening [ in list \"%.64s\"", s);
        return -1;
    }
    out->n = 0;
    const char *q = p;
    while (*q == ' ' || *q == '\t') q++;
    if (!*q) return 0;
    for (int i = 0;; i++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        if (i >= CONFIG_LIST_MAX) {
            snprintf(why, n, "more than %d elements", CONFIG_LIST_MAX);
            return -1;
        }
        const char *t = p;
        while (*t == ' ' || *t == '\t') t++;
        if (!*t) {
            snprintf(why, n, "element %d is empty", i);
            return -1;
        }
        int v;
        if (parse_int(p, &v)) {
            snprintf(why, n, "element %d: expected an integer, got \"%.64s\"", i, t);
            return -1;
        }
        char sub[200];
        if (bounds_check(f, v, sub, sizeof sub)) {
            snprintf(why, n, "element %d: %s", i, sub);
            return -1;
        }
        out->v[out->n++] = v;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}

/* The accepted names of an ENUM field, "a, b, c", into buf[n]. */
static void choices_format(const config_field *f, char *buf, size_t n)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; f->choices && f->choices[i] && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? ", " : "", f->choices[i]);
}

/* Parse value s into the storage dst of field f; on failure write the reason into why. */
static int value_parse(const config_field *f, const char *s, void *dst, char *why, size_t n)
{
    switch (f->type) {
    case CONFIG_INT: {
        int v;
        if (parse_int(s, &v)) {
            snprintf(why, n, "expected an integer, got \"%.64s\"", s);
            return -1;
        }
        if (bounds_check(f, v, why, n)) return -1;
        memcpy(dst, &v, sizeof v);
        return 0;
    }
    case CONFIG_DOUBLE: {
        char *end;
        while (*s == ' ' || *s == '\t') s++;
        errno = 0;
        double v = strtod(s, &end);
        while (*end == ' ' || *end == '\t') end++;
        if (!*s || *end) {
            snprintf(why, n, "expected a number, got \"%.64s\"", s);
            return -1;
        }
        if (!isfinite(v)) {
            snprintf(why, n, "expected a finite number, got \"%.64s\"", s);
            return -1;
        }
        if (bounds_check(f, v, why, n)) return -1;
        memcpy(dst, &v, sizeof v);
        return 0;
    }
    case CONFIG_BOOL: {
        static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
        for (int i = 0; i < 4; i++) {
            int v = -1;
            if (strcasecmp(s, yes[i]) == 0) v = 1;
            if (strcasecmp(s, no[i]) == 0) v = 0;
            if (v >= 0) {
                memcpy(dst, &v, sizeof v);
                return 0;
            }
        }
        snprintf(why, n, "expected true or false (yes/no, on/off, 1/0), got \"%.64s\"", s);
        return -1;
    }
    case CONFIG_STRING: {
        size_t len = strlen(s);
        if (len >= 2 && s[0] == '"' && s[len - 1] == '"') {
            s++;
            len -= 2;
        }
        if (len >= CONFIG_STRING_MAX) {
            snprintf(why, n, "value longer than %d characters", CONFIG_STRING_MAX - 1);
            return -1;
        }
        if (memchr(s, '\n', len)) {
            snprintf(why, n, "value contains a newline");
            return -1;
        }
        char *d = dst;
        memcpy(d, s, len);
        d[len] = '\0';
        return 0;
    }
    case CONFIG_INT_LIST: {
        config_int_list tmp;
        if (parse_list(f, s, &tmp, why, n)) return -1;
        memcpy(dst, &tmp, sizeof tmp);
        return 0;
    }
    case CONFIG_ENUM: {
        DF_ASSERT(f->choices && f->choices[0]);
        for (int v = 0; f->choices[v]; v++) {
            if (strcmp(s, f->choices[v]) == 0) {
                memcpy(dst, &v, sizeof v);
                return 0;
            }
        }
        char names[128];
        choices_format(f, names, sizeof names);
        snprintf(why, n, "expected one of %s; got \"%.64s\"", names, s);
        return -1;
    }
    }
    DF_ASSERT(!"unknown config type");
}

void config_defaults(const config_field *table, void *obj)
{
    for (const config_field *f = table; f->name; f++) {
        char *dst = (char *)obj + f->offset;
        memset(dst, 0, field_size(f));
        if (!f->default_value) continue;
        char why[256];
        if (value_parse(f, f->default_value, dst, why, sizeof why)) {
            fprintf(stderr, "config table: default of %s.%s: %s\n", f->section, f->name, why);
            DF_ASSERT(!"invalid default in config table");
        }
    }
}

/* Shortest %g that reads back to the same double; whole numbers plainly ("10", not %.1g's "1e+01"). */
static void format_double(char *buf, size_t n, double v)
{
    if (v == (double)(long long)v && v > -1e15 && v < 1e15) {
        snprintf(buf, n, "%lld", (long long)v);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static int value_format(const config_field *f, const void *src, char *buf, size_t n)
{
    int w = 0;
    switch (f->type) {
    case CONFIG_INT: {
        int v;
        memcpy(&v, src, sizeof v);
        w = snprintf(buf, n, "%d", v);
        break;
    }
    case CONFIG_DOUBLE: {
        double v;
        char tmp[40];
        memcpy(&v, src, sizeof v);
        format_double(tmp, sizeof tmp, v);
        w = snprintf(buf, n, "%s", tmp);
        break;
    }
    case CONFIG_BOOL: {
        int v;
        memcpy(&v, src, sizeof v);
        w = snprintf(buf, n, "%s", v ? "true" : "false");
        break;
    }
    case CONFIG_STRING:
        w = snprintf(buf, n, "%s", (const char *)src);
        break;
    case CONFIG_ENUM: {
        int v, k = 0;
        memcpy(&v, src, sizeof v);
        while (f->choices[k] && k < v) k++;
        DF_ASSERT(v >= 0 && k == v && f->choices[k]);
        w = snprintf(buf, n, "%s", f->choices[v]);
        break;
    }
    case CONFIG_INT_LIST: {
        const config_int_list *l = src;
        size_t off = 0;
        if (n) buf[0] = '\0';
        for (int i = 0; i < l->n && i < CONFIG_LIST_MAX; i++) {
            int k = snprintf(buf + (off < n ? off : n), off < n ? n - off : 0, "%s%d", i ? ", " : "", l->v[i]);
            off += (size_t)k;
        }
        w = (int)off;
        break;
    }
    }
    return (size_t)w < n ? 0 : -ERANGE;
}

int config_get(const config_field *table, const void *obj, const char *key, char *buf, size_t n)
{
    const config_field *f = config_find(table, key);
    if (!f) {
        if (n) buf[0] = '\0';
        return -ENOENT;
    }
    return value_format(f, (const char *)obj + f->offset, buf, n);
}

int config_set(const config_field *table, void *obj, const char *key, const char *value, const char *source,
               errbuf *err)
{
    const config_field *f = config_find(table, key);
    if (!f) return errbuf_set(err, ENOENT, "%s: %s: unknown key", source, key);
    char why[256];
    if (value_parse(f, value, (char *)obj + f->offset, why, sizeof why))
        return errbuf_set(err, EINVAL, "%s: %s: %s", source, key, why);
    return 0;
}

int config_arg_well_formed(const char *arg)
{
    const char *eq = strchr(arg, '=');
    return eq && eq != arg;
}

int config_set_arg(const config_field *table, void *obj, const char *arg, const char *source, errbuf *err)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg) return errbuf_set(err, EINVAL, "%s: \"%s\": expected section.key=value", source, arg);
    char key[256];
    size_t kl = (size_t)(eq - arg);
    if (kl >= sizeof key) return errbuf_set(err, EINVAL, "%s: \"%.64s...\": key too long", source, arg);
    memcpy(key, arg, kl);
    key[kl] = '\0';
    return config_set(table, obj, key, eq + 1, source, err);
}

/* ---- INI loading ---- */

struct load_ctx {
    const config_field *table;
    char *obj;            /* scratch copy written during the parse */
    const char *name;     /* file name for messages */
    const char *p;        /* reader position */
    int line;             /* current line (reader count) */
    int *seen;            /* line where each field was set, 0 if not yet */
    int err_line;         /* first error recorded by the reader or the handler */
    char err_msg[512];
};

static void load_error(struct load_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void load_error(struct load_ctx *c, const char *fmt, ...)
{
    if (c->err_line) return;
    c->err_line = c->line;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
}

/* fgets-style reader over the text: counts lines, drops leading blanks (so no line is a continuation line),
 * and flags lines longer than inih's buffer instead of letting them split. */
static char *load_reader(char *str, int num, void *stream)
{
    struct load_ctx *c = stream;
    if (!*c->p) return NULL;
    const char *nl = strchr(c->p, '\n');
    size_t len = nl ? (size_t)(nl - c->p) : strlen(c->p);
    const char *s = c->p;
    c->p += len + (nl ? 1 : 0);
    c->line++;
    while (len && (*s == ' ' || *s == '\t')) s++, len--;
    if (len > (size_t)num - 2) {
        load_error(c, "line longer than %d characters", num - 2);
        len = 0;
    }
    memcpy(str, s, len);
    str[len] = '\0';
    return str;
}

static int load_handler(void *user, const char *section, const char *name, const char *value)
{
    struct load_ctx *c = user;
    int sect_known = 0;
    for (int i = 0; c->table[i].name; i++) {
        const config_field *f = &c->table[i];
        if (strcmp(f->section, section) != 0) continue;
        sect_known = 1;
        if (strcmp(f->name, name) != 0) continue;
        if (c->seen[i]) {
            load_error(c, "%s.%s: given twice (first at line %d)", section, name, c->seen[i]);
            return 0;
        }
        c->seen[i] = c->line;
        char why[256];
        if (value_parse(f, value, c->obj + f->offset, why, sizeof why)) {
            load_error(c, "%s.%s: %s", section, name, why);
            return 0;
        }
        return 1;
    }
    if (!*section) load_error(c, "%s: key outside any [section]", name);
    else if (!sect_known) load_error(c, "%s.%s: unknown section [%s]", section, name, section);
    else load_error(c, "%s.%s: unknown key", section, name);
    return 0;
}

int config_load_string(const config_field *table, void *obj, const char *text, const char *name, errbuf *err)
{
    int n = table_len(table);
    size_t span = 0;
    for (int i = 0; i < n; i++)
        if (table[i].offset + field_size(&table[i]) > span) span = table[i].offset + field_size(&table[i]);
    struct load_ctx c = {.table = table, .name = name, .p = text};
    c.obj = xmalloc(span);
    memcpy(c.obj, obj, span);
    c.seen = xcalloc((size_t)n + 1, sizeof *c.seen);
    int r = ini_parse_stream(load_reader, &c, load_handler, &c);
    int ret = 0;
    if (r > 0 && (!c.err_line || r < c.err_line))
        ret = errbuf_set(err, EINVAL, "%s:%d: syntax error (expected [section] or key = value)", name, r);
    else if (c.err_line)
        ret = errbuf_set(err, EINVAL, "%s:%d: %s", name, c.err_line, c.err_msg);
    else if (r < 0)
        ret = errbuf_set(err, ENOMEM, "%s: parser error %d", name, r);
    if (!ret) memcpy(obj, c.obj, span); /* all or nothing */
    free(c.obj);
    free(c.seen);
    return ret;
}

int config_load_file(const config_field *table, void *obj, const char *path, errbuf *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return errbuf_set(err, errno, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, len = 0, r;
    char *buf = xmalloc(cap);
    while ((r = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += r;
        if (len == cap - 1) buf = xrealloc(buf, cap *= 2);
        if (len > (16u << 20)) break;
    }
    int bad = ferror(f);
    fclose(f);
    int ret;
    buf[len] = '\0';
    if (bad) ret = errbuf_set(err, EIO, "%s: read error", path);
    else if (len > (16u << 20)) ret = errbuf_set(err, EFBIG, "%s: larger than 16 MiB, not a config file", path);
    else if (strlen(buf) != len) ret = errbuf_set(err, EINVAL, "%s: contains a NUL byte", path);
    else ret = config_load_string(table, obj, buf, path, err);
    free(buf);
    return ret;
}

/* ---- dump and help ---- */

static int needs_quotes(const char *s)
{
    size_t n = strlen(s);
    return n && (s[0] == ' ' || s[0] == '\t' || s[n - 1] == ' ' || s[n - 1] == '\t' || s[0] == '"');
}

void config_dump(const config_field *table, const void *obj, FILE *out)
{
    int n = table_len(table);
    for (int i = 0; i < n; i++) {
        int first = 1;
        for (int j = 0; j < i; j++) first = first && strcmp(table[j].section, table[i].section) != 0;
        if (!first) continue;
        fprintf(out, "%s[%s]\n", i ? "\n" : "", table[i].section);
        for (int j = i; j < n; j++) {
            const config_field *f = &table[j];
            if (strcmp(f->section, table[i].section) != 0) continue;
            char buf[CONFIG_LIST_MAX * 13 + CONFIG_STRING_MAX];
            DF_ASSERT(value_format(f, (const char *)obj + f->offset, buf, sizeof buf) == 0);
            if (f->type == CONFIG_STRING && needs_quotes(buf)) fprintf(out, "%s = \"%s\"\n", f->name, buf);
            else fprintf(out, "%s = %s\n", f->name, buf);
        }
    }
}

void config_help(const config_field *table, FILE *out)
{
    for (const config_field *f = table; f->name; f++) {
        char key[160], bounds[224] = "";
        snprintf(key, sizeof key, "%s.%s", f->section, f->name);
        if (f->type == CONFIG_ENUM) {
            char names[200];
            choices_format(f, names, sizeof names);
            snprintf(bounds, sizeof bounds, "  {%s}", names);
        } else if (has_bounds(f) && f->type != CONFIG_BOOL && f->type != CONFIG_STRING) {
            char lo[32], hi[32];
            format_double(lo, sizeof lo, f->min);
            format_double(hi, sizeof hi, f->max);
            snprintf(bounds, sizeof bounds, "  [%s, %s]", lo, hi);
        }
        fprintf(out, "%-32s %-8s%s  default: %s%s\n", key, type_names[f->type], bounds,
                f->default_value && *f->default_value ? f->default_value : "(empty)",
                f->runtime_changeable ? "  (runtime)" : "");
        if (f->help) fprintf(out, "    %s\n", f->help);
    }
}
