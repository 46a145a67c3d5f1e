#include "slot_array.h"

#include <errno.h>
#include <stdatomic.h>

struct slot_array slot_array_view(const char *name, uint32_t nslots, slot_word *word0, size_t word_stride,
                                  uint64_t *id0, size_t id_stride, _Atomic uint32_t *gen)
{
    return (struct slot_array){ .name = name, .nslots = nslots, .words = (char *)word0, .word_stride = word_stride,
                                .ids = (char *)id0, .id_stride = id_stride, .gen = gen };
}

void slot_array_check_index(const struct slot_array *a, int i)
{
    DF_ASSERT(i >= 0 && (uint32_t)i < a->nslots);
}

static slot_word *word_at(const struct slot_array *a, uint32_t i)
{
    return (slot_word *)(a->words + (size_t)i * a->word_stride);
}

/* Relaxed: the id is read while the slot may change hands; whoever acts on it re-reads it after its own CAS. */
static uint64_t id_at(const struct slot_array *a, uint32_t i)
{
    return __atomic_load_n((uint64_t *)(a->ids + (size_t)i * a->id_stride), __ATOMIC_RELAXED);
}

uint64_t slot_array_word(const struct slot_array *a, int i)
{
    slot_array_check_index(a, i);
    return atomic_load_explicit(word_at(a, (uint32_t)i), memory_order_acquire);
}

uint64_t slot_array_batch_id(const struct slot_array *a, int i)
{
    slot_array_check_index(a, i);
    return id_at(a, (uint32_t)i);
}

/* One attempt of a wait: a claim, or a lease of what want asks for. */
struct attempt {
    struct slot_array *a;
    const struct slot_array_want *want; /* NULL for a claim, or a lease of any id */
    int lease;
    uint16_t owner;
    uint64_t epoch;
};

static int try_claim(const struct attempt *t)
{
    for (uint32_t i = 0; i < t->a->nslots; i++)
        if (slot_claim(word_at(t->a, i), t->owner, t->epoch) == 0) return (int)i;
    return -EAGAIN;
}

static int wants(const struct slot_array_want *w, uint64_t id)
{
    if (!w) return 1;
    if (w->by_id) return id == w->batch_id;
    return !w->pred || w->pred(id, w->ctx);
}

static int try_lease(const struct attempt *t)
{
    struct slot_array *a = t->a;
    for (;;) {
        int best = -1;
        uint64_t best_id = UINT64_MAX;
        for (uint32_t i = 0; i < a->nslots; i++) {
            if (slot_word_state(atomic_load_explicit(word_at(a, i), memory_order_acquire)) != SLOT_STATE_READY)
                continue;
            uint64_t id = id_at(a, i);
            if ((best < 0 || id < best_id) && wants(t->want, id)) {
                best = (int)i;
                best_id = id;
            }
        }
        if (best < 0) return -EAGAIN;
        slot_word *w = word_at(a, (uint32_t)best);
        if (slot_lease(w, t->owner, t->epoch) != 0) continue; /* someone leased it first: rescan */
        /* The id was read before the CAS: the slot may have been consumed and refilled in between. The lease's
         * acquire makes the current id visible; give back a slot that no longer holds the batch chosen. */
        if (id_at(a, (uint32_t)best) == best_id) return best;
        if (slot_unlease(w, t->owner, t->epoch) == 0) slot_gen_wake(a->gen);
    }
}

static int attempt_once(void *ctx)
{
    const struct attempt *t = ctx;
    return t->lease ? try_lease(t) : try_claim(t);
}

int slot_array_claim(struct slot_array *a, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    struct attempt t = { .a = a, .owner = owner, .epoch = epoch };
    return slot_gen_retry(a->gen, attempt_once, &t, timeout_ms);
}

int slot_array_lease(struct slot_array *a, const struct slot_array_want *want, uint16_t owner, uint64_t epoch,
                     int timeout_ms)
{
    struct attempt t = { .a = a, .want = want, .lease = 1, .owner = owner, .epoch = epoch };
    return slot_gen_retry(a->gen, attempt_once, &t, timeout_ms);
}

