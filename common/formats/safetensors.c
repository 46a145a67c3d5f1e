#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_util.h"
#include "progress.h"

/* One mapped .safetensors file. */
struct st_map {
    char *path;
    void *base;
    size_t size;
    json_t *meta; /* the __metadata__ object (a reference), or NULL */
};

struct st_file {
    char *path;            /* as given to st_open */
    struct st_map *maps;
    int nmaps;
    st_tensor *tensors;    /* file order, shards in index order */
    int ntensors, cap;
    int *by_name;          /* indices into tensors, sorted by name */
};

static const char *const dtype_names[] = {"F32", "BF16", "F16", "I32", "I64", "U8", "I8", "BOOL", "F64", "I16"};
static const size_t dtype_sizes[] = {4, 2, 2, 4, 8, 1, 1, 1, 8, 2};
#define ST_NDTYPES ((int)(sizeof dtype_names / sizeof dtype_names[0]))

size_t st_dtype_size(enum st_dtype dt)
{
    DF_ASSERT((int)dt >= 0 && (int)dt < ST_NDTYPES);
    return dtype_sizes[dt];
}

const char *st_dtype_name(enum st_dtype dt)
{
    DF_ASSERT((int)dt >= 0 && (int)dt < ST_NDTYPES);
    return dtype_names[dt];
}

static int dtype_parse(const char *s)
{
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(s, dtype_names[i]) == 0) return i;
    return -1;
}

