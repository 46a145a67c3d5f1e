#include "prompt_file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "json_util.h"

static int parse_line(prompt_line *pl, const char *path, int lineno, const char *text, size_t n, int vocab,
                      errbuf *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, n, 0, &je);
    int rc = 0;
    memset(pl, 0, sizeof *pl);
    pl->lineno = lineno;
    if (!root) return errbuf_set(err, EINVAL, "%s:%d: invalid JSON: %s (column %d)", path, lineno, je.text, je.column);
    json_t *ids = json_object_get(root, "input_ids"), *lm = json_object_get(root, "loss_mask");
    json_t *labels = json_object_get(root, "labels"), *m = lm ? lm : labels;
    const char *mname = lm ? "loss_mask" : "labels";
    if (!json_is_object(root)) {
        rc = errbuf_set(err, EINVAL, "%s:%d: not a JSON object", path, lineno);
        goto done;
    }
    if (!json_is_array(ids) || json_array_size(ids) == 0) {
        rc = errbuf_set(err, EINVAL, "%s:%d: input_ids: %s", path, lineno,
                        !ids ? "missing" : !json_is_array(ids) ? "not an array" : "empty");
        goto done;
    }
    size_t len = json_array_size(ids);
    if (m && (!json_is_array(m) || json_array_size(m) != len)) {
        rc = errbuf_set(err, EINVAL, "%s:%d: %s: %s", path, lineno, mname,
                        !json_is_array(m) ? "not an array" : "not as long as input_ids");
        goto done;
    }
    if (len > (1u << 30)) {
        rc = errbuf_set(err, EINVAL, "%s:%d: input_ids: %zu tokens", path, lineno, len);
        goto done;
    }
    pl->ids = xmalloc(sizeof(int32_t) * len);
    pl->len = (int)len;
    pl->plen = -1;
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab) {
            rc = json_is_integer(v)
                     ? errbuf_set(err, EINVAL, "%s:%d: input_ids[%zu] = %lld outside the target's vocabulary [0, %d)",
                                  path, lineno, i, (long long)json_integer_value(v), vocab)
                     : errbuf_set(err, EINVAL, "%s:%d: input_ids[%zu] is a %s, not a token id", path, lineno, i,
                                  json_type_name(v));
            goto done;
        }
        pl->ids[i] = (int32_t)json_integer_value(v);
        if (m && pl->plen < 0) {
            json_t *mv = json_array_get(m, i);
            int trained;
            if (json_is_boolean(mv)) trained = json_is_true(mv);
            else if (json_is_integer(mv)) trained = lm ? json_integer_value(mv) != 0 : json_integer_value(mv) != -100;
            else {
                rc = errbuf_set(err, EINVAL, "%s:%d: %s[%zu] is a %s", path, lineno, mname, i, json_type_name(mv));
                goto done;
            }
            if (trained) pl->plen = (int)i;
        }
    }
    if (pl->plen < 0) pl->plen = pl->len;
    if (pl->plen == 0)
        rc = errbuf_set(err, EINVAL, "%s:%d: %s[0] is trained: the line has no prompt", path, lineno, mname);
done:
    json_decref(root);
    if (rc) XFREE(pl->ids);
    return rc;
}

int prompt_file_read(prompt_set *out, const char *path, int vocab, int limit, errbuf *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, vcap = 0;
    ssize_t n;
    int lineno = 0, rc = 0;
    while ((limit <= 0 || out->n < limit) && (n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t k = 0;
        while (k < (size_t)n && strchr(" \t\r\n", line[k])) k++;
        if (k == (size_t)n) continue;
        if ((size_t)out->n == vcap) out->v = xrealloc(out->v, sizeof *out->v * (vcap = vcap ? 2 * vcap : 64));
        if ((rc = parse_line(&out->v[out->n], path, lineno, line, (size_t)n, vocab, err))) break;
        out->n++;
    }
    if (!rc && ferror(f)) rc = errbuf_set(err, EIO, "%s: read error", path);
    free(line);
    fclose(f);
    if (!rc && out->n == 0) rc = errbuf_set(err, EINVAL, "%s: no prompt (the file has no JSON line)", path);
    if (rc) prompt_set_free(out);
    return rc;
}

void prompt_set_free(prompt_set *s)
{
    for (int i = 0; i < s->n; i++) free(s->v[i].ids);
    XFREE(s->v);
    s->n = 0;
}
