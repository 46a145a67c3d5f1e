#include "slot_pool.h"

#include "shm.h"
#include "slot_array.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Control segment: [shm_header 64][slot_pool_shared 64][nslots * slot_pool_desc (64 each)]. */
struct slot_pool_shared {
    uint32_t nslots, reserved0;
    uint64_t slot_bytes;
    uint64_t data_bytes;
    _Atomic uint32_t generation; /* futex word: bumped on publish, abandon, release, unlease, reclaim */
    uint32_t reserved1;
    uint64_t device_bytes;       /* GPU pool: size of the VMM allocation deposited with the keeper; 0 otherwise */
    uint8_t device_uuid[16];     /* GPU pool: the GPU holding it */
    uint64_t reserved[1];
};
_Static_assert(sizeof(struct slot_pool_shared) == 64, "pool header is one cache line");
_Static_assert(sizeof(struct slot_pool_desc) == 64, "a descriptor is one cache line");

struct slot_pool {
    struct shm_segment seg;
    struct slot_pool_shared *hdr;
    struct slot_pool_desc *desc;
    struct slot_array array;       /* the descriptors' state words and batch ids */
    char label[SHM_NAME_MAX + 16]; /* "slot pool <name>", for messages */
    int data_fd;
    char *data;
    size_t data_bytes;
};

static size_t pool_control_bytes(uint32_t nslots)
{
    return SHM_HEADER_BYTES + sizeof(struct slot_pool_shared) + sizeof(struct slot_pool_desc) * nslots;
}

/* Point the handle at its control segment; nslots is the header's (set by the creator, checked by an opener). */
static void pool_bind(struct slot_pool *p, uint32_t nslots)
{
    p->hdr = shm_segment_body(&p->seg);
    p->desc = (struct slot_pool_desc *)(p->hdr + 1);
    snprintf(p->label, sizeof p->label, "slot pool %s", p->seg.name);
    p->array = slot_array_view(p->label, nslots, &p->desc[0].state, sizeof *p->desc, &p->desc[0].batch_id,
                               sizeof *p->desc, &p->hdr->generation);
}

static void pool_free(struct slot_pool *p)
{
    if (p->data) munmap(p->data, p->data_bytes);
    if (p->data_fd >= 0) close(p->data_fd);
    shm_segment_close(&p->seg);
    free(p);
}

/* The control segment alone (no data yet); *out holds it with data_fd -1. */
static int pool_create_segment(const char *name, uint32_t nslots, uint64_t slot_bytes, struct slot_pool **out,
                               errbuf *err)
{
    *out = NULL;
    if (nslots < 1 || nslots > SLOT_POOL_MAX_SLOTS)
        return errbuf_set(err, EINVAL, "slot pool %s: nslots %u out of range 1..%d", name, nslots,
                          SLOT_POOL_MAX_SLOTS);
    if (slot_bytes < 1 || slot_bytes > (UINT64_C(1) << 40) / nslots)
        return errbuf_set(err, EINVAL, "slot pool %s: slot_bytes %llu out of range 1..%llu", name,
                          (unsigned long long)slot_bytes, (unsigned long long)((UINT64_C(1) << 40) / nslots));
    slot_bytes = (slot_bytes + SLOT_POOL_ALIGN - 1) / SLOT_POOL_ALIGN * SLOT_POOL_ALIGN;
    struct slot_pool *p = xcalloc(1, sizeof *p);
    p->data_fd = -1;
    int rc = shm_segment_create(&p->seg, name, SHM_KIND_SLOT_POOL, pool_control_bytes(nslots), err);
    if (rc) {
        pool_free(p);
        return rc;
    }
    pool_bind(p, nslots);
    p->hdr->nslots = nslots;
    p->hdr->slot_bytes = slot_bytes;
    p->hdr->data_bytes = slot_bytes * nslots;
    atomic_thread_fence(memory_order_release);
    *out = p;
    return 0;
}

int slot_pool_create(const char *name, uint32_t nslots, uint64_t slot_bytes, struct slot_pool **out, errbuf *err)
{
    struct slot_pool *p = NULL;
    int rc = pool_create_segment(name, nslots, slot_bytes, &p, err);
    if (rc) return rc;
    char fdname[64];
    snprintf(fdname, sizeof fdname, "dflash-pool%.48s", name);
    p->data_bytes = p->hdr->data_bytes;
    p->data_fd = shm_memfd_create(fdname, p->data_bytes, err);
    if (p->data_fd < 0) {
        rc = errbuf_wrap(err, p->data_fd, "slot pool %s", name);
        p->data_fd = -1;
        goto fail;
    }
    size_t bytes = p->data_bytes;
    p->data = shm_map_fd(p->data_fd, &bytes, err);
    if (!p->data) {
        rc = errbuf_wrap(err, -EIO, "slot pool %s", name);
        goto fail;
    }
    *out = p;
    return 0;
fail:
    shm_segment_unlink(name, NULL);
    pool_free(p);
    return rc;
}

