#include "tfevents.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tensorboard.pb-c.h"

#define TFEVENTS_MAX_SCALARS (DFLASH_MAX_BLOCK + 8)

struct tfevents {
    char path[4096];
    int fd;
    off_t size;        /* bytes of whole records written */
};

/* ---- CRC32C (reflected polynomial 0x82F63B78), table-driven; the table is made once (a pure function of the
 * polynomial, so racing makers write the same values) ---- */

static uint32_t crc_table[256];
static int crc_ready;

uint32_t tfevents_crc32c(const void *p, size_t n)
{
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            crc_table[i] = c;
        }
        __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
    }
    const uint8_t *b = p;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t tfevents_crc_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void put_le32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put_le64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static uint32_t get_le32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get_le64(const uint8_t *p) { return get_le32(p) | (uint64_t)get_le32(p + 4) << 32; }

int tfevents_record_next(const uint8_t *buf, size_t n, size_t *pos, const uint8_t **data, size_t *len, errbuf *err)
{
    size_t at = *pos;
    if (at >= n) return 1;
    if (n - at < 12) return errbuf_set(err, EBADMSG, "record at byte %zu: torn header (%zu bytes)", at, n - at);
    uint64_t l = get_le64(buf + at);
    uint32_t want = get_le32(buf + at + 8), got = tfevents_crc_mask(tfevents_crc32c(buf + at, 8));
    if (want != got)
        return errbuf_set(err, EBADMSG, "record at byte %zu: length CRC 0x%08x, expected 0x%08x", at, want, got);
    if (l > n - at - 12 || n - at - 12 - l < 4)
        return errbuf_set(err, EBADMSG, "record at byte %zu: torn (length %llu, %zu bytes left)", at,
                          (unsigned long long)l, n - at - 12);
    want = get_le32(buf + at + 12 + l);
    got = tfevents_crc_mask(tfevents_crc32c(buf + at + 12, (size_t)l));
    if (want != got)
        return errbuf_set(err, EBADMSG, "record at byte %zu: data CRC 0x%08x, expected 0x%08x", at, want, got);
    *data = buf + at + 12;
    *len = (size_t)l;
    *pos = at + 16 + (size_t)l;
    return 0;
}

static double wall_time(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

/* Frame one Event and append it with one write; a failed or short write is cut back off the file, so the file
 * stays a sequence of whole records. */
static int write_event(tfevents *t, const Tensorboard__Event *ev, errbuf *err)
{
    size_t n = tensorboard__event__get_packed_size(ev);
    uint8_t *rec = xmalloc(n + 16);
    tensorboard__event__pack(ev, rec + 12);
    put_le64(rec, n);
    put_le32(rec + 8, tfevents_crc_mask(tfevents_crc32c(rec, 8)));
    put_le32(rec + 12 + n, tfevents_crc_mask(tfevents_crc32c(rec + 12, n)));
    errno = 0;
    ssize_t w = write(t->fd, rec, n + 16);
    free(rec);
    if (w != (ssize_t)(n + 16)) {
        int e = errno ? errno : ENOSPC; /* a short write without an errno is a full disk */
        if (w > 0 && ftruncate(t->fd, t->size) != 0) { /* O_APPEND: the next write goes to the new end */ }
        return errbuf_set(err, e, "%s: %s", t->path, strerror(e));
    }
    t->size += (off_t)(n + 16);
    return 0;
}

int tfevents_open(tfevents **out, const char *dir, errbuf *err)
{
    *out = NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return errbuf_set(err, errno, "%s: %s", dir, strerror(errno));
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    tfevents *t = xcalloc(1, sizeof *t);
    long long now = (long long)time(NULL);
    /* a second dflashd start within the same second gets a suffix, never the previous file */
    for (int i = 0;; i++) {
        if (i) snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%lld.%s.%d", dir, now, host, i);
        else snprintf(t->path, sizeof t->path, "%s/events.out.tfevents.%lld.%s", dir, now, host);
        t->fd = open(t->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (t->fd >= 0 || errno != EEXIST || i == 99) break;
    }
    if (t->fd < 0) {
        int e = errno;
        errbuf_set(err, e, "%s: %s", t->path, strerror(e));
        free(t);
        return -e;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    int rc = write_event(t, &ev, err);
    if (rc) {
        tfevents_destroy(&t);
        return rc;
    }
    *out = t;
    return 0;
}

int tfevents_write_scalars(tfevents *t, int64_t step, const char *const *tags, const double *values, int n,
                           errbuf *err)
{
    if (n < 0 || n > TFEVENTS_MAX_SCALARS) return errbuf_set(err, EINVAL, "%s: %d scalars in one event", t->path, n);
    Tensorboard__SummaryValue v[TFEVENTS_MAX_SCALARS], *vp[TFEVENTS_MAX_SCALARS];
    for (int i = 0; i < n; i++) {
        tensorboard__summary_value__init(&v[i]);
        v[i].tag = (char *)tags[i];
        v[i].value_case = TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
        v[i].simple_value = (float)values[i];
        vp[i] = &v[i];
    }
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = (size_t)n;
    sum.value = vp;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_event(t, &ev, err);
}

int tfevents_write_step(tfevents *t, uint64_t k, const step_summary *s, int block_size, errbuf *err)
{
    char slot_tags[DFLASH_MAX_BLOCK][24];
    const char *tags[TFEVENTS_MAX_SCALARS];
    double vals[TFEVENTS_MAX_SCALARS];
    int n = 0;
    tags[n] = "loss", vals[n++] = s->loss;
    for (int i = 1; i < block_size && i < DFLASH_MAX_BLOCK; i++) {
        snprintf(slot_tags[i], sizeof slot_tags[i], "slot_accuracy/%d", i);
        tags[n] = slot_tags[i], vals[n++] = step_metrics_slot_accuracy(s, i);
    }
    tags[n] = "acceptance", vals[n++] = s->acceptance;
    tags[n] = "grad_norm", vals[n++] = s->grad_norm;
    tags[n] = "lr", vals[n++] = s->lr;
    tags[n] = "tokens", vals[n++] = (double)s->tokens;
    return tfevents_write_scalars(t, (int64_t)k, tags, vals, n, err);
}

const char *tfevents_path(const tfevents *t) { return t->path; }

void tfevents_destroy(tfevents **tp)
{
    tfevents *t = *tp;
    if (!t) return;
    if (t->fd >= 0) close(t->fd);
    free(t);
    *tp = NULL;
}
