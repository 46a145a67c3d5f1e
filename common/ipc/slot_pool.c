#include "slot_pool.h"

#include "shm.h"

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
    int data_fd;
    char *data;
    size_t data_bytes;
};

static size_t pool_control_bytes(uint32_t nslots)
{
    return SHM_HEADER_BYTES + sizeof(struct slot_pool_shared) + sizeof(struct slot_pool_desc) * nslots;
}

static void pool_bind(struct slot_pool *p)
{
    p->hdr = shm_segment_body(&p->seg);
    p->desc = (struct slot_pool_desc *)(p->hdr + 1);
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
    pool_bind(p);
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
    pool_bind(p);
    uint32_t n = p->hdr->nslots;
    uint64_t sb = p->hdr->slot_bytes;
    if (n < 1 || n > SLOT_POOL_MAX_SLOTS || p->seg.bytes != pool_control_bytes(n)) {
        rc = errbuf_set(err, EPROTO, "slot pool %s: nslots %u does not fit the segment (%zu bytes)", name, n,
                        p->seg.bytes);
        goto fail;
    }
    if (sb == 0 || sb % SLOT_POOL_ALIGN || sb > (UINT64_C(1) << 40) / n || p->hdr->data_bytes != sb * n) {
        rc = errbuf_set(err, EPROTO, "slot pool %s: slot_bytes %llu / data_bytes %llu inconsistent for %u slots",
                        name, (unsigned long long)sb, (unsigned long long)p->hdr->data_bytes, n);
        goto fail;
    }
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

static void pool_check_index(const struct slot_pool *pool, int i)
{
    DF_ASSERT(i >= 0 && (uint32_t)i < pool->hdr->nslots);
}

void *slot_pool_data(struct slot_pool *pool, int i)
{
    pool_check_index(pool, i);
    DF_ASSERT(pool->data); /* a control-only handle has no host mapping */
    return pool->data + (size_t)i * pool->hdr->slot_bytes;
}

struct slot_pool_desc *slot_pool_desc(struct slot_pool *pool, int i)
{
    pool_check_index(pool, i);
    return &pool->desc[i];
}

/* Wait-loop state for one kind of attempt. */
struct pool_try {
    uint16_t owner;
    uint64_t epoch;
    int by_id;
    uint64_t batch_id;
    slot_pool_pred pred;
    void *ctx;
};

static int pool_try_claim(struct slot_pool *pool, const struct pool_try *t)
{
    for (uint32_t i = 0; i < pool->hdr->nslots; i++) {
        if (slot_claim(&pool->desc[i].state, t->owner, t->epoch) == 0) {
            struct slot_pool_desc *d = &pool->desc[i];
            d->producer_epoch = t->epoch;
            d->bytes_used = 0;
            return (int)i;
        }
    }
    return -EAGAIN;
}

static int pool_wants(const struct pool_try *t, uint64_t id)
{
    if (t->by_id) return id == t->batch_id;
    return !t->pred || t->pred(id, t->ctx);
}

/* Lowest wanted batch_id among READY slots. The id is read before the lease CAS, so after winning the lease it is
 * checked again (the slot may have been consumed and refilled in between); a slot that no longer fits is given
 * back with unlease. */
static int pool_try_lease(struct slot_pool *pool, const struct pool_try *t)
{
    for (;;) {
        int best = -1;
        uint64_t best_id = UINT64_MAX;
        for (uint32_t i = 0; i < pool->hdr->nslots; i++) {
            uint64_t w = atomic_load_explicit(&pool->desc[i].state, memory_order_acquire);
            if (slot_word_state(w) != SLOT_STATE_READY) continue;
            uint64_t id = __atomic_load_n(&pool->desc[i].batch_id, __ATOMIC_RELAXED);
            if ((best < 0 || id < best_id) && pool_wants(t, id)) {
                best = (int)i;
                best_id = id;
            }
        }
        if (best < 0) return -EAGAIN;
        struct slot_pool_desc *d = &pool->desc[best];
        if (slot_lease(&d->state, t->owner, t->epoch) != 0) continue;
        if (pool_wants(t, d->batch_id)) return best;
        if (slot_unlease(&d->state, t->owner, t->epoch) == 0) slot_gen_wake(&pool->hdr->generation);
    }
}

struct pool_attempt {
    struct slot_pool *pool;
    int (*try)(struct slot_pool *, const struct pool_try *);
    const struct pool_try *t;
};

static int pool_attempt_once(void *ctx)
{
    struct pool_attempt *a = ctx;
    return a->try(a->pool, a->t);
}

static int pool_wait(struct slot_pool *pool, int (*try)(struct slot_pool *, const struct pool_try *),
                     const struct pool_try *t, int timeout_ms)
{
    struct pool_attempt a = {pool, try, t};
    return slot_gen_retry(&pool->hdr->generation, pool_attempt_once, &a, timeout_ms);
}

int slot_pool_claim(struct slot_pool *pool, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    struct pool_try t = { .owner = owner, .epoch = epoch };
    return pool_wait(pool, pool_try_claim, &t, timeout_ms);
}

int slot_pool_lease(struct slot_pool *pool, slot_pool_pred pred, void *ctx, uint16_t owner, uint64_t epoch,
                    int timeout_ms)
{
    struct pool_try t = { .owner = owner, .epoch = epoch, .pred = pred, .ctx = ctx };
    return pool_wait(pool, pool_try_lease, &t, timeout_ms);
}

int slot_pool_lease_batch(struct slot_pool *pool, uint64_t batch_id, uint16_t owner, uint64_t epoch,
                          int timeout_ms)
{
    struct pool_try t = { .owner = owner, .epoch = epoch, .by_id = 1, .batch_id = batch_id };
    return pool_wait(pool, pool_try_lease, &t, timeout_ms);
}

int slot_pool_find_ready(struct slot_pool *pool, uint64_t *batch_ids, int cap)
{
    int n = 0;
    for (uint32_t i = 0; i < pool->hdr->nslots; i++) {
        uint64_t w = atomic_load_explicit(&pool->desc[i].state, memory_order_acquire);
        if (slot_word_state(w) != SLOT_STATE_READY) continue;
        if (n < cap) batch_ids[n] = __atomic_load_n(&pool->desc[i].batch_id, __ATOMIC_RELAXED);
        n++;
    }
    return n;
}

/* Apply one transition to slot i and wake waiters when it took effect. */
static int pool_step(struct slot_pool *pool, int i, int (*step)(slot_word *, uint16_t, uint64_t), uint16_t owner,
                     uint64_t epoch)
{
    pool_check_index(pool, i);
    int rc = step(&pool->desc[i].state, owner, epoch);
    if (rc == 0) slot_gen_wake(&pool->hdr->generation);
    return rc;
}

int slot_pool_publish(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    pool_check_index(pool, i);
    if (pool->desc[i].bytes_used > pool->hdr->slot_bytes) return -EINVAL;
    return pool_step(pool, i, slot_publish, owner, epoch);
}

int slot_pool_abandon(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    return pool_step(pool, i, slot_abandon, owner, epoch);
}

int slot_pool_release(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    return pool_step(pool, i, slot_release, owner, epoch);
}

int slot_pool_unlease(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch)
{
    return pool_step(pool, i, slot_unlease, owner, epoch);
}

int slot_pool_reclaim(struct slot_pool *pool, uint64_t epoch, int *freed, int *returned)
{
    int nf = 0, nr = 0;
    for (uint32_t i = 0; i < pool->hdr->nslots; i++) {
        int r = slot_reclaim_word(&pool->desc[i].state, epoch);
        nf += r == SLOT_RECLAIM_FREED;
        nr += r == SLOT_RECLAIM_RETURNED;
    }
    if (freed) *freed = nf;
    if (returned) *returned = nr;
    if (nf + nr) slot_gen_wake(&pool->hdr->generation);
    return nf + nr;
}

void slot_pool_stats(struct slot_pool *pool, int *nfree, int *nfilling, int *nready, int *nleased)
{
    int c[4] = { 0, 0, 0, 0 };
    for (uint32_t i = 0; i < pool->hdr->nslots; i++) {
        enum slot_state st = slot_word_state(atomic_load_explicit(&pool->desc[i].state, memory_order_relaxed));
        if ((unsigned)st < 4) c[st]++;
    }
    if (nfree) *nfree = c[SLOT_STATE_FREE];
    if (nfilling) *nfilling = c[SLOT_STATE_FILLING];
    if (nready) *nready = c[SLOT_STATE_READY];
    if (nleased) *nleased = c[SLOT_STATE_LEASED];
}

uint64_t slot_pool_slot_word(struct slot_pool *pool, int i)
{
    pool_check_index(pool, i);
    return atomic_load_explicit(&pool->desc[i].state, memory_order_acquire);
}
