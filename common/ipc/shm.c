#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int shm_check_name(const char *name, errbuf *err)
{
    size_t n = name ? strlen(name) : 0;
    if (n < 2 || name[0] != '/' || strchr(name + 1, '/') || n > SHM_NAME_MAX)
        return errbuf_set(err, EINVAL, "shm segment name \"%s\": must be \"/name\" with no other '/' and at most %d "
                          "characters", name ? name : "(null)", SHM_NAME_MAX);
    return 0;
}

int shm_segment_create(struct shm_segment *seg, const char *name, uint32_t kind, size_t bytes, errbuf *err)
{
    memset(seg, 0, sizeof *seg);
    int rc = shm_check_name(name, err);
    if (rc) return rc;
    if (bytes < SHM_HEADER_BYTES)
        return errbuf_set(err, EINVAL, "shm segment %s: size %zu is smaller than its %d-byte header", name, bytes,
                          SHM_HEADER_BYTES);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errbuf_set(err, errno, "shm segment %s: create: %s", name, strerror(errno));
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) < 0) {
        rc = errbuf_set(err, errno, "shm segment %s: size to %zu bytes: %s", name, bytes, strerror(errno));
        goto fail;
    }
    base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        rc = errbuf_set(err, errno, "shm segment %s: map %zu bytes: %s", name, bytes, strerror(errno));
        goto fail;
    }
    close(fd);
    struct shm_header *h = base;
    h->version = SHM_VERSION;
    h->kind = kind;
    h->total_bytes = bytes;
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    snprintf(seg->name, sizeof seg->name, "%s", name);
    seg->base = base;
    seg->bytes = bytes;
    return 0;
fail:
    close(fd);
    shm_unlink(name);
    return rc;
}

int shm_segment_open(struct shm_segment *seg, const char *name, uint32_t kind, errbuf *err)
{
    memset(seg, 0, sizeof *seg);
    int rc = shm_check_name(name, err);
    if (rc) return rc;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) return errbuf_set(err, errno, "shm segment %s: open: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = errbuf_set(err, errno, "shm segment %s: stat: %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    size_t bytes = (size_t)st.st_size;
    if (bytes < SHM_HEADER_BYTES) {
        close(fd);
        return errbuf_set(err, EPROTO, "shm segment %s: %zu bytes, smaller than the %d-byte header", name, bytes,
                          SHM_HEADER_BYTES);
    }
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int map_errno = errno;
    close(fd);
    if (base == MAP_FAILED)
        return errbuf_set(err, map_errno, "shm segment %s: map %zu bytes: %s", name, bytes, strerror(map_errno));
    struct shm_header *h = base;
    uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
    if (magic != SHM_MAGIC)
        rc = errbuf_set(err, EPROTO, "shm segment %s: bad magic 0x%016llx (not a dflash segment, or not yet "
                        "initialised)", name, (unsigned long long)magic);
    else if (h->version != SHM_VERSION)
        rc = errbuf_set(err, EPROTO,
                        "shm segment %s: layout version %u, this build speaks %d (made by another dflash build: stop "
                        "the job's processes, remove /dev/shm%s, start again)",
                        name, h->version, SHM_VERSION, name);
    else if (h->kind != kind)
        rc = errbuf_set(err, EPROTO, "shm segment %s: kind %u, expected %u", name, h->kind, kind);
    else if (h->total_bytes != bytes)
        rc = errbuf_set(err, EPROTO, "shm segment %s: header says %llu bytes but the segment has %zu", name,
                        (unsigned long long)h->total_bytes, bytes);
    if (rc) {
        munmap(base, bytes);
        return rc;
    }
    snprintf(seg->name, sizeof seg->name, "%s", name);
    seg->base = base;
    seg->bytes = bytes;
    return 0;
}

void shm_segment_close(struct shm_segment *seg)
{
    if (seg->base) munmap(seg->base, seg->bytes);
    seg->base = NULL;
    seg->bytes = 0;
}

int shm_segment_unlink(const char *name, errbuf *err)
{
    int rc = shm_check_name(name, err);
    if (rc) return rc;
    if (shm_unlink(name) < 0) return errbuf_set(err, errno, "shm segment %s: unlink: %s", name, strerror(errno));
    return 0;
}

void *shm_segment_body(const struct shm_segment *seg)
{
    return (char *)seg->base + SHM_HEADER_BYTES;
}

int shm_memfd_create(const char *name, size_t bytes, errbuf *err)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return errbuf_set(err, errno, "memfd %s: create: %s", name, strerror(errno));
    if (ftruncate(fd, (off_t)bytes) < 0) {
        int rc = errbuf_set(err, errno, "memfd %s: size to %zu bytes: %s", name, bytes, strerror(errno));
        close(fd);
        return rc;
    }
    return fd;
}

void *shm_map_fd(int fd, size_t *bytes, errbuf *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0) {
        errbuf_set(err, errno, "fd %d: stat: %s", fd, strerror(errno));
        return NULL;
    }
    size_t have = (size_t)st.st_size;
    if (*bytes && *bytes != have) {
        errbuf_set(err, EPROTO, "fd %d: %zu bytes, expected %zu", fd, have, *bytes);
        return NULL;
    }
    if (have == 0) {
        errbuf_set(err, EINVAL, "fd %d: empty, nothing to map", fd);
        return NULL;
    }
    void *p = mmap(NULL, have, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        errbuf_set(err, errno, "fd %d: map %zu bytes: %s", fd, have, strerror(errno));
        return NULL;
    }
    *bytes = have;
    return p;
}
