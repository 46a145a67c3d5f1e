#include "job_identity.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_util.h"

#define SAMPLE_BYTES (64 * 1024)
#define SAMPLES 16

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* size, the first 64 KiB (the header and the start of the data), SAMPLES more samples spread over the file */
static int digest_file(uint64_t *h, const char *path, errbuf *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errbuf_set(err, errno, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return errbuf_set(err, e, "%s: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size;
    *h = fnv(*h, &size, sizeof size);
    uint8_t *buf = xmalloc(SAMPLE_BYTES);
    for (int i = 0; i <= SAMPLES; i++) {
        off_t off = i == 0 ? 0 : (off_t)(size / SAMPLES * (uint64_t)i);
        if (i == SAMPLES) off = size > SAMPLE_BYTES ? (off_t)(size - SAMPLE_BYTES) : 0;
        ssize_t r = pread(fd, buf, SAMPLE_BYTES, off);
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return errbuf_set(err, e, "%s: %s", path, strerror(e));
        }
        *h = fnv(*h, buf, (size_t)r);
    }
    free(buf);
    close(fd);
    return 0;
}

static int is_safetensors(const struct dirent *d)
{
    size_t n = strlen(d->d_name);
    return n > 12 && !strcmp(d->d_name + n - 12, ".safetensors");
}

int job_identity_target(const char *dir, char config_digest[17], char weights_digest[17], errbuf *err)
{
    char path[8192];
    uint64_t h = 0xcbf29ce484222325ull;
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = digest_file(&h, path, err);
    if (rc) return rc;
    snprintf(config_digest, 17, "%016llx", (unsigned long long)h);
    struct dirent **names;
    int n = scandir(dir, &names, is_safetensors, alphasort);
    if (n < 0) return errbuf_set(err, errno, "%s: %s", dir, strerror(errno));
    h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        h = fnv(h, names[i]->d_name, strlen(names[i]->d_name));
        if (!rc) rc = digest_file(&h, path, err);
        free(names[i]);
    }
    free(names);
    if (rc) return rc;
    snprintf(weights_digest, 17, "%016llx", (unsigned long long)h);
    return 0;
}

int job_identity_checkpoint(const char *dir, char *out, size_t n, errbuf *err)
{
    char cfg[17], wts[17], real[PATH_MAX], path[8192];
    int rc = job_identity_target(dir, cfg, wts, err);
    if (rc) return rc;
    if (!realpath(dir, real)) return errbuf_set(err, errno, "%s: %s", dir, strerror(errno));
    struct dirent **names;
    int nf = scandir(dir, &names, is_safetensors, alphasort);
    if (nf < 0) return errbuf_set(err, errno, "%s: %s", dir, strerror(errno));
    uint64_t h = 0xcbf29ce484222325ull, total = 0;
    for (int i = 0; i < nf; i++) {
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (!rc && stat(path, &st) != 0) rc = errbuf_set(err, errno, "%s: %s", path, strerror(errno));
        if (!rc) {
            uint64_t f[4] = {(uint64_t)st.st_size, (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec,
                             (uint64_t)st.st_ino, (uint64_t)st.st_dev};
            h = fnv(fnv(h, names[i]->d_name, strlen(names[i]->d_name)), f, sizeof f);
            total += (uint64_t)st.st_size;
        }
        free(names[i]);
    }
    free(names);
    if (rc) return rc;
    snprintf(out, n, "checkpoint %s: config %s, weights %s (sampled), %d safetensors files of %llu bytes (stat %016llx)",
             real, cfg, wts, nf, (unsigned long long)total, (unsigned long long)h);
    return 0;
}

int job_identity_compute(job_identity *id, const job_plan *p, errbuf *err)
{
    memset(id, 0, sizeof *id);
    const char *dir = p->cfg.target.model;
    snprintf(id->target, sizeof id->target, "%s", dir);
    id->layers = p->target.num_layers;
    id->hidden = p->target.hidden_size;
    id->vocab = p->target.vocab_size;
    id->ntaps = p->drafter.num_taps;
    memcpy(id->taps, p->drafter.taps, sizeof(int) * (size_t)id->ntaps);
    id->drafter_parameters = p->numel;
    if (p->cfg.drafter.sliding_window > 0)
        snprintf(id->drafter_windows, sizeof id->drafter_windows, "layer_types %s, sliding_window %d",
                 p->cfg.drafter.layer_types, p->cfg.drafter.sliding_window);
    else
        snprintf(id->drafter_windows, sizeof id->drafter_windows, "full");
    return job_identity_target(dir, id->config_digest, id->weights_digest, err);
}

int job_identity_write(const job_identity *id, const char *path, errbuf *err)
{
    json_t *taps = json_array();
    for (int i = 0; i < id->ntaps; i++) json_array_append_new(taps, json_integer(id->taps[i]));
    json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:o, s:I, s:s}", "target", id->target,
                          "target_config_digest", id->config_digest, "target_weights_digest", id->weights_digest,
                          "target_layers", id->layers, "hidden_size", id->hidden, "vocab_size", id->vocab, "taps", taps,
                          "drafter_parameters", (json_int_t)id->drafter_parameters, "drafter_windows",
                          id->drafter_windows);
    if (!o) return errbuf_set(err, ENOMEM, "%s: cannot build the identity", path);
    int rc = json_file_save(o, path, JSON_INDENT(2) | JSON_SORT_KEYS, err);
    json_decref(o);
    return rc;
}