/* "[a, b, c]" into buf. */
static const char *shape_format(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

static void tensor_push(st_file *f, const st_tensor *t)
{
    if (f->ntensors == f->cap) {
        f->cap = f->cap ? 2 * f->cap : 64;
        f->tensors = xrealloc(f->tensors, (size_t)f->cap * sizeof *f->tensors);
    }
    f->tensors[f->ntensors++] = *t;
}

/* Parse one tensor entry of a header into t (name and file set by the caller). */
static int tensor_parse(st_tensor *t, const json_t *v, const char *file, const char *name, size_t data_size,
                        errbuf *err)
{
    if (!json_is_object(v))
        return errbuf_set(err, EINVAL, "%s: tensor %s: expected an object, got %s", file, name, json_type_name(v));
    const json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
                 *jo = json_object_get(v, "data_offsets");
    if (!jd) return errbuf_set(err, EINVAL, "%s: tensor %s: missing field dtype", file, name);
    if (!js) return errbuf_set(err, EINVAL, "%s: tensor %s: missing field shape", file, name);
    if (!jo) return errbuf_set(err, EINVAL, "%s: tensor %s: missing field data_offsets", file, name);
    if (!json_is_string(jd))
        return errbuf_set(err, EINVAL, "%s: tensor %s: field dtype: expected string, got %s", file, name,
                          json_type_name(jd));
    int dt = dtype_parse(json_string_value(jd));
    if (dt < 0)
        return errbuf_set(err, EINVAL, "%s: tensor %s: unknown dtype \"%s\"", file, name, json_string_value(jd));
    t->dtype = (enum st_dtype)dt;

    if (!json_is_array(js))
        return errbuf_set(err, EINVAL, "%s: tensor %s: field shape: expected array, got %s", file, name,
                          json_type_name(js));
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return errbuf_set(err, EINVAL, "%s: tensor %s: shape has %zu dimensions (at most %d supported)", file, name,
                          nd, ST_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t count = 1;
    int zero = 0, overflow = 0;
    for (size_t i = 0; i < nd; i++) {
        const json_t *d = json_array_get(js, i);
        if (!json_is_integer(d))
            return errbuf_set(err, EINVAL, "%s: tensor %s: shape[%zu]: expected integer, got %s", file, name, i,
                              json_type_name(d));
        json_int_t x = json_integer_value(d);
        if (x < 0)
            return errbuf_set(err, EINVAL, "%s: tensor %s: shape[%zu] = %lld is negative", file, name, i,
                              (long long)x);
        t->shape[i] = x;
        if (x == 0) zero = 1;
        else if (__builtin_mul_overflow(count, (uint64_t)x, &count)) overflow = 1;
    }
    if (zero) count = 0;

    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return errbuf_set(err, EINVAL, "%s: tensor %s: field data_offsets: expected an array of 2 integers", file,
                          name);
    json_int_t off[2];
    for (int i = 0; i < 2; i++) {
        const json_t *o = json_array_get(jo, (size_t)i);
        if (!json_is_integer(o))
            return errbuf_set(err, EINVAL, "%s: tensor %s: data_offsets[%d]: expected integer, got %s", file, name,
                              i, json_type_name(o));
        off[i] = json_integer_value(o);
        if (off[i] < 0)
            return errbuf_set(err, EINVAL, "%s: tensor %s: data_offsets[%d] = %lld is negative", file, name, i,
                              (long long)off[i]);
    }
    if (off[0] > off[1])
        return errbuf_set(err, EINVAL, "%s: tensor %s: data_offsets begin %lld > end %lld", file, name,
                          (long long)off[0], (long long)off[1]);
    if ((uint64_t)off[1] > data_size)
        return errbuf_set(err, EINVAL, "%s: tensor %s: data_offsets [%lld, %lld] out of range (data region is %zu "
                          "bytes)", file, name, (long long)off[0], (long long)off[1], data_size);
    uint64_t nbytes = (uint64_t)(off[1] - off[0]), want;
    if (!overflow && __builtin_mul_overflow(count, (uint64_t)dtype_sizes[dt], &want)) overflow = 1;
    if (overflow || want != nbytes) {
        char sb[160], need[48];
        if (overflow) snprintf(need, sizeof need, "more than 2^64");
        else snprintf(need, sizeof need, "%llu", (unsigned long long)want);
        return errbuf_set(err, EINVAL, "%s: tensor %s: shape %s of %s needs %s bytes but data_offsets span %llu",
                          file, name, shape_format(sb, sizeof sb, t->ndim, t->shape), dtype_names[dt], need,
                          (unsigned long long)nbytes);
    }
    t->nbytes = (size_t)nbytes;
    t->data = (const void *)(uintptr_t)off[0]; /* relative offset until the caller rebases it */
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const st_tensor *x = a, *y = b;
    uintptr_t ox = (uintptr_t)x->data, oy = (uintptr_t)y->data;
    if (ox != oy) return ox < oy ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Map one .safetensors file, validate its header and append its tensors to f. */
static int map_open(st_file *f, const char *path, errbuf *err)
{
    int ret = 0;
    json_t *root = NULL;
    st_tensor *local = NULL;
    size_t nlocal = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errbuf_set(err, errno, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        ret = errbuf_set(err, errno, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return ret;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return errbuf_set(err, EINVAL, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return errbuf_set(err, EINVAL, "%s: file is %zu bytes, shorter than the 8-byte header length", path, size);
    }
    void *base = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (base == MAP_FAILED) return errbuf_set(err, merr, "%s: cannot mmap: %s", path, strerror(merr));

    f->maps = xrealloc(f->maps, (size_t)(f->nmaps + 1) * sizeof *f->maps);
    struct st_map *m = &f->maps[f->nmaps++];
    *m = (struct st_map){.path = xstrdup(path), .base = base, .size = size};

    const unsigned char *p = base;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > size - 8) {
        ret = errbuf_set(err, EINVAL, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                         (unsigned long long)hlen, size);
        goto fail;
    }
    json_error_t jerr;
    root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        ret = errbuf_set(err, EINVAL, "%s: header is not valid JSON (line %d, column %d): %s", path, jerr.line,
                         jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        ret = errbuf_set(err, EINVAL, "%s: header must be a JSON object, got %s", path, json_type_name(root));
        goto fail;
    }
    size_t data_size = size - 8 - (size_t)hlen;
    const unsigned char *data = p + 8 + hlen;
    local = xcalloc(json_object_size(root) + 1, sizeof *local);
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                ret = errbuf_set(err, EINVAL, "%s: __metadata__: expected an object, got %s", path,
                                 json_type_name(val));
                goto fail;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    ret = errbuf_set(err, EINVAL, "%s: __metadata__.%s: expected string, got %s", path, mk,
                                     json_type_name(mv));
                    goto fail;
                }
            }
            m->meta = json_incref(val);
            continue;
        }
        st_tensor *t = &local[nlocal];
        memset(t, 0, sizeof *t);
        ret = tensor_parse(t, val, path, key, data_size, err);
        if (ret) goto fail;
        t->name = xstrdup(key);
        t->file = m->path;
        nlocal++;
    }
    qsort(local, nlocal, sizeof *local, cmp_by_offset);
    const st_tensor *prev = NULL;
    for (size_t i = 0; i < nlocal; i++) {
        if (local[i].nbytes == 0) continue;
        if (prev && (uintptr_t)prev->data + prev->nbytes > (uintptr_t)local[i].data) {
            ret = errbuf_set(err, EINVAL, "%s: tensor %s: data_offsets overlap tensor %s", path, local[i].name,
                             prev->name);
            goto fail;
        }
        prev = &local[i];
    }
    for (size_t i = 0; i < nlocal; i++) {
        local[i].data = data + (uintptr_t)local[i].data;
        tensor_push(f, &local[i]);
    }
    free(local);
    json_decref(root);
    return 0;

fail:
    for (size_t i = 0; i < nlocal; i++) free((char *)local[i].name);
    free(local);
    json_decref(root);
    return ret;
}

