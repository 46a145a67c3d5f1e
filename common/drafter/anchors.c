#include "anchors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"
#include "util.h"

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int anchors_any(const uint8_t *loss_mask, int64_t len)
{
    for (int64_t a = 0; a + 1 < len; a++)
        if (anchors_candidate(loss_mask, a, len)) return 1;
    return 0;
}

int anchors_sample(const int32_t *cu, int nseq, const uint8_t *loss_mask, int max_anchors, uint64_t seed,
                   uint64_t epoch, uint64_t batch_id, int32_t **anchors_out, int32_t **seq_out)
{
    int total_cap = 0;
    for (int s = 0; s < nseq; s++) {
        int len = cu[s + 1] - cu[s];
        total_cap += len < max_anchors ? len : max_anchors;
    }
    int32_t *anchors = xmalloc(sizeof(int32_t) * (size_t)(total_cap + 1));
    int32_t *seqs = xmalloc(sizeof(int32_t) * (size_t)(total_cap + 1));
    int32_t *cand = NULL;
    int n = 0, cand_cap = 0;
    for (int s = 0; s < nseq; s++) {
        int start = cu[s], len = cu[s + 1] - cu[s], nc = 0;
        if (len > cand_cap) {
            cand_cap = len;
            cand = xrealloc(cand, sizeof(int32_t) * (size_t)cand_cap);
        }
        for (int a = 0; a + 1 < len; a++)
            if (anchors_candidate(loss_mask + start, a, len)) cand[nc++] = a;
        int take = nc < max_anchors ? nc : max_anchors;
        rng r;
        rng_seed(&r, seed, epoch, batch_id, (uint64_t)s);
        /* partial Fisher-Yates: the first `take` entries become a uniform sample without replacement */
        for (int i = 0; i < take; i++) {
            int j = i + (int)rng_below(&r, (uint64_t)(nc - i));
            int32_t t = cand[i];
            cand[i] = cand[j];
            cand[j] = t;
        }
        qsort(cand, (size_t)take, sizeof(int32_t), cmp_i32);
        for (int i = 0; i < take; i++) {
            anchors[n] = cand[i];
            seqs[n++] = s;
        }
    }
    free(cand);
    *anchors_out = anchors;
    *seq_out = seqs;
    return n;
}

void drafter_blocks_build(drafter_blocks *b, const int32_t *input_ids, const int32_t *cu, const uint8_t *loss_mask,
                          const int32_t *anchors, const int32_t *anchor_seq, int N, int B, int mask_token_id,
                          double gamma)
{
    memset(b, 0, sizeof *b);
    b->nblocks = N;
    b->block_size = B;
    size_t nb = (size_t)N * (size_t)B;
    b->anchor = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    b->anchor_seq = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    b->ctx_start = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    b->ctx_len = xmalloc(sizeof(int32_t) * (size_t)(N + 1));
    b->block_ids = xmalloc(sizeof(int32_t) * (nb + 1));
    b->block_pos = xmalloc(sizeof(int32_t) * (nb + 1));
    b->labels = xcalloc(nb + 1, sizeof(int32_t));
    b->weights = xcalloc(nb + 1, sizeof(float));
    for (int j = 0; j < N; j++) {
        int s = anchor_seq[j], a = anchors[j], start = cu[s], len = cu[s + 1] - cu[s];
        DF_ASSERT(a >= 0 && a < len);
        b->anchor[j] = a;
        b->anchor_seq[j] = s;
        b->ctx_start[j] = start;
        b->ctx_len[j] = a; /* positions 0..a-1 of the same sequence: strictly before the anchor */
        for (int k = 0; k < B; k++) {
            size_t q = (size_t)j * (size_t)B + (size_t)k;
            b->block_ids[q] = k == 0 ? input_ids[start + a] : mask_token_id;
            b->block_pos[q] = a + k;
            if (k >= 1 && a + k < len && loss_mask[start + a + k]) {
                b->labels[q] = input_ids[start + a + k];
                b->weights[q] = (float)exp(-(double)(k - 1) / gamma);
            }
        }
    }
}

void drafter_blocks_free(drafter_blocks *b)
{
    int32_t **p[] = {&b->anchor, &b->anchor_seq, &b->ctx_start, &b->ctx_len, &b->block_ids, &b->block_pos,
                     &b->labels};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) XFREE(*p[i]);
    XFREE(b->weights);
}

double drafter_default_gamma(int block_size)
{
    if (block_size == 16) return 7.0;
    if (block_size == 10) return 5.0;
    if (block_size == 8) return 4.0;
    double g = block_size / 2.0 - 1.0;
    return g < 1.0 ? 1.0 : g;
}

void drafter_blocks_alloc_one(drafter_blocks *b, int block_size)
{
    b->nblocks = 1;
    b->block_size = block_size;
    b->anchor = xcalloc(1, sizeof(int32_t));
    b->anchor_seq = xcalloc(1, sizeof(int32_t));
    b->ctx_start = xcalloc(1, sizeof(int32_t));
    b->ctx_len = xcalloc(1, sizeof(int32_t));
    b->block_ids = xcalloc((size_t)block_size, sizeof(int32_t));
    b->block_pos = xcalloc((size_t)block_size, sizeof(int32_t));
    b->labels = xcalloc((size_t)block_size, sizeof(int32_t));
    b->weights = xcalloc((size_t)block_size, sizeof(float));
}

void drafter_blocks_set_one(drafter_blocks *b, int p, int32_t token, int32_t mask_token_id)
{
    b->anchor[0] = p;
    b->anchor_seq[0] = 0;
    b->ctx_start[0] = 0;
    b->ctx_len[0] = p;
    for (int k = 0; k < b->block_size; k++) {
        b->block_ids[k] = k == 0 ? token : mask_token_id;
        b->block_pos[k] = p + k;
    }
}
