/* token_ring: the bounded ring of packed token batches between prefetch (producer) and the targets (consumers),
 * in one named shm segment created by dflashd (docs/design.md §2). Each slot holds one batch plus a slot_state word;
 * producers claim a FREE slot, fill it, publish it; consumers lease the READY slot with the lowest batch_id, check
 * it (token_ring_slot_check) and release it when done; the slot protocol is slot_array's. A full ring blocks its
 * producer; waits use a cross-process futex with bounded slices. A struct token_ring is a process-local handle (one
 * per thread or guarded by the caller); all shared state is changed by CAS, so any number of processes may use one
 * ring at once. Errors: 0 / -errno (+ errbuf on setup and on a slot check). */
#ifndef DFLASH_TOKEN_RING_H
#define DFLASH_TOKEN_RING_H

#include "util.h"

#include <stdint.h>

struct token_ring;

struct token_ring_geometry {
    uint32_t nslots;     /* 1..TOKEN_RING_MAX_SLOTS */
    uint32_t max_tokens; /* per batch, 1..TOKEN_RING_MAX_TOKENS */
    uint32_t max_seqs;   /* per batch, 1..max_tokens */
};
#define TOKEN_RING_MAX_SLOTS 4096
#define TOKEN_RING_MAX_TOKENS (1u << 24)

/* The fixed part of a slot's batch, in shared memory. */
struct token_batch_meta {
    uint64_t batch_id;
    uint32_t nseq;
    uint32_t ntok;
};

/* A process-local view of one slot's batch: pointers into the mapping. */
struct token_batch {
    struct token_batch_meta *meta;
    int32_t *cu_seqlens;  /* (max_seqs + 1); cu_seqlens[0] = 0, cu_seqlens[nseq] = ntok */
    int32_t *input_ids;   /* (max_tokens) */
    uint8_t *loss_mask;   /* (max_tokens) */
    uint64_t *sample_ids; /* (max_seqs) dataset sample id of each sequence */
};

/* Create the ring segment `name` (e.g. "/dflash-<job>-tokens"); -EEXIST when it exists. */
int token_ring_create(const char *name, const struct token_ring_geometry *geom, struct token_ring **out, errbuf *err);
/* Open an existing ring; checks the stored geometry (and that it equals *expect unless expect is NULL). */
int token_ring_open(const char *name, const struct token_ring_geometry *expect, struct token_ring **out,
                    errbuf *err);
/* Unmap and free the handle, nulling *ring (the segment stays). */
void token_ring_destroy(struct token_ring **ring);
/* Remove the segment name (the keeper does this at job end). */
int token_ring_unlink(const char *name, errbuf *err);
/* The ring's geometry. */
struct token_ring_geometry token_ring_geometry_get(const struct token_ring *ring);

/* Producer: claim a FREE slot as FILLING(owner, epoch), waiting up to timeout_ms (<0: forever, 0: try once) while
 * the ring is full. Returns the slot index or -ETIMEDOUT. */
int token_ring_claim(struct token_ring *ring, uint16_t owner, uint64_t epoch, int timeout_ms);
/* View of slot i's batch (to fill after claim, or to read after lease). */
struct token_batch token_ring_batch(struct token_ring *ring, int i);
/* Producer: FILLING(owner, epoch) -> READY. -EINVAL when the batch breaks the geometry (nothing published),
 * -ESTALE when the slot is no longer ours (reclaimed). */
int token_ring_publish(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch);
/* Producer: give a claimed slot back unfilled (FILLING -> FREE). */
int token_ring_abandon(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch);
/* Consumer: lease the READY slot with the lowest batch_id, waiting up to timeout_ms. Slot index or -ETIMEDOUT. */
int token_ring_lease(struct token_ring *ring, uint16_t owner, uint64_t epoch, int timeout_ms);
/* Consumer, after leasing slot i and before reading it: its batch fits the ring's geometry (ntok <= max_tokens,
 * nseq <= max_seqs, cu_seqlens from 0 to ntok, never decreasing). -EPROTO with the ring, slot and field in err. */
int token_ring_slot_check(struct token_ring *ring, int i, errbuf *err);
/* Consumer: LEASED(owner, epoch) -> FREE after consuming; -ESTALE when the lease was reclaimed. */
int token_ring_release(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch);
/* Consumer: LEASED(owner, epoch) -> READY, giving the batch back unconsumed. */
int token_ring_unlease(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch);

/* The next batch id producers should use. */
uint64_t token_ring_next_id_peek(struct token_ring *ring);
/* Take id: CAS next_batch_id from id to id + 1. 0 when this caller took it, -EAGAIN when someone else did. */
int token_ring_next_id_advance(struct token_ring *ring, uint64_t id);
/* Set next_batch_id (keeper only, e.g. to the committed frontier on resume). */
void token_ring_next_id_set(struct token_ring *ring, uint64_t id);

/* Keeper: the worker with this epoch died; FILLING(*, epoch) -> FREE, LEASED(*, epoch) -> READY, and wake waiters.
 * Returns the number of slots changed; counts in *freed / *returned (NULL allowed). */
int token_ring_reclaim(struct token_ring *ring, uint64_t epoch, int *freed, int *returned);
/* Count slots per state (a snapshot; NULL allowed for any). */
void token_ring_stats(struct token_ring *ring, int *nfree, int *nfilling, int *nready, int *nleased);
/* Slot i's raw state word (status display, tests). */
uint64_t token_ring_slot_word(struct token_ring *ring, int i);

#endif
