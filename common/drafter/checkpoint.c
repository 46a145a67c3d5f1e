#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "drafter_model.h"
#include "safetensors.h"

void checkpoint_dir(const char *root, uint64_t step, char *out, size_t n)
{
    snprintf(out, n, "%s/step-%08llu", root, (unsigned long long)step);
}

int checkpoint_exists(const char *root, uint64_t step)
{
    char dir[4096];
    struct stat sb;
    checkpoint_dir(root, step, dir, sizeof dir);
    return stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int fsync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[4352];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int write_state_json(const char *path, const checkpoint_state *st, errbuf *err)
{
    json_t *o = json_pack("{s:I, s:I, s:i}", "step", (json_int_t)st->step, "batches_committed",
                          (json_int_t)st->batches_committed, "seed", st->seed);
    errno = 0;
    int e = json_dump_file(o, path, JSON_INDENT(2)) == 0 ? 0 : errno ? errno : EIO;
    json_decref(o);
    if (e) return errbuf_set(err, e, "%s: cannot write: %s", path, strerror(e));
    if ((e = -fsync_path(path)) != 0) return errbuf_set(err, e, "%s: fsync failed: %s", path, strerror(e));
    return 0;
}

/* Fault injection for the tests of a full disk (tests/system/disk_full.sh, which may run as root, where a
 * read-only folder does not stop writes): while the file named by DFLASH_FAULT_CKPT_ENOSPC exists, writing a
 * checkpoint's files fails with ENOSPC, as a full disk makes it fail, and takes the same way out. */
static int fault_enospc(const char *dir, errbuf *err)
{
    const char *f = getenv("DFLASH_FAULT_CKPT_ENOSPC");
    if (!f || !*f || access(f, F_OK) != 0) return 0;
    return errbuf_set(err, ENOSPC, "%s/model.safetensors: write failed: %s", dir, strerror(ENOSPC));
}

int checkpoint_write(const char *root, const hf_config *drafter, const float *w, const float *m, const float *v,
                     uint64_t numel, const checkpoint_state *st, errbuf *err)
{
    char tmp[4096], final_dir[4096], path[4200];
    if (mkdir(root, 0755) != 0 && errno != EEXIST) return errbuf_set(err, errno, "%s: %s", root, strerror(errno));
    checkpoint_dir(root, st->step, final_dir, sizeof final_dir);
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08llu-%d", root, (unsigned long long)st->step, (int)getpid());
    remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0) return errbuf_set(err, errno, "%s: %s", tmp, strerror(errno));
    /* the z-lab export: the flat weights laid out by name (drafter_layout) */
    DF_ASSERT(drafter_layout_numel(drafter) == numel);
    int rc = fault_enospc(tmp, err);
    if (!rc) rc = drafter_weights_save(drafter, w, tmp, ST_BF16, err);
    if (rc) goto fail;
    st_write_tensor t[3] = {{.name = "master", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)numel}, .data = w},
                            {.name = "adam_m", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)numel}, .data = m},
                            {.name = "adam_v", .dtype = ST_F32, .ndim = 1, .shape = {(int64_t)numel}, .data = v}};
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if ((rc = st_write(path, t, 3, NULL, err))) goto fail;
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    if ((rc = write_state_json(path, st, err))) goto fail;
    fsync_path(tmp);
    remove_tree(final_dir); /* an earlier incomplete attempt cannot exist (rename is atomic); a rewrite replaces */
    if (rename(tmp, final_dir) != 0) {
        rc = errbuf_set(err, errno, "rename %s -> %s: %s", tmp, final_dir, strerror(errno));
        goto fail;
    }
    char link_tmp[4200], link_path[4200], target[64];
    snprintf(target, sizeof target, "step-%08llu", (unsigned long long)st->step);
    snprintf(link_tmp, sizeof link_tmp, "%s/.latest-%d", root, (int)getpid());
    snprintf(link_path, sizeof link_path, "%s/latest", root);
    unlink(link_tmp);
    if (symlink(target, link_tmp) != 0 || rename(link_tmp, link_path) != 0) {
        int e = errno;
        unlink(link_tmp);
        remove_tree(final_dir); /* not the latest: a retry writes it again (checkpoint_exists would skip it) */
        return errbuf_set(err, e, "%s: cannot switch to %s: %s", link_path, target, strerror(e));
    }
    fsync_path(root);
    return 0;
fail:
    remove_tree(tmp);
    return rc;
}

/* A reader's hold on one step folder: the folder `latest` (or dir) names, resolved once and locked shared (flock) so
 * that checkpoint_prune leaves it alone while both of its files are read. A folder removed between the resolution
 * and the lock (the prune held it) is resolved again from `latest`, which then names a newer one. */
typedef struct ckpt_hold {
    int fd;
    char path[4352];
} ckpt_hold;