int slot_pool_create_control(const char *name, uint32_t nslots, uint64_t slot_bytes, struct slot_pool **out,
                             errbuf *err)
{
    return pool_create_segment(name, nslots, slot_bytes, out, err);
}

/* Map the control segment and check its header. */
static int pool_open_segment(const char *name, struct slot_pool **out, errbuf *err)
{
    *out = NULL;
    struct slot_pool *p = xcalloc(1, sizeof *p);
    p->data_fd = -1;
    int rc = shm_segment_open(&p->seg, name, SHM_KIND_SLOT_POOL, err);
    if (rc) goto fail;
    if (p->seg.bytes < pool_control_bytes(0)) {
        rc = errbuf_set(err, EPROTO, "slot pool %s: %zu bytes, too small for the pool header", name, p->seg.bytes);
        goto fail;
    }
    const struct slot_pool_shared *h = shm_segment_body(&p->seg);
    uint32_t n = h->nslots;
    uint64_t sb = h->slot_bytes;
    if (n < 1 || n > SLOT_POOL_MAX_SLOTS || p->seg.bytes != pool_control_bytes(n)) {
        rc = errbuf_set(err, EPROTO, "slot pool %s: nslots %u does not fit the segment (%zu bytes)", name, n,
                        p->seg.bytes);
        goto fail;
    }
    if (sb == 0 || sb % SLOT_POOL_ALIGN || sb > (UINT64_C(1) << 40) / n || h->data_bytes != sb * n) {
        rc = errbuf_set(err, EPROTO, "slot pool %s: slot_bytes %llu / data_bytes %llu inconsistent for %u slots",
                        name, (unsigned long long)sb, (unsigned long long)h->data_bytes, n);
        goto fail;
    }
    pool_bind(p, n);
    *out = p;
    return 0;
fail:
    pool_free(p);
    return rc;
}

int slot_pool_attach_control(const char *name, struct slot_pool **out, errbuf *err)
{
    return pool_open_segment(name, out, err);
}

int slot_pool_attach(const char *name, int data_fd, struct slot_pool **out, errbuf *err)
{
    struct slot_pool *p = NULL;
    int rc = pool_open_segment(name, &p, err);
    if (rc) return rc;
    p->data_fd = fcntl(data_fd, F_DUPFD_CLOEXEC, 0);
    if (p->data_fd < 0) {
        rc = errbuf_set(err, errno, "slot pool %s: data fd %d: %s", name, data_fd, strerror(errno));
        goto fail;
    }
    size_t bytes = (size_t)p->hdr->data_bytes;
    p->data = shm_map_fd(p->data_fd, &bytes, err);
    if (!p->data) {
        rc = errbuf_wrap(err, -EPROTO, "slot pool %s: data", name);
        goto fail;
    }
    p->data_bytes = bytes;
    *out = p;
    return 0;
fail:
    pool_free(p);
    return rc;
}

int slot_pool_set_device_data(struct slot_pool *pool, int fd, const uint8_t uuid[16], uint64_t device_bytes,
                              errbuf *err)
{
    if (pool->data_fd >= 0 || pool->data)
        return errbuf_set(err, EEXIST, "slot pool: data already held (fd %d)", pool->data_fd);
    if (device_bytes < pool->hdr->data_bytes)
        return errbuf_set(err, EINVAL, "slot pool: device allocation of %llu bytes is below the %u slots x %llu "
                          "bytes needed", (unsigned long long)device_bytes, pool->hdr->nslots,
                          (unsigned long long)pool->hdr->slot_bytes);
    pool->data_fd = fd;
    memcpy(pool->hdr->device_uuid, uuid, 16);
    for (uint32_t i = 0; i < pool->hdr->nslots; i++) memcpy(pool->desc[i].device_uuid, uuid, 16);
    atomic_thread_fence(memory_order_release);
    pool->hdr->device_bytes = device_bytes;
    return 0;
}

int slot_pool_device(const struct slot_pool *pool, uint8_t uuid[16], uint64_t *device_bytes)
{
    uint64_t b = __atomic_load_n(&pool->hdr->device_bytes, __ATOMIC_ACQUIRE);
    if (!b) return -ENOENT;
    if (uuid) memcpy(uuid, pool->hdr->device_uuid, 16);
    if (device_bytes) *device_bytes = b;
    return 0;
}

