#include "token_ring.h"

#include "shm.h"
#include "slot_state.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Segment layout: [shm_header 64][token_ring_shared 64][state words, padded to 64][nslots * slot_bytes].
 * A slot: [token_batch_meta, padded to 64][cu_seqlens][input_ids][loss_mask][sample_ids], each 64-aligned. */
struct token_ring_shared {
    uint32_t nslots, max_tokens, max_seqs, reserved0;
    uint64_t slot_bytes;
    _Atomic uint64_t next_batch_id;
    _Atomic uint32_t generation; /* futex word: bumped on publish, release, abandon, unlease, reclaim */
    uint32_t reserved1;
    uint64_t reserved[3];
};
_Static_assert(sizeof(struct token_ring_shared) == 64, "token ring header is one cache line");

struct token_ring {
    struct shm_segment seg;
    struct token_ring_shared *hdr;
    slot_word *words;
    char *slots;
    struct token_ring_geometry geom;
    size_t slot_bytes, off_cu, off_ids, off_mask, off_samples;
};

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

static int ring_check_geometry(const char *name, const struct token_ring_geometry *g, errbuf *err)
{
    if (g->nslots < 1 || g->nslots > TOKEN_RING_MAX_SLOTS)
        return errbuf_set(err, EINVAL, "token ring %s: nslots %u out of range 1..%d", name, g->nslots,
                          TOKEN_RING_MAX_SLOTS);
    if (g->max_tokens < 1 || g->max_tokens > TOKEN_RING_MAX_TOKENS)
        return errbuf_set(err, EINVAL, "token ring %s: max_tokens %u out of range 1..%u", name, g->max_tokens,
                          TOKEN_RING_MAX_TOKENS);
    if (g->max_seqs < 1 || g->max_seqs > g->max_tokens)
        return errbuf_set(err, EINVAL, "token ring %s: max_seqs %u out of range 1..max_tokens (%u)", name,
                          g->max_seqs, g->max_tokens);
    return 0;
}

/* Fill the offsets from the geometry; returns the segment's total bytes (sizes are bounded, so no overflow). */
static size_t ring_layout(struct token_ring *r, const struct token_ring_geometry *g)
{
    r->geom = *g;
    r->off_cu = align64(sizeof(struct token_batch_meta));
    r->off_ids = r->off_cu + align64(sizeof(int32_t) * ((size_t)g->max_seqs + 1));
    r->off_mask = r->off_ids + align64(sizeof(int32_t) * g->max_tokens);
    r->off_samples = r->off_mask + align64(g->max_tokens);
    r->slot_bytes = r->off_samples + align64(sizeof(uint64_t) * g->max_seqs);
    return SHM_HEADER_BYTES + sizeof(struct token_ring_shared) + align64(sizeof(slot_word) * g->nslots) +
           r->slot_bytes * g->nslots;
}

static void ring_bind(struct token_ring *r)
{
    r->hdr = shm_segment_body(&r->seg);
    r->words = (slot_word *)(r->hdr + 1);
    r->slots = (char *)r->words + align64(sizeof(slot_word) * r->geom.nslots);
}

int token_ring_create(const char *name, const struct token_ring_geometry *geom, struct token_ring **out, errbuf *err)
{
    *out = NULL;
    int rc = ring_check_geometry(name, geom, err);
    if (rc) return rc;
    struct token_ring *r = xcalloc(1, sizeof *r);
    size_t total = ring_layout(r, geom);
    rc = shm_segment_create(&r->seg, name, SHM_KIND_TOKEN_RING, total, err);
    if (rc) goto fail;
    ring_bind(r);
    /* The segment is zero filled: every word is FREE, next_batch_id and generation are 0. */
    r->hdr->nslots = geom->nslots;
    r->hdr->max_tokens = geom->max_tokens;
    r->hdr->max_seqs = geom->max_seqs;
    r->hdr->slot_bytes = r->slot_bytes;
    atomic_thread_fence(memory_order_release);
    *out = r;
    return 0;
fail:
    free(r);
    return rc;
}