static int cmp_name_idx_ctx(const void *a, const void *b, void *ctx)
{
    const st_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

/* Build the name index; duplicate names (across shards) are an error. */
static int index_build(st_file *f, errbuf *err)
{
    f->by_name = xmalloc((size_t)(f->ntensors + 1) * sizeof *f->by_name);
    for (int i = 0; i < f->ntensors; i++) f->by_name[i] = i;
    qsort_r(f->by_name, (size_t)f->ntensors, sizeof *f->by_name, cmp_name_idx_ctx, f->tensors);
    for (int i = 1; i < f->ntensors; i++) {
        const st_tensor *a = &f->tensors[f->by_name[i - 1]], *b = &f->tensors[f->by_name[i]];
        if (strcmp(a->name, b->name) == 0)
            return errbuf_set(err, EINVAL, "%s: tensor %s is also in %s", b->file, b->name, a->file);
    }
    return 0;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static char *path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Open every shard named by a model.safetensors.index.json (each once, in order of first mention). */
static int index_open(st_file *f, const char *path, errbuf *err)
{
    json_t *root;
    int ret = json_file_load(&root, path, JSON_REJECT_DUPLICATES, err);
    if (ret) return ret;
    char *dir = xstrdup(path), *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else strcpy(dir, ".");
    const char **files = NULL;
    size_t nfiles = 0;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!wm) {
        ret = errbuf_set(err, EINVAL, "%s: missing field weight_map", path);
        goto out;
    }
    if (!json_is_object(wm)) {
        ret = errbuf_set(err, EINVAL, "%s: field weight_map: expected object, got %s", path, json_type_name(wm));
        goto out;
    }
    files = xcalloc(json_object_size(wm) + 1, sizeof *files);
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        if (!json_is_string(val)) {
            ret = errbuf_set(err, EINVAL, "%s: weight_map.%s: expected string, got %s", path, key,
                             json_type_name(val));
            goto out;
        }
        const char *fn = json_string_value(val);
        size_t i = 0;
        while (i < nfiles && strcmp(files[i], fn) != 0) i++;
        if (i == nfiles) files[nfiles++] = fn;
    }
    for (size_t i = 0; i < nfiles; i++) {
        char *sp = path_join(dir, files[i]);
        ret = map_open(f, sp, err);
        free(sp);
        if (ret) {
            errbuf_wrap(err, ret, "%s", path);
            goto out;
        }
    }
    ret = index_build(f, err);
    if (ret) goto out;
    json_object_foreach(wm, key, val) {
        const st_tensor *t = st_find(f, key);
        char *sp = path_join(dir, json_string_value(val));
        if (!t) ret = errbuf_set(err, ENOENT, "%s: tensor %s named by %s not found", sp, key, path);
        else if (strcmp(t->file, sp) != 0)
            ret = errbuf_set(err, EINVAL, "%s: tensor %s is in %s, not in %s", path, key, t->file, sp);
        free(sp);
        if (ret) goto out;
    }
out:
    free(files);
    free(dir);
    json_decref(root);
    return ret;
}