int job_identity_read(job_identity *id, const char *path, errbuf *err)
{
    memset(id, 0, sizeof *id);
    if (access(path, F_OK) != 0) return errbuf_set(err, ENOENT, "%s: %s", path, strerror(errno));
    json_error_t je;
    json_t *o;
    int rc = json_file_load(&o, path, 0, err);
    if (rc) return rc;
    const char *target = NULL, *cd = NULL, *wd = NULL;
    json_t *taps = NULL;
    json_int_t params = 0;
    if (json_unpack_ex(o, &je, 0, "{s:s, s:s, s:s, s:i, s:i, s:i, s:o, s:I}", "target", &target,
                       "target_config_digest", &cd, "target_weights_digest", &wd, "target_layers", &id->layers,
                       "hidden_size", &id->hidden, "vocab_size", &id->vocab, "taps", &taps, "drafter_parameters",
                       &params) != 0 || !json_is_array(taps) || json_array_size(taps) > HF_MAX_TAPS) {
        rc = errbuf_set(err, EINVAL, "%s: %s", path, je.text[0] ? je.text : "taps: not a list of layers");
    } else {
        snprintf(id->target, sizeof id->target, "%s", target);
        snprintf(id->config_digest, sizeof id->config_digest, "%s", cd);
        snprintf(id->weights_digest, sizeof id->weights_digest, "%s", wd);
        id->drafter_parameters = (uint64_t)params;
        const char *win = json_string_value(json_object_get(o, "drafter_windows"));
        snprintf(id->drafter_windows, sizeof id->drafter_windows, "%s", win ? win : "");
        id->ntaps = (int)json_array_size(taps);
        for (int i = 0; i < id->ntaps; i++) id->taps[i] = (int)json_integer_value(json_array_get(taps, (size_t)i));
    }
    json_decref(o);
    return rc;
}

/* id in words; for the drafter shape (params) only the drafter's part: the checks before it found the target equal. */
static void describe(const job_identity *id, int params, char *out, size_t n)
{
    if (params) {
        snprintf(out, n, "a drafter of %llu parameters, attention %s", (unsigned long long)id->drafter_parameters,
                 id->drafter_windows[0] ? id->drafter_windows : "(not recorded)");
        return;
    }
    size_t o = (size_t)snprintf(out, n, "%s (%d layers, hidden %d, vocab %d, taps [", id->target, id->layers,
                                id->hidden, id->vocab);
    for (int i = 0; i < id->ntaps && o < n; i++) o += (size_t)snprintf(out + o, n - o, "%s%d", i ? "," : "", id->taps[i]);
    if (o < n) snprintf(out + o, n - o, "], weights %s)", id->weights_digest);
}

int job_identity_check(const job_identity *was, const job_identity *now, const char *path, errbuf *err)
{
    const char *what = NULL;
    if (was->layers != now->layers || was->hidden != now->hidden || was->vocab != now->vocab) what = "target shape";
    else if (was->ntaps != now->ntaps || memcmp(was->taps, now->taps, sizeof(int) * (size_t)now->ntaps)) what = "taps";
    else if (strcmp(was->weights_digest, now->weights_digest)) what = "target weights";
    else if (strcmp(was->config_digest, now->config_digest)) what = "target config.json";
    else if (was->drafter_parameters != now->drafter_parameters) what = "drafter shape";
    else if (was->drafter_windows[0] && strcmp(was->drafter_windows, now->drafter_windows)) what = "drafter shape";
    if (!what) return 0;
    int params = !strcmp(what, "drafter shape");
    char a[1024], b[1024];
    describe(was, params, a, sizeof a);
    describe(now, params, b, sizeof b);
    return errbuf_set(err, EINVAL, "--resume: mismatch of the %s: %s was trained against %s; this job has %s (resume with what "
                      "it was trained with, or start over with --fresh)", what, path, a, b);
}