/* One transition of slot i; wakes the waiters when it took effect. */
static int step(struct slot_array *a, int i, int (*fn)(slot_word *, uint16_t, uint64_t), uint16_t owner,
                uint64_t epoch)
{
    slot_array_check_index(a, i);
    int rc = fn(word_at(a, (uint32_t)i), owner, epoch);
    if (rc == 0) slot_gen_wake(a->gen);
    return rc;
}

int slot_array_publish(struct slot_array *a, int i, uint16_t owner, uint64_t epoch)
{
    return step(a, i, slot_publish, owner, epoch);
}

int slot_array_abandon(struct slot_array *a, int i, uint16_t owner, uint64_t epoch)
{
    return step(a, i, slot_abandon, owner, epoch);
}

int slot_array_release(struct slot_array *a, int i, uint16_t owner, uint64_t epoch)
{
    return step(a, i, slot_release, owner, epoch);
}

int slot_array_unlease(struct slot_array *a, int i, uint16_t owner, uint64_t epoch)
{
    return step(a, i, slot_unlease, owner, epoch);
}

int slot_array_find_ready(struct slot_array *a, uint64_t *batch_ids, int cap)
{
    int n = 0;
    for (uint32_t i = 0; i < a->nslots; i++) {
        if (slot_word_state(atomic_load_explicit(word_at(a, i), memory_order_acquire)) != SLOT_STATE_READY) continue;
        if (n < cap) batch_ids[n] = id_at(a, i);
        n++;
    }
    return n;
}

int slot_array_reclaim(struct slot_array *a, uint64_t epoch, int *freed, int *returned)
{
    int nf = 0, nr = 0;
    for (uint32_t i = 0; i < a->nslots; i++) {
        int r = slot_reclaim_word(word_at(a, i), epoch);
        nf += r == SLOT_RECLAIM_FREED;
        nr += r == SLOT_RECLAIM_RETURNED;
    }
    if (freed) *freed = nf;
    if (returned) *returned = nr;
    if (nf + nr) slot_gen_wake(a->gen);
    return nf + nr;
}

void slot_array_stats(const struct slot_array *a, int *nfree, int *nfilling, int *nready, int *nleased)
{
    int c[4] = { 0, 0, 0, 0 };
    for (uint32_t i = 0; i < a->nslots; i++) {
        enum slot_state st = slot_word_state(atomic_load_explicit(word_at(a, i), memory_order_relaxed));
        if ((unsigned)st < 4) c[st]++;
    }
    if (nfree) *nfree = c[SLOT_STATE_FREE];
    if (nfilling) *nfilling = c[SLOT_STATE_FILLING];
    if (nready) *nready = c[SLOT_STATE_READY];
    if (nleased) *nleased = c[SLOT_STATE_LEASED];
}

int slot_array_check_shape(const struct slot_array *a, int i, const struct slot_shape *s, uint32_t max_tokens,
                           uint32_t max_seqs, errbuf *err)
{
    slot_array_check_index(a, i);
    unsigned long long id = (unsigned long long)id_at(a, (uint32_t)i);
#define SHAPE_ERR(...) errbuf_set(err, EPROTO, "%s: slot %d (batch %llu): " __VA_ARGS__)
    if (s->ntok > max_tokens) return SHAPE_ERR("ntok %u exceeds max_tokens %u", a->name, i, id, s->ntok, max_tokens);
    if (s->nseq > max_seqs) return SHAPE_ERR("nseq %u exceeds max_seqs %u", a->name, i, id, s->nseq, max_seqs);
    const int32_t *cu = s->cu_seqlens;
    if (!cu) return 0;
    if (cu[0] != 0) return SHAPE_ERR("cu_seqlens[0] is %d, not 0", a->name, i, id, cu[0]);
    for (uint32_t q = 0; q < s->nseq; q++)
        if (cu[q + 1] < cu[q])
            return SHAPE_ERR("cu_seqlens[%u] = %d is below cu_seqlens[%u] = %d", a->name, i, id, q + 1, cu[q + 1], q,
                             cu[q]);
    if (cu[s->nseq] != (int32_t)s->ntok)
        return SHAPE_ERR("cu_seqlens[%u] = %d, not ntok %u", a->name, i, id, s->nseq, cu[s->nseq], s->ntok);
#undef SHAPE_ERR
    return 0;
}
