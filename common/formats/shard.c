#include "shard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reader hands out pointers into the mapping, so the host must share the file's byte order. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "dflash shards are little-endian and read in place: a little-endian host is required"
#endif

/* ---- XXH64 (seed 0), after the reference description by Yann Collet ---- */

#define XXH_P1 11400714785074694791ULL
#define XXH_P2 14029467366897019727ULL
#define XXH_P3 1609587929392839161ULL
#define XXH_P4 9650029242287828579ULL
#define XXH_P5 2870177450012600261ULL

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t load64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t load32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static void store64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void store32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static uint64_t xxh_round(uint64_t acc, uint64_t in)
{
    acc += in * XXH_P2;
    return rotl64(acc, 31) * XXH_P1;
}

static uint64_t xxh_merge(uint64_t acc, uint64_t v)
{
    acc ^= xxh_round(0, v);
    return acc * XXH_P1 + XXH_P4;
}

uint64_t shard_hash(const void *data, size_t n)
{
    const uint8_t *p = data, *end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v1 = XXH_P1 + XXH_P2, v2 = XXH_P2, v3 = 0, v4 = 0 - XXH_P1;
        const uint8_t *limit = end - 32;
        do {
            v1 = xxh_round(v1, load64(p));
            v2 = xxh_round(v2, load64(p + 8));
            v3 = xxh_round(v3, load64(p + 16));
            v4 = xxh_round(v4, load64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = xxh_merge(h, v1);
        h = xxh_merge(h, v2);
        h = xxh_merge(h, v3);
        h = xxh_merge(h, v4);
    } else {
        h = XXH_P5;
    }
    h += (uint64_t)n;
    while (end - p >= 8) {
        h ^= xxh_round(0, load64(p));
        h = rotl64(h, 27) * XXH_P1 + XXH_P4;
        p += 8;
    }
    if (end - p >= 4) {
        h ^= (uint64_t)load32(p) * XXH_P1;
        h = rotl64(h, 23) * XXH_P2 + XXH_P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)*p * XXH_P5;
        h = rotl64(h, 11) * XXH_P1;
        p++;
    }
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

/* ---- layout ---- */

/* Total file size implied by a header: header, offsets, tokens, mask, padding to 8; UINT64_MAX on overflow. */
static uint64_t shard_implied_size(uint64_t header_bytes, uint64_t nsamples, uint64_t ntokens)
{
    uint64_t off_bytes, tok_bytes, total;
    if (nsamples == UINT64_MAX || __builtin_mul_overflow(nsamples + 1, 8, &off_bytes) ||
        __builtin_mul_overflow(ntokens, 5, &tok_bytes) ||
        __builtin_add_overflow(header_bytes, off_bytes, &total) ||
        __builtin_add_overflow(total, tok_bytes, &total) || total > UINT64_MAX - 7)
        return UINT64_MAX;
    return (total + 7) & ~(uint64_t)7;
}

/* ---- reader ---- */

struct shard {
    char *path;
    const uint8_t *map;
    size_t map_bytes;
    uint64_t nsamples, ntokens, ntrained;
    const uint64_t *offsets; /* [nsamples + 1] */
    const uint32_t *tokens;  /* [ntokens] */
    const uint8_t *mask;     /* [ntokens] */
    struct stat st;          /* the file as opened: a later stat that differs means it changed under the mapping */
};

/* Index of the sample holding token t (offsets validated, t < ntokens). */
static uint64_t shard_sample_of_token(const shard *s, uint64_t t)
{
    uint64_t lo = 0, hi = s->nsamples; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (s->offsets[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
}

static int shard_validate_body(shard *s, errbuf *err)
{
    const char *path = s->path;
    const uint64_t *off = s->offsets;
    uint64_t n = s->nsamples, T = s->ntokens;
    if (off[0] != 0)
        return errbuf_set(err, EINVAL, "%s: bad offsets: offsets[0] is %llu, must be 0", path,
                          (unsigned long long)off[0]);
    for (uint64_t i = 0; i < n; i++) {
        if (off[i + 1] < off[i])
            return errbuf_set(err, EINVAL, "%s: offsets not monotonic: sample %llu ends at %llu before it starts "
                              "at %llu", path, (unsigned long long)i, (unsigned long long)off[i + 1],
                              (unsigned long long)off[i]);
        if (off[i + 1] > T)
            return errbuf_set(err, EINVAL, "%s: bad offsets: offsets[%llu] = %llu is past ntokens %llu", path,
                              (unsigned long long)(i + 1), (unsigned long long)off[i + 1], (unsigned long long)T);
    }
    if (off[n] != T)
        return errbuf_set(err, EINVAL, "%s: bad offsets: offsets[%llu] = %llu, header says ntokens %llu", path,
                          (unsigned long long)n, (unsigned long long)off[n], (unsigned long long)T);
    uint64_t trained = 0;
    for (uint64_t t = 0; t < T; t++) {
        uint8_t m = s->mask[t];
        if (m > 1) {
            uint64_t i = shard_sample_of_token(s, t);
            return errbuf_set(err, EINVAL, "%s: sample %llu, token %llu: loss_mask is %u (must be 0 or 1)", path,
                              (unsigned long long)i, (unsigned long long)(t - off[i]), m);
        }
        trained += m;
    }
    s->ntrained = trained;
    return 0;
}

int shard_open(shard **out, const char *path, errbuf *err)
{
    *out = NULL;
    shard *s = xcalloc(1, sizeof *s);
    s->path = xstrdup(path);
    int ret, fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ret = errbuf_set(err, errno, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ret = errbuf_set(err, errno, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = errbuf_set(err, EINVAL, "%s: not a regular file", path);
        goto fail;
    }
    s->st = st;
    uint64_t size = (uint64_t)st.st_size;
    uint8_t hdr[SHARD_HEADER_BYTES] = {0};
    ssize_t got = pread(fd, hdr, sizeof hdr, 0);
    if (got < 0) {
        ret = errbuf_set(err, errno, "%s: cannot read: %s", path, strerror(errno));
        goto fail;
    }
    size_t cmp = (size_t)got < sizeof SHARD_MAGIC ? (size_t)got : sizeof SHARD_MAGIC;
    if (memcmp(hdr, SHARD_MAGIC, cmp) != 0) {
        ret = errbuf_set(err, EINVAL, "%s: bad magic: not a dflash shard (expected \"DFSHARD\\0\" at byte 0)", path);
        goto fail;
    }
    if ((uint64_t)got < SHARD_HEADER_BYTES) {
        ret = errbuf_set(err, EINVAL, "%s: truncated: a shard header is %u bytes, file has %llu", path,
                         SHARD_HEADER_BYTES, (unsigned long long)size);
        goto fail;
    }
    uint32_t version = load32(hdr + SHARD_OFF_VERSION), header_bytes = load32(hdr + SHARD_OFF_HEADER_BYTES);
    if (version != SHARD_VERSION) {
        ret = errbuf_set(err, EINVAL, "%s: unsupported shard version %u (this build reads version %u)", path,
                         version, SHARD_VERSION);
        goto fail;
    }
    if (header_bytes < SHARD_HEADER_BYTES || header_bytes % 8 != 0 || header_bytes > 65536) {
        ret = errbuf_set(err, EINVAL, "%s: bad header_bytes %u (must be a multiple of 8 in [64, 65536])", path,
                         header_bytes);
        goto fail;
    }
    s->nsamples = load64(hdr + SHARD_OFF_NSAMPLES);
    s->ntokens = load64(hdr + SHARD_OFF_NTOKENS);
    uint64_t checksum = load64(hdr + SHARD_OFF_CHECKSUM);
    uint64_t want = shard_implied_size(header_bytes, s->nsamples, s->ntokens);
    if (want == UINT64_MAX) {
        ret = errbuf_set(err, EINVAL, "%s: truncated: header says nsamples %llu and ntokens %llu, more bytes than a "
                         "file can hold; file has %llu", path, (unsigned long long)s->nsamples,
                         (unsigned long long)s->ntokens, (unsigned long long)size);
        goto fail;
    }
    if (size < want) {
        ret = errbuf_set(err, EINVAL, "%s: truncated: header says %llu bytes, file has %llu", path,
                         (unsigned long long)want, (unsigned long long)size);
        goto fail;
    }
    if (size > want) {
        ret = errbuf_set(err, EINVAL, "%s: size mismatch: header says %llu bytes, file has %llu (trailing data)", path,
                         (unsigned long long)want, (unsigned long long)size);
        goto fail;
    }
    if (want > SIZE_MAX) {
        ret = errbuf_set(err, EFBIG, "%s: %llu bytes do not fit in the address space", path,
                         (unsigned long long)want);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)want, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ret = errbuf_set(err, errno, "%s: cannot mmap %llu bytes: %s", path, (unsigned long long)want,
                         strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    s->map = map;
    s->map_bytes = (size_t)want;
    uint64_t actual = shard_hash(s->map + header_bytes, s->map_bytes - header_bytes);
    if (actual != checksum) {
        ret = errbuf_set(err, EINVAL, "%s: checksum mismatch: header says 0x%016llx, contents hash to 0x%016llx "
                         "(file is corrupt)", path, (unsigned long long)checksum, (unsigned long long)actual);
        goto fail;
    }
    s->offsets = (const uint64_t *)(s->map + header_bytes);
    s->tokens = (const uint32_t *)(s->offsets + s->nsamples + 1);
    s->mask = (const uint8_t *)(s->tokens + s->ntokens);
    if ((ret = shard_validate_body(s, err)) != 0) goto fail;
    *out = s;
    return 0;
fail:
    if (fd >= 0) close(fd);
    shard_close(&s);
    return ret;
}

uint64_t shard_file_bytes(const shard *s) { return (uint64_t)s->map_bytes; }

uint64_t shard_header_digest(const shard *s) { return shard_hash(s->map, SHARD_HEADER_BYTES); }

int shard_check_unchanged(const shard *s, errbuf *err)
{
    struct stat now;
    if (stat(s->path, &now) != 0)
        return errbuf_set(err, errno, "%s: the shard is gone since it was opened (%s)", s->path, strerror(errno));
    if (now.st_dev != s->st.st_dev || now.st_ino != s->st.st_ino)
        return errbuf_set(err, ESTALE, "%s: the shard was replaced by another file since it was opened", s->path);
    if (now.st_size != s->st.st_size)
        return errbuf_set(err, ESTALE, "%s: the shard was truncated or resized since it was opened (%lld bytes, "
                          "was %lld)", s->path, (long long)now.st_size, (long long)s->st.st_size);
    if (now.st_mtim.tv_sec != s->st.st_mtim.tv_sec || now.st_mtim.tv_nsec != s->st.st_mtim.tv_nsec)
        return errbuf_set(err, ESTALE, "%s: the shard was overwritten in place since it was opened (its "
                          "modification time moved)", s->path);
    return 0;
}

void shard_close(shard **sp)
{
    shard *s = *sp;
    if (!s) return;
    if (s->map) munmap((void *)s->map, s->map_bytes);
    free(s->path);
    free(s);
    *sp = NULL;
}

const char *shard_path(const shard *s) { return s->path; }
uint64_t shard_count(const shard *s) { return s->nsamples; }
uint64_t shard_ntokens(const shard *s) { return s->ntokens; }
uint64_t shard_ntrained(const shard *s) { return s->ntrained; }

void shard_sample(const shard *s, uint64_t i, const uint32_t **tokens, const uint8_t **mask, uint64_t *len)
{
    DF_ASSERT(i < s->nsamples);
    uint64_t a = s->offsets[i];
    if (tokens) *tokens = s->tokens + a;
    if (mask) *mask = s->mask + a;
    if (len) *len = s->offsets[i + 1] - a;
}

/* ---- writer ---- */

struct shard_writer {
    char *path, *tmp_path;
    uint64_t *offsets; /* [nsamples + 1] */
    uint32_t *tokens;
    uint8_t *mask;
    uint64_t nsamples, ntokens, cap_samples, cap_tokens;
};

int shard_writer_open(shard_writer **out, const char *path, errbuf *err)
{
    *out = NULL;
    if (!path || !*path) return errbuf_set(err, EINVAL, "shard writer: empty output path");
    shard_writer *w = xcalloc(1, sizeof *w);
    w->path = xstrdup(path);
    size_t n = strlen(path) + 32;
    w->tmp_path = xmalloc(n);
    snprintf(w->tmp_path, n, "%s.%ld.tmp", path, (long)getpid());
    w->cap_samples = 1024;
    w->offsets = xmalloc((w->cap_samples + 1) * sizeof *w->offsets);
    w->offsets[0] = 0;
    *out = w;
    return 0;
}

int shard_writer_add(shard_writer *w, const uint32_t *tokens, const uint8_t *mask, size_t n, errbuf *err)
{
    if (mask) {
        for (size_t i = 0; i < n; i++)
            if (mask[i] > 1)
                return errbuf_set(err, EINVAL, "%s: sample %llu, token %zu: loss_mask is %u (must be 0 or 1)",
                                  w->path, (unsigned long long)w->nsamples, i, mask[i]);
    }
    if (w->nsamples == w->cap_samples) {
        w->cap_samples *= 2;
        w->offsets = xrealloc(w->offsets, (w->cap_samples + 1) * sizeof *w->offsets);
    }
    if (w->ntokens + n > w->cap_tokens) {
        uint64_t cap = w->cap_tokens ? w->cap_tokens : 4096;
        while (cap < w->ntokens + n) cap *= 2;
        w->tokens = xrealloc(w->tokens, cap * sizeof *w->tokens);
        w->mask = xrealloc(w->mask, cap);
        w->cap_tokens = cap;
    }
    if (n) {
        memcpy(w->tokens + w->ntokens, tokens, n * sizeof *tokens);
        if (mask) memcpy(w->mask + w->ntokens, mask, n);
        else memset(w->mask + w->ntokens, 1, n);
    }
    w->ntokens += n;
    w->nsamples++;
    w->offsets[w->nsamples] = w->ntokens;
    return 0;
}

uint64_t shard_writer_count(const shard_writer *w) { return w->nsamples; }
uint64_t shard_writer_ntokens(const shard_writer *w) { return w->ntokens; }

static int write_all(int fd, const void *data, size_t n)
{
    const uint8_t *p = data;
    while (n > 0) {
        ssize_t k = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int shard_writer_close(shard_writer **wp, errbuf *err)
{
    shard_writer *w = *wp;
    DF_ASSERT(w);
    int ret = 0, fd = open(w->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    void *map = MAP_FAILED;
    uint64_t size = shard_implied_size(SHARD_HEADER_BYTES, w->nsamples, w->ntokens);
    if (fd < 0) {
        ret = errbuf_set(err, errno, "%s: cannot create: %s", w->tmp_path, strerror(errno));
        goto done;
    }
    uint8_t hdr[SHARD_HEADER_BYTES] = {0}, pad[8] = {0};
    memcpy(hdr, SHARD_MAGIC, sizeof SHARD_MAGIC);
    store32(hdr + SHARD_OFF_VERSION, SHARD_VERSION);
    store32(hdr + SHARD_OFF_HEADER_BYTES, SHARD_HEADER_BYTES);
    store64(hdr + SHARD_OFF_NSAMPLES, w->nsamples);
    store64(hdr + SHARD_OFF_NTOKENS, w->ntokens);
    size_t body = (size_t)(SHARD_HEADER_BYTES + 8 * (w->nsamples + 1) + 5 * w->ntokens);
    int r;
    if ((r = write_all(fd, hdr, sizeof hdr)) || (r = write_all(fd, w->offsets, 8 * (w->nsamples + 1))) ||
        (r = write_all(fd, w->tokens, 4 * w->ntokens)) || (r = write_all(fd, w->mask, w->ntokens)) ||
        (r = write_all(fd, pad, (size_t)size - body))) {
        ret = errbuf_set(err, -r, "%s: write failed: %s", w->tmp_path, strerror(-r));
        goto done;
    }
    /* Hash what actually went to the file (page cache), then fill in the checksum. */
    map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        ret = errbuf_set(err, errno, "%s: cannot mmap for checksum: %s", w->tmp_path, strerror(errno));
        goto done;
    }
    uint8_t sum[8];
    store64(sum, shard_hash((const uint8_t *)map + SHARD_HEADER_BYTES, (size_t)size - SHARD_HEADER_BYTES));
    if (pwrite(fd, sum, 8, SHARD_OFF_CHECKSUM) != 8) {
        ret = errbuf_set(err, errno ? errno : EIO, "%s: write failed: %s", w->tmp_path, strerror(errno));
        goto done;
    }
    if (fsync(fd) != 0) {
        ret = errbuf_set(err, errno, "%s: fsync failed: %s", w->tmp_path, strerror(errno));
        goto done;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        ret = errbuf_set(err, errno, "%s: cannot rename into place: %s", w->path, strerror(errno));
        goto done;
    }
    if ((r = fsync_parent(w->path)) != 0)
        ret = errbuf_set(err, -r, "%s: fsync of the folder failed: %s", w->path, strerror(-r));
done:
    if (map != MAP_FAILED) munmap(map, (size_t)size);
    if (fd >= 0) close(fd);
    if (ret != 0) unlink(w->tmp_path);
    shard_writer_discard(wp);
    return ret;
}

void shard_writer_discard(shard_writer **wp)
{
    shard_writer *w = *wp;
    if (!w) return;
    unlink(w->tmp_path); /* the tmp file exists only if close failed half way; ENOENT otherwise */
    free(w->path);
    free(w->tmp_path);
    free(w->offsets);
    free(w->tokens);
    free(w->mask);
    free(w);
    *wp = NULL;
}

/* ---- dataset ---- */

struct dataset {
    shard **shards;
    size_t nshards;
    uint64_t *first; /* [nshards + 1]: global index of each shard's first sample; first[nshards] = count */
    uint64_t ntokens;
};

static int shard_name_filter(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return d->d_name[0] != '.' && n > 6 && strcmp(d->d_name + n - 6, ".shard") == 0;
}

static int shard_name_compare(const struct dirent **a, const struct dirent **b)
{
    return strverscmp((*a)->d_name, (*b)->d_name);
}

int dataset_open(dataset **out, const char *path, errbuf *err)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return errbuf_set(err, errno, "%s: cannot open dataset: %s", path, strerror(errno));
    dataset *ds = xcalloc(1, sizeof *ds);
    struct dirent **names = NULL;
    int nnames = 0, ret = 0;
    if (S_ISDIR(st.st_mode)) {
        nnames = scandir(path, &names, shard_name_filter, shard_name_compare);
        if (nnames < 0) {
            ret = errbuf_set(err, errno, "%s: cannot list folder: %s", path, strerror(errno));
            nnames = 0;
            goto fail;
        }
        if (nnames == 0) {
            ret = errbuf_set(err, ENOENT, "%s: no *.shard files in this folder", path);
            goto fail;
        }
        ds->shards = xcalloc((size_t)nnames, sizeof *ds->shards);
        size_t dl = strlen(path); /* "data/" names its shards data/shard-0.shard, not data//shard-0.shard */
        while (dl > 1 && path[dl - 1] == '/') dl--;
        for (int i = 0; i < nnames; i++) {
            size_t n = dl + strlen(names[i]->d_name) + 2;
            char *file = xmalloc(n);
            snprintf(file, n, "%.*s/%s", (int)dl, path, names[i]->d_name);
            ret = shard_open(&ds->shards[ds->nshards], file, err);
            free(file);
            if (ret != 0) goto fail;
            ds->nshards++;
        }
    } else {
        ds->shards = xcalloc(1, sizeof *ds->shards);
        if ((ret = shard_open(&ds->shards[0], path, err)) != 0) goto fail;
        ds->nshards = 1;
    }
    ds->first = xmalloc((ds->nshards + 1) * sizeof *ds->first);
    ds->first[0] = 0;
    for (size_t i = 0; i < ds->nshards; i++) {
        ds->first[i + 1] = ds->first[i] + shard_count(ds->shards[i]);
        ds->ntokens += shard_ntokens(ds->shards[i]);
    }
    for (int i = 0; i < nnames; i++) free(names[i]);
    free(names);
    *out = ds;
    return 0;
fail:
    for (int i = 0; i < nnames; i++) free(names[i]);
    free(names);
    dataset_close(&ds);
    return ret;
}

void dataset_close(dataset **dsp)
{
    dataset *ds = *dsp;
    if (!ds) return;
    for (size_t i = 0; i < ds->nshards; i++) shard_close(&ds->shards[i]);
    free(ds->shards);
    free(ds->first);
    free(ds);
    *dsp = NULL;
}

uint64_t dataset_count(const dataset *ds) { return ds->first[ds->nshards]; }
uint64_t dataset_ntokens(const dataset *ds) { return ds->ntokens; }
size_t dataset_nshards(const dataset *ds) { return ds->nshards; }

const shard *dataset_shard(const dataset *ds, size_t i)
{
    DF_ASSERT(i < ds->nshards);
    return ds->shards[i];
}

int dataset_sample(const dataset *ds, uint64_t index, const uint32_t **tokens, const uint8_t **mask, uint64_t *len)
{
    if (index >= dataset_count(ds)) return -ERANGE;
    size_t lo = 0, hi = ds->nshards; /* last shard with first[s] <= index; skips empty shards */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (ds->first[mid] <= index) lo = mid; else hi = mid;
    }
    shard_sample(ds->shards[lo], index - ds->first[lo], tokens, mask, len);
    return 0;
}

int dataset_check_unchanged(const dataset *ds, errbuf *err)
{
    for (size_t k = 0; k < ds->nshards; k++) {
        int rc = shard_check_unchanged(ds->shards[k], err);
        if (rc) return rc;
    }
    return 0;
}

const char *dataset_shard_at(const dataset *ds, const void *addr)
{
    const uint8_t *a = addr;
    for (size_t k = 0; ds && k < ds->nshards; k++) {
        const shard *s = ds->shards[k];
        if (s && s->map && a >= s->map && a < s->map + s->map_bytes) return s->path;
    }
    return NULL;
}

int dataset_check_vocab(const dataset *ds, uint32_t vocab, errbuf *err)
{
    for (size_t k = 0; k < ds->nshards; k++) {
        const shard *s = ds->shards[k];
        for (uint64_t t = 0; t < s->ntokens; t++) {
            if (s->tokens[t] < vocab) continue;
            uint64_t i = shard_sample_of_token(s, t);
            return errbuf_set(err, ERANGE, "%s: sample %llu (dataset sample %llu), token %llu: id %u >= vocab %u",
                              s->path, (unsigned long long)i, (unsigned long long)(ds->first[k] + i),
                              (unsigned long long)(t - s->offsets[i]), s->tokens[t], vocab);
        }
    }
    return 0;
}
