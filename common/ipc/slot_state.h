/* slot_state: the one-word slot protocol of the data plane (docs/design.md §2), shared by the token ring and the
 * hidden-state pools. A slot's state is one _Atomic uint64_t in shared memory, changed only by compare-and-swap:
 * FREE -> FILLING(owner, epoch) -> READY -> LEASED(owner, epoch) -> FREE. Transitions are acq_rel, so a payload
 * written before FILLING->READY is visible to whoever later sees READY. Every function is safe from any thread or
 * process; transitions return 0, or -EBUSY / -ESTALE when the word is not in the required state. Also the futex
 * helpers every ring uses to wait for a state change without spinning. */
#ifndef DFLASH_SLOT_STATE_H
#define DFLASH_SLOT_STATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

enum slot_state {
    SLOT_STATE_FREE = 0,
    SLOT_STATE_FILLING = 1,
    SLOT_STATE_READY = 2,
    SLOT_STATE_LEASED = 3,
};

/* Word layout: state (bits 56..63) | owner (bits 40..55) | epoch (bits 0..39). FREE and READY carry no owner. */
#define SLOT_EPOCH_BITS 40
#define SLOT_EPOCH_MAX ((UINT64_C(1) << SLOT_EPOCH_BITS) - 1)

typedef _Atomic uint64_t slot_word;

/* Pack a state word (epoch must be <= SLOT_EPOCH_MAX). */
uint64_t slot_word_make(enum slot_state state, uint16_t owner, uint64_t epoch);
/* Unpack the state, the owner and the epoch of a word. */
enum slot_state slot_word_state(uint64_t w);
uint16_t slot_word_owner(uint64_t w);
uint64_t slot_word_epoch(uint64_t w);
/* Name of a state ("FREE", ...) for messages. */
const char *slot_state_name(enum slot_state state);

/* FREE -> FILLING(owner, epoch); -EBUSY when the slot is not FREE. */
int slot_claim(slot_word *w, uint16_t owner, uint64_t epoch);
/* FILLING(owner, epoch) -> READY; -ESTALE unless the word is exactly FILLING(owner, epoch). */
int slot_publish(slot_word *w, uint16_t owner, uint64_t epoch);
/* READY -> LEASED(owner, epoch); -EBUSY when the slot is not READY. */
int slot_lease(slot_word *w, uint16_t owner, uint64_t epoch);
/* LEASED(owner, epoch) -> FREE (consumed); -ESTALE unless the word is exactly LEASED(owner, epoch). */
int slot_release(slot_word *w, uint16_t owner, uint64_t epoch);
/* FILLING(owner, epoch) -> FREE (producer gives up); -ESTALE unless exactly FILLING(owner, epoch). */
int slot_abandon(slot_word *w, uint16_t owner, uint64_t epoch);
/* LEASED(owner, epoch) -> READY (give back without consuming); -ESTALE unless exactly LEASED(owner, epoch). */
int slot_unlease(slot_word *w, uint16_t owner, uint64_t epoch);
/* A worker with this epoch died: FILLING(*, epoch) -> FREE, LEASED(*, epoch) -> READY over n contiguous words;
 * counts in *freed / *returned (either may be NULL). Returns the number of slots changed. */
int slot_reclaim_epoch(slot_word *words, int n, uint64_t epoch, int *freed, int *returned);
/* The same for one word: returns SLOT_RECLAIM_FREED, SLOT_RECLAIM_RETURNED or 0 (not held by that epoch). */
int slot_reclaim_word(slot_word *w, uint64_t epoch);
enum { SLOT_RECLAIM_FREED = 1, SLOT_RECLAIM_RETURNED = 2 };

/* Bump a shared 32-bit generation counter and wake every process waiting on it (cross-process futex). */
void slot_gen_wake(_Atomic uint32_t *gen);
/* Wait until *gen != seen or timeout_ms passes (capped at SLOT_WAIT_SLICE_MS so a dead waker never strands a
 * waiter); callers re-check their condition after every return. */
void slot_gen_wait(_Atomic uint32_t *gen, uint32_t seen, int timeout_ms);
#define SLOT_WAIT_SLICE_MS 50
/* Run attempt(ctx) until it returns >= 0 or timeout_ms passes (<0: forever, 0: try once), sleeping on the
 * generation counter between attempts. Returns attempt's result or -ETIMEDOUT. */
int slot_gen_retry(_Atomic uint32_t *gen, int (*attempt)(void *ctx), void *ctx, int timeout_ms);

#endif