static int hold_open(const char *root, const char *dir, ckpt_hold *h, errbuf *err)
{
    for (int tries = 0;; tries++) {
        if (dir) {
            snprintf(h->path, sizeof h->path, "%s", dir);
        } else {
            char link[4200], to[1024];
            snprintf(link, sizeof link, "%s/latest", root);
            ssize_t n = readlink(link, to, sizeof to - 1);
            if (n > 0) {
                to[n] = 0;
                if (to[0] == '/') snprintf(h->path, sizeof h->path, "%s", to);
                else snprintf(h->path, sizeof h->path, "%s/%s", root, to);
            } else {
                snprintf(h->path, sizeof h->path, "%s", link); /* not a link: a folder named latest */
            }
        }
        h->fd = open(h->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (h->fd >= 0) {
            struct stat a, b;
            if (flock(h->fd, LOCK_SH) == 0 && fstat(h->fd, &a) == 0 && stat(h->path, &b) == 0 &&
                a.st_ino == b.st_ino && a.st_dev == b.st_dev)
                return 0;
            close(h->fd);
            h->fd = -1;
            errno = ENOENT;
        }
        if (dir || errno != ENOENT || tries >= 16)
            return errbuf_set(err, errno, "%s: cannot open the checkpoint: %s", h->path, strerror(errno));
    }
}

static void hold_close(ckpt_hold *h)
{
    if (h->fd >= 0) close(h->fd); /* drops the lock */
    h->fd = -1;
}

int checkpoint_hold_step(const char *root, uint64_t step, int *fd, errbuf *err)
{
    ckpt_hold h;
    char dir[4352];
    checkpoint_dir(root, step, dir, sizeof dir);
    int rc = hold_open(root, dir, &h, err);
    *fd = rc ? -1 : h.fd;
    return rc;
}

static int read_state_in(const char *base, checkpoint_state *st, errbuf *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/trainer_state.json", base);
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return errbuf_set(err, ENOENT, "%s: %s", path, je.text);
    json_t *step = json_object_get(o, "step"), *fr = json_object_get(o, "batches_committed"),
           *seed = json_object_get(o, "seed");
    if (!json_is_integer(step) || !json_is_integer(fr) || !json_is_integer(seed)) {
        json_decref(o);
        return errbuf_set(err, EINVAL, "%s: step, batches_committed and seed must be integers", path);
    }
    st->step = (uint64_t)json_integer_value(step);
    st->batches_committed = (uint64_t)json_integer_value(fr);
    st->seed = (int)json_integer_value(seed);
    json_decref(o);
    return 0;
}

int checkpoint_read_state(const char *root, const char *dir, checkpoint_state *st, errbuf *err)
{
    ckpt_hold h;
    int rc = hold_open(root, dir, &h, err);
    if (!rc) rc = read_state_in(h.path, st, err);
    hold_close(&h);
    return rc;
}

int checkpoint_read(const char *root, const char *dir, float *w, float *m, float *v, uint64_t numel,
                    checkpoint_state *st, errbuf *err)
{
    char path[4400];
    ckpt_hold h;
    int rc = hold_open(root, dir, &h, err);
    if (!rc) rc = read_state_in(h.path, st, err);
    st_file *f = NULL;
    if (!rc) {
        snprintf(path, sizeof path, "%s/optimizer.safetensors", h.path);
        rc = st_open(&f, path, err);
    }
    if (!rc) {
        int64_t shape[1] = {(int64_t)numel};
        rc = st_read_f32(f, "master", w, 1, shape, err);
        if (!rc) rc = st_read_f32(f, "adam_m", m, 1, shape, err);
        if (!rc) rc = st_read_f32(f, "adam_v", v, 1, shape, err);
        st_close(&f);
    }
    hold_close(&h);
    return rc;
}

/* The disk a folder's files take (allocated blocks). */
static uint64_t tree_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t n = 0;
    struct dirent *e;
    char p[4352];
    struct stat sb;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &sb) == 0) n += (uint64_t)sb.st_blocks * 512;
    }
    closedir(d);
    return n;
}

static int cmp_step_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int checkpoint_prune(const char *root, const checkpoint_retention *keep, uint64_t latest, checkpoint_disk *disk,
                     errbuf *err)
{
    memset(disk, 0, sizeof *disk);
    DIR *d = opendir(root);
    if (!d) return errbuf_set(err, errno, "%s: %s", root, strerror(errno));
    uint64_t *steps = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned long long s;
        char tail, left[4352];
        if (!strncmp(e->d_name, ".removing-step-", 15)) { /* a prune that died midway */
            snprintf(left, sizeof left, "%s/%s", root, e->d_name);
            remove_tree(left);
            continue;
        }
        if (sscanf(e->d_name, "step-%llu%c", &s, &tail) != 1 || strlen(e->d_name) != 13) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            uint64_t *g = realloc(steps, cap * sizeof *g);
            if (!g) {
                free(steps);
                closedir(d);
                return errbuf_set(err, ENOMEM, "%s: out of memory listing checkpoints", root);
            }
            steps = g;
        }
        steps[n++] = s;
    }
    closedir(d);
    qsort(steps, n, sizeof *steps, cmp_step_desc);
    char dir[4096], gone[4200];
    for (size_t i = 0; i < n; i++) {
        checkpoint_dir(root, steps[i], dir, sizeof dir);
        int kept = keep->keep_checkpoints == 0 || i < (size_t)keep->keep_checkpoints || steps[i] == latest ||
                   (keep->keep_every > 0 && steps[i] % (uint64_t)keep->keep_every == 0);
        if (!kept) {
            int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
                /* renamed first: a reader that resolved this path finds it gone and resolves `latest` again */
                snprintf(gone, sizeof gone, "%s/.removing-step-%08llu-%d", root, (unsigned long long)steps[i],
                         (int)getpid());
                if (rename(dir, gone) == 0) {
                    remove_tree(gone);
                    disk->removed++;
                } else {
                    kept = 1;
                }
            } else {
                kept = 1; /* a reader holds it (or it vanished): the next prune looks again */
                if (fd >= 0) disk->busy++;
            }
            if (fd >= 0) close(fd);
        }
        if (kept) {
            disk->kept++;
            disk->bytes += tree_bytes(dir);
        }
    }
    free(steps);
    return 0;
}
