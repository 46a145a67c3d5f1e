#include "token_ring.h"

#include "shm.h"
#include "slot_array.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
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
    struct slot_array array; /* the state words and each slot's batch_id (in its meta) */
    char label[SHM_NAME_MAX + 16]; /* "token ring <name>", for the slot array's messages */
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
    slot_word *words = (slot_word *)(r->hdr + 1);
    r->slots = (char *)words + align64(sizeof(slot_word) * r->geom.nslots);
    snprintf(r->label, sizeof r->label, "token ring %s", r->seg.name);
    r->array = slot_array_view(r->label, r->geom.nslots, words, sizeof(slot_word),
                               &((struct token_batch_meta *)r->slots)->batch_id, r->slot_bytes, &r->hdr->generation);
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

struct token_batch token_ring_batch(struct token_ring *ring, int i)
{
    slot_array_check_index(&ring->array, i);
    char *s = ring->slots + (size_t)i * ring->slot_bytes;
    return (struct token_batch){
        .meta = (struct token_batch_meta *)s,
        .cu_seqlens = (int32_t *)(s + ring->off_cu),
        .input_ids = (int32_t *)(s + ring->off_ids),
        .loss_mask = (uint8_t *)(s + ring->off_mask),
        .sample_ids = (uint64_t *)(s + ring->off_samples),
    };
}

/* The batch's shape against the ring's geometry (every reader's buffers are sized by it). */
static int ring_check_batch(struct token_ring *ring, int i, errbuf *err)
{
    struct token_batch b = token_ring_batch(ring, i);
    struct slot_shape sh = { .ntok = b.meta->ntok, .nseq = b.meta->nseq, .cu_seqlens = b.cu_seqlens };
    return slot_array_check_shape(&ring->array, i, &sh, ring->geom.max_tokens, ring->geom.max_seqs, err);
}

int token_ring_slot_check(struct token_ring *ring, int i, errbuf *err)
{
    return ring_check_batch(ring, i, err);
}

int token_ring_claim(struct token_ring *ring, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    return slot_array_claim(&ring->array, owner, epoch, timeout_ms);
}

int token_ring_publish(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    if (ring_check_batch(ring, i, NULL)) return -EINVAL;
    return slot_array_publish(&ring->array, i, owner, epoch);
}

int token_ring_abandon(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    return slot_array_abandon(&ring->array, i, owner, epoch);
}

int token_ring_lease(struct token_ring *ring, uint16_t owner, uint64_t epoch, int timeout_ms)
{
    return slot_array_lease(&ring->array, NULL, owner, epoch, timeout_ms);
}

int token_ring_release(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    return slot_array_release(&ring->array, i, owner, epoch);
}

int token_ring_unlease(struct token_ring *ring, int i, uint16_t owner, uint64_t epoch)
{
    return slot_array_unlease(&ring->array, i, owner, epoch);
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
    return slot_array_reclaim(&ring->array, epoch, freed, returned);
}

void token_ring_stats(struct token_ring *ring, int *nfree, int *nfilling, int *nready, int *nleased)
{
    slot_array_stats(&ring->array, nfree, nfilling, nready, nleased);
}

uint64_t token_ring_slot_word(struct token_ring *ring, int i)
{
    return slot_array_word(&ring->array, i);
}
