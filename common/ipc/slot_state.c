#include "slot_state.h"

#include "util.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SLOT_STATE_SHIFT 56
#define SLOT_OWNER_SHIFT SLOT_EPOCH_BITS

uint64_t slot_word_make(enum slot_state state, uint16_t owner, uint64_t epoch)
{
    DF_ASSERT(epoch <= SLOT_EPOCH_MAX);
    return ((uint64_t)state << SLOT_STATE_SHIFT) | ((uint64_t)owner << SLOT_OWNER_SHIFT) | epoch;
}

enum slot_state slot_word_state(uint64_t w) { return (enum slot_state)(w >> SLOT_STATE_SHIFT); }
uint16_t slot_word_owner(uint64_t w) { return (uint16_t)(w >> SLOT_OWNER_SHIFT); }
uint64_t slot_word_epoch(uint64_t w) { return w & SLOT_EPOCH_MAX; }

const char *slot_state_name(enum slot_state state)
{
    switch (state) {
    case SLOT_STATE_FREE: return "FREE";
    case SLOT_STATE_FILLING: return "FILLING";
    case SLOT_STATE_READY: return "READY";
    case SLOT_STATE_LEASED: return "LEASED";
    }
    return "INVALID";
}

/* One exact-word transition. acq_rel on success: the release half publishes what this process wrote into the
 * slot before the flip (payload before READY), the acquire half makes the previous owner's writes visible. */
static int slot_cas(slot_word *w, uint64_t from, uint64_t to, int fail)
{
    uint64_t expect = from;
    if (atomic_compare_exchange_strong_explicit(w, &expect, to, memory_order_acq_rel, memory_order_acquire))
        return 0;
    return -fail;
}

int slot_claim(slot_word *w, uint16_t owner, uint64_t epoch)
{
    return slot_cas(w, slot_word_make(SLOT_STATE_FREE, 0, 0), slot_word_make(SLOT_STATE_FILLING, owner, epoch),
                    EBUSY);
}

int slot_publish(slot_word *w, uint16_t owner, uint64_t epoch)
{
    return slot_cas(w, slot_word_make(SLOT_STATE_FILLING, owner, epoch), slot_word_make(SLOT_STATE_READY, 0, 0),
                    ESTALE);
}

int slot_lease(slot_word *w, uint16_t owner, uint64_t epoch)
{
    return slot_cas(w, slot_word_make(SLOT_STATE_READY, 0, 0), slot_word_make(SLOT_STATE_LEASED, owner, epoch),
                    EBUSY);
}

int slot_release(slot_word *w, uint16_t owner, uint64_t epoch)
{
    return slot_cas(w, slot_word_make(SLOT_STATE_LEASED, owner, epoch), slot_word_make(SLOT_STATE_FREE, 0, 0),
                    ESTALE);
}

int slot_abandon(slot_word *w, uint16_t owner, uint64_t epoch)
{
    return slot_cas(w, slot_word_make(SLOT_STATE_FILLING, owner, epoch), slot_word_make(SLOT_STATE_FREE, 0, 0),
                    ESTALE);
}

int slot_unlease(slot_word *w, uint16_t owner, uint64_t epoch)
{
    return slot_cas(w, slot_word_make(SLOT_STATE_LEASED, owner, epoch), slot_word_make(SLOT_STATE_READY, 0, 0),
                    ESTALE);
}

int slot_reclaim_word(slot_word *w, uint64_t epoch)
{
    uint64_t cur = atomic_load_explicit(w, memory_order_acquire);
    for (;;) {
        enum slot_state st = slot_word_state(cur);
        if ((st != SLOT_STATE_FILLING && st != SLOT_STATE_LEASED) || slot_word_epoch(cur) != epoch) return 0;
        uint64_t to = slot_word_make(st == SLOT_STATE_FILLING ? SLOT_STATE_FREE : SLOT_STATE_READY, 0, 0);
        /* On failure cur is reloaded; a dead worker's word can still change only through another reclaimer. */
        if (atomic_compare_exchange_weak_explicit(w, &cur, to, memory_order_acq_rel, memory_order_acquire))
            return st == SLOT_STATE_FILLING ? SLOT_RECLAIM_FREED : SLOT_RECLAIM_RETURNED;
    }
}

int slot_reclaim_epoch(slot_word *words, int n, uint64_t epoch, int *freed, int *returned)
{
    int nf = 0, nr = 0;
    for (int i = 0; i < n; i++) {
        int r = slot_reclaim_word(&words[i], epoch);
        nf += r == SLOT_RECLAIM_FREED;
        nr += r == SLOT_RECLAIM_RETURNED;
    }
    if (freed) *freed = nf;
    if (returned) *returned = nr;
    return nf + nr;
}

void slot_gen_wake(_Atomic uint32_t *gen)
{
    atomic_fetch_add_explicit(gen, 1, memory_order_seq_cst);
    /* Shared (not FUTEX_PRIVATE_FLAG): waiters live in other processes mapping the same page. */
    syscall(SYS_futex, (uint32_t *)gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void slot_gen_wait(_Atomic uint32_t *gen, uint32_t seen, int timeout_ms)
{
    if (timeout_ms == 0) return;
    if (timeout_ms < 0 || timeout_ms > SLOT_WAIT_SLICE_MS) timeout_ms = SLOT_WAIT_SLICE_MS;
    struct timespec ts = { .tv_sec = timeout_ms / 1000, .tv_nsec = (long)(timeout_ms % 1000) * 1000000L };
    /* Returns at once (EAGAIN) when the generation already moved on; EINTR and ETIMEDOUT just end the wait. */
    syscall(SYS_futex, (uint32_t *)gen, FUTEX_WAIT, seen, &ts, NULL, 0);
}

int slot_gen_retry(_Atomic uint32_t *gen, int (*attempt)(void *ctx), void *ctx, int timeout_ms)
{
    double deadline = timeout_ms < 0 ? 0 : now_seconds() + timeout_ms / 1000.0;
    for (;;) {
        uint32_t seen = atomic_load_explicit(gen, memory_order_acquire);
        int i = attempt(ctx);
        if (i >= 0) return i;
        int left_ms = SLOT_WAIT_SLICE_MS;
        if (timeout_ms >= 0) {
            double left = deadline - now_seconds();
            if (timeout_ms == 0 || left <= 0) return -ETIMEDOUT;
            left_ms = (int)(left * 1000.0) + 1;
        }
        slot_gen_wait(gen, seen, left_ms);
    }
}
