/* slot_array: the one slot mechanism of the data plane (docs/design.md §2), under both the token ring and the
 * hidden-state pools. A struct slot_array is a process-local view that owns nothing: nslots slot_state words and
 * the batch id each slot carries, both in shared memory at a fixed stride (the container's layout decides where),
 * and the futex generation word every transition bumps. It claims, publishes, leases (the lowest READY batch id,
 * optionally only one id or those a predicate wants), releases, gives back, reclaims a dead epoch's slots and counts
 * them; and checks a leased slot's shape against the reader's buffers. Safe from any thread or process (shared state
 * changes only by CAS); transitions return 0 / -errno, waits the slot index or -ETIMEDOUT. */
#ifndef DFLASH_SLOT_ARRAY_H
#define DFLASH_SLOT_ARRAY_H

#include "slot_state.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

struct slot_array {
    const char *name;      /* the segment's name, for messages (the container's storage) */
    uint32_t nslots;
    char *words;           /* slot i's state word at words + i * word_stride */
    size_t word_stride;
    char *ids;             /* slot i's batch id (uint64_t) at ids + i * id_stride */
    size_t id_stride;
    _Atomic uint32_t *gen; /* futex word: bumped on publish, abandon, release, unlease, reclaim */
};

/* Nonzero when a consumer wants this batch. */
typedef int (*slot_array_pred)(uint64_t batch_id, void *ctx);

/* Which READY slots a lease may take: the lowest batch id among those wanted. */
struct slot_array_want {
    int by_id;           /* only batch_id */
    uint64_t batch_id;
    slot_array_pred pred; /* else those pred holds for (NULL: any) */
    void *ctx;
};

/* A leased slot's shape as its descriptor states it. cu_seqlens (nseq + 1 entries, host memory) may be NULL when the
 * data lives on a GPU: then only the descriptor is checked. */
struct slot_shape {
    uint32_t ntok, nseq;
    const int32_t *cu_seqlens;
};

/* The view of a container's slots (all pointers into one mapping; name is kept, not copied). */
struct slot_array slot_array_view(const char *name, uint32_t nslots, slot_word *word0, size_t word_stride,
                                  uint64_t *id0, size_t id_stride, _Atomic uint32_t *gen);

/* Producer: claim a FREE slot as FILLING(owner, epoch), waiting up to timeout_ms (<0 forever, 0 try once) while
 * none is free. The slot index or -ETIMEDOUT. */
int slot_array_claim(struct slot_array *a, uint16_t owner, uint64_t epoch, int timeout_ms);
/* Producer: FILLING(owner, epoch) -> READY (-ESTALE when not ours). */
int slot_array_publish(struct slot_array *a, int i, uint16_t owner, uint64_t epoch);
/* Producer: FILLING(owner, epoch) -> FREE. */
int slot_array_abandon(struct slot_array *a, int i, uint16_t owner, uint64_t epoch);
/* Consumer: lease the READY slot with the lowest wanted batch id (want NULL: any), waiting up to timeout_ms. The id
 * is read again after the lease CAS: when the slot was consumed and refilled between the scan and the CAS, it is
 * given back and the scan redone, so the slot returned always holds the id the scan chose. Index or -ETIMEDOUT. */
int slot_array_lease(struct slot_array *a, const struct slot_array_want *want, uint16_t owner, uint64_t epoch,
                     int timeout_ms);
/* Consumer: LEASED(owner, epoch) -> FREE after consuming (-ESTALE when the lease was reclaimed). */
int slot_array_release(struct slot_array *a, int i, uint16_t owner, uint64_t epoch);
/* Consumer: LEASED(owner, epoch) -> READY, giving the batch back unconsumed. */
int slot_array_unlease(struct slot_array *a, int i, uint16_t owner, uint64_t epoch);
/* The batch ids of READY slots (a snapshot): fills up to cap ids, returns how many are READY. */
int slot_array_find_ready(struct slot_array *a, uint64_t *batch_ids, int cap);
/* Keeper: the worker with this epoch died; FILLING(*, epoch) -> FREE, LEASED(*, epoch) -> READY, and wake waiters.
 * Returns the number of slots changed; counts in *freed / *returned (NULL allowed). */
int slot_array_reclaim(struct slot_array *a, uint64_t epoch, int *freed, int *returned);
/* Count slots per state (a snapshot; NULL allowed for any). */
void slot_array_stats(const struct slot_array *a, int *nfree, int *nfilling, int *nready, int *nleased);
/* Slot i's raw state word, and the batch id it carries (meaningful while READY or LEASED). */
uint64_t slot_array_word(const struct slot_array *a, int i);
uint64_t slot_array_batch_id(const struct slot_array *a, int i);
/* Abort unless 0 <= i < nslots. */
void slot_array_check_index(const struct slot_array *a, int i);

/* Slot i's shape against the reader's buffers: ntok <= max_tokens, nseq <= max_seqs, and (when s->cu_seqlens is
 * given) cu_seqlens[0] = 0, non-decreasing, cu_seqlens[nseq] = ntok. -EPROTO with a message naming the segment, the
 * slot, its batch and the field; err may be NULL. */
int slot_array_check_shape(const struct slot_array *a, int i, const struct slot_shape *s, uint32_t max_tokens,
                           uint32_t max_seqs, errbuf *err);

#endif