int st_open(st_file **out, const char *path, errbuf *err)
{
    *out = NULL;
    st_file *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    int ret;
    struct stat sb;
    if (stat(path, &sb) < 0) {
        ret = errbuf_set(err, errno, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(sb.st_mode)) {
        char *ip = path_join(path, "model.safetensors.index.json");
        if (access(ip, F_OK) == 0) {
            ret = index_open(f, ip, err);
        } else {
            char *mp = path_join(path, "model.safetensors");
            if (access(mp, F_OK) == 0) ret = map_open(f, mp, err);
            else ret = errbuf_set(err, ENOENT, "%s: no model.safetensors.index.json or model.safetensors", path);
            free(mp);
            if (!ret) ret = index_build(f, err);
        }
        free(ip);
    } else if (has_suffix(path, ".json")) {
        ret = index_open(f, path, err);
    } else {
        ret = map_open(f, path, err);
        if (!ret) ret = index_build(f, err);
    }
    if (ret) goto fail;
    *out = f;
    return 0;
fail:
    st_close(&f);
    return ret;
}

void st_close(st_file **pf)
{
    st_file *f = *pf;
    if (!f) return;
    for (int i = 0; i < f->ntensors; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->nmaps; i++) {
        munmap(f->maps[i].base, f->maps[i].size);
        json_decref(f->maps[i].meta);
        free(f->maps[i].path);
    }
    free(f->maps);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
    *pf = NULL;
}

int st_count(const st_file *f)
{
    return f->ntensors;
}

const st_tensor *st_at(const st_file *f, int i)
{
    DF_ASSERT(i >= 0 && i < f->ntensors);
    return &f->tensors[i];
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    int lo = 0, hi = f->ntensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const st_tensor *t = &f->tensors[f->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *st_metadata(const st_file *f, const char *key)
{
    if (f->nmaps == 0 || !f->maps[0].meta) return NULL;
    return json_string_value(json_object_get(f->maps[0].meta, key));
}

const char *st_path(const st_file *f)
{
    return f->path;
}

static size_t tensor_count(const st_tensor *t)
{
    return t->nbytes / dtype_sizes[t->dtype];
}

static int tensor_lookup(const st_file *f, const char *name, const st_tensor **out, errbuf *err)
{
    *out = st_find(f, name);
    if (!*out) return errbuf_set(err, ENOENT, "%s: tensor %s not found", f->path, name);
    return 0;
}

static void convert_f32(const st_tensor *t, float *dst)
{
    size_t n = tensor_count(t);
    const unsigned char *src = t->data;
    progress_bump(); /* loading a large model is tensor after tensor: a sign of life each (progress.h) */
    if (t->dtype == ST_F32) {
        memcpy(dst, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
}

static int check_float(const st_tensor *t, errbuf *err)
{
    if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16)
        return errbuf_set(err, EINVAL, "%s: tensor %s: dtype %s is not a float type (F32, BF16, F16)", t->file,
                          t->name, dtype_names[t->dtype]);
    return 0;
}

static int check_shape(const st_tensor *t, int ndim, const int64_t *shape, errbuf *err)
{
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (same) return 0;
    char a[160], b[160];
    return errbuf_set(err, EINVAL, "%s: tensor %s: shape %s does not match expected %s", t->file, t->name,
                      shape_format(a, sizeof a, t->ndim, t->shape), shape_format(b, sizeof b, ndim, shape));
}

int st_read_f32(const st_file *f, const char *name, float *dst, int ndim, const int64_t *shape, errbuf *err)
{
    const st_tensor *t;
    int ret = tensor_lookup(f, name, &t, err);
    if (!ret) ret = check_float(t, err);
    if (!ret) ret = check_shape(t, ndim, shape, err);
    if (ret) return ret;
    convert_f32(t, dst);
    return 0;
}

int st_load_f32(const st_file *f, const char *name, float **out, int ndim, const int64_t *shape, size_t *out_count,
                errbuf *err)
{
    *out = NULL;
    const st_tensor *t;
    int ret = tensor_lookup(f, name, &t, err);
    if (!ret) ret = check_float(t, err);
    if (!ret && ndim >= 0) ret = check_shape(t, ndim, shape, err);
    if (ret) return ret;
    size_t n = tensor_count(t);
    *out = xmalloc(n * sizeof **out);
    convert_f32(t, *out);
    if (out_count) *out_count = n;
    return 0;
}

int st_load_i32(const st_file *f, const char *name, int32_t **out, size_t *out_count, errbuf *err)
{
    *out = NULL;
    const st_tensor *t;
    int ret = tensor_lookup(f, name, &t, err);
    if (ret) return ret;
    if (t->dtype != ST_I32 && t->dtype != ST_I64)
        return errbuf_set(err, EINVAL, "%s: tensor %s: dtype %s is not an integer type (I32, I64)", t->file,
                          t->name, dtype_names[t->dtype]);
    size_t n = tensor_count(t);
    int32_t *v = xmalloc(n * sizeof *v);
    const unsigned char *src = t->data;
    if (t->dtype == ST_I32) {
        memcpy(v, src, n * 4);
    } else {
        for (size_t i = 0; i < n; i++) {
            int64_t x;
            memcpy(&x, src + 8 * i, 8);
            if (x < INT32_MIN || x > INT32_MAX) {
                free(v);
                return errbuf_set(err, ERANGE, "%s: tensor %s: element %zu = %lld does not fit in int32", t->file,
                                  t->name, i, (long long)x);
            }
            v[i] = (int32_t)x;
        }
    }
    *out = v;
    if (out_count) *out_count = n;
    return 0;
}

/* ---- writer ---- */

/* In pieces of at most 64 MiB, each a sign of life (progress.h): a checkpoint of a large drafter is GBs. */
static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        progress_bump();
        ssize_t w = write(fd, p, n < ((size_t)64 << 20) ? n : (size_t)64 << 20);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int cmp_write_name(const void *a, const void *b, void *ctx)
{
    const st_write_tensor *t = ctx;
    return strcmp(t[*(const int *)a].name, t[*(const int *)b].name);
}

static size_t write_nbytes(const st_write_tensor *t)
{
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n * dtype_sizes[t->dtype];
}

/* The header text (padded with spaces to a multiple of 8), or NULL with err set. */
static char *write_header(const char *path, const st_write_tensor *tensors, const int *order, int n,
                          const char *metadata_json, size_t *out_len, errbuf *err)
{
    json_t *root = json_object();
    if (metadata_json) {
        json_error_t jerr;
        json_t *meta = json_loads(metadata_json, JSON_REJECT_DUPLICATES, &jerr);
        int ok = json_is_object(meta);
        const char *k;
        json_t *v;
        if (ok) json_object_foreach(meta, k, v) ok = ok && json_is_string(v);
        if (!ok) {
            json_decref(meta);
            json_decref(root);
            errbuf_set(err, EINVAL, "%s: metadata must be a JSON object of string values", path);
            return NULL;
        }
        json_object_set_new(root, "__metadata__", meta);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const st_write_tensor *t = &tensors[order[i]];
        json_t *e = json_object(), *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        size_t nb = write_nbytes(t);
        json_object_set_new(e, "dtype", json_string(dtype_names[t->dtype]));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + nb)));
        json_object_set_new(root, t->name, e);
        off += nb;
    }
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    DF_ASSERT(text);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char *hdr = xmalloc(padded);
    memcpy(hdr, text, len);
    memset(hdr + len, ' ', padded - len);
    free(text);
    *out_len = padded;
    return hdr;
}

static int write_data(int fd, const st_write_tensor *t)
{
    size_t count = write_nbytes(t) / dtype_sizes[t->dtype];
    if (t->dtype != ST_BF16) return write_all(fd, t->data, count * dtype_sizes[t->dtype]);
    enum { CHUNK = 1 << 15 };
    uint16_t buf[CHUNK];
    const float *src = t->data;
    for (size_t i = 0; i < count; i += CHUNK) {
        size_t m = count - i < CHUNK ? count - i : CHUNK;
        for (size_t j = 0; j < m; j++) buf[j] = f32_to_bf16(src[i + j]);
        int ret = write_all(fd, buf, m * sizeof *buf);
        if (ret) return ret;
    }
    return 0;
}

int st_write(const char *path, const st_write_tensor *tensors, int n, const char *metadata_json, errbuf *err)
{
    for (int i = 0; i < n; i++) {
        const st_write_tensor *t = &tensors[i];
        if (!t->name || !*t->name || strcmp(t->name, "__metadata__") == 0)
            return errbuf_set(err, EINVAL, "%s: tensor %d: invalid name \"%s\"", path, i, t->name ? t->name : "");
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_I32)
            return errbuf_set(err, EINVAL, "%s: tensor %s: cannot write dtype %s (F32, BF16 or I32 only)", path,
                              t->name, st_dtype_name(t->dtype));
        if (t->ndim < 0 || t->ndim > ST_MAX_DIMS)
            return errbuf_set(err, EINVAL, "%s: tensor %s: ndim %d out of range", path, t->name, t->ndim);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return errbuf_set(err, EINVAL, "%s: tensor %s: shape[%d] = %lld is negative", path, t->name, d,
                                  (long long)t->shape[d]);
        if (!t->data && write_nbytes(t) > 0)
            return errbuf_set(err, EINVAL, "%s: tensor %s: no data", path, t->name);
    }
    int *order = xmalloc((size_t)(n + 1) * sizeof *order);
    for (int i = 0; i < n; i++) order[i] = i;
    qsort_r(order, (size_t)n, sizeof *order, cmp_write_name, (void *)tensors);
    for (int i = 1; i < n; i++)
        if (strcmp(tensors[order[i - 1]].name, tensors[order[i]].name) == 0) {
            int ret = errbuf_set(err, EINVAL, "%s: tensor %s given twice", path, tensors[order[i]].name);
            free(order);
            return ret;
        }
    size_t hlen = 0;
    char *hdr = write_header(path, tensors, order, n, metadata_json, &hlen, err);
    if (!hdr) {
        free(order);
        return -EINVAL;
    }
    size_t tn = strlen(path) + 5;
    char *tmp = xmalloc(tn);
    snprintf(tmp, tn, "%s.tmp", path);
    int ret = 0, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ret = errbuf_set(err, errno, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    ret = write_all(fd, lenbuf, 8);
    if (!ret) ret = write_all(fd, hdr, hlen);
    for (int i = 0; !ret && i < n; i++) ret = write_data(fd, &tensors[order[i]]);
    if (!ret && fsync(fd) < 0) ret = -errno;
    if (close(fd) < 0 && !ret) ret = -errno;
    if (ret) {
        errbuf_set(err, -ret, "%s: write failed: %s", tmp, strerror(-ret));
        unlink(tmp);
        goto out;
    }
    if (rename(tmp, path) < 0) {
        ret = errbuf_set(err, errno, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    ret = fsync_parent(path);
    if (ret) errbuf_set(err, -ret, "%s: cannot fsync its directory: %s", path, strerror(-ret));
out:
    free(tmp);
    free(hdr);
    free(order);
    return ret;
}