int token_ring_open(const char *name, const struct token_ring_geometry *expect, struct token_ring **out,
                    errbuf *err)
{
    *out = NULL;
    struct token_ring *r = xcalloc(1, sizeof *r);
    int rc = shm_segment_open(&r->seg, name, SHM_KIND_TOKEN_RING, err);
    if (rc) goto fail;
    if (r->seg.bytes < SHM_HEADER_BYTES + sizeof(struct token_ring_shared)) {
        rc = errbuf_set(err, EPROTO, "token ring %s: %zu bytes, too small for the ring header", name, r->seg.bytes);
        goto fail;
    }
    const struct token_ring_shared *h = shm_segment_body(&r->seg);
    struct token_ring_geometry g = { h->nslots, h->max_tokens, h->max_seqs };
    rc = ring_check_geometry(name, &g, err);
    if (rc) goto fail;
    if (expect && (expect->nslots != g.nslots || expect->max_tokens != g.max_tokens ||
                   expect->max_seqs != g.max_seqs)) {
        rc = errbuf_set(err, EPROTO, "token ring %s: geometry nslots=%u max_tokens=%u max_seqs=%u, expected "
                        "nslots=%u max_tokens=%u max_seqs=%u", name, g.nslots, g.max_tokens, g.max_seqs,
                        expect->nslots, expect->max_tokens, expect->max_seqs);
        goto fail;
    }
    size_t total = ring_layout(r, &g);
    if (total != r->seg.bytes || h->slot_bytes != r->slot_bytes) {
        rc = errbuf_set(err, EPROTO, "token ring %s: %zu bytes (slot_bytes %llu) but its geometry needs %zu "
                        "(slot_bytes %zu)", name, r->seg.bytes, (unsigned long long)h->slot_bytes, total,
                        r->slot_bytes);
        goto fail;
    }
    ring_bind(r);
    *out = r;
    return 0;
fail:
    shm_segment_close(&r->seg);
    free(r);
    return rc;
}

void token_ring_destroy(struct token_ring **ring)
{
    if (!*ring) return;
    shm_segment_close(&(*ring)->seg);
    XFREE(*ring);
}

int token_ring_unlink(const char *name, errbuf *err)
{
    return shm_segment_unlink(name, err);
}

struct token_ring_geometry token_ring_geometry_get(const struct token_ring *ring)
{
    return ring->geom;
}

static void ring_check_index(const struct token_ring *ring, int i)
{
    DF_ASSERT(i >= 0 && (uint32_t)i < ring->geom.nslots);
}

struct token_batch token_ring_batch(struct token_ring *ring, int i)
{
    ring_check_index(ring, i);
    char *s = ring->slots + (size_t)i * ring->slot_bytes;
    return (struct token_batch){
        .meta = (struct token_batch_meta *)s,
        .cu_seqlens = (int32_t *)(s + ring->off_cu),
        .input_ids = (int32_t *)(s + ring->off_ids),
        .loss_mask = (uint8_t *)(s + ring->off_mask),
        .sample_ids = (uint64_t *)(s + ring->off_samples),
    };
}

static int ring_try_claim(struct token_ring *ring, uint16_t owner, uint64_t epoch)
{
    for (uint32_t i = 0; i < ring->geom.nslots; i++)
        if (slot_claim(&ring->words[i], owner, epoch) == 0) return (int)i;
    return -EAGAIN;
}

/* Lowest batch_id among READY slots. batch_id is read before the lease CAS; if the slot changes hands in between
 * (READY..READY with another batch) the lease still takes a valid READY batch, just possibly not the lowest. */
static int ring_try_lease(struct token_ring *ring, uint16_t owner, uint64_t epoch)
{
    for (;;) {
        int best = -1;
        uint64_t best_id = UINT64_MAX;
        for (uint32_t i = 0; i < ring->geom.nslots; i++) {
            uint64_t w = atomic_load_explicit(&ring->words[i], memory_order_acquire);
            if (slot_word_state(w) != SLOT_STATE_READY) continue;
            uint64_t id = __atomic_load_n(&token_ring_batch(ring, (int)i).meta->batch_id, __ATOMIC_RELAXED);
            if (best < 0 || id < best_id) {
                best = (int)i;
                best_id = id;
            }
        }
        if (best < 0) return -EAGAIN;
        if (slot_lease(&ring->words[best], owner, epoch) == 0) return best;
        /* Someone leased it first: rescan. */
    }
}

struct ring_attempt {
    struct token_ring *ring;
    int (*try)(struct token_ring *, uint16_t, uint64_t);
    uint16_t owner;
    uint64_t epoch;
};

