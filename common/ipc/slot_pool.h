/* slot_pool: the hidden-state pool of one target worker (docs/design.md §2): K slots, each a slot_state word plus a
 * descriptor in a named shm control segment, and the slot data in a separate shareable memory object (CPU backend:
 * a memfd dflashd creates; GPU backend: a VMM allocation the target creates and deposits, its fd and GPU UUID then
 * kept by dflashd, which creates only the control segment). dflashd keeps the data fd so the data outlives every
 * worker; workers attach with the fd passed to them (fdpass) — on the GPU they import it themselves. Producers (targets)
 * claim/publish, consumers (drafters) lease a READY slot by batch id or predicate, check its shape against their
 * buffers (slot_pool_slot_check) and release it; the keeper reclaims a dead worker's epoch. The slot protocol is
 * slot_array's. Handles are process-local; shared state changes only by CAS. Errors: 0 / -errno. */
#ifndef DFLASH_SLOT_POOL_H
#define DFLASH_SLOT_POOL_H

#include "slot_array.h"
#include "util.h"

#include <stdint.h>

struct slot_pool;

#define SLOT_POOL_MAX_SLOTS 1024
#define SLOT_POOL_ALIGN 4096 /* slot_bytes is rounded up to this */

/* One slot's descriptor in the control segment. `state` changes only through the slot_pool_* calls; the other
 * fields are written by the producer between claim and publish and read by the consumer after lease. */
struct slot_pool_desc {
    slot_word state;
    uint64_t batch_id;
    uint32_t ntok;
    uint32_t nseq;
    uint64_t producer_epoch; /* set by claim */
    uint64_t bytes_used;     /* <= slot bytes, checked by publish */
    uint8_t device_uuid[16]; /* GPU holding the data; all zero on the CPU backend */
    uint64_t reserved;
};

/* Predicate for slot_pool_lease: nonzero when the consumer wants this batch. */
typedef slot_array_pred slot_pool_pred;

/* What a reader's buffers hold: a leased slot beyond it is an error, never read. */
struct slot_pool_shape {
    uint32_t max_tokens; /* the slot's ntok may not exceed it */
    uint32_t max_seqs;   /* nor its nseq */
    uint64_t cu_seqlens; /* byte offset of the slot's int32 cu_seqlens (max_seqs + 1) in its data */
};

/* Create the control segment `name` and a memfd of nslots * slot_bytes (slot_bytes rounded up to SLOT_POOL_ALIGN). */
int slot_pool_create(const char *name, uint32_t nslots, uint64_t slot_bytes, struct slot_pool **out, errbuf *err);
/* Map an existing pool: its control segment by name and its data from data_fd (dup'ed; the caller keeps its fd). */
int slot_pool_attach(const char *name, int data_fd, struct slot_pool **out, errbuf *err);
/* GPU pools: create (keeper) or map (workers) the control segment only; the handle has no data mapping and no fd
 * until slot_pool_set_device_data. slot_pool_data must not be called on it. */
int slot_pool_create_control(const char *name, uint32_t nslots, uint64_t slot_bytes, struct slot_pool **out,
                             errbuf *err);
int slot_pool_attach_control(const char *name, struct slot_pool **out, errbuf *err);
/* Keeper: take ownership of a deposited VMM allocation's fd (device_bytes >= nslots * slot_bytes) and record the
 * GPU's UUID in the pool header and every descriptor. -EEXIST when the handle already holds data. */
int slot_pool_set_device_data(struct slot_pool *pool, int fd, const uint8_t uuid[16], uint64_t device_bytes,
                              errbuf *err);
/* The deposited GPU allocation's UUID and size, as recorded in the control segment; -ENOENT when none yet. */
int slot_pool_device(const struct slot_pool *pool, uint8_t uuid[16], uint64_t *device_bytes);
/* Unmap, close the handle's data fd, free, null *pool (segment and data live on while others hold them). */
void slot_pool_destroy(struct slot_pool **pool);
/* Remove the control segment's name (keeper, at job end). */
int slot_pool_unlink(const char *name, errbuf *err);

/* The data fd to pass to workers (owned by the handle; -1 when a GPU pool has not been deposited). */
int slot_pool_data_fd(const struct slot_pool *pool);
/* Slot i's data (slot_pool_slot_bytes bytes). */
void *slot_pool_data(struct slot_pool *pool, int i);
/* Slot i's descriptor. */
struct slot_pool_desc *slot_pool_desc(struct slot_pool *pool, int i);
uint32_t slot_pool_nslots(const struct slot_pool *pool);
uint64_t slot_pool_slot_bytes(const struct slot_pool *pool);

/* Producer: claim any FREE slot as FILLING(owner, epoch), waiting up to timeout_ms (<0 forever, 0 try once).
 * Returns the index or -ETIMEDOUT. */
int slot_pool_claim(struct slot_pool *pool, uint16_t owner, uint64_t epoch, int timeout_ms);
/* Producer: FILLING(owner, epoch) -> READY; -EINVAL when bytes_used exceeds the slot, -ESTALE when not ours. */
int slot_pool_publish(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch);
/* Producer: FILLING(owner, epoch) -> FREE. */
int slot_pool_abandon(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch);
/* Consumer: lease the READY slot with the lowest batch_id for which pred holds (pred NULL: any), waiting up to
 * timeout_ms. Returns the index or -ETIMEDOUT. */
int slot_pool_lease(struct slot_pool *pool, slot_pool_pred pred, void *ctx, uint16_t owner, uint64_t epoch,
                    int timeout_ms);
/* Consumer: lease the READY slot holding batch_id, waiting up to timeout_ms. Index or -ETIMEDOUT. */
int slot_pool_lease_batch(struct slot_pool *pool, uint64_t batch_id, uint16_t owner, uint64_t epoch,
                          int timeout_ms);
/* Consumer, after leasing slot i and before reading it: its descriptor fits shape (ntok, nseq, and bytes_used within
 * the slot) and, when the data is mapped here (host memory), its cu_seqlens run from 0 to ntok without decreasing; a
 * control-only (GPU) handle checks the descriptor only. -EPROTO naming the pool, slot, batch and field. */
int slot_pool_slot_check(struct slot_pool *pool, int i, const struct slot_pool_shape *shape, errbuf *err);
/* List the batch ids of READY slots (a snapshot): fills up to cap ids, returns how many are READY. */
int slot_pool_find_ready(struct slot_pool *pool, uint64_t *batch_ids, int cap);
/* Consumer: LEASED(owner, epoch) -> FREE; -ESTALE when the lease was reclaimed. */
int slot_pool_release(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch);
/* Consumer: LEASED(owner, epoch) -> READY (give back unconsumed). */
int slot_pool_unlease(struct slot_pool *pool, int i, uint16_t owner, uint64_t epoch);
/* Keeper: the worker with this epoch died; FILLING -> FREE, LEASED -> READY; wakes waiters; returns slots changed. */
int slot_pool_reclaim(struct slot_pool *pool, uint64_t epoch, int *freed, int *returned);
/* Count slots per state (snapshot; NULL allowed). */
void slot_pool_stats(struct slot_pool *pool, int *nfree, int *nfilling, int *nready, int *nleased);
/* Slot i's raw state word. */
uint64_t slot_pool_slot_word(struct slot_pool *pool, int i);

#endif
