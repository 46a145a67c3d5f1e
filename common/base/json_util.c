#include "json_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *json_type_name(const json_t *v)
{
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    default: return "null";
    }
}

int json_file_load(json_t **out, const char *path, size_t flags, errbuf *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        return errbuf_set(err, e, "%s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen takes a directory; jansson then reads "" */
        fclose(f);
        return errbuf_set(err, EISDIR, "%s: %s", path, strerror(EISDIR));
    }
    json_error_t je;
    *out = json_loadf(f, flags, &je);
    int rerr = ferror(f) ? errno : 0;
    fclose(f);
    if (*out) return 0;
    if (rerr) return errbuf_set(err, rerr, "%s: %s", path, strerror(rerr));
    if (je.line < 1) return errbuf_set(err, EINVAL, "%s: invalid JSON: %s", path, je.text);
    if (je.column < 1) return errbuf_set(err, EINVAL, "%s:%d: invalid JSON: %s", path, je.line, je.text);
    return errbuf_set(err, EINVAL, "%s:%d:%d: invalid JSON: %s", path, je.line, je.column, je.text);
}

int json_file_save(const json_t *o, const char *path, size_t flags, errbuf *err)
{
    char tmp[8192];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    errno = 0;
    if (json_dump_file(o, tmp, flags) != 0 || rename(tmp, path) != 0) {
        int e = errno ? errno : EIO;
        unlink(tmp);
        return errbuf_set(err, e, "%s: %s", path, strerror(e));
    }
    return 0;
}