static int ring_attempt_once(void *ctx)
{
    struct ring_attempt *a = ctx;
    return a->try(a->ring, a->owner, a->epoch);
}

/* Run try() until it succeeds or timeout_ms passes, sleeping on the generation futex in between. */
static int ring_wait(struct token_ring *ring, int (*try)(struct token_ring *, uint16_t, uint64_t), uint16_t owner,
                     uint64_t epoch, int timeout_ms)
{
    struct ring_attempt a = {ring, try, owner, epoch};
    return slot_gen_retry(&ring->hdr->generation, ring_attempt_once, &a, timeout_ms);
}

int token_ring_claim(struct token_ring *ring, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    return ring_wait(ring, ring_try_claim, owner, epoch, timeout_ms);
}

int token_ring_lease(struct token_ring *ring, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    return ring_wait(ring, ring_try_lease, owner, epoch, timeout_ms);
}

static int ring_batch_valid(struct token_ring *ring, const struct token_batch *b)
{
    const struct token_batch_meta *m = b->meta;
    if (m->nseq > ring->geom.max_seqs || m->ntok > ring->geom.max_tokens) return 0;
    if (b->cu_seqlens[0] != 0 || b->cu_seqlens[m->nseq] != (int32_t)m->ntok) return 0;
    for (uint32_t s = 0; s < m->nseq; s++)
        if (b->cu_seqlens[s + 1] < b->cu_seqlens[s]) return 0;
    return 1;
}

int token_ring_publish(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    struct token_batch b = token_ring_batch(ring, i);
    if (!ring_batch_valid(ring, &b)) return -EINVAL;
    int rc = slot_publish(&ring->words[i], owner, epoch);
    if (rc == 0) slot_gen_wake(&ring->hdr->generation);
    return rc;
}

int token_ring_abandon(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    ring_check_index(ring, i);
    int rc = slot_abandon(&ring->words[i], owner, epoch);
    if (rc == 0) slot_gen_wake(&ring->hdr->generation);
    return rc;
}

int token_ring_release(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    ring_check_index(ring, i);
    int rc = slot_release(&ring->words[i], owner, epoch);
    if (rc == 0) slot_gen_wake(&ring->hdr->generation);
    return rc;
}

int token_ring_unlease(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    ring_check_index(ring, i);
    int rc = slot_unlease(&ring->words[i], owner, epoch);
    if (rc == 0) slot_gen_wake(&ring->hdr->generation);
    return rc;
}

uint64_t token_ring_next_id_peek(struct token_ring *ring)
{
    return atomic_load_explicit(&ring->hdr->next_batch_id, memory_order_acquire);
}

int token_ring_next_id_advance(struct token_ring *ring, uint64_t id)
{
    uint64_t expect = id;
    return atomic_compare_exchange_strong_explicit(&ring->hdr->next_batch_id, &expect, id + 1, memory_order_acq_rel,
                                                   memory_order_acquire) ? 0 : -EAGAIN;
}

void token_ring_next_id_set(struct token_ring *ring, uint64_t id)
{
    atomic_store_explicit(&ring->hdr->next_batch_id, id, memory_order_release);
}

int token_ring_reclaim(struct token_ring *ring, uint64_t epoch, int *freed, int *returned)
{
    int n = slot_reclaim_epoch(ring->words, (int)ring->geom.nslots, epoch, freed, returned);
    if (n) slot_gen_wake(&ring->hdr->generation);
    return n;
}

void token_ring_stats(struct token_ring *ring, int *nfree, int *nfilling, int *nready, int *nleased)
{
    int c[4] = { 0, 0, 0, 0 };
    for (uint32_t i = 0; i < ring->geom.nslots; i++) {
        enum slot_state st = slot_word_state(atomic_load_explicit(&ring->words[i], memory_order_relaxed));
        if ((unsigned)st < 4) c[st]++;
    }
    if (nfree) *nfree = c[SLOT_STATE_FREE];
    if (nfilling) *nfilling = c[SLOT_STATE_FILLING];
    if (nready) *nready = c[SLOT_STATE_READY];
    if (nleased) *nleased = c[SLOT_STATE_LEASED];
}

uint64_t token_ring_slot_word(struct token_ring *ring, int i)
{
    ring_check_index(ring, i);
    return atomic_load_explicit(&ring->words[i], memory_order_acquire);
}