void slot_pool_destroy(struct slot_pool **pool)
{
    if (!*pool) return;
    pool_free(*pool);
    *pool = NULL;
}

int slot_pool_unlink(const char *name, errbuf *err)
{
    return shm_segment_unlink(name, err);
}

int slot_pool_data_fd(const struct slot_pool *pool) { return pool->data_fd; }
uint32_t slot_pool_nslots(const struct slot_pool *pool) { return pool->hdr->nslots; }
uint64_t slot_pool_slot_bytes(const struct slot_pool *pool) { return pool->hdr->slot_bytes; }

void *slot_pool_data(struct slot_pool *pool, int i)
{
    slot_array_check_index(&pool->array, i);
    DF_ASSERT(pool->data); /* a control-only handle has no host mapping */
    return pool->data + (size_t)i * pool->hdr->slot_bytes;
}

struct slot_pool_desc *slot_pool_desc(struct slot_pool *pool, int i)
{
    slot_array_check_index(&pool->array, i);
    return &pool->desc[i];
}

int slot_pool_slot_check(struct slot_pool *pool, int i, const struct slot_pool_shape *shape, errbuf *err)
{
    const struct slot_pool_desc *d = slot_pool_desc(pool, i);
    const uint64_t sb = pool->hdr->slot_bytes;
    if (d->bytes_used > sb)
        return errbuf_set(err, EPROTO, "%s: slot %d (batch %llu): bytes_used %llu exceeds the slot's %llu bytes",
                          pool->label, i, (unsigned long long)d->batch_id, (unsigned long long)d->bytes_used,
                          (unsigned long long)sb);
    struct slot_shape sh = { .ntok = d->ntok, .nseq = d->nseq };
    if (pool->data) { /* host memory: the token part can be checked too */
        if (shape->cu_seqlens > sb || (sb - shape->cu_seqlens) / sizeof(int32_t) < (uint64_t)shape->max_seqs + 1)
            return errbuf_set(err, EINVAL, "%s: cu_seqlens at byte %llu with max_seqs %u do not fit a slot of %llu "
                              "bytes", pool->label, (unsigned long long)shape->cu_seqlens, shape->max_seqs,
                              (unsigned long long)sb);
        sh.cu_seqlens = (const int32_t *)((const char *)slot_pool_data(pool, i) + shape->cu_seqlens);
    }
    return slot_array_check_shape(&pool->array, i, &sh, shape->max_tokens, shape->max_seqs, err);
}

int slot_pool_claim(struct slot_pool *pool, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    int i = slot_array_claim(&pool->array, owner, epoch, timeout_ms);
    if (i >= 0) { /* FILLING and ours: no one else writes the descriptor now */
        pool->desc[i].producer_epoch = epoch;
        pool->desc[i].bytes_used = 0;
    }
    return i;
}

int slot_pool_publish(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    if (slot_pool_desc(pool, i)->bytes_used > pool->hdr->slot_bytes) return -EINVAL;
    return slot_array_publish(&pool->array, i, owner, epoch);
}

int slot_pool_abandon(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    return slot_array_abandon(&pool->array, i, owner, epoch);
}

int slot_pool_lease(struct slot_pool *pool, slot_pool_pred pred, void *ctx, uint16_t owner, uint64_t epoch,
                    int timeout_ms)
{
    struct slot_array_want want = { .pred = pred, .ctx = ctx };
    return slot_array_lease(&pool->array, &want, owner, epoch, timeout_ms);
}

int slot_pool_lease_batch(struct slot_pool *pool, uint64_t batch_id, uint16_t owner, uint64_t epoch,
                          int timeout_ms)
{
    struct slot_array_want want = { .by_id = 1, .batch_id = batch_id };
    return slot_array_lease(&pool->array, &want, owner, epoch, timeout_ms);
}

int slot_pool_find_ready(struct slot_pool *pool, uint64_t *batch_ids, int cap)
{
    return slot_array_find_ready(&pool->array, batch_ids, cap);
}

int slot_pool_release(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    return slot_array_release(&pool->array, i, owner, epoch);
}

int slot_pool_unlease(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    return slot_array_unlease(&pool->array, i, owner, epoch);
}

int slot_pool_reclaim(struct slot_pool *pool, uint64_t epoch, int *freed, int *returned)
{
    return slot_array_reclaim(&pool->array, epoch, freed, returned);
}

void slot_pool_stats(struct slot_pool *pool, int *nfree, int *nfilling, int *nready, int *nleased)
{
    slot_array_stats(&pool->array, nfree, nfilling, nready, nleased);
}

uint64_t slot_pool_slot_word(struct slot_pool *pool, int i)
{
    return slot_array_word(&pool->array, i);
}
